//! Step 5 (part): capabilities and no_new_privs.

use std::io;

use crate::sys::cvt;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capget() -> io::Result<[CapData; 2]> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array as the v3 ABI requires.
    cvt(unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } as libc::c_int)?;
    Ok(data)
}

fn capset(data: &[CapData; 2]) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: header and a two-element data array as the v3 ABI requires.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } as libc::c_int)?;
    Ok(())
}

/// Makes every permitted capability effective again (after a uid change with KEEPCAPS).
pub(crate) fn raise_effective() -> io::Result<()> {
    let mut data = capget()?;
    for d in &mut data {
        d.effective = d.permitted;
    }
    capset(&data)
}

/// Drops every capability from every set: bounding and ambient first (they need
/// CAP_SETPCAP, which the later capset removes), then effective, permitted and inheritable.
pub(crate) fn drop_all() -> io::Result<()> {
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments. EINVAL past the kernel's last capability is fine.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(err);
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    cvt(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    })?;
    capset(&[CapData::default(); 2])
}

/// The highest capability number the running kernel knows. /proc may not be mounted yet or any
/// more, so ask the kernel directly: PR_CAPBSET_READ fails with EINVAL past the last one.
fn last_cap() -> libc::c_ulong {
    let mut cap: libc::c_ulong = 40;
    // SAFETY: prctl with integer arguments.
    while cap < 63 && unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap + 1, 0, 0, 0) } >= 0 {
        cap += 1;
    }
    cap
}

/// no_new_privs: execve can never grant privileges again (setuid bits, file capabilities).
/// Landlock and seccomp need it.
pub(crate) fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
    Ok(())
}
