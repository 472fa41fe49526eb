//! cgroup v2: one directory `<parent>/<name>` per run, with `memory`, `pids` and (if available)
//! `cpu` enabled through the `cgroup.subtree_control` files from the mount root down.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::detect::{cgroup_dir, MountEntry, OwnCgroup};
use super::dirs::{kill_each, Dirs, RUNCELL_DIR};
use super::error::CgroupError;
use super::files::{read_controller_list, write_file, write_optional, write_raw, write_required};
use super::limits::{CgroupLimits, CPU_PERIOD_US};
use super::usage::{Field, UsageFile, UsageFiles};

/// Controllers runcell enables, in this order.
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// Controllers without which a run cannot be contained.
const REQUIRED: [&str; 2] = ["memory", "pids"];

#[derive(Debug)]
pub(super) struct V2Hierarchy {
    /// Root cgroup of the mount (exempt from the "no internal processes" rule).
    root: PathBuf,
    /// Preferred parent of the run cgroups: `<own cgroup>/runcell`.
    parent: PathBuf,
    /// Controllers listed in the root's `cgroup.controllers`.
    available: Vec<String>,
    /// The parent actually prepared (the preferred one or `<root>/runcell`), once done.
    resolved: Mutex<Option<PathBuf>>,
    /// Test hook standing in for the kernel: fills a directory we just created.
    #[cfg(test)]
    mkdir_hook: Option<fn(&Path)>,
    /// Test hook: directories whose `cgroup.subtree_control` refuses writes with `EBUSY`.
    #[cfg(test)]
    busy: Vec<PathBuf>,
}

impl V2Hierarchy {
    fn new(root: PathBuf, parent: PathBuf) -> V2Hierarchy {
        let available = read_controller_list(&root.join("cgroup.controllers"));
        V2Hierarchy {
            root,
            parent,
            available,
            resolved: Mutex::new(None),
            #[cfg(test)]
            mkdir_hook: None,
            #[cfg(test)]
            busy: Vec::new(),
        }
    }

    /// The first cgroup2 mount (`/sys/fs/cgroup` preferred) whose root offers memory and pids.
    pub(super) fn detect(mounts: &[MountEntry], own: &[OwnCgroup]) -> Option<V2Hierarchy> {
        let own_path = own
            .iter()
            .find(|c| c.id == "0" && c.controllers.is_empty())
            .map_or("/", |c| c.path.as_str());
        let mut candidates: Vec<&MountEntry> =
            mounts.iter().filter(|m| m.fstype == "cgroup2").collect();
        candidates.sort_by_key(|m| m.mount_point != Path::new("/sys/fs/cgroup"));
        candidates.into_iter().find_map(|m| {
            let h = V2Hierarchy::new(
                m.mount_point.clone(),
                cgroup_dir(&m.mount_point, &m.root, own_path).join(RUNCELL_DIR),
            );
            h.missing_required().is_empty().then_some(h)
        })
    }

    /// See [`super::Hierarchy::v2_at`].
    pub(super) fn at(parent: PathBuf) -> V2Hierarchy {
        let mut root = None;
        for dir in parent.ancestors() {
            if dir.join("cgroup.subtree_control").is_file() {
                root = Some(dir);
            } else if root.is_some() {
                break;
            }
        }
        let root = root
            .or_else(|| parent.parent())
            .unwrap_or(&parent)
            .to_path_buf();
        V2Hierarchy::new(root, parent)
    }

    fn has(&self, controller: &str) -> bool {
        self.available.iter().any(|c| c == controller)
    }

