//! Spare workspaces: empty workspace filesystems on disk, mounted ahead of demand.
//!
//! A workspace on disk is an ext4 image mounted through a loop device, and binding the loop
//! device and mounting cost 10-30 ms (docs/benchmarks.md, "Workspaces on disk"), against 0.1 ms
//! for the tmpfs it replaced. A create of the default disk size takes a spare, which is bound
//! into place in a few system calls ([`runcell_sandbox::WorkspaceImages::make_spare`]); the
//! thread below mounts the next one. Spares have no uid or session yet and live in the image
//! directory (`workspace-images/spares/`), so nothing else ever mistakes one for a session's;
//! the next start removes those a killed server left.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::core::Core;

/// Spares kept ready: a burst of creates (each forking a kernel, ~10 ms) takes them faster than
/// one thread mounts new ones (10-30 ms each), and a spare costs only a mount (and its journal
/// thread) and ~100 KiB of disk.
pub(crate) const SPARES: usize = 8;

/// How often an idle filler looks again without being woken.
const RECHECK: Duration = Duration::from_millis(100);

/// After a failed attempt (a full disk, no free loop device) the filler waits this long.
const BACKOFF: Duration = Duration::from_secs(2);

#[derive(Default)]
pub(crate) struct SpareWorkspaces {
    stopped: Mutex<bool>,
    wake: Condvar,
    filler: Mutex<Option<JoinHandle<()>>>,
}

impl SpareWorkspaces {
    /// Starts keeping [`SPARES`] workspaces of `disk_mb` ready (once; only for workspaces on
    /// disk: a tmpfs one is made in a tenth of a millisecond).
    pub(crate) fn start(self: &Arc<Self>, core: &Arc<Core>, disk_mb: u64) {
        let mut filler = self.filler.lock().unwrap_or_else(|p| p.into_inner());
        if core.images.is_none() || filler.is_some() || *self.lock_stopped() {
            return;
        }
        let (me, core) = (Arc::downgrade(self), Arc::downgrade(core));
        let spawned = thread::Builder::new()
            .name("workspace-spares".into())
            .spawn(move || fill(me, core, disk_mb << 20));
        match spawned {
            Ok(h) => *filler = Some(h),
            Err(e) => tracing::error!(error = %e, "cannot start the spare-workspace thread"),
        }
    }

    fn lock_stopped(&self) -> std::sync::MutexGuard<'_, bool> {
        self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops refilling and removes the spares (unmounted and deleted when this returns).
    pub(crate) fn stop(&self, core: &Core) {
        *self.lock_stopped() = true;
        self.wake.notify_all();
        let filler = self.filler.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = filler {
            let _ = h.join();
        }
        if let Some(images) = &core.images {
            images.remove_spares();
        }
    }
}

/// Spares are made only while the data dir's filesystem has this much room: on a nearly full
/// disk they would take the last bytes a session's own writes need.
const MIN_ROOM_FOR_SPARES: u64 = 64 << 20;

fn room_for_spares(images: &runcell_sandbox::WorkspaceImages) -> bool {
    images.room().is_some_and(|r| r >= MIN_ROOM_FOR_SPARES)
}

fn fill(spares: Weak<SpareWorkspaces>, core: Weak<Core>, size_bytes: u64) {
    loop {
        let (Some(spares), Some(core)) = (spares.upgrade(), core.upgrade()) else {
            return;
        };
        let Some(images) = &core.images else { return };
        images.tidy();
        let pause = if images.spares(size_bytes) >= SPARES || !room_for_spares(images) {
            RECHECK
        } else {
            match images.make_spare(size_bytes) {
                Ok(()) => Duration::ZERO,
                Err(e) => {
                    tracing::warn!(error = %crate::chain(&e), "cannot make a spare workspace");
                    BACKOFF
                }
            }
        };
        let stopped = spares.lock_stopped();
        if *stopped {
            return;
        }
        // Timed, so the thread lets go of the engine once nobody else holds it.
        let _ = spares.wake.wait_timeout(stopped, pause);
    }
}
