//! What `runcell doctor` reports about the isolation layers of this host.

use std::fs;
use std::path::Path;

use crate::cgroup::{CgroupError, Hierarchy};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Available,
    Degraded,
    Missing,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Available => "available",
            State::Degraded => "degraded",
            State::Missing => "missing",
        }
    }
}

/// One isolation layer on this host.
#[derive(Debug, Clone)]
pub struct Layer {
    pub name: &'static str,
    pub state: State,
    pub detail: String,
    /// runcell refuses to run code when a mandatory layer is missing.
    pub mandatory: bool,
}

impl Layer {
    /// Whether this layer stops runcell from running code.
    pub fn blocks(&self) -> bool {
        self.mandatory && self.state == State::Missing
    }
}

/// Checks every layer. Cheap: reads /proc and /sys and makes a few probing syscalls.
pub fn check() -> Vec<Layer> {
    layers(true, &Hierarchy::detect())
}

/// The layers whose absence stops runcell, checked as cheaply as possible: what every
/// `runcell run` pays before its sandbox starts. (The seccomp filter is not compiled here; each
/// sandbox compiles and installs it, and fails its start if that fails.) `cgroups` is the
/// caller's own detection, which its sandbox keeps: detecting parses mountinfo, once is enough.
pub fn check_mandatory_with(cgroups: &Result<Hierarchy, CgroupError>) -> Vec<Layer> {
    layers(false, cgroups)
        .into_iter()
        .filter(|l| l.mandatory)
        .collect()
}

fn layers(thorough: bool, cgroups: &Result<Hierarchy, CgroupError>) -> Vec<Layer> {
    let mut layers = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    layers.push(Layer {
        name: "privileges",
        state: if root {
            State::Available
        } else {
            State::Missing
        },
        detail: if root {
            "running as root: can map each sandbox to its own host uid and mount workspaces".into()
        } else {
            "runcell must run as root to give every sandbox its own unprivileged host uid".into()
        },
        mandatory: true,
    });
    let max_userns = fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    layers.push(match max_userns {
        Some(0) => Layer {
            name: "user namespace",
            state: State::Missing,
            detail: "disabled: /proc/sys/user/max_user_namespaces is 0".into(),
            mandatory: true,
        },
        _ if !Path::new("/proc/self/ns/user").exists() => Layer {
            name: "user namespace",
            state: State::Missing,
            detail: "kernel built without CONFIG_USER_NS".into(),
            mandatory: true,
        },
        n => Layer {
            name: "user namespace",
            state: State::Available,
            detail: format!(
                "sandbox uid 1000 maps to one host uid per sandbox (max {} namespaces)",
                n.map_or("?".into(), |n| n.to_string())
            ),
            mandatory: true,
        },
    });
    for (name, file, what) in [
        (
            "pid namespace",
            "pid",
            "own process tree; pid 1 reaps and takes everything with it",
        ),
        (
            "mount namespace",
            "mnt",
            "tmpfs root, read-only system binds, pivot_root",
        ),
        ("network namespace", "net", "loopback only, no route out"),
        ("ipc namespace", "ipc", "own System V IPC and POSIX queues"),
        ("uts namespace", "uts", "hostname runcell"),
        (
            "cgroup namespace",
            "cgroup",
            "the sandbox sees its own cgroup as the root",
        ),
    ] {
        let ok = Path::new("/proc/self/ns").join(file).exists();
        layers.push(Layer {
            name,
            state: if ok { State::Available } else { State::Missing },
            detail: if ok {
                what.into()
            } else {
                format!("/proc/self/ns/{file} is missing: kernel lacks this namespace")
            },
            mandatory: true,
        });
    }
    layers.push(match cgroups {
        Ok(h) => {
            let missing = h.missing_optional();
            Layer {
                name: "cgroups",
                state: if missing.is_empty() {
                    State::Available
                } else {
                    State::Degraded
                },
                detail: if missing.is_empty() {
                    h.describe()
                } else {
                    format!("{} (no {} limit)", h.describe(), missing.join(", "))
                },
                mandatory: true,
            }
        }
        Err(e) => Layer {
            name: "cgroups",
            state: State::Missing,
            detail: format!("{e}: memory and pids limits are mandatory"),
            mandatory: true,
        },
    });
    if !thorough {
        // SAFETY: prctl with integer arguments only reads state.
        let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
        layers.push(Layer {
            name: "seccomp",
            state: if mode >= 0 {
                State::Available
            } else {
                State::Missing
            },
            detail: if mode >= 0 {
                "available".into()
            } else {
                "kernel built without CONFIG_SECCOMP_FILTER".into()
            },
            mandatory: true,
        });
        return layers;
    }
    let abi = crate::landlock::kernel_abi();
    let target = crate::landlock::TARGET_ABI as i32;
    layers.push(Layer {
        name: "landlock",
        state: match abi {
            0 => State::Missing,
            a if a < target => State::Degraded,
            _ => State::Available,
        },
        detail: match abi {
            0 => "not enabled in this kernel (add landlock to the lsm= boot parameter); \
                  mounts and seccomp still confine file access"
                .into(),
            a if a < target => format!("ABI {a} < {target}: newer access rights are not enforced"),
            a => format!("ABI {a}: read/exec on the runtime, write on /workspace /tmp /dev/shm"),
        },
        mandatory: false,
    });
    // SAFETY: prctl with integer arguments only reads state.
    let seccomp_mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    let filter_ok = crate::seccomp::build().and_then(|_| crate::seccomp::build_pid1());
    layers.push(Layer {
        name: "seccomp",
        state: if seccomp_mode >= 0 && filter_ok.is_ok() {
            State::Available
        } else {
            State::Missing
        },
        detail: match (seccomp_mode, filter_ok) {
            (m, Ok(_)) if m >= 0 => format!(
                "allow-list of {} syscalls, {} denied with reasons, {} answered 0 without \
                 running; pid 1's own: {} syscalls",
                crate::seccomp::allowed().len(),
                crate::seccomp::denied().len(),
                crate::seccomp::no_ops().len(),
                crate::seccomp::pid1_allowed().len()
            ),
            (_, Err(e)) => format!("cannot build the filter: {e}"),
            _ => "kernel built without CONFIG_SECCOMP_FILTER".into(),
        },
        mandatory: true,
    });
    if thorough {
        layers.push(workspace_images());
    }
    layers
}

/// Whether session workspaces can be filesystem images on disk (loop devices, e2fsprogs); a
/// host without them keeps them in memory (tmpfs): not durable, and counted in each session's
/// memory limit.
fn workspace_images() -> Layer {
    let missing = crate::loopdev::available()
        .map_err(|e| format!("no loop devices (/dev/loop-control: {e})"))
        .and_then(|()| {
            crate::image::tools_available().map_err(|e| format!("{e}: install e2fsprogs"))
        });
    match missing {
        Ok(()) => Layer {
            name: "workspaces on disk",
            state: State::Available,
            detail: "session workspaces are ext4 images on loop devices: ENOSPC when full, durable across a reboot".into(),
            mandatory: false,
        },
        Err(why) => Layer {
            name: "workspaces on disk",
            state: State::Degraded,
            detail: format!("{why}; session workspaces stay in memory (tmpfs): counted in the session's memory, lost at a reboot"),
            mandatory: false,
        },
    }
}
