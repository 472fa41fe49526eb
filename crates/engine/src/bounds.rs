//! What one request may bring in and one execution give back, in one table ([`BOUNDS`]):
//! the code it runs, the files it moves, the metadata a session carries, the results and file
//! changes it returns and the audit log stores. docs/api.md lists the same table (a test
//! checks it), and every refusal quotes the bound it hit. Output streams are capped by the
//! sandbox (1 MiB each); results by the kernel's host side while they are read
//! ([`runcell_kernel::ResultLimits`]); session limits (memory, time) are policy, in
//! [`crate::limits`].

use std::collections::BTreeMap;

use crate::error::{Invalid, Oversize};
use crate::EngineError;

pub use runcell_kernel::{MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES};

/// Bytes of code one execution may run (a session cell, a one-shot program, a tool call).
/// Code is written by people and models, and 1 MiB of it is some 25,000 lines; data belongs
/// in files (uploads take up to [`MAX_FILE_BYTES`]). With the results and output caps it
/// bounds what the audit log stores for an execution, and, JSON-escaped (at most six bytes
/// a byte), it always fits the kernel channel's frame ([`runcell_protocol::MAX_FRAME`]).
pub const MAX_CODE_BYTES: usize = 1 << 20;
const _: () = assert!(MAX_CODE_BYTES * 6 + 4096 < runcell_protocol::MAX_FRAME);

/// Bytes of a shell command (`POST /v1/sessions/{id}/commands`, the bash tool): it is run as
/// `bash -c COMMAND`, and Linux takes no single program argument longer than this
/// (MAX_ARG_STRLEN, 128 KiB with its terminating NUL).
pub const MAX_COMMAND_BYTES: usize = (128 << 10) - 1;

/// Largest file a single upload or download moves (DESIGN.md §7).
pub const MAX_FILE_BYTES: u64 = 100 << 20;

/// Largest request body: an upload of [`MAX_FILE_BYTES`] plus its multipart framing, or a
/// one-shot run with its files (base64 takes 4 bytes for 3).
pub const MAX_REQUEST_BYTES: usize = (MAX_FILE_BYTES as usize) + (1 << 20);

/// A session's `metadata`: keys at most, characters of a key and of a value. Metadata labels a
/// session (who, which task) and is returned by every listing, so it is kept small, like
/// OpenAI's (16 pairs of 64/512 characters) and Kubernetes' labels: 36,864 characters at most
/// in all. Characters, not bytes, because that is what the API's document (JSON Schema's
/// `maxLength`) can state, and what a client counts.
pub const MAX_METADATA_KEYS: usize = 64;
pub const MAX_METADATA_KEY_CHARS: usize = 64;
pub const MAX_METADATA_VALUE_CHARS: usize = 512;

/// A session's `env`: variables at most, bytes of one `NAME=value`, and of all of them. The
/// kernel is started with them: Linux refuses (E2BIG) any single string over 128 KiB and an
/// environment past a quarter of the stack limit, so these stay well below both, with room
/// for runcell's own variables.
pub const MAX_ENV_VARS: usize = 256;
pub const MAX_ENV_VAR_BYTES: usize = 32 << 10;
pub const MAX_ENV_BYTES: usize = 256 << 10;

/// File changes one execution reports at most (`files`); past it `truncated.files` says the
/// list is partial. A cell may touch every file of a workspace of hundreds of thousands.
pub const MAX_FILE_CHANGES: usize = 1000;

/// One row of [`BOUNDS`].
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// What is bounded, as docs/api.md names it.
    pub name: &'static str,
    pub value: u64,
    pub unit: &'static str,
    /// What a request past it gets.
    pub refusal: &'static str,
}

impl Bound {
    /// The value as docs/api.md shows it: `1 MiB (1048576 bytes)`, `64 keys`.
    pub fn display(&self) -> String {
        let v = self.value;
        match self.unit {
            "bytes" if v >= 1 << 20 && v.is_multiple_of(1 << 20) => {
                format!("{} MiB ({v} bytes)", v >> 20)
            }
            "bytes" if v >= 1 << 10 && v.is_multiple_of(1 << 10) => {
                format!("{} KiB ({v} bytes)", v >> 10)
            }
            unit => format!("{v} {unit}"),
        }
    }
}

