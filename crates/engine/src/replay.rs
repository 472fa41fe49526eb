//! Replay: a recorded session's cells re-run, in order, in a fresh session, and each one's
//! stdout, main result, error and produced files compared with what the audit log holds — so
//! anyone can challenge a figure an agent produced (`runcell audit replay`,
//! `POST /v1/sessions/{id}/replay`).
//!
//! What can be restored: the store keeps each upload's path, size and SHA-256, not its bytes.
//! An upload is restored from a file the caller supplies, or else from the original session's
//! workspace while it lives, and only when its content still has the recorded hash; any other
//! upload is reported as not restored (the cells reading it will differ, and say so).
//!
//! What cannot be compared: bash commands and text editor calls are not recorded executions,
//! so only the python (and other language) cells replay; a cell that read a file such a call
//! wrote will differ. Known sources of difference are named from each cell's code (unseeded
//! random generators, the clock, uuids, the network, hash randomisation).

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::Resource;
use crate::records::{self, store_error};
use crate::{
    CreateSession, Engine, EngineError, Execution, FileChangeKind, InputFile, Language, Start,
};

/// A replay's whole report.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub object: &'static str,
    pub session_id: String,
    /// The fresh session the cells ran in (deleted when the replay ends).
    pub replay_session_id: String,
    /// Cells whose four checks all held.
    pub matched: usize,
    pub differed: usize,
    pub uploads: Vec<UploadRestore>,
    pub cells: Vec<CellReplay>,
}

/// One recorded upload, and whether the replay had it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct UploadRestore {
    pub path: String,
    /// The recorded hash (`None` for a file the caller supplied that the store did not record).
    pub sha256: Option<String>,
    pub restored: bool,
    /// Where it came from, or why it is missing.
    pub note: String,
}

/// One cell: recorded against replayed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct CellReplay {
    /// 1-based position in the session.
    pub index: usize,
    pub execution_id: String,
    pub replay_execution_id: Option<String>,
    pub code: String,
    /// stdout, the main result, the error and the files all matched.
    pub matches: bool,
    pub stdout: ReplayCheck,
    pub result: ReplayCheck,
    pub error: ReplayCheck,
    pub files: ReplayCheck,
    /// The SHA-256 of each file the replayed cell created or modified (compared with the
    /// record when it holds `files[].sha256`; otherwise files compare by path, change, size).
    pub replayed_sha256: BTreeMap<String, String>,
    /// Known sources of difference found in the cell's code (and earlier cells' for a cell
    /// that differed without one of its own).
    pub sources_of_difference: Vec<String>,
}

/// One comparison, with a unified diff when it failed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct ReplayCheck {
    pub matches: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

impl ReplayCheck {
    fn of(recorded: &str, replayed: &str) -> ReplayCheck {
        if recorded == replayed {
            return ReplayCheck {
                matches: true,
                diff: None,
            };
        }
        let diff = similar::TextDiff::from_lines(recorded, replayed)
            .unified_diff()
            .context_radius(2)
            .header("recorded", "replayed")
            .to_string();
        ReplayCheck {
            matches: false,
            diff: Some(diff),
        }
    }
}

/// Cells fetched from the store per page.
const PAGE: usize = 1000;

impl Engine {
    /// Re-runs `owner`'s recorded session `session` in a fresh session with the uploads
    /// restored (from `supplied`, or the live original's workspace: see the module docs) and
    /// compares every cell. `NotFound` when the owner has no such session; a session that ran
    /// nothing gives an empty report.
    pub fn replay(
        &self,
        owner: &str,
        session: &str,
        supplied: &[InputFile],
    ) -> Result<ReplayReport, EngineError> {
        let recorded = self.recorded_cells(owner, session)?;
        if recorded.is_empty() {
            // A session of this owner that ran nothing replays as nothing: no sandbox needed.
            return Ok(ReplayReport {
                object: "replay",
                session_id: session.to_owned(),
                replay_session_id: String::new(),
                matched: 0,
                differed: 0,
                uploads: Vec::new(),
                cells: Vec::new(),
            });
        }
        let language = recorded
            .first()
            .map_or(Language::Python, |(e, _)| e.language);
        let info = self.sessions().create(CreateSession {
            owner: owner.to_owned(),
            language: Some(language),
            // Its own hash secret, as the original's kernel may have had.
            start: (language == Language::Python).then_some(Start::Cold),
            metadata: BTreeMap::from([("replay_of".to_owned(), session.to_owned())]),
            ..CreateSession::default()
        })?;
        let replay_id = info.id.clone();
        let result = self.replay_into(session, &replay_id, &recorded, supplied);
        if let Err(e) = self.sessions().delete(&replay_id) {
            tracing::warn!(session = %replay_id, error = %crate::chain(&e), "cannot delete the replay session");
        }
        result
    }

