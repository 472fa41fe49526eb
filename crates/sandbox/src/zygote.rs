//! The zygote (DESIGN.md §4): one single-threaded Python per runtime that has already imported
//! the heavy modules, and forks every new Python session.
//!
//! The zygote is the runcell binary itself (`runcell __zygote`), which loads libpython with
//! `dlopen` and initialises the interpreter in-process. That keeps the isolation steps in one
//! place: the zygote plays the cold helper's part (cgroup, `clone(CLONE_NEW*)`, uid map) and its
//! child runs [`crate::pid1`]'s steps (mounts, limits) and forks the program, which takes
//! the same steps 5-7 (privileges, Landlock, seccomp) as a cold program, except that the program
//! is the forked Python itself instead of an `execve`.
//!
//! ```text
//! supervisor ──request (spec + 5 fds)──▶ zygote (host root, host namespaces)
//!     ▲                                   │ joins the cgroup, clone(CLONE_NEW*), leaves it,
//!     └────────── pidfd of pid 1 ─────────┤ writes the id maps
//!                                          ▼
//!                        pid 1: pid1.rs's steps 1-4, reports on the control socket
//!                          └─▶ program: confined, returns into the preloaded Python,
//!                                          which reseeds its RNGs and serves the kernel protocol
//! ```
//!
//! One fork of the (large) preloaded image fewer than a helper in between would cost, and no
//! Python after-fork work in pid 1, which runs no Python.
//!
//! Paths inside the preloaded Python (module files, `sys.path`, `sys.prefix`) must be valid in
//! the sandbox too, so the zygote imports in its own mount namespace in which the runtime and the
//! kernel code are bound where sandboxes see them (`/opt/runcell/...`). Once loaded it moves to
//! a private copy of the host's mount namespace, so that the sandboxes it clones are built from
//! host paths, exactly as cold ones, without copying the mounts the host gains later (one per
//! live workspace); each request brings its workspace's mount along, detached (`open_tree`).