/// Every bound of this module, as docs/api.md lists it.
pub const BOUNDS: &[Bound] = &[
    Bound {
        name: "request body",
        value: MAX_REQUEST_BYTES as u64,
        unit: "bytes",
        refusal: "413 payload_too_large",
    },
    Bound {
        name: "code",
        value: MAX_CODE_BYTES as u64,
        unit: "bytes",
        refusal: "413 payload_too_large",
    },
    Bound {
        name: "command",
        value: MAX_COMMAND_BYTES as u64,
        unit: "bytes",
        refusal: "413 payload_too_large",
    },
    Bound {
        name: "file",
        value: MAX_FILE_BYTES,
        unit: "bytes",
        refusal: "400 limit_exceeded",
    },
    Bound {
        name: "metadata keys",
        value: MAX_METADATA_KEYS as u64,
        unit: "keys",
        refusal: "400 invalid_request",
    },
    Bound {
        name: "metadata key",
        value: MAX_METADATA_KEY_CHARS as u64,
        unit: "characters",
        refusal: "400 invalid_request",
    },
    Bound {
        name: "metadata value",
        value: MAX_METADATA_VALUE_CHARS as u64,
        unit: "characters",
        refusal: "400 invalid_request",
    },
    Bound {
        name: "env variables",
        value: MAX_ENV_VARS as u64,
        unit: "variables",
        refusal: "400 invalid_request",
    },
    Bound {
        name: "env variable",
        value: MAX_ENV_VAR_BYTES as u64,
        unit: "bytes",
        refusal: "400 invalid_request",
    },
    Bound {
        name: "env",
        value: MAX_ENV_BYTES as u64,
        unit: "bytes",
        refusal: "400 invalid_request",
    },
    Bound {
        name: "results",
        value: MAX_RESULTS as u64,
        unit: "results",
        refusal: "dropped, `truncated.results`",
    },
    Bound {
        name: "result",
        value: MAX_RESULT_BYTES as u64,
        unit: "bytes",
        refusal: "dropped, `truncated.results`",
    },
    Bound {
        name: "results total",
        value: MAX_RESULTS_BYTES as u64,
        unit: "bytes",
        refusal: "dropped, `truncated.results`",
    },
    Bound {
        name: "file changes",
        value: MAX_FILE_CHANGES as u64,
        unit: "changes",
        refusal: "listed in part, `truncated.files`",
    },
];

/// `Err(PayloadTooLarge)` for code over [`MAX_CODE_BYTES`], naming the cap.
pub fn check_code(code: &str) -> Result<(), EngineError> {
    check("the code", code, MAX_CODE_BYTES)
}

/// `Err(PayloadTooLarge)` for a command over [`MAX_COMMAND_BYTES`], naming the cap.
/// `Err(InvalidRequest)` for a NUL byte, which no program argument can hold.
pub(crate) fn check_command(command: &str) -> Result<(), EngineError> {
    check("the command", command, MAX_COMMAND_BYTES)?;
    if command.contains('\0') {
        return Err(EngineError::InvalidRequest(Invalid::NulInCommand));
    }
    Ok(())
}

fn check(what: &'static str, text: &str, limit: usize) -> Result<(), EngineError> {
    if text.len() > limit {
        return Err(EngineError::PayloadTooLarge(Oversize {
            what,
            size: text.len(),
            limit,
        }));
    }
    Ok(())
}

/// `Err(InvalidRequest)` for metadata over any of the `MAX_METADATA_*` bounds, naming it.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), EngineError> {
    let bad = |m: String| Err(EngineError::InvalidRequest(Invalid::Metadata(m)));
    if metadata.len() > MAX_METADATA_KEYS {
        return bad(format!(
            "{} keys, over the limit of {MAX_METADATA_KEYS}",
            metadata.len()
        ));
    }
    for (k, v) in metadata {
        if k.is_empty() {
            return bad("a key is empty".into());
        }
        // A string of n bytes has at most n characters: most need no count.
        let chars = if k.len() > MAX_METADATA_KEY_CHARS {
            k.chars().count()
        } else {
            0
        };
        if chars > MAX_METADATA_KEY_CHARS {
            return bad(format!(
                "key {:?}… is {chars} characters, over the limit of {MAX_METADATA_KEY_CHARS} characters",
                prefix(k),
            ));
        }
        let chars = if v.len() > MAX_METADATA_VALUE_CHARS {
            v.chars().count()
        } else {
            0
        };
        if chars > MAX_METADATA_VALUE_CHARS {
            return bad(format!(
                "the value of {k:?} is {chars} characters, over the limit of {MAX_METADATA_VALUE_CHARS} characters",
            ));
        }
    }
    Ok(())
}

