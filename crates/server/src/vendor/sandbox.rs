//! What a vendor's code tools do in a container's session: a shell command, a Python cell, a
//! file edit, each with what it produced. Vendors return the files code wrote as file ids, so
//! every file created or changed in /workspace (`$OUTPUT_DIR`) by a call is copied into the
//! vendor's [`FileStore`], and so is every figure a cell showed. Blocking: call it from a
//! blocking thread.

use std::collections::BTreeMap;

use base64::Engine as _;
use runcell_engine::tools::{workspace_path, ToolImage};
use runcell_engine::{
    CancelToken, CommandOutput, Engine, EngineError, Execution, FileChangeKind, MAX_FILE_BYTES,
};

use super::{FileStore, StoredFile};

/// A container's session, for one request.
#[derive(Debug)]
pub(crate) struct Sandbox<'a> {
    pub engine: &'a Engine,
    pub files: &'a FileStore,
    pub tenant: &'a str,
    pub session: &'a str,
    /// Calls the running cell off when the client goes away.
    pub cancel: CancelToken,
}

/// A file the code produced, as stored.
#[derive(Debug, Clone)]
pub(crate) struct Saved {
    /// Relative to /workspace (a figure's made-up name when it is not in the workspace).
    pub path: String,
    pub file: StoredFile,
}

#[derive(Debug)]
pub(crate) struct BashRun {
    pub output: CommandOutput,
    pub saved: Vec<Saved>,
}

#[derive(Debug)]
pub(crate) struct PythonRun {
    pub execution: Execution,
    pub saved: Vec<Saved>,
}

/// What a file edit did, in the shapes Anthropic's editor reports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Edit {
    View {
        /// The text shown (numbered lines are the model's business, not the client's), or
        /// base64 for an image.
        content: String,
        file_type: &'static str,
        start_line: Option<usize>,
        num_lines: Option<usize>,
        total_lines: Option<usize>,
        image: Option<ToolImage>,
    },
    Create {
        path: String,
        is_file_update: bool,
    },
    StrReplace {
        path: String,
        old_start: usize,
        old_lines: usize,
        new_start: usize,
        new_lines: usize,
        /// The change as diff lines: `-old`, then `+new`.
        lines: Vec<String>,
    },
    Failed {
        /// `file_not_found` or `invalid_tool_input`.
        code: &'static str,
        message: String,
    },
}

/// An editor call's arguments.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub(crate) struct EditRequest {
    pub command: String,
    pub path: String,
    #[serde(default)]
    pub file_text: Option<String>,
    #[serde(default)]
    pub old_str: Option<String>,
    #[serde(default)]
    pub new_str: Option<String>,
    #[serde(default)]
    pub view_range: Option<Vec<i64>>,
}

/// Each file's size and modification time.
type Snapshot = BTreeMap<String, (u64, chrono::DateTime<chrono::Utc>)>;

/// The last component of a name a client or the code gave a file, safe to write anywhere.
pub(crate) fn safe_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    let clean: String = base.chars().filter(|c| !c.is_control()).take(200).collect();
    match clean.trim() {
        "" | "." | ".." => "upload".to_owned(),
        s => s.to_owned(),
    }
}

/// The lines of a text (a final newline does not start another line).
fn lines_of(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    text.strip_suffix('\n')
        .unwrap_or(text)
        .split('\n')
        .collect()
}

