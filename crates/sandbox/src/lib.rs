//! runcell-sandbox: Linux isolation only — namespaces, mounts, seccomp, landlock, rlimits,
//! cgroups v1 and v2, kill-the-tree and usage accounting for one sandboxed program.
//!
//! The isolation steps run in a freshly exec'd, single-threaded init helper ([`run_if_init`]),
//! never in the caller's process; [`Sandbox`] is the caller's side. `docs/sandbox.md` walks the
//! steps in the same order as `pid1.rs`.
#![cfg(target_os = "linux")]

pub mod alloc;
mod caps;
pub mod cgroup;
mod direct;
pub mod doctor;
mod exe;
mod image;
mod init;
pub mod landlock;
mod loopdev;
mod mount;
mod net;
mod output;
mod pid1;
mod removal;
mod rlimit;
mod sched;
pub mod seccomp;
mod spawn_ns;
mod spec;
mod supervisor;
mod sys;
mod user_ns;
mod workspace;
pub mod zygote;

pub use image::WorkspaceImages;
pub use init::{init_main, run_if_init};
pub use output::CappedOutput;
pub use rlimit::raise_nofile_soft_limit;
pub use sched::set_batch_scheduling;
pub use spec::{Bind, HOSTNAME, INIT_ARG, SANDBOX_UID, SANDBOX_USER, WORKSPACE};
pub use supervisor::{
    find_init_exe, ExitStatus, Finished, KillReason, Launch, Limits, Remains, RunOptions,
    RunOutcome, Running, RunningHandle, Sandbox, SandboxError, Stream, Usage,
};
pub use user_ns::{UidLease, UserNsError, HOST_UID_BASE, HOST_UID_COUNT};
pub use workspace::{
    validate_relative, FileStat, Snapshot, Workspace, WorkspaceError, MAX_PATH_CHARS,
};
pub use zygote::{Zygote, ZygoteConfig, ZygoteError, ZYGOTE_ARG};
