//! cgroup v1: one directory `<controller parent>/<name>` per run in each hierarchy used
//! (memory, pids, cpu, cpuacct, freezer; co-mounted controllers share a directory).

use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use super::detect::{cgroup_dir, MountEntry, OwnCgroup};
use super::dirs::{kill_each, Dirs, RUNCELL_DIR};
use super::error::CgroupError;
use super::files::{write_optional, write_raw, write_required};
use super::limits::{CgroupLimits, CPU_PERIOD_US};
use super::usage::{Field, UsageFile, UsageFiles};

/// Controllers runcell uses, in the order their directories are created and joined.
const KNOWN: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
/// Controllers without which a run cannot be contained.
const REQUIRED: [&str; 2] = ["memory", "pids"];
/// Controllers whose absence only degrades: no CPU limit, no CPU accounting.
const OPTIONAL: [&str; 2] = ["cpu", "cpuacct"];
/// How long a kill round waits for the freezer to report `FROZEN`.
const FREEZE_TIMEOUT: Duration = Duration::from_millis(200);

fn known(name: &str) -> Option<&'static str> {
    KNOWN.into_iter().find(|k| *k == name)
}

fn rank(controller: &str) -> usize {
    KNOWN
        .iter()
        .position(|k| *k == controller)
        .unwrap_or(KNOWN.len())
}

#[derive(Debug)]
pub(super) struct V1Hierarchy {
    mounts: Vec<V1Mount>,
    /// Test hook standing in for the kernel: fills a directory we just created.
    #[cfg(test)]
    mkdir_hook: Option<fn(&Path)>,
}

/// One hierarchy: the controllers it carries and runcell's parent directory in it.
#[derive(Debug, Clone)]
struct V1Mount {
    controllers: Vec<&'static str>,
    parent: PathBuf,
}

impl V1Hierarchy {
    /// See [`super::Hierarchy::v1_at`].
    pub(super) fn at(pairs: Vec<(String, PathBuf)>) -> V1Hierarchy {
        // (identity of the directory, mount)
        let mut keyed: Vec<(PathBuf, V1Mount)> = Vec::new();
        for (names, dir) in pairs {
            // `cpu` and `cpuacct` may be symlinks to one `cpu,cpuacct` mount.
            let key = fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
            let index = match keyed.iter().position(|(k, _)| *k == key) {
                Some(index) => index,
                None => {
                    keyed.push((
                        key,
                        V1Mount {
                            controllers: Vec::new(),
                            parent: dir.join(RUNCELL_DIR),
                        },
                    ));
                    keyed.len() - 1
                }
            };
            for controller in names.split(',').filter_map(known) {
                if !keyed
                    .iter()
                    .any(|(_, m)| m.controllers.contains(&controller))
                {
                    keyed[index].1.controllers.push(controller);
                }
            }
        }
        let mut mounts: Vec<V1Mount> = keyed
            .into_iter()
            .map(|(_, m)| m)
            .filter(|m| !m.controllers.is_empty())
            .collect();
        for m in &mut mounts {
            m.controllers.sort_by_key(|c| rank(c));
        }
        mounts.sort_by_key(|m| m.controllers.first().map_or(KNOWN.len(), |c| rank(c)));
        V1Hierarchy {
            mounts,
            #[cfg(test)]
            mkdir_hook: None,
        }
    }

    /// Every mounted v1 hierarchy carrying a controller we use, nested under our own cgroup.
    pub(super) fn detect(mounts: &[MountEntry], own: &[OwnCgroup]) -> Result<V1Hierarchy, String> {
        let mut pairs = Vec::new();
        for m in mounts.iter().filter(|m| m.fstype == "cgroup") {
            let controllers: Vec<&'static str> =
                m.super_options.iter().filter_map(|o| known(o)).collect();
            let Some(first) = controllers.first() else {
                continue;
            };
            let own_path = own
                .iter()
                .find(|o| o.controllers.iter().any(|c| c == first))
                .map_or("/", |o| o.path.as_str());
            pairs.push((
                controllers.join(","),
                cgroup_dir(&m.mount_point, &m.root, own_path),
            ));
        }
        let h = V1Hierarchy::at(pairs);
        let missing = h.missing_required();
        if missing.is_empty() {
            Ok(h)
        } else {
            Err(format!(
                "no cgroup2 mount offers memory and pids, and no cgroup v1 hierarchy is mounted for: {}",
                missing.join(", ")
            ))
        }
    }

    fn has(&self, controller: &str) -> bool {
        self.mounts
            .iter()
            .any(|m| m.controllers.contains(&controller))
    }

