//! The CPU scheduling policy of the server and everything it starts.
//!
//! An execution is a chain of hand-overs between processes and threads: the HTTP thread wakes
//! the session's worker, which wakes the kernel, which wakes the worker, which wakes the audit
//! writer, which wakes the HTTP thread. Under the default policy (`SCHED_OTHER`) a woken
//! thread may preempt the one that woke it, and usually does on a busy machine: the waker is
//! switched out a few instructions before it would have gone to sleep by itself, and needs a
//! second switch later only to go to sleep. `SCHED_BATCH` threads do not preempt on wake-up
//! (they wait for the running thread to block or use up its slice), which removes those
//! switches: with the server and its sessions under `SCHED_BATCH`, 16 busy sessions ran
//! 10-16% more executions per second on 2 cores (docs/benchmarks.md). The price is latency
//! under CPU contention only: a woken thread waits at most a scheduler slice (a few
//! milliseconds) for a CPU-bound one; on an idle CPU it runs at once as before. Nice values
//! and CPU shares (the cgroups' `cpu` limits) apply unchanged.

use std::io;

use crate::sys::cvt;

/// Puts the calling thread under `SCHED_BATCH` (`batch`) or back under `SCHED_OTHER`. Threads
/// and processes it creates afterwards inherit the policy, so calling this first thing in
/// `main` covers the whole process and its children. Needs no privilege.
pub fn set_batch_scheduling(batch: bool) -> io::Result<()> {
    let policy = if batch {
        libc::SCHED_BATCH
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    cvt(unsafe { libc::sched_setscheduler(0, policy, &param) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the calling thread runs under `SCHED_BATCH`.
    fn batch_scheduling() -> io::Result<bool> {
        // SAFETY: no pointers; pid 0 is the calling thread.
        let policy = cvt(unsafe { libc::sched_getscheduler(0) })?;
        Ok(policy == libc::SCHED_BATCH)
    }

    #[test]
    fn batch_is_set_inherited_and_undone() {
        // In a thread of its own, so the test harness's threads keep their policy.
        std::thread::spawn(|| {
            assert!(
                !batch_scheduling().expect("get"),
                "control: SCHED_OTHER to begin with"
            );
            set_batch_scheduling(true).expect("set batch");
            assert!(batch_scheduling().expect("get"));
            let child = std::thread::spawn(|| batch_scheduling().expect("get in child"));
            assert!(
                child.join().expect("child"),
                "a new thread inherits SCHED_BATCH"
            );
            set_batch_scheduling(false).expect("set other");
            assert!(!batch_scheduling().expect("get"));
        })
        .join()
        .expect("thread");
    }
}
