//! A real `runcell serve` on a free loopback port, for the CLI's server tests: started with the
//! shared test runtime, waited for by its "serving" line (no sleeps), stopped with SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fresh data dir whose runtime is the shared, already-installed test runtime; removed
/// (after unmounting whatever is mounted beneath it) when the returned guard is dropped, on
/// success and on a failed assertion alike. A test process killed before its guards ran
/// leaves its dirs to the next test process, which removes them ([`sweep_orphans`]).
pub fn data_dir(prefix: &str) -> DataDir {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_orphans);
    let dir = runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        prefix,
    );
    let _ = std::fs::write(dir.join(OWNER_FILE), owner_stamp(std::process::id()));
    DataDir(dir)
}

/// A test's data dir, removed when dropped: what its servers left mounted (the workspaces a
/// killed or stopped server keeps, its spare images) is unmounted first, so neither the
/// directory (a 256 MiB workspace image) nor a loop device outlives the test.
pub struct DataDir(PathBuf);

impl std::ops::Deref for DataDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for DataDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        remove_data_dir(&self.0);
    }
}

/// The file in a test's data dir naming the test process that owns it (pid and start time).
const OWNER_FILE: &str = "runcell-test-owner";

/// `PID START`: the process's start time (clock ticks after boot, /proc/PID/stat field 22)
/// tells a live owner from a later process that got its pid.
fn owner_stamp(pid: u32) -> String {
    let start = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // After the command name's closing parenthesis: field 3 onwards.
            let rest = s.rsplit_once(") ")?.1.to_owned();
            rest.split(' ').nth(19).map(str::to_owned)
        })
        .unwrap_or_default();
    format!("{pid} {start}")
}

/// Removes the data dirs of test processes that are gone (killed: their guards never ran),
/// unmounting what is mounted beneath them first. Only dirs carrying [`OWNER_FILE`] are
/// touched: those this module made.
pub fn sweep_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(stamp) = std::fs::read_to_string(path.join(OWNER_FILE)) else {
            continue;
        };
        let pid: u32 = match stamp.split(' ').next().and_then(|p| p.parse().ok()) {
            Some(p) => p,
            None => continue,
        };
        if owner_stamp(pid) != stamp {
            remove_data_dir(&path);
        }
    }
}

fn remove_data_dir(dir: &Path) {
    unmount_under(dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// Unmounts everything mounted under `dir`, deepest first (a workspace bound inside another
/// mount goes before it). A loop-mounted image's device is freed with its last mount.
fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut under: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.len()));
    under.dedup();
    for m in under {
        let _ = Command::new("umount").arg("-l").arg(m).status();
    }
}

/// `runcell` on `data`.
pub fn runcell(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data).env("NO_COLOR", "1");
    c
}

/// `runcell FLAGS keys create ARGS` on `data` (`flags`: the database and key files a cluster's
/// commands share): the key it prints, once.
pub fn create_key(data: &Path, flags: &[String], args: &[&str]) -> String {
    let out = runcell(data)
        .args(flags)
        .args(["keys", "create"])
        .args(args)
        .output()
        .expect("keys create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("key")
        .to_owned()
}

pub struct Serve {
    pub child: Child,
    pub base: String,
    stopped: bool,
}

impl Serve {
    /// A server started by the test itself, answering at `base`.
    pub fn adopt(child: Child, base: String) -> Serve {
        Serve {
            child,
            base,
            stopped: false,
        }
    }

    /// `kill -9`: nothing is cleaned up, as after a crash.
    pub fn kill9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
        self.stopped = true;
    }
}

impl Drop for Serve {
    /// A graceful stop (SIGTERM): the server ends its sessions, so no workspace mount stays.
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Unmounts, when dropped, whatever is still mounted under a data dir — what a `kill -9`ed
/// server leaves on purpose (its workspace images stay mounted for the next start to adopt).
/// Without it every such test leaks its spare images' loop devices on the host.
#[allow(dead_code)] // not every test binary that includes this module kills a server
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        unmount_under(&self.0);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// `runcell serve` on `data` with `flags`.
pub fn serve(data: &Path, flags: &[&str]) -> Serve {
    serve_logging(data, flags, |_| {})
}

/// [`serve`], every later line of its log handed to `on_line` (its log is drained either way,
/// so it never blocks on a full pipe).
pub fn serve_logging(
    data: &Path,
    flags: &[&str],
    on_line: impl FnMut(String) + Send + 'static,
) -> Serve {
    serve_at(data, free_port(), flags, on_line)
}

/// [`serve_logging`] on `port` (a server that starts again where its clients know it).
pub fn serve_at(
    data: &Path,
    port: u16,
    flags: &[&str],
    on_line: impl FnMut(String) + Send + 'static,
) -> Serve {
    serve_command(runcell(data), port, flags, on_line)
}

/// `command serve --listen 127.0.0.1:PORT FLAGS`, waited for as [`serve_at`] waits (a server
/// whose data dir or working directory a test sets itself).
pub fn serve_command(
    mut command: Command,
    port: u16,
    flags: &[&str],
    mut on_line: impl FnMut(String) + Send + 'static,
) -> Serve {
    let mut child = command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(flags)
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut log = Vec::new();
    loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("serve exited early:\n{}", log.join("\n"));
        };
        if line.contains("runcell serving on") {
            break;
        }
        log.push(line);
        assert!(Instant::now() < deadline, "serve did not start");
    }
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(&mut on_line));
    Serve {
        child,
        base: format!("http://127.0.0.1:{port}"),
        stopped: false,
    }
}
