//! Durable workspaces: each one is its own ext4 filesystem in an image file under the data
//! dir, mounted through a loop device (docs/sandbox.md, "The workspace on disk").
//!
//! Why this shape (docs/benchmarks.md, "Workspaces on disk"): a filesystem per workspace makes
//! a full workspace ENOSPC and its inode count a hard limit without project quotas (kernels
//! built without CONFIG_QUOTA, this development machine's among them, have none); its pages are
//! ordinary page cache, reclaimable, so filling it never OOM-kills the session as tmpfs did;
//! and its bytes are in a file, so they outlive the server and the host. Making a filesystem
//! costs ~40 ms (mkfs), so each size gets a template once and a new image is a copy of the
//! template's ~100 KiB of data extents (the rest is holes).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::loopdev::{self, LoopDevice};
use crate::removal::{unmount, wait_removals};
use crate::sys::{cstr, cvt};
use crate::user_ns::UidLease;
use crate::workspace::{Workspace, WorkspaceError};

/// Names spares uniquely within the process (the pid tells processes apart).
static SPARE_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bumped whenever templates are made differently, so old ones are not reused.
const TEMPLATE_VERSION: u32 = 1;
/// The smallest ext4 journal (1,024 blocks of 4 KiB). A journal, because a host that loses
/// power must find every acknowledged file's metadata consistent at the next mount.
const JOURNAL_MIB: u64 = 4;
/// ext4's inode size on every host (mke2fs.conf picks 128 for small filesystems, which cannot
/// hold timestamps past 2038).
const INODE_BYTES: u64 = 256;
/// Inodes ext4 keeps for itself below the first ordinary one (the root is one of them).
const RESERVED_INODES: u64 = 10;
/// `noinit_itable`: no background zeroing of the inode tables, so an image stays sparse (its
/// unused inode tables are holes, which read as zeros); `errors=remount-ro`: a filesystem found
/// inconsistent stops taking writes instead of making it worse.
const MOUNT_OPTIONS: &std::ffi::CStr = c"noinit_itable,errors=remount-ro";

/// Where the images live and how new ones are made.
#[derive(Debug)]
pub struct WorkspaceImages {
    /// The images, `<workspace name>.ext4`, and `templates/`. Only runcell writes here.
    dir: PathBuf,
    /// `dir` as the kernel names it (loop devices report their backing file that way).
    dir_real: PathBuf,
    mkfs: PathBuf,
    tune2fs: PathBuf,
    templates: Mutex<HashMap<(u64, u64), Arc<Template>>>,
    /// Images made and mounted ahead of demand under `spares/` ([`WorkspaceImages::make_spare`]).
    spares: Mutex<Vec<Spare>>,
    /// Mounts of spares that were bound into place, to detach off the create's path (an
    /// unmount waits for an RCU grace period: milliseconds on a busy host).
    taken: Mutex<Vec<PathBuf>>,
}

/// Where a new workspace's filesystem comes from.
enum Source {
    Spare(Spare),
    Template(Arc<Template>),
}

/// A mounted, unused workspace filesystem, nobody's yet.
#[derive(Debug)]
struct Spare {
    image: PathBuf,
    mount: PathBuf,
    size_bytes: u64,
    inodes: u64,
}

/// A ready-made, never mounted filesystem of one size.
#[derive(Debug)]
struct Template {
    path: PathBuf,
    /// Its length (the filesystem's size); holes past the data extents.
    len: u64,
    /// (offset, length) of the parts that are not holes.
    extents: Vec<(u64, u64)>,
}

impl WorkspaceImages {
    /// Opens (creating it) the image directory `dir`; fails when this host cannot make
    /// workspaces on disk (no loop devices, no `mkfs.ext4`), and then workspaces stay tmpfs.
    pub fn open(dir: &Path) -> Result<WorkspaceImages, WorkspaceError> {
        let err = |action, source| WorkspaceError::Io {
            action,
            path: dir.to_owned(),
            source,
        };
        loopdev::available().map_err(|e| err("open /dev/loop-control for", e))?;
        let mkfs = find_tool("mkfs.ext4").map_err(|e| err("find mkfs.ext4 for", e))?;
        let tune2fs = find_tool("tune2fs").map_err(|e| err("find tune2fs for", e))?;
        for d in [dir.to_owned(), dir.join("templates"), dir.join("spares")] {
            match fs::create_dir(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(err("create", e)),
            }
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&d, fs::Permissions::from_mode(0o700))
                .map_err(|e| err("chmod", e))?;
        }
        let dir_real = fs::canonicalize(dir).map_err(|e| err("resolve", e))?;
        let images = WorkspaceImages {
            dir: dir.to_owned(),
            dir_real,
            mkfs,
            tune2fs,
            templates: Mutex::default(),
            spares: Mutex::default(),
            taken: Mutex::default(),
        };
        // Spares of a process that died (nobody's: they never had a uid).
        images.remove_spares_on_disk();
        Ok(images)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The image of the workspace mounted (or to be mounted) at `workspace`.
    pub fn image_of(&self, workspace: &Path) -> PathBuf {
        let name = workspace.file_name().unwrap_or_default().to_string_lossy();
        self.dir.join(format!("{name}.ext4"))
    }

