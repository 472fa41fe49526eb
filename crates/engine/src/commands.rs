//! Shell commands beside a session's kernel: same workspace, same sandbox user and limits, a
//! sandbox of their own (so a command cannot disturb the kernel's process tree). A caller may
//! watch one run (E2B's process service): its output as it comes, extra environment variables,
//! a flag that ends it early ([`Engine::run_watched`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use runcell_sandbox::{KillReason, RunOptions, RunOutcome, Stream};
use serde::Serialize;

use crate::engine::Engine;
use crate::execution::{Began, Ended, Produced};
use crate::launch::Program;
use crate::limits::OUTPUT_CAP_BYTES;
use crate::model::{
    new_ordered_id, ErrorInfo, Execution, ExecutionStatus, Language, Truncated, UsageInfo,
};
use crate::EngineError;

/// What `POST /v1/sessions/{id}/commands` returns.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandOutput {
    pub stdout: String,
    pub stderr: String,
    /// The command's exit status (128 + signal when it died of one).
    pub exit_code: i32,
    pub truncated: Truncated,
    pub usage: UsageInfo,
}

impl Engine {
    /// Runs `command` with bash in the session's workspace.
    pub fn run_command(
        &self,
        session: &str,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<CommandOutput, EngineError> {
        self.run_watched(
            session,
            &WatchedCommand {
                command: command.to_owned(),
                timeout,
                ..Default::default()
            },
            &mut |_, _| {},
        )
    }
}

/// One watched command.
#[derive(Debug, Clone, Default)]
pub struct WatchedCommand {
    /// Run as `bash -c COMMAND` in /workspace.
    pub command: String,
    /// After runcell's own variables, never replacing one of them.
    pub env: std::collections::BTreeMap<String, String>,
    /// `None`: the session's execution limit. Longer than the server allows is refused.
    pub timeout: Option<Duration>,
    /// Set to end the command (killed, `KilledBy::Signal`); checked every 100 ms.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Engine {
    /// Runs `cmd` in the session's sandbox; `on_output` gets each chunk of stdout and stderr
    /// as it is read (on this thread: block it and the command's pipes fill). Blocking.
    pub fn run_watched(
        &self,
        session: &str,
        cmd: &WatchedCommand,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<CommandOutput, EngineError> {
        crate::bounds::check_command(&cmd.command)?;
        crate::bounds::check_env(&cmd.env)?;
        let env: Vec<(String, String)> = cmd.env.clone().into_iter().collect();
        let info = self.sessions().get(session)?;
        let workspace = self.sessions().workspace(session)?;
        let timeout = cmd
            .timeout
            .unwrap_or(Duration::from_secs(info.limits.exec_timeout_s));
        let timeout = self.core.config.limits.check_timeout(timeout)?;
        // A command is a sandbox of its own, beside the kernel: its memory is committed too.
        let _reserved = self.core.ledger.reserve(
            info.limits.memory_mb,
            self.core.config.limits.committed_memory_mb,
            crate::limits::Admit::Checked,
        )?;
        // The session's policy, with records of its own: the command's connections are its own.
        let egress = self.sessions().egress(session)?.map(|e| e.sibling());
        let launch = self.core.launch(
            Program::Command(&cmd.command),
            &workspace,
            &info.limits,
            &env,
            egress.is_some(),
        )?;
        let mut serving = None;
        let mut on_start = |running: &runcell_sandbox::Running| {
            if let Some(e) = &egress {
                serving = crate::network::serve_egress(running, e, timeout)?;
            }
            Ok(())
        };
        let began = Began::now(new_ordered_id("ex"), Some(session.to_owned()), &workspace);
        let out = self
            .core
            .sandbox
            .run_with(
                &launch,
                &RunOptions {
                    timeout,
                    output_cap: OUTPUT_CAP_BYTES,
                    cancel: cmd.cancel.clone(),
                    ..RunOptions::default()
                },
                on_output,
                &mut on_start,
            )
            .map_err(EngineError::sandbox)?;
        drop(serving);
        // Commands are code too: they go into the audit log like cells.
        let mut record = command_execution(began.end(&workspace), &out);
        if let Some(e) = &egress {
            record.network = crate::network::connections(e.take_records());
        }
        self.core.audit(&info.owner, &record, &cmd.command)?;
        Ok(CommandOutput {
            stdout: record.stdout,
            stderr: record.stderr,
            exit_code: out.exit.shell_code(),
            // What the command changed is not part of its reply.
            truncated: Truncated {
                files: false,
                ..record.truncated
            },
            usage: record.usage,
        })
    }
}

/// A command's record: language bash, execution_count 0 as it is not a cell of the kernel,
/// and an `ExitCode` error unless it exited 0.
pub(crate) fn command_execution(ended: Ended, out: &RunOutcome) -> Execution {
    let exit_code = out.exit.shell_code();
    let status = match (out.killed_by, exit_code) {
        (Some(KillReason::Timeout), _) => ExecutionStatus::Timeout,
        (Some(_), _) => ExecutionStatus::Killed,
        (None, 0) => ExecutionStatus::Ok,
        (None, _) => ExecutionStatus::Error,
    };
    ended.execution(Produced {
        language: Language::Bash,
        execution_count: 0,
        status,
        error: (status != ExecutionStatus::Ok).then(|| ErrorInfo {
            name: "ExitCode".into(),
            value: exit_code.to_string(),
            traceback: String::new(),
        }),
        stdout: &out.stdout,
        stderr: &out.stderr,
        results: Vec::new(),
        results_dropped: false,
        usage: out.usage,
        killed_by: out.killed_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_records_say_how_the_command_ended() {
        use runcell_sandbox::{CappedOutput, ExitStatus};
        let out = |exit, killed_by| {
            let mut stdout = CappedOutput::new(OUTPUT_CAP_BYTES);
            stdout.push(b"x");
            RunOutcome {
                exit,
                killed_by,
                stdout,
                stderr: CappedOutput::new(OUTPUT_CAP_BYTES),
                usage: Default::default(),
                remains: Default::default(),
            }
        };
        let t = chrono::Utc::now();
        let rec = |o: &RunOutcome| command_execution(Ended::at(Some("ses_1"), t), o);
        assert_eq!(
            rec(&out(ExitStatus::Code(0), None)).status,
            ExecutionStatus::Ok
        );
        let e = rec(&out(ExitStatus::Code(3), None));
        assert_eq!(e.status, ExecutionStatus::Error);
        assert_eq!(e.error.map(|x| x.value), Some("3".into()));
        assert_eq!(
            rec(&out(ExitStatus::Signal(9), Some(KillReason::Timeout))).status,
            ExecutionStatus::Timeout
        );
        let oom = rec(&out(ExitStatus::Signal(9), Some(KillReason::Oom)));
        assert_eq!(oom.status, ExecutionStatus::Killed);
        assert_eq!(oom.error.map(|x| x.value), Some("137".into()));
        let ok = rec(&out(ExitStatus::Code(0), None));
        assert_eq!(ok.language, Language::Bash);
        assert_eq!((ok.stdout.as_str(), ok.execution_count), ("x", 0));
        assert_eq!(ok.session_id.as_deref(), Some("ses_1"));
    }
}
