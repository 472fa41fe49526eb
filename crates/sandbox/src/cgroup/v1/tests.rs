//! cgroup v1 through the [`Hierarchy`] and [`Cgroup`] it creates: fake hierarchies in a
//! temporary directory (a hook stands in for the kernel), and the real one when this host has it.

use super::super::dirs::CgroupDir;
use super::super::testutil::{
    child_pid, crate_relative, fake_cgroup, is_root, read, real_lock, remove_parents, spawn_in,
    spawn_self_test, unique_name,
};
use super::super::{Cgroup, CgroupUsage, CgroupVersion, Hierarchy, Kind};
use super::*;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::Ordering;

const MIB: u64 = 1 << 20;
const LIMITS: CgroupLimits = CgroupLimits {
    memory_bytes: 64 * MIB,
    pids: 16,
    cpu_millis: 500,
};

const V1_FILES: [&str; 14] = [
    "cgroup.procs",
    "tasks",
    "memory.limit_in_bytes",
    "memory.memsw.limit_in_bytes",
    "memory.swappiness",
    "memory.max_usage_in_bytes",
    "memory.oom_control",
    "pids.max",
    "pids.events",
    "cpu.cfs_period_us",
    "cpu.cfs_quota_us",
    "cpuacct.usage",
    "freezer.state",
    "notify_on_release",
];

/// Stands in for the kernel on mkdir (all hierarchies get every file; harmless here).
fn fake_kernel_mkdir(dir: &Path) {
    fake_cgroup(dir, &V1_FILES);
}

/// Same, for a kernel booted without swap accounting.
fn fake_kernel_mkdir_no_memsw(dir: &Path) {
    let files: Vec<&str> = V1_FILES
        .into_iter()
        .filter(|f| !f.starts_with("memory.memsw"))
        .collect();
    fake_cgroup(dir, &files);
}

fn fake_hierarchy(pairs: Vec<(&str, PathBuf)>, hook: fn(&Path)) -> Hierarchy {
    let mut h = V1Hierarchy::at(pairs.into_iter().map(|(c, p)| (c.to_owned(), p)).collect());
    h.mkdir_hook = Some(hook);
    Hierarchy { kind: Kind::V1(h) }
}

/// This machine's layout: separate cpu and cpuacct mounts, memory nested in our cgroup.
fn separate_mounts(tmp: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("cpu", tmp.join("cpu")),
        ("memory", tmp.join("memory/api/h1")),
        ("pids", tmp.join("pids")),
        ("cpuacct", tmp.join("cpuacct")),
        ("freezer", tmp.join("freezer")),
        ("devices", tmp.join("devices")),
    ]
}

/// Fake cgroups cannot be rmdir'ed (they hold regular files) and their `cgroup.procs` must
/// never lead to real kills: skip the drop-time cleanup, the tempdir goes away anyway.
fn forget(cg: Cgroup) {
    cg.removed.store(true, Ordering::Release);
}

#[test]
fn fake_create_writes_limits() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let h = fake_hierarchy(separate_mounts(tmp.path()), fake_kernel_mkdir);
    assert_eq!(h.version(), CgroupVersion::V1);
    assert_eq!(h.describe(), "v1 (memory, pids, cpu, cpuacct, freezer)");
    assert!(h.missing_optional().is_empty());

    let cg = h.create("run-1", &LIMITS).expect("create");
    let t = tmp.path();
    let expected: Vec<PathBuf> = ["memory/api/h1", "pids", "cpu", "cpuacct", "freezer"]
        .iter()
        .map(|m| t.join(m).join("runcell/run-1"))
        .collect();
    assert_eq!(cg.paths(), expected);
    assert_eq!(
        cg.procs_files(),
        expected
            .iter()
            .map(|d| d.join("cgroup.procs"))
            .collect::<Vec<_>>()
    );
    let mem = &expected[0];
    assert_eq!(read(&mem.join("memory.limit_in_bytes")), "67108864");
    assert_eq!(read(&mem.join("memory.memsw.limit_in_bytes")), "67108864");
    assert_eq!(read(&mem.join("memory.swappiness")), "0");
    assert_eq!(read(&expected[1].join("pids.max")), "16");
    assert_eq!(read(&expected[2].join("cpu.cfs_period_us")), "100000");
    assert_eq!(read(&expected[2].join("cpu.cfs_quota_us")), "50000");
    // Limits go only where their controller lives.
    assert_eq!(read(&expected[1].join("memory.limit_in_bytes")), "");
    assert_eq!(read(&expected[0].join("pids.max")), "");
    assert!(!t.join("devices/runcell").exists());

    let unlimited = CgroupLimits {
        cpu_millis: 0,
        ..LIMITS
    };
    let cg2 = h.create("run-2", &unlimited).expect("create");
    assert_eq!(read(&t.join("cpu/runcell/run-2/cpu.cfs_quota_us")), "-1");

    let err = h.create("run-1", &LIMITS).expect_err("duplicate created");
    assert!(matches!(err, CgroupError::CreateDir { .. }), "{err}");
    forget(cg);
    forget(cg2);
}

