//! Step 6: Landlock. Even if a mount were misconfigured, the program may read and execute only
//! the runtime and system files, and write only to /workspace, /tmp and /dev/shm.

use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The newest ABI this policy was written and tested against (Linux 6.12). Newer kernels
/// enforce exactly these rights; older ones enforce what they know (best effort), which
/// `runcell doctor` reports as degraded.
pub(crate) const TARGET_ABI: ABI = ABI::V6;

#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("cannot build the landlock ruleset")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("cannot open {path} for a landlock rule")]
    PathFd {
        path: PathBuf,
        #[source]
        source: landlock::PathFdError,
    },
}

/// How much of the policy the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Full,
    Partial,
    None,
}

/// The policy as data: (path, rights, why).
fn rules(extra_read: &[PathBuf]) -> Vec<(PathBuf, landlock::BitFlags<AccessFs>, &'static str)> {
    let abi = TARGET_ABI;
    let read_exec = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let mut rules = vec![
        (
            "/".into(),
            AccessFs::ReadDir.into(),
            "listing directories reveals nothing the mounts do not already expose",
        ),
        (
            "/usr".into(),
            read_exec,
            "interpreters, libraries, coreutils",
        ),
        (
            "/etc".into(),
            read_exec,
            "the curated /etc: passwd, hosts, certificates",
        ),
        (
            "/opt".into(),
            read_exec,
            "runtimes and read-only inputs bound by runcell",
        ),
        (
            "/proc".into(),
            AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::WriteFile,
            "the sandbox's own /proc (read-only mounts guard /proc/sys)",
        ),
        (
            "/dev".into(),
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev,
            "null, zero, full, random, urandom, tty",
        ),
        ("/workspace".into(), all, "the session's files"),
        ("/tmp".into(), all, "scratch space"),
        (
            "/dev/shm".into(),
            all,
            "POSIX shared memory (multiprocessing)",
        ),
    ];
    for p in extra_read {
        rules.push((p.clone(), read_exec, "an extra read-only bind"));
    }
    rules
}

/// Restricts the calling thread (and everything it execs) to [`rules`]. Missing paths are
/// skipped: a rule cannot grant access to something that is not there.
pub(crate) fn restrict(extra_read: &[PathBuf]) -> Result<Enforcement, LandlockError> {
    let abi = TARGET_ABI;
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        // Signals and abstract sockets already stop at the PID and network namespaces; the
        // scopes say the same thing a second time where the kernel supports them.
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?;
    for (path, access, _why) in rules(extra_read) {
        if !Path::new(&path).exists() {
            continue;
        }
        let fd = PathFd::new(&path).map_err(|source| LandlockError::PathFd {
            path: path.clone(),
            source,
        })?;
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    let status = created.restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        RulesetStatus::NotEnforced => Enforcement::None,
    })
}

/// The Landlock ABI version the running kernel supports (0 when unavailable).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with the VERSION flag, a null attribute pointer and size 0 are the documented call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        0
    } else {
        r as i32
    }
}
