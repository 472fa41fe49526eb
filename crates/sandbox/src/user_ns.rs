//! Step 1: the user namespace. The sandbox user (uid/gid 1000 inside) maps to one unprivileged
//! host id that no other sandbox uses at the same time; host root is never mapped, so nothing
//! inside can act as root on host-owned objects (sysctls such as core_pattern, host files).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::spec::SANDBOX_UID;
use crate::sys::cvt;

/// First host uid handed to sandboxes. Far above the ranges distributions give to users
/// (1000-60000) and to `/etc/subuid` (100000 + 65536 * n), so no host file is owned by it.
pub const HOST_UID_BASE: u32 = 2_000_000_000;
/// How many sandboxes can run at once on one host.
pub const HOST_UID_COUNT: u32 = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum UserNsError {
    #[error("cannot write {path}")]
    WriteMap {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create the uid lease directory {path}")]
    LeaseDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("all {0} sandbox host uids are in use")]
    Exhausted(u32),
    #[error("host uid {0} is in use by another sandbox")]
    InUse(u32),
    #[error("cannot switch to the sandbox user")]
    SetId(#[source] io::Error),
}

/// Writes the single-id maps of the child `pid` (run by its parent, outside the namespace, which
/// holds CAP_SETUID/CAP_SETGID there). `setgroups` is denied first: an unprivileged process may
/// otherwise drop a group that is used to deny it access.
pub(crate) fn write_id_maps(pid: libc::pid_t, host_id: u32) -> Result<(), UserNsError> {
    let write = |name: &str, content: String| {
        let path = PathBuf::from(format!("/proc/{pid}/{name}"));
        fs::write(&path, content).map_err(|source| UserNsError::WriteMap { path, source })
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{SANDBOX_UID} {host_id} 1\n"))?;
    write("gid_map", format!("{SANDBOX_UID} {host_id} 1\n"))?;
    Ok(())
}

/// Inside the new namespace: become uid/gid 1000 while keeping the namespace's capabilities
/// for the mount steps that follow, so every file the setup creates is owned by a mapped id.
pub(crate) fn become_sandbox_user() -> Result<(), UserNsError> {
    // SAFETY: prctl with integer arguments has no memory effects.
    cvt(unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) }).map_err(UserNsError::SetId)?;
    // SAFETY: plain credential calls with integer arguments.
    cvt(unsafe { libc::setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID) })
        .map_err(UserNsError::SetId)?;
    // SAFETY: as above.
    cvt(unsafe { libc::setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID) })
        .map_err(UserNsError::SetId)?;
    crate::caps::raise_effective().map_err(UserNsError::SetId)?;
    Ok(())
}

/// A host uid reserved for one sandbox (or one session across its restarts). The reservation
/// is an advisory lock on a file, so it is released even if the process holding it is killed.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    _lock: File,
}

impl UidLease {
    /// Reserves a free host uid, starting the search at a random slot so concurrent callers
    /// rarely contend for the same file.
    pub fn acquire(lock_dir: &Path) -> Result<UidLease, UserNsError> {
        fs::create_dir_all(lock_dir).map_err(|source| UserNsError::LeaseDir {
            path: lock_dir.to_owned(),
            source,
        })?;
        let start = random_u32() % HOST_UID_COUNT;
        for i in 0..HOST_UID_COUNT {
            let uid = HOST_UID_BASE + (start + i) % HOST_UID_COUNT;
            let path = lock_dir.join(uid.to_string());
            let Ok(file) = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
            else {
                continue;
            };
            // SAFETY: flock on a descriptor we own.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if locked == 0 {
                return Ok(UidLease { uid, _lock: file });
            }
        }
        Err(UserNsError::Exhausted(HOST_UID_COUNT))
    }

    /// Reserves one particular host uid (a workspace that outlived its server is owned by it).
    pub fn acquire_uid(lock_dir: &Path, uid: u32) -> Result<UidLease, UserNsError> {
        if !(HOST_UID_BASE..HOST_UID_BASE + HOST_UID_COUNT).contains(&uid) {
            return Err(UserNsError::Exhausted(0));
        }
        fs::create_dir_all(lock_dir).map_err(|source| UserNsError::LeaseDir {
            path: lock_dir.to_owned(),
            source,
        })?;
        let path = lock_dir.join(uid.to_string());
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| UserNsError::LeaseDir {
                path: path.clone(),
                source,
            })?;
        // SAFETY: flock on a descriptor we own.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            return Err(UserNsError::InUse(uid));
        }
        Ok(UidLease { uid, _lock: file })
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        std::process::id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_and_released_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = UidLease::acquire(dir.path()).expect("a");
        let b = UidLease::acquire(dir.path()).expect("b");
        assert_ne!(a.uid(), b.uid());
        assert!(a.uid() >= HOST_UID_BASE && a.uid() < HOST_UID_BASE + HOST_UID_COUNT);
        let uid = a.uid();
        drop(a);
        // The lock is free again: locking the same file now succeeds.
        let f = File::options()
            .write(true)
            .open(dir.path().join(uid.to_string()))
            .expect("open");
        // SAFETY: flock on a descriptor we own.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, 0);
    }
}