use std::ffi::{c_char, c_int, c_void, CString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::direct::{start_pid1, ForkHooks, ForkRequest, ForkedProgram, StartError, Started};
use crate::pid1::Pid1Program;
use crate::sys::{cstr, cvt, pipe_cloexec};

/// First argument of the runcell binary that makes it a zygote.
pub const ZYGOTE_ARG: &str = "__zygote";

/// The zygote's request socket (a `SOCK_SEQPACKET` socket to the supervisor).
const REQUEST_FD: RawFd = 3;

/// Largest request: a sandbox spec (a few KiB in practice).
const MAX_REQUEST: usize = 1 << 20;

/// What a zygote preloads, and where.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ZygoteConfig {
    /// The interpreter's path as sandboxes see it; Python finds its prefix (and the venv's
    /// `pyvenv.cfg`) from it.
    pub python: PathBuf,
    /// The shared libpython matching that interpreter, e.g. `libpython3.11.so.1.0`.
    pub libpython: String,
    /// Host directories and where the zygote (and every sandbox) sees them.
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// The environment of a session (thread counts, matplotlib backend, ...): modules read it
    /// while they are imported, so the zygote imports them under the same one.
    pub env: Vec<(String, String)>,
    /// Directory of the kernel module, as sandboxes see it, and the module's name.
    pub kernel_dir: PathBuf,
    pub kernel_module: String,
    /// Modules imported before serving (`numpy`, `pandas`, `matplotlib.pyplot`, ...).
    pub preload: Vec<String>,
    /// Host directories (the workspaces' and the spare workspace images') whose mounts the
    /// zygote's spawning namespace drops: its copy of the host's namespace would otherwise keep
    /// the workspaces mounted when it started (a restarted zygote: every live session's) past
    /// their unmount on the host, holding their filesystems, and copy them into every sandbox.
    /// Each request brings its own workspace.
    #[serde(default)]
    pub detach_below: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error("cannot start the zygote {exe}")]
    Spawn {
        exe: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the zygote failed to start: {0}")]
    Preload(String),
    #[error("the zygote is gone")]
    Gone(#[source] io::Error),
    #[error("the zygote refused the request: {0}")]
    Refused(String),
    #[error("invalid zygote configuration: {0}")]
    Config(String),
}

/// The supervisor's handle on a running zygote. Requests are served one at a time.
#[derive(Debug)]
pub struct Zygote {
    inner: Mutex<Inner>,
    pid: u32,
    /// Modules the zygote holds, as reported once it was ready.
    pub preloaded: Vec<String>,
    /// Modules of the configured preload that could not be imported (the runtime lacks
    /// them), with Python's reason: left out, the zygote starts without them.
    pub skipped: Vec<(String, String)>,
}

#[derive(Debug)]
struct Inner {
    child: Child,
    socket: OwnedFd,
}

impl Zygote {
    /// Starts `init_exe __zygote` and waits until it has preloaded (which takes the time of
    /// the imports: a second or more).
    pub fn start(
        init_exe: &Path,
        config: &ZygoteConfig,
        timeout: Duration,
    ) -> Result<Zygote, ZygoteError> {
        for m in &config.preload {
            let ok = !m.is_empty()
                && m.split('.').all(|p| {
                    !p.is_empty()
                        && !p.starts_with(|c: char| c.is_ascii_digit())
                        && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            if !ok {
                return Err(ZygoteError::Config(format!("{m:?} is not a module name")));
            }
        }
        let (ours, theirs) = seqpacket_pair().map_err(|source| ZygoteError::Spawn {
            exe: init_exe.into(),
            source,
        })?;
        let theirs_fd = theirs.as_raw_fd();
        // Through a detached clone of its directory: a zygote-born program's /proc/self/exe
        // and maps name the binary `/runcell`, never by its host path (see crate::exe).
        let exe = crate::exe::InitExe::new(init_exe);
        let mut cmd = exe.command();
        cmd.arg(ZYGOTE_ARG)
            // No server secret reaches the zygote: its children become sandboxes.
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: between fork and exec; dup2 and fcntl only.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(theirs_fd, REQUEST_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let child = cmd.spawn().map_err(|source| ZygoteError::Spawn {
            exe: init_exe.into(),
            source,
        })?;
        drop(theirs);
        let pid = child.id();
        let inner = Inner {
            child,
            socket: ours,
        };
        let mut z = Zygote {
            inner: Mutex::new(inner),
            pid,
            preloaded: Vec::new(),
            skipped: Vec::new(),
        };
        let config_json =
            serde_json::to_vec(config).map_err(|e| ZygoteError::Config(e.to_string()))?;
        let reply = {
            let inner = z.inner.get_mut().unwrap_or_else(|p| p.into_inner());
            set_timeout(&inner.socket, Some(timeout)).map_err(ZygoteError::Gone)?;
            send_with_fds(inner.socket.as_fd(), &config_json, &[]).map_err(ZygoteError::Gone)?;
            let mut buf = vec![0u8; 64 << 10];
            let (n, _) = recv_with_fds(inner.socket.as_fd(), &mut buf, 0).map_err(|e| {
                ZygoteError::Preload(if e.kind() == io::ErrorKind::WouldBlock {
                    format!("not ready after {} s", timeout.as_secs())
                } else {
                    format!("it exited while preloading ({e})")
                })
            })?;
            set_timeout(&inner.socket, Some(Duration::from_secs(10))).map_err(ZygoteError::Gone)?;
            buf.truncate(n);
            buf
        };
        let text = String::from_utf8_lossy(&reply);
        match text.strip_prefix("ready ") {
            Some(rest) => {
                // `ready a,b,c`, then a line `skipped NAME REASON` per module left out.
                let mut lines = rest.split('\n');
                z.preloaded = lines
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(String::from)
                    .collect();
                z.skipped = lines
                    .filter_map(|l| l.strip_prefix("skipped "))
                    .map(|l| {
                        let (name, why) = l.split_once(' ').unwrap_or((l, ""));
                        (name.to_owned(), why.to_owned())
                    })
                    .collect();
                Ok(z)
            }
            None if text.is_empty() => {
                Err(ZygoteError::Preload("it exited while preloading".into()))
            }
            None => Err(ZygoteError::Preload(
                text.strip_prefix("error ").unwrap_or(&text).to_owned(),
            )),
        }
    }

    /// The zygote's host pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the zygote process is still there.
    pub fn is_alive(&self) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        matches!(inner.child.try_wait(), Ok(None))
    }

    /// Asks for a new sandbox running `spec`; returns a pidfd of its helper. The first five
    /// `fds` become the helper's 0-4: stdin, stdout, stderr, the control socket and the
    /// program's channel; a sixth, with `request.workspace_tree`, is the workspace's mount.
    pub(crate) fn fork_sandbox(
        &self,
        request: &ForkRequest,
        spec: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<OwnedFd, ZygoteError> {
        let header = serde_json::to_vec(request).map_err(|e| ZygoteError::Config(e.to_string()))?;
        let mut message = Vec::with_capacity(4 + header.len() + spec.len());
        message.extend_from_slice(&(header.len() as u32).to_le_bytes());
        message.extend_from_slice(&header);
        message.extend_from_slice(spec);
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        send_with_fds(inner.socket.as_fd(), &message, &raw).map_err(ZygoteError::Gone)?;
        let mut buf = [0u8; 4096];
        let (n, mut got) =
            recv_with_fds(inner.socket.as_fd(), &mut buf, 1).map_err(ZygoteError::Gone)?;
        match (&buf[..n], got.pop()) {
            (b"ok", Some(pidfd)) => Ok(pidfd),
            ([], _) => Err(ZygoteError::Gone(io::Error::from(
                io::ErrorKind::UnexpectedEof,
            ))),
            (other, _) => Err(ZygoteError::Refused(
                String::from_utf8_lossy(other).into_owned(),
            )),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        // Sessions it forked are not its children any more (their helpers were reported to
        // the supervisor, which owns them): ending the zygote ends no session.
        let _ = inner.child.kill();
        let _ = inner.child.wait();
    }
}

fn set_timeout(fd: &OwnedFd, t: Option<Duration>) -> io::Result<()> {
    let tv = match t {
        Some(t) => libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            tv_usec: t.subsec_micros() as libc::suseconds_t,
        },
        None => libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    // SAFETY: a valid timeval of the right size for SO_RCVTIMEO.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: a valid array for socketpair to fill.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// One message with descriptors attached (SCM_RIGHTS).
fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    // SAFETY: zeroed msghdr is a valid "empty" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one header carrying `fds`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: a valid header whose buffers outlive the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One message and up to `max_fds` descriptors (close-on-exec). Zero bytes means end of file.
fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE((max_fds.max(1) * 4) as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is a valid "empty" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: a valid header whose buffers outlive the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into our buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::Error::other("message truncated"));
    }
    Ok((n, fds))
}

// ---------------------------------------------------------------------------------------------
// The zygote process.

/// The few functions of the CPython C API the zygote calls, found with `dlsym`.
struct Python {
    run: unsafe extern "C" fn(*const c_char) -> c_int,
    before_fork: unsafe extern "C" fn(),
    after_fork_parent: unsafe extern "C" fn(),
    after_fork_child: unsafe extern "C" fn(),
    /// `PyRun_StringFlags(source, start, globals, locals, flags)`.
    run_string: unsafe extern "C" fn(
        *const c_char,
        c_int,
        *mut c_void,
        *mut c_void,
        *mut c_void,
    ) -> *mut c_void,
    dict_new: unsafe extern "C" fn() -> *mut c_void,
    long_as_long: unsafe extern "C" fn(*mut c_void) -> libc::c_long,
    dec_ref: unsafe extern "C" fn(*mut c_void),
    err_print: unsafe extern "C" fn(),
    err_clear: unsafe extern "C" fn(),
}

/// Entry point of `runcell __zygote`. Never returns; in a session's program process it runs the
/// kernel and exits with it.
pub fn zygote_main() -> ! {
    // SAFETY: no arguments; out of the server's process group (its Ctrl-C is not ours).
    unsafe { libc::setsid() };
    let sock = REQUEST_FD;
    // SAFETY: fd 3 was placed by the supervisor and is ours alone.
    let sock_fd = unsafe { BorrowedFd::borrow_raw(sock) };
    let mut buf = vec![0u8; MAX_REQUEST];
    let config = match recv_with_fds(sock_fd, &mut buf, 0) {
        Ok((n, _)) if n > 0 => match serde_json::from_slice::<ZygoteConfig>(&buf[..n]) {
            Ok(c) => c,
            Err(e) => exit_with(sock_fd, &format!("error invalid configuration: {e}")),
        },
        _ => exit_with(sock_fd, ""),
    };
    let (py, skipped) = match prepare(&config) {
        Ok(p) => p,
        Err(e) => exit_with(sock_fd, &format!("error {e}")),
    };
    let mut ready = format!(
        "ready {}",
        config
            .preload
            .iter()
            .filter(|m| !skipped.iter().any(|(s, _)| s == *m))
            .cloned()
            .collect::<Vec<_>>()
            .join(",")
    );
    for (name, why) in &skipped {
        // One line each: a reason's own newlines would start a line of their own.
        let why: String = why
            .chars()
            .take(500)
            .map(|c| if c == '\n' { ' ' } else { c })
            .collect();
        ready.push_str(&format!("\nskipped {name} {why}"));
    }
    let _ = send_with_fds(sock_fd, ready.as_bytes(), &[]);
    serve(&py, &config, sock_fd, &mut buf)
}

fn exit_with(sock: BorrowedFd<'_>, msg: &str) -> ! {
    if !msg.is_empty() {
        let _ = send_with_fds(sock, msg.as_bytes(), &[]);
    }
    // SAFETY: leaving; nothing to unwind.
    unsafe { libc::_exit(1) }
}

/// Its own mount namespace with the sandbox paths in place, then libpython, then the imports,
/// then back to the host's mount namespace.
/// The zygote's set-up: its namespace, Python, the imports. Returns Python and the modules
/// of the preload that could not be imported, with why.
fn prepare(config: &ZygoteConfig) -> Result<(Python, Vec<(String, String)>), String> {
    // Supplementary groups survive clone and stay usable in the user namespace: host root's
    // group 0 would open group-readable root files to every sandbox. Drop them while root.
    // SAFETY: an empty group list.
    cvt(unsafe { libc::setgroups(0, std::ptr::null()) }).map_err(|e| format!("setgroups: {e}"))?;
    // The host's mount namespace, to return to once the imports are done.
    let host_mnt =
        File::open("/proc/self/ns/mnt").map_err(|e| format!("open /proc/self/ns/mnt: {e}"))?;
    // SAFETY: a flag-only syscall in this single-threaded process.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNS) }).map_err(|e| format!("unshare: {e}"))?;
    mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    // Bind sources first, in the new namespace (a bind source must be a mount of the caller's
    // namespace), by their host paths: one of them may be under /tmp or /opt, covered next.
    let mut sources = Vec::new();
    for (src, dst) in &config.binds {
        let f = File::open(src).map_err(|e| format!("open {}: {e}", src.display()))?;
        sources.push((f, dst));
    }
    if !Path::new("/opt").is_dir() {
        std::fs::create_dir("/opt").map_err(|e| format!("mkdir /opt: {e}"))?;
    }
    mount(
        Some("runcell-zygote"),
        "/opt",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=1m"),
    )?;
    for (f, dst) in &sources {
        std::fs::create_dir_all(dst).map_err(|e| format!("mkdir {}: {e}", dst.display()))?;
        let src = format!("/proc/self/fd/{}", f.as_raw_fd());
        mount(
            Some(&src),
            &dst.to_string_lossy(),
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
        mount(
            None,
            &dst.to_string_lossy(),
            None,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )?;
    }
    drop(sources);
    // Whatever the imports write (matplotlib's font cache) stays in the zygote's own /tmp.
    mount(
        Some("runcell-zygote"),
        "/tmp",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777,size=64m"),
    )?;
    // SAFETY: single-threaded; the environment is rebuilt before anything reads it.
    unsafe { libc::clearenv() };
    for (k, v) in &config.env {
        std::env::set_var(k, v);
    }
    std::env::set_current_dir("/tmp").map_err(|e| format!("chdir /tmp: {e}"))?;

    // Every fork inherits the compiled seccomp filter.
    crate::seccomp::prebuild();
    let py = load_python(config)?;
    // The imports. Errors come back through a pipe, with Python's traceback.
    let (err_r, err_w) = pipe_cloexec().map_err(|e| format!("pipe: {e}"))?;
    let code = preload_code(config, err_w.as_raw_fd());
    let code = CString::new(code).map_err(|_| "module name contains a NUL byte".to_owned())?;
    // SAFETY: the interpreter is initialised and this thread holds the GIL.
    let rc = unsafe { (py.run)(code.as_ptr()) };
    drop(err_w);
    let mut msg = String::new();
    let _ = File::from(err_r).read_to_string(&mut msg);
    // What the preload wrote: one `skipped NAME\tREASON` line per module it could not
    // import, or a traceback (anything else) when it failed.
    let mut skipped = Vec::new();
    let mut failure = String::new();
    for line in msg.lines() {
        match line
            .strip_prefix("skipped ")
            .and_then(|l| l.split_once('\t'))
        {
            Some((name, why)) if failure.is_empty() => {
                skipped.push((name.to_owned(), why.to_owned()))
            }
            _ => {
                failure.push_str(line);
                failure.push('\n');
            }
        }
    }
    if rc != 0 || !failure.is_empty() {
        return Err(format!("preloading failed: {}", failure.trim()));
    }
    // fork() copies only the calling thread: any other thread (a BLAS pool started anyway)
    // could hold a lock that then stays locked forever in every session.
    let threads = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        .unwrap_or(0);
    if threads != 1 {
        return Err(format!(
            "the preloaded modules started threads ({threads} in all); forking would be unsafe"
        ));
    }
    // What it got shows as AnonHugePages in /proc/<zygote>/smaps_rollup.
    let _ = collapse_into_huge_pages();
    // Sandboxes are built from host paths (bind sources), as cold ones are; the zygote's own
    // namespace, with its private /tmp, goes away with this.
    // SAFETY: setns with our own descriptor in a single-threaded process.
    cvt(unsafe { libc::setns(host_mnt.as_raw_fd(), libc::CLONE_NEWNS) })
        .map_err(|e| format!("setns back to the host's mount namespace: {e}"))?;
    // ...but not the host's namespace itself: a private copy of it without the workspaces,
    // so that a clone does not copy one mount per live session.
    crate::mount::enter_spawning_copy(&config.detach_below)?;
    Ok((py, skipped))
}

fn mount(
    src: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let c = |s: &str| CString::new(s).map_err(|_| format!("{s}: NUL byte"));
    let src_c = src.map(c).transpose()?;
    let target_c = c(target)?;
    let fs_c = fstype.map(c).transpose()?;
    let data_c = data.map(c).transpose()?;
    // SAFETY: valid C strings or nulls.
    cvt(unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target_c.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    })
    .map(drop)
    .map_err(|e| {
        format!(
            "mount {} on {target} (flags {flags:#x}): {e}",
            src.unwrap_or("-")
        )
    })
}

fn load_python(config: &ZygoteConfig) -> Result<Python, String> {
    let lib = CString::new(config.libpython.as_str()).map_err(|_| "libpython: NUL byte")?;
    // RTLD_GLOBAL: extension modules (numpy's) resolve the C API against it.
    // SAFETY: loading a library by name.
    let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a C string or null.
        let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        return Err(format!(
            "cannot load {}: {} (Debian: apt-get install libpython3-dev or libpython3.X)",
            config.libpython,
            why.to_string_lossy()
        ));
    }
    let sym = |name: &std::ffi::CStr| -> Result<*mut c_void, String> {
        // SAFETY: looking up a symbol in a loaded library.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "{} lacks {}",
                config.libpython,
                name.to_string_lossy()
            ))
        } else {
            Ok(p)
        }
    };
    // SAFETY: the signatures are those of the CPython C API (stable since 3.7).
    unsafe {
        let decode: unsafe extern "C" fn(*const c_char, *mut usize) -> *mut libc::wchar_t =
            std::mem::transmute(sym(c"Py_DecodeLocale")?);
        let set_program_name: unsafe extern "C" fn(*const libc::wchar_t) =
            std::mem::transmute(sym(c"Py_SetProgramName")?);
        let initialize: unsafe extern "C" fn(c_int) = std::mem::transmute(sym(c"Py_InitializeEx")?);
        let py = Python {
            run: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char) -> c_int>(
                sym(c"PyRun_SimpleString")?,
            ),
            before_fork: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(sym(
                c"PyOS_BeforeFork",
            )?),
            after_fork_parent: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(sym(
                c"PyOS_AfterFork_Parent",
            )?),
            after_fork_child: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(sym(
                c"PyOS_AfterFork_Child",
            )?),
            run_string: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(
                    *const c_char,
                    c_int,
                    *mut c_void,
                    *mut c_void,
                    *mut c_void,
                ) -> *mut c_void,
            >(sym(c"PyRun_StringFlags")?),
            dict_new: std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *mut c_void>(
                sym(c"PyDict_New")?,
            ),
            long_as_long: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void) -> libc::c_long,
            >(sym(c"PyLong_AsLong")?),
            dec_ref: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(sym(
                c"Py_DecRef",
            )?),
            err_print: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(sym(
                c"PyErr_Print",
            )?),
            err_clear: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(sym(
                c"PyErr_Clear",
            )?),
        };
        let program = cstr(&config.python).map_err(|e| e.to_string())?;
        // The interpreter derives sys.prefix (the venv) from its program name, which must
        // outlive the interpreter: it is never freed.
        let wide = decode(program.as_ptr(), std::ptr::null_mut());
        if wide.is_null() {
            return Err("cannot decode the interpreter's path".into());
        }
        set_program_name(wide);
        // 1: Python's own signal handlers (SIGINT raises KeyboardInterrupt), as in `python3`.
        initialize(1);
        Ok(py)
    }
}

