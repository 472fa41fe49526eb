//! One-shot sandboxes made ahead of their runs, a light zygote for programs that import
//! nothing heavy, and teardown after the reply (issue 23, docs/benchmarks.md).
//!
//! A prepared one-shot is exactly the sandbox a zygote one-shot gets when it is asked for —
//! its own uid, workspace, cgroup, namespaces, the program forked from a zygote and confined —
//! made earlier, by a filler thread, and waiting for the run's argv on its channel. It serves
//! one run and is destroyed after it; nothing of it is ever given to a second run. Only runs
//! with the default limits and no network take one; the others are made on demand as before.
//!
//! Two zygotes serve one-shots: the sessions' (numpy, pandas, matplotlib, scikit-learn
//! preloaded; ~200 MiB) and a light one (the interpreter and the kernel module only). A fork
//! costs in proportion to the image it copies — twice per sandbox (pid 1 and the program) and
//! again at their exits — so a `print(1)` forked from the light zygote costs a fraction of one
//! forked from the full image, while a program that imports pandas saves the imports only in
//! the full one. Which one a program gets is decided from its source: [`needs_preload`].
//!
//! Teardown (the cgroup's removal, the workspace's unmount, the program directory) happens
//! after the run's Execution is recorded and answered, on a reaper thread with a bounded
//! queue: when the queue is full the run tears its sandbox down itself, so teardown can fall
//! behind by at most the queue's length.

use std::collections::{HashSet, VecDeque};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use runcell_sandbox::{Remains, Running, Workspace};

use crate::limits::SessionLimits;
use crate::model::Language;
use crate::EngineError;

/// How often an idle filler looks again without being woken (a zygote becoming ready is not
/// signalled).
const RECHECK: Duration = Duration::from_millis(250);
/// After a failed preparation, the filler waits this long before the next.
const BACKOFF: Duration = Duration::from_secs(2);
/// Finished sandboxes waiting for a reaper at most; past it the run tears its own down, so a
/// flood of runs slows down to the teardowns' pace instead of piling them up (their memory
/// is no longer reserved: see `run_once`).
const REAP_QUEUE: usize = 8;
/// Reaper threads: a teardown mostly waits for the kernel to free a sandbox (on another CPU),
/// so two overlap their waits.
const REAPERS: usize = 2;
/// How long after the last run ended the filler waits before preparing, unless the pool is
/// below half: a preparation (a fork, mounts, cgroups: ~5 ms of CPU) beside a run slows it
/// down on a small host, and between runs it costs nothing.
const QUIET: Duration = Duration::from_millis(5);

/// Which zygote a one-shot is forked from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The interpreter and the kernel module only.
    Light,
    /// The sessions' zygote, with the data stack preloaded.
    Full,
}

/// The program file's directory on the host, bound read-only at `/opt/runcell/input`; removed
/// on drop. Made empty for a prepared sandbox, the program written when the run comes.
pub(crate) struct ProgramDir {
    pub(crate) path: PathBuf,
    _dir: tempfile::TempDir,
}

impl ProgramDir {
    pub(crate) fn empty(tmp: &Path) -> Result<ProgramDir, EngineError> {
        let io = crate::error::io_error;
        let dir = tempfile::Builder::new()
            .prefix("program-")
            .tempdir_in(tmp)
            .map_err(io("create", tmp))?;
        let path = dir.path().to_owned();
        // The sandbox user is not the owner: it reads through the "other" bits.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(io("chmod", &path))?;
        Ok(ProgramDir { path, _dir: dir })
    }

