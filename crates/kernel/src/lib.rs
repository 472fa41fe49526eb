//! runcell-kernel: the host side of one session — start its kernel in a sandbox, speak the
//! protocol, enforce deadlines and output caps, report how it ended so it can be restarted.
//! `python/runcell_kernel.py` is the in-sandbox Python kernel (stdlib only).
#![forbid(unsafe_code)]

mod process;
pub mod runtime;

pub use process::{
    CellError, CellEvent, CellOptions, CellOutcome, CellStatus, Kernel, KernelError,
};

/// The in-sandbox Python kernel, embedded so the binary is all a host needs.
pub const PYTHON_KERNEL: &str = include_str!("../python/runcell_kernel.py");
