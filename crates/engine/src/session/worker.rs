//! The thread that runs a session's queued jobs.

use std::sync::mpsc::Receiver;
use std::sync::Arc;

use super::entry::{CellRunning, Entry, Job};
use crate::core::Core;
use crate::EngineError;

/// The thread that runs a session's queued jobs (executions submitted by synchronous or
/// streaming callers, restarts) and ends the session's kernel when the session ends.
pub(super) struct Worker {
    pub(super) core: Arc<Core>,
    pub(super) entry: Arc<Entry>,
}

impl Worker {
    pub(super) fn run(self, jobs: Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            if self.entry.lock().deleted {
                break;
            }
            match job {
                Job::Execute {
                    code,
                    timeout,
                    events,
                    cancel,
                    reply,
                    tools,
                } => {
                    if cancel.is_cancelled() {
                        reply(Err(EngineError::Cancelled));
                        continue;
                    }
                    let mut runner = self.entry.runner.blocking_lock();
                    if self.entry.lock().deleted {
                        break;
                    }
                    let running = CellRunning::start(&self.entry, &self.core, &cancel);
                    let result = runner.execute(
                        &self.entry.shared,
                        &code,
                        timeout,
                        events,
                        tools.map(|t| *t),
                    );
                    drop(running);
                    drop(runner);
                    match result {
                        // Recorded by the audit writer, which replies; meanwhile the session
                        // goes on with its next cell.
                        Ok((execution, owner)) => {
                            self.core.audit_then(owner, execution, code, reply)
                        }
                        Err(e) => reply(Err(e)),
                    }
                }
                Job::Restart { reply } => {
                    let mut runner = self.entry.runner.blocking_lock();
                    if let Some(k) = runner.kernel.take() {
                        k.shutdown();
                    }
                    let _ = reply.send(runner.ensure_kernel(&self.entry.shared).map(|_| ()));
                }
            }
        }
        // After a cell an HTTP task may be running (its kernel was killed with the session).
        let kernel = self.entry.runner.blocking_lock().kernel.take();
        if let Some(k) = kernel {
            k.shutdown();
        }
        // The workspace unmounts and disappears with the entry's last holder.
    }
}
