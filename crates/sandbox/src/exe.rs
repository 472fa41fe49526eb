//! The init binary (the cold helper, the zygote) as the supervisor execs it: through a detached
//! clone of its directory's mount (`open_tree(OPEN_TREE_CLONE)`, then `/proc/self/fd/N/NAME`),
//! not by its host path.
//!
//! A process's `/proc/PID/exe` and `maps` name its binary as seen from the reader's root; for a
//! binary outside the reader's mount namespace that is the host path (`/home/me/runcell/target/
//! release/runcell`, a data dir in `/root`). Pid 1 of every sandbox, and a zygote-born session's
//! program, are forks of this binary: exec'd from a detached mount, the kernel can only name it
//! relative to that mount (`/runcell`), whoever reads. (Pid 1 is also non-dumpable, so the
//! program cannot read its `exe` at all; a zygote-born program reads its own.) Where the kernel
//! has no `open_tree` (before 5.2) or refuses it, the host path is used as before.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The init binary, and a detached clone of the mount of its directory when the kernel allows.
#[derive(Debug)]
pub(crate) struct InitExe {
    path: PathBuf,
    detached: Option<(OwnedFd, OsString)>,
}

impl InitExe {
    /// Opens the clone (best effort: on failure, [`InitExe::command`] uses `path`).
    pub(crate) fn new(path: &Path) -> InitExe {
        InitExe {
            path: path.to_owned(),
            detached: detached_clone(path),
        }
    }

    /// A command that execs the binary: through the detached clone, with the host path as
    /// `argv[0]` (so the host's `ps` still says what runs; pid 1 rewrites its own).
    pub(crate) fn command(&self) -> Command {
        match &self.detached {
            Some((dir, name)) => {
                let via = Path::new("/proc/self/fd")
                    .join(dir.as_raw_fd().to_string())
                    .join(name);
                let mut cmd = Command::new(via);
                cmd.arg0(&self.path);
                cmd
            }
            None => Command::new(&self.path),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether [`InitExe::command`] goes through the detached clone.
    #[cfg(test)]
    pub(crate) fn is_detached(&self) -> bool {
        self.detached.is_some()
    }
}

/// `open_tree(dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)` of the binary's directory, kept only if
/// the file found through it is the binary itself (not one a mount below the directory hid).
fn detached_clone(path: &Path) -> Option<(OwnedFd, OsString)> {
    // The file itself, not a link to it (an absolute link would lead back to the host path).
    let path = std::fs::canonicalize(path).ok()?;
    let name = path.file_name()?.to_owned();
    let dir = path.parent()?;
    let fd = crate::mount::clone_tree(dir).ok()?;
    // Above the numbers the children's pre-exec code puts descriptors on (0-4): the path through
    // it is resolved by execve, after that code ran.
    // SAFETY: duplicating a descriptor we own.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if high < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor, ours alone (the low one closes with `fd`).
    let fd = unsafe { OwnedFd::from_raw_fd(high) };
    let through = Path::new("/proc/self/fd")
        .join(fd.as_raw_fd().to_string())
        .join(&name);
    let (a, b) = (
        std::fs::metadata(&path).ok()?,
        std::fs::metadata(through).ok()?,
    );
    (a.dev() == b.dev() && a.ino() == b.ino()).then_some((fd, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary exec'd through the clone names itself relative to it; by path, by host path.
    #[test]
    fn exec_through_the_clone_hides_the_host_path() {
        let exe = InitExe::new(Path::new("/bin/readlink"));
        if !exe.is_detached() {
            eprintln!("no open_tree here (old kernel or not root): skipping");
            return;
        }
        let real = std::fs::canonicalize("/bin/readlink").expect("canonicalize");
        let out = exe
            .command()
            .arg("/proc/self/exe")
            .output()
            .expect("readlink");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "/readlink");
        // The control: the same binary by its path shows the host path.
        let out = Command::new("/bin/readlink")
            .arg("/proc/self/exe")
            .output()
            .expect("readlink");
        assert_eq!(
            Path::new(String::from_utf8_lossy(&out.stdout).trim()),
            real.as_path()
        );
    }
}