#[test]
fn fake_concurrent_creators_share_the_parent() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let h = fake_hierarchy(separate_mounts(tmp.path()), fake_kernel_mkdir);
    let cgroups: Vec<Cgroup> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let h = &h;
                s.spawn(move || h.create(&format!("c{i}"), &LIMITS))
            })
            .collect();
        handles
            .into_iter()
            .map(|t| t.join().expect("thread").expect("create"))
            .collect()
    });
    assert_eq!(cgroups.len(), 8);
    for cg in cgroups {
        forget(cg);
    }
}

#[test]
fn fake_without_swap_accounting() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let h = fake_hierarchy(separate_mounts(tmp.path()), fake_kernel_mkdir_no_memsw);
    let cg = h.create("x", &LIMITS).expect("create");
    let mem = tmp.path().join("memory/api/h1/runcell/x");
    assert_eq!(read(&mem.join("memory.limit_in_bytes")), "67108864");
    assert!(!mem.join("memory.memsw.limit_in_bytes").exists());
    forget(cg);
}

#[test]
fn fake_comounted_cpu_cpuacct_share_a_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = tmp.path();
    let both = t.join("cpu,cpuacct");
    fs::create_dir(&both).expect("mkdir");
    std::os::unix::fs::symlink("cpu,cpuacct", t.join("cpu")).expect("symlink");
    std::os::unix::fs::symlink("cpu,cpuacct", t.join("cpuacct")).expect("symlink");
    let h = fake_hierarchy(
        vec![
            ("memory", t.join("memory")),
            ("pids", t.join("pids")),
            ("cpu", t.join("cpu")),
            ("cpuacct", t.join("cpuacct")),
        ],
        fake_kernel_mkdir,
    );
    assert_eq!(h.describe(), "v1 (memory, pids, cpu, cpuacct)");
    let cg = h.create("x", &LIMITS).expect("create");
    assert_eq!(cg.paths().len(), 3);
    let cpu = t.join("cpu/runcell/x");
    assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
    fs::write(cpu.join("cpuacct.usage"), "42\n").expect("write");
    assert_eq!(cg.usage().cpu_ns, 42);

    // The same written as one co-mount entry.
    let h = V1Hierarchy::at(vec![
        ("memory".to_owned(), t.join("memory")),
        ("pids".to_owned(), t.join("pids")),
        ("cpu,cpuacct".to_owned(), both.clone()),
    ]);
    assert_eq!(h.mounts.len(), 3);
    assert_eq!(h.mounts[2].controllers, vec!["cpu", "cpuacct"]);
    forget(cg);
}

#[test]
fn fake_missing_required_controller() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let h = fake_hierarchy(
        vec![("memory", tmp.path().join("memory"))],
        fake_kernel_mkdir,
    );
    assert_eq!(
        h.describe(),
        "v1 (memory); unusable, missing: pids; degraded, missing: cpu, cpuacct"
    );
    let err = h.create("x", &LIMITS).expect_err("created");
    assert!(
        matches!(
            err,
            CgroupError::ControllerNotMounted { controller: "pids" }
        ),
        "{err}"
    );
    assert!(!tmp.path().join("memory/runcell").exists());
}

