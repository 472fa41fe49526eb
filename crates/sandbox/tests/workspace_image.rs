//! Workspaces on disk (`WorkspaceImages`): quota, memory, durability and the hostile programs
//! that try to get past them, each probe beside a control that shows it works.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use runcell_sandbox::{
    ExitStatus, KillReason, Launch, Limits, RunOptions, Sandbox, UidLease, Workspace,
    WorkspaceImages,
};

fn sandbox() -> Sandbox {
    Sandbox::new(env!("CARGO_BIN_EXE_runcell-sandbox-init").into()).expect("sandbox")
}

fn images(dir: &tempfile::TempDir) -> WorkspaceImages {
    WorkspaceImages::open(&dir.path().join("images"))
        .expect("images (root, loop devices, e2fsprogs)")
}

fn lease(dir: &tempfile::TempDir) -> UidLease {
    UidLease::acquire(&dir.path().join("uids")).expect("lease")
}

/// Runs `code` with the host's python3 in a sandbox on `ws`; its stdout.
fn python(ws: &Workspace, limits: Limits, code: &str) -> (String, runcell_sandbox::RunOutcome) {
    let launch = Launch {
        argv: vec!["/usr/bin/python3".into(), "-c".into(), code.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        workspace: ws,
        ro_binds: vec![],
        limits,
        channel: false,
        egress_port: None,
    };
    let out = sandbox()
        .run(&launch, &RunOptions::default(), &mut |_, _| {})
        .expect("run");
    (out.stdout.render(), out)
}

fn mounted(path: &Path) -> bool {
    let p = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts")
        .expect("mounts")
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(p.as_str()))
}

/// 200 MiB written 1 MiB at a time (never more than a MiB in the program's own memory).
const WRITE_200_MIB: &str = r#"
import errno, os
block = b"\1" * (1 << 20)
with open("big", "wb") as f:
    for _ in range(200):
        f.write(block)
    f.flush(); os.fsync(f.fileno())
print("wrote", os.path.getsize("big") >> 20)
"#;

#[test]
fn a_full_image_is_enospc_and_its_bytes_are_not_the_sandboxs_memory() {
    let dir = tempfile::tempdir().expect("tmp");
    let imgs = images(&dir);
    let ws = imgs
        .create(&dir.path().join("ws"), 256 << 20, lease(&dir))
        .expect("create");
    assert!(ws.is_durable());
    let limits = Limits {
        memory_bytes: 128 << 20,
        fsize_bytes: 1 << 30,
        ..Limits::default()
    };
    // 200 MiB into a 256 MiB workspace from a sandbox allowed 128 MiB of memory, then past
    // the quota, then the room reported from inside.
    let (out, run) = python(
        &ws,
        limits,
        &format!(
            "{WRITE_200_MIB}{}",
            r#"
try:
    with open("more", "wb") as f:
        for _ in range(100):
            f.write(block)
            f.flush()
    print("no error")
except OSError as e:
    print("more:", errno.errorcode[e.errno], os.path.getsize("more") >> 20)
st = os.statvfs(".")
print("room_kib", st.f_bavail * st.f_frsize >> 10)
"#
        ),
    );
    assert_eq!(run.exit, ExitStatus::Code(0), "{run:?}");
    assert_eq!(run.killed_by, None);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "wrote 200", "{out}");
    let more: Vec<&str> = lines[1].split(' ').collect();
    assert_eq!(&more[..2], ["more:", "ENOSPC"], "{out}");
    let extra: u64 = more[2].parse().expect("MiB");
    assert!(
        (50..=56).contains(&extra),
        "ENOSPC after 200 + {extra} MiB: {out}"
    );
    let room: u64 = lines[2]
        .strip_prefix("room_kib ")
        .and_then(|r| r.parse().ok())
        .expect("room");
    assert!(room < 1024, "{out}");
    // The host's writes (root, which may use the blocks kept beyond the quota) stop there too.
    let e = ws
        .write_file("upload.bin", &[0u8; 1 << 20])
        .expect_err("full");
    assert!(e.to_string().starts_with("cannot write upload.bin"), "{e}");
    ws.delete("more").expect("delete");
    ws.write_file("upload.bin", &[0u8; 1 << 20])
        .expect("room again");

    // Control: the same 200 MiB in a tmpfs workspace is the sandbox's memory, and kills it.
    let tmpfs =
        Workspace::create(&dir.path().join("tmpfs"), 256 << 20, lease(&dir)).expect("tmpfs");
    let (_, run) = python(&tmpfs, limits, WRITE_200_MIB);
    assert_eq!(run.killed_by, Some(KillReason::Oom), "{run:?}");
}

