//! A live session as the manager holds it: its shared state, job queue, worker, workspace,
//! reservation and runner; the jobs its worker takes; and how it ends.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use runcell_sandbox::Workspace;

use super::cell::{CancelToken, EventSink};
use super::runner::Runner;
use super::shared::{Shared, SharedState};
use crate::audit::Reply;
use crate::core::Core;
use crate::limits::Reservation;
use crate::EngineError;

pub(super) enum Job {
    Execute {
        code: String,
        timeout: Duration,
        events: Option<EventSink>,
        cancel: CancelToken,
        reply: Reply,
        /// The tools the cell may call (bridge.rs).
        tools: Option<Box<crate::bridge::ExecTools>>,
    },
    Restart {
        reply: mpsc::Sender<Result<(), EngineError>>,
    },
}

pub(super) struct Entry {
    pub(super) shared: SharedState,
    /// Taken (dropped) when the session ends: the worker holds this entry too, so only
    /// dropping the sender itself lets its `recv` return.
    pub(super) jobs: Mutex<Option<SyncSender<Job>>>,
    /// Joined on delete, so that when delete returns the sandbox and workspace are gone.
    pub(super) worker: Mutex<Option<thread::JoinHandle<()>>>,
    /// Shared with the runner: host-side file operations need no trip through the queue.
    pub(super) workspace: Arc<Workspace>,
    /// The session's proxy state (with a network policy), for commands beside the kernel.
    pub(super) egress: Option<runcell_egress::SessionEgress>,
    /// The session's share of the memory budget and of its owner's quota: given back when
    /// the session's sandbox is gone (see `end`).
    pub(super) reservation: Mutex<Option<Reservation>>,
    /// The kernel; whoever runs a cell holds this lock: the worker thread for queued jobs, an
    /// HTTP task for `SessionManager::execute_async`. Fair, so cells run in the order their
    /// callers began to wait.
    pub(super) runner: Arc<tokio::sync::Mutex<Runner>>,
    /// `SessionManager::execute_async` callers waiting for the runner.
    pub(super) waiting: std::sync::atomic::AtomicUsize,
}

impl Entry {
    pub(super) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock()
    }

    pub(super) fn send(&self, job: Job) -> Result<(), TrySendError<Job>> {
        match &*self.jobs.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(tx) => tx.try_send(job),
            None => Err(TrySendError::Disconnected(job)),
        }
    }
}

/// A cell running, until dropped: its token is the one `SessionManager::cancel` interrupts,
/// and the audit writer counts it among the cells it may wait for.
pub(super) struct CellRunning<'a> {
    entry: &'a Entry,
    core: &'a Core,
}

impl<'a> CellRunning<'a> {
    pub(super) fn start(entry: &'a Entry, core: &'a Core, cancel: &CancelToken) -> Self {
        entry.lock().running = Some(cancel.clone());
        core.cells_running.fetch_add(1, Ordering::Relaxed);
        CellRunning { entry, core }
    }
}

impl Drop for CellRunning<'_> {
    fn drop(&mut self) {
        self.core.cells_running.fetch_sub(1, Ordering::Relaxed);
        self.entry.lock().running = None;
    }
}

/// Ends a session removed from the map: kills its kernel (a running cell ends as killed), then
/// waits for its worker, which drops the kernel's sandbox and the workspace mount.
pub(super) fn end(entry: Arc<Entry>) {
    let worker = {
        let mut s = entry.lock();
        s.deleted = true;
        if let Some(h) = s.handle.take() {
            h.kill();
        }
        entry
            .worker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    };
    // The worker stops when the job sender goes (the worker holds the entry too, so dropping
    // the entry would not be enough); jobs still queued are answered "ended".
    entry.jobs.lock().unwrap_or_else(|p| p.into_inner()).take();
    let reservation = entry
        .reservation
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    drop(entry);
    if let Some(w) = worker {
        if w.thread().id() != thread::current().id() {
            let _ = w.join();
        }
    }
    // The kernel's sandbox is gone now: its memory goes back to the budget and the quota.
    drop(reservation);
}
