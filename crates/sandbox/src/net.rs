//! Step 2 (part): the network namespace has only a loopback interface. It is brought up so
//! programs can talk to themselves (local servers, multiprocessing managers); nothing routes out.

use std::io;

use crate::sys::cvt;

pub(crate) fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() with constant arguments.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: an all-zero ifreq is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads into `req`, which outlives the call.
    let got = cvt(unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) });
    let result = got.and_then(|_| {
        // SAFETY: the flags member is the active union member after SIOCGIFFLAGS.
        unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
        // SAFETY: SIOCSIFFLAGS reads `req`, which outlives the call.
        cvt(unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) })
    });
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    result.map(|_| ())
}
