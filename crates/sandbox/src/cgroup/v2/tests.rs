//! cgroup v2 through the [`Hierarchy`] and [`Cgroup`] it creates: fake hierarchies in a
//! temporary directory (a hook stands in for the kernel), and the real unified mount when this
//! host has one.

use super::super::dirs::CgroupDir;
use super::super::testutil::{
    child_pid, fake_cgroup, is_root, read, real_lock, spawn_in, unique_name,
};
use super::super::{Cgroup, CgroupUsage, CgroupVersion, Hierarchy, Kind};
use super::*;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

const LIMITS: CgroupLimits = CgroupLimits {
    memory_bytes: 64 << 20,
    pids: 16,
    cpu_millis: 500,
};

/// Stands in for the kernel on mkdir: a new cgroup offers the controllers its parent
/// enabled in `cgroup.subtree_control`, with their interface files.
fn fake_kernel_mkdir(dir: &Path) {
    let offered = dir
        .parent()
        .map(|p| read_controller_list(&p.join("cgroup.subtree_control")))
        .unwrap_or_default();
    let mut files = vec![
        "cgroup.procs",
        "cgroup.subtree_control",
        "cgroup.kill",
        "cgroup.type",
        "cgroup.events",
        "cpu.stat",
    ];
    let has = |c: &str| offered.iter().any(|o| o == c);
    if has("memory") {
        files.extend([
            "memory.max",
            "memory.swap.max",
            "memory.oom.group",
            "memory.peak",
            "memory.current",
            "memory.events",
        ]);
    }
    if has("pids") {
        files.extend(["pids.max", "pids.events"]);
    }
    if has("cpu") {
        files.push("cpu.max");
    }
    for file in files {
        let path = dir.join(file);
        if !path.exists() {
            fs::write(&path, "").expect("fake kernel file");
        }
    }
    let controllers = dir.join("cgroup.controllers");
    if !controllers.exists() {
        fs::write(controllers, offered.join(" ")).expect("fake controllers");
    }
}

/// A fake cgroup2 mount at `<tmp>/cg` offering `controllers`, with our own cgroup `svc`
/// (to which the root already delegates `delegated`).
fn fake_mount(tmp: &Path, controllers: &str, delegated: &str) -> (PathBuf, PathBuf) {
    let root = tmp.join("cg");
    fake_cgroup(
        &root,
        &["cgroup.procs", "cgroup.subtree_control", "cpu.stat"],
    );
    fs::write(root.join("cgroup.controllers"), controllers).expect("write");
    let own = root.join("svc");
    fake_cgroup(
        &own,
        &["cgroup.procs", "cgroup.subtree_control", "cgroup.type"],
    );
    fs::write(own.join("cgroup.controllers"), delegated).expect("write");
    (root, own)
}

fn fake_hierarchy(parent: PathBuf, busy: Vec<PathBuf>) -> Hierarchy {
    let mut h = V2Hierarchy::at(parent);
    h.mkdir_hook = Some(fake_kernel_mkdir);
    h.busy = busy;
    Hierarchy { kind: Kind::V2(h) }
}

/// Marks a fake cgroup removed: its fake `cgroup.procs` must never lead to real kills, and
/// rmdir cannot remove directories holding regular files anyway (the tempdir cleans up).
fn forget(cg: Cgroup) {
    cg.removed.store(true, Ordering::Release);
}

