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

/// Bytes of the environment variables a session is created with, `NAME=value` each: they are
/// settings (a token, a URL, a flag), not data, and the kernel's `execve` takes them with its
/// own environment within a bound of its own (each string under 128 KiB, all of them within a
/// quarter of the stack limit).
pub const MAX_ENV_BYTES: usize = 64 << 10;

/// `Err(PayloadTooLarge)` for code over [`MAX_CODE_BYTES`], naming the cap.
pub fn check_code(code: &str) -> Result<(), EngineError> {
    check("the code", code, MAX_CODE_BYTES)
}

/// `Err(PayloadTooLarge)` for a command over [`MAX_COMMAND_BYTES`], naming the cap.
/// `Err(InvalidRequest)` for a NUL byte, which no program argument can hold.
pub(crate) fn check_command(command: &str) -> Result<(), EngineError> {
    check("the command", command, MAX_COMMAND_BYTES)?;
    if command.contains('\0') {
        return Err(EngineError::InvalidRequest(
            "the command contains a NUL byte, which no program argument can hold".into(),
        ));
    }
    Ok(())
}

/// A session's extra environment: names that are names (not empty, no `=`), no NUL byte
/// anywhere (`execve` cannot pass one), and at most [`MAX_ENV_BYTES`] in all.
pub(crate) fn check_env(
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(), EngineError> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(EngineError::InvalidRequest(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::InvalidRequest(format!(
                "environment variable {k:?} contains a NUL byte, which no environment can hold"
            )));
        }
    }
    let total: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if total > MAX_ENV_BYTES {
        return Err(EngineError::PayloadTooLarge(format!(
            "the environment is {total} bytes, over the limit of {MAX_ENV_BYTES} bytes; put data in files instead"
        )));
    }
    Ok(())
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
