//! An execution on its way into an audit chain: checked, its timestamp formatted as the chain
//! hashes it. Shared by both backends' appends.

use std::borrow::Cow;

use crate::error::Result;
use crate::{time, validate, NewExecution};

/// An execution waiting in the group commit, with its timestamp already formatted.
#[derive(Debug)]
pub(crate) struct PendingAppend<'a> {
    pub(crate) rec: Cow<'a, NewExecution>,
    pub(crate) created_at: String,
}

/// Checks one record and formats its timestamp for the chain.
pub(crate) fn pending_append(rec: &NewExecution) -> Result<PendingAppend<'_>> {
    validate::name("tenant", &rec.tenant)?;
    validate::id("execution id", &rec.execution_id)?;
    if let Some(s) = &rec.session_id {
        validate::id("session id", s)?;
    }
    validate::word("status", &rec.status)?;
    validate::json("execution_json", &rec.execution_json)?;
    Ok(PendingAppend {
        created_at: time::fmt(rec.created_at),
        rec: Cow::Borrowed(rec),
    })
}
