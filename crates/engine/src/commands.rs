//! Shell commands beside a session's kernel: same workspace, same sandbox user and limits, a
//! sandbox of their own (so a command cannot disturb the kernel's process tree).

use std::time::Duration;

use runcell_sandbox::{Launch, RunOptions};
use serde::Serialize;

use crate::core::{base_env, Engine};
use crate::model::{Execution, Language, Truncated, UsageInfo};
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
        crate::bounds::check_command(command)?;
        let info = self.sessions().get(session)?;
        let workspace = self.sessions().workspace(session)?;
        let timeout = timeout.unwrap_or(Duration::from_secs(info.limits.exec_timeout_s));
        let timeout = self.core.config.limits.check_timeout(timeout)?;
        // A command is a sandbox of its own, beside the kernel: its memory is committed too.
        let _reserved = self.core.ledger.reserve(
            info.limits.memory_mb,
            self.core.config.limits.committed_memory_mb,
            crate::limits::Admit::Checked,
        )?;
        let (_, ro_binds) = self.core.python();
        let limits = info.limits.sandbox_limits();
        let launch = Launch {
            argv: vec!["/bin/bash".into(), "-c".into(), command.to_owned()],
            // The session's runtime is on PATH, so `python3` and `pip list` see the same packages.
            env: base_env(
                Language::Python,
                limits.cpu_millis,
                self.core.config.python_runtime.is_some(),
            ),
            workspace: &workspace,
            ro_binds,
            limits,
            channel: false,
        };
        let before = workspace.snapshot().ok();
        let started_at = chrono::Utc::now();
        let out = self
            .core
            .sandbox
            .run(
                &launch,
                &RunOptions {
                    timeout,
                    ..RunOptions::default()
                },
                &mut |_, _| {},
            )
            .map_err(EngineError::sandbox)?;
        let output = CommandOutput {
            stdout: out.stdout.render(),
            stderr: out.stderr.render(),
            exit_code: out.exit.shell_code(),
            truncated: Truncated {
                stdout: out.stdout.truncated(),
                stderr: out.stderr.truncated(),
                results: false,
                files: false,
            },
            usage: UsageInfo {
                wall_ms: out.usage.wall.as_millis() as u64,
                cpu_ms: out.usage.cpu.as_millis() as u64,
                peak_memory_bytes: out.usage.peak_memory_bytes,
                killed_by: out.killed_by.map(Into::into),
            },
        };
        // Commands are code too: they go into the audit log like cells (language bash,
        // execution_count 0 as they are not cells of the kernel).
        let after = workspace.snapshot().ok();
        let diff = crate::oneshot::diff_files(before.as_ref(), after.as_ref());
        let record = command_execution(session, &output, started_at, diff);
        self.core.audit(&info.owner, &record, command)?;
        Ok(output)
    }
}

fn command_execution(
    session: &str,
    out: &CommandOutput,
    started_at: chrono::DateTime<chrono::Utc>,
    diff: crate::oneshot::FileDiff,
) -> Execution {
    use crate::model::{ErrorInfo, ExecutionStatus, KilledBy};
    let status = match (out.usage.killed_by, out.exit_code) {
        (Some(KilledBy::Timeout), _) => ExecutionStatus::Timeout,
        (Some(_), _) => ExecutionStatus::Killed,
        (None, 0) => ExecutionStatus::Ok,
        (None, _) => ExecutionStatus::Error,
    };
    Execution {
        id: crate::model::new_ordered_id("ex"),
        session_id: Some(session.to_owned()),
        language: Language::Bash,
        execution_count: 0,
        status,
        stdout: out.stdout.clone(),
        stderr: out.stderr.clone(),
        truncated: Truncated {
            files: diff.truncated,
            ..out.truncated
        },
        results: Vec::new(),
        error: (status != ExecutionStatus::Ok).then(|| ErrorInfo {
            name: "ExitCode".into(),
            value: out.exit_code.to_string(),
            traceback: String::new(),
        }),
        files: diff.files,
        usage: out.usage,
        started_at,
        finished_at: chrono::Utc::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_records_say_how_the_command_ended() {
        let out = |exit_code, killed_by| CommandOutput {
            stdout: "x".into(),
            stderr: String::new(),
            exit_code,
            truncated: Truncated::default(),
            usage: UsageInfo {
                killed_by,
                ..UsageInfo::default()
            },
        };
        let t = chrono::Utc::now();
        let rec = |o: &CommandOutput| command_execution("ses_1", o, t, Default::default());
        use crate::model::{ExecutionStatus, KilledBy};
        assert_eq!(rec(&out(0, None)).status, ExecutionStatus::Ok);
        let e = rec(&out(3, None));
        assert_eq!(e.status, ExecutionStatus::Error);
        assert_eq!(e.error.map(|x| x.value), Some("3".into()));
        assert_eq!(
            rec(&out(137, Some(KilledBy::Timeout))).status,
            ExecutionStatus::Timeout
        );
        assert_eq!(
            rec(&out(137, Some(KilledBy::Oom))).status,
            ExecutionStatus::Killed
        );
        assert_eq!(rec(&out(0, None)).language, Language::Bash);
    }
}
