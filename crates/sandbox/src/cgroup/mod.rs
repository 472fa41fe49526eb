//! Resource limits and usage accounting through Linux control groups, v1 or v2, detected at
//! runtime.
//!
//! [`Hierarchy::detect`] finds where cgroups live on this host and the parent directory under
//! which runcell creates one cgroup per run ([`Hierarchy::create`]). The supervisor (root) creates
//! the cgroup with its limits; the sandbox helper joins it ([`Cgroup::join_self`], or by writing
//! its pid into [`Cgroup::procs_files`]) before it creates namespaces; at the end the supervisor
//! reads [`Cgroup::usage`], kills what is left ([`Cgroup::kill_all`]) and removes the directories
//! ([`Cgroup::remove`]). Dropping a [`Cgroup`] that was not removed does both, best effort.
//!
//! * v2: one directory `<parent>/<name>` with `memory`, `pids` and (if available) `cpu` enabled.
//! * v1: one directory `<controller parent>/<name>` per mounted hierarchy among `memory`,
//!   `pids`, `cpu`, `cpuacct` and `freezer` (co-mounted controllers share one directory).

mod v1;
mod v2;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// Name of the directory under which runcell creates its per-run cgroups.
const RUNCELL_DIR: &str = "runcell";
/// Longest accepted cgroup name.
const MAX_NAME_LEN: usize = 64;
/// How long [`Cgroup::kill_all`] keeps trying to empty the cgroup.
const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `rmdir` is retried while the kernel still reports the cgroup busy.
const RMDIR_TIMEOUT: Duration = Duration::from_secs(1);
/// Polling interval of the kill and remove loops.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// CFS period used with the CPU quota (both versions), in microseconds.
const CPU_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota the kernel accepts (1 ms), in microseconds.
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// Which cgroup interface the host offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy: one hierarchy per controller (or group of co-mounted controllers).
    V1,
    /// Unified hierarchy.
    V2,
}

/// Limits applied to one run's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory limit in bytes (swap is disabled where the kernel lets us). Must not be 0.
    pub memory_bytes: u64,
    /// Maximum number of tasks (processes and threads). Must not be 0.
    pub pids: u64,
    /// CPU quota in milli-CPUs (1000 = one full CPU); 0 = unlimited.
    pub cpu_millis: u64,
}

impl CgroupLimits {
    fn validate(&self) -> Result<(), CgroupError> {
        if self.memory_bytes == 0 {
            return Err(CgroupError::InvalidLimits {
                reason: "memory limit must be greater than 0",
            });
        }
        if self.pids == 0 {
            return Err(CgroupError::InvalidLimits {
                reason: "pids limit must be greater than 0",
            });
        }
        Ok(())
    }

    /// CFS quota per [`CPU_PERIOD_US`], `None` for unlimited. Clamped to the kernel's 1 ms minimum.
    fn cpu_quota_us(&self) -> Option<u64> {
        (self.cpu_millis != 0).then(|| self.cpu_millis.saturating_mul(100).max(MIN_CPU_QUOTA_US))
    }
}

/// Resources a cgroup consumed. Best effort: anything the kernel does not report is 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// CPU time, user + system, in nanoseconds.
    pub cpu_ns: u64,
    /// Highest memory usage seen (v2 without `memory.peak`: current usage).
    pub peak_memory_bytes: u64,
    /// Processes the kernel OOM killer killed in the cgroup.
    pub oom_kills: u64,
    /// Forks refused because the pids limit was reached.
    pub pids_limit_hits: u64,
}

