//! Stateful sessions: one sandboxed kernel and one workspace each, executions run one at a time
//! in arrival order, idle sessions expire.
//!
//! A session's kernel sits behind a fair lock ([`Entry::runner`]); whoever holds it runs a
//! cell. Synchronous and streaming callers queue a job for the session's worker thread, which
//! takes the lock and blocks in `poll` while the cell runs. The HTTP API's plain executions
//! take the lock on their own task instead ([`SessionManager::execute_async`]) and wait for the
//! kernel on the tokio reactor: no thread hand-over per execution, which under load was two
//! context switches of the ~5 an execution cost.

mod cell;
mod entry;
mod info;
pub(crate) mod pause;
mod runner;
mod shared;
mod sibling;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use chrono::Utc;
use runcell_kernel::Kernel;
use runcell_sandbox::{UidLease, Workspace};

pub use self::cell::{CancelToken, EventSink, ExecEvent};
use self::entry::{end, CellRunning, Entry, Job};
pub(crate) use self::info::RecoverSession;
pub use self::info::{CreateSession, SessionInfo, SessionStatus};
use self::runner::Runner;
use self::shared::{Shared, SharedState};
use self::worker::Worker;
use crate::audit::Reply;
use crate::core::Core;
use crate::error::{Busy, Capacity, Invalid, RecordError, Resource};
use crate::limits::{Admit, Reservation, SessionLimits};
use crate::model::{new_id, Execution, Language, Start};
use crate::pool::{Warm, WarmPool, WarmSource};
use crate::EngineError;

/// Executions waiting behind the running one, per session; past it the session is busy.
pub const QUEUE_DEPTH: usize = 8;

/// How long a stopping server waits for its sessions to pause (SIGTERM; issue 17: 100
/// sessions in at most 10 s).
const PAUSE_ALL_WITHIN: Duration = Duration::from_secs(10);

/// Owns every session of an engine.
pub struct SessionManager {
    core: Arc<Core>,
    sessions: Mutex<HashMap<String, Arc<Entry>>>,
    /// The expiry sweeper starts with the first session, so an engine used only for one-shot
    /// runs stays single-threaded (and can fork its sandbox helpers).
    sweeper: std::sync::Once,
    /// Sessions taken out of the map whose teardown has not finished: `shutdown` waits for
    /// them, so no sandbox or mount outlives it.
    ending: (Mutex<usize>, std::sync::Condvar),
    /// Sessions started ahead of demand (empty unless [`SessionManager::start_warm_pool`]).
    pool: WarmPool,
    /// Workspaces made ahead of demand (from [`SessionManager::start_spare_workspaces`] on).
    spares: Arc<crate::spares::SpareWorkspaces>,
    /// At most this many live sessions (0: no cap); see [`SessionManager::set_max_sessions`].
    max_sessions: std::sync::atomic::AtomicUsize,
    /// Creates under way and one-shot runs, counted against `max_sessions` (see
    /// [`SessionManager::reserve_sandbox`]).
    creating: Arc<std::sync::atomic::AtomicUsize>,
    /// Sessions paused to disk (durable.rs).
    paused: crate::paused::PausedSessions,
    me: std::sync::Weak<SessionManager>,
}

impl std::fmt::Debug for SessionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionManager").finish_non_exhaustive()
    }
}

impl SessionManager {
    pub(crate) fn new(core: Arc<Core>) -> Arc<SessionManager> {
        Arc::new_cyclic(|me| SessionManager {
            core,
            sessions: Mutex::new(HashMap::new()),
            sweeper: std::sync::Once::new(),
            me: me.clone(),
            ending: (Mutex::new(0), std::sync::Condvar::new()),
            pool: WarmPool::default(),
            spares: Arc::default(),
            max_sessions: std::sync::atomic::AtomicUsize::new(0),
            creating: Arc::default(),
            paused: Default::default(),
        })
    }

    /// Refuses to create more than `n` live sessions (0: no cap): a server derives `n` from
    /// its open-files limit and the host uid range, so that sessions already running always
    /// find the descriptors their kernels, commands and cgroups need.
    pub fn set_max_sessions(&self, n: usize) {
        self.max_sessions.store(n, Ordering::Relaxed);
    }

    /// Keeps `n` Python sessions with the default limits started ahead of demand (forked from
    /// the zygote once it is ready), so creating one with the defaults and no environment
    /// needs no fork. A server calls this once it has recovered the sessions of a previous
    /// run (a warm session must not take a uid a recovered workspace needs back).
    pub fn start_warm_pool(&self, n: usize) {
        if self.core.zygote_status() == crate::ZygoteStatus::Off {
            return;
        }
        let me: std::sync::Weak<dyn WarmSource> = self.me.clone();
        self.pool.start(n, me);
    }