#[test]
fn fake_create_enables_controllers_and_writes_limits() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, own) = fake_mount(tmp.path(), "cpuset cpu io memory hugetlb pids", "");
    fs::write(own.join("cgroup.controllers"), "cpu memory pids").expect("write");
    let parent = own.join("runcell");
    let h = fake_hierarchy(parent.clone(), Vec::new());
    assert_eq!(h.version(), CgroupVersion::V2);
    assert_eq!(
        h.describe(),
        format!("v2 at {} (memory pids cpu)", parent.display())
    );

    let cg = h.create("run-1", &LIMITS).expect("create");
    let dir = parent.join("run-1");
    assert_eq!(cg.paths(), vec![dir.clone()]);
    assert_eq!(cg.procs_files(), vec![dir.join("cgroup.procs")]);
    for d in [&root, &own, &parent] {
        assert_eq!(
            read(&d.join("cgroup.subtree_control")),
            "+memory +pids +cpu",
            "{}",
            d.display()
        );
    }
    assert_eq!(read(&dir.join("memory.max")), "67108864");
    assert_eq!(read(&dir.join("memory.swap.max")), "0");
    assert_eq!(read(&dir.join("pids.max")), "16");
    assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
    assert_eq!(read(&dir.join("memory.oom.group")), "1");

    // The parent is prepared once; a second run reuses it. Unlimited CPU is "max".
    fs::write(parent.join("cgroup.subtree_control"), "memory pids cpu").expect("write");
    let unlimited = CgroupLimits {
        cpu_millis: 0,
        ..LIMITS
    };
    let cg2 = h.create("run-2", &unlimited).expect("create");
    assert_eq!(read(&parent.join("run-2/cpu.max")), "max 100000");
    assert_eq!(
        read(&parent.join("cgroup.subtree_control")),
        "memory pids cpu"
    );

    // Same name twice is refused.
    let err = h.create("run-1", &LIMITS).expect_err("duplicate created");
    assert!(matches!(err, CgroupError::CreateDir { .. }), "{err}");
    forget(cg);
    forget(cg2);
}

#[test]
fn fake_concurrent_creators_share_the_parent() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_root, own) = fake_mount(tmp.path(), "memory pids cpu", "memory pids cpu");
    let h = fake_hierarchy(own.join("runcell"), Vec::new());
    let cgroups: Vec<Cgroup> = thread::scope(|s| {
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
    for (i, cg) in cgroups.into_iter().enumerate() {
        assert_eq!(cg.paths(), vec![own.join(format!("runcell/c{i}"))]);
        forget(cg);
    }
}

#[test]
fn fake_already_enabled_controllers_are_not_rewritten() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, own) = fake_mount(tmp.path(), "memory pids cpu", "memory pids cpu");
    fs::write(root.join("cgroup.subtree_control"), "memory pids cpu").expect("write");
    fs::write(own.join("cgroup.subtree_control"), "pids memory").expect("write");
    // A parent left by an earlier supervisor (a real kernel would show all three enabled
    // in `svc` after the write; the fake file only keeps the last write).
    let parent = own.join("runcell");
    fake_cgroup(&parent, &["cgroup.procs"]);
    fs::write(parent.join("cgroup.controllers"), "memory pids cpu").expect("write");
    fs::write(parent.join("cgroup.subtree_control"), "memory pids cpu").expect("write");
    let h = fake_hierarchy(parent, Vec::new());
    let cg = h.create("x", &LIMITS).expect("create");
    assert_eq!(
        read(&root.join("cgroup.subtree_control")),
        "memory pids cpu"
    );
    // Only the missing one is added.
    assert_eq!(read(&own.join("cgroup.subtree_control")), "+cpu");
    forget(cg);
}

#[test]
fn fake_without_cpu_is_degraded_but_works() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, own) = fake_mount(tmp.path(), "memory pids io", "memory pids");
    let h = fake_hierarchy(own.join("runcell"), Vec::new());
    assert_eq!(h.missing_optional(), vec!["cpu"]);
    assert_eq!(
        h.describe(),
        format!(
            "v2 at {} (memory pids); degraded, missing: cpu",
            own.join("runcell").display()
        )
    );
    let cg = h.create("x", &LIMITS).expect("create");
    assert_eq!(read(&root.join("cgroup.subtree_control")), "+memory +pids");
    let dir = own.join("runcell/x");
    assert_eq!(read(&dir.join("memory.max")), "67108864");
    assert!(!dir.join("cpu.max").exists());
    forget(cg);
}

