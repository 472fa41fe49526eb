//! Loop devices: a file presented as a block device, so that a workspace's filesystem image
//! can be mounted. Host side only; the sandbox never sees a block device (its /dev is minimal).

use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::sys::cvt;

// <linux/loop.h>; the libc crate does not carry them.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
/// Detach the device when its last user (the mount) lets go: an unmount, lazy or not, or the
/// end of every mount namespace holding it, then frees it without a separate step.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Read and write the backing file with O_DIRECT: the workspace's pages are cached once (in
/// the filesystem on the device), not a second time for the backing file, and that second copy
/// would be charged to the writing session's memory cgroup too.
const LO_FLAGS_DIRECT_IO: u32 = 16;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// The block size of every workspace device: the filesystems are made with 4 KiB blocks, and
/// direct I/O needs the device's block size to be a multiple of the backing disk's.
pub(crate) const BLOCK_SIZE: u32 = 4096;

/// A loop device bound to a file, open. Closing it after the device is mounted leaves the
/// binding to the mount (autoclear).
#[derive(Debug)]
pub(crate) struct LoopDevice {
    fd: OwnedFd,
    path: PathBuf,
}

impl LoopDevice {
    /// Binds `backing` to a free loop device (autoclear, direct I/O where the backing file's
    /// filesystem allows it; the kernel falls back to buffered I/O silently where not).
    pub(crate) fn attach(backing: &File) -> io::Result<LoopDevice> {
        let ctl = open("/dev/loop-control")?;
        // Another process may take the device between GET_FREE and CONFIGURE (EBUSY): ask again.
        let mut last = io::Error::from(io::ErrorKind::ResourceBusy);
        for _ in 0..16 {
            // SAFETY: a request without an argument on our own descriptor.
            let n = cvt(unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) })?;
            let path = PathBuf::from(format!("/dev/loop{n}"));
            let dev = open(&path)?;
            let mut r = configure(&dev, backing, LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO);
            // A backing filesystem without O_DIRECT (some kernels refuse instead of falling
            // back): buffered, then.
            if r.as_ref().err().and_then(io::Error::raw_os_error) == Some(libc::EINVAL) {
                r = configure(&dev, backing, LO_FLAGS_AUTOCLEAR);
            }
            match r {
                Ok(()) => return Ok(LoopDevice { fd: dev, path }),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Unbinds a device that never got mounted (autoclear needs a user to let go first).
    pub(crate) fn detach(self) {
        const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
        // SAFETY: a request without an argument on our own descriptor.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), LOOP_CLR_FD as _) };
    }
}

fn configure(dev: &OwnedFd, backing: &File, flags: u32) -> io::Result<()> {
    // SAFETY: all-zero is a valid LoopConfig (plain integers and arrays).
    let mut config: LoopConfig = unsafe { std::mem::zeroed() };
    config.fd = backing.as_raw_fd() as u32;
    config.block_size = BLOCK_SIZE;
    config.info.lo_flags = flags;
    // SAFETY: LOOP_CONFIGURE reads one LoopConfig, which outlives the call.
    let r = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            LOOP_CONFIGURE as _,
            &config as *const LoopConfig,
        )
    };
    cvt(r).map(drop)
}

fn open(path: impl AsRef<Path>) -> io::Result<OwnedFd> {
    let c = crate::sys::cstr(path.as_ref())?;
    // SAFETY: a valid path; the result is checked.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })?;
    // SAFETY: open succeeded; the descriptor is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The file a loop device `major:minor` reads, as the kernel reports it (sysfs), or `None`
/// when that device is not a loop device or is unbound.
pub(crate) fn backing_file(dev: libc::dev_t) -> Option<PathBuf> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let raw =
        fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/loop/backing_file")).ok()?;
    Some(PathBuf::from(raw.trim_end_matches('\n')))
}

/// Whether this host can make loop devices (`/dev/loop-control` opens).
pub(crate) fn available() -> io::Result<()> {
    open("/dev/loop-control").map(drop)
}