    /// Keeps a few empty workspaces of the default disk size mounted ahead of demand (when
    /// workspaces are on disk), for creates of any language: a server's, once it has
    /// recovered the sessions of a previous run.
    pub fn start_spare_workspaces(&self) {
        self.spares
            .start(&self.core, self.core.config.limits.defaults.disk_mb);
    }

    /// Warm sessions ready to be handed out now.
    pub fn warm_ready(&self) -> usize {
        self.pool.ready()
    }

    /// The room left for new sessions, as a node reports it for placement (docs/scale.md):
    /// the memory budget not committed (warm sessions count as room, since a create takes
    /// or evicts one), and the sessions the cap still admits (`None`: no cap).
    pub fn room(&self) -> runcell_store::NodeRoom {
        let limits = &self.core.config.limits;
        let warm = (self.pool.ready() as u64).saturating_mul(limits.defaults.memory_mb);
        let held = self.core.ledger.committed_mb().saturating_sub(warm);
        let max = self.max_sessions.load(Ordering::Relaxed);
        let live = self.map().len() + self.creating.load(Ordering::Acquire);
        runcell_store::NodeRoom {
            free_memory_mb: limits.committed_memory_mb.saturating_sub(held),
            free_sessions: (max > 0).then(|| max.saturating_sub(live) as u64),
        }
    }

    /// `memory_mb` of the budget, for a sandbox about to start. When it does not fit and
    /// `evict` is set, warm sessions (started only in case) make room first.
    fn reserve(&self, memory_mb: u64, evict: bool) -> Result<Reservation, EngineError> {
        let budget = self.core.config.limits.committed_memory_mb;
        loop {
            match self.core.ledger.reserve(memory_mb, budget, Admit::Checked) {
                Err(EngineError::OverCommitted(_)) if evict && self.pool.evict_one() => continue,
                other => return other,
            }
        }
    }

    /// A new, empty workspace for session `id`, on a uid of its own.
    pub(crate) fn new_workspace(
        &self,
        id: &str,
        limits: &SessionLimits,
    ) -> Result<Arc<Workspace>, EngineError> {
        let lease = UidLease::acquire(&self.core.config.run_dir.join("uids"))
            .map_err(EngineError::unavailable)?;
        let workspace = self.core.create_workspace(
            &self.core.config.workspace_path(id),
            limits.disk_bytes(),
            lease,
        )?;
        Ok(Arc::new(workspace))
    }