#[test]
fn fake_busy_own_cgroup_falls_back_to_root() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, own) = fake_mount(tmp.path(), "memory pids cpu", "memory pids cpu");
    let h = fake_hierarchy(own.join("runcell"), vec![own.clone()]);
    let cg = h.create("x", &LIMITS).expect("create");
    let fallback = root.join("runcell");
    assert_eq!(cg.paths(), vec![fallback.join("x")]);
    assert!(!own.join("runcell").exists());
    assert_eq!(
        read(&root.join("cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert_eq!(
        read(&fallback.join("cgroup.subtree_control")),
        "+memory +pids +cpu"
    );
    assert_eq!(read(&fallback.join("x/pids.max")), "16");
    assert!(h
        .describe()
        .starts_with(&format!("v2 at {} ", fallback.display())));
    forget(cg);
}

#[test]
fn fake_busy_root_parent_is_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, _own) = fake_mount(tmp.path(), "memory pids cpu", "");
    let parent = root.join("runcell");
    fake_kernel_mkdir_after_enable(&root, &parent);
    let h = fake_hierarchy(parent.clone(), vec![parent]);
    let err = h.create("x", &LIMITS).expect_err("created");
    assert!(err.is_busy(), "{err}");
}

fn fake_kernel_mkdir_after_enable(root: &Path, dir: &Path) {
    fs::write(root.join("cgroup.subtree_control"), "memory pids cpu").expect("write");
    fs::create_dir(dir).expect("mkdir");
    fake_kernel_mkdir(dir);
}

#[test]
fn fake_missing_memory_controller_is_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_root, own) = fake_mount(tmp.path(), "pids cpu", "pids cpu");
    let h = fake_hierarchy(own.join("runcell"), Vec::new());
    assert_eq!(
        h.describe(),
        format!(
            "v2 at {} (pids cpu); unusable, missing: memory",
            own.join("runcell").display()
        )
    );
    let err = h.create("x", &LIMITS).expect_err("created");
    assert!(
        matches!(
            err,
            CgroupError::ControllerUnavailable {
                controller: "memory",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn v2_at_finds_the_mount_root() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, own) = fake_mount(tmp.path(), "memory pids", "");
    let h = V2Hierarchy::at(own.join("runcell"));
    assert_eq!(h.root, root);
    assert_eq!(h.available, vec!["memory", "pids"]);
    let h = V2Hierarchy::at(root.clone());
    assert_eq!(h.root, root);
    let h = V2Hierarchy::at(root.join("runcell"));
    assert_eq!(h.root, root);
}

#[test]
fn fake_usage_parsing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("run");
    fake_cgroup(&dir, &["cgroup.procs"]);
    // Usage files are opened once per Cgroup (a real cgroup has them all from the start),
    // so each state of the fake directory gets a fresh Cgroup.
    let fresh = || {
        let mut cg = Cgroup::new(CgroupVersion::V2);
        cg.dirs.push(CgroupDir {
            path: dir.clone(),
            controllers: CONTROLLERS.to_vec(),
        });
        cg
    };
    // Nothing there: all zero.
    let cg = fresh();
    assert_eq!(cg.usage(), CgroupUsage::default());
    forget(cg);

    fs::write(
        dir.join("cpu.stat"),
        "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 3\n",
    )
    .expect("write");
    fs::write(dir.join("memory.peak"), "52428800\n").expect("write");
    fs::write(dir.join("memory.current"), "4096\n").expect("write");
    fs::write(
        dir.join("memory.events"),
        "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 1\n",
    )
    .expect("write");
    fs::write(dir.join("pids.events"), "max 4\n").expect("write");
    let cg = fresh();
    assert_eq!(
        cg.usage(),
        CgroupUsage {
            cpu_ns: 1_234_567_000,
            peak_memory_bytes: 52_428_800,
            oom_kills: 1,
            pids_limit_hits: 4,
        }
    );
    // The cheap reads agree with the full one.
    assert_eq!(cg.cpu_and_peak(), (1_234_567_000, 52_428_800));
    assert_eq!(cg.pids_limit_hits(), 4);
    // Values change under an open file: each read is a fresh one.
    fs::write(dir.join("pids.events"), "max 12\n").expect("write");
    assert_eq!(cg.pids_limit_hits(), 12);
    forget(cg);
    // Kernels before 5.19 have no memory.peak: current usage instead.
    fs::remove_file(dir.join("memory.peak")).expect("rm");
    let cg = fresh();
    assert_eq!(cg.usage().peak_memory_bytes, 4096);

    // pids() reads cgroup.procs of the cgroup and its descendants. (These pids are above
    // the kernel's pid_max, so nothing real is ever addressed.)
    fs::write(dir.join("cgroup.procs"), "2100000001\n2100000003\n").expect("write");
    fake_cgroup(&dir.join("child"), &[]);
    fs::write(dir.join("child/cgroup.procs"), "2100000002\n").expect("write");
    assert_eq!(cg.pids(), vec![2_100_000_001, 2_100_000_002, 2_100_000_003]);
    forget(cg);
}

