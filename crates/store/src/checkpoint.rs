//! WAL checkpoints off the commit path.
//!
//! By default SQLite checkpoints inside the commit that takes the WAL past 1000 pages: that
//! commit, and every append queued behind the writer, waits while the whole log is copied into
//! the database file and synced. Here the writer connection only notes how long the log has
//! grown (a WAL hook, called after each of its commits) and wakes a thread that checkpoints on
//! a connection of its own while appends go on.
//!
//! A PASSIVE checkpoint never blocks a writer, but SQLite starts the log over only when a write
//! begins after a checkpoint that copied every frame, and under a steady stream of commits
//! there is always a frame committed meanwhile: the WAL would grow without bound. So once the
//! log passes [`WalLimits::restart_pages`], the commit that finds it so copies what is left
//! itself, on the writer connection (no commit can come in between, so the next write starts
//! the log over). What is left is only what the thread has not copied yet, usually what was
//! committed since its last pass; if a pass is running, the commit waits for it (SQLite lets
//! one checkpoint run at a time and would refuse the second at once), so the log never gets
//! much past the limit whatever the thread's scheduling.
//!
//! Durability is unchanged: a commit is durable once its frames are in the WAL, whether or not
//! they have been copied yet, and a checkpoint cut short (kill -9) is finished from the WAL by
//! the next open.

use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, MAIN_DB};

use crate::error::{Result, StoreError};

/// When checkpoints run, in WAL frames (one frame is one page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WalLimits {
    /// The thread checkpoints once this many frames are in the log that no checkpoint has
    /// copied yet.
    pub(crate) checkpoint_pages: i32,
    /// A commit that leaves more frames than this in the log finishes the checkpoint itself.
    pub(crate) restart_pages: i32,
}

impl Default for WalLimits {
    fn default() -> Self {
        // Measured (docs/benchmarks.md, `examples/append_load.rs`): passes of 1000 frames
        // with the catch-up at 4000 cost 5-14% more CPU per append than SQLite's own
        // checkpoints and gained no throughput on the server; short passes with the log kept
        // at SQLite's usual 1000 frames cost the same CPU as SQLite's own and take most of
        // the checkpoint stalls off the commits.
        WalLimits {
            checkpoint_pages: 250,
            // SQLite's own autocheckpoint threshold. What a commit copies here is only what was
            // committed since the thread's last pass.
            restart_pages: 1000,
        }
    }
}

/// What the writer's WAL hook and the checkpoint thread share.
#[derive(Debug, Default)]
struct Shared {
    /// Frames of the log copied into the database as of the last checkpoint.
    copied: AtomicI32,
    /// A checkpoint was asked for and has not run yet; keeps the hook from waking the thread
    /// on every commit while one is pending.
    pending: AtomicBool,
    /// Held by whoever is checkpointing in this process.
    pass: Mutex<()>,
    /// Whether the thread is to stop; the condition variable's lock.
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Shared {
    fn lock_stop(&self) -> std::sync::MutexGuard<'_, bool> {
        self.stop.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer's WAL hook: runs after each of its commits with the frames now in the log.
    fn committed(&self, wal: &mut Wal, frames: c_int, limits: WalLimits) {
        if frames >= limits.restart_pages {
            let _pass = self.pass.lock().unwrap_or_else(PoisonError::into_inner);
            // An error (SQLITE_BUSY: another process is checkpointing) leaves it to the next
            // commit. Never an error from the hook: SQLite would report it as the commit's,
            // though the commit is done.
            if let Ok((_, copied)) = wal.checkpoint_v2(CheckpointMode::PASSIVE) {
                self.copied.store(copied.max(0), Ordering::Relaxed);
            }
            return;
        }
        let copied = self.copied.load(Ordering::Relaxed);
        // A log shorter than what was copied has started over.
        let fresh = if frames < copied {
            frames
        } else {
            frames - copied
        };
        if fresh >= limits.checkpoint_pages && !self.pending.swap(true, Ordering::AcqRel) {
            // Taken so the thread cannot miss the flag between checking it and waiting.
            let _guard = self.lock_stop();
            self.wake.notify_one();
        }
    }
}

/// The checkpoint thread of one store; stopped and joined on drop.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Takes over checkpointing of `writer`'s database (at `path`): installs the WAL hook on
    /// `writer` (which replaces SQLite's autocheckpoint on that connection) and starts the
    /// thread with `conn`, a connection of its own.
    pub(crate) fn start(
        path: &Path,
        writer: &mut Connection,
        conn: Connection,
        limits: WalLimits,
    ) -> Result<Checkpointer> {
        let shared = Arc::new(Shared::default());
        let hook_shared = shared.clone();
        writer.wal_hook(Some(move |wal: &mut Wal, frames: c_int| {
            hook_shared.committed(wal, frames, limits);
            Ok(())
        }))?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("runcell-wal".into())
            .spawn(move || run(&thread_shared, &conn))
            .map_err(|source| StoreError::Io {
                path: path.to_owned(),
                source,
            })?;
        Ok(Checkpointer {
            shared,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        *self.shared.lock_stop() = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared, conn: &Connection) {
    loop {
        {
            let mut stop = shared.lock_stop();
            while !*stop && !shared.pending.load(Ordering::Acquire) {
                stop = shared
                    .wake
                    .wait(stop)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if *stop {
                return;
            }
        }
        // An error (SQLITE_BUSY: another process is checkpointing) leaves it to the next
        // request, which the next commit makes.
        let pass = shared.pass.lock().unwrap_or_else(PoisonError::into_inner);
        if let Ok((_, copied)) = conn.wal_checkpoint_v2(Some(MAIN_DB), CheckpointMode::PASSIVE) {
            shared.copied.store(copied.max(0), Ordering::Relaxed);
        }
        drop(pass);
        shared.pending.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