/// Python that imports the kernel and `config.preload`, then freezes the heap so the
/// collector never touches (and so copies) the shared pages in the sessions. A module of the
/// preload the runtime cannot import (an ImportError: scikit-learn not installed) is left
/// out and named on `err_fd` as `skipped NAME<TAB>REASON`: the zygote starts without it
/// rather than not at all (every session would then start cold). Any other failure, and
/// the kernel's own import, still fail it, with the traceback.
fn preload_code(config: &ZygoteConfig, err_fd: RawFd) -> String {
    let modules: Vec<String> = config.preload.iter().map(|m| format!("{m:?}")).collect();
    format!(
        r#"
def _runcell_preload():
    import gc, importlib, os, sys, traceback
    try:
        sys.argv = [""]
        sys.path.insert(0, {kdir:?})
        kernel = importlib.import_module({kmod:?})
        skipped = []
        for name in [{mods}]:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                why = " ".join(f"{{type(exc).__name__}}: {{exc}}".split())
                skipped.append(f"skipped {{name}}\t{{why}}\n")
        try:
            _runcell_warm_matplotlib(sys)
        except Exception:
            pass  # an optimisation only: sessions render their first figure themselves
        try:
            _runcell_warm_pandas(sys)
        except Exception:
            pass  # likewise
        try:
            # What every one-shot runs around its program, ten times here (the kernel module
            # says what and why; CPython 3.11 specialises a function on its eighth call); last,
            # so that it runs on the preloaded modules as a fork finds them.
            for _ in range(10):
                kernel.warm_one_shot()
        except Exception:
            pass  # likewise
        gc.collect()
        gc.freeze()
        if skipped:
            os.write({err_fd}, "".join(skipped).encode())
    except BaseException:
        os.write({err_fd}, traceback.format_exc().encode())
def _runcell_warm_matplotlib(sys):
    # One figure rendered to PNG here, so that what matplotlib builds on its first render (the
    # Agg backend and PIL's PNG writer imported, text layout and mathtext caches, the
    # renderer's lazily made state) is built once, in pages every session shares, instead of in
    # each session's own copy (~2.6 MiB per session that renders a figure). The fonts it
    # opened are dropped: an FT2Font reads its file lazily through a descriptor that a
    # sandbox's confinement closes, so a session must open its own.
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    import io
    fig, ax = pyplot.subplots()
    ax.plot([0, 1], [0, 1], label="a")
    ax.set_title("t")
    ax.set_xlabel("x")
    ax.legend()
    fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
    pyplot.close(fig)
    pyplot.close("all")
    font_manager = sys.modules.get("matplotlib.font_manager")
    if font_manager is not None and hasattr(font_manager, "_get_font"):
        font_manager._get_font.cache_clear()
def _runcell_warm_pandas(sys):
    # A small frame made, summed, grouped and printed here: pandas and numpy build caches and
    # dispatch tables on first use, which every one-shot would otherwise build again in its
    # own copy-on-write pages (~1 ms for `DataFrame(...).x.sum()`).
    pandas = sys.modules.get("pandas")
    numpy = sys.modules.get("numpy")
    if pandas is None or numpy is None:
        return
    frame = pandas.DataFrame({{"x": numpy.arange(3), "y": ["a", "b", "a"]}})
    str(frame.x.sum())
    str(frame.groupby("y").x.sum())
    str(frame.describe())
    repr(frame)
_runcell_preload()
del _runcell_preload, _runcell_warm_matplotlib, _runcell_warm_pandas
"#,
        kdir = config.kernel_dir.to_string_lossy(),
        kmod = config.kernel_module,
        mods = modules.join(", "),
    )
}

