//! The cgroup module's one error type.

use std::io;
use std::path::PathBuf;

/// Errors of the cgroup module.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Neither a usable cgroup v2 nor the needed v1 hierarchies are mounted.
    #[error("no usable cgroup hierarchy: {reason}")]
    Unavailable { reason: String },
    /// A required v1 controller hierarchy is not mounted.
    #[error("cgroup v1 {controller} hierarchy is not mounted")]
    ControllerNotMounted { controller: &'static str },
    /// A required controller's interface files are missing in the new cgroup.
    #[error("{controller} controller is not available in {}", .path.display())]
    ControllerUnavailable {
        controller: &'static str,
        path: PathBuf,
    },
    /// The cgroup name is not `[A-Za-z0-9_-]{1,64}`.
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// A limit value cannot be applied.
    #[error("invalid cgroup limits: {reason}")]
    InvalidLimits { reason: &'static str },
    /// Reading a file or listing a directory failed.
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `mkdir` of a cgroup directory failed (including: it already exists).
    #[error("cannot create cgroup directory {}", .path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Writing a control file failed.
    #[error("cannot write {value:?} to {}", .path.display())]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    /// `rmdir` of a cgroup directory failed.
    #[error("cannot remove cgroup directory {}", .path.display())]
    RemoveDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl CgroupError {
    pub(super) fn os_error(&self) -> Option<i32> {
        match self {
            CgroupError::Read { source, .. }
            | CgroupError::CreateDir { source, .. }
            | CgroupError::Write { source, .. }
            | CgroupError::RemoveDir { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    pub(super) fn is_busy(&self) -> bool {
        self.os_error() == Some(libc::EBUSY)
    }

    pub(super) fn is_not_found(&self) -> bool {
        self.os_error() == Some(libc::ENOENT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages() {
        let e = CgroupError::Write {
            path: "/x/memory.max".into(),
            value: "5".into(),
            source: io::Error::from_raw_os_error(libc::EBUSY),
        };
        assert_eq!(e.to_string(), "cannot write \"5\" to /x/memory.max");
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.is_busy());
        let e = CgroupError::ControllerUnavailable {
            controller: "memory",
            path: "/x".into(),
        };
        assert_eq!(e.to_string(), "memory controller is not available in /x");
    }
}
