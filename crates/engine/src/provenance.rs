//! Where a file came from: the lookup of the recorded execution that left a file's current
//! content (by the `files[].sha256` it recorded, see `hashing.rs`), which a signed provenance
//! statement names.

use runcell_store::audit::provenance::FileOrigin;

use crate::hashing::sha256_hex;

use crate::error::{EngineError, Resource};
use crate::model::{Execution, FileChange};

/// How many of a session's recorded executions, newest first, a provenance lookup reads.
const LOOKUP_EXECUTIONS: usize = 10_000;

impl crate::Engine {
    /// Where `path` of `session` (the owner's) comes from as it is now: the execution that
    /// left this content, in the audit log, with the content. Not found when no recorded
    /// execution did (an uploaded file, one changed since by hand or by a run whose hashing
    /// budget it exceeded).
    pub fn file_origin(
        &self,
        owner: &str,
        session: &str,
        path: &str,
    ) -> Result<(FileOrigin, Vec<u8>), EngineError> {
        let data = self.read_file(session, path)?;
        let sha256 = sha256_hex(&data);
        let path = runcell_sandbox::validate_relative(path)
            .map(|parts| parts.join("/"))
            .unwrap_or_else(|_| path.to_owned());
        let none = || {
            EngineError::NotFound(Resource::Record(format!(
                "a provenance of {path}: no recorded execution of session {session} left it as it is now"
            )))
        };
        let Some(records) = &self.core.records else {
            return Err(none());
        };
        let tenant = crate::records::tenant(owner);
        let mut before: Option<String> = None;
        let mut read = 0;
        while read < LOOKUP_EXECUTIONS {
            let (rows, next) = records
                .store()
                .list_executions(tenant, Some(session), 1000, before.as_deref())
                .map_err(crate::records::store_error)?;
            read += rows.len();
            let runs: Vec<(Execution, String)> = rows
                .into_iter()
                .filter_map(|r| Some((serde_json::from_str(&r.execution_json).ok()?, r.code)))
                .collect();
            // The newest run that touched the path decides: it left this content or not.
            let touched = runs
                .iter()
                .find(|(e, _)| e.files.iter().any(|f| f.path == path));
            if let Some((e, code)) = touched {
                let Some((e, f)) = producer([e], &path, &sha256) else {
                    return Err(none());
                };
                let origin = FileOrigin {
                    path: f.path.clone(),
                    size: data.len() as u64,
                    sha256,
                    mime: f.mime.clone(),
                    execution_id: e.id.clone(),
                    code_sha256: sha256_hex(code.as_bytes()),
                    session_id: e.session_id.clone(),
                    tenant: tenant.to_owned(),
                    time: e
                        .finished_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                };
                return Ok((origin, data));
            }
            match next {
                Some(n) => before = Some(n),
                None => break,
            }
        }
        Err(none())
    }
}

/// The execution among `executions` (newest first) that left `path` with content `sha256`,
/// and that file's entry: the last run that created or modified it, if its hash is this one.
/// A later run that deleted or rewrote the file hides the earlier ones.
pub fn producer<'a>(
    executions: impl IntoIterator<Item = &'a Execution>,
    path: &str,
    sha256: &str,
) -> Option<(&'a Execution, &'a FileChange)> {
    for e in executions {
        if let Some(f) = e.files.iter().find(|f| f.path == path) {
            return (f.sha256.as_deref() == Some(sha256)).then_some((e, f));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FileChangeKind;

    #[test]
    fn the_producer_is_the_last_run_that_wrote_the_file() {
        let t = chrono::Utc::now();
        let run = |id: &str, path: &str, change, sha: Option<&str>| Execution {
            id: id.into(),
            session_id: None,
            language: crate::Language::Python,
            execution_count: 1,
            status: crate::ExecutionStatus::Ok,
            stdout: String::new(),
            stderr: String::new(),
            truncated: Default::default(),
            results: vec![],
            error: None,
            files: vec![FileChange {
                path: path.into(),
                size: 1,
                mime: "text/plain".into(),
                change,
                sha256: sha.map(str::to_owned),
            }],
            usage: Default::default(),
            network: Vec::new(),
            tool_calls: Vec::new(),
            pending_tool_calls: Vec::new(),
            restored: None,
            started_at: t,
            finished_at: t,
        };
        let runs = [
            run("ex_3", "b.txt", FileChangeKind::Created, Some("bb")),
            run("ex_2", "a.txt", FileChangeKind::Modified, Some("a2")),
            run("ex_1", "a.txt", FileChangeKind::Created, Some("a1")),
        ];
        let found = |sha| producer(&runs, "a.txt", sha).map(|(e, _)| e.id.as_str());
        assert_eq!(found("a2"), Some("ex_2"));
        assert_eq!(found("a1"), None, "rewritten since");
        assert_eq!(
            producer(&runs, "c.txt", "cc").map(|(e, _)| e.id.clone()),
            None
        );
        let deleted = [run("ex_4", "b.txt", FileChangeKind::Deleted, None)];
        assert!(producer(deleted.iter().chain(&runs), "b.txt", "bb").is_none());
    }
}
