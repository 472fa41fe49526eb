#!/usr/bin/env python3
"""Candidates for a session's /workspace, measured side by side in one run (issue 17).

Usage: python3 bench/workspace_backends.py [N=200]     (as root; needs mkfs.xfs, mkfs.ext4, losetup)

Backends, each created and removed N times with the system calls runcell would make (ctypes, no
helper processes on the measured path):
  tmpfs        today: mkdir + a size- and inode-limited tmpfs mount + chown; umount + rmdir.
  xfs-prjquota one shared sparse XFS image, loop-mounted once with prjquota: mkdir + chown +
               project id/PROJINHERIT (FS_IOC_FSSETXATTR) + block/inode limits (quotactl_fd);
               removal rmdir + limits cleared.
  ext4-prjquota the same on a shared ext4 image made with -O quota,project.
  ext4-image-template  one ext4 image per session: a copy of a pre-made template (data extents
               only) + a free loop device (LOOP_CTL_GET_FREE, LOOP_CONFIGURE, autoclear, direct
               I/O) + mount; umount + unlink. `-mkfs`: mkfs.ext4 instead of the template;
               `-pool`: images made and mounted ahead, bound into place (what runcell does).
  xfs-image-template   the same with XFS (which cannot be made under 300 MB).
Then, per backend: 200 MiB written from a process in a 128 MiB memory cgroup (v1 or v2, whichever
the host has: OOM or not, the cgroup's peak); the cost of making one small written file durable
(fsync of file and directory; syncfs) and of a syncfs with nothing written (a `1+1` cell); and what
a write past a 64 MiB byte quota and past a 1,024-inode quota returns.
Prints a Markdown table; absolute numbers swing on a shared machine, ratios within a run do not.
"""
import ctypes, ctypes.util, errno, os, shutil, statistics, struct, subprocess, sys, tempfile, time

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.syscall.restype = ctypes.c_long
MS_NOSUID, MS_NODEV = 2, 4
SYS_quotactl_fd, SYS_syncfs = 443, 306
FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR = 0x801C581F, 0x401C5820
FS_XFLAG_PROJINHERIT = 0x200
Q_SETQUOTA, PRJQUOTA = 0x800008, 2
QIF_BLIMITS, QIF_ILIMITS = 1, 4
LOOP_CTL_GET_FREE, LOOP_CONFIGURE = 0x4C82, 0x4C0A
LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO = 4, 16
import fcntl


def check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return r


def mount(src, target, fstype, flags, data):
    check(libc.mount(src.encode(), target.encode(), fstype.encode(), flags, data.encode()), f"mount {target}")


def umount(target):
    check(libc.umount2(target.encode(), 2), f"umount {target}")  # MNT_DETACH


def set_project(fd, projid):
    buf = bytearray(fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(28)))
    xflags, extsize, nextents, _, cow = struct.unpack_from("5I", buf)
    struct.pack_into("5I", buf, 0, xflags | FS_XFLAG_PROJINHERIT, extsize, nextents, projid, cow)
    fcntl.ioctl(fd, FS_IOC_FSSETXATTR, bytes(buf))


def set_quota(mount_fd, projid, size_bytes, inodes):
    # struct if_dqblk: 8 x u64 then u32 dqb_valid (blocks of 1 KiB).
    blk = size_bytes // 1024
    dq = struct.pack("8QI4x", blk, blk, 0, inodes, inodes, 0, 0, 0, QIF_BLIMITS | QIF_ILIMITS)
    b = ctypes.create_string_buffer(dq, len(dq))
    check(libc.syscall(SYS_quotactl_fd, mount_fd, Q_SETQUOTA | PRJQUOTA, projid, b), "quotactl_fd")


def syncfs(fd):
    check(libc.syscall(SYS_syncfs, fd), "syncfs")


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


UID = 4_000_000  # an unmapped host uid, as a lease's would be