#[test]
fn fake_usage_parsing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let h = fake_hierarchy(separate_mounts(tmp.path()), fake_kernel_mkdir);
    let cg = h.create("x", &LIMITS).expect("create");
    // Freshly created (empty files): all zero.
    assert_eq!(cg.usage(), CgroupUsage::default());
    let t = tmp.path();
    let dir = |m: &str| t.join(m).join("runcell/x");
    fs::write(dir("cpuacct").join("cpuacct.usage"), "987654321\n").expect("write");
    fs::write(
        dir("memory/api/h1").join("memory.max_usage_in_bytes"),
        "67104768\n",
    )
    .expect("write");
    fs::write(
        dir("memory/api/h1").join("memory.oom_control"),
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
    )
    .expect("write");
    fs::write(dir("pids").join("pids.events"), "max 5\n").expect("write");
    assert_eq!(
        cg.usage(),
        CgroupUsage {
            cpu_ns: 987_654_321,
            peak_memory_bytes: 67_104_768,
            oom_kills: 2,
            pids_limit_hits: 5,
        }
    );
    // An empty fake cgroup counts as emptied at once.
    assert!(cg.kill_all().expect("kill_all"));
    forget(cg);
}

/// The real v1 hierarchy of this machine, or `None` (with a note) elsewhere.
fn real_v1() -> Option<Hierarchy> {
    if !is_root() {
        eprintln!("skipping: not root");
        return None;
    }
    match Hierarchy::detect() {
        Ok(h) if h.version() == CgroupVersion::V1 => Some(h),
        Ok(h) => {
            eprintln!("skipping: host is {}", h.describe());
            None
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

/// Removes the shared `runcell` parents when the test ends (after the cgroup, declared
/// later, was dropped), even on panic.
struct ParentsGuard<'a>(&'a Hierarchy);

impl Drop for ParentsGuard<'_> {
    fn drop(&mut self) {
        remove_parents(self.0);
    }
}

fn assert_gone(paths: &[PathBuf]) {
    for p in paths {
        assert!(!p.exists(), "{} left behind", p.display());
    }
}

#[test]
fn real_v1_sweep_removes_only_empty_cgroups_of_free_leases() {
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let tag = std::process::id() % 1_000_000;
    let name = |n: u32| format!("rc-{}-{tag:x}", 4_100_000_000 + n);
    let stale = h.create(&name(1), &LIMITS).expect("create");
    let leased = h.create(&name(2), &LIMITS).expect("create");
    let busy = h.create(&name(3), &LIMITS).expect("create");
    let mut child = spawn_in(&busy, "sleep 30");
    let free = |uid: u32| uid == 4_100_000_001 || uid == 4_100_000_003;
    let per_cgroup = stale.paths().len();
    assert_eq!(
        h.sweep_stale(&free),
        per_cgroup,
        "one directory per hierarchy"
    );
    assert_gone(&stale.paths());
    // Positive controls: a held lease and a cgroup with a process stay.
    assert!(leased.paths().iter().all(|p| p.exists()));
    assert!(busy.paths().iter().all(|p| p.exists()));
    let _ = child.kill();
    let _ = child.wait();
    assert!(busy.kill_all().expect("kill_all"));
    assert_eq!(h.sweep_stale(&free), per_cgroup, "empty now");
    assert_gone(&busy.paths());
}

#[test]
fn real_v1_sweep_thaws_a_sandbox_its_killed_supervisor_left_frozen() {
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let tag = std::process::id() % 1_000_000;
    let name = |n: u32| format!("rc-{}-{tag:x}", 4_100_000_010 + n);
    let frozen = h.create(&name(1), &LIMITS).expect("create");
    let running = h.create(&name(2), &LIMITS).expect("create");
    let mut victim = spawn_in(&frozen, "sleep 30");
    let mut bystander = spawn_in(&running, "sleep 30");
    // The supervisor froze the sandbox to kill it, sent the SIGKILL, and died before the
    // thaw: the process is killed but, frozen, cannot die.
    let freezer = frozen
        .dirs
        .dir_for("freezer")
        .expect("freezer dir")
        .to_owned();
    write_raw(&freezer.join("freezer.state"), "FROZEN").expect("freeze");
    let procs = read(&freezer.join("cgroup.procs"));
    assert!(procs.contains(&child_pid(&victim).to_string()), "{procs}");
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        // SAFETY: kill(2) with the pid of a process of this test's own cgroup (the shell
        // and its sleep); no memory is touched.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    thread::sleep(Duration::from_millis(200));
    assert!(
        victim.try_wait().expect("try_wait").is_none(),
        "a frozen process does not die of SIGKILL"
    );
    let free = |uid: u32| uid == 4_100_000_011 || uid == 4_100_000_012;
    assert_eq!(
        h.sweep_stale(&free),
        frozen.paths().len(),
        "the frozen sandbox is thawed, ends and its cgroup goes"
    );
    assert_gone(&frozen.paths());
    assert!(victim.wait().expect("wait").code().is_none(), "killed");
    // Positive control: a running process in a stale-looking cgroup is left alone.
    assert!(running.paths().iter().all(|p| p.exists()));
    assert!(bystander.try_wait().expect("try_wait").is_none());
    let _ = bystander.kill();
    let _ = bystander.wait();
    assert!(running.kill_all().expect("kill_all"));
    assert_eq!(h.sweep_stale(&free), running.paths().len());
}

#[test]
fn real_v1_lifecycle() {
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("life"), &LIMITS).expect("create");
    let paths = cg.paths();
    let mem = cg.dirs.dir_for("memory").expect("memory dir");
    assert_eq!(read(&mem.join("memory.limit_in_bytes")).trim(), "67108864");
    assert_eq!(
        read(&cg.dirs.dir_for("pids").expect("pids").join("pids.max")).trim(),
        "16"
    );
    if let Some(cpu) = cg.dirs.dir_for("cpu") {
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")).trim(), "50000");
    }

    let mut child = spawn_in(&cg, "exec sleep 30");
    assert!(cg.pids().contains(&child_pid(&child)), "{:?}", cg.pids());
    assert!(cg.kill_all().expect("kill_all"));
    assert!(cg.pids().is_empty());
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    cg.remove().expect("remove");
    assert_gone(&paths);
    cg.remove().expect("second remove");
}