#[test]
fn the_inode_quota_holds_on_an_image() {
    let dir = tempfile::tempdir().expect("tmp");
    let imgs = images(&dir);
    // 2 MiB: the smallest inode quota, 1,024.
    let ws = imgs
        .create(&dir.path().join("ws"), 2 << 20, lease(&dir))
        .expect("create");
    let (out, run) = python(
        &ws,
        Limits::default(),
        r#"
import errno, os
n = 0
try:
    while n < 100000:
        open(f"f{n}", "w").close()
        n += 1
    print("no error", n)
except OSError as e:
    print(errno.errorcode[e.errno], n)
print(sorted(os.listdir())[:1], len(os.listdir()))
"#,
    );
    assert_eq!(run.exit, ExitStatus::Code(0), "{run:?}");
    let first: Vec<&str> = out.lines().next().unwrap_or_default().split(' ').collect();
    assert_eq!(first[0], "ENOSPC", "{out}");
    let n: u64 = first[1].parse().expect("count");
    // As many as the tmpfs of that size gave (nr_inodes 1,024, less its root), give or take
    // ext4's rounding of the inode table to whole blocks.
    assert!((1023..=1040).contains(&n), "{n} files before ENOSPC");
    // No lost+found or other entry of ext4's own in the listing.
    assert!(
        out.lines().nth(1).unwrap_or_default().starts_with("['f0']"),
        "{out}"
    );
    let snap = ws.snapshot().expect("snapshot");
    assert!(snap.complete, "a walk of the full workspace sees it all");
    assert_eq!(snap.files.len() as u64, n);
}