    /// Writes the program as `file` (world-readable, as the sandbox user reads it).
    pub(crate) fn write(&self, file: &str, code: &str) -> Result<(), EngineError> {
        let io = crate::error::io_error;
        let path = self.path.join(file);
        fs::write(&path, code).map_err(io("write", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).map_err(io("chmod", &path))
    }
}

/// A sandbox made ahead of its run; see the module's documentation.
pub(crate) struct Prepared {
    pub(crate) running: Running,
    /// `[python, /opt/runcell/input/main.py]`: the run's argv begins so.
    pub(crate) argv: Vec<String>,
    pub(crate) limits: SessionLimits,
    pub(crate) input: ProgramDir,
    pub(crate) workspace: Workspace,
    /// Counts the run as in progress from its take until this is dropped.
    pub(crate) busy: Option<Busy>,
}

/// Runs in progress from prepared sandboxes, and when the last one ended.
#[derive(Debug)]
struct Activity {
    running: AtomicUsize,
    last_end: Mutex<Option<Instant>>,
}

/// One run from the pool in progress, until dropped.
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.last_end.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    /// No run in progress, and none ended within [`QUIET`].
    fn quiet(&self) -> bool {
        self.running.load(Ordering::Acquire) == 0
            && self
                .last_end
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none_or(|t| t.elapsed() >= QUIET)
    }
}

/// What is left of a finished one-shot, in the order it goes: the cgroup (and pid 1, with
/// whatever it stopped), the workspace (its tmpfs unmounted), the program's directory.
/// Held only to be dropped: fields drop in declaration order.
#[allow(dead_code)]
pub(crate) struct Leftovers {
    pub(crate) remains: Remains,
    pub(crate) workspace: Workspace,
    pub(crate) input: ProgramDir,
}

/// Where prepared one-shots come from (the engine's core); the pool only asks it.
pub(crate) trait OneShotSource: Send + Sync {
    fn one_shot_pool(&self) -> &OneShotPool;
    /// Whether this kind's zygote is ready (the pool fills only from a ready zygote).
    fn zygote_ready(&self, kind: Kind) -> bool;
    fn prepare(&self, kind: Kind) -> Result<Prepared, EngineError>;
}

#[derive(Default)]
struct State {
    light: VecDeque<Prepared>,
    full: VecDeque<Prepared>,
    /// How many of each kind to keep ready; 0 until the pool is started.
    target: usize,
    stopped: bool,
}

impl State {
    fn of(&mut self, kind: Kind) -> &mut VecDeque<Prepared> {
        match kind {
            Kind::Light => &mut self.light,
            Kind::Full => &mut self.full,
        }
    }
}

/// The prepared one-shots, their filler and the reaper.
pub(crate) struct OneShotPool {
    state: Mutex<State>,
    activity: Arc<Activity>,
    wake: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
    reaper: Mutex<Option<SyncSender<Leftovers>>>,
}

impl Default for OneShotPool {
    fn default() -> Self {
        OneShotPool {
            state: Mutex::default(),
            activity: Arc::new(Activity {
                running: AtomicUsize::new(0),
                last_end: Mutex::new(None),
            }),
            wake: Condvar::new(),
            threads: Mutex::default(),
            reaper: Mutex::default(),
        }
    }
}

