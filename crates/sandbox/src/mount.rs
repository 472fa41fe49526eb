//! Step 3: the sandbox's file system. A tmpfs root holding only what the program needs:
//! read-only, nosuid, nodev binds of the system directories, a curated /etc, /workspace
//! read-write, size-limited /tmp and /dev/shm, a minimal /dev, a fresh /proc and no /sys.
//! Then pivot_root into it and detach the host's tree.
//!
//! Every bind source is opened (O_PATH) by pid 1 while it still has the helper's host uid 0
//! ([`plan`], before step 1 switches to the sandbox user), then bound through
//! `/proc/self/fd/N` ([`build_root`]). So a source under a directory only its owner, root, may
//! traverse (the data dir in /root) or one the new root's tmpfs would hide (a workspace under the
//! host's /tmp) still binds, and no path is resolved twice. (The helper cannot open them for us:
//! a bind source must belong to the caller's own mount namespace.)

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{symlink, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::spec::{Spec, HOSTNAME, SANDBOX_UID, SANDBOX_USER, WORKSPACE};

/// Where E2B's sandboxes keep the user's files: the workspace, bound a second time.
const E2B_HOME: &str = "/home/user";
use crate::sys::{cstr, cvt};

/// The mount point used for the new root before pivot_root. Only this mount namespace sees it.
const NEW_ROOT: &str = "/tmp";

/// Host system directories bound read-only (or re-created as the same symlink, for merged-/usr
/// systems where /bin -> usr/bin). Who needs them: every dynamically linked program.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Host files and directories from /etc that are safe to share, read-only. Never the rest of
/// the host's /etc (shadow, ssh keys, the server's configuration).
const ETC_SHARED: &[(&str, &str)] = &[
    (
        "/etc/ld.so.cache",
        "dynamic loader: finds libraries in multiarch directories",
    ),
    ("/etc/localtime", "time zone for date/time libraries"),
    (
        "/etc/ssl/certs",
        "CA certificates for TLS libraries (no network now, but pip/requests read them)",
    ),
    (
        "/etc/alternatives",
        "Debian's alternatives symlinks (awk, editor, ...)",
    ),
    ("/etc/mime.types", "mimetypes module"),
    (
        "/etc/fonts",
        "fontconfig: fonts for matplotlib and Pillow text",
    ),
];

/// Device nodes the sandbox gets, bound from the host's /dev (a user namespace cannot mknod).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn err(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> MountError {
    let path = path.into();
    move |source| MountError::Io {
        action,
        path,
        source,
    }
}

/// The opened bind sources, made by [`plan`] and consumed by [`build_root`].
pub(crate) struct Plan(Vec<Planned>);

enum Source {
    /// Bind this open file or directory.
    Fd(OwnedFd, bool /* is_dir */),
    /// Re-create this symlink.
    Link(PathBuf),
}

