//! Durable sessions (issue 17): pause, resume, fork, and the snapshots a server comes back
//! from after a SIGTERM or a kill -9.
//!
//! A paused session has no sandbox, no kernel and no memory reserved: only its workspace
//! (its filesystem, mounted, reclaimable page cache) and its language state, a snapshot the
//! kernel wrote (`python/runcell_snapshot.py`, the bash kernel's,
//! `javascript/runcell_js_snapshot.js`), kept in the engine's snapshot store (snapshots.rs:
//! the data dir's `snapshots/`, or a store the nodes share) as `<id>.snap` with a
//! description beside it (`<id>.json`, written last). Resuming forks a kernel
//! from the zygote, copies the snapshot into the workspace, has the kernel read it back and
//! removes it. The host only moves the snapshot's bytes: pickles are code, and are read only
//! inside the sandbox.
//!
//! The same snapshot serves a server killed with -9: a session that went idle a few seconds
//! ago and ran something since its last snapshot gets a new one (off the hot path, on the
//! expiry thread), and a server that starts again brings every session back from its last
//! snapshot, naming the executions whose effect on variables was lost.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use runcell_kernel::{Kernel, SnapshotError, SnapshotOptions};
use runcell_sandbox::Workspace;
use serde::{Deserialize, Serialize};

use crate::core::io_error;
use crate::error::{NoSpace, Unresumable};
use crate::limits::Admit;
use crate::model::Language;
use crate::paused::{discard_snapshot, Paused, PausedWorkspace};
use crate::restored::{Restored, Skipped};
use crate::session::{SessionInfo, SessionManager, SessionStatus};
use crate::snapshots::{description_key, env_key, snap_key, SnapshotStore};
use crate::EngineError;

/// The layout of `<id>.json` and of how the host keeps snapshots; a snapshot described in
/// another layout is not read (the session resumes with files only and says so).
const LAYOUT: u32 = 1;
/// Where session `id`'s kernel writes and reads a snapshot, relative to the workspace, for
/// the moment it takes: the workspace is the one place both the kernel and the host reach.
/// Named after the session: kernels beside it on the same workspace (E2B's code contexts) are
/// paused at the same time at a stop, and each must find its own.
fn in_workspace(id: &str) -> String {
    format!(".runcell-state-{id}.snap")
}

/// [`in_workspace`] as the kernel inside the sandbox sees it.
fn in_sandbox(id: &str) -> String {
    format!("/workspace/{}", in_workspace(id))
}
/// A session idle this long since a cell that changed nothing snapshotted yet gets an idle
/// snapshot (what a server killed with -9 comes back from).
pub(crate) const IDLE_SNAPSHOT_AFTER: Duration = Duration::from_secs(3);
/// Executions named as lost at most (the most recent ones).
const MAX_LOST: usize = 1000;
/// What `<id>.json` says of the snapshot beside it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Description {
    layout: u32,
    language: String,
    taken_at: DateTime<Utc>,
    /// The session's last execution the snapshot includes (ids sort by time).
    pub(crate) last_execution: Option<String>,
    /// Names the pause could not save.
    skipped: Vec<Skipped>,
    /// The snapshot's size, as the kernel reported it.
    #[serde(default)]
    bytes: u64,
    /// The signature of the workspace files kept beside it (a shared store only:
    /// kept_files.rs), so unchanged files are not stored again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) files: Option<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A store's I/O error as the engine's (a full store: 507, the session keeps running).
fn store_error(action: &'static str, key: &str) -> impl FnOnce(std::io::Error) -> EngineError {
    io_error(action, Path::new(key))
}

/// Keeps a session's `env` beside its snapshot (`<id>.env`, JSON pairs; values may be the
/// user's secrets, which the store keeps readable by the server alone) for a server that
/// starts again, or another node that takes the session over. Written at each pause and idle
/// snapshot, only when it changed (it never does after the create).
fn keep_env(store: &dyn SnapshotStore, id: &str, env: &[(String, String)]) {
    let json = serde_json::to_vec(env).unwrap_or_default();
    let key = env_key(id);
    if store
        .get_bytes(&key)
        .ok()
        .flatten()
        .is_some_and(|old| old == json)
    {
        return;
    }
    if let Err(e) = store.put_bytes(&key, &json) {
        tracing::warn!(session = %id, error = %e, "cannot keep the session's env for a restart");
    }
}

