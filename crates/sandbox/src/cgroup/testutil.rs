//! Helpers shared by the tests of the v1 and v2 modules.

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::{Cgroup, Hierarchy};
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