struct Planned {
    source: Source,
    target: PathBuf,
    kind: BindKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BindKind {
    ReadOnly,
    ReadWrite,
    Device,
}

/// Builds the root file system and switches into it. Runs as pid 1 of the new namespaces,
/// holding capabilities in the new user namespace only.
pub(crate) fn build_root(spec: &Spec, plan: &Plan) -> Result<(), MountError> {
    let plan = &plan.0;
    // Nothing we mount may propagate back to the host.
    mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(err("make private", "/"))?;

    let root = Path::new(NEW_ROOT);
    mount(
        Some("tmpfs"),
        NEW_ROOT,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=16m,nr_inodes=16384"),
    )
    .map_err(err("mount the root tmpfs on", NEW_ROOT))?;

    for dir in [
        "etc",
        "proc",
        "dev",
        "tmp",
        "mnt",
        "opt",
        "workspace",
        "home",
    ] {
        fs::create_dir(root.join(dir)).map_err(err("create", root.join(dir)))?;
    }

    for p in plan {
        place(root, p)?;
    }
    symlink(WORKSPACE, root.join("mnt/data")).map_err(err("link", "/mnt/data"))?;

    write_etc(root)?;
    scratch_tmpfs(&root.join("tmp"), spec.limits.tmp_bytes)?;
    build_dev(root, plan, spec.limits.tmp_bytes)?;
    mount_proc(&root.join("proc"))?;

    pivot(root)?;
    // The root tmpfs is finished: nothing may be created next to /workspace or /tmp.
    mount(
        None,
        "/",
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
    .map_err(err("remount read-only", "/"))?;
    Ok(())
}

/// Opens every bind source while the host tree is still visible and pid 1 still has host uid 0,
/// which owns the directories on the way.
pub(crate) fn plan(spec: &Spec) -> Result<Plan, MountError> {
    let mut plan = Vec::new();
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        let Ok(meta) = fs::symlink_metadata(path) else {
            continue;
        };
        let source = if meta.file_type().is_symlink() {
            Source::Link(fs::read_link(path).map_err(err("read link", path))?)
        } else {
            Source::Fd(open_path(path)?, meta.is_dir())
        };
        plan.push(Planned {
            source,
            target: path.into(),
            kind: BindKind::ReadOnly,
        });
    }
    for (file, _why) in ETC_SHARED {
        let path = Path::new(file);
        // Follows symlinks: /etc/localtime points into /usr/share/zoneinfo.
        if let Ok(meta) = fs::metadata(path) {
            plan.push(Planned {
                source: Source::Fd(open_path(path)?, meta.is_dir()),
                target: path.into(),
                kind: BindKind::ReadOnly,
            });
        }
    }
    for dev in DEVICES {
        let path = Path::new("/dev").join(dev);
        if fs::metadata(&path).is_ok_and(|m| m.file_type().is_char_device()) {
            plan.push(Planned {
                source: Source::Fd(open_path(&path)?, false),
                target: path,
                kind: BindKind::Device,
            });
        }
    }
    plan.push(Planned {
        source: Source::Fd(open_path(&spec.workspace)?, true),
        target: WORKSPACE.into(),
        kind: BindKind::ReadWrite,
    });
    // The same directory again where E2B's sandboxes keep the user's files, for code written
    // for them (docs/e2b.md): a bind, not a symlink, so that `ls -l`, `find` and `getcwd` see
    // a directory. Landlock's rule for /workspace covers it (rules follow the directory, not
    // the path it is reached by).
    plan.push(Planned {
        source: Source::Fd(open_path(&spec.workspace)?, true),
        target: E2B_HOME.into(),
        kind: BindKind::ReadWrite,
    });
    for b in &spec.ro_binds {
        let meta = fs::metadata(&b.source).map_err(err("find bind source", &b.source))?;
        plan.push(Planned {
            source: Source::Fd(open_path(&b.source)?, meta.is_dir()),
            target: b.target.clone(),
            kind: BindKind::ReadOnly,
        });
    }
    Ok(Plan(plan))
}

/// `open_tree(path, OPEN_TREE_CLONE)`: a detached copy of the mount at `path`, or of the part
/// of a mount below a directory (the init binary's, `crate::exe`). A workspace's goes to a
/// sandbox cloned in a mount namespace that does not have it (the zygote's, `crate::zygote`),
/// where [`attach_tree`] puts it in place.
pub(crate) fn clone_tree(path: &Path) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let c = cstr(path)?;
    // SAFETY: a valid C string; the flags ask for a new descriptor, nothing else is touched.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Attaches a detached mount made by [`clone_tree`] at `at` in this mount namespace (pid 1's,
/// before [`plan`] opens `at` as the workspace's bind source). `move_mount` needs
/// `CAP_SYS_ADMIN` in the namespace's owner, which pid 1 has in its new user namespace; the
/// descriptor is consumed (a detached tree attaches once).
pub(crate) fn attach_tree(tree: OwnedFd, at: &Path) -> Result<(), MountError> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    let c = cstr(at).map_err(err("attach the workspace at", at))?;
    // SAFETY: a descriptor we own, an empty C string and a valid path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    crate::sys::cvt_long(r).map_err(err("attach the workspace at", at))?;
    Ok(())
}