    /// Creates `path` (which must not exist) and mounts on it a new filesystem of
    /// `size_bytes` usable bytes (and as many inodes as a tmpfs workspace of that size would
    /// have), owned by the lease's host uid: a spare of that size if one is ready. The image and
    /// both new directory entries reach the disk at the workspace's first sync.
    pub fn create(
        &self,
        path: &Path,
        size_bytes: u64,
        lease: UidLease,
    ) -> Result<Workspace, WorkspaceError> {
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: path.to_owned(),
            source,
        };
        let inodes = crate::workspace::inodes_for(size_bytes);
        let uid = lease.uid();
        let spare = {
            let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
            let i = spares.iter().position(|s| s.size_bytes == size_bytes);
            i.map(|i| spares.swap_remove(i))
        };
        let source = match spare {
            Some(spare) => Source::Spare(spare),
            None => Source::Template(self.template(size_bytes, inodes)?),
        };
        fs::create_dir(path).map_err(|e| io_err("create", e))?;
        let image = self.image_of(path);
        let mut fs_inodes = inodes;
        let made = (|| {
            // The mount point too belongs to the uid: after a reboot, with nothing mounted on
            // it, it is what says whose workspace this is.
            chown_nofollow(path, uid).map_err(|e| io_err("chown", e))?;
            match &source {
                Source::Spare(spare) => {
                    // A bind mount of the spare's root; the spare's own mount is detached later
                    // ([`WorkspaceImages::tidy`]). Not a rename (a mount point cannot be
                    // renamed) nor MS_MOVE (refused under a shared mount, which systemd makes
                    // `/`).
                    fs::rename(&spare.image, &image).map_err(|e| io_err("rename a spare to", e))?;
                    bind(&spare.mount, path).map_err(|e| io_err("bind a spare on", e))?;
                    fs_inodes = spare.inodes;
                }
                Source::Template(template) => {
                    let file = copy_template(template, &image)
                        .map_err(|e| io_err("copy the template to", e))?;
                    mount_image(&file, path).map_err(|e| io_err("mount the image on", e))?;
                    // Every inode is a file a walk may meet (ext4 rounds the count up).
                    fs_inodes = statfs(path).map(|s| s.f_files).unwrap_or(inodes);
                }
            }
            let root = open_dir(path).map_err(|e| io_err("open", e))?;
            // SAFETY: fchown on our own descriptor of the new filesystem's root.
            cvt(unsafe { libc::fchown(root.as_raw_fd(), uid, uid) })
                .map_err(|e| io_err("chown", e))?;
            // SAFETY: as above.
            cvt(unsafe { libc::fchmod(root.as_raw_fd(), 0o700) })
                .map_err(|e| io_err("chmod", e))?;
            Ok(())
        })();
        if let Source::Spare(spare) = &source {
            self.taken
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(spare.mount.clone());
        }
        if let Err(e) = made {
            unmount(path);
            let _ = fs::remove_file(&image);
            let _ = fs::remove_dir(path);
            if let Source::Spare(spare) = source {
                let _ = fs::remove_file(&spare.image);
            }
            return Err(e);
        }
        // Both new names (mount point, image) reach the disk with the workspace's first sync.
        let names = vec![
            self.dir.clone(),
            path.parent().unwrap_or(Path::new("/")).to_owned(),
        ];
        Ok(Workspace::on_image(
            path,
            lease,
            size_bytes,
            fs_inodes as usize,
            image,
            names,
        ))
    }

    /// Takes over the workspace at `path` after the process that made it died: still mounted
    /// (a server killed with -9), it must be this workspace's image; not mounted (the host
    /// rebooted, or an operator unmounted it), its image is mounted again. A tmpfs workspace
    /// from a runcell without images is adopted as it is. Either way the workspace must belong
    /// to the lease's uid.
    pub fn adopt(&self, path: &Path, lease: UidLease) -> Result<Workspace, WorkspaceError> {
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: path.to_owned(),
            source,
        };
        let not_ours =
            |why: &'static str| io_err("adopt", io::Error::new(io::ErrorKind::InvalidData, why));
        let meta = fs::symlink_metadata(path).map_err(|e| io_err("open", e))?;
        let parent = path
            .parent()
            .and_then(|p| fs::metadata(p).ok())
            .ok_or_else(|| io_err("open", io::Error::from(io::ErrorKind::NotFound)))?;
        if !meta.is_dir() || meta.uid() != lease.uid() {
            return Err(not_ours("not a workspace of this uid"));
        }
        let image = self.image_of(path);
        if meta.dev() != parent.dev() {
            if fs_type(path).map_err(|e| io_err("statfs", e))? == libc::TMPFS_MAGIC {
                return Workspace::adopt(path, lease);
            }
            // Mounted: the loop device under it must read this workspace's image.
            let expected = self.dir_real.join(image.file_name().unwrap_or_default());
            if loopdev::backing_file(meta.dev()).as_deref() != Some(expected.as_path()) {
                return Err(not_ours("mounted, but not from this workspace's image"));
            }
        } else {
            let file = open_image(&image).map_err(|e| io_err("open the image of", e))?;
            mount_image(&file, path).map_err(|e| io_err("mount the image on", e))?;
            let root = fs::symlink_metadata(path);
            if root.map(|m| m.uid()).ok() != Some(lease.uid()) {
                unmount(path);
                return Err(not_ours("its image's root belongs to another uid"));
            }
        }
        let st = statfs(path).map_err(|e| io_err("statfs", e))?;
        // What the sandbox may fill: what it holds plus what it may still write.
        let size = (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_bsize as u64;
        Ok(Workspace::on_image(
            path,
            lease,
            size,
            st.f_files as usize,
            image,
            Vec::new(),
        ))
    }

    /// Removes the image of a workspace that is not mounted (one whose server died before
    /// mounting it, or whose directory is gone).
    pub fn discard(&self, workspace: &Path) {
        let _ = fs::remove_file(self.image_of(workspace));
    }

    /// The names of every image (without `.ext4`), for a sweep of those nobody needs.
    pub fn images(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                Some(name.strip_suffix(".ext4")?.to_owned())
            })
            .collect()
    }

    /// Makes one spare workspace filesystem of `size_bytes` and keeps it mounted for the next
    /// [`WorkspaceImages::create`] of that size: binding it into place is a few system calls,
    /// where binding a loop device and mounting take 10-30 ms.
    pub fn make_spare(&self, size_bytes: u64) -> Result<(), WorkspaceError> {
        let inodes = crate::workspace::inodes_for(size_bytes);
        let template = self.template(size_bytes, inodes)?;
        let name = format!(
            "{}-{}",
            std::process::id(),
            SPARE_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let spares = self.dir.join("spares");
        let (image, mount) = (spares.join(format!("{name}.ext4")), spares.join(name));
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: mount.clone(),
            source,
        };
        fs::create_dir(&mount).map_err(|e| io_err("create", e))?;
        let made = copy_template(&template, &image)
            .and_then(|file| mount_image(&file, &mount))
            .and_then(|()| statfs(&mount));
        match made {
            Ok(st) => {
                self.spares
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Spare {
                        image,
                        mount,
                        size_bytes,
                        inodes: st.f_files,
                    });
                Ok(())
            }
            Err(e) => {
                unmount(&mount);
                let _ = fs::remove_dir(&mount);
                let _ = fs::remove_file(&image);
                Err(io_err("make a spare workspace at", e))
            }
        }
    }

    /// Detaches the mounts of spares taken since the last call (the workspaces they became
    /// hold their own bind mounts). A spare filler calls this between spares.
    pub fn tidy(&self) {
        let taken = std::mem::take(&mut *self.taken.lock().unwrap_or_else(|p| p.into_inner()));
        for mount in taken {
            unmount(&mount);
            let _ = fs::remove_dir(&mount);
        }
    }

    /// Waits up to `timeout` for dropped workspaces' filesystems to be shut down and their
    /// images deleted (off the dropping thread's path); whether they all were. A clean stop
    /// calls this last.
    pub fn wait_removals(&self, timeout: std::time::Duration) -> bool {
        wait_removals(timeout)
    }

    /// Bytes free on the filesystem that holds the images (what new images may still take).
    pub fn room(&self) -> Option<u64> {
        statfs(&self.dir)
            .ok()
            .map(|st| st.f_bavail * st.f_bsize as u64)
    }

    /// Spares of `size_bytes` ready now.
    pub fn spares(&self, size_bytes: u64) -> usize {
        let spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        spares.iter().filter(|s| s.size_bytes == size_bytes).count()
    }

    /// Unmounts and deletes every spare (at a clean stop).
    pub fn remove_spares(&self) {
        self.tidy();
        let spares = std::mem::take(&mut *self.spares.lock().unwrap_or_else(|p| p.into_inner()));
        for s in spares {
            unmount(&s.mount);
            let _ = fs::remove_dir(&s.mount);
            let _ = fs::remove_file(&s.image);
        }
    }

    /// Whatever `spares/` holds: after a crash, spares still mounted (unmounted here) and
    /// their images; nothing there ever belongs to a session.
    fn remove_spares_on_disk(&self) {
        let Ok(entries) = fs::read_dir(self.dir.join("spares")) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => {
                    unmount(&p);
                    let _ = fs::remove_dir(&p);
                }
                _ => {
                    let _ = fs::remove_file(&p);
                }
            }
        }
    }

    /// The template for `size_bytes` usable bytes and `inodes` inodes, made on first use
    /// (and kept on disk for the next server).
    fn template(&self, size_bytes: u64, inodes: u64) -> Result<Arc<Template>, WorkspaceError> {
        let mut map = self.templates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = map.get(&(size_bytes, inodes)) {
            return Ok(t.clone());
        }
        let path = self
            .dir
            .join("templates")
            .join(format!("{size_bytes}-{inodes}-v{TEMPLATE_VERSION}.ext4"));
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: path.clone(),
            source,
        };
        if fs::symlink_metadata(&path).is_err() {
            self.make_template(&path, size_bytes, inodes)?;
        }
        let file = File::open(&path).map_err(|e| io_err("open", e))?;
        let len = file.metadata().map_err(|e| io_err("stat", e))?.len();
        let extents = data_extents(&file).map_err(|e| io_err("read the extents of", e))?;
        let t = Arc::new(Template { path, len, extents });
        map.insert((size_bytes, inodes), t.clone());
        Ok(t)
    }

    /// mkfs, then, mounted once: no lost+found (the sandbox's listing would show it), and the
    /// blocks beyond `size_bytes` reserved for root, so an unprivileged writer (the sandbox
    /// user) gets ENOSPC after exactly `size_bytes`; the journal, inode tables and ext4's own
    /// reserve come on top and never out of the quota. Made under a temporary name and
    /// renamed, so a template that exists is complete.
    fn make_template(
        &self,
        path: &Path,
        size_bytes: u64,
        inodes: u64,
    ) -> Result<(), WorkspaceError> {
        let tmp = path.with_extension("tmp");
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: tmp.clone(),
            source,
        };
        // Room for the metadata (inode tables, journal, bitmaps and group descriptors; ~1/32
        // covers those and ext4's own reserve of 2%), at least twice the journal (mkfs's
        // minimum); more if that was not enough.
        let mut len =
            (size_bytes + inodes * INODE_BYTES + (JOURNAL_MIB << 20) + size_bytes / 32 + (1 << 20))
                .max(2 * (JOURNAL_MIB << 20) + (2 << 20));
        let avail = loop {
            len = len.next_multiple_of(u64::from(loopdev::BLOCK_SIZE));
            let avail = self
                .format(&tmp, len, inodes)
                .map_err(|e| io_err("make", e))?;
            if avail >= size_bytes {
                break avail;
            }
            if len > 2 * size_bytes + (64 << 20) {
                return Err(io_err(
                    "size",
                    io::Error::other(format!("{avail} bytes usable, {size_bytes} wanted")),
                ));
            }
            len += size_bytes - avail + (1 << 20);
        };
        // tune2fs keeps at most half the filesystem for root: a workspace of a few MiB gets
        // what remains past that (its journal alone is 4 MiB), a larger one exactly its size.
        let blocks = len / u64::from(loopdev::BLOCK_SIZE);
        let reserve =
            ((avail - size_bytes) / u64::from(loopdev::BLOCK_SIZE)).min(blocks * 49 / 100);
        run(Command::new(&self.tune2fs)
            .arg("-r")
            .arg(reserve.to_string())
            .arg(&tmp))
        .map_err(|e| io_err("tune2fs", e))?;
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err("fsync", e))?;
        fs::rename(&tmp, path).map_err(|e| io_err("rename", e))?;
        Ok(())
    }

    /// A new filesystem of `len` bytes and `inodes` ordinary inodes in `tmp`, without
    /// lost+found; returns what an unprivileged writer may fill in it.
    fn format(&self, tmp: &Path, len: u64, inodes: u64) -> io::Result<u64> {
        let _ = fs::remove_file(tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)?;
        file.set_len(len)?;
        drop(file);
        run(Command::new(&self.mkfs)
            .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-I"])
            .arg(INODE_BYTES.to_string())
            .args(["-m", "0", "-N"])
            .arg((inodes + RESERVED_INODES).to_string())
            .args(["-J", &format!("size={JOURNAL_MIB}")])
            // No room kept for growing: a workspace never grows in place.
            .args(["-O", "^resize_inode"])
            .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
            .args(["-L", "runcell-ws"])
            .arg(tmp))?;
        let mnt = tmp.with_extension("mnt");
        let _ = fs::remove_dir(&mnt);
        fs::create_dir(&mnt)?;
        let avail = (|| {
            let file = open_image(tmp)?;
            mount_image(&file, &mnt)?;
            let r = (|| {
                fs::remove_dir(mnt.join("lost+found"))?;
                let st = statfs(&mnt)?;
                Ok::<_, io::Error>(st.f_bavail * st.f_bsize as u64)
            })();
            unmount_now(&mnt);
            r
        })();
        let _ = fs::remove_dir(&mnt);
        avail
    }
}