    /// The session's recorded executions, oldest first, each with its code.
    fn recorded_cells(
        &self,
        owner: &str,
        session: &str,
    ) -> Result<Vec<(Execution, serde_json::Value)>, EngineError> {
        let not_found = || EngineError::NotFound(Resource::Session { id: session.into() });
        let Some(recs) = &self.core.records else {
            return Err(not_found());
        };
        let mut rows = Vec::new();
        let mut before: Option<String> = None;
        loop {
            let (page, next) = recs
                .store()
                .list_executions(
                    records::tenant(owner),
                    Some(session),
                    PAGE,
                    before.as_deref(),
                )
                .map_err(store_error)?;
            rows.extend(page.into_iter().filter(|r| !records::is_approval(r)));
            match next {
                Some(n) => before = Some(n),
                None => break,
            }
        }
        if rows.is_empty() {
            // No cell: an empty replay if the session is this owner's, live or recorded.
            let known = self.sessions().find(owner, session).is_some();
            return if known {
                Ok(Vec::new())
            } else {
                Err(not_found())
            };
        }
        rows.reverse();
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let e: Execution = serde_json::from_str(&r.execution_json).ok()?;
                Some((e, records::with_code(r)))
            })
            .collect())
    }

    fn replay_into(
        &self,
        session: &str,
        replay_id: &str,
        recorded: &[(Execution, serde_json::Value)],
        supplied: &[InputFile],
    ) -> Result<ReplayReport, EngineError> {
        let uploads = self.restore_uploads(session, replay_id, supplied)?;
        let mut cells = Vec::with_capacity(recorded.len());
        let mut earlier: Vec<(usize, Vec<String>)> = Vec::new();
        for (i, (was, raw)) in recorded.iter().enumerate() {
            let code = raw["code"].as_str().unwrap_or_default().to_owned();
            let own = sources_of_difference(&code);
            let now = self.sessions().execute(replay_id, &code, None, None)?;
            let hashes = self.produced_hashes(replay_id, &now);
            let stdout = ReplayCheck::of(&was.stdout, &now.stdout);
            let result = ReplayCheck::of(&main_result(was), &main_result(&now));
            let error = ReplayCheck::of(&error_text(was), &error_text(&now));
            let files = ReplayCheck::of(
                &recorded_files(raw),
                &replayed_files(&now, &hashes, has_hashes(raw)),
            );
            let matches = stdout.matches && result.matches && error.matches && files.matches;
            let mut sources = own.clone();
            if !matches && sources.is_empty() {
                for (n, s) in &earlier {
                    sources.extend(s.iter().map(|s| format!("cell {n}: {s}")));
                }
            }
            if !own.is_empty() {
                earlier.push((i + 1, own));
            }
            cells.push(CellReplay {
                index: i + 1,
                execution_id: was.id.clone(),
                replay_execution_id: Some(now.id.clone()),
                code,
                matches,
                stdout,
                result,
                error,
                files,
                replayed_sha256: hashes,
                sources_of_difference: sources,
            });
        }
        let matched = cells.iter().filter(|c| c.matches).count();
        Ok(ReplayReport {
            object: "replay",
            session_id: session.to_owned(),
            replay_session_id: replay_id.to_owned(),
            matched,
            differed: cells.len() - matched,
            uploads,
            cells,
        })
    }

    /// Writes each recorded upload whose content is at hand with the recorded hash.
    fn restore_uploads(
        &self,
        session: &str,
        replay_id: &str,
        supplied: &[InputFile],
    ) -> Result<Vec<UploadRestore>, EngineError> {
        let recorded = match &self.core.records {
            Some(r) => r.store().uploads(session).unwrap_or_default(),
            None => Vec::new(),
        };
        let live = self.sessions().get(session).is_ok();
        let mut out = Vec::new();
        for up in &recorded {
            let given = supplied.iter().find(|f| f.path == up.path);
            let (content, from) = match given {
                Some(f) => (Some(f.content.clone()), "the file supplied"),
                None if live => (
                    self.read_file(session, &up.path).ok(),
                    "the original session's workspace",
                ),
                None => (None, ""),
            };
            let (restored, note) = match content {
                Some(c) if sha256_hex(&c) == up.sha256 => {
                    self.write_file(replay_id, &up.path, &c)?;
                    (true, format!("restored from {from}"))
                }
                Some(_) => (
                    false,
                    format!("{from} does not have the recorded SHA-256; not restored"),
                ),
                None => (
                    false,
                    "the store keeps an upload's hash, not its content: supply the file to restore it".into(),
                ),
            };
            out.push(UploadRestore {
                path: up.path.clone(),
                sha256: Some(up.sha256.clone()),
                restored,
                note,
            });
        }
        for f in supplied {
            if recorded.iter().any(|u| u.path == f.path) {
                continue;
            }
            self.write_file(replay_id, &f.path, &f.content)?;
            out.push(UploadRestore {
                path: f.path.clone(),
                sha256: None,
                restored: true,
                note: "supplied; the store recorded no upload at this path to check it against"
                    .into(),
            });
        }
        Ok(out)
    }

    /// The SHA-256 of each file `e` created or modified, read from the workspace.
    fn produced_hashes(&self, session: &str, e: &Execution) -> BTreeMap<String, String> {
        e.files
            .iter()
            .filter(|f| f.change != FileChangeKind::Deleted)
            .map(|f| {
                let hash = self
                    .read_file(session, &f.path)
                    .map(|c| sha256_hex(&c))
                    .unwrap_or_else(|_| "unreadable".into());
                (f.path.clone(), hash)
            })
            .collect()
    }
}

