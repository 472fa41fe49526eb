//! An MCP `tools/call` result as the sandbox receives it: a small envelope the Python side
//! (`runcell_tools_mcp.decode`) turns into a value. Worked on the result's wire JSON (the
//! spec's shape), not on rmcp's types, so a new content kind upstream is passed on as data
//! rather than lost.
//!
//! - `structuredContent` present (even `null`): `{"structured": VALUE}`, the Python value.
//! - otherwise each content item: text → `{"text"}` (a `str`); image, audio, a resource's
//!   `blob` → `{"bytes": BASE64, "mime"}` (`bytes`); a resource's `text` → `{"text"}`;
//!   a resource link or a kind this code does not know → `{"value": ITEM}` (a dict).
//! - `isError: true` → the error's text (its text items joined), raised in the cell.

use base64::Engine as _;
use serde_json::{json, Value};

/// The envelope for a successful result, or the tool's error text.
pub fn convert(result: &Value) -> Result<Value, ConvertError> {
    let content = result
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let text: Vec<&str> = content
            .iter()
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect();
        let message = if !text.is_empty() {
            text.join("\n")
        } else if let Some(s) = result.get("structuredContent") {
            s.to_string()
        } else {
            "the tool reported an error without a message".to_owned()
        };
        return Err(ConvertError::Tool(message));
    }
    if let Some(value) = result.get("structuredContent") {
        return Ok(json!({ "structured": value }));
    }
    let items = content.iter().map(item).collect::<Result<Vec<_>, _>>()?;
    Ok(json!({ "content": items }))
}

fn item(c: &Value) -> Result<Value, ConvertError> {
    let kind = c.get("type").and_then(Value::as_str).unwrap_or_default();
    match kind {
        "text" => Ok(json!({ "text": c.get("text").and_then(Value::as_str).unwrap_or_default() })),
        "image" | "audio" => bytes(c.get("data"), c.get("mimeType"), kind),
        "resource" => {
            let r = c.get("resource").unwrap_or(&Value::Null);
            if let Some(text) = r.get("text").and_then(Value::as_str) {
                Ok(json!({ "text": text }))
            } else if r.get("blob").is_some() {
                bytes(r.get("blob"), r.get("mimeType"), "resource blob")
            } else {
                Ok(json!({ "value": r }))
            }
        }
        _ => Ok(json!({ "value": c })),
    }
}

/// Base64 checked here: a server's bad data is its error, named, not a `binascii.Error` deep
/// in the cell.
fn bytes(data: Option<&Value>, mime: Option<&Value>, kind: &str) -> Result<Value, ConvertError> {
    let data = data.and_then(Value::as_str).unwrap_or_default();
    if base64::engine::general_purpose::STANDARD
        .decode(data)
        .is_err()
    {
        return Err(ConvertError::Invalid(format!(
            "the server sent {kind} data that is not base64"
        )));
    }
    Ok(json!({ "bytes": data, "mime": mime.cloned().unwrap_or(Value::Null) }))
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// `isError`: the tool's own message.
    #[error("{0}")]
    Tool(String),
    /// A result that breaks the protocol.
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_content_wins_over_its_text_copy() {
        let r = json!({"content":[{"type":"text","text":"{\"n\":3}"}],"structuredContent":{"n":3}});
        assert_eq!(convert(&r), Ok(json!({"structured":{"n":3}})));
        let null = json!({"content":[],"structuredContent":null});
        assert_eq!(convert(&null), Ok(json!({"structured":null})));
    }

    #[test]
    fn content_items_become_text_bytes_or_values() {
        let r = json!({"content":[
            {"type":"text","text":"hi"},
            {"type":"image","data":"iVBORw0KGgo=","mimeType":"image/png"},
            {"type":"audio","data":"AAAA","mimeType":"audio/wav"},
            {"type":"resource","resource":{"uri":"file:///a","text":"body"}},
            {"type":"resource","resource":{"uri":"file:///b","blob":"AQI=","mimeType":"application/octet-stream"}},
            {"type":"resource_link","uri":"file:///c","name":"c"},
        ]});
        assert_eq!(
            convert(&r),
            Ok(json!({"content":[
                {"text":"hi"},
                {"bytes":"iVBORw0KGgo=","mime":"image/png"},
                {"bytes":"AAAA","mime":"audio/wav"},
                {"text":"body"},
                {"bytes":"AQI=","mime":"application/octet-stream"},
                {"value":{"type":"resource_link","uri":"file:///c","name":"c"}},
            ]}))
        );
        assert_eq!(convert(&json!({})), Ok(json!({"content":[]})));
    }

    #[test]
    fn errors_carry_their_text() {
        let r = json!({"isError":true,"content":[{"type":"text","text":"no such repo"},{"type":"text","text":"try again"}]});
        assert_eq!(
            convert(&r),
            Err(ConvertError::Tool("no such repo\ntry again".into()))
        );
        let bare = json!({"isError":true,"content":[]});
        assert_eq!(
            convert(&bare),
            Err(ConvertError::Tool(
                "the tool reported an error without a message".into()
            ))
        );
        let bad = json!({"content":[{"type":"image","data":"not base64!","mimeType":"image/png"}]});
        assert!(matches!(convert(&bad), Err(ConvertError::Invalid(m)) if m.contains("image")));
    }
}
