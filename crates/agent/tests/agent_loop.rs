//! The loop on a real engine (sandbox and Python runtime) with a scripted model.

mod common;

use std::path::Path;

use common::{openai_call, openai_text, StandIn};
use runcell_agent::{Agent, AgentOptions, ProviderKind, StepEvent, StopReason, Turn};
use runcell_engine::InputFile;
use serde_json::json;

fn engine() -> runcell_engine::testing::TestEngine {
    runcell_engine::testing::engine(Path::new(env!("CARGO_TARGET_TMPDIR")))
}

fn python(id: &str, code: &str) -> String {
    openai_call(id, "python", &json!({"code": code}).to_string())
}

#[test]
fn five_failures_in_a_row_end_the_run() {
    let engine = engine();
    let stand_in = StandIn::start(|n, _| (200, vec![], python(&format!("c{n}"), "1/0")));
    let agent = Agent::new(engine.0.clone(), stand_in.config(ProviderKind::OpenAi)).expect("agent");
    let mut results = 0;
    let outcome = agent
        .run("Divide.", &[], &AgentOptions::default(), &mut |e| {
            if let StepEvent::ToolResult { output, .. } = e {
                assert!(output.is_error && output.text.contains("ZeroDivisionError"));
                results += 1;
            }
        })
        .expect("run");
    assert_eq!(outcome.stop, StopReason::TooManyFailures);
    assert_eq!((outcome.steps, results), (5, 5));
    assert_eq!(stand_in.requests().len(), 5);
    assert!(
        engine.sessions().list().is_empty(),
        "the session is deleted"
    );
}

#[test]
fn a_success_resets_the_failure_count_and_max_steps_ends_the_run() {
    let engine = engine();
    let stand_in = StandIn::start(|n, _| {
        let code = if n % 4 == 3 { "x = 1" } else { "1/0" };
        (200, vec![], python(&format!("c{n}"), code))
    });
    let agent = Agent::new(engine.0.clone(), stand_in.config(ProviderKind::OpenAi)).expect("agent");
    let opts = AgentOptions {
        max_steps: 9,
        ..AgentOptions::default()
    };
    let outcome = agent.run("Loop.", &[], &opts, &mut |_| {}).expect("run");
    assert_eq!(outcome.stop, StopReason::MaxSteps);
    assert_eq!(outcome.steps, 9);
    assert_eq!(stand_in.requests().len(), 9);
}

#[test]
fn bad_calls_are_told_to_the_model_and_every_tool_shares_the_workspace() {
    let engine = engine();
    let stand_in = StandIn::start(|n, req| {
        let body = match n {
            0 => openai_call("c0", "python", "{not json"),
            1 => openai_call("c1", "rm_rf", "{}"),
            2 => openai_call("c2", "bash", &json!({"command": "mkdir -p out && wc -l < in.txt > out/count.txt"}).to_string()),
            3 => openai_call("c3", "text_editor", &json!({"command": "create", "path": "notes.md", "file_text": "# notes\n"}).to_string()),
            4 => python("c4", "open('in.txt', 'a').write('three\\n')\nprint(open('out/count.txt').read().strip())"),
            _ => {
                let last = req.body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
                openai_text(&format!("done: {}", last["content"].as_str().unwrap_or("")))
            }
        };
        (200, vec![], body)
    });
    let agent = Agent::new(engine.0.clone(), stand_in.config(ProviderKind::OpenAi)).expect("agent");
    let files = [InputFile {
        path: "in.txt".into(),
        content: b"one\ntwo\n".to_vec(),
    }];
    let outcome = agent
        .run("Count.", &files, &AgentOptions::default(), &mut |_| {})
        .expect("run");
    assert_eq!(outcome.stop, StopReason::Answer);
    assert!(outcome.answer.contains("stdout:\n2"), "{}", outcome.answer);

    let reqs = stand_in.requests();
    let tool_text = |n: usize| -> String {
        reqs[n].body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned()
    };
    assert!(tool_text(1).contains("not valid JSON"), "{}", tool_text(1));
    assert!(tool_text(2).contains("unknown tool"), "{}", tool_text(2));
    assert!(tool_text(3).contains("exit_code: 0"), "{}", tool_text(3));
    assert!(
        tool_text(4).contains("created notes.md"),
        "{}",
        tool_text(4)
    );

    // Created and modified files, whichever tool wrote them; the untouched upload is not one.
    let produced: Vec<(&str, &[u8])> = outcome
        .files_produced
        .iter()
        .map(|f| (f.path.as_str(), f.content.as_slice()))
        .collect();
    assert_eq!(
        produced,
        [
            ("in.txt", &b"one\ntwo\nthree\n"[..]),
            ("notes.md", b"# notes\n"),
            ("out/count.txt", b"2\n"),
        ]
    );
    assert!(matches!(
        outcome.transcript.last(),
        Some(Turn::Assistant(_))
    ));
    assert!(engine.sessions().list().is_empty());
}

#[test]
fn a_given_session_is_used_and_kept_and_the_stop_flag_ends_the_run_between_steps() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let engine = engine();
    let info = engine
        .sessions()
        .create(runcell_engine::CreateSession::default())
        .expect("session");
    let stand_in = StandIn::start(|n, _| (200, vec![], python(&format!("c{n}"), "x = 1")));
    let agent = Agent::new(engine.0.clone(), stand_in.config(ProviderKind::OpenAi)).expect("agent");
    let stop = Arc::new(AtomicBool::new(false));
    let opts = AgentOptions {
        session: Some(info.id.clone()),
        stop: Some(stop.clone()),
        ..AgentOptions::default()
    };
    let mut ran_in = Vec::new();
    let result = agent.run("Loop.", &[], &opts, &mut |e| {
        if let StepEvent::ToolResult { output, .. } = e {
            ran_in.push(output.execution.as_ref().and_then(|x| x.session_id.clone()));
            // The client went away after the first cell.
            stop.store(true, Ordering::SeqCst);
        }
    });
    assert!(
        matches!(result, Err(runcell_agent::AgentError::Stopped)),
        "{result:?}"
    );
    assert_eq!(
        ran_in,
        vec![Some(info.id.clone())],
        "the cell ran in the given session"
    );
    assert_eq!(stand_in.requests().len(), 1, "no model call after the stop");
    assert!(
        engine.sessions().get(&info.id).is_ok(),
        "a session the caller gave is not deleted"
    );
}
