//! What the kernels say about a language-state snapshot (issue 17, durable sessions): the
//! names a `snapshot` saved or a `restore` brought back, the ones it could not, and why a
//! snapshot file was refused.
//!
//! The file itself is the kernel's business: it is written and read inside the sandbox
//! (`crates/kernel/python/runcell_snapshot.py` holds its format), and the host only moves
//! its bytes. Pickles are code, so the host never looks inside one.

use serde::{Deserialize, Serialize};

/// Names a report lists at most; the rest are counted in `omitted`. A namespace of a million
/// variables must not make a report frame larger than the host keeps.
pub const MAX_REPORT_NAMES: usize = 4096;

/// A name that was left out, and why (an open file, a socket, a thread, a generator, a lock,
/// a module that cannot be imported, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedName {
    pub name: String,
    pub reason: String,
}

/// Why a snapshot file cannot be restored. Nothing of it was unpickled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum SnapshotRefusal {
    /// No file at the path.
    #[error("no snapshot at the path: {message}")]
    Missing { message: String },
    /// The file ends before the length its header gives.
    #[error("the snapshot is truncated: {message}")]
    Truncated { message: String },
    /// Not a runcell snapshot, or its checksum does not match its content.
    #[error("the snapshot is corrupt: {message}")]
    Corrupt { message: String },
    /// Taken by a runtime this kernel cannot read: `field` says which part differs.
    #[error(
        "the snapshot is incompatible: its {field} is {found:?}, this kernel needs {expected:?}"
    )]
    Incompatible {
        field: IncompatibleField,
        found: String,
        expected: String,
    },
}

/// The part of a snapshot's header that made it incompatible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncompatibleField {
    /// The file layout itself.
    FormatVersion,
    /// Taken by another kernel (a bash snapshot given to Python).
    Language,
    /// Another interpreter version (Python's bytecode changes with each minor version).
    LanguageVersion,
    /// Another serializer (cloudpickle, or the stdlib's pickle where it is missing).
    Serializer,
    /// Another version of the serializer (cloudpickle only promises to read its own).
    SerializerVersion,
}

impl std::fmt::Display for IncompatibleField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IncompatibleField::FormatVersion => "format version",
            IncompatibleField::Language => "language",
            IncompatibleField::LanguageVersion => "language version",
            IncompatibleField::Serializer => "serializer",
            IncompatibleField::SerializerVersion => "serializer version",
        })
    }
}
