//! The default Python runtime: a virtual environment built from the embedded lock file
//! (`runtime/python.lock`) on top of the system's `/usr/bin/python3`, kept under
//! `<data_dir>/runtimes/<name>` and bound read-only at [`SANDBOX_PYTHON_PREFIX`] inside every
//! sandbox.
//!
//! Layout of the runtimes root:
//! - `<name>/` a complete runtime; complete means its marker file (`.runcell-complete`) exists.
//!   The marker is written last inside a `.tmp-*` build directory, which is then renamed into
//!   place, so a crash never leaves a directory that looks complete.
//! - `.tmp-*` build (or removal) directories; stale ones are deleted by the next install.
//! - `.install.lock` the file that installs and removals take an exclusive `flock` on.
//!
//! The venv's `bin/python` is a symlink to `/usr/bin/python3` (read-only in the sandbox as
//! well) and `pyvenv.cfg` sits next to `bin/`, so the venv works from any mount point. Bytecode
//! is compiled ahead of time (the sandbox cannot write `__pycache__`), and the whole tree is made
//! world-readable because the sandbox user reads it through the "other" permission bits.

mod error;
mod lock;
mod python;
mod registry;
mod venv;

pub use error::RuntimeError;
pub use lock::PYTHON_LOCK;
pub use registry::{name_for, RuntimeInfo, Runtimes};
pub use venv::{InstallEvent, SANDBOX_PYTHON_BIN, SANDBOX_PYTHON_ENV, SANDBOX_PYTHON_PREFIX};
