//! The provider clients against a scripted local stand-in: retries, errors, request shapes.
//! No sandbox needed.

mod common;

use std::time::Duration;

use common::{openai_call, openai_text, StandIn};
use runcell_agent::{AgentError, Client, ModelReply, ProviderKind, ToolReply, Turn};
use runcell_engine::tools::ToolImage;
use serde_json::{json, Value};

fn ask(stand_in: &StandIn, kind: ProviderKind, turns: &[Turn]) -> Result<ModelReply, AgentError> {
    Client::new(stand_in.config(kind))
        .expect("client")
        .complete("system prompt", turns)
}

fn question() -> Vec<Turn> {
    vec![Turn::User("Hi?".into())]
}

#[test]
fn server_errors_are_retried_with_backoff() {
    let stand_in = StandIn::start(|n, _| match n {
        0 | 1 => (503, vec![], r#"{"error":{"message":"overloaded"}}"#.into()),
        _ => (200, vec![], openai_text("fine")),
    });
    let reply = ask(&stand_in, ProviderKind::OpenAi, &question()).expect("reply");
    assert_eq!(reply.text, "fine");
    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 3);
    // 50 ms, then 100 ms.
    assert!(reqs[1].at - reqs[0].at >= Duration::from_millis(45));
    assert!(reqs[2].at - reqs[1].at >= Duration::from_millis(95));
}

#[test]
fn retries_give_up_after_three() {
    let stand_in = StandIn::start(|_, _| (500, vec![], "upstream broke".into()));
    let err = ask(&stand_in, ProviderKind::Anthropic, &question()).expect_err("500s");
    match &err {
        AgentError::Api {
            status, attempts, ..
        } => assert_eq!((*status, *attempts), (500, 4)),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("upstream broke"), "{err}");
    assert_eq!(stand_in.requests().len(), 4);
}

