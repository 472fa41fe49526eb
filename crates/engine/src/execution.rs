//! One place assembles an [`Execution`]. A session's cell, a command beside it and a one-shot
//! run each note when they begin ([`Began`]) and when they end ([`Ended`]), with the workspace
//! as it was then, and [`Ended::execution`] makes what the run produced into the record every
//! interface returns and the audit log keeps.

use chrono::{DateTime, Utc};
use runcell_sandbox::{CappedOutput, KillReason, Snapshot, Usage, Workspace};

use crate::bounds::MAX_FILE_CHANGES;
use crate::model::{
    ErrorInfo, Execution, ExecutionStatus, FileChange, FileChangeKind, Language, ResultItem,
    Truncated, UsageInfo,
};

/// An execution as it begins.
#[derive(Debug)]
pub(crate) struct Began {
    pub(crate) id: String,
    pub(crate) session_id: Option<String>,
    /// The workspace before the run, to tell what the run changed in it.
    before: Option<Snapshot>,
    pub(crate) started_at: DateTime<Utc>,
}

impl Began {
    /// Execution `id` (of session `session_id`, if any) begins now, on `workspace`.
    pub(crate) fn now(id: String, session_id: Option<String>, workspace: &Workspace) -> Began {
        Began {
            id,
            session_id,
            before: workspace.snapshot().ok(),
            started_at: Utc::now(),
        }
    }

    /// The session the execution belongs to, if any.
    pub(crate) fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// The run is over: its end time and what it changed in `workspace`, which is on disk
    /// when this returns (before anyone is told the run happened).
    pub(crate) fn end(self, workspace: &Workspace) -> Ended {
        let finished_at = Utc::now();
        let after = workspace.snapshot().ok();
        let mut diff = diff_files(self.before.as_ref(), after.as_ref());
        crate::hashing::hash_files(workspace, &mut diff.files);
        sync_if_changed(workspace, self.before.as_ref(), after.as_ref(), &diff);
        Ended {
            diff,
            id: self.id,
            session_id: self.session_id,
            started_at: self.started_at,
            finished_at,
        }
    }
}

/// [`Workspace::sync`] after a cell, a command or a one-shot run (a no-op for a tmpfs), unless both walks were complete and saw no
/// change (a `1+1` cell: the sync would only flush the disk's cache). Its failure is logged:
/// the execution happened and its reply is due, but an operator must learn that its files may
/// not survive a crash of the host.
fn sync_if_changed(
    workspace: &Workspace,
    before: Option<&Snapshot>,
    after: Option<&Snapshot>,
    diff: &FileDiff,
) {
    let unchanged = before.is_some_and(|b| b.complete)
        && after.is_some_and(|a| a.complete)
        && diff.files.is_empty()
        && !diff.truncated;
    if unchanged {
        return;
    }
    if let Err(e) = workspace.sync() {
        tracing::error!(error = %crate::chain(&e), "cannot make a workspace durable");
    }
}

/// An execution whose run is over, waiting for what the run produced.
#[derive(Debug)]
pub(crate) struct Ended {
    id: String,
    session_id: Option<String>,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    diff: FileDiff,
}

/// What a run produced, in the kernel's and the sandbox's terms.
#[derive(Debug)]
pub(crate) struct Produced<'a> {
    pub(crate) language: Language,
    pub(crate) execution_count: u64,
    pub(crate) status: ExecutionStatus,
    pub(crate) error: Option<ErrorInfo>,
    pub(crate) stdout: &'a CappedOutput,
    pub(crate) stderr: &'a CappedOutput,
    pub(crate) results: Vec<ResultItem>,
    /// Results were dropped over their bounds (see [`Truncated::results`]).
    pub(crate) results_dropped: bool,
    pub(crate) usage: Usage,
    pub(crate) killed_by: Option<KillReason>,
}

impl Ended {
    /// The Execution of this run.
    pub(crate) fn execution(self, run: Produced<'_>) -> Execution {
        Execution {
            id: self.id,
            session_id: self.session_id,
            language: run.language,
            execution_count: run.execution_count,
            status: run.status,
            stdout: run.stdout.render(),
            stderr: run.stderr.render(),
            truncated: Truncated {
                stdout: run.stdout.truncated(),
                stderr: run.stderr.truncated(),
                results: run.results_dropped,
                files: self.diff.truncated,
            },
            results: run.results,
            error: run.error,
            files: self.diff.files,
            usage: UsageInfo {
                wall_ms: run.usage.wall.as_millis() as u64,
                cpu_ms: run.usage.cpu.as_millis() as u64,
                peak_memory_bytes: run.usage.peak_memory_bytes,
                killed_by: run.killed_by.map(Into::into),
            },
            network: Vec::new(),
            tool_calls: Vec::new(),
            pending_tool_calls: Vec::new(),
            started_at: self.started_at,
            finished_at: self.finished_at,
            restored: None,
        }
    }