    pub(super) fn missing_required(&self) -> Vec<&'static str> {
        REQUIRED.into_iter().filter(|c| !self.has(c)).collect()
    }

    pub(super) fn missing_optional(&self) -> Vec<&'static str> {
        OPTIONAL.into_iter().filter(|c| !self.has(c)).collect()
    }

    pub(super) fn describe(&self) -> String {
        let usable: Vec<&str> = KNOWN.into_iter().filter(|c| self.has(c)).collect();
        format!("v1 ({})", usable.join(", "))
    }

    pub(super) fn parent_dirs(&self) -> Vec<PathBuf> {
        self.mounts.iter().map(|m| m.parent.clone()).collect()
    }

    #[cfg(test)]
    fn after_mkdir(&self, dir: &Path) {
        if let Some(hook) = self.mkdir_hook {
            hook(dir);
        }
    }

    #[cfg(not(test))]
    fn after_mkdir(&self, _dir: &Path) {}

    /// `mkdir -p` of a parent; tolerates concurrent creators.
    fn make_parent(&self, parent: &Path) -> Result<(), CgroupError> {
        if parent.is_dir() {
            return Ok(());
        }
        fs::create_dir_all(parent).map_err(|source| CgroupError::CreateDir {
            path: parent.to_path_buf(),
            source,
        })?;
        self.after_mkdir(parent);
        Ok(())
    }

    /// Creates run `name`'s directory in every hierarchy, recording each in `dirs` as it is
    /// made (the caller removes them on an error), and applies `limits`.
    pub(super) fn create(
        &self,
        name: &str,
        limits: &CgroupLimits,
        dirs: &mut Dirs,
    ) -> Result<(), CgroupError> {
        if let Some(controller) = self.missing_required().into_iter().next() {
            return Err(CgroupError::ControllerNotMounted { controller });
        }
        for m in &self.mounts {
            let dir = m.parent.join(name);
            self.make_parent(&m.parent)?;
            if let Err(e) = dirs.add(dir.clone(), m.controllers.clone()) {
                if !e.is_not_found() {
                    return Err(e);
                }
                // The parent vanished (removed by someone else): create it again, once.
                self.make_parent(&m.parent)?;
                dirs.add(dir.clone(), m.controllers.clone())?;
            }
            self.after_mkdir(&dir);
        }
        apply_limits(dirs, limits)
    }
}

/// memory.limit_in_bytes, then memory.memsw.limit_in_bytes (must stay >= the former, so it
/// goes second), memory.swappiness = 0 (best effort), pids.max, CFS period and quota.
fn apply_limits(dirs: &Dirs, limits: &CgroupLimits) -> Result<(), CgroupError> {
    let memory = dirs
        .dir_for("memory")
        .ok_or(CgroupError::ControllerNotMounted {
            controller: "memory",
        })?;
    let bytes = limits.memory_bytes.to_string();
    write_required(memory, "memory.limit_in_bytes", &bytes, "memory")?;
    write_optional(memory, "memory.memsw.limit_in_bytes", &bytes)?;
    let _ = write_optional(memory, "memory.swappiness", "0");

    let pids = dirs
        .dir_for("pids")
        .ok_or(CgroupError::ControllerNotMounted { controller: "pids" })?;
    write_required(pids, "pids.max", &limits.pids.to_string(), "pids")?;

    if let Some(cpu) = dirs.dir_for("cpu") {
        write_optional(cpu, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
        let quota = limits
            .cpu_quota_us()
            .map_or_else(|| "-1".to_owned(), |q| q.to_string());
        write_optional(cpu, "cpu.cfs_quota_us", &quota)?;
    }
    Ok(())
}

pub(super) fn usage_files(dirs: &Dirs) -> UsageFiles {
    let open = |controller, file, field, writable| {
        dirs.dir_for(controller)
            .and_then(|d| UsageFile::open(&d.join(file), field, writable))
    };
    UsageFiles {
        cpu: open("cpuacct", "cpuacct.usage", Field::Plain, false),
        cpu_scale: 1,
        // Writing to it starts a new peak window (Cgroup::reset_peak).
        peak: open("memory", "memory.max_usage_in_bytes", Field::Plain, true),
        oom_kills: open(
            "memory",
            "memory.oom_control",
            Field::Keyed("oom_kill"),
            false,
        ),
        pids_limit_hits: open("pids", "pids.events", Field::Keyed("max"), false),
    }
}

/// Whether `pids.current` (hierarchical) says no process is left anywhere in the tree.
pub(super) fn known_empty(dirs: &Dirs) -> bool {
    dirs.dir_for("pids")
        .is_some_and(|d| fs::read_to_string(d.join("pids.current")).is_ok_and(|s| s.trim() == "0"))
}

/// One round of [`super::Cgroup::kill_all`]. With a freezer hierarchy (and us outside the
/// cgroup): freeze, SIGKILL whatever is inside then (nothing can fork meanwhile), thaw so the
/// signals take effect. Otherwise SIGKILL each listed process.
pub(super) fn kill_round(dirs: &Dirs, pids: &[i32], me_inside: bool) {
    let state = match dirs.dir_for("freezer") {
        Some(dir) if !me_inside => dir.join("freezer.state"),
        _ => {
            kill_each(pids);
            return;
        }
    };
    if write_raw(&state, "FROZEN").is_err() {
        kill_each(pids);
        return;
    }
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    while Instant::now() < deadline {
        match fs::read_to_string(&state) {
            Ok(s) if s.trim() == "FREEZING" => thread::sleep(Duration::from_millis(1)),
            _ => break,
        }
    }
    kill_each(&dirs.live_pids().unwrap_or_else(|_| pids.to_vec()));
    // Frozen tasks act on SIGKILL only once thawed.
    let _ = write_raw(&state, "THAWED");
}

#[cfg(test)]
mod tests;
