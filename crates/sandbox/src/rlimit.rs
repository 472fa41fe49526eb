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
