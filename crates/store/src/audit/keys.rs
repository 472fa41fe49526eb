//! The audit chain's secret key and the checkpoint signing key: files outside the database.
//!
//! Both are 32 random bytes written as 64 lowercase hex characters and a newline, in a file of
//! mode 0600 (its directory 0700 when runcell creates it). By default they live next to the
//! database, in `<data dir>/keys/`: `audit-chain.key` and `audit-signing.key`. Keeping them in
//! another place (a mounted secret, say) is the operator's choice; the point is that someone
//! who can edit the database file cannot also read them.
//!
//! A key file is created only when it is missing, never replaced: losing the chain key makes
//! every keyed row unverifiable, and a new signing key makes old checkpoints unverifiable under
//! the new public key. Rotation is not supported.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{Result, StoreError};
use crate::validate::hex;

/// The chain key's file name in the default keys directory.
pub const CHAIN_KEY_FILE: &str = "audit-chain.key";
/// The signing key's file name in the default keys directory.
pub const SIGNING_KEY_FILE: &str = "audit-signing.key";

/// The default keys directory for the database at `db_path`: `keys/` beside it.
pub fn default_dir(db_path: &Path) -> PathBuf {
    db_path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."))
        .join("keys")
}

/// The secret the chain's HMACs are keyed with.
#[derive(Clone)]
pub struct ChainKey([u8; 32]);

impl fmt::Debug for ChainKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key itself.
        f.debug_tuple("ChainKey").field(&self.id()).finish()
    }
}

impl ChainKey {
    /// A fresh random key.
    pub fn generate() -> Result<ChainKey> {
        Ok(ChainKey(random32()?))
    }

    /// The key with these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> ChainKey {
        ChainKey(bytes)
    }

    /// Reads a key file (64 hex characters, surrounding whitespace ignored).
    pub fn read(path: &Path) -> Result<ChainKey> {
        Ok(ChainKey(read32(path)?))
    }

    /// A public name for the key: the first 16 hex characters of a SHA-256 of it, stored in
    /// the database so runcell can refuse to extend a chain with the wrong key.
    pub fn id(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"runcell-audit-chain-key-id\0");
        h.update(self.0);
        hex(&h.finalize()[..8])
    }

    pub(crate) fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length: this cannot fail.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }

    pub(crate) fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

/// 32 bytes from the operating system's random number generator.
pub(crate) fn random32() -> Result<[u8; 32]> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(StoreError::Random)?;
    Ok(b)
}

fn key_error(path: &Path, problem: impl Into<String>) -> StoreError {
    StoreError::AuditKey {
        path: path.to_owned(),
        problem: problem.into(),
        source: None,
    }
}

fn key_io(path: &Path, problem: &str, e: std::io::Error) -> StoreError {
    StoreError::AuditKey {
        path: path.to_owned(),
        problem: problem.to_owned(),
        source: Some(e),
    }
}

/// Reads 32 bytes written as hex.
pub(crate) fn read32(path: &Path) -> Result<[u8; 32]> {
    let text = std::fs::read_to_string(path).map_err(|e| key_io(path, "cannot read", e))?;
    parse32(text.trim()).ok_or_else(|| key_error(path, "is not 64 hexadecimal characters"))
}

/// 64 hex characters as 32 bytes.
pub(crate) fn parse32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Writes `hex` to `path` (0600), creating its directory (0700) if needed, and syncs it.
/// `create_new`: fails if the file exists.
pub(crate) fn write_new(path: &Path, hex: &str, create_new: bool) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir)
            .map_err(|e| key_io(path, "cannot create the directory of", e))?;
    }
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    if create_new {
        o.create_new(true);
    } else {
        o.create(true).truncate(true);
    }
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut f = o.open(path).map_err(|e| key_io(path, "cannot create", e))?;
    f.write_all(format!("{hex}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| key_io(path, "cannot write", e))
}

/// The chain key file as found when a store opens.
#[derive(Debug)]
pub(crate) enum Found {
    /// The file exists.
    Existing(ChainKey),
    /// It does not: a key to use, written to `tmp` but not yet in place (see [`publish`]).
    /// A `tmp` left by an attempt that crashed is reused, so a database keyed by it is not
    /// stranded.
    New { key: ChainKey, tmp: PathBuf },
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".new");
    PathBuf::from(p)
}

/// Loads the chain key at `path`, or prepares a new one.
pub(crate) fn find_chain_key(path: &Path) -> Result<Found> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => return Ok(Found::Existing(ChainKey::read(path)?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(key_io(path, "cannot read", e)),
    }
    let tmp = tmp_path(path);
    if let Ok(key) = ChainKey::read(&tmp) {
        return Ok(Found::New { key, tmp });
    }
    let key = ChainKey::generate()?;
    write_new(&tmp, &key.to_hex(), false)?;
    Ok(Found::New { key, tmp })
}

/// Moves a new key into place, never over an existing file (a hard link fails if the name is
/// taken). If another process put the same key there first, fine.
pub(crate) fn publish(tmp: &Path, path: &Path, key: &ChainKey) -> Result<()> {
    match std::fs::hard_link(tmp, path) {
        Ok(()) => {
            discard(tmp);
            Ok(())
        }
        Err(e) => match ChainKey::read(path) {
            Ok(k) if k.0 == key.0 => {
                discard(tmp);
                Ok(())
            }
            _ => Err(key_io(path, "cannot put in place", e)),
        },
    }
}

/// Removes an unused new key.
pub(crate) fn discard(tmp: &Path) {
    let _ = std::fs::remove_file(tmp);
}
