//! The host side of `/workspace`: a directory backed by its own size-limited filesystem (so a
//! full workspace is ENOSPC, enforced by the kernel), owned by the sandbox's host uid. A
//! session's is an ext4 image on disk ([`crate::WorkspaceImages`]); a one-shot run's, which
//! nothing needs after its reply, a tmpfs.
//!
//! Host code never follows a path the sandbox could have planted: every walk below goes
//! descriptor by descriptor with `O_NOFOLLOW`, starting from the workspace root.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use crate::sys::{cstr, cvt};
use crate::user_ns::UidLease;

/// Longest relative path accepted, in characters (so at most 4 KiB of UTF-8); each component is
/// also limited to NAME_MAX (255 bytes). Characters, not bytes, because that is what a JSON
/// Schema `maxLength` (the API's document) can state; the walk goes component by component, so
/// the kernel's PATH_MAX never applies.
pub const MAX_PATH_CHARS: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
}

/// A mounted, size-limited workspace. Unmounted and removed on drop (its image too).
#[derive(Debug)]
pub struct Workspace {
    path: PathBuf,
    /// Taken only by [`Workspace::unmount_keeping`], which leaves nothing to drop.
    lease: Option<UidLease>,
    /// The host uid of `lease`.
    uid: u32,
    size_bytes: u64,
    /// The filesystem image under the mount, for a workspace on disk; `None` for a tmpfs.
    image: Option<PathBuf>,
    /// Directories whose new entries (the mount point, the image) the first sync makes
    /// durable too: a workspace nothing was acknowledged in need not survive a power loss.
    unsynced_names: std::sync::Mutex<Vec<PathBuf>>,
    /// The root directory, opened by the first snapshot and rewound by the next ones (two
    /// snapshots a cell: reopening it each time was two path walks and two closes).
    root: std::sync::Mutex<Option<rustix::fs::Dir>>,
    /// Entries a walk takes at most: the tmpfs's inode quota, so a walk of a workspace the
    /// sandbox filled to its quota is still complete (a walk that stopped short would make
    /// every file it did not reach look deleted).
    max_entries: usize,
    /// Walks of the tree so far (snapshots and listings): an upload must not cost one.
    scans: std::sync::atomic::AtomicU64,
    /// Kept at drop ([`Workspace::keep`]): a server stopping with paused sessions.
    keep: std::sync::atomic::AtomicBool,
}

/// The regular files of a workspace at one moment, and whether the walk saw all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub files: BTreeMap<String, FileStat>,
    /// `false` when a directory could not be read (descriptors exhausted, say) or the walk
    /// reached its bound: a file missing from `files` may still exist.
    pub complete: bool,
}