impl OneShotPool {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts keeping `target` one-shots of each kind ready, and the reaper. Once only.
    pub(crate) fn start(&self, target: usize, source: Weak<dyn OneShotSource>) {
        {
            let mut st = self.lock();
            if st.stopped || st.target > 0 || target == 0 {
                return;
            }
            st.target = target;
        }
        let (tx, rx) = sync_channel::<Leftovers>(REAP_QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let mut reapers = 0;
        for _ in 0..REAPERS {
            let rx = rx.clone();
            // Each item is torn down by being dropped; a reaper ends once the senders are gone
            // and the queue is empty.
            let reaper = thread::Builder::new()
                .name("oneshot-reaper".into())
                .spawn(move || loop {
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    match next {
                        Ok(left) => drop(left),
                        Err(_) => return,
                    }
                });
            match reaper {
                Ok(h) => {
                    threads.push(h);
                    reapers += 1;
                }
                Err(e) => tracing::error!(error = %e, "cannot start a one-shot reaper"),
            }
        }
        if reapers > 0 {
            *self.reaper.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        }
        let filler = thread::Builder::new()
            .name("oneshot-warm".into())
            .spawn(move || fill(source));
        match filler {
            Ok(h) => threads.push(h),
            Err(e) => tracing::error!(error = %e, "cannot start the warm one-shot thread"),
        }
    }

    /// Whether the pool was started (and not stopped): one-shots then use the light zygote,
    /// prepared sandboxes and the reaper.
    pub(crate) fn active(&self) -> bool {
        let st = self.lock();
        st.target > 0 && !st.stopped
    }

    /// A prepared one-shot of `kind` for `limits`, if one is ready and fits.
    pub(crate) fn take(&self, kind: Kind, limits: &SessionLimits) -> Option<Prepared> {
        let mut st = self.lock();
        let queue = st.of(kind);
        let fits = |p: &Prepared| {
            let (a, b) = (&p.limits, limits);
            a.memory_mb == b.memory_mb
                && a.cpu == b.cpu
                && a.pids == b.pids
                && a.disk_mb == b.disk_mb
        };
        let i = queue.iter().position(fits)?;
        let mut p = queue.remove(i)?;
        self.activity.running.fetch_add(1, Ordering::AcqRel);
        p.busy = Some(Busy(self.activity.clone()));
        self.wake.notify_all();
        Some(p)
    }

    /// How many of each kind the pool keeps ready (0: not started, or stopped).
    pub(crate) fn target(&self) -> usize {
        let st = self.lock();
        if st.stopped {
            0
        } else {
            st.target
        }
    }

    /// How many are ready now, of each kind.
    pub(crate) fn ready(&self) -> (usize, usize) {
        let st = self.lock();
        (st.light.len(), st.full.len())
    }

    /// Tears `left` down on the reaper, or here when there is none or it is behind.
    pub(crate) fn reap(&self, left: Leftovers) {
        let reaper = self
            .reaper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(tx) = reaper {
            match tx.try_send(left) {
                Ok(()) => {}
                Err(TrySendError::Full(left) | TrySendError::Disconnected(left)) => drop(left),
            }
        }
    }

    /// Stops refilling, ends the prepared sandboxes and waits for the reaper to finish what is
    /// queued: no sandbox, mount or cgroup of a one-shot is left when this returns.
    pub(crate) fn stop(&self) {
        let (light, full) = {
            let mut st = self.lock();
            st.stopped = true;
            self.wake.notify_all();
            (std::mem::take(&mut st.light), std::mem::take(&mut st.full))
        };
        drop((light, full));
        self.reaper.lock().unwrap_or_else(|p| p.into_inner()).take();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for h in threads {
            if h.thread().id() != thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// The filler thread: keeps each kind at its target while the source lives. The light kind
/// first: it is the cheaper to make and the one throughput depends on. Below half of the
/// target it refills at once; above, only when runs are quiet ([`QUIET`]).
fn fill(source: Weak<dyn OneShotSource>) {
    loop {
        let Some(s) = source.upgrade() else { return };
        let pool = s.one_shot_pool();
        let quiet = pool.activity.quiet();
        let (due, waiting) = {
            let mut st = pool.lock();
            if st.stopped {
                return;
            }
            let target = st.target;
            let short = [Kind::Light, Kind::Full]
                .into_iter()
                .filter(|k| st.of(*k).len() < target && s.zygote_ready(*k))
                .collect::<Vec<_>>();
            let urgent = short
                .iter()
                .copied()
                .find(|k| st.of(*k).len() < target.div_ceil(2));
            let due = urgent.or_else(|| short.first().copied().filter(|_| quiet));
            (due, !short.is_empty())
        };
        let Some(kind) = due else {
            let st = pool.lock();
            // Something to refill once the runs are quiet: look again soon.
            let wait = if waiting { QUIET } else { RECHECK };
            let (st, _) = pool
                .wake
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner());
            if st.stopped {
                return;
            }
            continue;
        };
        match s.prepare(kind) {
            Ok(p) => {
                let mut st = pool.lock();
                if st.stopped {
                    drop(st);
                    drop(p);
                    return;
                }
                st.of(kind).push_back(p);
            }
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), ?kind, "cannot prepare a one-shot sandbox");
                let st = pool.lock();
                let _ = pool.wake.wait_timeout(st, BACKOFF);
            }
        }
    }
}

