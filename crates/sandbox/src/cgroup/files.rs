//! Reading and writing cgroupfs files and directories, for both versions.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use super::error::CgroupError;

/// Polling interval of the kill and remove loops.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(10);

pub(super) fn read_string(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// One `write(2)` of `value` to an existing control file (no `O_CREAT`, so a missing file
/// reports `ENOENT` instead of creating a regular file).
pub(super) fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    file.write_all(value.as_bytes())
}

pub(super) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_raw(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_owned(),
        source,
    })
}

/// Writes `dir/file`; `Ok(false)` if the file does not exist (controller feature absent).
pub(super) fn write_optional(dir: &Path, file: &str, value: &str) -> Result<bool, CgroupError> {
    match write_file(&dir.join(file), value) {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `dir/file`; a missing file means `controller` is not available there.
pub(super) fn write_required(
    dir: &Path,
    file: &str,
    value: &str,
    controller: &'static str,
) -> Result<(), CgroupError> {
    match write_file(&dir.join(file), value) {
        Err(e) if e.is_not_found() => Err(CgroupError::ControllerUnavailable {
            controller,
            path: dir.to_path_buf(),
        }),
        other => other,
    }
}

/// The value of the `key N` line of a flat keyed file (`memory.events`, `cpu.stat`, ...).
pub(super) fn keyed_u64(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.next()? != key {
            return None;
        }
        fields.next()?.parse().ok()
    })
}

/// Positive pids of a `cgroup.procs` file.
pub(super) fn parse_pids(text: &str) -> impl Iterator<Item = i32> + '_ {
    text.split_whitespace()
        .filter_map(|s| s.parse::<i32>().ok())
        .filter(|&pid| pid > 0)
}

/// Adds the pids of `dir` and its descendant cgroups. A directory that is gone is empty.
pub(super) fn collect_procs(dir: &Path, out: &mut BTreeSet<i32>) -> Result<(), CgroupError> {
    let procs = dir.join("cgroup.procs");
    match fs::read_to_string(&procs) {
        Ok(text) => out.extend(parse_pids(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: procs,
                source,
            })
        }
    }
    for child in subdirs(dir)? {
        collect_procs(&child, out)?;
    }
    Ok(())
}

/// Subdirectories (child cgroups) of `dir`; none if `dir` is gone.
pub(super) fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let read_err = |source| CgroupError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_err(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read_err)?;
        if entry.file_type().map_err(read_err)?.is_dir() {
            out.push(entry.path());
        }
    }
    Ok(out)
}

/// `rmdir` of `dir` after its descendants, retrying while the kernel says `EBUSY` (tasks that
/// were just killed can keep a cgroup busy for a moment). A directory that is gone is fine.
pub(super) fn rmdir_tree(dir: &Path, deadline: Instant) -> Result<(), CgroupError> {
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Child cgroups (listed only now: usually there are none) or tasks still leaving.
            // (cgroupfs says EBUSY for both; a plain directory, ENOTEMPTY.)
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOTEMPTY))
                    && Instant::now() < deadline =>
            {
                let children = subdirs(dir)?;
                for child in &children {
                    rmdir_tree(child, deadline)?;
                }
                if children.is_empty() {
                    thread::sleep(POLL_INTERVAL);
                }
            }
            Err(source) => {
                return Err(CgroupError::RemoveDir {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        }
    }
}

/// Controller names of a `cgroup.controllers` / `cgroup.subtree_control` file (empty if
/// unreadable). A leading `+` is ignored.
pub(super) fn read_controller_list(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|text| {
            text.split_whitespace()
                .map(|c| c.trim_start_matches('+').to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_parsing() {
        let text = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n";
        assert_eq!(keyed_u64(text, "usage_usec"), Some(1500));
        assert_eq!(keyed_u64(text, "system_usec"), Some(500));
        assert_eq!(keyed_u64(text, "usage"), None);
        assert_eq!(keyed_u64("oom 1\noom_kill 3\n", "oom_kill"), Some(3));
        assert_eq!(keyed_u64("max 7", "max"), Some(7));
        assert_eq!(keyed_u64("max x", "max"), None);
    }

    #[test]
    fn pids_parsing_ignores_junk_and_non_positive() {
        let pids: Vec<i32> = parse_pids("12\n0\n-1\nabc\n 34 \n").collect();
        assert_eq!(pids, vec![12, 34]);
    }
}
