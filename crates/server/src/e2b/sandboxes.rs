//! Which sessions are E2B sandboxes: each one's data-plane token, variables, code contexts and
//! commands; the check every data-plane request passes; the sweeper that forgets sandboxes
//! whose session ended.
//!
//! The token, template, variables and timeout behaviour are also kept in the store (the
//! session's extra document of kind [`EXTRA_KIND`], removed with the session), so that a
//! server that stopped (its sessions paused) and started again still knows the sandbox: the
//! SDK's `Sandbox.connect(id)` and the token it already holds keep working. Code contexts and
//! commands live in this process only.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use runcell_engine::Engine;
use runcell_store::Store;
use serde::{Deserialize, Serialize};

use super::names::HOME;

/// The envd version runcell answers as: the SDK picks its wire shapes by it (octet-stream
/// uploads from 0.5.7, no default `user` from 0.4.0).
pub(crate) const ENVD_VERSION: &str = "0.6.4";

/// E2B's default sandbox lifetime and its default (and runcell's maximum) cell time limit.
pub(crate) const DEFAULT_TIMEOUT_S: u64 = 300;

/// Marks a context's kernel (a session beside the sandbox's own, on its workspace) with the
/// sandbox it belongs to; such sessions are no sandboxes of their own.
pub(crate) const CONTEXT_OF: &str = "e2b_context_of";

/// The kind of a session's extra document in the store that holds its [`Record`].
pub(crate) const EXTRA_KIND: &str = "e2b";

/// What the store keeps of a sandbox: what its session does not hold itself.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    token: String,
    template: String,
    envs: BTreeMap<String, String>,
    /// `autoPause`: the sandbox pauses at its timeout instead of being killed.
    auto_pause: bool,
    /// Its timeout as the client last set it, in seconds.
    timeout_s: u64,
}

/// What runcell keeps of an E2B sandbox beside its session: the data plane's token, the
/// variables every command and kernel gets, its code contexts and its commands.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub id: String,
    pub owner: String,
    pub token: String,
    pub template: String,
    pub envs: BTreeMap<String, String>,
    /// `autoPause` at create: at its timeout the sandbox pauses (its session's
    /// `pause_after_s`), else it is killed (its `idle_timeout_s`).
    pub auto_pause: bool,
    /// The timeout in seconds as the client last set it (create, `set_timeout`, `connect`).
    pub timeout_s: AtomicU64,
    pub contexts: Mutex<BTreeMap<String, Context>>,
    pub processes: Mutex<BTreeMap<u32, Arc<Process>>>,
    next_pid: AtomicU32,
}

/// A command started through `Start`.
#[derive(Debug)]
pub(crate) struct Process {
    pub pid: u32,
    pub tag: Option<String>,
    /// `ProcessConfig` as the client sent it.
    pub config: serde_json::Value,
    pub cancel: Arc<std::sync::atomic::AtomicBool>,
    /// Its events after `start`, for `Connect`ed streams.
    pub events: tokio::sync::broadcast::Sender<bytes::Bytes>,
}

impl Process {
    pub fn kill(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
}

/// A code context: a kernel of the sandbox (its own session's, or one beside it).
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub id: String,
    /// As E2B names it (`python`, `javascript`, `bash`).
    pub language: &'static str,
    pub cwd: String,
    /// The runcell session whose kernel it is.
    pub session: String,
}

impl Sandbox {
    pub fn contexts(&self) -> MutexGuard<'_, BTreeMap<String, Context>> {
        self.contexts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn processes(&self) -> MutexGuard<'_, BTreeMap<u32, Arc<Process>>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn next_pid(&self) -> u32 {
        self.next_pid.fetch_add(1, Ordering::Relaxed)
    }

    /// The sessions of its contexts beside its own.
    pub fn context_sessions(&self) -> Vec<String> {
        self.contexts()
            .values()
            .map(|c| c.session.clone())
            .filter(|s| *s != self.id)
            .collect()
    }
}

/// The E2B view of the sessions: which are sandboxes, with their tokens and contexts.
#[derive(Debug, Default)]
pub(crate) struct Sandboxes {
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
    sweeper: std::sync::OnceLock<()>,
}

