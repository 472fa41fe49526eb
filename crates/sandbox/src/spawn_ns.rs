//! The mount namespace cold sandboxes are cloned from, when the supervisor is a server.
//!
//! A cold sandbox's helper is exec'd by the (multi-threaded) supervisor and clones pid 1 with
//! `CLONE_NEWNS`, which copies every mount of the helper's namespace. In the host's namespace
//! there is one mount for every live workspace, so cold sandboxes (bash and JavaScript
//! sessions, `"start": "cold"` one-shots) got slower the more sessions lived, as zygote-born
//! ones did before the zygote moved into a copy without them (`crate::zygote`). The helper now
//! joins such a copy before it execs (`setns` between fork and exec), and takes the workspace's
//! mount along, detached ([`crate::mount::clone_tree`]), for pid 1 to attach.
//!
//! The namespace is made once, by a short-lived exec of the init binary ([`holder_main`]: the
//! supervisor's threads make forking code that reads files unsafe), and kept by a descriptor of
//! it: a namespace lives as long as a descriptor to it does. It is made on the first cold spawn
//! that needs it, so that a `runcell run`, which plays the helper itself and never execs one,
//! does not pay for it. Where it cannot be made (no privilege to make a mount namespace outside
//! a user namespace: the server is not root), helpers stay in the host's namespace, as before.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;

use crate::exe::InitExe;

/// The first argument that turns a runcell binary into the namespace's maker.
pub(crate) const SPAWN_NS_ARG: &str = "__sandbox-spawn-ns";

/// The directories whose mounts the namespace leaves out, and the namespace once made.
#[derive(Debug, Default)]
pub(crate) struct SpawnNamespace {
    detach_below: Vec<PathBuf>,
    made: OnceLock<Result<OwnedFd, String>>,
}

impl SpawnNamespace {
    pub(crate) fn new(detach_below: Vec<PathBuf>) -> SpawnNamespace {
        SpawnNamespace {
            detach_below,
            made: OnceLock::new(),
        }
    }

    /// The namespace, made on first use; `Err` (kept: it is not retried) when it cannot be;
    /// `None` when none is wanted (no directories to leave out were named).
    pub(crate) fn get(&self, init_exe: &InitExe) -> Option<Result<&OwnedFd, &str>> {
        if self.detach_below.is_empty() {
            return None;
        }
        let made = self.made.get_or_init(|| make(init_exe, &self.detach_below));
        Some(made.as_ref().map_err(String::as_str))
    }
}

/// Execs the init binary as [`holder_main`], waits for its namespace to be ready, keeps a
/// descriptor of it, and lets the process end.
fn make(init_exe: &InitExe, detach_below: &[PathBuf]) -> Result<OwnedFd, String> {
    let mut child = init_exe
        .command()
        .arg(SPAWN_NS_ARG)
        .args(detach_below)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("exec {}: {e}", init_exe.path().display()))?;
    let result = (|| {
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("read its answer: {e}"))?;
        if line.trim_end() != "ready" {
            return Err(line.trim_end().to_owned());
        }
        std::fs::File::open(format!("/proc/{}/ns/mnt", child.id()))
            .map(OwnedFd::from)
            .map_err(|e| format!("open its namespace: {e}"))
    })();
    // End of its stdin: it may go (the namespace stays with our descriptor).
    drop(child.stdin.take());
    let _ = child.wait();
    result.map_err(|e| format!("the cold sandboxes' mount namespace: {e}"))
}

/// `runcell __sandbox-spawn-ns DIR...`: enters a private copy of the mount namespace without the
/// mounts below the `DIR`s, says `ready` on stdout and waits for the end of stdin, so that its
/// parent can take hold of the namespace. Says why on stdout when it cannot.
pub(crate) fn holder_main(dirs: Vec<PathBuf>) -> ! {
    let answer = match crate::mount::enter_spawning_copy(&dirs) {
        Ok(()) => "ready".to_owned(),
        Err(e) => e.replace('\n', " "),
    };
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{answer}");
    let _ = out.flush();
    drop(out);
    let mut sink = Vec::new();
    let _ = io::Read::read_to_end(&mut io::stdin().lock(), &mut sink);
    std::process::exit(0)
}

/// Between fork and exec of a helper: joins the namespace. Only a system call: no allocation.
/// `ns` is the raw descriptor of the [`SpawnNamespace`]'s namespace, which outlives the call.
pub(crate) fn join(ns: RawFd) -> io::Result<()> {
    // SAFETY: setns with a namespace descriptor the parent owns; the caller is the
    // single-threaded child of a fork, whose filesystem context (root, cwd) is its own.
    if unsafe { libc::setns(ns, libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