/// `madvise(2)`'s MADV_COLLAPSE (Linux 6.1): make a range's pages one transparent huge page
/// per aligned 2 MiB, now and whatever the system's THP setting.
const MADV_COLLAPSE: libc::c_int = 25;
const HUGE_PAGE: usize = 2 << 20;

/// Moves the preloaded interpreter's anonymous memory (the heap and the large anonymous
/// mappings: ~130 MiB with numpy, pandas, matplotlib and scikit-learn) onto 2 MiB pages where
/// a mapping holds whole aligned 2 MiB ranges. Returns the bytes collapsed.
///
/// Why: every sandbox is a fork of this process, and a fork copies one page-table entry per
/// 4 KiB page that has one (an exit frees them again), twice per sandbox (pid 1 and the
/// program). On this kind of VM that copy is most of a fork: ~6 ms of CPU for 200 MiB on
/// 4 KiB pages, under 1 ms on 2 MiB pages (docs/benchmarks.md). A sandbox's copy-on-write
/// stays per 4 KiB page (the kernel splits a shared huge page's mapping on the first write
/// and copies one small page), so a session costs no more memory; the zygote itself gains the
/// zeroed holes of the ranges it collapses. Only `MADV_COLLAPSE` is used, not
/// `MADV_HUGEPAGE`: a mapping marked so would make a sandbox's first touch of an empty 2 MiB
/// range allocate a whole huge page. Best effort: a kernel without it (EINVAL), a range it
/// cannot collapse (EAGAIN, ENOMEM) stay on small pages.
fn collapse_into_huge_pages() -> usize {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return 0;
    };
    let mut collapsed = 0;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        // Private and writable; anonymous or the brk heap (file mappings are not copied by a
        // fork unless written to, and collapsing them would need the page cache's help).
        let name = fields.nth(3).unwrap_or("");
        if !perms.starts_with("rw") || perms.as_bytes().get(3) != Some(&b'p') {
            continue;
        }
        if !(name.is_empty() || name == "[heap]") {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        let from = start.next_multiple_of(HUGE_PAGE);
        let to = end / HUGE_PAGE * HUGE_PAGE;
        if to <= from {
            continue;
        }
        // SAFETY: advice on a range of our own mappings; MADV_COLLAPSE keeps the contents.
        if unsafe { libc::madvise(from as *mut c_void, to - from, MADV_COLLAPSE) } == 0 {
            collapsed += to - from;
        }
    }
    collapsed
}

