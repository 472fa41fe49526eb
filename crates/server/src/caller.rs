//! The API key a request was made with, as much of it as handlers need: its own file, so that
//! what uses it (the vendor loops' approvals) need not import the state it is resolved by.

/// A key, as authentication found it (`state.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRef {
    pub id: String,
    pub name: String,
    /// The key's approval default (`runcell keys create --approval`), a floor for requests.
    pub approval: Option<runcell_store::ApprovalMode>,
}
