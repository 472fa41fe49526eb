//! A dead node's sessions, brought back on another node (issue 18). With a snapshot store the
//! nodes share (snapshots.rs), each idle snapshot and pause also keeps the session's workspace
//! files there (a tar of its regular files, kept_files.rs). When a request for a session
//! reaches a live node and the session's own node has stopped beating, that node takes the
//! session over in the database (a conditional update: one node wins, and the dead node, if it
//! comes back, can no longer change the session: its epoch is no longer the owner's), makes it
//! a workspace of its own from the kept files and holds it paused: the request then resumes it
//! from the shared snapshot, as after a restart, and names the executions the snapshot
//! missed (`lost_executions`).

use std::sync::Mutex;

use chrono::Utc;

use crate::durable::{description, kept_env};
use crate::kept_files::restore_files;
use crate::paused::{Paused, PausedWorkspace};
use crate::session::{SessionInfo, SessionManager, SessionStatus};
use crate::EngineError;

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
