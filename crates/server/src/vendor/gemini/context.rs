//! What every `/gemini` handler shares: the API versions served, who calls, where
//! interactions are kept, and how a `generateContent` conversation finds its session.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::Value;
use sha2::Digest;

use super::error::Error;
use crate::caller::KeyRef;
use crate::state::{AppState, Principal, Tenant};
use crate::vendor::FileStore;

/// The API versions the SDKs use.
pub(super) fn check_version(version: &str) -> Result<(), Error> {
    match version {
        "v1" | "v1beta" | "v1alpha" => Ok(()),
        other => Err(Error::new(
            StatusCode::NOT_FOUND,
            format!("API version {other:?} is not served here: use v1 or v1beta"),
        )),
    }
}

/// Stored interactions, for `previous_interaction_id` (ids `int_...`).
pub(super) fn interaction_store(state: &AppState) -> FileStore {
    FileStore::new(
        &state.engine.config().data_dir,
        "gemini-interactions",
        "int",
    )
}

/// The session each `generateContent` conversation runs in, by [`history_key`].
pub(super) fn chat_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "gemini-chats", "chat")
}

/// A `generateContent` conversation's key: a hash of what its turns say (each turn's role,
/// its text, its code and the code's output; not inline data or signatures, which an SDK
/// may re-encode). The server keeps the session of the conversation a reply ends under the
/// key of the contents up to and including that reply; the next request sends those
/// contents back before its new user turn, so the same key finds the session. A client that
/// edits earlier turns, or starts over, gets a fresh session.
pub(super) fn history_key(contents: &[Value]) -> String {
    let mut h = sha2::Sha256::new();
    for c in contents {
        let role = c.get("role").and_then(Value::as_str).unwrap_or("user");
        h.update(format!("role:{role}\n").as_bytes());
        for p in c
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let field = |camel: &str, snake: &str| p.get(camel).or_else(|| p.get(snake)).cloned();
            if let Some(Value::String(t)) = p.get("text") {
                h.update(format!("text:{}:{t}\n", t.len()).as_bytes());
            }
            if let Some(code) = field("executableCode", "executable_code") {
                let c = code.get("code").and_then(Value::as_str).unwrap_or("");
                h.update(format!("code:{}:{c}\n", c.len()).as_bytes());
            }
            if let Some(r) = field("codeExecutionResult", "code_execution_result") {
                let o = r.get("output").and_then(Value::as_str).unwrap_or("");
                h.update(format!("output:{}:{o}\n", o.len()).as_bytes());
            }
        }
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("chat_{hex}")
}

/// The caller's tenant (and key: its approval default), from `x-goog-api-key` (what the SDKs send), `?key=`, or
/// `Authorization: Bearer`.
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant, pub Option<KeyRef>);

/// `key=` of a query string.
fn query_key(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "key").then(|| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let mut headers: HeaderMap = parts.headers.clone();
        if !headers.contains_key("x-goog-api-key") {
            if let Some(k) = query_key(parts.uri.query()) {
                if let Ok(v) = HeaderValue::from_str(&k) {
                    headers.insert("x-goog-api-key", v);
                }
            }
        }
        let header = headers
            .contains_key("x-goog-api-key")
            .then_some("x-goog-api-key");
        match Principal::of_vendor_request(&headers, header, state).await? {
            Ok(p) => Ok(Caller(p.tenant, p.key)),
            Err(why) => Err(Error::new(
                StatusCode::UNAUTHORIZED,
                format!("API key not valid: {why}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_conversation_is_keyed_on_what_it_says_in_either_spelling() {
        let camel = vec![
            json!({"role": "user", "parts": [{"text": "fib?"}]}),
            json!({"role": "model", "parts": [
                {"executableCode": {"language": "PYTHON", "code": "print(55)"}},
                {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "55\n"}},
                {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                {"text": "55", "thoughtSignature": "xyz"}]}),
        ];
        let snake = vec![
            json!({"parts": [{"text": "fib?"}]}),
            json!({"role": "model", "parts": [
                {"executable_code": {"code": "print(55)", "language": "PYTHON"}},
                {"code_execution_result": {"output": "55\n", "outcome": "OUTCOME_OK"}},
                {"text": "55"}]}),
        ];
        assert_eq!(history_key(&camel), history_key(&snake));
        assert_ne!(history_key(&camel), history_key(&camel[..1]));
        let edited = vec![
            camel[0].clone(),
            json!({"role": "model", "parts": [{"text": "56"}]}),
        ];
        assert_ne!(history_key(&camel), history_key(&edited));
        let key = history_key(&camel);
        let store = FileStore::new(std::path::Path::new("/tmp"), "x", "chat");
        assert!(store.is_id(&key), "{key}");
    }

    #[test]
    fn the_key_may_come_in_the_query() {
        assert_eq!(query_key(Some("alt=sse&key=a%2Bb")).as_deref(), Some("a+b"));
        assert_eq!(query_key(Some("alt=sse")), None);
    }
}