#[test]
fn real_v1_drop_kills_and_removes() {
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("drop"), &LIMITS).expect("create");
    let paths = cg.paths();
    let mut child = spawn_in(&cg, "sleep 30 & exec sleep 30");
    drop(cg);
    assert_gone(&paths);
    assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGKILL));
}

#[test]
fn real_v1_kill_all_stops_a_fork_loop() {
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("forks"), &LIMITS).expect("create");
    let mut child = spawn_in(&cg, "while :; do sleep 10 & done");
    std::thread::sleep(Duration::from_millis(300));
    assert!(cg.pids().len() > 1, "{:?}", cg.pids());
    assert!(cg.kill_all().expect("kill_all"));
    if let Some(freezer) = cg.dirs.dir_for("freezer") {
        assert_eq!(read(&freezer.join("freezer.state")).trim(), "THAWED");
    }
    let _ = child.wait();
    cg.remove().expect("remove");
}

#[test]
fn real_v1_memory_limit_oom_kills() {
    if !Path::new("/usr/bin/python3").exists() {
        return;
    }
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("oom"), &LIMITS).expect("create");
    let mut child = spawn_in(
        &cg,
        "exec /usr/bin/python3 -c \"b = b'x' * (200 * 1024 * 1024)\"",
    );
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let usage = cg.usage();
    eprintln!("oom test: {usage:?}");
    assert!(usage.oom_kills >= 1, "{usage:?}");
    assert!(usage.peak_memory_bytes > 32 * MIB, "{usage:?}");
    assert!(usage.peak_memory_bytes <= 64 * MIB, "{usage:?}");
    assert!(cg.kill_all().expect("kill_all"));
    cg.remove().expect("remove");
}

