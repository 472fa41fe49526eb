//! E2B's needs of a session manager: another kernel on a session's workspace (code contexts,
//! a second language beside the first: same files, same network policy) and a lifetime a
//! client sets while the session lives.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;

use super::{SessionInfo, SessionManager, SessionStatus, Start};
use crate::limits::Admit;
use crate::model::{new_id, Language};
use crate::EngineError;

impl SessionManager {
    /// Another kernel on session `of`'s workspace (E2B's code contexts; a second language
    /// beside the first): a session of its own (id, kernel, queue, expiry) for the same owner
    /// with the same limits, whose files are `of`'s. Never recorded in the store: it lasts as
    /// long as this server process, and the workspace stays until both sessions are gone.
    pub fn create_sibling(
        &self,
        of: &str,
        language: Language,
        env: BTreeMap<String, String>,
        metadata: BTreeMap<String, String>,
    ) -> Result<SessionInfo, EngineError> {
        crate::bounds::check_metadata(&metadata)?;
        crate::bounds::check_env(&env)?;
        let parent = self.entry(of)?;
        let (owner, limits, network) = {
            let s = parent.lock();
            (s.info.owner.clone(), s.info.limits, s.info.network.clone())
        };
        let _slot = self.creation_slot()?;
        let policy = self.core.tenant_policy(&owner)?;
        self.core
            .ledger
            .check_quota(&owner, &policy, limits.memory_mb)?;
        let mut reservation = self.reserve(limits.memory_mb, true)?;
        self.core
            .ledger
            .assign(&mut reservation, &owner, &policy, Admit::Checked)?;
        let now = Utc::now();
        let info = SessionInfo {
            id: new_id("ses"),
            language,
            status: SessionStatus::Ready,
            created_at: now,
            last_active_at: now,
            expires_at: now + chrono::Duration::seconds(limits.idle_timeout_s as i64),
            limits,
            start: match language {
                Language::Python => Start::Zygote,
                _ => Start::Cold,
            },
            metadata,
            owner,
            network,
        };
        let workspace = parent.workspace.clone();
        // The parent's network policy, with records of its own.
        let egress = parent.egress.as_ref().map(|e| e.sibling());
        drop(parent);
        self.launch(
            info,
            workspace,
            env.into_iter().collect(),
            None,
            reservation,
            egress,
        )
    }

    /// Sets session `id`'s idle limit (at most the server's) and counts it from now: E2B's
    /// sandbox `timeout`, which a client may change while the sandbox lives.
    pub fn set_idle_timeout(&self, id: &str, idle: Duration) -> Result<SessionInfo, EngineError> {
        let entry = self.entry(id)?;
        let mut s = entry.lock();
        let secs = idle
            .as_secs()
            .clamp(1, self.core.config.limits.max.idle_timeout_s);
        s.info.limits.idle_timeout_s = secs;
        s.info.expires_at = Utc::now() + chrono::Duration::seconds(secs as i64);
        Ok(s.info.clone())
    }

    /// Sets session `id`'s auto-pause delay (at most the server's) and counts it from now:
    /// E2B's `timeout` of a sandbox that pauses at its timeout (`autoPause`), which, like
    /// `set_timeout`, starts again when the client sets it. The count starts from the
    /// session's last activity, so that is what "now" moves.
    pub fn set_pause_after(&self, id: &str, after: Duration) -> Result<SessionInfo, EngineError> {
        let entry = self.entry(id)?;
        let mut s = entry.lock();
        let secs = after
            .as_secs()
            .clamp(1, self.core.config.limits.max.pause_after_s);
        s.info.limits.pause_after_s = secs;
        s.info.last_active_at = Utc::now();
        Ok(s.info.clone())
    }

    /// Gives a paused session the extra environment its kernel starts with when it resumes:
    /// a session recovered after a restart comes back without the one it was created with
    /// (the engine does not record it), which E2B's layer keeps and hands back. `false` if
    /// `id` is not paused.
    pub fn set_paused_env(
        &self,
        id: &str,
        env: BTreeMap<String, String>,
    ) -> Result<bool, EngineError> {
        crate::bounds::check_env(&env)?;
        Ok(match self.paused().entry(id) {
            Some(p) => {
                p.set_env(env.into_iter().collect());
                true
            }
            None => false,
        })
    }
}
