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

/// Where pid 1 keeps the egress proxy's listening socket until the host takes a copy
/// (`pidfd_getfd`). Far above anything pid 1 opens during setup, and closed in the program
/// (step 5 closes every descriptor above the channel).
pub(crate) const EGRESS_FD: libc::c_int = 1000;

/// Listens on 127.0.0.1:`port` of the sandbox's network namespace and moves the socket to
/// [`EGRESS_FD`]. Only the host serves it: pid 1 never accepts.
pub(crate) fn egress_listen(port: u16) -> io::Result<()> {
    // SAFETY: socket() with constant arguments.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in and its size; `fd` is ours.
    let bound = cvt(unsafe {
        libc::bind(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })
    // SAFETY: listen on our own socket.
    .and_then(|_| cvt(unsafe { libc::listen(fd, 128) }))
    // SAFETY: dup3 onto a descriptor number pid 1 does not use.
    .and_then(|_| cvt(unsafe { libc::dup3(fd, EGRESS_FD, libc::O_CLOEXEC) }));
    // SAFETY: `fd` is ours and closed once (EGRESS_FD holds the socket now).
    unsafe { libc::close(fd) };
    bound.map(|_| ())
}
