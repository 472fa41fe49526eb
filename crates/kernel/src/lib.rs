//! runcell-kernel: the host side of one session — start its kernel in a sandbox, speak the
//! protocol, enforce deadlines and output caps, report how it ended so it can be restarted.
//! `python/runcell_kernel.py` is the in-sandbox Python kernel (stdlib only).
#![forbid(unsafe_code)]

mod process;
pub mod runtime;
mod snapshot;

pub use process::{
    blocking, CellError, CellEvent, CellOptions, CellOutcome, CellStatus, DroppedResults, Kernel,
    KernelError, ResultLimits, MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES,
};
pub use runcell_protocol::{IncompatibleField, SkippedName, SnapshotRefusal};
pub use snapshot::{RestoreReport, SnapshotError, SnapshotOptions, SnapshotReport};

/// The in-sandbox Python kernel, embedded so the binary is all a host needs.
pub const PYTHON_KERNEL: &str = include_str!("../python/runcell_kernel.py");
/// Snapshots of the language state (file format, Python namespace serializer), imported by
/// the Python and bash kernels from their own directory.
pub const SNAPSHOT_MODULE: &str = include_str!("../python/runcell_snapshot.py");
/// The bash kernel: a stdlib Python program driving one persistent bash.
pub const BASH_KERNEL: &str = include_str!("../bash/runcell_bash_kernel.py");
/// The JavaScript kernel, for Node.js (built-in modules only).
pub const JAVASCRIPT_KERNEL: &str = include_str!("../javascript/runcell_js_kernel.js");

/// Every kernel program with the file name it is run as inside the sandbox.
pub const KERNEL_FILES: &[(&str, &str)] = &[
    ("runcell_kernel.py", PYTHON_KERNEL),
    ("runcell_snapshot.py", SNAPSHOT_MODULE),
    ("runcell_bash_kernel.py", BASH_KERNEL),
    ("runcell_js_kernel.js", JAVASCRIPT_KERNEL),
];