/// Moves this (single-threaded) process into a private copy of its mount namespace without
/// the mounts strictly below `dirs`: the namespace sandboxes are then cloned from (the
/// zygote's, the cold helpers', `crate::spawn_ns`). A clone with `CLONE_NEWNS` copies every
/// mount of its creator's namespace, and pid 1 then walks and detaches them all; in the host's
/// there is one more for every live workspace (with 500 sessions, ~3.7 ms more machine time
/// per one-shot, docs/benchmarks.md). The copy holds the host's mounts of now and sees every
/// directory made later; workspaces, the only mounts a sandbox needs that come later, go along
/// with each sandbox, detached ([`clone_tree`]).
pub(crate) fn enter_spawning_copy(dirs: &[PathBuf]) -> Result<(), String> {
    // SAFETY: a flag-only syscall; the callers are single-threaded.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNS) })
        .map_err(|e| format!("unshare the spawning mount namespace: {e}"))?;
    // Private: the host's later mounts and unmounts must not propagate into it, nor ours out.
    mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| format!("make the spawning mount namespace private: {e}"))?;
    detach_mounts_below(dirs)
}

/// Detaches, in this (private) mount namespace, every mount strictly below one of `dirs`.
fn detach_mounts_below(dirs: &[PathBuf]) -> Result<(), String> {
    if dirs.is_empty() {
        return Ok(());
    }
    // Mount points are listed with their links resolved.
    let dirs: Vec<PathBuf> = dirs
        .iter()
        .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()))
        .collect();
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    for entry in crate::cgroup::parse_mountinfo(&text) {
        let point = &entry.mount_point;
        if !dirs.iter().any(|d| point.starts_with(d) && point != d) {
            continue;
        }
        let c = cstr(point).map_err(|e| format!("{}: {e}", point.display()))?;
        // SAFETY: a valid path. EINVAL: no longer a mount point (it went with one above it,
        // a detach takes the mounts below along).
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(format!("detach {}: {e}", point.display()));
            }
        }
    }
    Ok(())
}

fn open_path(path: &Path) -> Result<OwnedFd, MountError> {
    let c = cstr(path).map_err(err("open", path))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) })
        .map_err(err("open", path))?;
    // SAFETY: open succeeded; we own the new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Puts one planned entry into the new root. /dev entries wait for the /dev tmpfs.
fn place(root: &Path, p: &Planned) -> Result<(), MountError> {
    if p.kind == BindKind::Device {
        return Ok(());
    }
    let target = root.join(p.target.strip_prefix("/").unwrap_or(&p.target));
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(err("create", parent))?;
    }
    match &p.source {
        Source::Link(to) => symlink(to, &target).map_err(err("link", &target)),
        Source::Fd(fd, is_dir) => bind(fd, *is_dir, &target, p.kind),
    }
}

fn bind(fd: &OwnedFd, is_dir: bool, target: &Path, kind: BindKind) -> Result<(), MountError> {
    if is_dir {
        if !target.exists() {
            fs::create_dir(target).map_err(err("create", target))?;
        }
    } else {
        fs::File::create(target).map_err(err("create", target))?;
    }
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let target_s = target.to_str().unwrap_or_default();
    mount(Some(&source), target_s, None, libc::MS_BIND, None).map_err(err("bind", target))?;
    let mut flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | preserved_flags(target)?;
    match kind {
        BindKind::ReadOnly => flags |= libc::MS_RDONLY | libc::MS_NODEV,
        BindKind::ReadWrite => flags |= libc::MS_NODEV,
        BindKind::Device => flags |= libc::MS_NOEXEC,
    }
    mount(None, target_s, None, flags, None).map_err(err("remount", target))
}

/// Flags a bind remount must keep: in a user namespace the kernel refuses to clear flags that
/// the host's mount has (they are locked), including the atime ones.
fn preserved_flags(target: &Path) -> Result<libc::c_ulong, MountError> {
    let c = cstr(target).map_err(err("statvfs", target))?;
    // SAFETY: an all-zero statvfs is a valid value for the kernel to overwrite.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `st` a valid out-pointer.
    cvt(unsafe { libc::statvfs(c.as_ptr(), &mut st) }).map_err(err("statvfs", target))?;
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

fn write_etc(root: &Path) -> Result<(), MountError> {
    let etc = root.join("etc");
    let uid = SANDBOX_UID;
    let files: [(&str, String); 6] = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 {SANDBOX_USER}:x:{uid}:{uid}:runcell sandbox:/tmp:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\n{SANDBOX_USER}:x:{uid}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ),
        ("hostname", format!("{HOSTNAME}\n")),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n\
             protocols: files\nservices: files\n"
                .to_owned(),
        ),
        // No resolver: there is no network. An empty file makes lookups fail fast.
        ("resolv.conf", String::new()),
    ];
    for (name, content) in files {
        let path = etc.join(name);
        fs::write(&path, content).map_err(err("write", &path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
            .map_err(err("chmod", &path))?;
    }
    Ok(())
}

/// A size-limited tmpfs the sandbox may write to. Its pages are charged to the sandbox's
/// memory cgroup; `size` bounds it below that, `nr_inodes` bounds file counts.
fn scratch_tmpfs(target: &Path, bytes: u64) -> Result<(), MountError> {
    let inodes = (bytes / 4096).clamp(1024, 1 << 20);
    let options = format!("mode=1777,size={bytes},nr_inodes={inodes}");
    mount(
        Some("tmpfs"),
        target.to_str().unwrap_or_default(),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&options),
    )
    .map_err(err("mount tmpfs on", target))
}