    pub(super) fn missing_required(&self) -> Vec<&'static str> {
        REQUIRED.into_iter().filter(|c| !self.has(c)).collect()
    }

    pub(super) fn missing_optional(&self) -> Vec<&'static str> {
        if self.has("cpu") {
            Vec::new()
        } else {
            vec!["cpu"]
        }
    }

    fn current_parent(&self) -> PathBuf {
        self.resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| self.parent.clone())
    }

    pub(super) fn describe(&self) -> String {
        let usable: Vec<&str> = CONTROLLERS.into_iter().filter(|c| self.has(c)).collect();
        format!(
            "v2 at {} ({})",
            self.current_parent().display(),
            usable.join(" ")
        )
    }

    #[cfg(test)]
    pub(super) fn parent_dirs(&self) -> Vec<PathBuf> {
        vec![self.current_parent()]
    }

    /// Where run cgroups may be: the preferred parent and the fallback under the root.
    pub(super) fn possible_parents(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.parent.clone(), self.root.join("runcell")];
        dirs.dedup();
        dirs
    }

    #[cfg(test)]
    fn after_mkdir(&self, dir: &Path) {
        if let Some(hook) = self.mkdir_hook {
            hook(dir);
        }
    }

    #[cfg(not(test))]
    fn after_mkdir(&self, _dir: &Path) {}

    /// Creates run `name`'s directory, recording it in `dirs` (the caller removes it on an
    /// error), and applies `limits`.
    pub(super) fn create(
        &self,
        name: &str,
        limits: &CgroupLimits,
        dirs: &mut Dirs,
    ) -> Result<(), CgroupError> {
        let mut dir = self.parent_dir()?.join(name);
        if let Err(e) = dirs.add(dir.clone(), CONTROLLERS.to_vec()) {
            if !e.is_not_found() {
                return Err(e);
            }
            // The parent vanished (removed by someone else): set it up again, once.
            self.forget_parent();
            dir = self.parent_dir()?.join(name);
            dirs.add(dir.clone(), CONTROLLERS.to_vec())?;
        }
        self.after_mkdir(&dir);
        apply_limits(&dir, limits)
    }

    /// The prepared parent directory, preparing it on first use.
    fn parent_dir(&self) -> Result<PathBuf, CgroupError> {
        let mut resolved = self.resolved.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(parent) = resolved.as_ref() {
            return Ok(parent.clone());
        }
        let parent = self.prepare_parent()?;
        *resolved = Some(parent.clone());
        Ok(parent)
    }

    fn forget_parent(&self) {
        *self.resolved.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Prepares `<own>/runcell`, or `<root>/runcell` when a cgroup on the way refuses to enable
    /// controllers because it holds processes.
    fn prepare_parent(&self) -> Result<PathBuf, CgroupError> {
        match self.prepare(&self.parent) {
            Ok(()) => Ok(self.parent.clone()),
            Err(e) if e.is_busy() => {
                let fallback = self.root.join(RUNCELL_DIR);
                if fallback == self.parent {
                    return Err(e);
                }
                self.prepare(&fallback)?;
                Ok(fallback)
            }
            Err(e) => Err(e),
        }
    }

    /// Enables the controllers in every cgroup from the root down to `parent` (creating
    /// `parent`, tolerating concurrent creators), so that `parent`'s children get them.
    fn prepare(&self, parent: &Path) -> Result<(), CgroupError> {
        let mut chain = Vec::new();
        match parent.strip_prefix(&self.root) {
            Ok(rel) => {
                let mut dir = self.root.clone();
                chain.push(dir.clone());
                for component in rel.components() {
                    dir.push(component);
                    chain.push(dir.clone());
                }
            }
            Err(_) => chain.push(parent.to_path_buf()),
        }
        for dir in &chain {
            if !dir.is_dir() {
                fs::create_dir_all(dir).map_err(|source| CgroupError::CreateDir {
                    path: dir.clone(),
                    source,
                })?;
                self.after_mkdir(dir);
            }
            self.enable_controllers(dir)?;
        }
        Ok(())
    }

    /// Writes `+memory +pids +cpu` (only those available and not yet enabled) to `dir`'s
    /// `cgroup.subtree_control`. If that fails for another reason than `EBUSY`, retries without
    /// the optional `cpu` (which the kernel refuses e.g. while realtime tasks are around).
    fn enable_controllers(&self, dir: &Path) -> Result<(), CgroupError> {
        let available = read_controller_list(&dir.join("cgroup.controllers"));
        let enabled = read_controller_list(&dir.join("cgroup.subtree_control"));
        let wanted: Vec<&str> = CONTROLLERS
            .into_iter()
            .filter(|c| available.iter().any(|a| a == c) && !enabled.iter().any(|e| e == c))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let file = dir.join("cgroup.subtree_control");
        match self.write_subtree_control(&file, &wanted) {
            Ok(()) => Ok(()),
            Err(e) if e.is_busy() => Err(e),
            Err(e) => {
                let required: Vec<&str> = wanted.iter().copied().filter(|c| *c != "cpu").collect();
                if required.len() == wanted.len() {
                    Err(e)
                } else if required.is_empty() {
                    Ok(())
                } else {
                    self.write_subtree_control(&file, &required)
                }
            }
        }
    }

    fn write_subtree_control(&self, file: &Path, controllers: &[&str]) -> Result<(), CgroupError> {
        let value = controllers
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        #[cfg(test)]
        if file
            .parent()
            .is_some_and(|dir| self.busy.iter().any(|b| b == dir))
        {
            return Err(CgroupError::Write {
                path: file.to_path_buf(),
                value,
                source: std::io::Error::from_raw_os_error(libc::EBUSY),
            });
        }
        write_file(file, &value)
    }
}