impl Workspace {
    /// Creates `path` (which must not exist), mounts a tmpfs of `size_bytes` on it and gives it to
    /// the lease's host uid.
    pub fn create(
        path: &Path,
        size_bytes: u64,
        lease: UidLease,
    ) -> Result<Workspace, WorkspaceError> {
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: path.to_owned(),
            source,
        };
        fs::create_dir(path).map_err(|e| io_err("create", e))?;
        let uid = lease.uid();
        let inodes = inodes_for(size_bytes);
        let options = format!("size={size_bytes},nr_inodes={inodes},mode=0700,uid={uid},gid={uid}");
        let c_path = cstr(path).map_err(|e| io_err("mount", e))?;
        let c_opts = CString::new(options).map_err(|_| {
            io_err(
                "mount",
                io::Error::new(io::ErrorKind::InvalidInput, "NUL in options"),
            )
        })?;
        // SAFETY: valid NUL-terminated strings for every argument.
        let mounted = cvt(unsafe {
            libc::mount(
                c"runcell-workspace".as_ptr(),
                c_path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c_opts.as_ptr().cast(),
            )
        });
        if let Err(e) = mounted {
            let _ = fs::remove_dir(path);
            return Err(io_err("mount a tmpfs on", e));
        }
        Ok(Workspace {
            path: path.to_owned(),
            uid: lease.uid(),
            lease: Some(lease),
            size_bytes,
            image: None,
            unsynced_names: Default::default(),
            root: std::sync::Mutex::new(None),
            max_entries: inodes as usize,
            scans: Default::default(),
            keep: Default::default(),
        })
    }

    /// A workspace mounted from `image` (see [`crate::WorkspaceImages`]).
    pub(crate) fn on_image(
        path: &Path,
        lease: UidLease,
        size_bytes: u64,
        inodes: usize,
        image: PathBuf,
        unsynced_names: Vec<PathBuf>,
    ) -> Workspace {
        Workspace {
            path: path.to_owned(),
            uid: lease.uid(),
            lease: Some(lease),
            size_bytes,
            image: Some(image),
            unsynced_names: std::sync::Mutex::new(unsynced_names),
            root: std::sync::Mutex::new(None),
            max_entries: inodes.max(MIN_WALK_ENTRIES),
            scans: Default::default(),
            keep: Default::default(),
        }
    }

    /// Takes over a workspace that outlived the process that created it (a server killed
    /// with -9): it must still be runcell's tmpfs mount, owned by the lease's uid.
    pub fn adopt(path: &Path, lease: UidLease) -> Result<Workspace, WorkspaceError> {
        use std::os::unix::fs::MetadataExt;
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: path.to_owned(),
            source,
        };
        let meta = fs::symlink_metadata(path).map_err(|e| io_err("open", e))?;
        let parent = path
            .parent()
            .and_then(|p| fs::metadata(p).ok())
            .ok_or_else(|| io_err("open", io::Error::from(io::ErrorKind::NotFound)))?;
        // A mount point sits on another device than its parent; ours is owned by the lease.
        if !meta.is_dir() || meta.dev() == parent.dev() || meta.uid() != lease.uid() {
            return Err(io_err(
                "adopt",
                io::Error::new(io::ErrorKind::InvalidData, "not a runcell workspace mount"),
            ));
        }
        let c = cstr(path).map_err(|e| io_err("statfs", e))?;
        // SAFETY: an all-zero statfs is a valid value for the kernel to overwrite.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid path and out-pointer.
        cvt(unsafe { libc::statfs(c.as_ptr(), &mut st) }).map_err(|e| io_err("statfs", e))?;
        if st.f_type != libc::TMPFS_MAGIC {
            return Err(io_err(
                "adopt",
                io::Error::new(io::ErrorKind::InvalidData, "not a tmpfs"),
            ));
        }
        Ok(Workspace {
            path: path.to_owned(),
            uid: lease.uid(),
            lease: Some(lease),
            size_bytes: st.f_blocks * st.f_bsize as u64,
            image: None,
            unsynced_names: Default::default(),
            root: std::sync::Mutex::new(None),
            max_entries: (st.f_files as usize).max(MIN_WALK_ENTRIES),
            scans: Default::default(),
            keep: Default::default(),
        })
    }

    /// The host uid that owns the workspace at `path` (to re-acquire its lease).
    pub fn owner_of(path: &Path) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        fs::symlink_metadata(path).ok().map(|m| m.uid())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The host uid the sandbox user maps to for this workspace.
    pub fn host_uid(&self) -> u32 {
        self.uid
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Whether the files are on disk (an image), so [`Workspace::sync`] makes them outlive a
    /// crash of the host; a tmpfs workspace's never do.
    pub fn is_durable(&self) -> bool {
        self.image.is_some()
    }

    /// Makes everything written to the workspace so far durable (syncfs of its own
    /// filesystem: the sandbox's writes and the host's, nobody else's; the flush reaches the
    /// backing disk through the loop device). Nothing to do for a tmpfs.
    pub fn sync(&self) -> Result<(), WorkspaceError> {
        if self.image.is_none() {
            return Ok(());
        }
        let io_err = |source| WorkspaceError::Io {
            action: "sync",
            path: self.path.clone(),
            source,
        };
        let dir = open_dir_nofollow(None, &self.path).map_err(io_err)?;
        // SAFETY: syncfs on our own descriptor.
        cvt(unsafe { libc::syncfs(dir.as_raw_fd()) }).map_err(io_err)?;
        let mut names = self
            .unsynced_names
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while let Some(d) = names.last() {
            open_dir_nofollow(None, d)
                .and_then(|f| fs::File::from(f).sync_all())
                .map_err(io_err)?;
            names.pop();
        }
        Ok(())
    }

    /// Walks of the tree done so far ([`Workspace::snapshot`], [`Workspace::list`]).
    pub fn scans(&self) -> u64 {
        self.scans.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes `data` to `rel` (creating parent directories), owned by the sandbox user, and
    /// returns what it wrote as a listing would show it, from the descriptor written (no walk
    /// of the directory: an upload of N files would otherwise cost N walks). Never follows a
    /// symlink: an existing symlink anywhere on the way is an error.
    pub fn write_file(&self, rel: &str, data: &[u8]) -> Result<FileStat, WorkspaceError> {
        let mut file = self.create_for_write(rel, data.len() as u64)?;
        file.write_all(data).map_err(|e| WorkspaceError::Io {
            action: "write",
            path: PathBuf::from(rel),
            source: e,
        })?;
        Self::stat_written(rel, &file)
    }

    /// [`Workspace::write_file`] with the content of `src` (from its current offset, `len`
    /// bytes): copied by the kernel (`copy_file_range`, or `sendfile` between filesystems),
    /// never through a buffer of ours. A 10 MB snapshot moved into a workspace this way costs
    /// no allocation and no page faults of the server's.
    pub fn write_file_from(
        &self,
        rel: &str,
        src: &mut fs::File,
        len: u64,
    ) -> Result<FileStat, WorkspaceError> {
        let mut file = self.create_for_write(rel, len)?;
        let copied = io::copy(&mut io::Read::take(&mut *src, len), &mut file).map_err(|e| {
            WorkspaceError::Io {
                action: "write",
                path: PathBuf::from(rel),
                source: e,
            }
        })?;
        if copied != len {
            return Err(WorkspaceError::Io {
                action: "write",
                path: PathBuf::from(rel),
                source: io::Error::from(io::ErrorKind::UnexpectedEof),
            });
        }
        Self::stat_written(rel, &file)
    }

    fn stat_written(rel: &str, file: &fs::File) -> Result<FileStat, WorkspaceError> {
        let io_err = |source| WorkspaceError::Io {
            action: "stat",
            path: PathBuf::from(rel),
            source,
        };
        let meta = file.metadata().map_err(io_err)?;
        Ok(FileStat {
            size: meta.len(),
            modified: meta.modified().map_err(io_err)?,
        })
    }

    /// Creates (or truncates) `rel` for `len` bytes to be written, as [`Workspace::write_file`]
    /// says: parents made, owned by the sandbox user, never through a symlink, and refused
    /// when the sandbox's own room is less than `len`.
    fn create_for_write(&self, rel: &str, len: u64) -> Result<fs::File, WorkspaceError> {
        let parts = validate_relative(rel)?;
        let (file_name, dirs) = parts.split_last().ok_or(WorkspaceError::InvalidPath {
            path: rel.to_owned(),
            reason: "empty path",
        })?;
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: PathBuf::from(rel),
            source,
        };
        let mut dir = open_dir_nofollow(None, &self.path).map_err(|e| io_err("open", e))?;
        for d in dirs {
            let c = cname(d);
            // SAFETY: valid directory descriptor and name.
            let r = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) };
            if r == 0 {
                self.chown_at(&dir, &c).map_err(|e| io_err("chown", e))?;
            } else if io::Error::last_os_error().kind() != io::ErrorKind::AlreadyExists {
                return Err(io_err("create directory", io::Error::last_os_error()));
            }
            dir = open_dir_nofollow(Some(&dir), Path::new(d)).map_err(|e| io_err("open", e))?;
        }
        let c = cname(file_name);
        // SAFETY: valid directory descriptor and name; O_NOFOLLOW refuses a planted symlink.
        let fd = cvt(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o644,
            )
        })
        .map_err(|e| io_err("create", e))?;
        // SAFETY: openat succeeded; the descriptor is ours.
        let file = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let uid = self.uid;
        // SAFETY: fchown on our own descriptor.
        cvt(unsafe { libc::fchown(file.as_raw_fd(), uid, uid) }).map_err(|e| io_err("chown", e))?;
        if self.image.is_some() {
            // The host writes as root, which may use the blocks an image keeps beyond its
            // quota: the sandbox's room (measured after the truncation) bounds an upload too.
            let room = fstatfs_avail(&file).map_err(|e| io_err("statfs", e))?;
            if len > room {
                return Err(io_err("write", io::Error::from_raw_os_error(libc::ENOSPC)));
            }
        }
        Ok(file)
    }

    /// Reads `rel`; never through a symlink.
    pub fn read_file(&self, rel: &str, max_bytes: u64) -> Result<Vec<u8>, WorkspaceError> {
        use std::io::Read;
        let (file, size) = self.open_file(rel)?;
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: PathBuf::from(rel),
            source,
        };
        if size > max_bytes {
            return Err(io_err("read", io::Error::from(io::ErrorKind::FileTooLarge)));
        }
        let mut data = Vec::with_capacity(size as usize);
        file.take(max_bytes)
            .read_to_end(&mut data)
            .map_err(|e| io_err("read", e))?;
        Ok(data)
    }

    /// Opens the regular file `rel` for reading, and its size; never through a symlink (a
    /// FIFO the sandbox planted is not waited on: it is refused as not a regular file).
    pub fn open_file(&self, rel: &str) -> Result<(fs::File, u64), WorkspaceError> {
        let (dir, name) = self.open_parent(rel)?;
        let io_err = |action, source| WorkspaceError::Io {
            action,
            path: PathBuf::from(rel),
            source,
        };
        let c = cname(name);
        // SAFETY: valid directory descriptor and name; O_NOFOLLOW refuses a planted symlink.
        let fd = cvt(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        })
        .map_err(|e| io_err("open", e))?;
        // SAFETY: openat succeeded; the descriptor is ours.
        let file = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        if !meta.is_file() {
            return Err(io_err("read", io::Error::from(io::ErrorKind::InvalidInput)));
        }
        Ok((file, meta.len()))
    }

    /// Removes the file (or empty directory) `rel`; never through a symlink (a symlink itself
    /// is removed, not its target).
    pub fn delete(&self, rel: &str) -> Result<(), WorkspaceError> {
        let (dir, name) = self.open_parent(rel)?;
        let c = cname(name);
        // SAFETY: valid directory descriptor and name; unlinkat never follows the last component.
        let r = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
        let r = if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EISDIR) {
            // SAFETY: as above, for an (empty) directory.
            unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) }
        } else {
            r
        };
        cvt(r).map_err(|source| WorkspaceError::Io {
            action: "delete",
            path: PathBuf::from(rel),
            source,
        })?;
        Ok(())
    }

    /// The files under directory `rel` ("" for the whole workspace), relative to the workspace.
    pub fn list(&self, rel: &str) -> Result<BTreeMap<String, FileStat>, WorkspaceError> {
        // "", ".", "./", "./." ... all name the workspace itself.
        if !rel.starts_with('/') && rel.split('/').all(|c| c.is_empty() || c == ".") {
            return self.snapshot().map(|s| s.files);
        }
        self.scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let parts = validate_relative(rel)?;
        let mut dir = open_dir_nofollow(None, &self.path).map_err(|source| WorkspaceError::Io {
            action: "open",
            path: self.path.clone(),
            source,
        })?;
        for d in &parts {
            dir = open_dir_nofollow(Some(&dir), Path::new(d)).map_err(|source| {
                WorkspaceError::Io {
                    action: "open",
                    path: PathBuf::from(rel),
                    source,
                }
            })?;
        }
        let mut dir = rustix::fs::Dir::new(dir).map_err(|e| WorkspaceError::Io {
            action: "read",
            path: PathBuf::from(rel),
            source: e.into(),
        })?;
        let mut walk = Walk::new(self.max_entries);
        walk.dir(&mut dir, &parts.join("/"), 0);
        Ok(walk.out.files)
    }

    /// Opens the directory holding `rel` (no symlink on the way) and returns it with the name.
    fn open_parent<'a>(&self, rel: &'a str) -> Result<(OwnedFd, &'a str), WorkspaceError> {
        let parts = validate_relative(rel)?;
        let (name, dirs) = parts.split_last().ok_or(WorkspaceError::InvalidPath {
            path: rel.to_owned(),
            reason: "empty path",
        })?;
        let io_err = |source| WorkspaceError::Io {
            action: "open",
            path: PathBuf::from(rel),
            source,
        };
        let mut dir = open_dir_nofollow(None, &self.path).map_err(io_err)?;
        for d in dirs {
            dir = open_dir_nofollow(Some(&dir), Path::new(d)).map_err(io_err)?;
        }
        Ok((dir, name))
    }

    fn chown_at(&self, dir: &OwnedFd, name: &CString) -> io::Result<()> {
        let uid = self.uid;
        // SAFETY: valid descriptor and name; AT_SYMLINK_NOFOLLOW never touches a link target.
        cvt(unsafe {
            libc::fchownat(
                dir.as_raw_fd(),
                name.as_ptr(),
                uid,
                uid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(())
    }

    /// Every regular file under the workspace with its size and modification time, keyed by
    /// relative path. Symlinks and special files are skipped, never followed.
    pub fn snapshot(&self) -> Result<Snapshot, WorkspaceError> {
        self.scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut walk = Walk::new(self.max_entries);
        let mut root = self.root.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *root {
            Some(dir) => dir.rewind(),
            None => {
                let io_err = |source| WorkspaceError::Io {
                    action: "open",
                    path: self.path.clone(),
                    source,
                };
                let fd = open_dir_nofollow(None, &self.path).map_err(io_err)?;
                *root = Some(rustix::fs::Dir::new(fd).map_err(|e| io_err(e.into()))?);
            }
        }
        if let Some(dir) = &mut *root {
            walk.dir(dir, "", 0);
        }
        Ok(walk.out)
    }
}

impl Workspace {
    /// Keeps the files when the workspace is dropped (a server stopping while its session
    /// is paused, to be adopted by the next one): an image is synced and unmounted, its mount
    /// point and image left in place; a tmpfs stays mounted (unmounting would lose it).
    pub fn keep(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Unmounts an image workspace at once, keeping its image and mount point, and gives back
    /// its uid lease (a session paused for a while: mounted again at its resume). Refused
    /// (the workspace back) for a tmpfs, which would lose its files, and while something
    /// still uses the filesystem: a lazy unmount would leave it attached while a later mount
    /// of the same image wrote to it too.
    pub fn unmount_keeping(mut self: Box<Self>) -> Result<UidLease, Box<Workspace>> {
        if self.image.is_none() || self.sync().is_err() {
            return Err(self);
        }
        self.root.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Ok(c) = cstr(&self.path) else {
            return Err(self);
        };
        // SAFETY: a valid path; no flags: fails with EBUSY rather than detaching.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            return Err(self);
        }
        self.keep();
        self.image = None;
        self.lease.take().ok_or(self)
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.keep.load(std::sync::atomic::Ordering::SeqCst) {
            // `image` is none once `unmount_keeping` unmounted it.
            if self.image.is_some() {
                let _ = self.sync();
                self.root.lock().unwrap_or_else(|p| p.into_inner()).take();
                crate::removal::unmount(&self.path);
            }
            return;
        }
        // An image: descriptors on its filesystem keep it alive past the unmount below, which
        // then only detaches the mount point (as for a tmpfs); the filesystem's shutdown and
        // the image's deletion happen on the removal thread (`removal::remove_later`).
        let holders: Vec<Box<dyn Send>> = match self.image {
            Some(_) => {
                let cached = self.root.lock().unwrap_or_else(|p| p.into_inner()).take();
                let fresh = open_dir_nofollow(None, &self.path).ok();
                vec![Box::new(cached), Box::new(fresh)]
            }
            None => Vec::new(),
        };
        // MNT_DETACH so a lingering reference cannot keep it busy.
        crate::removal::unmount(&self.path);
        let _ = fs::remove_dir(&self.path);
        if let Some(image) = self.image.take() {
            crate::removal::remove_later(crate::removal::Remains { holders, image });
        }
    }
}

/// The inode quota of a workspace of `size_bytes`: one per 2 KiB, at least 1,024 and at most
/// 2^20 (a tmpfs's `nr_inodes`; an image's inode table).
pub(crate) fn inodes_for(size_bytes: u64) -> u64 {
    (size_bytes / 2048).clamp(1024, 1 << 20)
}

/// Bytes an unprivileged writer may still add to the filesystem holding `file`.
fn fstatfs_avail(file: &fs::File) -> io::Result<u64> {
    // SAFETY: an all-zero statfs is a valid value for the kernel to overwrite.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: our own descriptor and a valid out-pointer.
    cvt(unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) })?;
    Ok(st.f_bavail * st.f_bsize as u64)
}

