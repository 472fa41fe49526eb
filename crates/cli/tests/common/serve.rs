//! A real `runcell serve` on a free loopback port, for the CLI's server tests: started with the
//! shared test runtime, waited for by its "serving" line (no sleeps), stopped with SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fresh data dir whose runtime is the shared, already-installed test runtime.
pub fn data_dir(prefix: &str) -> PathBuf {
    runcell_engine::testing::data_dir_with_runtime(Path::new(env!("CARGO_TARGET_TMPDIR")), prefix)
}

/// `runcell` on `data`.
pub fn runcell(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data).env("NO_COLOR", "1");
    c
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
        let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
            return;
        };
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| Path::new(m).starts_with(&self.0))
            .collect();
        // Deepest first: a workspace bound inside another mount goes before it.
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
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
    mut on_line: impl FnMut(String) + Send + 'static,
) -> Serve {
    let mut child = runcell(data)
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
