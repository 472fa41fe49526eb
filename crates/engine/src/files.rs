//! Host-side file operations on a session's workspace: upload, list, download, delete. Every
//! path is relative to /workspace and checked; nothing follows a symlink the sandbox planted.

use chrono::{DateTime, Utc};
use runcell_sandbox::WorkspaceError;
use serde::Serialize;

use crate::bounds::MAX_FILE_BYTES;
use crate::engine::Engine;
use crate::error::{Invalid, Limit, Resource, WorkspaceConflict};
use crate::EngineError;

/// One file in a listing.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub mime: String,
    #[serde(serialize_with = "crate::model::rfc3339")]
    pub modified_at: DateTime<Utc>,
}

/// Whether an operation only looks (a read, a listing, a delete) or writes: a path below a
/// file names nothing that could exist, so a look answers "not found" where a write conflicts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Look,
    Write,
}

pub(crate) fn map_err(op: Op) -> impl Fn(WorkspaceError) -> EngineError {
    move |e| map_workspace_error(op, e)
}

fn map_workspace_error(op: Op, e: WorkspaceError) -> EngineError {
    let (errno, kind, path) = match &e {
        WorkspaceError::InvalidPath { path, reason } => {
            return EngineError::InvalidRequest(Invalid::Path {
                path: path.clone(),
                reason,
            })
        }
        WorkspaceError::Io { source, path, .. } => (
            source.raw_os_error(),
            source.kind(),
            path.display().to_string(),
        ),
    };
    let conflict = EngineError::Conflict;
    match errno {
        Some(2) => EngineError::NotFound(Resource::File { path }),
        // ENOTDIR: a component is a file.
        Some(20) if op == Op::Look => EngineError::NotFound(Resource::File { path }),
        // ENOTDIR, ELOOP: a component is a file, or a symlink (never followed).
        Some(20) | Some(40) => conflict(WorkspaceConflict::NotADirectory { path }),
        Some(21) => conflict(WorkspaceConflict::IsADirectory { path }),
        Some(39) => conflict(WorkspaceConflict::NotEmpty { path }),
        // ENAMETOOLONG: a name of wide characters, within the API's 255 characters but over
        // the filesystem's 255 bytes.
        Some(36) => conflict(WorkspaceConflict::NameTooLong { path }),
        Some(28) => EngineError::LimitExceeded(Limit::WorkspaceFull { path }),
        _ if kind == std::io::ErrorKind::FileTooLarge => {
            EngineError::LimitExceeded(Limit::FileTooLarge {
                path,
                maximum_bytes: MAX_FILE_BYTES,
            })
        }
        _ if kind == std::io::ErrorKind::InvalidInput => {
            conflict(WorkspaceConflict::NotARegularFile { path })
        }
        _ => EngineError::sandbox(e),
    }
}

/// A sync that failed. ENOSPC there is never the workspace's own quota (a write past that
/// fails at the write): its image could not grow on the data dir's filesystem, which is full.
fn sync_error(e: WorkspaceError) -> EngineError {
    match e {
        // ENOSPC.
        WorkspaceError::Io { ref source, .. } if source.raw_os_error() == Some(28) => {
            tracing::warn!(error = %crate::chain(&e), "the data dir is full");
            crate::core::no_space("write")
        }
        WorkspaceError::Io {
            action,
            path,
            source,
        } => EngineError::Io {
            action,
            path,
            source,
        },
        other => EngineError::sandbox(other),
    }
}

fn entry(path: String, st: runcell_sandbox::FileStat) -> FileEntry {
    FileEntry {
        mime: crate::mime_of(&path),
        size: st.size,
        modified_at: DateTime::<Utc>::from(st.modified),
        path,
    }
}

impl Engine {
    /// Writes a file into the session's workspace (parents created), owned by the sandbox
    /// user, and returns its listing entry once it is on disk.
    pub fn write_file(
        &self,
        session: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, EngineError> {
        let entry = self.write_file_unsynced(session, path, data)?;
        self.sync_files(session)?;
        Ok(entry)
    }

    /// [`Engine::write_file`] without making it durable: for a request that writes many files
    /// (a multipart upload), which calls [`Engine::sync_files`] once before its reply.
    pub fn write_file_unsynced(
        &self,
        session: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, EngineError> {
        if data.len() as u64 > MAX_FILE_BYTES {
            return Err(EngineError::LimitExceeded(Limit::UploadTooLarge {
                size: data.len() as u64,
                maximum_bytes: MAX_FILE_BYTES,
            }));
        }
        let ws = self.sessions().workspace(session)?;
        let st = ws.write_file(path, data).map_err(map_err(Op::Write))?;
        // The name the listing would give it: the path as checked, components joined by `/`.
        let path = runcell_sandbox::validate_relative(path)
            .map_err(map_err(Op::Write))?
            .join("/");
        Ok(entry(path, st))
    }

    /// [`Engine::write_file`] for a client's upload: recorded (its size and SHA-256) with the
    /// session, where sessions are recorded, and on disk, before it is acknowledged.
    pub fn upload_file(
        &self,
        session: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, EngineError> {
        let entry = self.upload_file_unsynced(session, path, data)?;
        self.sync_files(session)?;
        Ok(entry)
    }

    /// [`Engine::upload_file`] without making it durable: for a request that uploads many
    /// files (a multipart upload), which calls [`Engine::sync_files`] once before its reply.
    pub fn upload_file_unsynced(
        &self,
        session: &str,
        path: &str,
        data: &[u8],
    ) -> Result<FileEntry, EngineError> {
        let entry = self.write_file_unsynced(session, path, data)?;
        if let Some(store) = self.core.session_store() {
            let sha256 = {
                use sha2::Digest;
                let d = sha2::Sha256::digest(data);
                d.iter().map(|b| format!("{b:02x}")).collect::<String>()
            };
            store
                .record_upload(session, &entry.path, entry.size, &sha256, Utc::now())
                .map_err(crate::records::store_error)?;
        }
        Ok(entry)
    }

    /// Walks of the session's workspace tree so far (every cell takes two; an upload none).
    #[cfg(feature = "test-support")]
    pub fn workspace_scans(&self, session: &str) -> Result<u64, EngineError> {
        Ok(self.sessions().workspace(session)?.scans())
    }

    pub fn read_file(&self, session: &str, path: &str) -> Result<Vec<u8>, EngineError> {
        let ws = self.sessions().workspace(session)?;
        ws.read_file(path, MAX_FILE_BYTES)
            .map_err(map_err(Op::Look))
    }

    /// Puts everything written to the session's workspace so far on disk (a no-op for a
    /// workspace in memory).
    pub fn sync_files(&self, session: &str) -> Result<(), EngineError> {
        let ws = self.sessions().workspace(session)?;
        ws.sync().map_err(sync_error)
    }

    pub fn delete_file(&self, session: &str, path: &str) -> Result<(), EngineError> {
        let ws = self.sessions().workspace(session)?;
        ws.delete(path).map_err(map_err(Op::Look))?;
        // A deleted file does not come back after a crash either.
        ws.sync().map_err(sync_error)
    }

    /// Files under `dir` ("" for all), sorted by path.
    pub fn list_files(&self, session: &str, dir: &str) -> Result<Vec<FileEntry>, EngineError> {
        let ws = self.sessions().workspace(session)?;
        let files = ws.list(dir).map_err(map_err(Op::Look))?;
        Ok(files
            .into_iter()
            .map(|(path, st)| entry(path, st))
            .collect())
    }
}