/// What the host knows of one workspace file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub size: u64,
    pub modified: SystemTime,
}

/// Directories deeper than this are not entered (in any walk, so what lies below is
/// consistently unseen, never reported deleted).
const MAX_DEPTH: usize = 64;
/// The bound of a walk of a workspace whose inode quota is unknown or smaller.
const MIN_WALK_ENTRIES: usize = 1024;

/// One walk of a tree: what it found, and whether it saw everything.
struct Walk {
    out: Snapshot,
    max_entries: usize,
}

impl Walk {
    fn new(max_entries: usize) -> Walk {
        Walk {
            out: Snapshot {
                files: BTreeMap::new(),
                complete: true,
            },
            max_entries,
        }
    }

    /// Reads `dir` from where it stands (a fresh or rewound stream) and everything below it.
    fn dir(&mut self, dir: &mut rustix::fs::Dir, prefix: &str, depth: usize) {
        use rustix::fs::FileType;
        if depth > MAX_DEPTH {
            return;
        }
        // Entries come from the descriptor itself (getdents): exactly the directory we opened,
        // whatever happened to its path since.
        let Ok(fd) = dir.fd().map(|fd| fd.as_raw_fd()) else {
            self.out.complete = false;
            return;
        };
        loop {
            let entry = match dir.read() {
                None => break,
                Some(Ok(e)) => e,
                Some(Err(_)) => {
                    self.out.complete = false;
                    break;
                }
            };
            if self.out.files.len() >= self.max_entries {
                self.out.complete = false;
                return;
            }
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let rel = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            };
            // The entry's type saves a stat for directories and whatever is neither (tmpfs
            // reports it; other file systems may say "unknown", and then the stat decides).
            let kind = match entry.file_type() {
                FileType::Unknown => match fstatat_nofollow(fd, name) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    // Removed since getdents: gone, not unseen.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(_) => {
                        self.out.complete = false;
                        continue;
                    }
                },
                k => k,
            };
            match kind {
                FileType::RegularFile => {
                    let stat = match fstatat_nofollow(fd, name) {
                        Ok(st) => st,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(_) => {
                            self.out.complete = false;
                            continue;
                        }
                    };
                    // A file replaced by something else since getdents is not a file.
                    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
                        continue;
                    }
                    let modified = SystemTime::UNIX_EPOCH
                        + std::time::Duration::new(stat.st_mtime as u64, stat.st_mtime_nsec as u32);
                    self.out.files.insert(
                        rel,
                        FileStat {
                            size: stat.st_size as u64,
                            modified,
                        },
                    );
                }
                FileType::Directory => {
                    // O_NOFOLLOW: a directory swapped for a symlink since getdents is not
                    // entered.
                    let sub = open_dir_at_nofollow(fd, name)
                        .and_then(|fd| rustix::fs::Dir::new(fd).map_err(io::Error::from));
                    match sub {
                        Ok(mut sub) => self.dir(&mut sub, &rel, depth + 1),
                        // Removed, or now a symlink (ELOOP, ENOTDIR): nothing of ours below it.
                        Err(e)
                            if matches!(
                                e.raw_os_error(),
                                Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
                            ) => {}
                        Err(_) => self.out.complete = false,
                    }
                }
                _ => {}
            }
        }
    }
}

