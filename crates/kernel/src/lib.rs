//! runcell-kernel: the host side of one session — start its kernel in a sandbox, speak the
//! protocol, enforce deadlines and output caps, report how it ended so it can be restarted.
//! `python/runcell_kernel.py` is the in-sandbox Python kernel (stdlib only); `programs`
//! says how each language's kernel is started.
#![forbid(unsafe_code)]

mod process;
mod programs;
pub mod runtime;
mod snapshot;
mod tools;

pub use process::{
    blocking, CellError, CellEvent, CellOptions, CellOutcome, CellStatus, DroppedResults, Kernel,
    KernelError, ResultLimits, MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES,
};
pub use programs::{
    KernelProgram, BASH, JAVASCRIPT, KERNELS, KERNEL_FILES, NODE, PYTHON, SANDBOX_KERNEL_DIR,
    SNAPSHOT_MODULE, SYSTEM_PYTHON,
};
pub use runcell_protocol::{IncompatibleField, SkippedName, SnapshotRefusal};
pub use runcell_protocol::{ToolFailure, ToolFailureKind};
pub use snapshot::{RestoreReport, SnapshotError, SnapshotOptions, SnapshotReport};
pub use tools::{CellTools, KernelToolCall, ToolAnswer, ToolSink, MAX_WAIT_CREDIT};
