//! A dead node's sessions, brought back on another node (issue 18). With a snapshot store the
//! nodes share (snapshots.rs), each idle snapshot and pause also keeps the session's workspace
//! files there (a tar of its regular files, [`keep_files`]). When a request for a session
//! reaches a live node and the session's own node has stopped beating, that node takes the
//! session over in the database (a conditional update: one node wins, and the dead node, if it
//! comes back, can no longer change the session: its epoch is no longer the owner's), makes it
//! a workspace of its own from the kept files and holds it paused: the request then resumes it
//! from the shared snapshot, as after a restart, and names the executions the snapshot
//! missed (`lost_executions`).

use std::io::{Read, Seek};
use std::path::Path;
use std::sync::Mutex;

use chrono::Utc;
use runcell_sandbox::Workspace;

use crate::durable::{description, kept_env};
use crate::paused::{Paused, PausedWorkspace};
use crate::session::{SessionInfo, SessionManager, SessionStatus};
use crate::snapshots::{files_key, SnapshotStore};
use crate::EngineError;

fn tar_error(e: std::io::Error) -> EngineError {
    EngineError::Io {
        action: "pack the workspace's files",
        path: "workspace".into(),
        source: e,
    }
}

/// Keeps every regular file of session `id`'s workspace in `store` (`<id>.files.tar`), read
/// beneath the workspace's root (never through a link: symlinks, FIFOs and devices the
/// session made are left out, as a fork leaves them). Built in an unnamed file under the data
/// dir's `tmp/` and stored in one piece, so the store holds the previous set or this one.
pub(crate) fn keep_files(
    store: &dyn SnapshotStore,
    id: &str,
    ws: &Workspace,
    data_dir: &Path,
) -> Result<(), EngineError> {
    let snap = ws.snapshot().map_err(EngineError::unavailable)?;
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
        ))
}

/// Writes the files [`keep_files`] kept into `ws` (a new, empty workspace), each beneath its
/// root as the sandbox user (a path that would leave it, or a link on the way, is refused by
/// the workspace); entries other than regular files are skipped, and none larger than the
/// workspace is read. Returns how many files were written; none kept: 0.
fn restore_files(
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

impl SessionManager {
    /// Takes session `id` of tenant `owner` over from `dead_node`, which has stopped beating,
    /// when the shared snapshot store holds a snapshot of it: it is then this node's, paused,
    /// and the next request resumes it. `Ok(None)`: nothing taken (no shared store, no
    /// snapshot — the session stays `dead` — or another node took it first, or it is not
    /// `owner`'s); `Ok(Some)`: it is here now (or already was).
    pub fn take_over(
        &self,
        owner: &str,
        id: &str,
        dead_node: &str,
    ) -> Result<Option<SessionInfo>, EngineError> {
        let core = self.core().clone();
        if !core.snapshots.shared() {
            return Ok(None);
        }
        if let Ok(here) = self.get(id) {
            return Ok(Some(here).filter(|i| i.owner == owner));
        }
        let Some(store) = core.session_store() else {
            return Ok(None);
        };
        let Some(rec) = store
            .get_session(crate::records::tenant(owner), id)
            .map_err(crate::records::store_error)?
        else {
            return Ok(None);
        };
        let Some(desc) = description(&*core.snapshots, id) else {
            return Ok(None);
        };
        let Some(info) = crate::records::session_of_record(&rec, SessionStatus::Paused) else {
            return Ok(None);
        };
        // Requests for it that reach this node meanwhile (another node's, which lost the race
        // and forwards here) wait until it is here ([`SessionManager::taking_over`]).
        if !self.paused().start_taking(id) {
            // Another request here is taking it: its outcome is this one's.
            while self.paused().is_taking(id) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            return Ok(self.get(id).ok().filter(|i| i.owner == owner));
        }
        let taken = self.take_over_marked(store, owner, id, dead_node, info, desc);
        self.paused().done_taking(id);
        taken
    }

    fn take_over_marked(
        &self,
        store: &dyn runcell_store::DomainStore,
        owner: &str,
        id: &str,
        dead_node: &str,
        mut info: SessionInfo,
        desc: crate::durable::Description,
    ) -> Result<Option<SessionInfo>, EngineError> {
        let core = self.core().clone();
        // The one step two nodes cannot both pass: the loser sees the winner as the owner.
        if !store
            .take_over_session(id, dead_node)
            .map_err(crate::records::store_error)?
        {
            return Ok(None);
        }
        info.owner = owner.to_owned();
        let now = Utc::now();
        info.expires_at = now + chrono::Duration::seconds(info.limits.expire_after_s as i64);
        let moved = self
            .new_workspace(id, &info.limits)
            .and_then(|ws| restore_files(&*core.snapshots, id, &ws).map(|n| (ws, n)));
        let (ws, files) = match moved {
            Ok(m) => m,
            Err(e) => {
                // Ours now, and beyond bringing back: dead, as it would have stayed.
                let _ = store.update_session_status(id, "dead", info.last_active_at, now);
                tracing::warn!(session = %id, from = %dead_node, error = %crate::chain(&e), "took over a session but cannot rebuild its workspace; marked dead");
                return Err(e);
            }
        };
        let lost = self.executions_after(&info, desc.last_execution.clone());
        let _ = store.update_session_status(id, "paused", info.last_active_at, info.expires_at);
        self.start_sweeper();
        tracing::info!(session = %id, from = %dead_node, files, lost = lost.len(), "took over a dead node's session; it resumes from its last snapshot");
        self.paused().insert(
            id.to_owned(),
            Paused {
                info: Mutex::new(info.clone()),
                workspace: Mutex::new(PausedWorkspace::Mounted(ws)),
                since: std::time::Instant::now(),
                env: Mutex::new(kept_env(&*core.snapshots, id)),
                // Its network policy's secrets stay with the dead node: it comes back without
                // a network, as a fork starts.
                egress: None,
                no_snapshot: None,
                lost,
                resumed: Mutex::new(false),
            },
        );
        Ok(Some(info))
    }

    /// Whether session `id` is being taken over here right now: a request for it waits until
    /// it is done (the session is then here, or stays where the database says).
    pub fn taking_over(&self, id: &str) -> bool {
        self.paused().is_taking(id)
    }

    /// Whether this engine keeps snapshots where other nodes read them (and so may take
    /// their sessions over).
    pub fn shares_snapshots(&self) -> bool {
        self.core().snapshots.shared()
    }
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
        keep_files(&store, "ses_x", &ws, tmp.path()).expect("keep");

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
}
