//! What one execution may bring in and give back: the code it runs, and the results it
//! returns and the audit log stores. Output streams are capped by the sandbox (1 MiB each);
//! results by the kernel's host side, while they are read ([`runcell_kernel::ResultLimits`]).

use crate::EngineError;

pub use runcell_kernel::{MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES};

/// Bytes of code one execution may run (a session cell, a one-shot program, a tool call).
/// Code is written by people and models, and 1 MiB of it is some 25,000 lines; data belongs
/// in files (uploads take up to 100 MiB). With the results and output caps it bounds what
/// the audit log stores for an execution.
pub const MAX_CODE_BYTES: usize = 1 << 20;

/// Bytes of a shell command (`POST /v1/sessions/{id}/commands`, the bash tool): it is run as
/// `bash -c COMMAND`, and Linux takes no single program argument longer than this
/// (MAX_ARG_STRLEN, 128 KiB with its terminating NUL).
pub const MAX_COMMAND_BYTES: usize = (128 << 10) - 1;

/// `Err(PayloadTooLarge)` for code over [`MAX_CODE_BYTES`], naming the cap.
pub fn check_code(code: &str) -> Result<(), EngineError> {
    check("the code", code, MAX_CODE_BYTES)
}

/// `Err(PayloadTooLarge)` for a command over [`MAX_COMMAND_BYTES`], naming the cap.
pub(crate) fn check_command(command: &str) -> Result<(), EngineError> {
    check("the command", command, MAX_COMMAND_BYTES)
}

fn check(what: &str, text: &str, limit: usize) -> Result<(), EngineError> {
    if text.len() > limit {
        return Err(EngineError::PayloadTooLarge(format!(
            "{what} is {} bytes, over the limit of {limit} bytes; put data and long scripts in files instead",
            text.len()
        )));
    }
    Ok(())
}