/// memory.max, memory.swap.max = 0, pids.max, cpu.max, memory.oom.group = 1 (optional files are
/// skipped when the kernel lacks them).
fn apply_limits(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    write_required(
        dir,
        "memory.max",
        &limits.memory_bytes.to_string(),
        "memory",
    )?;
    write_optional(dir, "memory.swap.max", "0")?;
    write_required(dir, "pids.max", &limits.pids.to_string(), "pids")?;
    let cpu_max = match limits.cpu_quota_us() {
        Some(quota) => format!("{quota} {CPU_PERIOD_US}"),
        None => format!("max {CPU_PERIOD_US}"),
    };
    write_optional(dir, "cpu.max", &cpu_max)?;
    // An OOM kills the whole run, not one arbitrary process of it.
    write_optional(dir, "memory.oom.group", "1")?;
    Ok(())
}

pub(super) fn usage_files(dirs: &Dirs) -> UsageFiles {
    let Some(dir) = dirs.first() else {
        return UsageFiles::default();
    };
    let open = |file, field, writable| UsageFile::open(&dir.join(file), field, writable);
    UsageFiles {
        cpu: open("cpu.stat", Field::Keyed("usage_usec"), false),
        cpu_scale: 1000,
        // Read and reset through one descriptor: a write resets the peak of that open file
        // only (Linux 6.12+). Kernels without memory.peak report the current usage.
        peak: open("memory.peak", Field::Plain, true)
            .or_else(|| open("memory.current", Field::Plain, false)),
        oom_kills: open("memory.events", Field::Keyed("oom_kill"), false),
        pids_limit_hits: open("pids.events", Field::Keyed("max"), false),
    }
}

/// Whether `cgroup.events` says `populated 0`: no process is left anywhere in the tree.
pub(super) fn known_empty(dirs: &Dirs) -> bool {
    dirs.first().is_some_and(|d| {
        fs::read_to_string(d.join("cgroup.events"))
            .is_ok_and(|s| s.lines().any(|l| l == "populated 0"))
    })
}

/// One round of [`super::Cgroup::kill_all`]: `cgroup.kill` (whole subtree, also stops forks
/// racing with it) when the kernel has it and we are not inside, else SIGKILL per process.
pub(super) fn kill_round(dirs: &Dirs, pids: &[i32], me_inside: bool) {
    if !me_inside {
        if let Some(dir) = dirs.first() {
            if write_raw(&dir.join("cgroup.kill"), "1").is_ok() {
                return;
            }
        }
    }
    kill_each(pids);
}

#[cfg(test)]
mod tests;
