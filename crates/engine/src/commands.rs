//! Shell commands beside a session's kernel: same workspace, same sandbox user and limits, a
//! sandbox of their own (so a command cannot disturb the kernel's process tree).

use std::time::Duration;

use runcell_sandbox::{Launch, RunOptions};
use serde::Serialize;

use crate::core::{base_env, Engine};
use crate::model::{Language, Truncated, UsageInfo};
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
        let info = self.sessions().get(session)?;
        let workspace = self.sessions().workspace(session)?;
        let timeout = timeout.unwrap_or(Duration::from_secs(info.limits.exec_timeout_s));
        if timeout.is_zero() || timeout > crate::MAX_TIMEOUT {
            return Err(EngineError::InvalidRequest(format!(
                "timeout_s must be between 1 and {}",
                crate::MAX_TIMEOUT.as_secs()
            )));
        }
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
            .map_err(|e| EngineError::Sandbox(crate::chain(&e)))?;
        Ok(CommandOutput {
            stdout: out.stdout.render(),
            stderr: out.stderr.render(),
            exit_code: out.exit.shell_code(),
            truncated: Truncated {
                stdout: out.stdout.truncated(),
                stderr: out.stderr.truncated(),
            },
            usage: UsageInfo {
                wall_ms: out.usage.wall.as_millis() as u64,
                cpu_ms: out.usage.cpu.as_millis() as u64,
                peak_memory_bytes: out.usage.peak_memory_bytes,
                killed_by: out.killed_by.map(Into::into),
            },
        })
    }
}