/// The request loop: one sandbox per request; zombies reaped as they come.
fn serve(py: &Python, config: &ZygoteConfig, sock: BorrowedFd<'_>, buf: &mut [u8]) -> ! {
    loop {
        reap_children();
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 200) };
        if r <= 0 {
            continue;
        }
        let (n, mut fds) = match recv_with_fds(sock, buf, 6) {
            Ok((0, _)) | Err(_) => {
                // The supervisor is gone; so is the reason to exist.
                // SAFETY: leaving.
                unsafe { libc::_exit(0) }
            }
            Ok(x) => x,
        };
        let request = split_request(&buf[..n]);
        let tree = match &request {
            Some((r, _)) if r.workspace_tree && fds.len() == 6 => fds.pop(),
            _ => None,
        };
        let outcome = match (request, <[OwnedFd; 5]>::try_from(fds)) {
            (Some((request, _)), _) if request.workspace_tree && tree.is_none() => {
                Err("a request with the workspace's mount carries 6 descriptors".to_owned())
            }
            (Some((request, spec)), Ok(fds)) => {
                let raw = [0, 1, 2, 3, 4].map(|i| fds[i].as_raw_fd());
                let after_fork = || {
                    // SAFETY: in the program, right after its fork from pid 1, which ran no
                    // Python since the zygote's PyOS_BeforeFork.
                    unsafe { (py.after_fork_child)() }
                };
                let hooks = ForkHooks {
                    // SAFETY: this process is single-threaded (checked after preloading) and
                    // holds the GIL; PyOS_BeforeFork/AfterFork keep the interpreter's locks
                    // consistent across the clone.
                    before: &|| unsafe { (py.before_fork)() },
                    // SAFETY: as above, in the parent right after the clone.
                    after_in_parent: &|| unsafe { (py.after_fork_parent)() },
                };
                let started = start_pid1(
                    &request,
                    spec,
                    raw,
                    tree.as_ref().map(|t| t.as_raw_fd()),
                    Pid1Program::Continue(&after_fork),
                    Some(hooks),
                );
                match started {
                    Ok(Started::Caller(_, pidfd)) => Ok(pidfd),
                    Ok(Started::Program(argv)) => match request.program {
                        ForkedProgram::Kernel => run_kernel(py, config),
                        ForkedProgram::Main => run_main(py, config, Some(&argv)),
                        ForkedProgram::MainWhenTold => run_main(py, config, None),
                    },
                    // Not our cgroup any more: the next session's kill_all would end us anyway.
                    Err(StartError::StuckInCgroup(e)) => exit_with(sock, &e),
                    Err(StartError::Failed(e)) => Err(e),
                }
            }
            (None, _) => Err("malformed request".to_owned()),
            (_, Err(_)) => Err("a request carries 5 descriptors and the workspace's".to_owned()),
        };
        // The spec (the session's environment, its paths) must not reach the next fork, where a
        // shorter request would leave its tail readable in that session's memory.
        for b in buf[..n].iter_mut() {
            // SAFETY: a valid byte of our own buffer; volatile so the clearing is not elided.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
        match outcome {
            Ok(pidfd) => {
                let _ = send_with_fds(sock, b"ok", &[pidfd.as_raw_fd()]);
            }
            Err(e) => {
                let _ = send_with_fds(sock, e.as_bytes(), &[]);
            }
        }
    }
}