impl Sandbox<'_> {
    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        Ok(self
            .engine
            .list_files(self.session, "")?
            .into_iter()
            .map(|f| (f.path, (f.size, f.modified_at)))
            .collect())
    }

    /// Copies each workspace file in `paths` into the store.
    fn save(&self, paths: impl IntoIterator<Item = String>) -> Vec<Saved> {
        let mut out = Vec::new();
        for path in paths {
            let data = match self.engine.read_file(self.session, &path) {
                Ok(d) => d,
                // Gone again, or over the size limit: nothing to hand over.
                Err(e) => {
                    tracing::warn!(%path, error = %runcell_engine::error_chain(&e), "an output file is not returned");
                    continue;
                }
            };
            self.keep(&mut out, path, &data);
        }
        out
    }

    fn keep(&self, out: &mut Vec<Saved>, path: String, data: &[u8]) {
        let mime = runcell_engine::mime_of(&path);
        match self.files.put(
            self.tenant,
            &safe_name(&path),
            &mime,
            data,
            Some(self.session),
        ) {
            Ok(file) => out.push(Saved { path, file }),
            Err(e) => tracing::warn!(%path, error = %e, "cannot store an output file"),
        }
    }

    /// A shell command; the files it created or changed.
    pub(crate) fn bash(&self, command: &str) -> Result<BashRun, EngineError> {
        let before = self.snapshot()?;
        let output = self.engine.run_command(self.session, command, None)?;
        let after = self.snapshot()?;
        let changed = after
            .iter()
            .filter(|(p, st)| before.get(*p) != Some(st))
            .map(|(p, _)| p.clone());
        let saved = self.save(changed);
        Ok(BashRun { output, saved })
    }

    /// A cell in the session's Python kernel (its state persists); the files it created or
    /// changed, then the figures it showed.
    pub(crate) fn python(&self, code: &str) -> Result<PythonRun, EngineError> {
        let execution = self.engine.sessions().execute_cancellable(
            self.session,
            code,
            None,
            None,
            self.cancel.clone(),
        )?;
        let saved = self.saved_by(&execution);
        Ok(PythonRun { execution, saved })
    }

    /// The files a finished cell created or changed, then the figures it showed, copied into
    /// the store (a cell run elsewhere, as one that called client tools, ends here too).
    pub(crate) fn saved_by(&self, execution: &Execution) -> Vec<Saved> {
        let mut saved = self.save(
            execution
                .files
                .iter()
                .filter(|f| f.change != FileChangeKind::Deleted)
                .map(|f| f.path.clone()),
        );
        let pngs = execution
            .results
            .iter()
            .filter_map(|r| r.data.get("image/png"));
        for (n, png) in pngs.enumerate() {
            if let Ok(data) = base64::engine::general_purpose::STANDARD.decode(png) {
                let name = format!("figure_{}_{}.png", execution.execution_count, n + 1);
                self.keep(&mut saved, name, &data);
            }
        }
        saved
    }

    /// Places an uploaded file at /workspace/NAME unless a file of that name is there
    /// already (a conversation sent again names its uploads again: what the code made of
    /// them since must not be overwritten). The path, relative to /workspace.
    pub(crate) fn place(&self, file: &StoredFile, data: &[u8]) -> Result<String, EngineError> {
        let path = safe_name(&file.filename);
        match self.engine.read_file(self.session, &path) {
            Ok(_) => {}
            Err(EngineError::NotFound(_)) => {
                self.engine.upload_file(self.session, &path, data)?;
            }
            Err(e) => return Err(e),
        }
        Ok(path)
    }

    /// The editor: `view`, `create` and `str_replace`, confined to /workspace. An `Err` is
    /// about the session itself; everything the model got wrong is an [`Edit::Failed`].
    pub(crate) fn edit(&self, req: &EditRequest) -> Result<Edit, EngineError> {
        self.engine.sessions().get(self.session)?;
        Ok(self
            .edit_inner(req)
            .unwrap_or_else(|(code, message)| Edit::Failed { code, message }))
    }

    /// The edit, or its failure's `error_code` and message.
    fn edit_inner(&self, req: &EditRequest) -> Result<Edit, (&'static str, String)> {
        let invalid = |message: String| ("invalid_tool_input", message);
        let path = workspace_path(&req.path).map_err(invalid)?;
        let shown = format!("/workspace/{path}");
        let shown = shown.trim_end_matches('/').to_owned();
        let not_found = || ("file_not_found", format!("{shown} does not exist"));
        let file_err = |e: EngineError| match e {
            EngineError::NotFound(_) => not_found(),
            other => invalid(runcell_engine::error_chain(&other)),
        };
        match req.command.as_str() {
            "view" => {
                // A directory lists its files.
                if path.is_empty() || self.engine.list_files(self.session, &path).is_ok() {
                    let files = self
                        .engine
                        .list_files(self.session, &path)
                        .map_err(file_err)?;
                    let content: String = files
                        .iter()
                        .map(|f| format!("{} ({} bytes)\n", f.path, f.size))
                        .collect();
                    let n = files.len();
                    return Ok(Edit::View {
                        content,
                        file_type: "text",
                        start_line: Some(1),
                        num_lines: Some(n),
                        total_lines: Some(n),
                        image: None,
                    });
                }
                let data = self
                    .engine
                    .read_file(self.session, &path)
                    .map_err(file_err)?;
                let mime = runcell_engine::mime_of(&path);
                if mime.starts_with("image/") {
                    let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
                    return Ok(Edit::View {
                        content: b64.clone(),
                        file_type: "image",
                        start_line: None,
                        num_lines: None,
                        total_lines: None,
                        image: Some(ToolImage {
                            mime,
                            data_base64: b64,
                        }),
                    });
                }
                let text = String::from_utf8(data).map_err(|_| {
                    invalid(format!(
                        "{shown} is not a text file: read it with code instead"
                    ))
                })?;
                let lines = lines_of(&text);
                let total = lines.len();
                let (start, end) = match req.view_range.as_deref() {
                    None => (1, total),
                    Some(&[s, e]) => {
                        let e = if e == -1 { total as i64 } else { e };
                        if s < 1 || (total > 0 && s as usize > total) || e < s {
                            return Err(invalid(format!(
                                "invalid view_range [{s}, {e}]: the file has {total} lines"
                            )));
                        }
                        (s as usize, (e as usize).min(total))
                    }
                    Some(_) => {
                        return Err(invalid(
                            "view_range must be two integers [start, end]".into(),
                        ))
                    }
                };
                let shown_lines = if total == 0 {
                    &[][..]
                } else {
                    &lines[start - 1..end]
                };
                let mut content = shown_lines.join("\n");
                if !shown_lines.is_empty() {
                    content.push('\n');
                }
                Ok(Edit::View {
                    content,
                    file_type: "text",
                    start_line: Some(start),
                    num_lines: Some(shown_lines.len()),
                    total_lines: Some(total),
                    image: None,
                })
            }
            "create" => {
                let text = req
                    .file_text
                    .as_deref()
                    .ok_or_else(|| invalid("create needs file_text".into()))?;
                if path.is_empty() {
                    return Err(invalid("create needs a file path".into()));
                }
                if text.len() as u64 > MAX_FILE_BYTES {
                    return Err(invalid(format!(
                        "file_text is over {} MiB",
                        MAX_FILE_BYTES >> 20
                    )));
                }
                let existed = self.engine.read_file(self.session, &path).is_ok();
                self.engine
                    .write_file(self.session, &path, text.as_bytes())
                    .map_err(file_err)?;
                Ok(Edit::Create {
                    path,
                    is_file_update: existed,
                })
            }
            "str_replace" => {
                let old = req
                    .old_str
                    .as_deref()
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| invalid("str_replace needs a non-empty old_str".into()))?;
                let new = req.new_str.as_deref().unwrap_or("");
                let data = self
                    .engine
                    .read_file(self.session, &path)
                    .map_err(file_err)?;
                let text = String::from_utf8(data)
                    .map_err(|_| invalid(format!("{shown} is not a text file")))?;
                let starts: Vec<usize> = text.match_indices(old).map(|(at, _)| at).collect();
                let at = match starts.as_slice() {
                    [at] => *at,
                    [] => {
                        return Err(invalid(format!(
                            "old_str did not appear verbatim in {shown}"
                        )))
                    }
                    many => {
                        return Err(invalid(format!(
                            "old_str appears {} times in {shown}: include more context so that it is unique",
                            many.len()
                        )))
                    }
                };
                let edited = format!("{}{new}{}", &text[..at], &text[at + old.len()..]);
                self.engine
                    .write_file(self.session, &path, edited.as_bytes())
                    .map_err(file_err)?;
                let line = text[..at].matches('\n').count() + 1;
                let old_lines: Vec<&str> = old.split('\n').collect();
                let new_lines: Vec<&str> = if new.is_empty() {
                    Vec::new()
                } else {
                    new.split('\n').collect()
                };
                let lines = old_lines
                    .iter()
                    .map(|l| format!("-{l}"))
                    .chain(new_lines.iter().map(|l| format!("+{l}")))
                    .collect();
                Ok(Edit::StrReplace {
                    path,
                    old_start: line,
                    old_lines: old_lines.len(),
                    new_start: line,
                    new_lines: new_lines.len(),
                    lines,
                })
            }
            other => Err(invalid(format!(
                "unknown command {other:?}: use view, create or str_replace"
            ))),
        }
    }
}

