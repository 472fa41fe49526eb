//! Thin, checked wrappers over the raw system calls the isolation steps need.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Turns a `-1` return into the thread's `errno`.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Same as [`cvt`] for calls made through `libc::syscall`.
pub(crate) fn cvt_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub(crate) fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// A pipe whose both ends close on exec.
pub(crate) fn pipe_cloexec() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Closes every descriptor at or above `lowest`, except those in `keep`.
pub(crate) fn close_fds_from(lowest: libc::c_int, keep: &[libc::c_int]) {
    let mut keep: Vec<libc::c_int> = keep.iter().copied().filter(|&k| k >= lowest).collect();
    keep.sort_unstable();
    let mut from = lowest as libc::c_uint;
    for k in keep {
        close_range(from, k as libc::c_uint - 1);
        from = k as libc::c_uint + 1;
    }
    close_range(from, libc::c_uint::MAX);
}

fn close_range(first: libc::c_uint, last: libc::c_uint) {
    if first > last {
        return;
    }
    // SAFETY: close_range only closes descriptors; the callers own every descriptor in the range
    // (this runs in the init helper, which holds nothing it still needs there).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if ret != 0 {
        // Kernels before 5.9: close them one by one up to the soft limit.
        // SAFETY: getdtablesize has no preconditions.
        let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.max(1024) as libc::c_uint;
        for fd in first..=last.min(max) {
            // SAFETY: as above; EBADF for descriptors that are not open is harmless.
            unsafe { libc::close(fd as libc::c_int) };
        }
    }
}

/// Writes a whole buffer to a file descriptor, retrying on EINTR.
pub(crate) fn write_all_fd(fd: libc::c_int, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice of the given length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// A connected pair of Unix stream sockets, both close-on-exec.
pub(crate) fn socketpair_cloexec() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element array for socketpair to fill.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}
