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

mod detect;
mod dirs;
mod error;
mod files;
mod limits;
#[cfg(test)]
pub(crate) mod testutil;
mod usage;
mod v1;
mod v2;

pub use error::CgroupError;
pub use limits::CgroupLimits;
pub use usage::CgroupUsage;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

pub(crate) use detect::parse_mountinfo;
use detect::parse_self_cgroup;
use dirs::{own_pid, Dirs};
use files::{read_string, write_file, write_raw, POLL_INTERVAL};
use usage::{UsageFile, UsageFiles};

/// Longest accepted cgroup name.
const MAX_NAME_LEN: usize = 64;
/// How long [`Cgroup::kill_all`] keeps trying to empty the cgroup.
const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `rmdir` is retried while the kernel still reports the cgroup busy.
const RMDIR_TIMEOUT: Duration = Duration::from_secs(1);

/// Which cgroup interface the host offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy: one hierarchy per controller (or group of co-mounted controllers).
    V1,
    /// Unified hierarchy.
    V2,
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
        // On an error, dropping `cg` removes whatever was created for it so far.
        let mut cg = Cgroup::new(self.version());
        match &self.kind {
            Kind::V1(h) => h.create(name, limits, &mut cg.dirs)?,
            Kind::V2(h) => h.create(name, limits, &mut cg.dirs)?,
        }
        Ok(cg)
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
    dirs: Dirs,
    removed: AtomicBool,
    /// The usage files, opened on first use and kept open: a session reads them on every
    /// execution, and a `pread` of an open file costs a fraction of path lookup + open +
    /// read + close. Closed before the directories are removed.
    files: Mutex<Option<UsageFiles>>,
}

impl Cgroup {
    fn new(version: CgroupVersion) -> Cgroup {
        Cgroup {
            version,
            dirs: Dirs::default(),
            removed: AtomicBool::new(false),
            files: Mutex::new(None),
        }
    }

    /// Runs `f` on the open usage files, opening them first if needed.
    fn with_files<T>(&self, f: impl FnOnce(&UsageFiles) -> T) -> T {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        let files = files.get_or_insert_with(|| match self.version {
            CgroupVersion::V1 => v1::usage_files(&self.dirs),
            CgroupVersion::V2 => v2::usage_files(&self.dirs),
        });
        f(files)
    }

    /// Every `cgroup.procs` into which a process writes its decimal pid to join the cgroup
    /// (v2: one; v1: one per hierarchy, memory first).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.procs_files()
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
        self.dirs.live_pids().unwrap_or_default()
    }

    /// Whether a hierarchical counter says no process is left anywhere in the tree. False when
    /// it cannot tell.
    fn known_empty(&self) -> bool {
        match self.version {
            CgroupVersion::V1 => v1::known_empty(&self.dirs),
            CgroupVersion::V2 => v2::known_empty(&self.dirs),
        }
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
            let pids = self.dirs.live_pids()?;
            if pids.is_empty() {
                return Ok(true);
            }
            let me_inside = pids.contains(&me);
            if (me_inside && pids.len() == 1) || Instant::now() >= deadline {
                return Ok(false);
            }
            match self.version {
                CgroupVersion::V1 => v1::kill_round(&self.dirs, &pids, me_inside),
                CgroupVersion::V2 => v2::kill_round(&self.dirs, &pids, me_inside),
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
        self.dirs.remove_all(Instant::now() + RMDIR_TIMEOUT)?;
        self.removed.store(true, Ordering::Release);
        Ok(())
    }

    /// The interface of this cgroup.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The cgroup's directories (v2: one; v1: one per hierarchy), for tests and leak checks.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.paths()
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

/// How long [`Hierarchy::sweep_stale`] waits for the processes of a thawed stale cgroup to end.
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