/// A kept `env` ([`keep_env`]); none when it was never kept or cannot be read.
pub(crate) fn kept_env(store: &dyn SnapshotStore, id: &str) -> Vec<(String, String)> {
    store
        .get_bytes(&env_key(id))
        .ok()
        .flatten()
        .and_then(|d| serde_json::from_slice(&d).ok())
        .unwrap_or_default()
}

/// The description of session `id`'s snapshot, if the store has one it can read.
pub(crate) fn description(store: &dyn SnapshotStore, id: &str) -> Option<Description> {
    store
        .get_bytes(&description_key(id))
        .ok()
        .flatten()
        .and_then(|d| serde_json::from_slice(&d).ok())
}

/// How long a pause's or a resume's snapshot may take (it runs the session's own
/// `__reduce__`s): longer than any sane namespace needs, shorter than a client's patience.
fn snapshot_options() -> SnapshotOptions {
    SnapshotOptions {
        timeout: Duration::from_secs(30),
        grace: Duration::from_secs(2),
    }
}

/// Why a kernel's snapshot could not be taken, for the caller: a full workspace is the
/// storage's fault (507) and the session keeps running either way.
fn snapshot_failed(id: &str, e: SnapshotError) -> EngineError {
    match &e {
        // ENOSPC as the kernels report it: Python's OSError, Node's system error.
        SnapshotError::Failed { value, .. }
            if value.contains("[Errno 28]") || value.contains("ENOSPC") =>
        {
            EngineError::InsufficientStorage(NoSpace::Snapshot {
                id: id.to_owned(),
                place: "workspace",
            })
        }
        _ => EngineError::Unresumable(Unresumable::SnapshotFailed {
            id: id.to_owned(),
            reason: crate::chain(&e),
        }),
    }
}

impl SessionManager {
    /// Takes the snapshot of an idle session's kernel into the data dir. `Ok(Err(why))`: the
    /// kernel is not running.
    fn take_snapshot(
        &self,
        idle: &mut crate::session::pause::Idle,
    ) -> Result<Result<Description, String>, EngineError> {
        let info = idle.info();
        let store = self.core().snapshots.clone();
        let last_execution = self.last_execution(&info);
        // In a store other nodes read, a node that lost the session (taken over while this
        // node could not beat: a partition, a long stall) must not write over the new owner's
        // snapshot: the owner's conditional update, refused to an earlier owner, says whether
        // it is still this node's.
        if store.shared() && !self.still_owned(&info)? {
            return Err(EngineError::Unresumable(Unresumable::SnapshotFailed {
                id: info.id.clone(),
                reason: "another node has taken the session over; this node no longer owns it"
                    .into(),
            }));
        }
        let Some(kernel) = idle.kernel() else {
            return Ok(Err("the session's kernel was not running".into()));
        };
        let t = std::time::Instant::now();
        let report = kernel
            .snapshot(&in_sandbox(&info.id), &snapshot_options())
            .map_err(|e| snapshot_failed(&info.id, e))?;
        let kernel_took = t.elapsed();
        let ws = idle.workspace().clone();
        let moved = ws
            .open_file(&in_workspace(&info.id))
            .map_err(EngineError::unavailable)
            .and_then(|(mut file, _)| {
                store
                    .put(&snap_key(&info.id), &mut file)
                    .map_err(store_error("write a snapshot", &snap_key(&info.id)))
            });
        let _ = ws.delete(&in_workspace(&info.id));
        moved.map_err(|e| match e {
            EngineError::InsufficientStorage(_) => {
                EngineError::InsufficientStorage(NoSpace::Snapshot {
                    id: info.id.clone(),
                    place: "data dir",
                })
            }
            e => e,
        })?;
        // Another node resuming it needs its files too: kept beside the snapshot, before the
        // description that says the snapshot is there.
        let files = if store.shared() {
            let kept = description(&*store, &info.id).and_then(|d| d.files);
            let data_dir = &self.core().config.data_dir;
            Some(crate::kept_files::keep_files(
                &*store,
                &info.id,
                &ws,
                data_dir,
                kept.as_deref(),
            )?)
        } else {
            None
        };

        let desc = Description {
            layout: LAYOUT,
            language: info.language.as_str().to_owned(),
            taken_at: Utc::now(),
            last_execution,
            skipped: report.skipped.into_iter().map(Skipped::from).collect(),
            bytes: report.bytes,
            files,
        };
        let json = serde_json::to_vec(&desc).unwrap_or_default();
        store
            .put_bytes(&description_key(&info.id), &json)
            .map_err(store_error("write a snapshot", &description_key(&info.id)))?;
        tracing::debug!(session = %info.id, bytes = report.bytes, kernel_ms = ms(kernel_took), kernel_own_ms = ms(report.duration), copy_ms = ms(t.elapsed() - kernel_took), "snapshot taken");
        Ok(Ok(desc))
    }

