//! A vendor conversation's runcell session (a Gemini interaction chain or chat, a Mistral
//! conversation) and the records it is found again by.

use super::FileStore;
use crate::error::ApiError;
use crate::state::{AppState, Tenant};

/// A new session of `tenant` for one conversation of `vendor`'s API (its metadata's
/// `source`).
pub(crate) async fn start_session(
    state: &AppState,
    tenant: &Tenant,
    vendor: &str,
) -> Result<String, ApiError> {
    let engine = state.engine.clone();
    let owner = tenant.0.clone();
    let metadata = [("source".to_owned(), vendor.to_owned())].into();
    let info = crate::sessions::blocking(move || {
        engine.sessions().create(runcell_engine::CreateSession {
            owner,
            metadata,
            ..runcell_engine::CreateSession::default()
        })
    })
    .await?;
    Ok(info.id)
}

/// `id` if it is a live session of `tenant` (one that ended, or another tenant's, is not).
pub(crate) fn live_session(state: &AppState, tenant: &Tenant, id: &str) -> Option<String> {
    state
        .engine
        .sessions()
        .get(id)
        .ok()
        .filter(|i| i.owner == tenant.0 && i.status != runcell_engine::SessionStatus::Dead)
        .map(|i| i.id)
}

/// A JSON record of `tenant` kept in `store` (a stored interaction, conversation, agent);
/// `None` when there is none (another tenant's is none either).
pub(crate) async fn load_record<T: serde::de::DeserializeOwned + Send + 'static>(
    store: &FileStore,
    tenant: &str,
    id: &str,
) -> std::io::Result<Option<T>> {
    let (store, tenant, id) = (store.clone(), tenant.to_owned(), id.to_owned());
    let found = tokio::task::spawn_blocking(move || store.read(&tenant, &id))
        .await
        .map_err(std::io::Error::other)??;
    match found {
        Some((_, data)) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(std::io::Error::other),
        None => Ok(None),
    }
}

/// Keeps `record` as `tenant`'s `id` in `store` (blocking).
pub(crate) fn save_record<T: serde::Serialize>(
    store: &FileStore,
    tenant: &str,
    id: &str,
    record: &T,
    session: Option<&str>,
) -> std::io::Result<()> {
    let data = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    store
        .put_as(
            tenant,
            id,
            "record.json",
            "application/json",
            &data,
            session,
            None,
        )
        .map(|_| ())
}
