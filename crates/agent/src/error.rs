//! What can stop an agent run before its answer.

use runcell_engine::EngineError;

/// What can stop a run before an answer.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("no API key: set {env} (or point --base-url at a server that needs none)")]
    MissingKey { env: &'static str },
    #[error("the provider rejected the API key ({status}): check {env}: {message}")]
    Unauthorized {
        status: u16,
        env: &'static str,
        message: String,
    },
    #[error("the provider answered {status} after {attempts} attempt(s): {message}")]
    Api {
        status: u16,
        message: String,
        attempts: u32,
    },
    #[error("{0}")]
    Http(String),
    #[error("malformed reply: {0}")]
    Malformed(String),
    #[error("the sandbox session failed")]
    Engine(#[from] EngineError),
    #[error("the run was stopped before its answer")]
    Stopped,
}