/// How often sandboxes whose session ended (expired, deleted through `/v1`) are forgotten and
/// their context kernels and commands ended.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Sandboxes {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts (once) the task that forgets sandboxes whose session is gone. Call it from the
    /// runtime (a handler).
    pub fn start_sweeper(self: &Arc<Self>, engine: &Engine) {
        self.sweeper.get_or_init(|| {
            let me = Arc::downgrade(self);
            let engine = engine.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(SWEEP_EVERY).await;
                    let Some(me) = me.upgrade() else { break };
                    let gone: Vec<String> = me
                        .map()
                        .keys()
                        .filter(|id| engine.sessions().get(id).is_err())
                        .cloned()
                        .collect();
                    for id in gone {
                        if let Some(sandbox) = me.remove(&id) {
                            let engine = engine.clone();
                            tokio::task::spawn_blocking(move || end_extras(&engine, &sandbox));
                        }
                    }
                }
            });
        });
    }

    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.map().get(id).cloned()
    }

    /// The sandbox session `id` (of `owner`) is: known, or kept in the store (a server that
    /// started again: its session, paused, gets back the variables its kernel was created
    /// with, which the engine does not record). May read the store.
    pub fn get_or_load(
        &self,
        engine: &Engine,
        store: &Store,
        id: &str,
        owner: &str,
    ) -> Option<Arc<Sandbox>> {
        if let Some(s) = self.get(id) {
            return Some(s);
        }
        let text = match store.session_extra(id, EXTRA_KIND) {
            Ok(t) => t?,
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "cannot read an E2B sandbox's record");
                return None;
            }
        };
        let rec: Record = match serde_json::from_str(&text) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "an E2B sandbox's record does not parse");
                return None;
            }
        };
        if !rec.envs.is_empty() {
            if let Err(e) = engine.sessions().set_paused_env(id, rec.envs.clone()) {
                tracing::warn!(session = %id, error = %e, "cannot give an E2B sandbox's kernel its variables back");
            }
        }
        let mut sandbox = Sandbox::new(id, owner, &rec.template, rec.envs, rec.auto_pause);
        sandbox.token = rec.token;
        sandbox.timeout_s = AtomicU64::new(rec.timeout_s);
        Some(
            self.map()
                .entry(id.to_owned())
                .or_insert_with(|| Arc::new(sandbox))
                .clone(),
        )
    }

    /// The sandbox session `id` is, made known now if it was not (a session created through
    /// `/v1/sessions`): a fresh token, no variables, kept in the store. May read and write the
    /// store.
    pub fn get_or_adopt(
        &self,
        engine: &Engine,
        store: &Store,
        id: &str,
        owner: &str,
    ) -> Arc<Sandbox> {
        if let Some(s) = self.get_or_load(engine, store, id, owner) {
            return s;
        }
        let fresh = Arc::new(Sandbox::new(id, owner, "base", BTreeMap::new(), false));
        let sandbox = self
            .map()
            .entry(id.to_owned())
            .or_insert_with(|| fresh.clone())
            .clone();
        if Arc::ptr_eq(&sandbox, &fresh) {
            sandbox.persist(store);
        }
        sandbox
    }

    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        self.map().values().cloned().collect()
    }

    pub fn insert(&self, sandbox: Sandbox) -> Arc<Sandbox> {
        let s = Arc::new(sandbox);
        self.map().insert(s.id.clone(), s.clone());
        s
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.map().remove(id)
    }
}

impl Sandbox {
    /// Writes what a restarted server needs of it into the store. Blocking; a store that
    /// cannot take it (sessions not recorded, a full disk) only costs the sandbox its
    /// survival of a restart, which the log says.
    pub fn persist(&self, store: &Store) {
        let rec = Record {
            token: self.token.clone(),
            template: self.template.clone(),
            envs: self.envs.clone(),
            auto_pause: self.auto_pause,
            timeout_s: self.timeout_s.load(Ordering::Relaxed),
        };
        let text = match serde_json::to_string(&rec) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(session = %self.id, error = %e, "cannot encode an E2B sandbox's record");
                return;
            }
        };
        if let Err(e) = store.put_session_extra(&self.id, EXTRA_KIND, &text) {
            tracing::warn!(session = %self.id, error = %e, "cannot keep an E2B sandbox's record: it will not survive a restart");
        }
    }

    pub fn new(
        id: &str,
        owner: &str,
        template: &str,
        envs: BTreeMap<String, String>,
        auto_pause: bool,
    ) -> Sandbox {
        let mut contexts = BTreeMap::new();
        contexts.insert(
            "python".to_owned(),
            Context {
                id: "python".to_owned(),
                language: "python",
                cwd: HOME.to_owned(),
                session: id.to_owned(),
            },
        );
        Sandbox {
            id: id.to_owned(),
            owner: owner.to_owned(),
            token: new_token(),
            template: template.to_owned(),
            envs,
            auto_pause,
            timeout_s: AtomicU64::new(DEFAULT_TIMEOUT_S),
            contexts: Mutex::new(contexts),
            processes: Mutex::default(),
            next_pid: AtomicU32::new(1000),
        }
    }
}

/// 160 random bits.
fn new_token() -> String {
    let a = runcell_engine::new_id("");
    let b = runcell_engine::new_id("");
    format!("{}{}", a.trim_start_matches('_'), b.trim_start_matches('_'))
}

/// Whether two secrets are equal, in time independent of where they differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Ends the sandbox's context kernels (not its own session) and its commands. Blocking.
pub(crate) fn end_extras(engine: &Engine, sandbox: &Sandbox) {
    for p in sandbox.processes().values() {
        p.kill();
    }
    for s in sandbox.context_sessions() {
        let _ = engine.sessions().delete(&s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert_ne!(new_token(), new_token());
        assert!(new_token().len() >= 32);
    }
}