fn build_dev(root: &Path, plan: &[Planned], shm_bytes: u64) -> Result<(), MountError> {
    let dev = root.join("dev");
    mount(
        Some("tmpfs"),
        dev.to_str().unwrap_or_default(),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0755,size=64k,nr_inodes=64"),
    )
    .map_err(err("mount tmpfs on", &dev))?;
    for p in plan.iter().filter(|p| p.kind == BindKind::Device) {
        if let Source::Fd(fd, _) = &p.source {
            let name = p.target.file_name().unwrap_or_default();
            bind(fd, false, &dev.join(name), BindKind::Device)?;
        }
    }
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(to, dev.join(name)).map_err(err("link", dev.join(name)))?;
    }
    let shm = dev.join("shm");
    fs::create_dir(&shm).map_err(err("create", &shm))?;
    scratch_tmpfs(&shm, shm_bytes)?;
    // Nothing else may be created in /dev.
    mount(
        None,
        dev.to_str().unwrap_or_default(),
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
        None,
    )
    .map_err(err("remount read-only", &dev))
}

/// A fresh proc for the new PID namespace: it shows only the sandbox's processes. /proc/sys and
/// /proc/sysrq-trigger are additionally made read-only, as defence in depth behind the user
/// namespace (which already denies writes to host-owned entries).
fn mount_proc(target: &Path) -> Result<(), MountError> {
    let t = target.to_str().unwrap_or_default();
    mount(
        Some("proc"),
        t,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(err("mount proc on", target))?;
    for sub in ["sys", "sysrq-trigger"] {
        let p = target.join(sub);
        let ps = p.to_str().unwrap_or_default().to_owned();
        if p.exists() {
            mount(Some(&ps), &ps, None, libc::MS_BIND | libc::MS_REC, None)
                .map_err(err("bind", &p))?;
            let flags = libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC
                | preserved_flags(&p)?;
            mount(None, &ps, None, flags, None).map_err(err("remount read-only", &p))?;
        }
    }
    Ok(())
}

/// pivot_root with the old root stacked on the new one, then detached: no directory for the
/// old root is needed and no path to the host's tree remains.
fn pivot(root: &Path) -> Result<(), MountError> {
    let c = cstr(root).map_err(err("chdir", root))?;
    // SAFETY: `c` is a valid path.
    cvt(unsafe { libc::chdir(c.as_ptr()) }).map_err(err("chdir", root))?;
    let dot = CString::from(c".");
    // SAFETY: both arguments are valid paths.
    let r = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    crate::sys::cvt_long(r).map_err(err("pivot_root into", root))?;
    // SAFETY: `dot` is a valid path.
    cvt(unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) })
        .map_err(err("detach the old root at", "/"))?;
    // SAFETY: a constant valid path.
    cvt(unsafe { libc::chdir(c"/".as_ptr()) }).map_err(err("chdir", "/"))?;
    Ok(())
}

fn mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let c = |s: &str| {
        CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in mount"))
    };
    let source = source.map(c).transpose()?;
    let target = c(target)?;
    let fstype = fstype.map(c).transpose()?;
    let data = data.map(c).transpose()?;
    let ptr = |o: &Option<CString>| o.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is either null or a valid NUL-terminated string that outlives the call.
    cvt(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })?;
    Ok(())
}