#[test]
fn hostile_programs_cannot_escape_or_enlarge_the_image() {
    let dir = tempfile::tempdir().expect("tmp");
    let imgs = images(&dir);
    let ws = imgs
        .create(&dir.path().join("ws"), 16 << 20, lease(&dir))
        .expect("create");
    // Each probe prints `name result`, result an errno name or "ok". RLIMIT_FSIZE well above
    // the quota, so what stops a write is the filesystem.
    let limits = Limits {
        fsize_bytes: 1 << 30,
        ..Limits::default()
    };
    let (out, run) = python(
        &ws,
        limits,
        r#"
import ctypes, errno, fcntl, os, struct
libc = ctypes.CDLL(None, use_errno=True)
def probe(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def c(r):
    if r != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
open("small", "wb").write(b"x")
# Control and probe: fallocate within the quota, then past it.
probe("fallocate_1m", lambda: os.posix_fallocate(os.open("fa", os.O_WRONLY | os.O_CREAT), 0, 1 << 20))
probe("fallocate_64m", lambda: os.posix_fallocate(os.open("fb", os.O_WRONLY | os.O_CREAT), 0, 64 << 20))
os.unlink("fb")
# A huge sparse file holds no blocks: the room stays, and filling it stops at the quota.
before = os.statvfs(".").f_bavail
probe("sparse_900m", lambda: open("sparse", "wb").truncate(900 << 20))
print("room_kept", os.statvfs(".").f_bavail == before)
def fill_sparse():
    with open("sparse", "r+b") as f:
        for i in range(56):
            f.seek(i << 24); f.write(b"\1" * (1 << 20)); f.flush()
probe("fill_sparse", fill_sparse)
os.unlink("sparse")
# Hard links: within the workspace (control), out of it, and into it.
probe("link_inside", lambda: os.link("small", "small2"))
probe("link_to_tmp", lambda: os.link("small", "/tmp/small"))
probe("link_from_etc", lambda: os.link("/etc/passwd", "passwd"))
# Remount bigger, or mount the device anew.
probe("remount", lambda: c(libc.mount(b"none", b"/workspace", None, 32 | 4096, b"size=1g")))
probe("loop_control", lambda: os.open("/dev/loop-control", os.O_RDWR))
# ext4's own knobs: grow the filesystem, shut it down, make a file immutable.
probe("resize_fs", lambda: fcntl.ioctl(fd, 0x40086610, struct.pack("Q", 1 << 30)))
probe("shutdown_fs", lambda: fcntl.ioctl(fd, 0x8004587D, struct.pack("I", 0)))
probe("immutable", lambda: fcntl.ioctl(os.open("small", os.O_RDONLY), 0x40086602, struct.pack("l", 0x10)))
probe("chown_root", lambda: os.chown("small", 0, 0))
"#,
    );
    assert_eq!(run.exit, ExitStatus::Code(0), "{run:?}");
    let got: std::collections::BTreeMap<&str, &str> =
        out.lines().filter_map(|l| l.split_once(' ')).collect();
    let want = [
        ("fallocate_1m", "ok"),
        ("fallocate_64m", "ENOSPC"),
        ("sparse_900m", "ok"),
        ("room_kept", "True"),
        ("fill_sparse", "ENOSPC"),
        ("link_inside", "ok"),
        ("link_to_tmp", "EXDEV"),
        ("link_from_etc", "EXDEV"),
        ("remount", "EPERM"),
        ("loop_control", "ENOENT"),
        ("resize_fs", "EPERM"),
        ("shutdown_fs", "EPERM"),
        ("immutable", "EPERM"),
        ("chown_root", "EINVAL"),
    ];
    for (name, result) in want {
        assert_eq!(got.get(name).copied(), Some(result), "{name}: {out}");
    }
    // The host still sees a healthy, writable filesystem of the size it made.
    ws.write_file("after.txt", b"fine")
        .expect("write after the probes");
    ws.sync().expect("sync");
    assert_eq!(ws.read_file("after.txt", 16).expect("read"), b"fine");
}

#[test]
fn an_image_outlives_its_mount_and_is_adopted_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let imgs = images(&dir);
    let path = dir.path().join("ws_1");
    let ws = imgs.create(&path, 8 << 20, lease(&dir)).expect("create");
    let uid = ws.host_uid();
    ws.write_file("uploaded.txt", b"from the host")
        .expect("write");
    let (_, run) = python(
        &ws,
        Limits::default(),
        "open('written.txt', 'w').write('from inside')",
    );
    assert_eq!(run.exit, ExitStatus::Code(0));
    ws.sync().expect("sync");
    let image = imgs.image_of(&path);
    assert!(image.is_file());
    // A server killed with -9: nothing is dropped, the mount stays.
    std::mem::forget(ws);
    // The lease of the next server (the forgotten one still holds its lock here).
    let next_server = |d: &tempfile::TempDir| UidLease::acquire_uid(d.path(), uid).expect("lease");
    let (second, third) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let again = imgs
        .adopt(&path, next_server(&second))
        .expect("adopt while mounted");
    assert_eq!(
        again.read_file("written.txt", 64).expect("read"),
        b"from inside"
    );
    std::mem::forget(again);
    // A reboot: nothing mounted any more; the directory and the image remain.
    let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).expect("path");
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::umount2(c.as_ptr(), 0) }, 0, "unmount");
    assert!(!mounted(&path));
    assert_eq!(
        Workspace::owner_of(&path),
        Some(uid),
        "the mount point says whose it is"
    );
    // Another uid's lease is refused, and mounts nothing.
    let wrong = UidLease::acquire(third.path()).expect("lease");
    assert!(imgs.adopt(&path, wrong).is_err());
    assert!(!mounted(&path));
    let back = imgs
        .adopt(&path, next_server(&third))
        .expect("re-attach after a reboot");
    assert!(mounted(&path));
    assert_eq!(
        back.read_file("uploaded.txt", 64).expect("read"),
        b"from the host"
    );
    assert_eq!(
        back.read_file("written.txt", 64).expect("read"),
        b"from inside"
    );
    // Its size as the filesystem reports it (used + room): the quota, within a few blocks of
    // directory metadata.
    assert!(
        back.size_bytes().abs_diff(8 << 20) <= 64 << 10,
        "{}",
        back.size_bytes()
    );
    assert_eq!(std::fs::metadata(&path).expect("root").uid(), uid);
    // Dropped: unmounted and its directory gone at once; the image once the removal thread
    // has shut its filesystem down.
    drop(back);
    assert!(!mounted(&path) && !path.exists());
    assert!(imgs.wait_removals(std::time::Duration::from_secs(20)));
    assert!(!image.exists());
}