class Tmpfs:
    name = "tmpfs"

    def __init__(self, root):
        self.root = root

    def create(self, i, size, inodes=None):
        p = f"{self.root}/ws{i}"
        os.mkdir(p)
        inodes = inodes or max(1024, min(size // 2048, 1 << 20))
        mount("runcell-workspace", p, "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={size},nr_inodes={inodes},mode=0700,uid={UID},gid={UID}")
        return p

    def remove(self, i, p):
        umount(p)
        os.rmdir(p)

    def close(self):
        pass


class SharedPrjquota:
    def __init__(self, root, fs):
        self.name = f"{fs}-prjquota"
        self.img, self.mnt = f"{root}/{fs}.img", f"{root}/{fs}"
        os.mkdir(self.mnt)
        with open(self.img, "wb") as f:
            f.truncate(64 << 30)
        t = time.perf_counter()
        if fs == "xfs":
            sh("mkfs.xfs", "-q", self.img)
        else:
            sh("mkfs.ext4", "-q", "-O", "quota,project", "-E", "lazy_itable_init=1", self.img)
        self.mkfs_s = time.perf_counter() - t
        self.loop = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", self.img], check=True,
                                   capture_output=True, text=True).stdout.strip()
        try:
            mount(self.loop, self.mnt, fs, MS_NOSUID | MS_NODEV, "prjquota")
        except OSError:
            sh("losetup", "-d", self.loop)
            raise
        self.mfd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)

    def create(self, i, size, inodes=None):
        p = f"{self.mnt}/ws{i}"
        os.mkdir(p, 0o700)
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, UID, UID)
            set_project(fd, UID + i)
            set_quota(self.mfd, UID + i, size, inodes or max(1024, min(size // 2048, 1 << 20)))
        finally:
            os.close(fd)
        return p

    def remove(self, i, p):
        shutil.rmtree(p)
        set_quota(self.mfd, UID + i, 0, 0)

    def close(self):
        os.close(self.mfd)
        umount(self.mnt)
        sh("losetup", "-d", self.loop)


def mkfs(fs, img, size, inodes):
    with open(img, "wb") as f:
        f.truncate(size)
    if fs == "ext4":
        sh("mkfs.ext4", "-q", "-b", "4096", "-m", "0", "-N", str(inodes), "-J", "size=4", "-O", "^resize_inode",
           "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", img)
    else:
        sh("mkfs.xfs", "-q", "-K", "-s", "size=4096", "-m", "reflink=0", img)


class ImagePerSession:
    """`how`: "template" (copy a pre-made image's data extents), "mkfs" (make one each time) or
    "pool" (premounted images made ahead, bound into place)."""

    def __init__(self, root, fs, how, n=0):
        self.root, self.fs, self.how = root, fs, how
        self.name = f"{fs}-image-{how}"
        self.opts = "noinit_itable" if fs == "ext4" else ""
        self.ctl = os.open("/dev/loop-control", os.O_RDWR)
        self.templates = {}
        self.pool = []
        if how == "pool":
            for k in range(n + 3):
                self.pool.append(self.attach(f"{root}/pool{k}", 1 << 30, None))

    def image(self, img, size, inodes):
        inodes = inodes or max(1024, min(size // 2048, 1 << 20))
        if self.how == "mkfs":
            return mkfs(self.fs, img, size, inodes)
        key = (size, inodes)
        if key not in self.templates:
            t = f"{self.root}/template-{size}-{inodes}.img"
            mkfs(self.fs, t, size, inodes)
            self.templates[key] = (t, data_extents(t))
        t, ext = self.templates[key]
        copy_extents(t, img, ext)

    def attach(self, p, size, inodes):
        img = p + ".img"
        os.mkdir(p)
        self.image(img, size, inodes)
        n = fcntl.ioctl(self.ctl, LOOP_CTL_GET_FREE)
        dev = f"/dev/loop{n}"
        lfd = os.open(dev, os.O_RDWR)
        bfd = os.open(img, os.O_RDWR)
        # struct loop_config: u32 fd, u32 block_size, struct loop_info64 (232 bytes), 8 x u64
        info = bytearray(232)
        struct.pack_into("I", info, 52, LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO)  # lo_flags
        cfg = struct.pack("II", bfd, 4096) + bytes(info) + bytes(64)
        fcntl.ioctl(lfd, LOOP_CONFIGURE, cfg)
        os.close(bfd)
        mount(dev, p, self.fs, MS_NOSUID | MS_NODEV, self.opts)
        os.close(lfd)  # autoclear: the loop device goes with the mount
        return p

    def create(self, i, size, inodes=None):
        p = f"{self.root}/ws{i}"
        if self.how == "pool" and size == 1 << 30 and inodes is None and self.pool:
            # As runcell does: the spare's root bound into place, its own mount detached (a
            # mount point cannot be renamed; MS_MOVE fails under a shared `/`).
            src = self.pool.pop()
            os.mkdir(p)
            os.rename(src + ".img", p + ".img")
            check(libc.mount(src.encode(), p.encode(), None, 4096, None), "MS_BIND")
            umount(src)
            os.rmdir(src)
        else:
            self.attach(p, size, inodes)
        os.chown(p, UID, UID)
        return p

    def remove(self, i, p):
        umount(p)
        os.rmdir(p)
        os.unlink(p + ".img")

    def close(self):
        for src in self.pool:
            umount(src)
        os.close(self.ctl)


def data_extents(path):
    fd, out, off = os.open(path, os.O_RDONLY), [], 0
    end = os.fstat(fd).st_size
    while off < end:
        try:
            d = os.lseek(fd, off, os.SEEK_DATA)
        except OSError:
            break
        h = os.lseek(fd, d, os.SEEK_HOLE)
        out.append((d, h - d))
        off = h
    os.close(fd)
    return out


def copy_extents(src, dst, extents):
    s = os.open(src, os.O_RDONLY)
    d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(d, os.fstat(s).st_size)
    for off, n in extents:
        os.lseek(s, off, os.SEEK_SET)
        os.lseek(d, off, os.SEEK_SET)
        while n > 0:
            k = os.sendfile(d, s, None, n)
            n -= k
    os.close(s)
    os.close(d)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def memcg():
    """A fresh 128 MiB memory cgroup; returns (dir, procs file, peak reader)."""
    if os.path.exists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        d = tempfile.mkdtemp(prefix="rc-wsbench-", dir="/sys/fs/cgroup/memory")
        open(f"{d}/memory.limit_in_bytes", "w").write(str(128 << 20))
        return d, f"{d}/cgroup.procs", lambda: int(open(f"{d}/memory.max_usage_in_bytes").read()), \
            lambda: int(dict(l.split() for l in open(f"{d}/memory.oom_control"))["oom_kill"])
    d = tempfile.mkdtemp(prefix="rc-wsbench-", dir="/sys/fs/cgroup")
    open(f"{d}/memory.max", "w").write(str(128 << 20))
    open(f"{d}/memory.swap.max", "w").write("0")
    return d, f"{d}/cgroup.procs", lambda: int(open(f"{d}/memory.peak").read()), \
        lambda: int(dict(l.split() for l in open(f"{d}/memory.events"))["oom_kill"])


def write_in_memcg(path, mib):
    d, procs, peak, ooms = memcg()
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            open(procs, "w").write(str(os.getpid()))
            fd = os.open(f"{path}/big", os.O_WRONLY | os.O_CREAT, 0o600)
            block = b"\1" * (1 << 20)
            for _ in range(mib):
                os.write(fd, block)
            os.fsync(fd)
            os._exit(0)
        except OSError as e:
            os._exit(100 + e.errno % 100)
    _, status = os.waitpid(pid, 0)
    secs = time.perf_counter() - t
    res = (os.waitstatus_to_exitcode(status), secs, peak() >> 20, ooms())
    os.remove(f"{path}/big") if os.path.exists(f"{path}/big") else None
    os.rmdir(d)
    return res


def ack_costs(path, rounds=50):
    fsyncs, syncfss, cleans = [], [], []
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(rounds):
        fd = os.open(f"{path}/small{i}", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"0123456789")
        t = time.perf_counter(); os.fsync(fd); os.fsync(dfd); fsyncs.append((time.perf_counter() - t) * 1e3)
        os.close(fd)
        fd = os.open(f"{path}/other{i}", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"0123456789"); os.close(fd)
        t = time.perf_counter(); syncfs(dfd); syncfss.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter(); syncfs(dfd); cleans.append((time.perf_counter() - t) * 1e3)
    os.close(dfd)
    return statistics.median(fsyncs), statistics.median(syncfss), statistics.median(cleans)


def past_quota(b, i):
    # XFS refuses to make a filesystem under 300 MB.
    size = (320 if b.name.startswith("xfs") else 64) << 20
    p = b.create(i, size, 1024)
    err = "none"
    try:
        with open(f"{p}/fill", "wb") as f:
            for _ in range((size >> 20) + 36):
                f.write(b"\0" * (1 << 20))
                f.flush()
    except OSError as e:
        err = errno.errorcode[e.errno]
    ierr = "none"
    try:
        for k in range(2048):
            open(f"{p}/i{k}", "w").close()
    except OSError as e:
        ierr = errno.errorcode[e.errno]
    b.remove(i, p)
    return err, ierr


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    root = tempfile.mkdtemp(prefix="rc-wsbench-", dir="/var/tmp")
    rows, made = [], []
    try:
        backends = [Tmpfs(root)]
        xfs = shutil.which("mkfs.xfs") is not None
        if not xfs:
            print("[workspace_backends] no mkfs.xfs (apt-get install xfsprogs): XFS skipped", file=sys.stderr)
        for fs in ("xfs", "ext4") if xfs else ("ext4",):
            try:
                backends.append(SharedPrjquota(root, fs))
            except OSError as e:
                print(f"[workspace_backends] {fs}-prjquota: {e} (dmesg: quota support missing?)", file=sys.stderr)
                rows.append((f"{fs}-prjquota",) + (0,) * 11 + ("cannot mount", "with prjquota"))
        made = backends
        for fs, how in (("ext4", "template"), ("ext4", "pool"), ("ext4", "mkfs"), ("xfs", "template")):
            if fs == "ext4" or xfs:
                backends.append(ImagePerSession(root, fs, how, n))
        for b in backends:
            count = n if not b.name.endswith("mkfs") else max(10, n // 10)
            creates, removes = [], []
            for i in range(count):
                t = time.perf_counter(); p = b.create(i, 1 << 30); creates.append((time.perf_counter() - t) * 1e3)
                t = time.perf_counter(); b.remove(i, p); removes.append((time.perf_counter() - t) * 1e3)
            p = b.create(n + 1, 300 << 20)
            code, secs, peak, ooms = write_in_memcg(p, 200)
            fs_, sf, clean = ack_costs(p) if b.name != "tmpfs" else (0, 0, 0)
            b.remove(n + 1, p)
            err, ierr = past_quota(b, n + 2)
            rows.append((b.name, count, statistics.median(creates), pct(creates, .95), statistics.median(removes),
                         code, secs, peak, ooms, fs_, sf, clean, err, ierr))
            print(f"[workspace_backends] {b.name} done", file=sys.stderr)
    finally:
        for b in made:
            try:
                b.close()
            except OSError as e:
                print(f"close {b.name}: {e}", file=sys.stderr)
        for line in open("/proc/mounts"):
            m = line.split()[1]
            if m.startswith(root):
                libc.umount2(m.encode(), 2)
        shutil.rmtree(root, ignore_errors=True)
    print("| backend | creates | create p50 ms | p95 | remove p50 | 200 MiB in 128 MiB cgroup: exit | s | peak MiB | OOM kills | fsync file+dir ms | syncfs after a write | syncfs clean | past the byte quota | past 1,024 inodes |")
    print("|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:--|:--|")
    for r in rows:
        print("| %s | %d | %.3f | %.3f | %.3f | %s | %.2f | %d | %d | %.2f | %.2f | %.3f | %s | %s |" % r)


if __name__ == "__main__":
    main()
