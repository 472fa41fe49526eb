//! What one execution may bring in and give back: the code it runs, and the results it
//! returns and the audit log stores. Output streams are capped by the sandbox (1 MiB each);
//! results by the kernel's host side, while they are read ([`runcell_kernel::ResultLimits`]).

use crate::EngineError;

pub use runcell_kernel::{MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES};

/// Bytes of code one execution may run (a session cell, a one-shot program, a command, a
/// tool call). Code is written by people and models, and 1 MiB of it is some 25,000 lines;
/// data belongs in files (uploads take up to 100 MiB). It bounds what the audit log stores
/// for an execution, with the results and output caps.
pub const MAX_CODE_BYTES: usize = 1 << 20;

/// `Err(PayloadTooLarge)` for code over [`MAX_CODE_BYTES`]; `what` names it for the message.
pub(crate) fn check_code(what: &str, code: &str) -> Result<(), EngineError> {
    if code.len() > MAX_CODE_BYTES {
        return Err(EngineError::PayloadTooLarge(format!(
            "{what} is {} bytes, over the limit of {MAX_CODE_BYTES} bytes (1 MiB); put data in files instead",
            code.len()
        )));
    }
    Ok(())
}