/// Whether the record holds its files' hashes (`files[].sha256`, newer records).
fn has_hashes(raw: &serde_json::Value) -> bool {
    raw["files"]
        .as_array()
        .is_some_and(|fs| fs.iter().any(|f| f["sha256"].is_string()))
}

/// The replayed cell's file list in [`recorded_files`]'s form.
fn replayed_files(e: &Execution, hashes: &BTreeMap<String, String>, with_hash: bool) -> String {
    let mut lines: Vec<String> = e
        .files
        .iter()
        .map(|f| {
            let hash = match hashes.get(&f.path) {
                Some(h) if with_hash => Some(h.as_str()),
                _ => None,
            };
            file_line(&f.path, change_word(f.change), f.size, hash)
        })
        .collect();
    lines.sort();
    lines.concat()
}

fn change_word(c: FileChangeKind) -> &'static str {
    match c {
        FileChangeKind::Created => "created",
        FileChangeKind::Modified => "modified",
        FileChangeKind::Deleted => "deleted",
    }
}

fn file_line(path: &str, change: &str, size: u64, hash: Option<&str>) -> String {
    match hash {
        Some(h) => format!("{path} {change} {size} bytes sha256:{h}\n"),
        None => format!("{path} {change} {size} bytes\n"),
    }
}

/// The recorded file list. Executions recorded without `files[].sha256` compare by path,
/// change and size: nothing else is known of their content.
fn recorded_files(raw: &serde_json::Value) -> String {
    let mut lines: Vec<String> = raw["files"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|f| {
            let change = f["change"].as_str().unwrap_or("?");
            file_line(
                f["path"].as_str().unwrap_or("?"),
                change,
                f["size"].as_u64().unwrap_or(0),
                f["sha256"].as_str(),
            )
        })
        .collect();
    lines.sort();
    lines.concat()
}

