//! Commands a caller watches while they run (E2B's process service): their output as it comes,
//! the caller's environment variables, and a flag that ends them early. Otherwise exactly a
//! session's shell command ([`Engine::run_command`]): same sandbox, workspace and audit record.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use runcell_sandbox::{RunOptions, Stream};

use crate::commands::{command_execution, CommandOutput};
use crate::engine::Engine;
use crate::execution::Began;
use crate::launch::Program;
use crate::limits::OUTPUT_CAP_BYTES;
use crate::model::{new_ordered_id, Truncated};
use crate::EngineError;

/// One watched command.
#[derive(Debug, Clone, Default)]
pub struct WatchedCommand {
    /// Run as `bash -c COMMAND` in /workspace.
    pub command: String,
    /// After runcell's own variables, never replacing one of them.
    pub env: std::collections::BTreeMap<String, String>,
    /// `None`: the session's execution limit. Longer than the server allows is cut to it.
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
        let policy = &self.core.config.limits;
        let timeout = cmd
            .timeout
            .unwrap_or(Duration::from_secs(info.limits.exec_timeout_s))
            .min(Duration::from_secs(policy.max.exec_timeout_s));
        let timeout = policy.check_timeout(timeout)?;
        let _reserved = self.core.ledger.reserve(
            info.limits.memory_mb,
            policy.committed_memory_mb,
            crate::limits::Admit::Checked,
        )?;
        let launch = self.core.launch(
            Program::Command(&cmd.command),
            &workspace,
            &info.limits,
            &env,
        )?;
        let began = Began::now(new_ordered_id("ex"), Some(session.to_owned()), &workspace);
        let out = self
            .core
            .sandbox
            .run(
                &launch,
                &RunOptions {
                    timeout,
                    output_cap: OUTPUT_CAP_BYTES,
                    cancel: cmd.cancel.clone(),
                    ..RunOptions::default()
                },
                on_output,
            )
            .map_err(EngineError::sandbox)?;
        let record = command_execution(began.end(&workspace), &out);
        self.core.audit(&info.owner, &record, &cmd.command)?;
        Ok(CommandOutput {
            stdout: record.stdout,
            stderr: record.stderr,
            exit_code: out.exit.shell_code(),
            truncated: Truncated {
                files: false,
                ..record.truncated
            },
            usage: record.usage,
        })
    }
}
