//! `/mistral/v1/agents`: an agent is a kept model, instructions and tools that a
//! conversation starts from (`agent_id`); only the `code_interpreter` tool runs here.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::context::{agent_store, time, Caller};
use super::error::Error;
use crate::state::AppState;
use crate::vendor::session::{load_record, save_record};

/// The request's tools, checked: `code_interpreter` only.
pub(super) fn check_tools(tools: Option<&Value>) -> Result<bool, Error> {
    let Some(tools) = tools.filter(|t| !t.is_null()) else {
        return Ok(false);
    };
    let list = tools
        .as_array()
        .ok_or_else(|| Error::invalid(&[json!("tools")], "Input should be a valid list"))?;
    let mut code = false;
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("code_interpreter") => code = true,
            other => {
                return Err(Error::invalid(
                    &[json!("tools"), json!(i), json!("type")],
                    format!(
                        "tool type {:?} is not supported here: this server runs code_interpreter",
                        other.unwrap_or("")
                    ),
                ))
            }
        }
    }
    Ok(code)
}

/// A JSON body, or Mistral's 422.
pub(super) fn parse_body(
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Value, Error> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
            )
        } else {
            Error::invalid(&[], e.body_text())
        }
    })?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid(&[], format!("JSON decode error: {e}")))?;
    if !v.is_object() {
        return Err(Error::invalid(&[], "the body must be a JSON object"));
    }
    Ok(v)
}

/// A required string field.
pub(super) fn required<'a>(v: &'a Value, field: &str) -> Result<&'a str, Error> {
    v.get(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::invalid(&[json!(field)], "Field required"))
}

pub(super) async fn create(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, Error> {
    let req = parse_body(body)?;
    let model = required(&req, "model")?;
    let name = required(&req, "name")?;
    check_tools(req.get("tools"))?;
    let store = agent_store(&state);
    let id = store.new_id();
    let now = time(chrono::Utc::now());
    let get = |k: &str| req.get(k).cloned().unwrap_or(Value::Null);
    let agent = json!({
        "object": "agent", "id": id, "model": model, "name": name,
        "version": 0, "versions": [0], "created_at": now, "updated_at": now,
        "deployment_chat": false, "source": "api",
        "instructions": get("instructions"), "description": get("description"),
        "tools": req.get("tools").cloned().unwrap_or_else(|| json!([])),
        "completion_args": req.get("completion_args").cloned().unwrap_or_else(|| json!({})),
        "handoffs": get("handoffs"), "metadata": get("metadata"),
    });
    let (t, i, a) = (tenant.0.clone(), id.clone(), agent.clone());
    tokio::task::spawn_blocking(move || save_record(&store, &t, &i, &a, None))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    Ok(Json(agent))
}

/// The tenant's agent `id`.
pub(super) async fn find(state: &AppState, tenant: &str, id: &str) -> Result<Value, Error> {
    load_record(&agent_store(state), tenant, id)
        .await
        .map_err(Error::internal)?
        .ok_or_else(|| Error::not_found(format!("Agent {id} not found")))
}

pub(super) async fn retrieve(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    find(&state, &tenant.0, &id).await.map(Json)
}

pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
) -> Result<Json<Value>, Error> {
    let store = agent_store(&state);
    let t = tenant.0.clone();
    let files = tokio::task::spawn_blocking(move || store.list(&t))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    let mut agents = Vec::new();
    for f in files {
        if let Some(a) = load_record::<Value>(&agent_store(&state), &tenant.0, &f.id)
            .await
            .map_err(Error::internal)?
        {
            agents.push(a);
        }
    }
    Ok(Json(Value::Array(agents)))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, Error> {
    let store = agent_store(&state);
    let (t, i) = (tenant.0.clone(), id.clone());
    let gone = tokio::task::spawn_blocking(move || store.delete(&t, &i))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    if gone {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Error::not_found(format!("Agent {id} not found")))
    }
}