/// The main result's text (and which forms it came in).
fn main_result(e: &Execution) -> String {
    match e.results.iter().find(|r| r.is_main_result) {
        None => String::new(),
        Some(r) => {
            let kinds: Vec<&str> = r.data.keys().map(String::as_str).collect();
            let text = r.data.get("text/plain").map_or("", String::as_str);
            format!("[{}]\n{text}\n", kinds.join(", "))
        }
    }
}

fn error_text(e: &Execution) -> String {
    e.error
        .as_ref()
        .map(|x| format!("{}: {}\n", x.name, x.value))
        .unwrap_or_default()
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `code` calls the builtin `name` (not `x.name(` nor `other_name(`).
fn calls(code: &str, name: &str) -> bool {
    let pat = format!("{name}(");
    code.match_indices(&pat).any(|(at, _)| {
        code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '.'))
    })
}

/// Known sources of difference in `code`: each a short phrase naming what was found.
pub fn sources_of_difference(code: &str) -> Vec<String> {
    let has = |s: &str| code.contains(s);
    let mut out = Vec::new();
    let seeded = has("seed(") || has("default_rng(") && !has("default_rng()");
    if (has("np.random") || has("numpy.random") || has("default_rng")) && !seeded {
        out.push("numpy random numbers without a seed".to_owned());
    }
    let stdlib_random = code.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with("import random") || l.starts_with("from random ")
    });
    if stdlib_random && !has("random.seed(") {
        out.push("the random module without random.seed()".to_owned());
    }
    if has("secrets.") || has("os.urandom") {
        out.push("the system's random source (secrets, os.urandom)".to_owned());
    }
    if has("uuid") {
        out.push("uuids".to_owned());
    }
    if has("datetime.now")
        || has("datetime.utcnow")
        || has("date.today")
        || has("time.time")
        || has("time.perf_counter")
        || has("time.monotonic")
        || has("pd.Timestamp.now")
    {
        out.push("the clock (datetime.now, time.time, ...)".to_owned());
    }
    if has("requests.") || has("urllib") || has("http.client") || has("socket") || has("httpx") {
        out.push("the network (no network in the sandbox by default)".to_owned());
    }
    if calls(code, "hash") || calls(code, "id") {
        out.push("hash randomisation or object ids (hash(), id())".to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_known_sources_of_difference() {
        assert!(sources_of_difference("x = 6 * 7\nprint(x)").is_empty());
        assert_eq!(
            sources_of_difference("import random\nprint(random.random())"),
            ["the random module without random.seed()"]
        );
        assert!(
            sources_of_difference("import random\nrandom.seed(1)\nprint(random.random())")
                .is_empty()
        );
        assert_eq!(
            sources_of_difference("import numpy as np\nprint(np.random.rand())"),
            ["numpy random numbers without a seed"]
        );
        assert!(
            sources_of_difference("import numpy as np\nrng = np.random.default_rng(7)").is_empty()
        );
        assert_eq!(
            sources_of_difference("from datetime import datetime\nprint(datetime.now())"),
            ["the clock (datetime.now, time.time, ...)"]
        );
        assert_eq!(
            sources_of_difference("import uuid; uuid.uuid4()"),
            ["uuids"]
        );
        assert!(sources_of_difference("valid(grid(x.id(1)))").is_empty());
        assert_eq!(
            sources_of_difference("print(hash('a'))"),
            ["hash randomisation or object ids (hash(), id())"]
        );
    }

    #[test]
    fn a_failed_check_carries_a_unified_diff() {
        assert!(ReplayCheck::of("a\n", "a\n").matches);
        let c = ReplayCheck::of("a\nb\n", "a\nc\n");
        assert!(!c.matches);
        assert_eq!(
            c.diff.as_deref(),
            Some("--- recorded\n+++ replayed\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n")
        );
    }
}
