//! Step 4 (part): rlimits, the backstop behind the cgroup. No RLIMIT_AS: it counts reserved
//! address space, which numpy/OpenBLAS and JITs reserve generously, and breaks them.

use std::io;

use crate::spec::InnerLimits;
use crate::sys::cvt;

#[derive(Debug, thiserror::Error)]
#[error("cannot set {name} to {value}")]
pub struct RlimitError {
    name: &'static str,
    value: u64,
    #[source]
    source: io::Error,
}

/// The rlimits every sandbox gets, as data: (resource, name, value).
pub(crate) fn table(limits: &InnerLimits) -> [(libc::__rlimit_resource_t, &'static str, u64); 4] {
    [
        // Bounds descriptor tables (and epoll/inotify memory) per process.
        (libc::RLIMIT_NOFILE, "RLIMIT_NOFILE", limits.nofile),
        // One file can never be larger than the workspace is allowed to be.
        (libc::RLIMIT_FSIZE, "RLIMIT_FSIZE", limits.fsize_bytes),
        // No core dumps: they would land in the workspace and can be huge.
        (libc::RLIMIT_CORE, "RLIMIT_CORE", 0),
        // Per host uid, which is unique to this sandbox: a second fork-bomb fence.
        (libc::RLIMIT_NPROC, "RLIMIT_NPROC", limits.nproc),
    ]
}

pub(crate) fn apply(limits: &InnerLimits) -> Result<(), RlimitError> {
    for (resource, name, value) in table(limits) {
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: `lim` is a valid rlimit struct.
        cvt(unsafe { libc::setrlimit(resource, &lim) }).map_err(|source| RlimitError {
            name,
            value,
            source,
        })?;
    }
    Ok(())
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit and returns the new soft
/// limit. A server holds several descriptors per live session (channel, output pipes, pidfd,
/// cgroup files, uid lease), so hundreds of sessions outgrow the common soft default of 1024
/// long before the hard limit; sandboxes set their own limit whatever this one is.
pub fn raise_nofile_soft_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit struct; raising soft up to hard needs no privilege.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_files_limit_rises_to_the_hard_one() {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: valid out-pointer.
        cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }).expect("getrlimit");
        let hard = lim.rlim_max;
        // Control: a soft limit below the hard one, as on a host with the usual 1024.
        lim.rlim_cur = 256.min(hard);
        // SAFETY: valid rlimit struct; lowering the soft limit needs no privilege.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }).expect("setrlimit");
        assert_eq!(raise_nofile_soft_limit().expect("raise"), hard);
        // SAFETY: valid out-pointer.
        cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }).expect("getrlimit");
        assert_eq!(lim.rlim_cur, hard);
    }
}
