//! Where durable sessions' snapshots are kept (issue 18): a directory of this node's data dir
//! (the default), a directory every node of a cluster mounts (`serve --snapshot-dir`, an NFS
//! or ReadWriteMany volume), or object storage (`serve --snapshot-store s3://...`, which the
//! CLI implements on the `object_store` crate behind [`SnapshotStore`]).
//!
//! A store keeps whole objects under keys (`<id>.snap`, `<id>.json`, ...): each one is
//! written whole or not at all (a temporary file renamed over it; one PUT), so a node that
//! reads a key while another writes it sees the old object or the new one, never half. A
//! shared store ([`SnapshotStore::shared`]) also keeps each session's workspace files, so
//! another node can bring the session back when its own node dies (takeover.rs).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// A place for snapshots, seen from one node.
pub trait SnapshotStore: Send + Sync + std::fmt::Debug {
    /// Whether other nodes read this store too: a session's workspace files are then kept
    /// there as well, and a live node may take over a dead node's sessions from it.
    fn shared(&self) -> bool;
    /// Stores the content of `from` (from its current offset to its end) under `key`,
    /// replacing what was there, whole or not at all.
    fn put(&self, key: &str, from: &mut File) -> io::Result<()>;
    /// Stores `data` under `key`, whole or not at all.
    fn put_bytes(&self, key: &str, data: &[u8]) -> io::Result<()>;
    /// The object under `key`, as a file positioned at its start; `None` if there is none.
    fn open(&self, key: &str) -> io::Result<Option<File>>;
    /// The object under `key`, read whole; `None` if there is none.
    fn get_bytes(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        match self.open(key)? {
            Some(mut f) => {
                let mut data = Vec::new();
                io::Read::read_to_end(&mut f, &mut data)?;
                Ok(Some(data))
            }
            None => Ok(None),
        }
    }
    /// Removes the object under `key` (none there: nothing to do).
    fn delete(&self, key: &str) -> io::Result<()>;
}

/// Snapshots as files in a directory: the data dir's `snapshots/` (this node's alone), or a
/// directory the nodes share.
#[derive(Debug, Clone)]
pub struct DirSnapshots {
    dir: PathBuf,
    shared: bool,
}

impl DirSnapshots {
    /// The data dir's own `snapshots/`, which no other node reads.
    pub fn local(data_dir: &Path) -> DirSnapshots {
        DirSnapshots {
            dir: data_dir.join("snapshots"),
            shared: false,
        }
    }

    /// A directory every node of the cluster mounts at `dir`.
    pub fn shared(dir: PathBuf) -> DirSnapshots {
        DirSnapshots { dir, shared: true }
    }

    fn path(&self, key: &str) -> io::Result<PathBuf> {
        check_key(key)?;
        Ok(self.dir.join(key))
    }

    /// Writes `key` through a temporary file beside it, renamed over it once complete. The
    /// temporary name carries random bytes, not only the pid: nodes sharing the directory
    /// may have the same pids. Mode 0600: a snapshot holds the session's variables, its env
    /// the user's secrets. Not synced: a pause must be quick, a process killed with -9 loses
    /// nothing of the page cache, and a file truncated by a power loss is noticed by the
    /// kernel that reads it (the session then resumes with its files only, and says so).
    fn write(&self, key: &str, write: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path(key)?;
        std::fs::create_dir_all(&self.dir)?;
        let mut salt = [0u8; 8];
        getrandom::fill(&mut salt).map_err(io::Error::other)?;
        let tmp = self.dir.join(format!(
            ".{key}.tmp{}-{:016x}",
            std::process::id(),
            u64::from_ne_bytes(salt)
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| write(&mut f))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

impl SnapshotStore for DirSnapshots {
    fn shared(&self) -> bool {
        self.shared
    }

    /// Copied by the kernel (`copy_file_range` or `sendfile`, which `std::io::copy` uses
    /// between files), never through a buffer of ours: the server allocates and faults in
    /// nothing for a 10 MB snapshot.
    fn put(&self, key: &str, from: &mut File) -> io::Result<()> {
        self.write(key, |to| io::copy(from, to).map(|_| ()))
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> io::Result<()> {
        self.write(key, |to| io::Write::write_all(to, data))
    }

    fn open(&self, key: &str) -> io::Result<Option<File>> {
        match File::open(self.path(key)?) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn delete(&self, key: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path(key)?) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Keys are the engine's own (`<session id>.<kind>`): one path segment of plain characters,
/// so no key reaches outside its directory or prefix.
pub fn check_key(key: &str) -> io::Result<()> {
    let plain = !key.is_empty()
        && key.len() <= 200
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if plain {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{key:?} is not a snapshot key"),
        ))
    }
}

/// The language state a session's kernel wrote.
pub(crate) fn snap_key(id: &str) -> String {
    format!("{id}.snap")
}

/// What `<id>.json` says of the snapshot (durable.rs's `Description`): written last, so a
/// node that finds it finds the rest.
pub(crate) fn description_key(id: &str) -> String {
    format!("{id}.json")
}

/// The session's `env` as given at its create (JSON pairs).
pub(crate) fn env_key(id: &str) -> String {
    format!("{id}.env")
}

/// The session's workspace files (a tar of its regular files), in a shared store only.
pub(crate) fn files_key(id: &str) -> String {
    format!("{id}.files.tar")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_keeps_whole_objects_and_refuses_keys_outside_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = DirSnapshots::local(tmp.path());
        assert!(!store.shared());
        assert!(store.open("ses_1.snap").expect("open").is_none());
        assert!(store.get_bytes("ses_1.json").expect("get").is_none());

        // From a file, from its offset on (as a workspace file is handed over).
        let mut src = tempfile::tempfile().expect("tempfile");
        src.write_all(b"headSTATE").expect("write");
        src.seek(io::SeekFrom::Start(4)).expect("seek");
        store.put("ses_1.snap", &mut src).expect("put");
        let mut back = String::new();
        store
            .open("ses_1.snap")
            .expect("open")
            .expect("stored")
            .read_to_string(&mut back)
            .expect("read");
        assert_eq!(back, "STATE");
        let path = tmp.path().join("snapshots/ses_1.snap");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "readable by the server alone");

        // Replaced whole, and no temporary file left beside it.
        store.put_bytes("ses_1.snap", b"new").expect("put");
        assert_eq!(
            store.get_bytes("ses_1.snap").expect("get").as_deref(),
            Some(&b"new"[..])
        );
        let names: Vec<String> = std::fs::read_dir(tmp.path().join("snapshots"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["ses_1.snap"]);

        store.delete("ses_1.snap").expect("delete");
        store
            .delete("ses_1.snap")
            .expect("deleting twice is no error");
        assert!(store.open("ses_1.snap").expect("open").is_none());

        for bad in ["", "../x", "a/b", ".hidden", "x\0y", "ses 1"] {
            let e = store.put_bytes(bad, b"x").expect_err(bad);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert!(!tmp.path().join("x").exists());
    }

    #[test]
    fn a_shared_directory_says_so() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = DirSnapshots::shared(tmp.path().join("shared"));
        assert!(store.shared());
        store.put_bytes("ses_2.json", b"{}").expect("put");
        assert!(tmp.path().join("shared/ses_2.json").exists());
    }
}