    /// Whether the store still names this node the owner of the (idle, live) session: its
    /// status written again as it is, which only the owner may do. No store: it is.
    fn still_owned(&self, info: &SessionInfo) -> Result<bool, EngineError> {
        let Some(store) = self.core().session_store() else {
            return Ok(true);
        };
        store
            .update_session_status(&info.id, "ready", info.last_active_at, info.expires_at)
            .map_err(crate::records::store_error)
    }

    /// The session's most recent recorded execution.
    fn last_execution(&self, info: &SessionInfo) -> Option<String> {
        let records = self.core().records.as_ref()?;
        let tenant = if info.owner.is_empty() {
            crate::OPEN_TENANT
        } else {
            &info.owner
        };
        let (rows, _) = records
            .store()
            .list_executions(tenant, Some(&info.id), 1, None)
            .ok()?;
        rows.into_iter().next().map(|r| r.execution_id)
    }

    /// Pauses a session: snapshots its language state to the data dir, ends its kernel and
    /// gives its memory back. A session running or queueing a cell is refused (409
    /// `session_busy`): a pause never waits behind a cell that may run for an hour. When the
    /// snapshot cannot be written (a full disk) the session keeps running and the error says
    /// why. Pausing a paused session changes nothing.
    pub fn pause(&self, id: &str) -> Result<SessionInfo, EngineError> {
        if let Some(info) = self.paused().get(id) {
            return Ok(info);
        }
        let t = std::time::Instant::now();
        let mut idle = match self.idle(id) {
            Ok(idle) => idle,
            // Paused meanwhile by another request, whose pause this one waited for.
            Err(e) => return self.paused().get(id).ok_or(e),
        };
        keep_env(&*self.core().snapshots, id, idle.env());
        let snapshot = self.take_snapshot(&mut idle)?;
        let snapshotted = t.elapsed();
        let mut info = idle.info();
        let now = Utc::now();
        info.status = SessionStatus::Paused;
        info.expires_at = now + chrono::Duration::seconds(info.limits.expire_after_s as i64);
        self.record_status(&info, "paused")?;
        let recorded = t.elapsed();
        let paused = Paused {
            info: Mutex::new(info.clone()),
            workspace: Mutex::new(PausedWorkspace::Mounted(idle.workspace().clone())),
            since: std::time::Instant::now(),
            env: Mutex::new(idle.env().to_vec()),
            egress: idle.egress(),
            no_snapshot: snapshot.err(),
            lost: Vec::new(),
            resumed: Mutex::new(false),
        };
        self.retire(idle, move |paused_map| {
            paused_map.insert(info.id.clone(), paused);
        });
        tracing::info!(session = %id, snapshot_ms = ms(snapshotted), record_ms = ms(recorded - snapshotted), end_ms = ms(t.elapsed() - recorded), "session paused");
        self.get(id)
    }