/// Errors of the cgroup module.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Neither a usable cgroup v2 nor the needed v1 hierarchies are mounted.
    #[error("no usable cgroup hierarchy: {reason}")]
    Unavailable { reason: String },
    /// A required v1 controller hierarchy is not mounted.
    #[error("cgroup v1 {controller} hierarchy is not mounted")]
    ControllerNotMounted { controller: &'static str },
    /// A required controller's interface files are missing in the new cgroup.
    #[error("{controller} controller is not available in {}", .path.display())]
    ControllerUnavailable {
        controller: &'static str,
        path: PathBuf,
    },
    /// The cgroup name is not `[A-Za-z0-9_-]{1,64}`.
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// A limit value cannot be applied.
    #[error("invalid cgroup limits: {reason}")]
    InvalidLimits { reason: &'static str },
    /// Reading a file or listing a directory failed.
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `mkdir` of a cgroup directory failed (including: it already exists).
    #[error("cannot create cgroup directory {}", .path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Writing a control file failed.
    #[error("cannot write {value:?} to {}", .path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    /// `rmdir` of a cgroup directory failed.
    #[error("cannot remove cgroup directory {}", .path.display())]
    RemoveDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl CgroupError {
    fn os_error(&self) -> Option<i32> {
        match self {
            CgroupError::Read { source, .. }
            | CgroupError::CreateDir { source, .. }
            | CgroupError::Write { source, .. }
            | CgroupError::RemoveDir { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    fn is_busy(&self) -> bool {
        self.os_error() == Some(libc::EBUSY)
    }

    fn is_not_found(&self) -> bool {
        self.os_error() == Some(libc::ENOENT)
    }
}

/// Where cgroups live on this host (detected once): version, mount points, the parent under
/// which runcell creates its cgroups.
#[derive(Debug)]
pub struct Hierarchy {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    V1(v1::V1Hierarchy),
    V2(v2::V2Hierarchy),
}

impl Hierarchy {
    /// Detects from `/proc/self/mountinfo` and `/proc/self/cgroup`.
    ///
    /// v2 when a cgroup2 mount has the memory and pids controllers available (pure v2 at
    /// `/sys/fs/cgroup`, or a hybrid unified mount that has them); otherwise v1 when the memory
    /// and pids v1 hierarchies are mounted. Error if neither. The parent is
    /// `<mount>/<own cgroup of this process>/runcell`, nesting under our own cgroup so the host's
    /// limits still apply (v2 may fall back to `<mount>/runcell`, see [`Hierarchy::create`]).
    pub fn detect() -> Result<Hierarchy, CgroupError> {
        let mountinfo = read_string(Path::new("/proc/self/mountinfo"))?;
        let own = read_string(Path::new("/proc/self/cgroup"))?;
        Self::detect_from(&mountinfo, &own)
    }

    fn detect_from(mountinfo: &str, self_cgroup: &str) -> Result<Hierarchy, CgroupError> {
        let mounts = parse_mountinfo(mountinfo);
        let own = parse_self_cgroup(self_cgroup);
        if let Some(h) = v2::V2Hierarchy::detect(&mounts, &own) {
            return Ok(Hierarchy { kind: Kind::V2(h) });
        }
        v1::V1Hierarchy::detect(&mounts, &own)
            .map(|h| Hierarchy { kind: Kind::V1(h) })
            .map_err(|reason| CgroupError::Unavailable { reason })
    }

    /// For tests: a v1 hierarchy from explicit `(controller, dir)` pairs. `dir` is the directory
    /// under which runcell's parent lives: run cgroups go to `<dir>/runcell/<name>`. A controller
    /// may be a co-mount list such as `"cpu,cpuacct"`; pairs naming the same directory share it.
    /// Controllers other than memory, pids, cpu, cpuacct and freezer are ignored.
    pub fn v1_at(mounts: Vec<(String, PathBuf)>) -> Hierarchy {
        Hierarchy {
            kind: Kind::V1(v1::V1Hierarchy::at(mounts)),
        }
    }

    /// For tests: a v2 hierarchy whose runcell parent is `parent` itself: run cgroups go to
    /// `<parent>/<name>`. The hierarchy root is the topmost ancestor of `parent` that (together
    /// with every directory below it on the way to `parent`) has a `cgroup.subtree_control` file.
    pub fn v2_at(parent: PathBuf) -> Hierarchy {
        Hierarchy {
            kind: Kind::V2(v2::V2Hierarchy::at(parent)),
        }
    }

    /// The cgroup interface in use.
    pub fn version(&self) -> CgroupVersion {
        match self.kind {
            Kind::V1(_) => CgroupVersion::V1,
            Kind::V2(_) => CgroupVersion::V2,
        }
    }

    /// Human description for `runcell doctor`, e.g. `v1 (memory, pids, cpu, cpuacct, freezer)`
    /// or `v2 at /sys/fs/cgroup/runcell (memory pids cpu)`, followed by what is missing
    /// (`; degraded, missing: cpu` or `; unusable, missing: memory`).
    pub fn describe(&self) -> String {
        let (mut out, missing_required) = match &self.kind {
            Kind::V1(h) => (h.describe(), h.missing_required()),
            Kind::V2(h) => (h.describe(), h.missing_required()),
        };
        let optional = self.missing_optional();
        if !missing_required.is_empty() {
            out.push_str("; unusable, missing: ");
            out.push_str(&missing_required.join(", "));
        }
        if !optional.is_empty() {
            out.push_str("; degraded, missing: ");
            out.push_str(&optional.join(", "));
        }
        out
    }

    /// Optional controllers that are not available (v2: `cpu`; v1: `cpu`, `cpuacct`): runs work
    /// but without a CPU limit or CPU accounting.
    pub fn missing_optional(&self) -> Vec<&'static str> {
        match &self.kind {
            Kind::V1(h) => h.missing_optional(),
            Kind::V2(h) => h.missing_optional(),
        }
    }

    /// Creates the cgroup for one run/session named `name` (`[A-Za-z0-9_-]`, at most 64
    /// characters) with `limits` applied. The parent directory is created lazily (`mkdir -p`,
    /// safe against concurrent creators). Fails if a cgroup of that name already exists. On any
    /// error, whatever was created for this name is removed again.
    ///
    /// v2 first enables `memory pids cpu` in the `cgroup.subtree_control` of every ancestor from
    /// the mount root down to the parent; if our own (non-root) cgroup refuses with `EBUSY`
    /// (it holds processes: "no internal processes"), the parent becomes `<mount root>/runcell`.
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<Cgroup, CgroupError> {
        validate_name(name)?;
        limits.validate()?;
        match &self.kind {
            Kind::V1(h) => h.create(name, limits),
            Kind::V2(h) => h.create(name, limits),
        }
    }

    /// Removes the run cgroups (`rc-<uid>-<hex>`) that a killed supervisor left behind: empty
    /// ones whose uid lease `lease_free` says nobody holds (a live run or session holds its
    /// lease from before its cgroup exists until after it is removed). The kernel refuses to
    /// remove a cgroup that still has processes, so a mistaken call removes nothing in use.
    ///
    /// One that is not empty is thawed: a supervisor killed between the freeze and the thaw
    /// of its freeze-kill-thaw leaves the sandbox frozen, and a frozen process cannot die,
    /// not even of the SIGKILL its parent's death already sent it; thawed, it ends, and its
    /// cgroup is removed once empty (waiting up to [`STALE_THAW_WAIT`]). Thawing takes nothing
    /// from a live run: its processes are frozen only while they are being killed, and a
    /// process that was not frozen is untouched. Returns how many directories were removed.
    pub fn sweep_stale(&self, lease_free: &dyn Fn(u32) -> bool) -> usize {
        let parents = match &self.kind {
            Kind::V1(h) => h.parent_dirs(),
            Kind::V2(h) => h.possible_parents(),
        };
        let mut removed = 0;
        let (mut busy, mut any_thawed) = (Vec::new(), false);
        for parent in parents {
            let Ok(entries) = fs::read_dir(&parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let uid = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("rc-"))
                    .and_then(|rest| rest.split_once('-'))
                    .and_then(|(uid, _)| uid.parse::<u32>().ok());
                if !uid.is_some_and(lease_free) {
                    continue;
                }
                let path = entry.path();
                if fs::remove_dir(&path).is_ok() {
                    removed += 1;
                } else {
                    any_thawed |= thaw(&path);
                    busy.push(path);
                }
            }
        }
        // A thawed sandbox ends on its own (the pending SIGKILL), emptying its cgroup in every
        // v1 hierarchy, not only the freezer's: give it a moment, then remove what is empty.
        let deadline = Instant::now() + STALE_THAW_WAIT;
        while any_thawed && !busy.is_empty() {
            busy.retain(|path| {
                if fs::remove_dir(path).is_ok() {
                    removed += 1;
                    false
                } else {
                    true
                }
            });
            if busy.is_empty() || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        removed
    }

    #[cfg(test)]
    fn parent_dirs(&self) -> Vec<PathBuf> {
        match &self.kind {
            Kind::V1(h) => h.parent_dirs(),
            Kind::V2(h) => h.parent_dirs(),
        }
    }
}

/// The cgroup of one run: one directory (v2) or one per used hierarchy (v1).
#[derive(Debug)]
pub struct Cgroup {
    version: CgroupVersion,
    dirs: Vec<CgroupDir>,
    removed: AtomicBool,
    /// The usage files, opened on first use and kept open: a session reads them on every
    /// execution, and a `pread` of an open file costs a fraction of path lookup + open +
    /// read + close. Closed before the directories are removed.
    files: Mutex<Option<UsageFiles>>,
}

/// How a number is found in a cgroup file.
#[derive(Debug, Clone, Copy)]
enum Field {
    /// The whole file is one number (`cpuacct.usage`).
    Plain,
    /// The value of the `key N` line of a flat keyed file (`pids.events`).
    Keyed(&'static str),
}

/// One open cgroup file and how to read its number.
#[derive(Debug)]
struct UsageFile {
    file: fs::File,
    field: Field,
}

impl UsageFile {
    /// Read-write where the caller may reset the value through it (v2 resets `memory.peak`
    /// per open file, so the resetting descriptor must be the reading one).
    fn open(path: &Path, field: Field, writable: bool) -> Option<UsageFile> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .ok()
            .or_else(|| writable.then(|| fs::File::open(path).ok()).flatten())?;
        Some(UsageFile { file, field })
    }

    /// The current value: a cgroup file regenerates its text on every read from offset 0.
    fn read(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 1024];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        if n == buf.len() {
            // Longer than any file read here today (a kernel adding many keys): read it all,
            // by offset like the first chunk.
            let mut all = buf.to_vec();
            loop {
                let mut more = [0u8; 1024];
                let m = self.file.read_at(&mut more, all.len() as u64).ok()?;
                if m == 0 {
                    break;
                }
                all.extend_from_slice(&more[..m]);
            }
            return self.parse(std::str::from_utf8(&all).ok()?);
        }
        self.parse(std::str::from_utf8(&buf[..n]).ok()?)
    }

    fn parse(&self, text: &str) -> Option<u64> {
        match self.field {
            Field::Plain => text.trim().parse().ok(),
            Field::Keyed(key) => keyed_u64(text, key),
        }
    }

    fn reset(&self) {
        use std::os::unix::fs::FileExt;
        let _ = self.file.write_at(b"0", 0);
    }
}

/// The files [`Cgroup::usage`] reads, each `None` where the host lacks it.
#[derive(Debug, Default)]
struct UsageFiles {
    /// CPU time; `cpu_scale` converts its unit to nanoseconds.
    cpu: Option<UsageFile>,
    cpu_scale: u64,
    /// Peak memory, also where the peak is reset (v2 without `memory.peak`: current usage).
    peak: Option<UsageFile>,
    oom_kills: Option<UsageFile>,
    pids_limit_hits: Option<UsageFile>,
}

#[derive(Debug, Clone)]
struct CgroupDir {
    path: PathBuf,
    controllers: Vec<&'static str>,
}

impl Cgroup {
    fn new(version: CgroupVersion) -> Cgroup {
        Cgroup {
            version,
            dirs: Vec::new(),
            removed: AtomicBool::new(false),
            files: Mutex::new(None),
        }
    }

    /// Runs `f` on the open usage files, opening them first if needed.
    fn with_files<T>(&self, f: impl FnOnce(&UsageFiles) -> T) -> T {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        let files = files.get_or_insert_with(|| match self.version {
            CgroupVersion::V1 => v1::usage_files(self),
            CgroupVersion::V2 => v2::usage_files(self),
        });
        f(files)
    }

    /// `mkdir <parent>/<name>` (the parent must exist) and records the directory so that it is
    /// removed on drop from then on.
    fn add_dir(
        &mut self,
        path: PathBuf,
        controllers: Vec<&'static str>,
    ) -> Result<(), CgroupError> {
        fs::create_dir(&path).map_err(|source| CgroupError::CreateDir {
            path: path.clone(),
            source,
        })?;
        self.dirs.push(CgroupDir { path, controllers });
        Ok(())
    }

    /// The directory in the hierarchy that carries `controller`.
    fn dir_for(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|d| d.controllers.contains(&controller))
            .map(|d| d.path.as_path())
    }

    /// Every `cgroup.procs` into which a process writes its decimal pid to join the cgroup
    /// (v2: one; v1: one per hierarchy, memory first).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|d| d.path.join("cgroup.procs"))
            .collect()
    }

    /// Moves the calling process into the cgroup by writing `getpid()` to each procs file.
    /// Meant for a single-threaded helper process, before it creates namespaces.
    pub fn join_self(&self) -> Result<(), CgroupError> {
        let pid = std::process::id().to_string();
        for file in self.procs_files() {
            write_file(&file, &pid)?;
        }
        Ok(())
    }

    /// Resources used so far. Best effort: missing or unreadable files count as 0.
    pub fn usage(&self) -> CgroupUsage {
        self.with_files(|f| {
            let read = |file: &Option<UsageFile>| file.as_ref().and_then(UsageFile::read);
            CgroupUsage {
                cpu_ns: read(&f.cpu).unwrap_or(0).saturating_mul(f.cpu_scale),
                peak_memory_bytes: read(&f.peak).unwrap_or(0),
                oom_kills: read(&f.oom_kills).unwrap_or(0),
                pids_limit_hits: read(&f.pids_limit_hits).unwrap_or(0),
            }
        })
    }

    /// CPU time (ns) and peak memory (bytes) so far: the part of [`Cgroup::usage`] read after
    /// every execution, two reads.
    pub fn cpu_and_peak(&self) -> (u64, u64) {
        self.with_files(|f| {
            let cpu = f.cpu.as_ref().and_then(UsageFile::read).unwrap_or(0);
            let peak = f.peak.as_ref().and_then(UsageFile::read).unwrap_or(0);
            (cpu.saturating_mul(f.cpu_scale), peak)
        })
    }

    /// CPU time used so far, in nanoseconds: one read (a cell's start needs no peak).
    pub fn cpu_ns(&self) -> u64 {
        self.with_files(|f| {
            f.cpu
                .as_ref()
                .and_then(UsageFile::read)
                .unwrap_or(0)
                .saturating_mul(f.cpu_scale)
        })
    }

    /// Forks refused because the pids limit was reached (polled while a cell runs): one read.
    pub fn pids_limit_hits(&self) -> u64 {
        self.with_files(|f| {
            f.pids_limit_hits
                .as_ref()
                .and_then(UsageFile::read)
                .unwrap_or(0)
        })
    }

    /// Starts a new peak-memory window (per execution in a long-lived session). v1: writing to
    /// `memory.max_usage_in_bytes` resets it to the current usage; v2 (Linux 6.12+): writing to
    /// `memory.peak` resets it. Best effort: older v2 kernels keep the lifetime peak.
    ///
    /// On v2 the reset holds for the open file it was written to only, which is why the peak
    /// is read through that same kept-open file.
    pub fn reset_peak(&self) {
        self.with_files(|f| {
            if let Some(peak) = &f.peak {
                peak.reset();
            }
        });
    }

    /// Processes currently in the cgroup or its descendants (all hierarchies, deduplicated,
    /// sorted). Best effort: empty on errors.
    pub fn pids(&self) -> Vec<i32> {
        self.live_pids().unwrap_or_default()
    }

    /// Whether a hierarchical counter says no process is left anywhere in the tree (v1:
    /// `pids.current`; v2: `populated 0` in `cgroup.events`). False when it cannot tell.
    fn known_empty(&self) -> bool {
        match self.version {
            CgroupVersion::V1 => self.dir_for("pids").is_some_and(|d| {
                fs::read_to_string(d.join("pids.current")).is_ok_and(|s| s.trim() == "0")
            }),
            CgroupVersion::V2 => self.dirs.first().is_some_and(|d| {
                fs::read_to_string(d.path.join("cgroup.events"))
                    .is_ok_and(|s| s.lines().any(|l| l == "populated 0"))
            }),
        }
    }

    fn live_pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut set = BTreeSet::new();
        for dir in &self.dirs {
            collect_procs(&dir.path, &mut set)?;
        }
        Ok(set.into_iter().collect())
    }

    /// Kills every process in the cgroup and waits (polling, up to 2 s) until it is empty.
    /// Returns whether it emptied.
    ///
    /// v2 writes `1` to `cgroup.kill` when the file exists (kernel ≥ 5.14), else sends SIGKILL
    /// to each process; v1 freezes the freezer cgroup (if that hierarchy is mounted) while it
    /// sends SIGKILL to each process, then thaws it so they die. Both repeat until empty. The
    /// calling process itself is never signalled (nor frozen): if it is inside, the result is
    /// `false`.
    pub fn kill_all(&self) -> Result<bool, CgroupError> {
        // The common case (every process already gone with its pid 1) from one read.
        if self.known_empty() {
            return Ok(true);
        }
        let deadline = Instant::now() + KILL_TIMEOUT;
        let me = own_pid();
        loop {
            let pids = self.live_pids()?;
            if pids.is_empty() {
                return Ok(true);
            }
            let me_inside = pids.contains(&me);
            if (me_inside && pids.len() == 1) || Instant::now() >= deadline {
                return Ok(false);
            }
            match self.version {
                CgroupVersion::V1 => v1::kill_round(self, &pids, me_inside),
                CgroupVersion::V2 => v2::kill_round(self, &pids, me_inside),
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Removes the directories (`rmdir`, descendants first). Call after [`Cgroup::kill_all`]:
    /// the kernel refuses to remove a cgroup that still has processes. Idempotent; a directory
    /// that is already gone is fine.
    pub fn remove(&self) -> Result<(), CgroupError> {
        if self.removed.load(Ordering::Acquire) {
            return Ok(());
        }
        // Nothing of ours stays open in a directory about to go.
        self.files.lock().unwrap_or_else(|p| p.into_inner()).take();
        let deadline = Instant::now() + RMDIR_TIMEOUT;
        let mut first_error = None;
        for dir in &self.dirs {
            if let Err(e) = rmdir_tree(&dir.path, deadline) {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            None => {
                self.removed.store(true, Ordering::Release);
                Ok(())
            }
            Some(e) => Err(e),
        }
    }

    /// The interface of this cgroup.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The cgroup's directories (v2: one; v1: one per hierarchy), for tests and leak checks.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.path.clone()).collect()
    }
}

impl Drop for Cgroup {
    /// Best effort [`Cgroup::kill_all`] + [`Cgroup::remove`], so nothing is left behind even on an
    /// early return, unless already removed.
    fn drop(&mut self) {
        if self.removed.load(Ordering::Acquire) || self.dirs.is_empty() {
            return;
        }
        let _ = self.kill_all();
        let _ = self.remove();
    }
}

/// Accepts `[A-Za-z0-9_-]{1,64}`.
fn validate_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > MAX_NAME_LEN {
        "longer than 64 characters"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        "only A-Z, a-z, 0-9, '_' and '-' are allowed"
    } else {
        return Ok(());
    };
    Err(CgroupError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

fn own_pid() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// Sends SIGKILL to each pid except our own. Errors (mostly ESRCH: already gone) are ignored.
fn kill_each(pids: &[i32]) {
    let me = own_pid();
    for &pid in pids {
        // Only positive pids: 0 and negative values would address process groups or everything.
        if pid <= 0 || pid == me {
            continue;
        }
        // SAFETY: kill(2) takes two integers and accesses no memory of ours; `pid` is positive,
        // so it addresses exactly one process, never a process group or "every process".
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn read_string(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// One `write(2)` of `value` to an existing control file (no `O_CREAT`, so a missing file
/// reports `ENOENT` instead of creating a regular file).
/// How long [`Cgroups::sweep_stale`] waits for the processes of a thawed stale cgroup to end.
pub const STALE_THAW_WAIT: Duration = Duration::from_secs(1);

/// Thaws the frozen cgroup at `dir` (v1 `freezer.state`, v2 `cgroup.freeze`); whether it was
/// frozen (or freezing) and is thawed now.
fn thaw(dir: &Path) -> bool {
    let v1 = dir.join("freezer.state");
    if let Ok(state) = fs::read_to_string(&v1) {
        return state.trim() != "THAWED" && write_raw(&v1, "THAWED").is_ok();
    }
    let v2 = dir.join("cgroup.freeze");
    match fs::read_to_string(&v2) {
        Ok(state) => state.trim() == "1" && write_raw(&v2, "0").is_ok(),
        Err(_) => false,
    }
}

fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    file.write_all(value.as_bytes())
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_raw(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_owned(),
        source,
    })
}

/// Writes `dir/file`; `Ok(false)` if the file does not exist (controller feature absent).
fn write_optional(dir: &Path, file: &str, value: &str) -> Result<bool, CgroupError> {
    match write_file(&dir.join(file), value) {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `dir/file`; a missing file means `controller` is not available there.
fn write_required(
    dir: &Path,
    file: &str,
    value: &str,
    controller: &'static str,
) -> Result<(), CgroupError> {
    match write_file(&dir.join(file), value) {
        Err(e) if e.is_not_found() => Err(CgroupError::ControllerUnavailable {
            controller,
            path: dir.to_path_buf(),
        }),
        other => other,
    }
}

/// The value of the `key N` line of a flat keyed file (`memory.events`, `cpu.stat`, ...).
fn keyed_u64(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.next()? != key {
            return None;
        }
        fields.next()?.parse().ok()
    })
}

/// Positive pids of a `cgroup.procs` file.
fn parse_pids(text: &str) -> impl Iterator<Item = i32> + '_ {
    text.split_whitespace()
        .filter_map(|s| s.parse::<i32>().ok())
        .filter(|&pid| pid > 0)
}

/// Adds the pids of `dir` and its descendant cgroups. A directory that is gone is empty.
fn collect_procs(dir: &Path, out: &mut BTreeSet<i32>) -> Result<(), CgroupError> {
    let procs = dir.join("cgroup.procs");
    match fs::read_to_string(&procs) {
        Ok(text) => out.extend(parse_pids(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: procs,
                source,
            })
        }
    }
    for child in subdirs(dir)? {
        collect_procs(&child, out)?;
    }
    Ok(())
}

/// Subdirectories (child cgroups) of `dir`; none if `dir` is gone.
fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let read_err = |source| CgroupError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_err(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read_err)?;
        if entry.file_type().map_err(read_err)?.is_dir() {
            out.push(entry.path());
        }
    }
    Ok(out)
}

/// `rmdir` of `dir` after its descendants, retrying while the kernel says `EBUSY` (tasks that
/// were just killed can keep a cgroup busy for a moment). A directory that is gone is fine.
fn rmdir_tree(dir: &Path, deadline: Instant) -> Result<(), CgroupError> {
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Child cgroups (listed only now: usually there are none) or tasks still leaving.
            // (cgroupfs says EBUSY for both; a plain directory, ENOTEMPTY.)
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOTEMPTY))
                    && Instant::now() < deadline =>
            {
                let children = subdirs(dir)?;
                for child in &children {
                    rmdir_tree(child, deadline)?;
                }
                if children.is_empty() {
                    thread::sleep(POLL_INTERVAL);
                }
            }
            Err(source) => {
                return Err(CgroupError::RemoveDir {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
    }
}

/// Controller names of a `cgroup.controllers` / `cgroup.subtree_control` file (empty if
/// unreadable). A leading `+` is ignored.
fn read_controller_list(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|text| {
            text.split_whitespace()
                .map(|c| c.trim_start_matches('+').to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// One line of `/proc/self/mountinfo`, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry {
    /// Root of the mount within its filesystem (for cgroupfs: the cgroup shown at the mount
    /// point).
    root: PathBuf,
    mount_point: PathBuf,
    fstype: String,
    super_options: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            // id parent dev root mount-point options [optional...] - fstype source super-options
            let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            Some(MountEntry {
                root: unescape_mount_path(fields.get(3)?),
                mount_point: unescape_mount_path(fields.get(4)?),
                fstype: (*fields.get(sep + 1)?).to_owned(),
                super_options: fields
                    .get(sep + 3)
                    .map(|o| o.split(',').map(str::to_owned).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// Undoes the kernel's octal escaping of mountinfo paths (`\040` for a space, ...).
fn unescape_mount_path(s: &str) -> PathBuf {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// One line of `/proc/self/cgroup`: `id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnCgroup {
    id: String,
    /// Empty for the v2 line (`0::/path`); `name=systemd` style entries are kept verbatim.
    controllers: Vec<String>,
    path: String,
}

fn parse_self_cgroup(text: &str) -> Vec<OwnCgroup> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.to_owned();
            let controllers = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            let path = parts.next()?.trim_end_matches(" (deleted)").to_owned();
            Some(OwnCgroup {
                id,
                controllers,
                path,
            })
        })
        .collect()
}

/// The directory of cgroup `own_path` under a cgroupfs mounted at `mount_point` whose root is
/// `mount_root`. Falls back to the mount point when our cgroup is not visible below it (outside
/// the mount's root, or `/..` paths from a cgroup namespace).
fn cgroup_dir(mount_point: &Path, mount_root: &Path, own_path: &str) -> PathBuf {
    let own = Path::new(own_path);
    if !own.is_absolute() || own.components().any(|c| c == Component::ParentDir) {
        return mount_point.to_path_buf();
    }
    match own.strip_prefix(mount_root) {
        Ok(rel) => mount_point.join(rel),
        Err(_) => mount_point.to_path_buf(),
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Helpers shared by the tests of the v1 and v2 modules.

    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::AtomicU32;
    use std::sync::{Mutex, MutexGuard};

    /// Tests that touch the real cgroupfs run one at a time (the CPU test needs a quiet machine,
    /// and they share the `runcell` parent directories).
    static REAL_LOCK: Mutex<()> = Mutex::new(());

    pub(crate) fn real_lock() -> MutexGuard<'static, ()> {
        REAL_LOCK.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the effective uid is 0 (from `/proc/self/status`, to stay free of `unsafe`).
    pub(crate) fn is_root() -> bool {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                let line = status.lines().find(|l| l.starts_with("Uid:"))?;
                line.split_whitespace().nth(2).map(|euid| euid == "0")
            })
            .unwrap_or(false)
    }

    /// A name unique to this process and call.
    pub(crate) fn unique_name(label: &str) -> String {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        format!("test-{}-{label}-{n}", std::process::id())
    }

    /// Creates `path` and the files a kernel would show in it (empty).
    pub(crate) fn fake_cgroup(path: &Path, files: &[&str]) {
        fs::create_dir_all(path).expect("create fake cgroup dir");
        for file in files {
            fs::write(path.join(file), "").expect("create fake control file");
        }
    }

    pub(crate) fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    /// Spawns `/bin/sh -c <script>` that waits on stdin until the parent has moved it into
    /// `cg` (by writing its pid to every procs file), so everything it runs is accounted.
    pub(crate) fn spawn_in(cg: &Cgroup, script: &str) -> Child {
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("read _gate; {script}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn /bin/sh");
        for file in cg.procs_files() {
            fs::write(&file, child.id().to_string())
                .unwrap_or_else(|e| panic!("write pid to {}: {e}", file.display()));
        }
        let mut stdin = child.stdin.take().expect("child stdin");
        stdin.write_all(b"go\n").expect("release child");
        child
    }

    pub(crate) fn child_pid(child: &Child) -> i32 {
        i32::try_from(child.id()).expect("pid fits i32")
    }

    /// Re-runs the current test binary, only test `test_name` (relative to the crate root, e.g.
    /// `cgroup::v1::tests::x`), with `env` set, and waits until it prints `marker`.
    pub(crate) fn spawn_self_test(test_name: &str, env: (&str, String), marker: &str) -> Child {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(env.0, env.1)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn test binary");
        let stdout = child.stdout.take().expect("child stdout");
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains(marker) => break,
                Some(Ok(_)) => continue,
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("child test exited before printing {marker}");
                }
            }
        }
        child
    }

    /// This test module's path relative to the crate root (`module_path!()` starts with the
    /// crate name).
    pub(crate) fn crate_relative(module: &str) -> String {
        module
            .split_once("::")
            .map(|(_, rest)| rest.to_owned())
            .unwrap_or_else(|| module.to_owned())
    }

    /// Best-effort removal of the (empty) `runcell` parents the real tests created.
    pub(crate) fn remove_parents(h: &Hierarchy) {
        for dir in h.parent_dirs() {
            let _ = fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Hierarchy>();
        check::<Cgroup>();
        check::<CgroupError>();
    }

    #[test]
    fn name_validation() {
        for ok in ["a", "run-1_X", &"x".repeat(64)] {
            validate_name(ok).unwrap_or_else(|e| panic!("{ok:?} rejected: {e}"));
        }
        for bad in [
            "",
            "../x",
            "a/b",
            ".",
            "..",
            "a b",
            "é",
            "a\0b",
            &"x".repeat(65),
        ] {
            assert!(
                matches!(validate_name(bad), Err(CgroupError::InvalidName { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn create_rejects_bad_names_and_limits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = Hierarchy::v2_at(dir.path().join("runcell"));
        let limits = CgroupLimits {
            memory_bytes: 1 << 20,
            pids: 4,
            cpu_millis: 0,
        };
        for bad in ["../x", "", "a/b", &"y".repeat(65)] {
            let err = h.create(bad, &limits).expect_err("bad name accepted");
            assert!(matches!(err, CgroupError::InvalidName { .. }), "{err}");
        }
        let zero_mem = CgroupLimits {
            memory_bytes: 0,
            ..limits
        };
        let err = h.create("ok", &zero_mem).expect_err("zero memory accepted");
        assert!(matches!(err, CgroupError::InvalidLimits { .. }), "{err}");
        let zero_pids = CgroupLimits { pids: 0, ..limits };
        let err = h.create("ok", &zero_pids).expect_err("zero pids accepted");
        assert!(matches!(err, CgroupError::InvalidLimits { .. }), "{err}");
        // Nothing was created for rejected requests.
        assert!(!dir.path().join("runcell").exists());
    }

    #[test]
    fn cpu_quota() {
        let q = |cpu_millis| {
            CgroupLimits {
                memory_bytes: 1,
                pids: 1,
                cpu_millis,
            }
            .cpu_quota_us()
        };
        assert_eq!(q(0), None);
        assert_eq!(q(1000), Some(100_000));
        assert_eq!(q(500), Some(50_000));
        assert_eq!(q(2500), Some(250_000));
        assert_eq!(q(1), Some(MIN_CPU_QUOTA_US));
        assert_eq!(q(u64::MAX), Some(u64::MAX));
    }

    #[test]
    fn error_messages() {
        let e = CgroupError::Write {
            path: "/x/memory.max".into(),
            value: "5".into(),
            source: io::Error::from_raw_os_error(libc::EBUSY),
        };
        assert_eq!(e.to_string(), "cannot write \"5\" to /x/memory.max");
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.is_busy());
        let e = CgroupError::ControllerUnavailable {
            controller: "memory",
            path: "/x".into(),
        };
        assert_eq!(e.to_string(), "memory controller is not available in /x");
    }

    #[test]
    fn keyed_parsing() {
        let text = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n";
        assert_eq!(keyed_u64(text, "usage_usec"), Some(1500));
        assert_eq!(keyed_u64(text, "system_usec"), Some(500));
        assert_eq!(keyed_u64(text, "usage"), None);
        assert_eq!(keyed_u64("oom 1\noom_kill 3\n", "oom_kill"), Some(3));
        assert_eq!(keyed_u64("max 7", "max"), Some(7));
        assert_eq!(keyed_u64("max x", "max"), None);
    }

    #[test]
    fn pids_parsing_ignores_junk_and_non_positive() {
        let pids: Vec<i32> = parse_pids("12\n0\n-1\nabc\n 34 \n").collect();
        assert_eq!(pids, vec![12, 34]);
    }

    #[test]
    fn mountinfo_parsing() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:5 - cgroup cgroup rw,cpu
33 31 0:30 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /mnt/with\\040space rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].fstype, "cgroup");
        assert_eq!(m[1].mount_point, PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(m[1].super_options, vec!["rw", "cpu"]);
        assert_eq!(m[2].root, PathBuf::from("/docker/abc"));
        assert_eq!(m[2].super_options, vec!["rw", "cpu", "cpuacct"]);
        assert_eq!(m[3].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[3].fstype, "cgroup2");
    }

    #[test]
    fn self_cgroup_parsing() {
        let text = "9:name=systemd:/\n4:memory:/process_api/c0dd\n2:cpu,cpuacct:/a:b\n0::/user.slice/x.scope\n";
        let own = parse_self_cgroup(text);
        assert_eq!(own.len(), 4);
        assert_eq!(own[1].controllers, vec!["memory"]);
        assert_eq!(own[1].path, "/process_api/c0dd");
        assert_eq!(own[2].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(own[2].path, "/a:b");
        assert_eq!(own[3].id, "0");
        assert!(own[3].controllers.is_empty());
        assert_eq!(own[3].path, "/user.slice/x.scope");
    }

    #[test]
    fn cgroup_dir_joins_relative_to_mount_root() {
        let mp = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(cgroup_dir(mp, Path::new("/"), "/"), mp);
        assert_eq!(
            cgroup_dir(mp, Path::new("/"), "/process_api/x"),
            mp.join("process_api/x")
        );
        assert_eq!(
            cgroup_dir(mp, Path::new("/docker/abc"), "/docker/abc/inner"),
            mp.join("inner")
        );
        assert_eq!(cgroup_dir(mp, Path::new("/docker/abc"), "/other"), mp);
        assert_eq!(cgroup_dir(mp, Path::new("/"), "/../.."), mp);
    }

    /// Fake mountinfo + /proc/self/cgroup pointing into a tempdir.
    fn fake_proc(root: &Path, v1: &[&str], unified: Option<&str>) -> (String, String) {
        let mut mountinfo = String::new();
        let mut own = String::new();
        for (i, ctrl) in v1.iter().enumerate() {
            let mp = root.join(ctrl);
            fs::create_dir_all(&mp).expect("mkdir");
            mountinfo.push_str(&format!(
                "{} 31 0:{} / {} rw,relatime - cgroup cgroup rw,{ctrl}\n",
                40 + i,
                40 + i,
                mp.display()
            ));
            let path = if *ctrl == "memory" { "/api/h1" } else { "/" };
            own.push_str(&format!("{}:{ctrl}:{path}\n", i + 1));
        }
        if let Some(controllers) = unified {
            let mp = root.join("unified");
            fs::create_dir_all(&mp).expect("mkdir");
            fs::write(mp.join("cgroup.controllers"), controllers).expect("write");
            fs::write(mp.join("cgroup.subtree_control"), "").expect("write");
            mountinfo.push_str(&format!(
                "60 31 0:60 / {} rw,relatime - cgroup2 cgroup2 rw\n",
                mp.display()
            ));
            own.push_str("0::/svc\n");
        }
        (mountinfo, own)
    }

    #[test]
    fn detect_prefers_v2_with_memory_and_pids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mountinfo, own) = fake_proc(
            dir.path(),
            &["cpu"],
            Some("cpuset cpu io memory hugetlb pids rdma misc"),
        );
        let h = Hierarchy::detect_from(&mountinfo, &own).expect("detect");
        assert_eq!(h.version(), CgroupVersion::V2);
        let parent = dir.path().join("unified/svc/runcell");
        assert_eq!(
            h.describe(),
            format!("v2 at {} (memory pids cpu)", parent.display())
        );
        assert!(h.missing_optional().is_empty());
    }

    #[test]
    fn detect_hybrid_with_empty_unified_is_v1() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mountinfo, own) = fake_proc(
            dir.path(),
            &["cpu", "cpuacct", "memory", "pids", "freezer"],
            Some("hugetlb"),
        );
        let h = Hierarchy::detect_from(&mountinfo, &own).expect("detect");
        assert_eq!(h.version(), CgroupVersion::V1);
        assert_eq!(h.describe(), "v1 (memory, pids, cpu, cpuacct, freezer)");
        assert!(h.missing_optional().is_empty());
        let parents = h.parent_dirs();
        assert!(parents.contains(&dir.path().join("memory/api/h1/runcell")));
        assert!(parents.contains(&dir.path().join("pids/runcell")));
    }

    #[test]
    fn detect_v1_without_cpu_is_degraded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mountinfo, own) = fake_proc(dir.path(), &["memory", "pids"], None);
        let h = Hierarchy::detect_from(&mountinfo, &own).expect("detect");
        assert_eq!(h.version(), CgroupVersion::V1);
        assert_eq!(h.missing_optional(), vec!["cpu", "cpuacct"]);
        assert_eq!(
            h.describe(),
            "v1 (memory, pids); degraded, missing: cpu, cpuacct"
        );
    }

    #[test]
    fn detect_fails_without_memory_or_pids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mountinfo, own) = fake_proc(dir.path(), &["memory", "cpu"], Some("cpu io"));
        let err = Hierarchy::detect_from(&mountinfo, &own).expect_err("detected");
        assert!(matches!(err, CgroupError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("pids"), "{err}");
    }

    #[test]
    fn real_detect_matches_mounts() {
        if !Path::new("/proc/self/mountinfo").exists() {
            return;
        }
        let h = match Hierarchy::detect() {
            Ok(h) => h,
            Err(e) => {
                eprintln!("skipping: {e}");
                return;
            }
        };
        let cgroup2_root_has_memory = fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .map(|c| c.split_whitespace().any(|x| x == "memory"))
            .unwrap_or(false);
        if cgroup2_root_has_memory {
            assert_eq!(h.version(), CgroupVersion::V2);
        }
        if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
            && Path::new("/sys/fs/cgroup/pids").is_dir()
        {
            // This development machine: hybrid with an empty unified mount.
            assert_eq!(h.version(), CgroupVersion::V1, "{}", h.describe());
        }
        assert!(!h.describe().is_empty());
    }
}