/// `[u32 length][ForkRequest JSON][spec]` split into the parsed header and the spec's bytes.
fn split_request(message: &[u8]) -> Option<(ForkRequest, &[u8])> {
    let len = u32::from_le_bytes(message.get(..4)?.try_into().ok()?) as usize;
    let header = message.get(4..4usize.checked_add(len)?)?;
    let request = serde_json::from_slice(header).ok()?;
    Some((request, &message[4 + len..]))
}

fn reap_children() {
    loop {
        // SAFETY: reaping any exited child without blocking.
        let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if r <= 0 {
            return;
        }
    }
}

/// In the program's process (a fork of pid 1, confined): the preloaded Python takes the
/// session's environment, reseeds, and runs the kernel. Never returns.
fn run_kernel(py: &Python, config: &ZygoteConfig) -> ! {
    // The program, confined. Its process is a copy of the zygote: reseed what must differ
    // between sessions, take the session's environment, and serve the kernel protocol.
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let env_hex: String = serde_json::to_vec(&env)
        .unwrap_or_default()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let code = format!(
        r#"
import json as _json, os as _os, sys as _sys
_os.environ.clear()
_os.environ.update(_json.loads(bytes.fromhex("{env_hex}")))
del _json, _os
import {kmod} as _runcell_kernel
_sys.exit(_runcell_kernel.main())
"#,
        kmod = config.kernel_module,
    );
    let code = CString::new(code).unwrap_or_default();
    // SAFETY: the interpreter is initialised in this process (inherited) and we hold the GIL.
    let rc = unsafe { (py.run)(code.as_ptr()) };
    // PyRun_SimpleString handles SystemExit by exiting the process; getting here means an
    // uncaught exception (already printed to stderr).
    // SAFETY: leaving.
    unsafe { libc::_exit(if rc == 0 { 0 } else { 1 }) }
}

