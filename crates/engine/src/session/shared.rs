//! What a session's callers, worker and runner share, behind one lock.

use std::sync::{Mutex, MutexGuard};

use runcell_sandbox::RunningHandle;

use super::cell::CancelToken;
use super::info::SessionInfo;

pub(super) struct Shared {
    pub(super) info: SessionInfo,
    /// The token of the execution running now.
    pub(super) running: Option<CancelToken>,
    /// Interrupts or kills the current kernel from outside the worker.
    pub(super) handle: Option<RunningHandle>,
    pub(super) deleted: bool,
    /// What a resume nobody asked for brought back, for the next Execution to say.
    pub(super) restored: Option<crate::restored::Restored>,
}

/// [`Shared`] behind its lock; a panic while it was held does not poison it.
pub(super) struct SharedState(Mutex<Shared>);

impl SharedState {
    pub(super) fn new(shared: Shared) -> Self {
        SharedState(Mutex::new(shared))
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
