//! The engine: the domain's entry point (one-shot runs, sessions, files, commands, records),
//! over the services of [`Core`] and the sessions of [`SessionManager`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::core::{sweep_stale_cgroups, Core, EngineConfig};
use crate::records::{self, ExecutionPage, Records};
use crate::session::SessionManager;
use crate::zygote::ZygoteStatus;
use crate::EngineError;

/// The domain entry point: one-shot runs and sessions.
#[derive(Clone)]
pub struct Engine {
    pub(crate) core: Arc<Core>,
    sessions: Arc<SessionManager>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("data_dir", &self.core.config.data_dir)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine that records nothing (`runcell run`, `repl`, `mcp`). Refuses to start when a
    /// mandatory isolation layer is missing on this host.
    pub fn new(config: EngineConfig) -> Result<Engine, EngineError> {
        Self::build(config, None)
    }

    /// A server's engine: every session is recorded in `store` when it is created and
    /// forgotten when it ends (so a server started after a crash recovers it:
    /// [`SessionManager::recover_previous`]), uploads and executions too, and each tenant's
    /// quotas and default start are read from it at every session start.
    pub fn with_store(
        config: EngineConfig,
        store: Arc<dyn runcell_store::DomainStore>,
    ) -> Result<Engine, EngineError> {
        Self::build(config, Some(Records::everything(store)))
    }

    /// An engine that records every execution in `store`'s audit chains, and nothing else
    /// (`runcell ask`: its one session is the process's own, and ends with it).
    pub fn audited(
        config: EngineConfig,
        store: Arc<dyn runcell_store::DomainStore>,
    ) -> Result<Engine, EngineError> {
        Self::build(config, Some(Records::executions_only(store)))
    }

    fn build(config: EngineConfig, records: Option<Records>) -> Result<Engine, EngineError> {
        let core = Arc::new(Core::new(config, records)?);
        // Preloading takes a second or more: begin now, in the background.
        let _ = core.zygote();
        let sessions = SessionManager::new(core.clone());
        Ok(Engine { core, sessions })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.core.config
    }

    /// The host directory of session `id`'s workspace.
    pub fn workspace_path(&self, id: &str) -> PathBuf {
        self.core.config.workspace_path(id)
    }

    /// The zygote's state (Python sessions are forked from it when it is ready).
    pub fn zygote_status(&self) -> ZygoteStatus {
        self.core.zygote_status()
    }

    /// Waits up to `timeout` for the zygote to finish starting; returns its state then.
    pub fn wait_for_zygote(&self, timeout: Duration) -> ZygoteStatus {
        self.core.wait_zygote(timeout)
    }

    pub fn sessions(&self) -> &SessionManager {
        &self.sessions
    }

    /// Makes `dispatch` answer the `mcp.` calls of every session cell from now on (the
    /// operator's MCP servers; mcp_tools.rs), its calls run on `runtime`, each waiting at most
    /// `call_timeout` (for cells whose execute set no tools of its own).
    pub fn set_mcp_dispatch(
        &self,
        dispatch: Arc<dyn crate::bridge::ToolDispatch>,
        runtime: tokio::runtime::Handle,
        call_timeout: Duration,
    ) {
        self.core.mcp_tools.set(dispatch, runtime, call_timeout);
    }

    /// Whether session cells can reach MCP servers ([`Engine::set_mcp_dispatch`] was called):
    /// the agent then lists them for the model (code mode).
    pub fn has_mcp_dispatch(&self) -> bool {
        self.core.mcp_tools.is_set()
    }

    /// Memory committed to live sandboxes now (MiB): sessions, warm ones and one-shot runs.
    pub fn committed_memory_mb(&self) -> u64 {
        self.core.ledger.committed_mb()
    }

    /// Removes the empty run cgroups a killed runcell left behind (a server calls this when it
    /// starts; a one-shot run does when it finds a stale workspace). Returns how many.
    pub fn sweep_stale_cgroups(&self) -> usize {
        sweep_stale_cgroups(&self.core.sandbox, &self.core.config)
    }
}

impl Engine {
    /// The owner's recorded executions, newest first, optionally of one session: at most
    /// `limit` (1..=1000), strictly older than the execution `before` if given (an unknown
    /// cursor is an invalid request). An engine without a store has recorded none.
    pub fn executions(
        &self,
        owner: &str,
        session: Option<&str>,
        limit: usize,
        before: Option<&str>,
    ) -> Result<ExecutionPage, EngineError> {
        let Some(records) = &self.core.records else {
            return Ok(ExecutionPage {
                executions: Vec::new(),
                next: None,
            });
        };
        let (rows, next) = records
            .store()
            .list_executions(records::tenant(owner), session, limit, before)
            .map_err(records::store_error)?;
        Ok(ExecutionPage {
            executions: rows
                .into_iter()
                .filter(|r| !records::is_approval(r))
                .map(records::with_code)
                .collect(),
            next,
        })
    }

    /// The owner's recorded execution `id` (another owner's is none), plus its `code`.
    pub fn execution(
        &self,
        owner: &str,
        id: &str,
    ) -> Result<Option<serde_json::Value>, EngineError> {
        let row = match &self.core.records {
            Some(records) => records
                .store()
                .get_execution(records::tenant(owner), id)
                .map_err(records::store_error)?,
            None => None,
        };
        Ok(row
            .filter(|r| !records::is_approval(r))
            .map(records::with_code))
    }

    /// Re-walks the owner's audit chain and reports the first edited, deleted or out-of-band
    /// record. An engine without a store has recorded nothing, and nothing is broken.
    pub fn verify_audit(&self, owner: &str) -> Result<runcell_store::VerifyReport, EngineError> {
        match &self.core.records {
            Some(records) => records
                .store()
                .verify_chain(Some(records::tenant(owner)))
                .map_err(records::store_error),
            None => Ok(runcell_store::VerifyReport {
                ok: true,
                checked: 0,
                first_broken: None,
            }),
        }
    }
}