#[test]
fn a_429_without_retry_after_backs_off_and_gives_up() {
    let stand_in =
        StandIn::start(|_, _| (429, vec![], r#"{"error":{"message":"slow down"}}"#.into()));
    let err = ask(&stand_in, ProviderKind::OpenAi, &question()).expect_err("429s");
    assert!(
        matches!(
            err,
            AgentError::Api {
                status: 429,
                attempts: 4,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("slow down"));
}

#[test]
fn other_client_errors_are_not_retried() {
    let stand_in =
        StandIn::start(|_, _| (400, vec![], r#"{"error":{"message":"bad model"}}"#.into()));
    let err = ask(&stand_in, ProviderKind::OpenAi, &question()).expect_err("400");
    assert!(
        err.to_string().contains("400") && err.to_string().contains("bad model"),
        "{err}"
    );
    assert_eq!(stand_in.requests().len(), 1);
}

#[test]
fn anthropic_401_names_its_variable() {
    let stand_in = StandIn::start(|_, _| {
        (401, vec![], r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#.into())
    });
    let err = ask(&stand_in, ProviderKind::Anthropic, &question()).expect_err("401");
    let text = err.to_string();
    assert!(
        text.contains("ANTHROPIC_API_KEY") && text.contains("invalid x-api-key"),
        "{text}"
    );
}

#[test]
fn malformed_replies_are_explained() {
    let stand_in = StandIn::start(|n, _| match n {
        0 => (200, vec![], "<html>gateway</html>".into()),
        1 => (200, vec![], r#"{"choices": []}"#.into()),
        _ => (
            200,
            vec![],
            r#"{"id": "msg", "content": "not a list"}"#.into(),
        ),
    });
    let e = ask(&stand_in, ProviderKind::OpenAi, &question()).expect_err("html");
    assert!(
        matches!(e, AgentError::Malformed(_))
            && e.to_string().contains("not JSON")
            && e.to_string().contains("gateway"),
        "{e}"
    );
    let e = ask(&stand_in, ProviderKind::OpenAi, &question()).expect_err("no choices");
    assert!(e.to_string().contains("choices[0].message"), "{e}");
    let e = ask(&stand_in, ProviderKind::Anthropic, &question()).expect_err("no content");
    assert!(e.to_string().contains("no content list"), "{e}");
}

#[test]
fn unparsable_arguments_are_kept_for_the_model() {
    let stand_in = StandIn::start(|_, _| (200, vec![], openai_call("c1", "python", "{\"code\": ")));
    let reply = ask(&stand_in, ProviderKind::OpenAi, &question()).expect("reply");
    assert_eq!(reply.calls.len(), 1);
    assert_eq!(reply.calls[0].arguments, "{\"code\": ");
    assert!(reply.calls[0]
        .bad_arguments
        .as_deref()
        .is_some_and(|m| m.contains("not valid JSON")));
}

fn transcript_with_image() -> Vec<Turn> {
    let reply = ModelReply {
        text: String::new(),
        calls: vec![runcell_agent::ToolUse {
            id: "c1".into(),
            name: "python".into(),
            input: json!({"code": "plot()"}),
            arguments: r#"{"code": "plot()"}"#.into(),
            bad_arguments: None,
        }],
        raw: Value::Null,
    };
    vec![
        Turn::User("Chart it".into()),
        Turn::Assistant(reply),
        Turn::Tools(vec![ToolReply {
            id: "c1".into(),
            name: "python".into(),
            text: "images: 1 PNG image attached\n".into(),
            images: vec![ToolImage {
                mime: "image/png".into(),
                data_base64: "iVBORw0KGgo=".into(),
            }],
            is_error: false,
        }]),
    ]
}

#[test]
fn openai_images_follow_the_tool_messages_as_a_user_message() {
    let body = runcell_agent::provider::openai_request("m", "sys", &transcript_with_image());
    let m = body["messages"].as_array().expect("messages");
    assert_eq!(m.len(), 5);
    assert_eq!(
        m[2]["tool_calls"][0]["function"]["arguments"],
        r#"{"code": "plot()"}"#
    );
    assert_eq!(m[2]["content"], Value::Null);
    assert_eq!(m[3]["role"], "tool");
    assert!(m[3]["content"].is_string(), "tool messages are text only");
    assert_eq!(m[4]["role"], "user");
    assert_eq!(
        m[4]["content"][1]["image_url"]["url"],
        "data:image/png;base64,iVBORw0KGgo="
    );
}

#[test]
fn anthropic_images_go_inside_the_tool_result() {
    let body =
        runcell_agent::provider::anthropic_request("m", 100, "sys", &transcript_with_image());
    let m = body["messages"].as_array().expect("messages");
    assert_eq!(m.len(), 3);
    assert_eq!(m[1]["content"][0]["type"], "tool_use");
    assert_eq!(m[1]["content"][0]["input"]["code"], "plot()");
    let result = &m[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["content"][1]["source"]["data"], "iVBORw0KGgo=");
    assert_eq!(body["system"], "sys");
}

#[test]
fn gemini_calls_are_read_and_sent_back_with_their_signatures() {
    let stand_in = StandIn::start(|_, _| {
        let body = json!({"candidates": [{"index": 0, "finishReason": "STOP", "content": {"role": "model",
            "parts": [{"text": "thinking...", "thought": true}, {"text": "Running it."},
                      {"functionCall": {"name": "python", "args": {"code": "1+1"}}, "thoughtSignature": "c2ln"}]}}],
            "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3}});
        (200, vec![], body.to_string())
    });
    let client = Client::new(stand_in.config(ProviderKind::Gemini)).expect("client");
    let (reply, meta) = client
        .complete_with(
            "sys",
            &question(),
            &[runcell_agent::ToolSpec {
                name: "python".into(),
                description: "run".into(),
                input_schema: json!({"type": "object", "additionalProperties": false,
                                     "properties": {"code": {"type": "string"}}}),
            }],
        )
        .expect("reply");
    assert_eq!(reply.text, "Running it.", "a thought is not the answer");
    assert_eq!(reply.calls[0].input["code"], "1+1");
    assert_eq!(meta.input_tokens, 7);
    assert_eq!(meta.stop_reason.as_deref(), Some("tool_use"));
    let req = &stand_in.requests()[0];
    assert_eq!(req.path, "/v1beta/models/test-model:generateContent");
    assert_eq!(req.headers["x-goog-api-key"], "test-key");
    let decl = &req.body["tools"][0]["functionDeclarations"][0];
    assert_eq!(decl["name"], "python");
    assert!(
        decl["parameters"].get("additionalProperties").is_none(),
        "Gemini's schema subset: {decl}"
    );
    assert_eq!(req.body["systemInstruction"]["parts"][0]["text"], "sys");

    // The reply goes back verbatim; the result as a functionResponse without an id (the call
    // had none), then the figure.
    let mut turns = question();
    let id = reply.calls[0].id.clone();
    turns.push(Turn::Assistant(reply));
    turns.push(Turn::Tools(vec![ToolReply {
        id,
        name: "python".into(),
        text: "2".into(),
        images: vec![ToolImage {
            mime: "image/png".into(),
            data_base64: "iVBORw0KGgo=".into(),
        }],
        is_error: false,
    }]));
    client.complete_with("sys", &turns, &[]).expect("reply");
    let body = &stand_in.requests()[1].body;
    assert!(body.get("tools").is_none(), "no tools offered: {body}");
    let c = body["contents"].as_array().expect("contents");
    assert_eq!(c[1]["role"], "model");
    assert_eq!(c[1]["parts"][2]["thoughtSignature"], "c2ln");
    assert_eq!(c[1]["parts"][0]["thought"], true);
    assert_eq!(
        c[2]["parts"][0],
        json!({"functionResponse": {"name": "python", "response": {"output": "2"}}})
    );
    assert_eq!(c[2]["parts"][1]["inlineData"]["data"], "iVBORw0KGgo=");
}

#[test]
fn a_gemini_reply_without_candidates_says_why() {
    let stand_in = StandIn::start(|_, _| {
        (
            200,
            vec![],
            json!({"promptFeedback": {"blockReason": "SAFETY"}}).to_string(),
        )
    });
    let e = ask(&stand_in, ProviderKind::Gemini, &question()).expect_err("blocked");
    assert!(e.to_string().contains("SAFETY"), "{e}");
}