fn fstatat_nofollow(dir: std::os::fd::RawFd, name: &str) -> io::Result<libc::stat> {
    let c = cname(name);
    // SAFETY: an all-zero stat is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, name and out-pointer.
    cvt(unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

/// [`open_dir_nofollow`] of `name` in the directory open as `dir`.
fn open_dir_at_nofollow(dir: std::os::fd::RawFd, name: &str) -> io::Result<OwnedFd> {
    let c = cname(name);
    // SAFETY: valid descriptor and name.
    let fd = cvt(unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: openat succeeded; the descriptor is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_dir_nofollow(at: Option<&OwnedFd>, path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    let base = at.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: valid descriptor (or AT_FDCWD) and path.
    let fd = cvt(unsafe {
        libc::openat(
            base,
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: openat succeeded; the descriptor is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cname(name: &str) -> CString {
    // validate_relative already refused NUL bytes.
    CString::new(name).unwrap_or_default()
}

/// Checks a client-supplied path relative to the workspace and splits it into components:
/// no absolute paths, no `..`, no NUL, no empty or over-long names.
pub fn validate_relative(rel: &str) -> Result<Vec<&str>, WorkspaceError> {
    let bad = |reason| WorkspaceError::InvalidPath {
        path: rel.chars().take(200).collect(),
        reason,
    };
    if rel.is_empty() {
        return Err(bad("empty path"));
    }
    if rel.len() > MAX_PATH_CHARS && rel.chars().count() > MAX_PATH_CHARS {
        return Err(bad("the path is longer than 1024 characters"));
    }
    if rel.contains('\0') {
        return Err(bad("path contains a NUL byte"));
    }
    if rel.starts_with('/') {
        return Err(bad("absolute paths are not allowed"));
    }
    let mut parts = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(s) => {
                if s.as_bytes().len() > 255 && s.to_string_lossy().chars().count() > 255 {
                    return Err(bad("a path component is longer than 255 characters"));
                }
                if s.as_bytes().len() > 255 {
                    // A name the document allows (255 characters) that the filesystem cannot
                    // hold (NAME_MAX is 255 bytes): the kernel's own ENAMETOOLONG, which the
                    // engine answers as a conflict with the workspace, not a malformed path.
                    return Err(WorkspaceError::Io {
                        action: "name",
                        path: PathBuf::from(rel.chars().take(200).collect::<String>()),
                        source: io::Error::from_raw_os_error(libc::ENAMETOOLONG),
                    });
                }
                parts.push(s.to_str().unwrap_or_default());
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("'..' is not allowed")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(bad("absolute paths are not allowed"))
            }
        }
    }
    if parts.is_empty() {
        return Err(bad("empty path"));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_escaping_and_malformed_paths() {
        for (p, why) in [
            ("", "empty path"),
            ("/etc/passwd", "absolute paths are not allowed"),
            ("../x", "'..' is not allowed"),
            ("a/../../x", "'..' is not allowed"),
            ("a\0b", "path contains a NUL byte"),
            (".", "empty path"),
        ] {
            match validate_relative(p) {
                Err(WorkspaceError::InvalidPath { reason, .. }) => assert_eq!(reason, why, "{p:?}"),
                other => panic!("{p:?}: {other:?}"),
            }
        }
        let long = "a".repeat(256);
        assert!(matches!(
            validate_relative(&long),
            Err(WorkspaceError::InvalidPath { .. })
        ));
        // 255 characters the document allows, over NAME_MAX's 255 bytes: the kernel's error.
        match validate_relative(&"é".repeat(200)) {
            Err(WorkspaceError::Io { source, .. }) => {
                assert_eq!(source.raw_os_error(), Some(libc::ENAMETOOLONG))
            }
            other => panic!("{other:?}"),
        }
        assert!(validate_relative(&"a/".repeat(600)).is_err());
        // The whole path's bound is in characters: 11 names of 85 three-byte characters (255
        // bytes each, the most a name takes) are 945 characters and 2,805 bytes.
        let wide = vec!["€".repeat(85); 11].join("/");
        assert_eq!(validate_relative(&wide).expect("ok").len(), 11);
        assert!(validate_relative(&format!("{}€", "€".repeat(85))).is_err());
        assert_eq!(
            validate_relative("./a/b.txt").expect("ok"),
            vec!["a", "b.txt"]
        );
    }
}
