//! The SHA-256 of every file an execution created or modified, taken when the run ends
//! (`files[].sha256`, kept in the execution's audit record).

use std::io::Read;

use runcell_sandbox::Workspace;
use sha2::{Digest, Sha256};

use crate::model::{FileChange, FileChangeKind};

/// What one execution's end hashes at most, in bytes (beyond it, files keep no `sha256`): a
/// run that wrote gigabytes does not hold its reply for seconds of hashing.
pub const MAX_HASHED_BYTES: u64 = 256 << 20;

/// Fills in `sha256` of each created or modified file, within [`MAX_HASHED_BYTES`]. A file
/// that is gone, is not a regular file or cannot be read keeps none.
pub(crate) fn hash_files(workspace: &Workspace, files: &mut [FileChange]) {
    let mut budget = MAX_HASHED_BYTES;
    for f in files
        .iter_mut()
        .filter(|f| f.change != FileChangeKind::Deleted)
    {
        let Ok((file, size)) = workspace.open_file(&f.path) else {
            continue;
        };
        if size > budget {
            continue;
        }
        if let Some((hash, read)) = sha256_of(file, budget) {
            budget -= read;
            f.sha256 = Some(hash);
        }
    }
}

/// SHA-256 (hex) of what `r` holds and how many bytes that was; None past `limit` bytes or on
/// a read error.
pub fn sha256_of(mut r: impl Read, limit: u64) -> Option<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        total += n as u64;
        if total > limit {
            return None;
        }
        hasher.update(&buf[..n]);
    }
    Some((hex(&hasher.finalize()), total))
}

/// SHA-256 (hex) of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_sha256_and_bounded() {
        assert_eq!(
            sha256_of(&b"abc"[..], 3),
            Some((
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".to_owned(),
                3
            ))
        );
        assert_eq!(sha256_of(&b"abcd"[..], 3), None);
        assert_eq!(sha256_hex(b"abc"), sha256_of(&b"abc"[..], 9).expect("h").0);
    }
}
