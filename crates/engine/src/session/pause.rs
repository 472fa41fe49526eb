//! What pausing, resuming and forking (`crate::durable`) need of a live session: its kernel
//! held while idle, its retirement from the live sessions, and a resumed session's launch.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use runcell_kernel::Kernel;
use runcell_sandbox::Workspace;

use super::entry::Entry;
use super::runner::Runner;
use super::{SessionInfo, SessionManager, SessionStatus};
use crate::error::Busy;
use crate::limits::Reservation;
use crate::EngineError;

/// An idle session whose kernel is held ([`SessionManager::idle`]): nothing runs on it
/// until this is dropped.
pub(crate) struct Idle {
    entry: Arc<Entry>,
    runner: tokio::sync::OwnedMutexGuard<Runner>,
}

impl Idle {
    pub(crate) fn info(&self) -> SessionInfo {
        self.entry.lock().info.clone()
    }

    /// The kernel, if it is running.
    pub(crate) fn kernel(&mut self) -> Option<&mut Kernel> {
        self.runner.kernel.as_mut().filter(|k| k.is_alive())
    }

    pub(crate) fn workspace(&self) -> &Arc<Workspace> {
        &self.runner.workspace
    }

    pub(crate) fn env(&self) -> &[(String, String)] {
        &self.runner.env
    }

    /// Its network policy's proxy state (a resume starts its kernel with the same).
    pub(crate) fn egress(&self) -> Option<runcell_egress::SessionEgress> {
        self.entry.egress.clone()
    }
}

impl SessionManager {
    pub(crate) fn core(&self) -> &Arc<crate::core::Core> {
        &self.core
    }

    pub(crate) fn paused(&self) -> &crate::paused::PausedSessions {
        &self.paused
    }

    pub(crate) fn me(&self) -> Option<Arc<SessionManager>> {
        self.me.upgrade()
    }

    /// An idle session's kernel, held so that nothing runs on it meanwhile (a pause, a fork,
    /// an idle snapshot); a cell running or waiting is [`Busy::Running`]. Held by no cell
    /// (the idle snapshot a few seconds after a cell, another pause or fork), it is waited
    /// for: a pause right then is not the user's busy session. Not from an async context.
    pub(crate) fn idle(&self, id: &str) -> Result<Idle, EngineError> {
        let entry = self.entry(id)?;
        let busy = || EngineError::SessionBusy(Busy::Running { id: id.to_owned() });
        let cell = |e: &Entry| e.waiting.load(Ordering::Acquire) > 0 || e.lock().running.is_some();
        let runner = match entry.runner.clone().try_lock_owned() {
            Ok(r) => r,
            Err(_) if !cell(&entry) => {
                // Cells queue behind this wait (the lock is fair), so it never waits for one
                // that had not started when it began.
                let r = entry.runner.clone().blocking_lock_owned();
                // Whoever held it may have paused or ended the session meanwhile.
                let live = self.map().get(id).is_some_and(|e| Arc::ptr_eq(e, &entry));
                if !live {
                    return Err(busy());
                }
                r
            }
            Err(_) => return Err(busy()),
        };
        if cell(&entry) {
            return Err(busy());
        }
        Ok(Idle { entry, runner })
    }

    /// Ends an idle session's kernel and takes the session out of the live ones, calling
    /// `then` under the map's lock (a pause puts it among the paused there, so a request
    /// always finds it one way or the other). Its workspace stays with whoever holds it.
    pub(crate) fn retire(&self, mut idle: Idle, then: impl FnOnce(&crate::paused::PausedSessions)) {
        let kernel = idle.runner.kernel.take();
        let id = idle.info().id;
        drop(idle);
        let entry = {
            let mut map = self.map();
            let entry = map.remove(&id);
            if entry.is_some() {
                *self.ending.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            }
            then(&self.paused);
            entry
        };
        // Killing and reaping the sandbox's tree takes tens of milliseconds: off the caller's
        // path. Its memory goes back to the budget when it is gone (`end`), and `shutdown`
        // waits for it (it is counted as ending).
        let teardown = move |m: &SessionManager| {
            if let Some(k) = kernel {
                k.shutdown();
            }
            if let Some(e) = entry {
                m.end(e);
            }
        };
        match self.me() {
            Some(me) => {
                let (tx, rx) =
                    std::sync::mpsc::channel::<Box<dyn FnOnce(&SessionManager) + Send>>();
                let spawned = std::thread::Builder::new()
                    .name("session-end".into())
                    .spawn(move || {
                        if let Ok(teardown) = rx.recv() {
                            teardown(&me);
                        }
                    });
                let teardown: Box<dyn FnOnce(&SessionManager) + Send> = Box::new(teardown);
                match spawned {
                    Ok(_) => {
                        let _ = tx.send(teardown);
                    }
                    Err(_) => teardown(self),
                }
            }
            None => teardown(self),
        }
    }

    /// Registers a resumed session with its kernel (durable.rs).
    pub(crate) fn launch_resumed(
        &self,
        info: SessionInfo,
        workspace: Arc<Workspace>,
        env: Vec<(String, String)>,
        kernel: Kernel,
        reservation: Reservation,
        egress: Option<runcell_egress::SessionEgress>,
    ) -> Result<SessionInfo, EngineError> {
        self.launch(info, workspace, env, Some(kernel), reservation, egress)
    }

    /// What the session's next Execution says a resume restored.
    pub(crate) fn set_restored(&self, id: &str, restored: crate::restored::Restored) {
        if let Some(e) = self.map().get(id) {
            e.lock().restored = Some(restored);
        }
    }

    /// Takes back what a resume restored (the explicit resume's reply carried it).
    pub(crate) fn take_restored(&self, id: &str) {
        if let Some(e) = self.map().get(id) {
            e.lock().restored = None;
        }
    }

    /// `memory_mb` of the budget for a resumed session (warm sessions make room).
    pub(crate) fn reserve_memory(&self, memory_mb: u64) -> Result<Reservation, EngineError> {
        self.reserve(memory_mb, true)
    }

    /// Pauses the sessions idle past their `pause_after_s` (and not expiring first), and
    /// expires the paused ones past their `expire_after_s`. On the expiry thread.
    pub(super) fn pause_idle(&self, now: DateTime<Utc>) {
        let pausing: Vec<String> = self
            .map()
            .iter()
            .filter(|(_, e)| {
                let s = e.lock();
                let after = chrono::Duration::seconds(s.info.limits.pause_after_s as i64);
                s.info.status == SessionStatus::Ready
                    && s.info.last_active_at + after <= now
                    && s.info.expires_at > now
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in pausing {
            match self.pause(&id) {
                Ok(_) => tracing::info!(session = %id, "idle session paused"),
                Err(e) => {
                    tracing::warn!(session = %id, error = %crate::chain(&e), "cannot pause an idle session")
                }
            }
        }
        for id in self.paused.expired(now) {
            if self.end_paused(&id) {
                tracing::info!(session = %id, "paused session expired");
                if let Err(e) = self.forget(&id) {
                    tracing::warn!(session = %id, error = %crate::chain(&e), "cannot forget an expired session's record");
                }
            }
        }
    }
}