/// Whether `mkfs.ext4` and `tune2fs` are there (for `runcell doctor`).
pub(crate) fn tools_available() -> io::Result<()> {
    find_tool("mkfs.ext4")
        .and_then(|_| find_tool("tune2fs"))
        .map(drop)
}

/// `mkfs.ext4` and `tune2fs` live in sbin, which a server's PATH may lack.
fn find_tool(name: &str) -> io::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name} (e2fsprogs)")))
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.stdin(std::process::Stdio::null()).output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// The parts of `file` that are not holes.
fn data_extents(file: &File) -> io::Result<Vec<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let end = file.metadata()?.len() as i64;
    let mut out = Vec::new();
    let mut at = 0;
    while at < end {
        // SAFETY: lseek on our own descriptor.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::ENXIO) => break, // only a hole is left
                _ => return Err(io::Error::last_os_error()),
            }
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        out.push((data as u64, (hole - data) as u64));
        at = hole;
    }
    Ok(out)
}

/// A new image at `dst` (which must not exist): the template's length, its data extents
/// copied, holes elsewhere.
fn copy_template(t: &Template, dst: &Path) -> io::Result<File> {
    let src = File::open(&t.path)?;
    let out = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dst)?;
    out.set_len(t.len)?;
    let mut buf = vec![0u8; 64 << 10];
    for &(start, len) in &t.extents {
        let mut done = 0;
        while done < len {
            let n = buf.len().min((len - done) as usize);
            src.read_exact_at(&mut buf[..n], start + done)?;
            out.write_all_at(&buf[..n], start + done)?;
            done += n as u64;
        }
    }
    Ok(out)
}

