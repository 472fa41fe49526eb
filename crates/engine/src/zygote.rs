//! The engine's side of the zygote (DESIGN.md §4): start it in the background, hand Python
//! sessions to it while it is alive, restart it when it dies, and fall back to cold starts (slower,
//! never broken) whenever it is not there.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runcell_sandbox::Zygote;

/// Modules a zygote imports unless configured otherwise: the data stack, and what resuming
/// a paused data session needs (issue 17): restoring a fitted scikit-learn model into a kernel
/// without it imports it first, 2.5 s of a resume that otherwise takes tens of milliseconds;
/// cloudpickle is the snapshots' serializer (docs/benchmarks.md, "Pause and resume").
pub const DEFAULT_PRELOAD: &[&str] = &[
    "numpy",
    "pandas",
    "matplotlib",
    "matplotlib.pyplot",
    "sklearn.ensemble",
    "cloudpickle",
];

/// Modules the light zygote (one-shots that import only the standard library) holds beyond the
/// kernel module: what such programs import most (an evaluation's solutions: collections,
/// heapq, re, math...), ~0.8 MiB together, ~8 ms to import in each run otherwise.
pub(crate) const LIGHT_PRELOAD: &[&str] = &[
    "random",
    "json",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "math",
    "typing",
    "string",
    "datetime",
    "decimal",
    "fractions",
    "statistics",
    "dataclasses",
];

/// Warns of the preload's modules the runtime could not import, each once per process (a
/// zygote started again after it died skips the same ones).
fn log_skipped_once(skipped: &[(String, String)]) {
    static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    for (module, reason) in skipped {
        if !logged.contains(module) {
            tracing::warn!(%module, %reason, "the zygote preloads without a module the runtime lacks; sessions import it themselves if they use it");
            logged.push(module.clone());
        }
    }
}

/// How long preloading may take (a cold disk can make the first imports slow).
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Wait before starting again after a failure, so a broken runtime does not spin.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// What the zygote is doing, for `/healthz`, logs and tests.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ZygoteStatus {
    /// Not configured (no runtime, or preloading turned off): every session starts cold.
    Off,
    Starting,
    Ready {
        pid: u32,
        preloaded: Vec<String>,
    },
    Failed {
        error: String,
    },
}

/// The zygote's state; what it preloads is the engine's configuration.
pub(crate) struct ZygoteSlot {
    state: Mutex<State>,
}

enum State {
    Idle,
    Starting,
    Ready(Arc<Zygote>),
    Failed { at: Instant, error: String },
}

impl ZygoteSlot {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::Idle),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn status(&self) -> ZygoteStatus {
        match &*self.lock() {
            State::Idle | State::Starting => ZygoteStatus::Starting,
            State::Ready(z) => ZygoteStatus::Ready {
                pid: z.pid(),
                preloaded: z.preloaded.clone(),
            },
            State::Failed { error, .. } => ZygoteStatus::Failed {
                error: error.clone(),
            },
        }
    }
}

impl ZygoteSlot {
    /// The live zygote, if there is one. Otherwise (re)starts it in the background with
    /// `start` when due and returns `None`: the caller starts cold this time.
    pub(crate) fn live_or_start(
        self: &Arc<Self>,
        start: impl FnOnce() -> Result<Zygote, String> + Send + 'static,
    ) -> Option<Arc<Zygote>> {
        let mut state = self.lock();
        match &*state {
            State::Ready(z) if z.is_alive() => return Some(z.clone()),
            State::Ready(z) => {
                tracing::warn!(
                    pid = z.pid(),
                    "the zygote died; restarting it (sessions start cold meanwhile)"
                );
            }
            State::Starting => return None,
            State::Failed { at, .. } if at.elapsed() < RETRY_AFTER => return None,
            State::Failed { .. } | State::Idle => {}
        }
        *state = State::Starting;
        drop(state);
        let slot = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("runcell-zygote-start".into())
            .spawn(move || {
                let result = start();
                let mut state = slot.lock();
                *state = match result {
                    Ok(z) => {
                        tracing::info!(pid = z.pid(), preloaded = ?z.preloaded, "zygote ready");
                        log_skipped_once(&z.skipped);
                        State::Ready(Arc::new(z))
                    }
                    Err(error) => {
                        tracing::warn!(%error, "no zygote: Python sessions start cold");
                        State::Failed {
                            at: Instant::now(),
                            error,
                        }
                    }
                };
            });
        if let Err(e) = spawned {
            *self.lock() = State::Failed {
                at: Instant::now(),
                error: e.to_string(),
            };
        }
        None
    }

    /// The live zygote, if there is one; starts nothing.
    pub(crate) fn live(&self) -> Option<Arc<Zygote>> {
        match &*self.lock() {
            State::Ready(z) if z.is_alive() => Some(z.clone()),
            _ => None,
        }
    }

    /// Marks the zygote as unusable after a failed fork, so the next session restarts it.
    pub(crate) fn failed(&self, error: String) {
        let mut state = self.lock();
        if matches!(&*state, State::Ready(_)) {
            tracing::warn!(%error, "the zygote failed a request; it will be restarted");
            *state = State::Failed {
                at: Instant::now() - RETRY_AFTER,
                error,
            };
        }
    }
}

/// `X.Y` of the runtime's interpreter, from the venv's `pyvenv.cfg`.
pub(crate) fn python_version(runtime: &std::path::Path) -> Result<String, String> {
    let cfg = std::fs::read_to_string(runtime.join("pyvenv.cfg"))
        .map_err(|e| format!("cannot read {}/pyvenv.cfg: {e}", runtime.display()))?;
    cfg.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| matches!(k.trim(), "version" | "version_info"))
        .and_then(|(_, v)| {
            let mut parts = v.trim().split('.');
            Some(format!("{}.{}", parts.next()?, parts.next()?))
        })
        .ok_or_else(|| format!("{}/pyvenv.cfg names no version", runtime.display()))
}
