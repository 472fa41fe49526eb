//! What a session is to its callers: its status, how its kernel starts, what creating or
//! recovering one takes.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::limits::SessionLimits;
use crate::model::{Language, Start};

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Starting,
    Ready,
    Busy,
    /// Snapshotted to disk, without a sandbox (durable.rs); any request resumes it.
    Paused,
    Dead,
    Expired,
}

/// What callers see of a session (DESIGN.md §6).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub id: String,
    pub language: Language,
    pub status: SessionStatus,
    #[serde(serialize_with = "crate::model::rfc3339")]
    pub created_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::model::rfc3339")]
    pub last_active_at: DateTime<Utc>,
    #[serde(serialize_with = "crate::model::rfc3339")]
    pub expires_at: DateTime<Utc>,
    pub limits: SessionLimits,
    /// How its kernel started: `zygote` (forked from the preloaded zygote) or `cold` (asked
    /// for, or a language, CPU count or moment the zygote does not serve).
    pub start: Start,
    /// What the sandbox may reach (secrets' values read back redacted).
    pub network: crate::network::policy::NetworkPolicy,
    pub metadata: BTreeMap<String, String>,
    /// Who the session belongs to (the server's tenant); opaque to the engine.
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub owner: String,
}

/// What `recover` takes: what the store remembers of a session.
#[derive(Debug, Clone)]
pub(crate) struct RecoverSession {
    pub(crate) id: String,
    pub(crate) language: Language,
    pub(crate) owner: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) limits: SessionLimits,
    /// What the session asked for (a cold session stays cold).
    pub(crate) start: Start,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) last_active_at: DateTime<Utc>,
    /// The expiry of a session paused when its server stopped; `None`: it was live.
    pub(crate) paused_until: Option<DateTime<Utc>>,
}

/// What `create` takes.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    /// Who the session belongs to (recorded with every execution).
    pub owner: String,
    pub language: Option<Language>,
    pub limits: crate::limits::LimitsRequest,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    /// `None`: from the zygote for Python, cold for the other languages.
    pub start: Option<Start>,
    /// Disabled by default; an allowlist must stay within the server's bound.
    pub network: crate::network::policy::NetworkPolicy,
}