/// Opens an existing image for its loop device, never through a symlink.
fn open_image(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// Binds `image` to a loop device and mounts it on `target`; the device goes away with the
/// mount (autoclear).
fn mount_image(image: &File, target: &Path) -> io::Result<()> {
    let dev = LoopDevice::attach(image)?;
    let src = cstr(dev.path())?;
    let dst = cstr(target)?;
    // SAFETY: valid NUL-terminated strings for every argument.
    let r = cvt(unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            c"ext4".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            MOUNT_OPTIONS.as_ptr().cast(),
        )
    });
    if let Err(e) = r {
        dev.detach();
        return Err(e);
    }
    Ok(())
}

/// An unmount that has let go of the image when it returns (nothing else uses the mount).
fn unmount_now(path: &Path) {
    if let Ok(c) = cstr(path) {
        // SAFETY: a valid path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            // SAFETY: as above.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Binds the filesystem mounted at `from` on `to` too (same mount flags: nosuid, nodev).
fn bind(from: &Path, to: &Path) -> io::Result<()> {
    let (src, dst) = (cstr(from)?, cstr(to)?);
    // SAFETY: valid NUL-terminated paths; no filesystem type or data for a bind.
    cvt(unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    })
    .map(drop)
}

fn chown_nofollow(path: &Path, uid: u32) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: a valid path; lchown never follows a symlink.
    cvt(unsafe { libc::lchown(c.as_ptr(), uid, uid) }).map(drop)
}

fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

pub(crate) fn statfs(path: &Path) -> io::Result<libc::statfs> {
    let c = cstr(path)?;
    // SAFETY: an all-zero statfs is a valid value for the kernel to overwrite.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and out-pointer.
    cvt(unsafe { libc::statfs(c.as_ptr(), &mut st) })?;
    Ok(st)
}

fn fs_type(path: &Path) -> io::Result<libc::c_long> {
    statfs(path).map(|s| s.f_type as libc::c_long)
}