    /// Records a session's status and times in the store (when sessions are recorded).
    fn record_status(&self, info: &SessionInfo, status: &str) -> Result<(), EngineError> {
        let Some(store) = self.core().session_store() else {
            return Ok(());
        };
        store
            .update_session_status(&info.id, status, info.last_active_at, info.expires_at)
            .map(|_| ())
            .map_err(crate::records::store_error)
    }

    /// Resumes a paused session (`POST .../resume`): a kernel forked from the zygote reads
    /// its snapshot back. A live session is resumed already: nothing is restored.
    pub fn resume(&self, id: &str) -> Result<(SessionInfo, Option<Restored>), EngineError> {
        match self.resume_paused(id) {
            Some(r) => {
                let restored = r?;
                // The explicit resume's reply carries it; the next Execution need not.
                self.take_restored(id);
                Ok((self.get(id)?, restored))
            }
            None => Ok((self.get(id)?, None)),
        }
    }

    /// Brings a paused session back, if `id` is one: `None` if it is not paused (live, or
    /// unknown); `Some(Ok(None))` if another request resumed it meanwhile.
    pub(crate) fn resume_paused(&self, id: &str) -> Option<Result<Option<Restored>, EngineError>> {
        let paused = self.paused().entry(id)?;
        let mut resumed = paused.resumed.lock().unwrap_or_else(|p| p.into_inner());
        if *resumed {
            return Some(Ok(None));
        }
        let r = self.resume_locked(id, &paused);
        if r.is_ok() {
            *resumed = true;
        }
        Some(r.map(Some))
    }

    fn resume_locked(&self, id: &str, paused: &Paused) -> Result<Restored, EngineError> {
        let core = self.core().clone();
        let mut info = paused.info();
        if info.language == Language::Python {
            if let Some(rt) = &core.config.python_runtime {
                if !rt.exists() {
                    return Err(EngineError::Unresumable(Unresumable::RuntimeMissing {
                        id: id.to_owned(),
                        runtime: rt.display().to_string(),
                    }));
                }
            }
        }
        // Counted like a create: the server's session cap, the tenant's quota, the budget.
        let _slot = self.reserve_sandbox()?;
        let policy = core.tenant_policy(&info.owner)?;
        core.ledger
            .check_quota(&info.owner, &policy, info.limits.memory_mb)?;
        let mut reservation = self.reserve_memory(info.limits.memory_mb)?;
        core.ledger
            .assign(&mut reservation, &info.owner, &policy, Admit::Checked)?;
        let t = std::time::Instant::now();
        let ws = self.paused_workspace(id, paused)?;
        let mounted = t.elapsed();
        let env = paused.env();
        let (mut kernel, how) = core.start_kernel(
            &ws,
            info.language,
            &info.limits,
            &env,
            info.start,
            paused.egress.as_ref(),
        )?;
        let started = t.elapsed();
        let mut restored = match &paused.no_snapshot {
            Some(why) => Restored {
                files_only: Some(why.clone()),
                ..Default::default()
            },
            None => self.restore_into(&mut kernel, &ws, &info),
        };
        if !kernel.is_alive() {
            // The restore killed it (out of memory, say): a fresh one, files only.
            kernel = core
                .start_kernel(
                    &ws,
                    info.language,
                    &info.limits,
                    &env,
                    info.start,
                    paused.egress.as_ref(),
                )?
                .0;
        }
        restored.lost_executions = paused.lost.clone();
        let now = Utc::now();
        info.status = SessionStatus::Ready;
        info.last_active_at = now;
        info.expires_at = now + chrono::Duration::seconds(info.limits.idle_timeout_s as i64);
        let mut launched =
            self.launch_resumed(info, ws, env, kernel, reservation, paused.egress.clone())?;
        self.set_restored(id, restored.clone());
        launched.start = how;
        self.paused().remove(id);
        if let Err(e) = self.record_status(&launched, "ready") {
            tracing::warn!(session = %id, error = %crate::chain(&e), "cannot record a resumed session's status");
        }
        tracing::info!(session = %id, names = restored.names.len(), files_only = restored.files_only.is_some(), mount_ms = ms(mounted), start_ms = ms(started - mounted), total_ms = ms(t.elapsed()), "session resumed");
        Ok(restored)
    }