/// Largest argv a prepared one-shot accepts on its channel: 64 arguments of 4,096 characters
/// (the engine's bound) of up to 4 bytes each, and room for the JSON around them.
const MAX_TOLD_ARGV: u64 = 2 << 20;

/// In a prepared one-shot's program (confined, the channel at fd 3): the run's argv, sent by the
/// supervisor when the run is asked for; the channel is closed before the program runs, as a
/// `python3 FILE` has nothing open beyond its standard streams. Leaves quietly when the
/// supervisor hangs up instead (a prepared sandbox never used) or sends nonsense.
fn told_argv() -> Vec<String> {
    // SAFETY: fd 3 is the channel, placed by pid 1 for this process alone.
    let channel = unsafe { File::from_raw_fd(3) };
    let mut text = Vec::new();
    let read = channel.take(MAX_TOLD_ARGV).read_to_end(&mut text);
    match (read, serde_json::from_slice::<Vec<String>>(&text)) {
        (Ok(_), Ok(argv)) if argv.len() >= 2 => argv,
        // SAFETY: leaving without running anything.
        _ => unsafe { libc::_exit(0) },
    }
}

/// Hex of the JSON of `value`: a literal that Python code can carry whatever the bytes.
fn json_hex<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_vec(value)
        .unwrap_or_default()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// In the program's process of a one-shot run: the preloaded Python runs `argv[1]` as
