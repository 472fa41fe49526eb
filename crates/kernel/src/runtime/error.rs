//! Errors of installing, reading and removing runtimes.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// Errors of installing, reading and removing runtimes.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot run {}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unexpected version output from {}: {output:?}", path.display())]
    PythonVersion { path: PathBuf, output: String },
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{step} failed ({status}); last output:\n{tail}")]
    StepFailed {
        step: &'static str,
        status: ExitStatus,
        tail: String,
    },
    #[error("invalid lock file line {line}: {reason}")]
    Lock { line: usize, reason: String },
    #[error("cannot write runtime marker {}", path.display())]
    Marker {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid runtime name {0:?}")]
    InvalidName(String),
    #[error("no runtime {}", path.display())]
    NotFound { path: PathBuf },
}

pub(super) fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