    /// Removes the session workspaces nobody will come back for: no live session has them,
    /// `known(id)` (the store) does not remember them, and no process holds their uid. A
    /// server killed with warm sessions, or between starting a session and recording it,
    /// leaves such workspaces (and, on disk, their images). Returns how many were removed.
    pub fn sweep_orphan_workspaces(&self, known: &dyn Fn(&str) -> bool) -> usize {
        let dir = self.core.config.workspaces_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return 0;
        };
        let leases = self.core.config.run_dir.join("uids");
        let mut removed = 0;
        // Images without a workspace directory (a server killed between the two); first, as
        // the workspaces removed below lose their directory before their image.
        if let Some(images) = &self.core.images {
            for id in images.images() {
                if id.starts_with("ses_")
                    && !known(&id)
                    && !self.map().contains_key(&id)
                    && !dir.join(&id).exists()
                {
                    images.discard(&dir.join(&id));
                    tracing::info!(session = %id, "removed an orphaned workspace image");
                    removed += 1;
                }
            }
        }
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().filter(|n| n.starts_with("ses_")) else {
                continue;
            };
            if known(id) || self.map().contains_key(id) {
                continue;
            }
            let path = entry.path();
            let Some(uid) = Workspace::owner_of(&path) else {
                continue;
            };
            let Ok(lease) = UidLease::acquire_uid(&leases, uid) else {
                continue; // someone still runs on that uid
            };
            match self.core.adopt_workspace(&path, lease) {
                Ok(ws) => drop(ws), // unmounts and removes it, and its image
                // Not mounted and no image to mount (the server died before making it): a
                // plain directory.
                Err(_) if !is_mount_point(&path) => {
                    let _ = std::fs::remove_dir_all(&path);
                    if let Some(images) = &self.core.images {
                        images.discard(&path);
                    }
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %crate::chain(&e), "left an orphaned workspace that is not runcell's mount");
                    continue;
                }
            }
            tracing::info!(session = id, "removed an orphaned session workspace");
            removed += 1;
        }
        // Their filesystems shut down and images deleted before this returns (`runcell
        // doctor --clean` exits right after).
        if let Some(images) = &self.core.images {
            images.wait_removals(Duration::from_secs(30));
        }
        removed
    }

    /// Idle expiry: a sweep every second; it stops with the manager.
    pub(crate) fn start_sweeper(&self) {
        let weak = self.me.clone();
        self.sweeper.call_once(|| {
            let spawned = thread::Builder::new()
                .name("session-expiry".into())
                .spawn(move || {
                    // When each session's last idle snapshot was of (its last activity then).
                    let mut snapshots = HashMap::new();
                    loop {
                        thread::sleep(Duration::from_secs(1));
                        let Some(m) = weak.upgrade() else { return };
                        m.expire_idle();
                        m.paused.unmount_idle(m.core.images.as_ref());
                        if m.core.session_store().is_some() {
                            m.idle_snapshots(&mut snapshots);
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the session expiry thread");
            }
        });
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a session and starts its kernel; returns once it is ready.
    pub fn create(&self, req: CreateSession) -> Result<SessionInfo, EngineError> {
        crate::bounds::check_metadata(&req.metadata)?;
        crate::bounds::check_env(&req.env)?;
        self.leased()?;
        // Checked (and its proxy state made) before anything is allocated; nothing starts yet.
        let egress = self.core.network.session(&req.network)?;
        let _slot = self.creation_slot()?;
        let language = req.language.unwrap_or(Language::Python);
        let limits = self.core.resolve_session_limits(&req.limits)?;
        let policy = self.core.tenant_policy(&req.owner)?;
        // The tenant's default start applies to Python sessions (the others start cold).
        let asked = req
            .start
            .or(policy.start.filter(|_| language == Language::Python));
        let start = match (asked, language) {
            (Some(Start::Zygote), l) if l != Language::Python => {
                return Err(EngineError::InvalidRequest(Invalid::ZygoteStart {
                    language: l,
                }))
            }
            (Some(s), _) => s,
            (None, Language::Python) => Start::Zygote,
            (None, _) => Start::Cold,
        };
        self.start_sweeper();
        // The quota first (the tenant's own business), then the server's room.
        self.core
            .ledger
            .check_quota(&req.owner, &policy, limits.memory_mb)?;
        // A warm session fits a request that changes nothing fixed at the fork.
        // A warm one has no egress socket: a session with a network policy starts its own.
        let warm = (language == Language::Python
            && req.env.is_empty()
            && start == Start::Zygote
            && egress.is_none())
        .then(|| self.pool.take(&limits))
        .flatten();
        let (id, workspace, kernel, mut reservation) = match warm {
            Some(w) => (w.id, w.workspace, Some(w.kernel), w.reservation),
            None => {
                let reservation = self.reserve(limits.memory_mb, true)?;
                let id = new_id("ses");
                let workspace = self.new_workspace(&id, &limits)?;
                (id, workspace, None, reservation)
            }
        };
        // Checked again under the ledger's lock: a concurrent create may have taken the room.
        self.core
            .ledger
            .assign(&mut reservation, &req.owner, &policy, Admit::Checked)?;
        let env: Vec<(String, String)> = req.env.into_iter().collect();
        let now = Utc::now();
        let info = SessionInfo {
            id,
            language,
            status: SessionStatus::Ready,
            created_at: now,
            last_active_at: now,
            expires_at: now + chrono::Duration::seconds(limits.idle_timeout_s as i64),
            limits,
            start,
            network: req.network,
            metadata: req.metadata,
            owner: req.owner,
        };
        let info = self.launch(info, workspace, env, kernel, reservation, egress)?;
        let kept = crate::network::keep_policy(&self.core.config.data_dir, &info.id, &info.network)
            .map_err(|e| EngineError::unavailable(runcell_sandbox::SandboxError::Io(e)));
        if let Err(e) = kept.and_then(|()| self.record(&info)) {
            // A session the store does not know would be lost at the next start, and the
            // caller, told it failed, would never delete it: end it now (a full disk, say).
            if let Some(entry) = self.take(&info.id) {
                self.end(entry);
            }
            return Err(e);
        }
        Ok(info)
    }

    /// Records a new session in the store (when sessions are recorded).
    fn record(&self, info: &SessionInfo) -> Result<(), EngineError> {
        let Some(store) = self.core.session_store() else {
            return Ok(());
        };
        let rec = crate::records::session_record(info, &self.core.config.workspace_path(&info.id));
        store.put_session(&rec).map_err(crate::records::store_error)
    }

    /// Forgets a session's record; whether there was one.
    fn forget(&self, id: &str) -> Result<bool, EngineError> {
        match self.core.session_store() {
            Some(store) => store
                .delete_session(id)
                .map_err(crate::records::store_error),
            None => Ok(false),
        }
    }

    /// A place under the session cap for one create, held until the session is in the map.
    fn creation_slot(&self) -> Result<SandboxSlot, EngineError> {
        let slot = SandboxSlot(self.creating.clone());
        let before = self.creating.fetch_add(1, Ordering::AcqRel);
        let max = self.max_sessions.load(Ordering::Relaxed);
        if max > 0 && self.map().len() + before >= max {
            return Err(EngineError::AtCapacity(Capacity { max_sessions: max }));
        }
        Ok(slot)
    }

    /// A place under the session cap for a sandbox that is not a session (a one-shot run),
    /// held until dropped: it needs as many descriptors as a session.
    pub fn reserve_sandbox(&self) -> Result<SandboxSlot, EngineError> {
        self.creation_slot()
    }

    /// Sessions a previous server process left behind (stopped, or killed with -9): their
    /// kernels died with it, their workspaces did not. Each one whose workspace can be
    /// adopted comes back paused (durable.rs): its first request resumes it from its last
    /// snapshot, and names the executions after that snapshot; the others are marked dead.
    /// Session workspaces the store has no record of are removed. Returns (recovered, dead);
    /// (0, 0) when sessions are not recorded. A server calls this once, before it serves.
    pub fn recover_previous(&self) -> Result<(usize, usize), EngineError> {
        let Some(store) = self.core.session_store() else {
            return Ok((0, 0));
        };
        let (mut recovered, mut dead) = (0, 0);
        for s in crate::records::stale_sessions(store)? {
            let rec = &s.record;
            match s
                .recover
                .and_then(|r| self.recover(r).map_err(|e| e.to_string()))
            {
                Ok(info) => {
                    recovered += 1;
                    let (at, until) = (info.last_active_at, info.expires_at);
                    crate::records::settle(store, &rec.id, "paused", at, until)?;
                }
                Err(why) => {
                    dead += 1;
                    tracing::warn!(session = %rec.id, reason = %why, "session could not be recovered; marked dead");
                    let (at, until) = (rec.last_active_at, rec.expires_at);
                    crate::records::settle(store, &rec.id, "dead", at, until)?;
                }
            }
        }
        // Dead sessions past their expiry are forgotten, and their workspaces swept below.
        crate::records::all_dead(store);
        // Workspaces no row names: warm sessions of the killed server, or sessions it started
        // but never recorded. Nobody can reach them; they only hold disk and memory.
        let known = crate::records::known_sessions(store)?;
        self.sweep_orphan_workspaces(&|id| known.contains(id));
        Ok((recovered, dead))
    }

    /// Brings back a session whose server stopped or died: its workspace (still mounted, or
    /// its image, owned by its host uid) is adopted and the session is paused, to resume
    /// from its last snapshot on its first request.
    fn recover(&self, req: RecoverSession) -> Result<SessionInfo, EngineError> {
        self.start_sweeper();
        let path = self.core.config.workspace_path(&req.id);
        let uid = Workspace::owner_of(&path).ok_or_else(|| {
            EngineError::NotFound(Resource::Workspace {
                session: req.id.clone(),
            })
        })?;
        let lease = UidLease::acquire_uid(&self.core.config.run_dir.join("uids"), uid)
            .map_err(EngineError::unavailable)?;
        // Mounted at its resume; an image that is not there is a session that cannot come back.
        if let Some(images) = &self.core.images {
            let mounted = is_mount_point(&path);
            if !mounted && !images.image_of(&path).exists() {
                return Err(EngineError::NotFound(Resource::Workspace {
                    session: req.id.clone(),
                }));
            }
        }
        let now = Utc::now();
        // Paused at the stop: its expiry stands; a live one's starts now.
        let expires_at = match req.paused_until {
            Some(until) => until,
            None => now + chrono::Duration::seconds(req.limits.expire_after_s as i64),
        };
        let info = SessionInfo {
            id: req.id,
            language: req.language,
            status: SessionStatus::Paused,
            created_at: req.created_at,
            last_active_at: req.last_active_at,
            expires_at,
            limits: req.limits,
            start: req.start,
            network: Default::default(),
            metadata: req.metadata,
            owner: req.owner,
        };
        // The policy was kept beside the egress CA (its secrets are not in the store); it is
        // checked again against what the server allows now: never more than that.
        let mut info = info;
        let mut egress = None;
        if let Some(policy) = crate::network::kept_policy(&self.core.config.data_dir, &info.id) {
            match self.core.network.session(&policy) {
                Ok(e) => {
                    egress = e;
                    info.network = policy;
                }
                Err(e) => {
                    tracing::warn!(session = %info.id, error = %crate::chain(&e), "the session's network policy is beyond what the server now allows; it comes back without a network");
                    crate::network::forget_policy(&self.core.config.data_dir, &info.id);
                }
            }
        }
        self.add_recovered_paused(info.clone(), lease, req.paused_until.is_some(), egress);
        Ok(info)
    }

    /// Starts the kernel (unless a warm one is given) and the worker of a session and
    /// registers it.
    fn launch(
        &self,
        mut info: SessionInfo,
        workspace: Arc<Workspace>,
        env: Vec<(String, String)>,
        kernel: Option<Kernel>,
        reservation: Reservation,
        egress: Option<runcell_egress::SessionEgress>,
    ) -> Result<SessionInfo, EngineError> {
        // What was asked for; `info.start` becomes what happened.
        let requested = info.start;
        let kernel = match kernel {
            Some(k) => k,
            None => {
                let (k, how) = self.core.start_kernel(
                    &workspace,
                    info.language,
                    &info.limits,
                    &env,
                    requested,
                    egress.as_ref(),
                )?;
                info.start = how;
                k
            }
        };
        let id = info.id.clone();
        let (tx, rx) = mpsc::sync_channel(QUEUE_DEPTH);
        let entry = Arc::new(Entry {
            shared: SharedState::new(Shared {
                info: info.clone(),
                running: None,
                handle: Some(kernel.handle()),
                deleted: false,
                restored: None,
            }),
            jobs: Mutex::new(Some(tx)),
            worker: Mutex::new(None),
            workspace: workspace.clone(),
            egress: egress.clone(),
            reservation: Mutex::new(Some(reservation)),
            runner: Arc::new(tokio::sync::Mutex::new(Runner {
                core: self.core.clone(),
                workspace,
                kernel: Some(kernel),
                env,
                start: requested,
                egress,
            })),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        });
        let worker = Worker {
            core: self.core.clone(),
            entry: entry.clone(),
        };
        let handle = thread::Builder::new()
            .name(format!("session-{id}"))
            .spawn(move || worker.run(rx))
            .map_err(|source| EngineError::NoThread {
                thread: "a session thread",
                source,
            })?;
        *entry.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        self.map().insert(id, entry);
        Ok(info)
    }

    /// A live session; a paused one is resumed first (any request resumes it).
    ///
    /// Only while this node holds its lease on its sessions (nodes sharing a database): a
    /// node that cannot prove it still owns them does not act on them ([`Self::leased`]).
    fn entry(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        self.leased()?;
        if let Some(e) = self.map().get(id) {
            return Ok(e.clone());
        }
        if let Some(resumed) = self.resume_paused(id) {
            resumed?;
        }
        self.map()
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::no_session(id))
    }

    /// `Ok` unless this node shares a database with others and cannot prove, now, that it
    /// still owns its sessions (its lease lapsed or its epoch was declared dead): then a
    /// [`runcell_store::StoreError::Fenced`] saying why, and nothing is done.
    pub fn leased(&self) -> Result<(), EngineError> {
        match self.core.session_store() {
            Some(store) => store.lease().check().map_err(EngineError::Store),
            None => Ok(()),
        }
    }

    /// A live or paused session (in memory: no I/O).
    pub fn get(&self, id: &str) -> Result<SessionInfo, EngineError> {
        if let Some(e) = self.map().get(id) {
            return Ok(e.lock().info.clone());
        }
        self.paused
            .get(id)
            .ok_or_else(|| EngineError::no_session(id))
    }

    /// Every live and paused session, oldest first.
    pub fn list(&self) -> Vec<SessionInfo> {
        let mut v: Vec<SessionInfo> = self.map().values().map(|e| e.lock().info.clone()).collect();
        v.extend(self.paused.list());
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// The owner's session `id`: a live one, or one only the store remembers, dead with an
    /// earlier server process (one past its expiry is forgotten on the way). Another owner's
    /// session is none. May read the store.
    pub fn find(&self, owner: &str, id: &str) -> Option<SessionInfo> {
        match self.get(id) {
            Ok(live) => Some(live).filter(|i| i.owner == owner),
            // The store looks it up among the owner's own.
            Err(_) => self
                .core
                .session_store()
                .and_then(|store| crate::records::dead_one(store, owner, id)),
        }
    }

    /// The owner's sessions: the live ones, oldest first, then those only the store
    /// remembers, dead with an earlier server process (listed, never missing, until they
    /// expire). May read the store.
    pub fn list_owned(&self, owner: &str) -> Vec<SessionInfo> {
        let mut sessions: Vec<SessionInfo> = self
            .list()
            .into_iter()
            .filter(|s| s.owner == owner)
            .collect();
        if let Some(store) = self.core.session_store() {
            sessions.extend(crate::records::dead_of(store, owner));
        }
        sessions
    }

    /// How many sessions of every owner only the store remembers, dead with an earlier server
    /// process and not yet expired (those past their expiry are forgotten on the way).
    pub fn dead_count(&self) -> usize {
        self.core
            .session_store()
            .map_or(0, |store| crate::records::all_dead(store).len())
    }

    /// Runs `code` after the executions already queued; blocks until it is done.
    pub fn execute(
        &self,
        id: &str,
        code: &str,
        timeout: Option<Duration>,
        events: Option<EventSink>,
    ) -> Result<Execution, EngineError> {
        self.execute_cancellable(id, code, timeout, events, CancelToken::new())
    }

    /// [`SessionManager::execute`] that [`SessionManager::cancel`] can call off with `cancel`.
    pub fn execute_cancellable(
        &self,
        id: &str,
        code: &str,
        timeout: Option<Duration>,
        events: Option<EventSink>,
        cancel: CancelToken,
    ) -> Result<Execution, EngineError> {
        self.execute_with_tools(id, code, timeout, events, cancel, None)
    }

    /// [`SessionManager::execute_cancellable`] whose code may call `tools` (bridge.rs).
    pub fn execute_with_tools(
        &self,
        id: &str,
        code: &str,
        timeout: Option<Duration>,
        events: Option<EventSink>,
        cancel: CancelToken,
        tools: Option<crate::bridge::ExecTools>,
    ) -> Result<Execution, EngineError> {
        // Queued for the session's worker thread (async callers use
        // [`SessionManager::execute_async`], which needs no thread); `reply` gets the outcome.
        let (reply, wait) = mpsc::channel();
        let reply: Reply = Box::new(move |r| {
            let _ = reply.send(r);
        });
        crate::bounds::check_code(code)?;
        let entry = self.entry(id)?;
        let timeout = resolve_timeout(&entry, id, timeout, &self.core.config.limits)?;
        match entry.send(Job::Execute {
            code: code.to_owned(),
            timeout,
            events,
            cancel,
            reply,
            tools: tools.map(Box::new),
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(EngineError::SessionBusy(Busy::Queue {
                    id: id.to_owned(),
                    waiting: QUEUE_DEPTH,
                }))
            }
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::ended(id, false)),
        }
        wait.recv().map_err(|_| EngineError::ended(id, true))?
    }

    /// Runs `code` on the calling task once the executions queued before it are done, without
    /// a thread hop: the task speaks to the kernel itself. Checks the request now (an ended
    /// session, a bad timeout, a full queue are errors at once); the returned future runs it.
    /// Run that future to completion (spawn it): dropping it while its cell runs would leave
    /// the cell's reply for the next one. [`SessionManager::cancel`] with `cancel` calls it off.
    pub fn execute_async(
        &self,
        id: &str,
        code: String,
        timeout: Option<Duration>,
        cancel: CancelToken,
    ) -> Result<
        impl std::future::Future<Output = Result<Execution, EngineError>> + Send + 'static,
        EngineError,
    > {
        self.execute_async_with_tools(id, code, timeout, cancel, None)
    }

    /// [`SessionManager::execute_async`] whose code may call `tools` (bridge.rs).
    pub fn execute_async_with_tools(
        &self,
        id: &str,
        code: String,
        timeout: Option<Duration>,
        cancel: CancelToken,
        tools: Option<crate::bridge::ExecTools>,
    ) -> Result<
        impl std::future::Future<Output = Result<Execution, EngineError>> + Send + 'static,
        EngineError,
    > {
        crate::bounds::check_code(&code)?;
        let entry = self.entry(id)?;
        let timeout = resolve_timeout(&entry, id, timeout, &self.core.config.limits)?;
        if entry.waiting.fetch_add(1, Ordering::AcqRel) >= QUEUE_DEPTH {
            entry.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::SessionBusy(Busy::Queue {
                id: id.to_owned(),
                waiting: QUEUE_DEPTH,
            }));
        }
        let waiting = Waiting(entry.clone());
        let core = self.core.clone();
        let id = id.to_owned();
        Ok(async move {
            let mut runner = entry.runner.clone().lock_owned().await;
            drop(waiting);
            if cancel.is_cancelled() {
                return Err(EngineError::Cancelled);
            }
            if entry.lock().deleted {
                return Err(EngineError::ended(&id, true));
            }
            let running = CellRunning::start(&entry, &core, &cancel);
            let result = runner
                .execute_async(&entry.shared, &code, timeout, tools)
                .await;
            drop(running);
            // The next cell may start while this one is recorded.
            drop(runner);
            drop(entry);
            let (execution, owner) = result?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            core.audit_then(
                owner,
                execution,
                code,
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            rx.await
                .map_err(|_| EngineError::from(RecordError::WriterStopped))?
        })
    }

    /// Calls off one request: a queued one is skipped, a running one is interrupted; someone
    /// else's running execution is left alone.
    pub fn cancel(&self, id: &str, token: &CancelToken) {
        token.set();
        // Not `entry`: a client gone away still stops its cell while the lease lapsed.
        let Some(entry) = self.map().get(id).cloned() else {
            return;
        };
        let s = entry.lock();
        if s.running.as_ref().is_some_and(|r| r.same(token)) {
            if let Some(h) = &s.handle {
                h.interrupt();
            }
        }
    }

    /// Interrupts the running execution (KeyboardInterrupt; the session keeps its state).
    pub fn interrupt(&self, id: &str) -> Result<bool, EngineError> {
        let entry = self.entry(id)?;
        let s = entry.lock();
        Ok(
            s.info.status == SessionStatus::Busy
                && s.handle.as_ref().is_some_and(|h| h.interrupt()),
        )
    }

    /// Replaces the kernel with a fresh one (variables are lost, files are kept). Waits for
    /// queued executions first.
    pub fn restart(&self, id: &str) -> Result<SessionInfo, EngineError> {
        let entry = self.entry(id)?;
        let (reply, wait) = mpsc::channel();
        entry
            .send(Job::Restart { reply })
            .map_err(|_| EngineError::SessionBusy(Busy::Worker { id: id.to_owned() }))?;
        wait.recv().map_err(|_| EngineError::ended(id, false))??;
        self.get(id)
    }

    /// Ends a session at its owner's request: forgets its record, kills its kernel (a running
    /// execution ends as killed) and removes its workspace. A dead session only the store
    /// remembers is forgotten.
    pub fn delete(&self, id: &str) -> Result<(), EngineError> {
        // The record first: when the store cannot take it (a full disk), nothing has changed
        // and the caller can retry; the other way round the session would be gone yet still
        // recorded, and come back `dead` at the next start.
        let forgotten = self.forget(id)?;
        crate::paused::discard_snapshot(&self.core, id);
        match self.take(id) {
            Some(entry) => {
                self.end(entry);
                Ok(())
            }
            None if self.end_paused(id) || forgotten => Ok(()),
            None => Err(EngineError::no_session(id)),
        }
    }

    /// Ends a session whatever becomes of its record: kills its kernel and removes its
    /// workspace, then forgets its record if the store can (a connection's teardown, which
    /// must not fail; a record left behind comes back `dead` at the next start, and expires).
    pub fn close(&self, id: &str) -> Result<(), EngineError> {
        let ended = match self.take(id) {
            Some(entry) => {
                self.end(entry);
                true
            }
            None => self.end_paused(id),
        };
        crate::paused::discard_snapshot(&self.core, id);
        let forgotten = self.forget(id).unwrap_or_else(|e| {
            tracing::warn!(session = %id, error = %crate::chain(&e), "cannot forget a closed session's record");
            false
        });
        match ended || forgotten {
            true => Ok(()),
            false => Err(EngineError::no_session(id)),
        }
    }

    /// Removes a session from the map and counts it as ending, in one step under the map's
    /// lock, so `shutdown` sees every session either in the map or ending.
    fn take(&self, id: &str) -> Option<Arc<Entry>> {
        let mut map = self.map();
        let entry = map.remove(id)?;
        *self.ending.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        Some(entry)
    }

    fn end(&self, entry: Arc<Entry>) {
        end(entry);
        let mut n = self.ending.0.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        self.ending.1.notify_all();
    }

    /// The session's workspace, for host-side file operations (confined to it).
    pub(crate) fn workspace(&self, id: &str) -> Result<Arc<Workspace>, EngineError> {
        Ok(self.entry(id)?.workspace.clone())
    }

    /// The session's proxy state, with a network policy.
    pub(crate) fn egress(
        &self,
        id: &str,
    ) -> Result<Option<runcell_egress::SessionEgress>, EngineError> {
        Ok(self.entry(id)?.egress.clone())
    }

    fn expire_idle(&self) {
        let now = Utc::now();
        self.pause_idle(now);
        let expired: Vec<String> = self
            .map()
            .iter()
            .filter(|(_, e)| {
                let s = e.lock();
                // A dead session (its kernel could not be restarted) expires like an idle
                // one: nothing will run there again.
                matches!(s.info.status, SessionStatus::Ready | SessionStatus::Dead)
                    && s.info.expires_at <= now
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(entry) = self.take(&id) {
                entry.lock().info.status = SessionStatus::Expired;
                self.end(entry);
                crate::paused::discard_snapshot(&self.core, &id);
                tracing::info!(session = %id, "idle session expired");
                if let Err(e) = self.forget(&id) {
                    // The next start finds its workspace gone: it is reported dead until its
                    // recorded expiry, which is past.
                    tracing::warn!(session = %id, error = %crate::chain(&e), "cannot forget an expired session's record");
                }
            }
        }
    }

    /// Ends every session and waits (up to 30 s) for teardowns other threads started. A
    /// server's (sessions recorded, workspaces on disk) pauses every live session first, all
    /// at once, for at most `PAUSE_ALL_WITHIN`, and keeps their workspaces: the next start
    /// brings them back paused. One that could not be paused keeps its workspace and last
    /// idle snapshot too, as after a kill -9. Otherwise sessions end and their workspaces go.
    pub fn shutdown(&self) {
        self.pool.stop();
        self.core.one_shots.stop();
        self.spares.stop(&self.core);
        // Workspaces in memory would have to stay mounted to be kept: they end as before.
        let durable = self.core.session_store().is_some() && self.core.images.is_some();
        if durable {
            let t = std::time::Instant::now();
            let paused = self.pause_all(PAUSE_ALL_WITHIN);
            tracing::info!(
                paused,
                ms = t.elapsed().as_millis() as u64,
                "paused the sessions at the stop"
            );
            for id in self.paused.ids() {
                self.paused.keep_and_remove(&id);
            }
        }
        let ids: Vec<String> = self.map().keys().cloned().collect();
        for id in ids {
            if let Some(entry) = self.take(&id) {
                if durable {
                    entry.workspace.keep();
                }
                self.end(entry);
            }
        }
        let n = self.ending.0.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .ending
            .1
            .wait_timeout_while(n, Duration::from_secs(30), |n| *n > 0);
        // Workspaces on disk are unmounted and deleted off their sessions' path: no mount
        // outlives a clean stop either.
        if let Some(images) = &self.core.images {
            if !images.wait_removals(Duration::from_secs(30)) {
                tracing::warn!("workspaces still being removed at the stop");
            }
        }
    }
}

impl WarmSource for SessionManager {
    fn warm_pool(&self) -> &WarmPool {
        &self.pool
    }

    fn zygote_ready(&self) -> bool {
        self.core.zygote().is_some()
    }

    fn start_warm(&self) -> Result<Warm, EngineError> {
        let limits = self.core.resolve_session_limits(&Default::default())?;
        // Counted like any session: a warm pool never fills past the budget.
        let reservation = self.reserve(limits.memory_mb, false)?;
        let id = new_id("ses");
        let workspace = self.new_workspace(&id, &limits)?;
        let (kernel, _) = self.core.start_kernel(
            &workspace,
            Language::Python,
            &limits,
            &[],
            Start::Zygote,
            None,
        )?;
        Ok(Warm {
            id,
            workspace,
            kernel,
            limits,
            reservation,
        })
    }

    fn warm_fits(&self) -> bool {
        self.core.ledger.fits(
            self.core.config.limits.defaults.memory_mb,
            self.core.config.limits.committed_memory_mb,
        )
    }
}

/// A request's timeout (the session's own by default), or why the request cannot run.
fn resolve_timeout(
    entry: &Entry,
    id: &str,
    timeout: Option<Duration>,
    policy: &crate::limits::LimitPolicy,
) -> Result<Duration, EngineError> {
    let s = entry.lock();
    if matches!(s.info.status, SessionStatus::Expired | SessionStatus::Dead) {
        return Err(EngineError::ended(id, false));
    }
    match timeout {
        Some(t) => policy.check_timeout(t),
        None => Ok(Duration::from_secs(s.info.limits.exec_timeout_s)),
    }
}

/// A create under way or a one-shot run, counted against the session cap until dropped.
#[derive(Debug)]
pub struct SandboxSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for SandboxSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts an [`SessionManager::execute_async`] caller as waiting until dropped.
struct Waiting(Arc<Entry>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether `path` is on another device than its parent (a mount point); true when unsure.
fn is_mount_point(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let dev = |p: &std::path::Path| std::fs::symlink_metadata(p).map(|m| m.dev()).ok();
    match (dev(path), path.parent().and_then(dev)) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}
