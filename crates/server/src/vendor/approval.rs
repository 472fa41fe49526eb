//! `approval: "never" | "always"` on the vendor endpoints (issue 27): an official SDK sends it
//! through its standard escape hatches, as a body field (`extra_body={"approval": "always"}`)
//! or a header (`extra_headers={"runcell-approval": "always"}`), or the API key carries it as
//! its default (`runcell keys create --approval always`). With `always`, each code cell the
//! model proposes waits in `GET /v1/approvals` until `POST /v1/approvals/{id}` approves,
//! edits or declines it; the decision goes to the audit log before anything runs.
//!
//! A key's `always` is a floor: a request made with it that asks for `never` is refused (403)
//! rather than quietly made to wait, so a client that counted on cells running unattended
//! learns at once why they will not. A key whose default is `never` (or none) lets a request
//! ask for `always`.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use runcell_agent::{Gate, Proposal, Ruling, ToolUse};
use runcell_engine::{Engine, EngineError};
use runcell_store::ApprovalMode;
use serde_json::Value;

use crate::caller::KeyRef;
use crate::error::ApiError;
use crate::pending::{Approvals, Place};

/// The header a request may say its approval mode in.
pub(crate) const HEADER: &str = "runcell-approval";

/// The approval mode a request runs under: what its body's `approval` field or the
/// [`HEADER`] says (they must agree when both are given), else its key's default, else
/// `never`. Refused: a word other than `never` / `always` (400), and `never` on a key whose
/// default is `always` (403).
pub(crate) fn mode(
    body: Option<&str>,
    headers: &HeaderMap,
    key: Option<&KeyRef>,
) -> Result<ApprovalMode, ApiError> {
    let word = |s: &str, from: &str| {
        ApprovalMode::parse(s).ok_or_else(|| {
            ApiError::invalid(format!(
                "{from} is `never` or `always`, not {:?}",
                s.chars().take(64).collect::<String>()
            ))
        })
    };
    let from_body = body.map(|b| word(b, "`approval`")).transpose()?;
    let from_header = match headers.get(HEADER) {
        None => None,
        Some(v) => Some(word(
            v.to_str().map(str::trim).unwrap_or("(not text)"),
            "the runcell-approval header",
        )?),
    };
    let asked = match (from_body, from_header) {
        (Some(b), Some(h)) if b != h => {
            return Err(ApiError::invalid(format!(
                "the body's `approval` ({b}) and the runcell-approval header ({h}) disagree"
            )))
        }
        (b, h) => b.or(h),
    };
    let floor = key.and_then(|k| k.approval);
    if floor == Some(ApprovalMode::Always) && asked == Some(ApprovalMode::Never) {
        let name = key.map_or("", |k| k.name.as_str());
        return Err(ApiError::forbidden(format!(
            "the API key {name:?} requires approval of every cell (its approval is `always`): \
             a request cannot lower it to `never`"
        )));
    }
    Ok(asked.or(floor).unwrap_or(ApprovalMode::Never))
}

/// [`mode`] of a request whose body is read as JSON (Gemini's, Mistral's): its `approval`
/// member, which must be a string when present.
pub(crate) fn mode_of_json(
    body: &Value,
    headers: &HeaderMap,
    key: Option<&KeyRef>,
) -> Result<ApprovalMode, ApiError> {
    let field = match body.get("approval") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(ApiError::invalid(
                "`approval` is `never` or `always` (a string)",
            ))
        }
    };
    mode(field, headers, key)
}

/// The approver of one request in `mode` whose cells run in `session` (none: no code runs)
/// of `tenant`, answering at `source`'s endpoint. (`state`'s approvals and engine.)
pub(crate) fn approver_for(
    state: (&Arc<Approvals>, &Engine),
    mode: ApprovalMode,
    tenant: &str,
    session: Option<&String>,
    source: &'static str,
    stop: &Arc<AtomicBool>,
) -> Option<Approver> {
    let place = Place {
        tenant: tenant.to_owned(),
        session: session?.clone(),
        source,
    };
    Approver::new(mode, state.0, state.1, place, stop.clone())
}

