//! Input checks and key material shared by every backend.

use sha2::{Digest, Sha256};

use crate::error::{Result, StoreError};

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Length of the random part of an API key.
pub(crate) const KEY_RANDOM_LEN: usize = 40;
/// Characters of the key kept for display ("rc_" + 4).
pub(crate) const KEY_PREFIX_LEN: usize = 7;

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// Key names and tenant names: 1..=64 chars of `[A-Za-z0-9_.-]`.
pub(crate) fn name(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > 64 || !s.chars().all(allowed) {
        return Err(StoreError::Invalid(format!(
            "{what} must be 1 to 64 characters of A-Z a-z 0-9 _ . - (got {s:?})"
        )));
    }
    Ok(())
}

/// At most this many patterns in a key's egress bound (as in a session's allowlist).
pub(crate) const MAX_EGRESS_PATTERNS: usize = 256;

/// A key's egress bound: at most 256 patterns of 1 to 255 printable ASCII characters each
/// (the form of a domain pattern is the egress crate's to check, before the store sees it).
pub(crate) fn egress_bound(bound: &[String]) -> Result<()> {
    if bound.len() > MAX_EGRESS_PATTERNS {
        return Err(StoreError::Invalid(format!(
            "a key's egress bound holds at most {MAX_EGRESS_PATTERNS} patterns (got {})",
            bound.len()
        )));
    }
    for p in bound {
        if p.is_empty() || p.len() > 255 || !p.chars().all(|c| c.is_ascii_graphic()) {
            return Err(StoreError::Invalid(format!(
                "egress pattern {p:?}: 1 to 255 printable ASCII characters"
            )));
        }
    }
    Ok(())
}

/// Record ids (sessions, executions): 1..=128 chars of `[A-Za-z0-9_.-]`.
pub(crate) fn id(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > 128 || !s.chars().all(allowed) {
        return Err(StoreError::Invalid(format!(
            "{what} must be 1 to 128 characters of A-Z a-z 0-9 _ . - (got {s:?})"
        )));
    }
    Ok(())
}

/// A short free-form word such as a status or language: 1..=64 printable ASCII chars.
pub(crate) fn word(what: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.len() > 64 || !s.chars().all(|c| c.is_ascii_graphic()) {
        return Err(StoreError::Invalid(format!(
            "{what} must be 1 to 64 printable ASCII characters (got {s:?})"
        )));
    }
    Ok(())
}

/// Must parse as JSON (any value).
pub(crate) fn json(what: &str, s: &str) -> Result<()> {
    serde_json::from_str::<serde::de::IgnoredAny>(s)
        .map(|_| ())
        .map_err(|e| StoreError::Invalid(format!("{what} is not valid JSON: {e}")))
}

/// A session's extra document: its session id, kind and JSON (see
/// [`crate::Backend::put_session_extra`]).
pub(crate) fn session_extra(session_id: &str, kind: &str, data: &str) -> Result<()> {
    id("session id", session_id)?;
    word("kind", kind)?;
    if data.len() > crate::MAX_SESSION_EXTRA_BYTES {
        return Err(StoreError::Invalid(format!(
            "a session's {kind} document is {} bytes, over the limit of {}",
            data.len(),
            crate::MAX_SESSION_EXTRA_BYTES
        )));
    }
    json("data_json", data)
}

/// 64 lowercase hex digits.
pub(crate) fn sha256_hex(what: &str, s: &str) -> Result<()> {
    if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(StoreError::Invalid(format!(
            "{what} must be 64 lowercase hex digits"
        )));
    }
    Ok(())
}

/// `n` uniformly random base62 characters from the OS generator (rejection sampling, no bias).
pub(crate) fn random_base62(n: usize) -> Result<String> {
    let mut out = String::with_capacity(n);
    let mut buf = [0u8; 64];
    while out.len() < n {
        getrandom::fill(&mut buf).map_err(StoreError::Random)?;
        // 248 = 4 * 62: bytes at or above it would favour the first characters.
        for &b in buf.iter().filter(|&&b| b < 248) {
            out.push(char::from(BASE62[usize::from(b % 62)]));
            if out.len() == n {
                break;
            }
        }
    }
    Ok(out)
}

/// A fresh plaintext API key: `rc_` + 40 base62 characters (~238 bits).
pub(crate) fn new_key() -> Result<String> {
    Ok(format!("rc_{}", random_base62(KEY_RANDOM_LEN)?))
}

/// A fresh plaintext API key in `format`.
pub(crate) fn new_key_in(format: crate::KeyFormat) -> Result<String> {
    match format {
        crate::KeyFormat::Runcell => new_key(),
        crate::KeyFormat::E2b => {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes).map_err(StoreError::Random)?;
            Ok(format!("e2b_{}", hex(&bytes)))
        }
    }
}

/// A fresh key id: `key_` + 16 base62 characters.
pub(crate) fn new_key_id() -> Result<String> {
    Ok(format!("key_{}", random_base62(16)?))
}

/// Lowercase hex SHA-256 of `data`.
pub(crate) fn sha256(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(name("name", "ci-bot.v2_x").is_ok());
        assert!(name("name", &"a".repeat(64)).is_ok());
        assert!(name("name", &"a".repeat(65)).is_err());
        assert!(name("name", "").is_err());
        assert!(name("name", "has space").is_err());
        assert!(name("name", "é").is_err());
        assert!(name("name", "a/b").is_err());
    }

    #[test]
    fn keys_look_right() {
        let k = new_key().unwrap_or_default();
        assert_eq!(k.len(), 43);
        assert!(k.starts_with("rc_"));
        assert!(k[3..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(new_key().ok(), new_key().ok());
        let e = new_key_in(crate::KeyFormat::E2b).unwrap_or_default();
        assert_eq!(e.len(), 4 + 64);
        assert!(e.starts_with("e2b_"));
        assert!(e[4..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
