//! runcell-kernel: the host side of one session — start its kernel in a sandbox, speak the
//! protocol, enforce deadlines and output caps, report how it ended so it can be restarted.
//! `python/runcell_kernel.py` is the in-sandbox Python kernel (stdlib only).
#![forbid(unsafe_code)]

mod process;
pub mod runtime;

pub use process::{
    blocking, CellError, CellEvent, CellOptions, CellOutcome, CellStatus, DroppedResults, Kernel,
    KernelError, ResultLimits, MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES,
};

/// The in-sandbox Python kernel, embedded so the binary is all a host needs.
pub const PYTHON_KERNEL: &str = include_str!("../python/runcell_kernel.py");
/// The wire framing both Python kernels import, shipped beside them.
pub const PYTHON_WIRE: &str = include_str!("../python/runcell_wire.py");
/// The bash kernel: a stdlib Python program driving one persistent bash.
pub const BASH_KERNEL: &str = include_str!("../bash/runcell_bash_kernel.py");
/// The JavaScript kernel, for Node.js (built-in modules only).
pub const JAVASCRIPT_KERNEL: &str = include_str!("../javascript/runcell_js_kernel.js");
/// The JavaScript kernel's source adjustments (imports, object literals), required from beside it.
pub const JAVASCRIPT_SOURCE: &str = include_str!("../javascript/runcell_js_source.js");

/// Every file of the kernels (the programs and the module the Python ones share) with its name
/// in the kernel directory: one flat directory, where a Python kernel finds its imports on
/// `sys.path` as a script (cold) and as the zygote's preloaded module alike.
pub const KERNEL_FILES: &[(&str, &str)] = &[
    ("runcell_kernel.py", PYTHON_KERNEL),
    ("runcell_wire.py", PYTHON_WIRE),
    ("runcell_bash_kernel.py", BASH_KERNEL),
    ("runcell_js_kernel.js", JAVASCRIPT_KERNEL),
    ("runcell_js_source.js", JAVASCRIPT_SOURCE),
];