/// What a gate asks: the registry's wait for one cell.
type Decide = Box<dyn FnMut(&Proposal<'_>) -> runcell_agent::Answer + Send>;

/// Asks a person about each cell of one vendor request, through the approvals registry, and
/// records each decision. Shared by the loops' threads through `&self`.
pub(crate) struct Approver {
    engine: Engine,
    place: Place,
    decide: Mutex<Decide>,
}

impl std::fmt::Debug for Approver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approver")
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

impl Approver {
    /// An approver for `mode` (none for `never`): cells of `session` of `tenant`, waiting in
    /// `approvals` until answered, [`crate::pending::WAIT`] passes or `stop` is set.
    pub(crate) fn new(
        mode: ApprovalMode,
        approvals: &Arc<Approvals>,
        engine: &Engine,
        place: Place,
        stop: Arc<AtomicBool>,
    ) -> Option<Approver> {
        if mode == ApprovalMode::Never {
            return None;
        }
        let session = place.session.clone();
        let decide = crate::pending::gate_for(approvals.clone(), place.clone(), stop, move |p| {
            tracing::info!(%session, approval = %p.id, tool = %p.tool, "a cell waits for approval");
        });
        Some(Approver {
            engine: engine.clone(),
            place,
            decide: Mutex::new(Box::new(decide)),
        })
    }

    /// Asks about `call` (step `step` of the request), whose reviewable form is `code`, and
    /// records the decision in the audit log before anything runs.
    pub(crate) fn rule(
        &self,
        step: usize,
        call: &ToolUse,
        code: String,
    ) -> Result<Ruling, EngineError> {
        let mut decide = self.decide.lock().unwrap_or_else(|p| p.into_inner());
        let mut gate = Gate {
            // Every answer names who gave it; this is only the fallback.
            by: format!("api:{}", self.place.tenant),
            decide: &mut **decide,
        };
        let p = Proposal { step, call, code };
        runcell_agent::approval::rule(
            &self.engine,
            &self.place.tenant,
            &self.place.session,
            &p,
            &mut gate,
        )
    }
}

/// `call` with the edited `code` in its input's `field` (`code`, `command`), or, with no
/// field, `code` as the whole input (a JSON object: the text editor's arguments).
pub(crate) fn edited(call: &ToolUse, field: Option<&str>, code: &str) -> Result<ToolUse, String> {
    let mut out = call.clone();
    out.input = match field {
        Some(f) => {
            let mut input = match &call.input {
                Value::Object(m) => m.clone(),
                _ => serde_json::Map::new(),
            };
            input.insert(f.into(), Value::String(code.to_owned()));
            Value::Object(input)
        }
        None => match serde_json::from_str::<Value>(code) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return Err("the edited arguments are not a JSON object".into()),
            Err(e) => return Err(format!("the edited arguments are not JSON: {e}")),
        },
    };
    out.arguments = out.input.to_string();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn key(approval: Option<ApprovalMode>) -> KeyRef {
        KeyRef {
            id: "key_1".into(),
            name: "agent".into(),
            approval,
            egress: None,
        }
    }

    fn headers(v: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = v {
            h.insert(HEADER, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    #[test]
    fn the_request_says_else_the_key_else_never() {
        use ApprovalMode::*;
        let none = headers(None);
        assert_eq!(mode(None, &none, None).expect("ok"), Never);
        assert_eq!(mode(Some("always"), &none, None).expect("ok"), Always);
        assert_eq!(
            mode(None, &headers(Some("always")), None).expect("ok"),
            Always
        );
        assert_eq!(
            mode(Some("always"), &headers(Some("always")), None).expect("agree"),
            Always
        );
        assert_eq!(
            mode(None, &none, Some(&key(Some(Always)))).expect("ok"),
            Always
        );
        assert_eq!(
            mode(None, &none, Some(&key(Some(Never)))).expect("ok"),
            Never
        );
        // A key's `never` (or none) lets a request ask for more.
        assert_eq!(
            mode(Some("always"), &none, Some(&key(Some(Never)))).expect("ok"),
            Always
        );
        assert_eq!(
            mode(Some("always"), &none, Some(&key(Some(Always)))).expect("ok"),
            Always
        );
    }

    #[test]
    fn bad_words_disagreement_and_lowering_a_floor_are_refused() {
        use ApprovalMode::*;
        let status = |r: Result<ApprovalMode, ApiError>| r.expect_err("refused").parts().0;
        let none = headers(None);
        assert_eq!(status(mode(Some("sometimes"), &none, None)), 400);
        assert_eq!(status(mode(Some("Always"), &none, None)), 400);
        assert_eq!(status(mode(None, &headers(Some("yes")), None)), 400);
        assert_eq!(
            status(mode(Some("never"), &headers(Some("always")), None)),
            400
        );
        let floor = key(Some(Always));
        let e = mode(Some("never"), &none, Some(&floor)).expect_err("a floor");
        let (s, body) = e.parts();
        assert_eq!(s, 403);
        assert!(
            body.error.message.contains("\"agent\""),
            "{}",
            body.error.message
        );
        assert_eq!(
            status(mode(None, &headers(Some("never")), Some(&floor))),
            403
        );
        // The control: the same request on a key without the floor runs unattended.
        assert_eq!(
            mode(Some("never"), &none, Some(&key(None))).expect("ok"),
            Never
        );
    }

    #[test]
    fn edits_replace_the_field_or_the_whole_input() {
        let call = ToolUse {
            id: "c".into(),
            name: "bash_code_execution".into(),
            input: serde_json::json!({"command": "rm -rf data", "restart": false}),
            arguments: String::new(),
            bad_arguments: None,
        };
        let e = edited(&call, Some("command"), "ls").expect("edited");
        assert_eq!(
            e.input,
            serde_json::json!({"command": "ls", "restart": false})
        );
        assert_eq!(e.arguments, e.input.to_string());
        let e = edited(&call, None, r#"{"command": "view", "path": "a"}"#).expect("json");
        assert_eq!(e.input["path"], "a");
        assert!(edited(&call, None, "[1]").is_err());
        assert!(edited(&call, None, "view a").is_err());
    }
}
