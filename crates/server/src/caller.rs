//! The API key a request was made with, as much of it as handlers need: its own file, so that
//! what uses it (the vendor loops' approvals) need not import the state it is resolved by.

use runcell_engine::{KeyEgressBound, NetworkPolicy};

use crate::error::ApiResult;

/// A key, as authentication found it (`state.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRef {
    pub id: String,
    pub name: String,
    /// The key's approval default (`runcell keys create --approval`), a floor for requests.
    pub approval: Option<runcell_store::ApprovalMode>,
    /// The key's own egress bound (`runcell keys create --egress-allow`), within which every
    /// network asked for with it must stay, besides the server's; `None`: the server's alone.
    pub egress: Option<KeyEgressBound>,
}

impl KeyRef {
    /// The key as authentication hands it over from the store.
    pub(crate) fn of(info: runcell_store::KeyInfo) -> KeyRef {
        let label = format!("{} ({})", info.id, info.name);
        KeyRef {
            egress: info
                .egress_allow
                .map(|patterns| KeyEgressBound::new(&patterns, label)),
            id: info.id,
            name: info.name,
            approval: info.approval,
        }
    }
}

/// Whether `policy`, asked for with `key`, stays within the key's own egress bound (the server's
/// is the engine's to check): 400 `limit_exceeded` naming the domain and the key when it does
/// not. No key (an open server, or a request another node authenticated and forwarded): no
/// bound beyond the server's.
pub(crate) fn within_key(key: Option<&KeyRef>, policy: &NetworkPolicy) -> ApiResult<()> {
    match key.and_then(|k| k.egress.as_ref()) {
        Some(bound) => bound.check(policy).map_err(Into::into),
        None => Ok(()),
    }
}