/// `Err(InvalidRequest)` for an environment over any of the `MAX_ENV_*` bounds, naming it.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), EngineError> {
    let bad = |m: String| Err(EngineError::InvalidRequest(Invalid::Env(m)));
    if env.len() > MAX_ENV_VARS {
        return bad(format!(
            "{} variables, over the limit of {MAX_ENV_VARS}",
            env.len()
        ));
    }
    let mut total = 0;
    for (k, v) in env {
        // `execve` takes `NAME=value` strings ending in NUL: a name must be a name, and no
        // NUL can be passed anywhere.
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return bad(format!("invalid variable name {:?}", prefix(k)));
        }
        if v.contains('\0') {
            return bad(format!(
                "the value of {:?} contains a NUL byte, which no environment can hold",
                prefix(k)
            ));
        }
        // `NAME=value` and its NUL, as the kernel counts it.
        let len = k.len() + v.len() + 2;
        if len > MAX_ENV_VAR_BYTES {
            return bad(format!(
                "{:?}… is {len} bytes as NAME=value, over the limit of {MAX_ENV_VAR_BYTES} bytes",
                prefix(k)
            ));
        }
        total += len;
    }
    if total > MAX_ENV_BYTES {
        return bad(format!(
            "{total} bytes in all, over the limit of {MAX_ENV_BYTES} bytes"
        ));
    }
    Ok(())
}

/// The first few characters of `s`, for a message about a string too long to quote.
fn prefix(s: &str) -> &str {
    let mut end = s.len().min(16);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_held_to_every_bound() {
        let ok = |m: &[(String, String)]| check_metadata(&m.iter().cloned().collect());
        let kv = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        assert!(ok(&[kv("user", "alice")]).is_ok());
        let at_limits: Vec<_> = (0..MAX_METADATA_KEYS)
            .map(|i| kv(&format!("{i:0>2}"), &"v".repeat(200)))
            .collect();
        assert!(ok(&at_limits).is_ok(), "64 keys of 202 characters");
        // Every key and value at its bound, in characters that take 3 bytes each.
        let wide: Vec<_> = (0..MAX_METADATA_KEYS)
            .map(|i| kv(&format!("{i:€>64}"), &"€".repeat(512)))
            .collect();
        assert!(ok(&wide).is_ok(), "64 keys of 576 three-byte characters");
        let msg = |r: Result<(), EngineError>| match r {
            Err(EngineError::InvalidRequest(Invalid::Metadata(m))) => m,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let too_many: Vec<_> = (0..=MAX_METADATA_KEYS)
            .map(|i| kv(&i.to_string(), ""))
            .collect();
        assert!(msg(ok(&too_many)).contains("65 keys, over the limit of 64"));
        assert!(msg(ok(&[kv(&"k".repeat(65), "")])).contains("over the limit of 64 characters"));
        assert!(msg(ok(&[kv(&"€".repeat(65), "")])).contains("65 characters"));
        assert!(msg(ok(&[kv("k", &"v".repeat(513))])).contains("over the limit of 512 characters"));
        assert!(msg(ok(&[kv("", "v")])).contains("empty"));
    }

    #[test]
    fn env_is_held_to_every_bound() {
        let env = |pairs: Vec<(String, String)>| check_env(&pairs.into_iter().collect());
        assert!(env(vec![("A".into(), "x".repeat(30 << 10))]).is_ok());
        let too_long = env(vec![("A".into(), "x".repeat(200_000))]);
        assert!(
            matches!(&too_long, Err(EngineError::InvalidRequest(Invalid::Env(m))) if m.contains("over the limit of 32768 bytes")),
            "{too_long:?}"
        );
        let many = env((0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect());
        assert!(
            matches!(&many, Err(EngineError::InvalidRequest(Invalid::Env(m))) if m.contains("257 variables"))
        );
        let big = env((0..10)
            .map(|i| (format!("V{i}"), "x".repeat(30_000)))
            .collect());
        assert!(
            matches!(&big, Err(EngineError::InvalidRequest(Invalid::Env(m))) if m.contains("in all"))
        );
    }

    /// docs/api.md's Limits section lists every bound with its value.
    #[test]
    fn the_docs_list_every_bound() {
        let doc = include_str!("../../../docs/api.md");
        for b in BOUNDS {
            let row = format!("| {} | {} | {} |", b.name, b.display(), b.refusal);
            assert!(doc.contains(&row), "docs/api.md lacks the row {row:?}");
        }
    }
}
