//! Warm sessions: Python kernels forked from the zygote ahead of demand, so that creating a
//! session with the default limits and no caller environment hands one out instead of
//! waiting for a fork (the fork, the namespaces, the mounts and Python's own start-up are
//! ~15 ms of CPU on a small VM; handing out is a queue pop).
//!
//! A warm session is an ordinary, complete and unused session: its own uid, workspace,
//! cgroup and namespaces, started by the same code path as any other. It is handed out once
//! and never returns to the pool; a claimed session ends exactly like one forked on demand.
//! Requests the warm ones do not fit (another language, limits, an environment) fork as
//! before. The pool fills only from a ready zygote: a cold start is not worth keeping warm.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use runcell_kernel::Kernel;
use runcell_sandbox::Workspace;

use crate::limits::{Reservation, SessionLimits};
use crate::EngineError;

/// How often an idle filler looks again without being woken (the zygote becoming ready is
/// not signalled).
const RECHECK: Duration = Duration::from_millis(250);

/// After a failed start, the filler waits this long before the next one, so a broken host
/// does not turn into a fork loop.
const BACKOFF: Duration = Duration::from_secs(2);

/// One started, never used session.
pub(crate) struct Warm {
    pub(crate) id: String,
    pub(crate) workspace: Arc<Workspace>,
    pub(crate) kernel: Kernel,
    pub(crate) limits: SessionLimits,
    /// Its memory in the server's budget; last, so it is given back once the sandbox is gone.
    pub(crate) reservation: Reservation,
}

impl Warm {
    /// Whether a request for `limits` can have this session: the sandbox's limits and the
    /// workspace size are fixed at the fork; the timeouts are the session's own and are
    /// taken from the request.
    fn fits(&self, limits: &SessionLimits) -> bool {
        let (a, b) = (&self.limits, limits);
        a.memory_mb == b.memory_mb && a.cpu == b.cpu && a.pids == b.pids && a.disk_mb == b.disk_mb
    }
}

#[derive(Default)]
struct State {
    ready: VecDeque<Warm>,
    /// How many to keep ready; 0 until the pool is started.
    target: usize,
    stopped: bool,
}

/// Where warm sessions come from (the session manager); the pool only asks it.
pub(crate) trait WarmSource: Send + Sync {
    /// The pool these sessions go to.
    fn warm_pool(&self) -> &WarmPool;
    /// Whether new Python sessions would come from a ready zygote (a pool fills only then).
    fn zygote_ready(&self) -> bool;
    /// Whether a warm session with the default limits fits the budget now.
    fn warm_fits(&self) -> bool;
    /// Starts one session with the default limits.
    fn start_warm(&self) -> Result<Warm, EngineError>;
}

/// The warm sessions of one session manager and the thread that refills them.
#[derive(Default)]
pub(crate) struct WarmPool {
    state: Mutex<State>,
    /// Wakes the filler: a session was taken, or the pool stops.
    wake: Condvar,
    filler: Mutex<Option<JoinHandle<()>>>,
}

impl WarmPool {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts keeping `target` sessions warm; `manager` starts them. Once only.
    pub(crate) fn start(&self, target: usize, manager: Weak<dyn WarmSource>) {
        {
            let mut st = self.lock();
            if st.stopped || st.target > 0 || target == 0 {
                return;
            }
            st.target = target;
        }
        let spawned = thread::Builder::new()
            .name("session-warm".into())
            .spawn(move || fill(manager));
        match spawned {
            Ok(h) => *self.filler.lock().unwrap_or_else(|p| p.into_inner()) = Some(h),
            Err(e) => tracing::error!(error = %e, "cannot start the warm-session thread"),
        }
    }

    /// A warm session for `limits`, if one fits and is still alive.
    pub(crate) fn take(&self, limits: &SessionLimits) -> Option<Warm> {
        let mut dead = Vec::new();
        let taken = {
            let mut st = self.lock();
            let mut taken = None;
            while let Some(i) = st.ready.iter().position(|w| w.fits(limits)) {
                let Some(w) = st.ready.remove(i) else { break };
                if w.kernel.is_idle() {
                    taken = Some(w);
                    break;
                }
                dead.push(w);
            }
            if taken.is_some() || !dead.is_empty() {
                self.wake.notify_all();
            }
            taken
        };
        if !dead.is_empty() {
            tracing::warn!(
                n = dead.len(),
                "warm sessions died while waiting; discarded"
            );
        }
        // Dropping kills the sandboxes and removes the workspaces, outside the lock.
        drop(dead);
        taken
    }

    /// Ends one warm session to make room in the memory budget for a session someone asked
    /// for (warm sessions are started only in case); false if there is none. The filler
    /// starts another only when the budget has room again.
    pub(crate) fn evict_one(&self) -> bool {
        let w = self.lock().ready.pop_back();
        // Dropped outside the lock: its sandbox is killed and its reservation given back.
        w.is_some()
    }

    /// How many are ready now.
    pub(crate) fn ready(&self) -> usize {
        self.lock().ready.len()
    }

    /// Stops refilling and ends the warm sessions (their sandboxes and workspaces are gone
    /// when this returns).
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
            if h.thread().id() != thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// The filler thread: keeps the pool at its target while the manager lives.
fn fill(manager: Weak<dyn WarmSource>) {
    loop {
        let Some(m) = manager.upgrade() else { return };
        let pool = m.warm_pool();
        {
            let st = pool.lock();
            if st.stopped {
                return;
            }
            // A warm session is started only with room in the memory budget left for it.
            if st.ready.len() >= st.target || !m.zygote_ready() || !m.warm_fits() {
                let (st, _) = pool
                    .wake
                    .wait_timeout(st, RECHECK)
                    .unwrap_or_else(|p| p.into_inner());
                if st.stopped {
                    return;
                }
                continue;
            }
        }
        match m.start_warm() {
            Ok(w) => {
                let mut st = pool.lock();
                if st.stopped {
                    drop(st);
                    drop(w);
                    return;
                }
                tracing::debug!(session = %w.id, "warm session ready");
                st.ready.push_back(w);
            }
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), "cannot start a warm session");
                let st = pool.lock();
                let _ = pool.wake.wait_timeout(st, BACKOFF);
            }
        }
    }
}
