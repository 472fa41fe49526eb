//! Paused sessions as an engine holds them (issue 17): each one's workspace (mounted, or only
//! its image and uid), what its kernel needs to start again, and where its snapshot is kept.
//! Pausing and resuming them is `durable.rs`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use runcell_sandbox::Workspace;

use crate::session::SessionInfo;

/// A session paused this long has its workspace unmounted (its image stays, and its uid): a
/// pause soon followed by a resume does not pay a mount (10-30 ms), and a session paused for
/// longer holds no mount, no loop device and no journal thread.
pub(crate) const UNMOUNT_AFTER: Duration = Duration::from_secs(30);

/// A paused session's workspace: mounted still, or only its image and its uid.
pub(crate) enum PausedWorkspace {
    Mounted(Arc<Workspace>),
    /// Unmounted (after [`UNMOUNT_AFTER`], or brought back by a restarted server): mounted
    /// again at the resume. The lease keeps the uid the image's files belong to.
    Unmounted(runcell_sandbox::UidLease),
    /// A resume could not mount it and gave up its lease: taken again at the next one.
    Lost,
}

/// A paused session: its workspace, what its kernel needs to start again, and why its
/// variables will not come back if they will not.
pub(crate) struct Paused {
    pub(crate) info: Mutex<SessionInfo>,
    pub(crate) workspace: Mutex<PausedWorkspace>,
    /// When it paused (its workspace is unmounted [`UNMOUNT_AFTER`] later).
    pub(crate) since: std::time::Instant,
    /// Its kernel's extra environment; empty for a session recovered after a restart (not
    /// recorded) until its owner gives it back ([`Paused::set_env`]).
    pub(crate) env: Mutex<Vec<(String, String)>>,
    /// Its network policy's proxy state, kept while the server runs (not across a restart:
    /// a recovered session comes back without a network, as before).
    pub(crate) egress: Option<runcell_egress::SessionEgress>,
    /// Why no snapshot was taken at the pause (the language cannot save its state, the kernel
    /// was dead): the resume says so.
    pub(crate) no_snapshot: Option<String>,
    /// Executions after the snapshot (a kill -9): named in the first reply after the resume.
    pub(crate) lost: Vec<String>,
    /// Held by the one resuming it; `true` once it is live again.
    pub(crate) resumed: Mutex<bool>,
}

impl Paused {
    pub(crate) fn info(&self) -> SessionInfo {
        self.info.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn env(&self) -> Vec<(String, String)> {
        self.env.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set_env(&self, env: Vec<(String, String)>) {
        *self.env.lock().unwrap_or_else(|p| p.into_inner()) = env;
    }

    pub(crate) fn workspace(&self) -> MutexGuard<'_, PausedWorkspace> {
        self.workspace.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unmounts its workspace, keeping the image and the uid; a workspace still in use (a
    /// file request holding it) stays mounted, for the next sweep.
    fn unmount(&self, images: Option<&runcell_sandbox::WorkspaceImages>) {
        let mut ws = self.workspace();
        let PausedWorkspace::Mounted(arc) = &*ws else {
            return;
        };
        if images.is_none() || Arc::strong_count(arc) > 1 {
            return; // a tmpfs would lose its files; someone holds it
        }
        let PausedWorkspace::Mounted(arc) = std::mem::replace(&mut *ws, PausedWorkspace::Lost)
        else {
            return;
        };
        let Ok(workspace) = Arc::try_unwrap(arc) else {
            return;
        };
        match Box::new(workspace).unmount_keeping() {
            Ok(lease) => *ws = PausedWorkspace::Unmounted(lease),
            Err(workspace) => *ws = PausedWorkspace::Mounted(Arc::new(*workspace)),
        }
    }
}

/// Every paused session of an engine.
#[derive(Default)]
pub(crate) struct PausedSessions(
    Mutex<HashMap<String, Arc<Paused>>>,
    /// Sessions this node is taking over from a dead node (takeover.rs): the database names
    /// this node their owner a moment before they are here.
    Mutex<std::collections::HashSet<String>>,
);

impl PausedSessions {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Paused>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `id` as being taken over; `false` if it already is (by another request).
    pub(crate) fn start_taking(&self, id: &str) -> bool {
        self.1
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned())
    }

    pub(crate) fn done_taking(&self, id: &str) {
        self.1.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    pub(crate) fn is_taking(&self, id: &str) -> bool {
        self.1
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    pub(crate) fn get(&self, id: &str) -> Option<SessionInfo> {
        self.map().get(id).map(|p| p.info())
    }

    pub(crate) fn list(&self) -> Vec<SessionInfo> {
        self.map().values().map(|p| p.info()).collect()
    }

    pub(crate) fn ids(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }

    pub(crate) fn entry(&self, id: &str) -> Option<Arc<Paused>> {
        self.map().get(id).cloned()
    }

    pub(crate) fn insert(&self, id: String, p: Paused) {
        self.map().insert(id, Arc::new(p));
    }

    /// Forgets a paused session in memory, keeping its workspace and snapshot on disk (a
    /// server stopping).
    pub(crate) fn keep_and_remove(&self, id: &str) {
        if let Some(p) = self.map().remove(id) {
            if let PausedWorkspace::Mounted(ws) = &*p.workspace() {
                ws.keep();
            }
        }
    }

    /// Unmounts the workspaces of the sessions paused for [`UNMOUNT_AFTER`].
    pub(crate) fn unmount_idle(&self, images: Option<&runcell_sandbox::WorkspaceImages>) {
        let due: Vec<Arc<Paused>> = self
            .map()
            .values()
            .filter(|p| p.since.elapsed() >= UNMOUNT_AFTER)
            .cloned()
            .collect();
        for p in due {
            p.unmount(images);
        }
    }

    /// Forgets a paused session (resumed: its workspace now the live session's).
    pub(crate) fn remove(&self, id: &str) -> bool {
        self.map().remove(id).is_some()
    }

    pub(crate) fn take(&self, id: &str) -> Option<Arc<Paused>> {
        self.map().remove(id)
    }

    /// The paused sessions past their expiry.
    pub(crate) fn expired(&self, now: DateTime<Utc>) -> Vec<String> {
        self.map()
            .iter()
            .filter(|(_, p)| p.info().expires_at <= now)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// Removes a session's snapshot and what is kept beside it (it ended).
pub(crate) fn discard_snapshot(core: &crate::core::Core, id: &str) {
    use crate::snapshots::{description_key, env_key, files_key, snap_key};
    // The description first: a node that finds no description reads no snapshot.
    for key in [
        description_key(id),
        snap_key(id),
        env_key(id),
        files_key(id),
    ] {
        if let Err(e) = core.snapshots.delete(&key) {
            tracing::warn!(session = %id, key, error = %e, "cannot remove a snapshot");
        }
    }
    // The session's kept network policy ends with it too.
    crate::network::forget_policy(&core.config.data_dir, id);
}
