//! The directories of one run's cgroup (v2: one; v1: one per hierarchy) and the processes in
//! them. What the directories mean to a version, its v1 or v2 module knows; the [`super::Cgroup`]
//! handle owns them and removes them.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::error::CgroupError;
use super::files::{collect_procs, rmdir_tree};

/// Name of the directory under which runcell creates its per-run cgroups.
pub(super) const RUNCELL_DIR: &str = "runcell";

#[derive(Debug, Clone)]
pub(super) struct CgroupDir {
    pub(super) path: PathBuf,
    pub(super) controllers: Vec<&'static str>,
}

/// A run's directories, in the order they were created (v1: memory first).
#[derive(Debug, Default)]
pub(super) struct Dirs(Vec<CgroupDir>);

impl Dirs {
    /// `mkdir <parent>/<name>` (the parent must exist) and records the directory so that it is
    /// removed with the cgroup from then on.
    pub(super) fn add(
        &mut self,
        path: PathBuf,
        controllers: Vec<&'static str>,
    ) -> Result<(), CgroupError> {
        fs::create_dir(&path).map_err(|source| CgroupError::CreateDir {
            path: path.clone(),
            source,
        })?;
        self.0.push(CgroupDir { path, controllers });
        Ok(())
    }

    /// Records a directory that exists already (tests: a fake cgroup, or one a parent test
    /// process created).
    #[cfg(test)]
    pub(super) fn push(&mut self, dir: CgroupDir) {
        self.0.push(dir);
    }

    /// The directory in the hierarchy that carries `controller`.
    pub(super) fn dir_for(&self, controller: &str) -> Option<&Path> {
        self.0
            .iter()
            .find(|d| d.controllers.contains(&controller))
            .map(|d| d.path.as_path())
    }

    /// The first directory (v2: the only one).
    pub(super) fn first(&self) -> Option<&Path> {
        self.0.first().map(|d| d.path.as_path())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn paths(&self) -> Vec<PathBuf> {
        self.0.iter().map(|d| d.path.clone()).collect()
    }

    /// Every `cgroup.procs` into which a process writes its decimal pid to join the cgroup.
    pub(super) fn procs_files(&self) -> Vec<PathBuf> {
        self.0.iter().map(|d| d.path.join("cgroup.procs")).collect()
    }

    /// Processes in the directories or their descendants (deduplicated, sorted).
    pub(super) fn live_pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut set = BTreeSet::new();
        for dir in &self.0 {
            collect_procs(&dir.path, &mut set)?;
        }
        Ok(set.into_iter().collect())
    }

    /// `rmdir` of every directory (descendants first), retrying busy ones until `deadline`; the
    /// first error, after trying them all.
    pub(super) fn remove_all(&self, deadline: Instant) -> Result<(), CgroupError> {
        let mut first_error = None;
        for dir in &self.0 {
            if let Err(e) = rmdir_tree(&dir.path, deadline) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

pub(super) fn own_pid() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// Sends SIGKILL to each pid except our own. Errors (mostly ESRCH: already gone) are ignored.
pub(super) fn kill_each(pids: &[i32]) {
    let me = own_pid();
    for &pid in pids {
        // Only positive pids: 0 and negative values would address process groups or everything.
        if pid <= 0 || pid == me {
            continue;
        }
        // SAFETY: kill(2) takes two integers and accesses no memory of ours; `pid` is positive,
        // so it addresses exactly one process, never a process group or "every process".
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