    /// A paused session's workspace, mounted again if it was unmounted.
    fn paused_workspace(&self, id: &str, paused: &Paused) -> Result<Arc<Workspace>, EngineError> {
        let mut slot = paused.workspace();
        let lease = match std::mem::replace(&mut *slot, PausedWorkspace::Lost) {
            PausedWorkspace::Mounted(ws) => {
                *slot = PausedWorkspace::Mounted(ws.clone());
                return Ok(ws);
            }
            PausedWorkspace::Unmounted(lease) => lease,
            PausedWorkspace::Lost => self.workspace_lease(id)?,
        };
        let path = self.core().config.workspace_path(id);
        let ws = Arc::new(
            self.core()
                .adopt_workspace(&path, lease)
                .map_err(EngineError::unavailable)?,
        );
        *slot = PausedWorkspace::Mounted(ws.clone());
        Ok(ws)
    }

    /// The uid lease of session `id`'s workspace, whose directory (or mounted root) it owns.
    pub(crate) fn workspace_lease(
        &self,
        id: &str,
    ) -> Result<runcell_sandbox::UidLease, EngineError> {
        let path = self.core().config.workspace_path(id);
        let uid = Workspace::owner_of(&path).ok_or_else(|| {
            EngineError::NotFound(crate::error::Resource::Workspace {
                session: id.to_owned(),
            })
        })?;
        runcell_sandbox::UidLease::acquire_uid(&self.core().config.run_dir.join("uids"), uid)
            .map_err(EngineError::unavailable)
    }