    /// A run of session `session_id` that changed no file, begun and ended at `at`.
    #[cfg(test)]
    pub(crate) fn at(session_id: Option<&str>, at: DateTime<Utc>) -> Ended {
        Ended {
            id: crate::model::new_ordered_id("ex"),
            session_id: session_id.map(str::to_owned),
            started_at: at,
            finished_at: at,
            diff: FileDiff::default(),
        }
    }
}

/// The files a run created, modified or deleted.
fn diff_files(before: Option<&Snapshot>, after: Option<&Snapshot>) -> FileDiff {
    let (Some(before), Some(after)) = (before, after) else {
        // Without both pictures nothing can be said; an empty one would make every file
        // look created or deleted.
        return FileDiff {
            files: Vec::new(),
            truncated: true,
        };
    };
    let mut out = Vec::new();
    let mut truncated = false;
    for (path, stat) in &after.files {
        let change = match before.files.get(path) {
            None if before.complete => FileChangeKind::Created,
            // Perhaps there all along, where the first walk did not reach.
            None => {
                truncated = true;
                continue;
            }
            Some(old) if old != stat => FileChangeKind::Modified,
            Some(_) => continue,
        };
        out.push(FileChange {
            path: path.clone(),
            size: stat.size,
            mime: crate::mime_of(path),
            change,
            sha256: None,
        });
    }
    if after.complete {
        for path in before
            .files
            .keys()
            .filter(|p| !after.files.contains_key(*p))
        {
            out.push(FileChange {
                path: path.clone(),
                size: 0,
                mime: crate::mime_of(path),
                change: FileChangeKind::Deleted,
                sha256: None,
            });
        }
    } else if before.files.keys().any(|p| !after.files.contains_key(p)) {
        // Never a false deletion: a file the second walk did not reach may well exist.
        truncated = true;
    }
    if out.len() > MAX_FILE_CHANGES {
        out.truncate(MAX_FILE_CHANGES);
        truncated = true;
    }
    FileDiff {
        files: out,
        truncated,
    }
}

/// What changed in a workspace between two snapshots.
#[derive(Debug, Default)]
struct FileDiff {
    /// Created and modified files by path, then deleted ones, at most [`MAX_FILE_CHANGES`].
    files: Vec<FileChange>,
    /// More changed than `files` says (see [`Truncated::files`]).
    truncated: bool,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use runcell_sandbox::FileStat;
    use std::collections::BTreeMap;

    fn snapshot(files: &[(&str, u64, std::time::SystemTime)], complete: bool) -> Snapshot {
        Snapshot {
            files: files
                .iter()
                .map(|&(p, size, modified)| (p.to_owned(), FileStat { size, modified }))
                .collect::<BTreeMap<_, _>>(),
            complete,
        }
    }

    #[test]
    fn file_diff_reports_created_modified_deleted() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let t1 = t0 + Duration::from_secs(1);
        let before = snapshot(&[("a.txt", 1, t0), ("b.csv", 2, t0)], true);
        let after = snapshot(&[("a.txt", 1, t1), ("c.png", 3, t1)], true);
        let d = diff_files(Some(&before), Some(&after));
        let got: Vec<_> = d
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.change, f.mime.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a.txt", FileChangeKind::Modified, "text/plain"),
                ("c.png", FileChangeKind::Created, "image/png"),
                ("b.csv", FileChangeKind::Deleted, "text/csv"),
            ]
        );
        assert!(!d.truncated);
    }

    /// A walk that did not see everything never turns an unseen file into a deletion (or an
    /// old file into a new one); the diff says it is partial instead.
    #[test]
    fn an_incomplete_snapshot_reports_no_false_change() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let t1 = t0 + Duration::from_secs(1);
        let full = snapshot(&[("a", 1, t0), ("b", 1, t0), ("c", 1, t0)], true);
        let part = snapshot(&[("a", 2, t1)], false);
        let d = diff_files(Some(&full), Some(&part));
        let got: Vec<_> = d
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.change))
            .collect();
        assert_eq!(got, vec![("a", FileChangeKind::Modified)]);
        assert!(d.truncated);
        let d = diff_files(Some(&part), Some(&full));
        assert!(
            d.files.iter().all(|f| f.change != FileChangeKind::Created),
            "{:?}",
            d.files
        );
        assert!(d.truncated);
        let d = diff_files(Some(&full), None);
        assert!(d.files.is_empty() && d.truncated);
    }

    #[test]
    fn file_changes_past_the_bound_are_summarised() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let names: Vec<String> = (0..MAX_FILE_CHANGES + 5)
            .map(|i| format!("f{i:05}"))
            .collect();
        let files: Vec<_> = names.iter().map(|n| (n.as_str(), 1, t0)).collect();
        let d = diff_files(Some(&snapshot(&[], true)), Some(&snapshot(&files, true)));
        assert_eq!(d.files.len(), MAX_FILE_CHANGES);
        assert!(d.truncated);
        assert_eq!(d.files[0].path, "f00000");
    }
}