impl Edit {
    /// The outcome as the model reads it.
    pub(crate) fn text(&self) -> String {
        match self {
            Edit::View {
                content,
                file_type: "text",
                start_line,
                total_lines,
                ..
            } => {
                let first = start_line.unwrap_or(1);
                let mut out = String::new();
                for (i, l) in lines_of(content).iter().enumerate() {
                    out.push_str(&format!("{:6}\t{l}\n", first + i));
                }
                if out.is_empty() {
                    out.push_str("(empty)\n");
                }
                format!("{out}({} lines in all)", total_lines.unwrap_or_default())
            }
            Edit::View { .. } => "the image is attached".into(),
            Edit::Create {
                path,
                is_file_update,
            } => format!(
                "{} /workspace/{path}",
                if *is_file_update {
                    "overwrote"
                } else {
                    "created"
                }
            ),
            Edit::StrReplace {
                path,
                old_start,
                lines,
                ..
            } => format!(
                "edited /workspace/{path} at line {old_start}:\n{}",
                lines.join("\n")
            ),
            Edit::Failed { code, message } => format!("error ({code}): {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_their_directories_and_control_characters() {
        assert_eq!(safe_name("a/b/report.csv"), "report.csv");
        assert_eq!(safe_name("..\\..\\x.txt"), "x.txt");
        assert_eq!(safe_name("../"), "upload");
        assert_eq!(safe_name(".."), "upload");
        assert_eq!(safe_name("a\u{0}b\nc"), "abc");
        assert_eq!(safe_name(""), "upload");
    }
}