/// `python3 argv[1] argv[2..]` would, as `__main__` (the kernel module's `run_one_shot`, which
/// says how). `argv` is `None` for a prepared one-shot: what does not depend on the program is
/// done first, then the argv awaited on the channel. Never returns.
fn run_main(py: &Python, config: &ZygoteConfig, argv: Option<&[String]>) -> ! {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let prepare = format!(
        "prepare_one_shot(__import__('json').loads(bytes.fromhex({env:?})), {kdir:?})",
        env = json_hex(&env),
        kdir = config.kernel_dir.to_string_lossy(),
    );
    if call_kernel(py, config, &prepare).is_none() {
        // SAFETY: leaving (the traceback is on stderr).
        unsafe { libc::_exit(1) }
    }
    let told;
    let argv = match argv {
        Some(a) => a,
        None => {
            told = told_argv();
            &told
        }
    };
    let run = format!(
        "run_one_shot(__import__('json').loads(bytes.fromhex({argv:?})))",
        argv = json_hex(&argv),
    );
    match call_kernel(py, config, &run) {
        Some(status) => exit_before_teardown(status as c_int & 0xFF),
        // SAFETY: only a failure of the runner itself gets here (its traceback printed).
        None => unsafe { libc::_exit(1) },
    }
}

/// Evaluates `call` on the kernel module (`runcell_kernel.CALL`) and returns the result as an
/// integer (0 for anything else); `None` if it raised, with the traceback printed to stderr.
fn call_kernel(py: &Python, config: &ZygoteConfig, call: &str) -> Option<i64> {
    let expr = format!(
        "__import__('sys').modules[{kmod:?}].{call}",
        kmod = config.kernel_module
    );
    let expr = CString::new(expr).ok()?;
    // SAFETY: the interpreter is initialised in this process (inherited) and we hold the GIL;
    // the dict and the result are new references, released here.
    unsafe {
        let globals = (py.dict_new)();
        if globals.is_null() {
            (py.err_print)();
            return None;
        }
        let result = (py.run_string)(
            expr.as_ptr(),
            PY_EVAL_INPUT,
            globals,
            globals,
            std::ptr::null_mut(),
        );
        (py.dec_ref)(globals);
        if result.is_null() {
            (py.err_print)();
            return None;
        }
        let n = (py.long_as_long)(result);
        (py.dec_ref)(result);
        if n == -1 {
            // Not an int (None) or -1 itself: either way, clear what AsLong may have raised.
            (py.err_clear)();
        }
        Some(if n == -1 { 0 } else { n as i64 })
    }
}

/// `Py_eval_input`: the start symbol of a single expression.
const PY_EVAL_INPUT: c_int = 258;

/// Exits with `status` so that pid 1 hears of the exit before the kernel frees this process's
/// memory. A fork of the zygote maps its whole image (~200 MiB with the data stack); the exit
/// of the last process holding an address space tears it down before the exit is reported to
/// the parent (2-8 ms here: each page's mapping undone), so pid 1, and the answer, would wait
/// for it. Instead a holder process shares this address space (`CLONE_VM`): this process's exit
/// only drops a reference and is reported at once; the holder, with nothing open and every
/// signal blocked, waits to be killed with the namespace (pid 1 kills every process before it
/// reports), and the teardown happens in its exit, after the answer. The standard streams are
/// closed first (they are flushed), so the host sees their end now too. Without a holder (no
/// pid left under the sandbox's bound) the exit is the ordinary one.
fn exit_before_teardown(status: c_int) -> ! {
    const STACK: usize = 64 << 10;
    // SAFETY: the program's output is flushed and nothing more is written; closing every
    // descriptor takes integers only. The stack is a fresh private mapping of ours; `hold`
    // touches nothing but its own frame and the signal mask.
    unsafe {
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        let stack = libc::mmap(
            std::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack != libc::MAP_FAILED {
            libc::clone(
                hold,
                stack.cast::<u8>().add(STACK).cast(),
                libc::CLONE_VM | libc::SIGCHLD,
                std::ptr::null_mut(),
            );
        }
        libc::_exit(status)
    }
}

/// The holder of [`exit_before_teardown`]: every signal blocked (SIGKILL cannot be), then
/// asleep until killed.
extern "C" fn hold(_: *mut c_void) -> c_int {
    // SAFETY: a filled signal set on our own stack; pause sleeps until a signal arrives, and
    // only SIGKILL can, which ends the process.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        loop {
            libc::pause();
        }
    }
}

/// The libpython soname for a Python `X.Y`.
pub fn libpython_for(version: &str) -> String {
    format!("libpython{version}.so.1.0")
}
