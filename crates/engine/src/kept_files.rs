//! A session's workspace files kept beside its snapshot in a store the nodes share (issue
//! 18): what another node needs, with the snapshot, to resume the session when its own node
//! dies (takeover.rs). One tar of the workspace's regular files, `<id>.files.tar`.

use std::io::{Read, Seek};
use std::path::Path;

use runcell_sandbox::Workspace;

use crate::snapshots::{files_key, SnapshotStore};
use crate::EngineError;

fn tar_error(e: std::io::Error) -> EngineError {
    EngineError::Io {
        action: "pack the workspace's files",
        path: "workspace".into(),
        source: e,
    }
}

/// What the workspace's files are now, as a walk sees them (every path, size and
/// modification time, hashed): the same after a cell that wrote nothing, so an idle
/// snapshot of such a session stores its files no second time.
fn signature(snap: &runcell_sandbox::Snapshot) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for (path, stat) in &snap.files {
        let ns = stat
            .modified
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.update(path.as_bytes());
        h.update([0]);
        h.update(stat.size.to_le_bytes());
        h.update(ns.to_le_bytes());
    }
    h.update([u8::from(snap.complete)]);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Keeps every regular file of session `id`'s workspace in `store` (`<id>.files.tar`), read
/// beneath the workspace's root (never through a link: symlinks, FIFOs and devices the
/// session made are left out, as a fork leaves them). Built in an unnamed file under the data
/// dir's `tmp/` and stored in one piece, so the store holds the previous set or this one.
/// Returns the files' signature; when it is `kept` (the one the last snapshot's description
/// recorded) the files are there already and nothing is written.
pub(crate) fn keep_files(
    store: &dyn SnapshotStore,
    id: &str,
    ws: &Workspace,
    data_dir: &Path,
    kept: Option<&str>,
) -> Result<String, EngineError> {
    let snap = ws.snapshot().map_err(EngineError::unavailable)?;
    let sig = signature(&snap);
    if kept == Some(sig.as_str()) {
        return Ok(sig);
    }
    let tmp = tempfile::tempfile_in(data_dir.join("tmp")).map_err(tar_error)?;
    let mut tar = tar::Builder::new(tmp);
    for path in snap.files.keys() {
        // Removed or replaced since the walk: not there to keep.
        let Ok((file, len)) = ws.open_file(path) else {
            continue;
        };
        let mut header = tar::Header::new_gnu();
        header.set_size(len);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, path, file.take(len))
            .map_err(tar_error)?;
    }
    let mut tmp = tar.into_inner().map_err(tar_error)?;
    tmp.rewind().map_err(tar_error)?;
    store
        .put(&files_key(id), &mut tmp)
        .map_err(crate::core::io_error(
            "keep the workspace's files",
            Path::new(&files_key(id)),
        ))?;
    Ok(sig)
}

