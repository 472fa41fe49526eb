//! What a resume brought back of a session's variables (issue 17): the reply of
//! `POST /v1/sessions/{id}/resume` and `Execution.restored` (durable.rs makes them).

use serde::{Deserialize, Serialize};

/// What a resume brought back of a session's variables: in the reply of
/// `POST /v1/sessions/{id}/resume`, and on the first Execution after a resume nobody asked
/// for (a request to a paused session, a restart of the server).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Restored {
    /// The names restored.
    pub names: Vec<String>,
    /// Names that were not saved at the pause or could not be restored, and why (an open
    /// file, a socket, a thread, a generator, a module that is gone).
    pub skipped: Vec<Skipped>,
    /// Set when no variables came back, only the files: why (the snapshot is corrupt,
    /// truncated, from an incompatible runtime, or the language cannot save its state).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_only: Option<String>,
    /// Executions whose effects on variables were lost: those that ran after the last
    /// snapshot of a session whose server was killed (their files are kept).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost_executions: Vec<String>,
}

/// A name left out, and why.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

impl From<runcell_kernel::SkippedName> for Skipped {
    fn from(s: runcell_kernel::SkippedName) -> Self {
        Skipped {
            name: s.name,
            reason: s.reason,
        }
    }
}