    /// Copies the session's snapshot into its workspace and has `kernel` read it; what came
    /// back. Never fails: a snapshot that cannot be read leaves the files only, and says why.
    fn restore_into(&self, kernel: &mut Kernel, ws: &Workspace, info: &SessionInfo) -> Restored {
        let t0 = std::time::Instant::now();
        let store = &*self.core().snapshots;
        let files_only = |why: String| Restored {
            files_only: Some(why),
            ..Default::default()
        };
        let desc: Description = match description(store, &info.id) {
            Some(d) => d,
            None => return files_only("no snapshot of its variables was taken".into()),
        };
        if desc.layout != LAYOUT || desc.language != info.language.as_str() {
            return files_only(format!(
                "its snapshot was taken by an incompatible runcell (layout {}, language {})",
                desc.layout, desc.language
            ));
        }
        let opened = store
            .open(&snap_key(&info.id))
            .and_then(|f| f.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)))
            .and_then(|f| f.metadata().map(|m| (f, m.len())));
        let (mut file, len) = match opened {
            Ok(f) => f,
            Err(e) => return files_only(format!("its snapshot cannot be read: {e}")),
        };
        if let Err(e) = ws.write_file_from(&in_workspace(&info.id), &mut file, len) {
            return files_only(format!(
                "its snapshot does not fit in the workspace: {}",
                crate::chain(&e)
            ));
        }
        let copied = t0.elapsed();
        let t = std::time::Instant::now();
        let r = kernel.restore(&in_sandbox(&info.id), &snapshot_options());
        tracing::debug!(session = %info.id, copy_ms = ms(copied), restore_ms = ms(t.elapsed()), kernel_own_ms = r.as_ref().map(|r| ms(r.duration)).unwrap_or_default(), "snapshot read back");
        if kernel.is_alive() {
            let _ = ws.delete(&in_workspace(&info.id));
        }
        match r {
            Ok(report) => {
                let mut skipped = desc.skipped;
                skipped.extend(report.skipped.into_iter().map(Skipped::from));
                Restored {
                    names: report.names,
                    skipped,
                    ..Default::default()
                }
            }
            Err(SnapshotError::Refused(why)) => files_only(why.to_string()),
            Err(e) => files_only(format!(
                "its snapshot could not be restored: {}",
                crate::chain(&e)
            )),
        }
    }

    /// Takes an idle snapshot of every session idle for a few seconds whose last cell came
    /// after its last snapshot (what a server killed with -9 comes back from). On the expiry
    /// thread: never in a request's way, and a session that got busy meanwhile is skipped.
    pub(crate) fn idle_snapshots(&self, taken: &mut HashMap<String, DateTime<Utc>>) {
        let now = Utc::now();
        let idle_for = chrono::Duration::from_std(IDLE_SNAPSHOT_AFTER).unwrap_or_default();
        let live = self.list();
        taken.retain(|id, _| live.iter().any(|s| &s.id == id));
        for s in live {
            let changed = taken.get(&s.id).is_none_or(|at| *at < s.last_active_at);
            if s.status != SessionStatus::Ready || !changed || s.last_active_at + idle_for > now {
                continue;
            }
            let Ok(mut idle) = self.idle(&s.id) else {
                continue;
            };
            keep_env(&*self.core().snapshots, &s.id, idle.env());
            match self.take_snapshot(&mut idle) {
                Ok(_) => {
                    taken.insert(s.id.clone(), s.last_active_at);
                }
                Err(e) => {
                    // Tried again after the next cell.
                    taken.insert(s.id.clone(), s.last_active_at);
                    tracing::warn!(session = %s.id, error = %crate::chain(&e), "idle snapshot failed");
                }
            }
        }
    }

    /// Pauses every live session at once (a server stopping: SIGTERM), each on a thread of
    /// its own, waiting at most `within`; returns how many were paused.
    pub(crate) fn pause_all(&self, within: Duration) -> usize {
        let ids: Vec<String> = self.list().into_iter().map(|s| s.id).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let Some(me) = self.me() else { return 0 };
        let n = ids.len();
        for id in ids {
            let (tx2, me) = (tx.clone(), me.clone());
            let spawned = std::thread::Builder::new()
                .name("pause".into())
                .spawn(move || {
                    let r = me.pause(&id);
                    if let Err(e) = &r {
                        tracing::warn!(session = %id, error = %crate::chain(e), "could not pause at the stop");
                    }
                    let _ = tx2.send(r.is_ok());
                });
            if spawned.is_err() {
                let _ = tx.send(false);
            }
        }
        drop(tx);
        let deadline = std::time::Instant::now() + within;
        let mut paused = 0;
        for _ in 0..n {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(true) => paused += 1,
                Ok(false) => {}
                Err(_) => break,
            }
        }
        paused
    }

    /// A session of an earlier server process brought back paused (its workspace's uid held,
    /// mounted at its resume): `lost` names the executions after its last snapshot.
    pub(crate) fn add_recovered_paused(
        &self,
        mut info: SessionInfo,
        lease: runcell_sandbox::UidLease,
        was_paused: bool,
        egress: Option<runcell_egress::SessionEgress>,
    ) {
        let store = &*self.core().snapshots;
        let desc = description(store, &info.id);
        let lost = if was_paused {
            Vec::new()
        } else {
            self.executions_after(&info, desc.as_ref().and_then(|d| d.last_execution.clone()))
        };
        info.status = SessionStatus::Paused;
        let env = kept_env(store, &info.id);
        self.paused().insert(
            info.id.clone(),
            Paused {
                info: Mutex::new(info),
                workspace: Mutex::new(PausedWorkspace::Unmounted(lease)),
                since: std::time::Instant::now(),
                env: Mutex::new(env),
                egress,
                no_snapshot: None,
                lost,
                resumed: Mutex::new(false),
            },
        );
    }

    /// The session's recorded executions after `last` (all of them without one), oldest first.
    pub(crate) fn executions_after(&self, info: &SessionInfo, last: Option<String>) -> Vec<String> {
        let Some(records) = self.core().records.as_ref() else {
            return Vec::new();
        };
        let tenant = if info.owner.is_empty() {
            crate::OPEN_TENANT
        } else {
            &info.owner
        };
        let Ok((rows, _)) = records
            .store()
            .list_executions(tenant, Some(&info.id), MAX_LOST, None)
        else {
            return Vec::new();
        };
        let mut ids: Vec<String> = rows
            .into_iter()
            .map(|r| r.execution_id)
            .filter(|e| last.as_ref().is_none_or(|l| e > l))
            .collect();
        ids.reverse();
        ids
    }

    /// Ends a paused session for good (deleted, expired): its workspace and snapshot go.
    pub(crate) fn end_paused(&self, id: &str) -> bool {
        let Some(p) = self.paused().take(id) else {
            return false;
        };
        let lease = match std::mem::replace(&mut *p.workspace(), PausedWorkspace::Lost) {
            // Removed with its image by its last holder.
            PausedWorkspace::Mounted(_) => None,
            PausedWorkspace::Unmounted(lease) => Some(lease),
            PausedWorkspace::Lost => self.workspace_lease(id).ok(),
        };
        if let Some(lease) = lease {
            // Adopted (mounted again if need be) to be removed the one way, image and all.
            let path = self.core().config.workspace_path(id);
            match self.core().adopt_workspace(&path, lease) {
                Ok(ws) => drop(ws),
                Err(_) => {
                    let _ = std::fs::remove_dir(&path);
                    if let Some(images) = &self.core().images {
                        images.discard(&path);
                    }
                }
            }
        }
        discard_snapshot(self.core(), id);
        true
    }

    /// Forks a session (`POST .../fork`): a new session of the same owner, language, limits,
    /// environment and metadata, with a copy of the workspace's files and of the variables
    /// (a snapshot restored into the new kernel). Independent of the source afterwards. A
    /// paused source is resumed first; a busy one is refused (409 `session_busy`).
    pub fn fork(&self, id: &str) -> Result<(SessionInfo, Restored), EngineError> {
        if let Some(r) = self.resume_paused(id) {
            r?;
        }
        let mut idle = self.idle(id)?;
        let info = idle.info();
        let snapshot = self.take_snapshot(&mut idle)?;
        let env = idle.env().to_vec();
        let source_ws = idle.workspace().clone();
        drop(idle);
        let new = self.create(crate::session::CreateSession {
            owner: info.owner.clone(),
            language: Some(info.language),
            limits: crate::limits::LimitsRequest::from(&info.limits),
            env: env.into_iter().collect(),
            metadata: info.metadata.clone(),
            start: Some(info.start),
            // Its policy's secrets are not readable back: a fork starts without a network,
            // never with more than its source had.
            network: Default::default(),
        })?;
        let copied = self.copy_files(&source_ws, &new.id);
        let restored = match (copied, snapshot) {
            (Err(e), _) => {
                let _ = self.delete(&new.id);
                return Err(e);
            }
            (Ok(()), Err(why)) => Restored {
                files_only: Some(why),
                ..Default::default()
            },
            (Ok(()), Ok(_)) => {
                let store = &*self.core().snapshots;
                for (from, to) in [
                    (snap_key(id), snap_key(&new.id)),
                    (description_key(id), description_key(&new.id)),
                ] {
                    if let Ok(Some(mut f)) = store.open(&from) {
                        let _ = store.put(&to, &mut f);
                    }
                }
                let mut idle = self.idle(&new.id)?;
                let info = idle.info();
                let ws = idle.workspace().clone();
                match idle.kernel() {
                    Some(k) => self.restore_into(k, &ws, &info),
                    None => Restored {
                        files_only: Some("the new session's kernel was not running".into()),
                        ..Default::default()
                    },
                }
            }
        };
        Ok((self.get(&new.id)?, restored))
    }

    /// Copies every regular file of `from` (directories as needed) into session `to`'s
    /// workspace, read and written by the host beneath each root (never through a link).
    fn copy_files(&self, from: &Workspace, to: &str) -> Result<(), EngineError> {
        let dest = self.workspace(to)?;
        let snap = from.snapshot().map_err(EngineError::unavailable)?;
        for path in snap.files.keys() {
            let data = match from.read_file(path, from.size_bytes()) {
                Ok(d) => d,
                // Removed or replaced since the walk: not there to copy.
                Err(_) => continue,
            };
            dest.write_file(path, &data)
                .map_err(crate::files::map_err(crate::files::Op::Write))?;
        }
        dest.sync().map_err(EngineError::unavailable)?;
        Ok(())
    }
}