#[test]
fn real_v1_peak_resets_through_the_kept_open_file() {
    if !Path::new("/usr/bin/python3").exists() {
        return;
    }
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("peak"), &LIMITS).expect("create");
    // Opens the usage files before anything ran: later reads must still see new values.
    assert_eq!(cg.usage().oom_kills, 0);
    let mut child = spawn_in(
        &cg,
        "exec /usr/bin/python3 -c \"b = b'x' * (40 * 1024 * 1024)\"",
    );
    assert!(child.wait().expect("wait").success());
    let (cpu_ns, peak) = cg.cpu_and_peak();
    assert!(cpu_ns > 0);
    assert!(peak > 32 * MIB, "peak {peak}");
    assert_eq!(cg.usage().peak_memory_bytes, peak);
    // The 40 MiB are freed: a new window starts at the current usage.
    cg.reset_peak();
    let (_, after) = cg.cpu_and_peak();
    assert!(after < 32 * MIB, "peak after reset {after}");
    cg.remove().expect("remove");
}

#[test]
fn real_v1_pids_limit_is_counted() {
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("pids"), &LIMITS).expect("create");
    let mut child = spawn_in(&cg, "for i in $(seq 40); do sleep 5 & done; wait");
    let deadline = Instant::now() + Duration::from_secs(3);
    while cg.usage().pids_limit_hits == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let usage = cg.usage();
    eprintln!("pids test: {usage:?}, {} pids", cg.pids().len());
    assert!(usage.pids_limit_hits >= 1, "{usage:?}");
    assert!(cg.pids().len() <= 16, "{:?}", cg.pids());
    assert!(cg.kill_all().expect("kill_all"));
    let _ = child.wait();
    cg.remove().expect("remove");
}

#[test]
fn real_v1_cpu_quota_throttles() {
    if !Path::new("/usr/bin/python3").exists() {
        return;
    }
    let Some(h) = real_v1() else { return };
    if !h.missing_optional().is_empty() {
        eprintln!("skipping: {}", h.describe());
        return;
    }
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("cpu"), &LIMITS).expect("create");
    // Spins for 1 s of wall time; with 0.5 CPU it gets about 0.5 s of CPU.
    let mut child = spawn_in(
        &cg,
        "exec /usr/bin/python3 -c \"import time; t = time.monotonic(); \
         all(iter(lambda: time.monotonic() - t < 1, False))\"",
    );
    assert!(child.wait().expect("wait").success());
    let cpu_ns = cg.usage().cpu_ns;
    eprintln!("cpu test: {cpu_ns} ns");
    assert!(cpu_ns > 100_000_000, "cpu_ns = {cpu_ns}");
    assert!(cpu_ns <= 800_000_000, "cpu_ns = {cpu_ns}");
    cg.remove().expect("remove");
}

const JOIN_ENV: &str = "RUNCELL_CGROUP_TEST_JOIN_DIRS";

#[test]
fn real_v1_join_self_from_a_child_process() {
    if let Ok(dirs) = std::env::var(JOIN_ENV) {
        // Child mode (re-executed by the parent test below): join and wait to be killed.
        let mut cg = Cgroup::new(CgroupVersion::V1);
        for d in dirs.split('\n') {
            cg.dirs.push(CgroupDir {
                path: PathBuf::from(d),
                controllers: Vec::new(),
            });
        }
        cg.removed.store(true, Ordering::Release);
        cg.join_self().expect("join_self");
        println!("RUNCELL-JOINED");
        thread::sleep(Duration::from_secs(30));
        return;
    }
    let Some(h) = real_v1() else { return };
    let _lock = real_lock();
    let _parents = ParentsGuard(&h);
    let cg = h.create(&unique_name("join"), &LIMITS).expect("create");
    let dirs: Vec<String> = cg
        .paths()
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let test = format!(
        "{}::real_v1_join_self_from_a_child_process",
        crate_relative(module_path!())
    );
    let mut child = spawn_self_test(&test, (JOIN_ENV, dirs.join("\n")), "RUNCELL-JOINED");
    let pid = child_pid(&child);
    for file in cg.procs_files() {
        let procs = read(&file);
        assert!(
            procs.split_whitespace().any(|p| p == pid.to_string()),
            "{pid} not in {}: {procs:?}",
            file.display()
        );
    }
    assert!(cg.kill_all().expect("kill_all"));
    assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGKILL));
    cg.remove().expect("remove");
}