/// Writes the files [`keep_files`] kept into `ws` (a new, empty workspace), each beneath its
/// root as the sandbox user (a path that would leave it, or a link on the way, is refused by
/// the workspace); entries other than regular files are skipped, and none larger than the
/// workspace is read. Returns how many files were written; none kept: 0.
pub(crate) fn restore_files(
    store: &dyn SnapshotStore,
    id: &str,
    ws: &Workspace,
) -> Result<usize, EngineError> {
    let Some(file) = store.open(&files_key(id)).map_err(crate::core::io_error(
        "read the workspace's files",
        Path::new(&files_key(id)),
    ))?
    else {
        return Ok(0);
    };
    let mut archive = tar::Archive::new(file);
    let mut written = 0;
    for entry in archive.entries().map_err(tar_error)? {
        let mut entry = entry.map_err(tar_error)?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry
            .path()
            .map_err(tar_error)?
            .to_string_lossy()
            .into_owned();
        if entry.size() > ws.size_bytes() {
            return Err(EngineError::InsufficientStorage(
                crate::error::NoSpace::Snapshot {
                    id: id.to_owned(),
                    place: "workspace",
                },
            ));
        }
        let mut data = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut data).map_err(tar_error)?;
        ws.write_file(&path, &data)
            .map_err(crate::files::map_err(crate::files::Op::Write))?;
        written += 1;
    }
    ws.sync().map_err(EngineError::unavailable)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshots::DirSnapshots;

    /// Files kept from one workspace come back in another, links and all that is not a
    /// regular file left out; nothing kept is no files.
    #[test]
    fn workspace_files_travel_through_the_store() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("tmp")).expect("tmp");
        let store = DirSnapshots::shared(tmp.path().join("shared"));
        // Two real tmpfs workspaces, on uids leased as a server leases them.
        let leases = std::path::PathBuf::from("/run/runcell/uids");
        let tmpfs = |name: &str| {
            let lease = runcell_sandbox::UidLease::acquire(&leases).expect("lease");
            Workspace::create(&tmp.path().join(name), 16 << 20, lease).expect("workspace")
        };
        let ws = tmpfs("from");
        let from = tmp.path().join("from");
        ws.write_file("a.txt", b"alpha").expect("write");
        ws.write_file("d/e/b.bin", &[0u8, 1, 2, 255])
            .expect("write");
        std::os::unix::fs::symlink("/etc/passwd", from.join("link")).expect("symlink");
        let sig = keep_files(&store, "ses_x", &ws, tmp.path(), None).expect("keep");
        // Unchanged files are not written again; changed ones are.
        let kept = tmp.path().join("shared/ses_x.files.tar");
        let before = std::fs::read(&kept).expect("kept");
        std::fs::remove_file(&kept).expect("remove");
        assert_eq!(
            keep_files(&store, "ses_x", &ws, tmp.path(), Some(&sig)).expect("keep"),
            sig
        );
        assert!(!kept.exists(), "unchanged: not written again");
        ws.write_file("a.txt", b"alpha, changed").expect("write");
        let sig2 = keep_files(&store, "ses_x", &ws, tmp.path(), Some(&sig)).expect("keep");
        assert_ne!(sig2, sig);
        ws.write_file("a.txt", b"alpha").expect("write back");
        keep_files(&store, "ses_x", &ws, tmp.path(), Some(&sig2)).expect("keep");
        assert_eq!(std::fs::read(&kept).expect("kept").len(), before.len());

        let back = tmpfs("to");
        let to = tmp.path().join("to");
        assert_eq!(restore_files(&store, "ses_x", &back).expect("restore"), 2);
        assert_eq!(std::fs::read(to.join("a.txt")).expect("a"), b"alpha");
        assert_eq!(
            std::fs::read(to.join("d/e/b.bin")).expect("b"),
            [0u8, 1, 2, 255]
        );
        assert!(
            std::fs::symlink_metadata(to.join("link")).is_err(),
            "links are not kept"
        );
        assert_eq!(restore_files(&store, "ses_none", &back).expect("none"), 0);
    }

    /// A store others can write to (a shared directory, a bucket) may hold a crafted tar: a
    /// path out of the workspace is refused, nothing lands outside it, links are not made; the
    /// plain file before it (the positive control) is written.
    #[test]
    fn a_crafted_tar_writes_nothing_outside_the_workspace() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = DirSnapshots::shared(tmp.path().join("shared"));
        let mut tar = tar::Builder::new(Vec::new());
        let entry = |name: &[u8], kind: tar::EntryType, size: u64| {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.set_entry_type(kind);
            h.set_size(size);
            h.set_mode(0o644);
            h.set_cksum();
            h
        };
        tar.append(
            &entry(b"inside.txt", tar::EntryType::Regular, 2),
            &b"ok"[..],
        )
        .expect("append");
        let mut link = entry(b"link", tar::EntryType::Symlink, 0);
        link.set_link_name("/etc/passwd").expect("link name");
        link.set_cksum();
        tar.append(&link, &b""[..]).expect("append");
        tar.append(
            &entry(b"../escape.txt", tar::EntryType::Regular, 3),
            &b"out"[..],
        )
        .expect("append");
        let bytes = tar.into_inner().expect("tar");
        store.put_bytes("ses_h.files.tar", &bytes).expect("put");

        let leases = std::path::PathBuf::from("/run/runcell/uids");
        let lease = runcell_sandbox::UidLease::acquire(&leases).expect("lease");
        let ws = Workspace::create(&tmp.path().join("ws"), 16 << 20, lease).expect("workspace");
        let e = restore_files(&store, "ses_h", &ws).expect_err("a path out of the workspace");
        assert!(
            crate::chain(&e).contains("'..' is not allowed"),
            "{}",
            crate::chain(&e)
        );
        assert_eq!(
            std::fs::read(tmp.path().join("ws/inside.txt")).expect("inside"),
            b"ok"
        );
        assert!(std::fs::symlink_metadata(tmp.path().join("ws/link")).is_err());
        assert!(!tmp.path().join("escape.txt").exists());
    }
}