#[test]
fn fake_remove_is_idempotent() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_root, own) = fake_mount(tmp.path(), "memory pids cpu", "memory pids cpu");
    let h = fake_hierarchy(own.join("runcell"), Vec::new());
    let cg = h.create("x", &LIMITS).expect("create");
    let dir = own.join("runcell/x");
    assert!(cg.kill_all().expect("kill_all"), "empty cgroup not empty");
    // A real kernel removes the interface files with the directory; a fake tree needs help.
    for entry in fs::read_dir(&dir).expect("ls") {
        fs::remove_file(entry.expect("entry").path()).expect("rm");
    }
    fs::create_dir(dir.join("nested")).expect("mkdir");
    cg.remove().expect("remove");
    assert!(!dir.exists());
    cg.remove().expect("second remove");
    drop(cg);
    assert!(own.join("runcell").is_dir(), "the shared parent stays");
}

/// The unified mount of this hybrid development machine has no controllers, but cgroup.kill
/// and cpu.stat exist in every non-root cgroup (kernel >= 5.14).
fn real_unified() -> Option<PathBuf> {
    let mount = PathBuf::from("/sys/fs/cgroup/unified");
    let controllers = fs::read_to_string(mount.join("cgroup.controllers")).ok()?;
    if !is_root() || controllers.split_whitespace().any(|c| c == "memory") {
        eprintln!("skipping: no root or no controller-less unified mount");
        return None;
    }
    Some(mount)
}

#[test]
fn real_unified_without_controllers_fails_cleanly() {
    let Some(mount) = real_unified() else { return };
    let _lock = real_lock();
    let parent = mount.join(unique_name("v2parent"));
    let h = Hierarchy::v2_at(parent.clone());
    assert_eq!(h.missing_optional(), vec!["cpu"]);
    let result = h.create("x", &LIMITS);
    let cleanup = fs::remove_dir(&parent);
    let err = result.expect_err("created without a memory controller");
    assert!(
        matches!(
            err,
            CgroupError::ControllerUnavailable {
                controller: "memory",
                ..
            }
        ),
        "{err}"
    );
    // The half-made run cgroup was removed; then so could the parent be.
    cleanup.expect("remove parent");
}

#[test]
fn real_unified_cgroup_kill_empties_the_cgroup() {
    let Some(mount) = real_unified() else { return };
    let _lock = real_lock();
    let dir = mount.join(unique_name("v2kill"));
    let mut cg = Cgroup::new(CgroupVersion::V2);
    cg.dirs
        .add(dir.clone(), CONTROLLERS.to_vec())
        .expect("mkdir");
    assert!(dir.join("cgroup.kill").exists());

    // CPU accounting works without the cpu controller.
    let mut busy = spawn_in(&cg, "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done");
    assert!(busy.wait().expect("wait").success());
    assert!(cg.usage().cpu_ns > 1_000_000, "{:?}", cg.usage());

    let mut child = spawn_in(&cg, "sleep 30 & sleep 30 & wait");
    let deadline = Instant::now() + Duration::from_secs(5);
    while cg.pids().len() < 3 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let pids = cg.pids();
    assert!(pids.contains(&child_pid(&child)), "{pids:?}");
    assert_eq!(pids.len(), 3, "{pids:?}");

    assert!(cg.kill_all().expect("kill_all"));
    assert!(cg.pids().is_empty());
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    cg.remove().expect("remove");
    assert!(!dir.exists());
    cg.remove().expect("idempotent");
}

#[test]
fn real_unified_drop_kills_and_removes() {
    let Some(mount) = real_unified() else { return };
    let _lock = real_lock();
    let dir = mount.join(unique_name("v2drop"));
    let mut cg = Cgroup::new(CgroupVersion::V2);
    cg.dirs
        .add(dir.clone(), CONTROLLERS.to_vec())
        .expect("mkdir");
    let mut child = spawn_in(&cg, "exec sleep 30");
    drop(cg);
    assert!(!dir.exists());
    let status = child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}
