//! Spare workspaces: empty session workspaces on disk, made ahead of demand.
//!
//! A workspace on disk is an ext4 image mounted through a loop device, and the loop device and
//! the mount cost 10-30 ms (docs/benchmarks.md, "Workspaces on disk"), against 0.1 ms for the
//! tmpfs it replaced. A create with the default disk size takes a spare (a queue pop) and
//! keeps the session start where it was; the thread below makes the next one. A spare is a
//! complete, unused workspace with its own uid and session id, named like any other; one
//! that no session took when the server died is an orphan the next start removes.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use runcell_sandbox::{UidLease, Workspace};

use crate::core::Core;
use crate::EngineError;

/// Spares kept ready: a burst of creates (each forking a kernel, ~10 ms) takes them faster than
/// one thread can mount new ones, and a spare costs only a mount and ~100 KiB of disk.
pub(crate) const SPARES: usize = 4;

/// How often an idle filler looks again without being woken.
const RECHECK: Duration = Duration::from_millis(500);

/// After a failed attempt, the filler waits this long (a full disk, no free loop device).
const BACKOFF: Duration = Duration::from_secs(2);

/// One made, never used workspace.
pub(crate) struct Spare {
    pub(crate) id: String,
    pub(crate) workspace: Arc<Workspace>,
    disk_mb: u64,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Spare>,
    /// How many to keep ready, and of what size; 0 until started.
    target: usize,
    disk_mb: u64,
    stopped: bool,
}

#[derive(Default)]
pub(crate) struct SpareWorkspaces {
    state: Mutex<State>,
    wake: Condvar,
    filler: Mutex<Option<JoinHandle<()>>>,
}

impl SpareWorkspaces {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts keeping [`SPARES`] workspaces of `disk_mb` ready (once; only for workspaces on
    /// disk: a tmpfs one is made in a tenth of a millisecond).
    pub(crate) fn start(self: &Arc<Self>, core: &Arc<Core>, disk_mb: u64) {
        if core.images.is_none() {
            return;
        }
        {
            let mut st = self.lock();
            if st.stopped || st.target > 0 {
                return;
            }
            st.target = SPARES;
            st.disk_mb = disk_mb;
        }
        let (me, core) = (Arc::downgrade(self), Arc::downgrade(core));
        let spawned = thread::Builder::new()
            .name("workspace-spares".into())
            .spawn(move || fill(me, core));
        match spawned {
            Ok(h) => *self.filler.lock().unwrap_or_else(|p| p.into_inner()) = Some(h),
            Err(e) => tracing::error!(error = %e, "cannot start the spare-workspace thread"),
        }
    }

    /// A spare of `disk_mb`, if one is ready.
    pub(crate) fn take(&self, disk_mb: u64) -> Option<Spare> {
        let mut st = self.lock();
        let i = st.ready.iter().position(|s| s.disk_mb == disk_mb)?;
        let spare = st.ready.remove(i);
        self.wake.notify_all();
        spare
    }

    /// Stops refilling and removes the spares (unmounted and deleted when this returns).
    pub(crate) fn stop(&self) {
        let ready = {
            let mut st = self.lock();
            st.stopped = true;
            self.wake.notify_all();
            std::mem::take(&mut st.ready)
        };
        drop(ready);
        let filler = self.filler.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = filler {
            let _ = h.join();
        }
    }
}

fn fill(spares: Weak<SpareWorkspaces>, core: Weak<Core>) {
    loop {
        let (Some(spares), Some(core)) = (spares.upgrade(), core.upgrade()) else {
            return;
        };
        let disk_mb = {
            let st = spares.lock();
            if st.stopped {
                return;
            }
            if st.ready.len() >= st.target {
                // Timed, so the thread lets go of the engine once nobody else holds it.
                let _ = spares.wake.wait_timeout(st, RECHECK);
                continue;
            }
            st.disk_mb
        };
        match make(&core, disk_mb) {
            Ok(spare) => {
                let mut st = spares.lock();
                if st.stopped {
                    drop(st);
                    drop(spare);
                    return;
                }
                st.ready.push_back(spare);
            }
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), "cannot make a spare workspace");
                let st = spares.lock();
                let _ = spares.wake.wait_timeout(st, BACKOFF);
            }
        }
    }
}

fn make(core: &Core, disk_mb: u64) -> Result<Spare, EngineError> {
    let id = crate::model::new_id("ses");
    let lease = UidLease::acquire(&core.config.run_dir.join("uids"))
        .map_err(|e| EngineError::Unavailable(crate::chain(&e)))?;
    let path = core.config.data_dir.join("workspaces").join(&id);
    let workspace = Arc::new(core.create_workspace(&path, disk_mb << 20, lease)?);
    Ok(Spare {
        id,
        workspace,
        disk_mb,
    })
}
