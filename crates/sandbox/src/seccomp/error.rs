//! The seccomp layer's one error type.

use seccompiler::BackendError;

/// Errors building or installing the filters.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The policy tables list a call twice.
    #[error("system call {name} is listed twice in the seccomp policy")]
    Duplicate {
        /// The call.
        name: &'static str,
    },
    /// The policy tables both allow and deny (or fake) a call.
    #[error("system call {name} is both allowed and denied in the seccomp policy")]
    AllowedAndDenied {
        /// The call.
        name: &'static str,
    },
    /// A denied entry has an errno the kernel can't return.
    #[error("system call {name} is denied with errno {errno}, outside 1..=4095")]
    BadErrno {
        /// The call.
        name: &'static str,
        /// The errno.
        errno: i32,
    },
    /// An argument condition was rejected by seccompiler.
    #[error("cannot build the argument rule for system call {name}")]
    Rule {
        /// The call.
        name: &'static str,
        /// seccompiler's error.
        #[source]
        source: BackendError,
    },
    /// seccompiler could not compile a filter.
    #[error("cannot compile the {filter} seccomp filter")]
    Compile {
        /// Which filter.
        filter: &'static str,
        /// seccompiler's error.
        #[source]
        source: BackendError,
    },
    /// The kernel refused a filter. Earlier filters may already be in force.
    #[error("cannot install seccomp filter {index} of {count}")]
    Install {
        /// Position of the filter in [`super::build`]'s output.
        index: usize,
        /// How many filters there are.
        count: usize,
        /// seccompiler's error, with the OS error inside.
        #[source]
        source: seccompiler::Error,
    },
}