/// Whether a Python program is better forked from the full zygote: it imports a module of
/// the runtime's own packages (`third_party`, the top-level names in its site-packages), or
/// imports by a name computed at run time. A program that imports only the standard library
/// runs from the light zygote. Read from the source's text, not parsed: a word `import` in a
/// string or comment can only send a program to the full zygote, which runs everything the
/// light one does (and a module it lacks is imported when the program asks for it, either way).
pub(crate) fn needs_preload(code: &str, third_party: &HashSet<String>) -> bool {
    if code.contains("__import__") || code.contains("import_module") {
        return true;
    }
    imported_modules(code)
        .iter()
        .any(|m| third_party.contains(m))
}

/// The top-level module names after each `import` and `from ... import` in `code`.
fn imported_modules(code: &str) -> Vec<String> {
    let words: Vec<&str> = code
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')' | ':'))
        .filter(|w| !w.is_empty())
        .collect();
    let top = |name: &str| -> String {
        name.trim_end_matches(',')
            .split('.')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            // `from X import ...` (`from . import` names nothing here).
            "from" => {
                if let Some(name) = words.get(i + 1).map(|w| top(w)) {
                    out.push(name);
                }
                i += 2;
            }
            // `import a, b.c as d, e`: each name, skipping aliases, up to the last comma.
            "import" => {
                i += 1;
                while let Some(w) = words.get(i) {
                    out.push(top(w));
                    let mut last = *w;
                    if words.get(i + 1) == Some(&"as") {
                        i += 2;
                        last = words.get(i).copied().unwrap_or("");
                    }
                    i += 1;
                    if !last.ends_with(',') {
                        break;
                    }
                }
            }
            _ => i += 1,
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// The top-level names a runtime's site-packages provides (packages, modules, extension
/// modules): what a program imports from beyond the standard library.
pub(crate) fn site_packages_names(runtime: &Path, version: &str) -> HashSet<String> {
    let dir = runtime.join(format!("lib/python{version}/site-packages"));
    let Ok(entries) = fs::read_dir(&dir) else {
        return HashSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            if name.ends_with(".dist-info") || name.ends_with(".egg-info") || name.ends_with(".pth")
            {
                return None;
            }
            let stem = name.split('.').next()?.to_owned();
            (!stem.is_empty() && stem != "__pycache__").then_some(stem)
        })
        .collect()
}

impl Language {
    /// Whether one-shots of this language can come from a zygote.
    pub(crate) fn forks_from_zygote(self) -> bool {
        self == Language::Python
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn third_party() -> HashSet<String> {
        ["numpy", "pandas", "matplotlib", "sklearn", "requests"]
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn programs_that_import_the_runtimes_packages_want_the_preload() {
        let t = third_party();
        for code in [
            "import numpy as np\nprint(np.arange(3))",
            "from pandas import DataFrame",
            "import os, sys, numpy",
            "import os as o, pandas as pd",
            "import json; import matplotlib.pyplot as plt",
            "def f():\n    import sklearn.ensemble\n",
            "m = __import__('numpy')",
            "import importlib\nimportlib.import_module('os')",
            "try:\n    import requests\nexcept ImportError:\n    pass",
        ] {
            assert!(needs_preload(code, &t), "{code:?}");
        }
        for code in [
            "print(1)",
            "import os, sys\nprint(sys.argv)",
            "from collections import Counter\nimport json as j",
            "import math; print(math.pi)",
            "x = 'numpy'  # named, not imported\nprint(x)",
            "from . import nothing",
        ] {
            assert!(!needs_preload(code, &t), "{code:?}");
        }
    }
}