#[test]
fn a_mount_that_is_not_the_workspaces_image_is_not_adopted() {
    let dir = tempfile::tempdir().expect("tmp");
    let imgs = images(&dir);
    let a = imgs
        .create(&dir.path().join("a"), 4 << 20, lease(&dir))
        .expect("a");
    let uid = a.host_uid();
    // b's directory, owned by a's uid, with a's image mounted on it: not b's workspace.
    let b = dir.path().join("b");
    std::fs::create_dir(&b).expect("mkdir");
    std::os::unix::fs::lchown(&b, Some(uid), Some(uid)).expect("chown");
    let bind = std::process::Command::new("mount")
        .args(["--bind"])
        .arg(a.path())
        .arg(&b)
        .status()
        .expect("mount");
    assert!(bind.success());
    let other = tempfile::tempdir().expect("tmp");
    let err = imgs
        .adopt(&b, UidLease::acquire_uid(other.path(), uid).expect("lease"))
        .expect_err("another image");
    assert!(
        format!("{err:?}").contains("not from this workspace's image"),
        "{err:?}"
    );
    // Control: a's own path is adopted by the same check.
    let _ = std::process::Command::new("umount").arg(&b).status();
    std::mem::forget(a);
    let a_path = dir.path().join("a");
    let a = imgs
        .adopt(
            &a_path,
            UidLease::acquire_uid(other.path(), uid).expect("lease"),
        )
        .expect("a's own image");
    drop(a);
}

#[test]
fn a_spare_is_bound_into_place_and_spares_do_not_outlive_their_server() {
    let dir = tempfile::tempdir().expect("tmp");
    let imgs = images(&dir);
    imgs.make_spare(8 << 20).expect("spare");
    imgs.make_spare(8 << 20).expect("spare");
    assert_eq!(imgs.spares(8 << 20), 2);
    assert_eq!(imgs.spares(16 << 20), 0, "spares are of one size");
    let path = dir.path().join("ws");
    let ws = imgs.create(&path, 8 << 20, lease(&dir)).expect("create");
    assert_eq!(imgs.spares(8 << 20), 1, "the create took a spare");
    // A complete workspace: its own image under its name, the quota, the uid, a sync.
    assert!(imgs.image_of(&path).is_file());
    assert!(mounted(&path));
    assert_eq!(std::fs::metadata(&path).expect("root").uid(), ws.host_uid());
    let (out, run) = python(
        &ws,
        Limits::default(),
        "import os\nst = os.statvfs('.')\nprint(st.f_bavail * st.f_frsize >> 20, sorted(os.listdir()))",
    );
    assert_eq!(run.exit, ExitStatus::Code(0), "{run:?}");
    assert_eq!(out, "8 []\n");
    ws.write_file("a.txt", b"a").expect("write");
    ws.sync().expect("sync");
    // The taken spare's own mount goes off the create's path; the workspace keeps its bind.
    imgs.tidy();
    assert_eq!(ws.read_file("a.txt", 8).expect("read after tidy"), b"a");
    // What a killed server leaves: a spare still mounted. The next one removes it.
    std::mem::forget(imgs);
    let spares = dir.path().join("images/spares");
    assert_eq!(
        std::fs::read_dir(&spares).expect("spares").count(),
        2,
        "a mount point and its image"
    );
    let again = images(&dir);
    assert_eq!(std::fs::read_dir(&spares).expect("spares").count(), 0);
    assert_eq!(again.spares(8 << 20), 0);
    assert!(mounts_under(dir.path())
        .iter()
        .all(|m| !m.starts_with(&spares)));
    // A clean stop removes its spares.
    again.make_spare(8 << 20).expect("spare");
    again.remove_spares();
    assert_eq!(std::fs::read_dir(&spares).expect("spares").count(), 0);
    let image = again.image_of(&path);
    drop(ws);
    assert!(!path.exists() && !mounted(&path));
    assert!(again.wait_removals(std::time::Duration::from_secs(20)));
    assert!(!image.exists());
}

fn mounts_under(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_to_string("/proc/self/mounts")
        .expect("mounts")
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(std::path::PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect()
}
