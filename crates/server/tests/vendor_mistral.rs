//! `/mistral` as Mistral's official Python SDK speaks it (tests/vendor-clients/
//! mistral_client.py, replies read through the SDK's typed models), against the app on port 0
//! whose model is a scripted stand-in: the seed's agent runs real code in a runcell session
//! per conversation, and the answers quote what that code computed.

mod common;

#[path = "common/vendor.rs"]
mod vendor;

use runcell_agent::ProviderKind;
use serde_json::{json, Value};
use vendor::{scripted, shown, Step};

async fn server(stand_in: &runcell_agent::testing::StandIn) -> common::Server {
    let provider = stand_in.config(ProviderKind::OpenAi);
    common::start_with(move |s| {
        s.with_vendor(runcell_server::VendorConfig {
            provider,
            pin_model: false,
            max_steps: 8,
        })
    })
    .await
}

async fn sdk(scenario: &str, srv: &common::Server, key: &str, arg: Option<&str>) -> Value {
    let (scenario, base, key) = (
        scenario.to_owned(),
        format!("{}/mistral", srv.base),
        key.to_owned(),
    );
    let arg = arg.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut args = vec![scenario.as_str(), base.as_str(), key.as_str()];
        if let Some(a) = &arg {
            args.push(a);
        }
        vendor::run_sdk("mistral_client.py", &args)
    })
    .await
    .expect("the SDK client")
}

fn python(code: &str) -> Step {
    Step::Call("python", json!({"code": code}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_coding_agent_runs_fibonacci_and_the_conversation_keeps_its_session() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match (task, outputs) {
        ("Run a fibonacci function for the first 20 values.", []) => python(
            "def fibonacci(n):\n    a, b = 0, 1\n    out = []\n    for _ in range(n):\n        out.append(a)\n        a, b = b, a + b\n    return out\nvalues = fibonacci(20)\nprint(values)",
        ),
        ("Now sum them", []) => python("print(sum(values))"),
        (_, [out, ..]) => Step::Say(format!("Result: {}", shown(out))),
        (t, []) => Step::Say(format!("unexpected task {t:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let (_, key) = srv.store.create_key("app", "acme").expect("key");
    let r = sdk("fibonacci", &srv, &key, None).await;

    let fib =
        "[0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181]";
    assert_eq!(
        r["types"],
        json!(["tool.execution", "message.output"]),
        "{r}"
    );
    assert_eq!(r["name"], "code_interpreter");
    assert_eq!(r["code_output"], format!("{fib}\n"));
    assert_eq!(r["arguments"]["code"], r["code"]);
    assert_eq!(r["answer"], format!("Result: {fib}"));
    assert_eq!(r["usage"], json!([201, 20, 221]));
    assert_eq!(r["follow_output"], "10945\n", "`values` was still defined");
    assert_eq!(r["follow_answer"], "Result: 10945");
    assert_eq!(r["same"], true);
    assert_eq!(
        r["history"],
        json!([
            "message.input",
            "tool.execution",
            "message.output",
            "message.input",
            "tool.execution",
            "message.output"
        ])
    );
    assert_eq!(r["conversation"][1], r["agent"][0]);
    // The agent's instructions went to the model.
    let requests = stand_in.requests();
    assert_eq!(requests[0].body["model"], "mistral-medium-2505");
    assert!(requests[0].body["messages"][0]["content"]
        .as_str()
        .is_some_and(|s| s.starts_with("Use the code interpreter tool")));

    let (rows, _) = srv
        .store
        .list_executions("acme", None, 10, None)
        .expect("executions");
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0].session_id, rows[1].session_id,
        "one session per conversation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_conversation_solves_the_linear_system() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("linear system") => python(
            "import numpy as np\nA = np.array([[1, 1, 1], [0, 2, 5], [2, 5, -1]])\nb = np.array([6, -4, 27])\nprint(np.linalg.solve(A, b))",
        ),
        [out, ..] => Step::Say(format!("x, y, z = {}", shown(out))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("linear", &srv, "unused", None).await;

    assert_eq!(
        r["events"],
        json!([
            "conversation.response.started",
            "tool.execution.started",
            "tool.execution.done",
            "message.output.delta",
            "conversation.response.done"
        ]),
        "{r}"
    );
    assert_eq!(r["code_output"], "[ 5.  3. -2.]\n");
    assert_eq!(r["answer"], "x, y, z = [ 5.  3. -2.]");
    assert_eq!(r["usage"], 221);
    assert_eq!(
        r["history"],
        json!(["message.input", "tool.execution", "message.output"])
    );
    let system = stand_in.requests()[0].body["messages"][0]["content"].clone();
    assert!(
        system
            .as_str()
            .is_some_and(|s| s.starts_with("Solve with numpy.")),
        "{system}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bar_chart_is_a_tool_file_to_download() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("bar chart") => python(
            "import matplotlib.pyplot as plt\nplt.bar(['North', 'South', 'East'], [120, 95, 143])\nplt.show()",
        ),
        [_, ..] => Step::Say("Here is the chart.".into()),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("chart", &srv, "unused", None).await;
    assert_eq!(r["chunks"], json!(["text", "tool_file"]), "{r}");
    assert_eq!(r["tool"], "code_interpreter");
    assert_eq!(r["file_name"], "plot_1.png");
    assert_eq!(r["png"], true);
    assert_eq!(r["answer"], "Here is the chart.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_mistrals_envelope_and_other_tenants_see_nothing() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, outputs| match outputs {
        [] => python("6 * 7"),
        [out, ..] => Step::Say(format!("It is {}.", shown(out))),
    });
    let srv = server(&stand_in).await;
    let (_, alice) = srv.store.create_key("a", "alice").expect("key");
    let (_, bob) = srv.store.create_key("b", "bob").expect("key");
    let started = sdk("started", &srv, &alice, None).await;
    let id = started["id"].as_str().expect("id").to_owned();
    let r = sdk("errors", &srv, &bob, Some(&id)).await;

    assert_eq!(r["tool"]["status"], 422, "{r}");
    assert_eq!(r["tool"]["class"], "HTTPValidationError");
    assert_eq!(r["tool"]["loc"], json!(["body", "tools", 0, "type"]));
    assert_eq!(r["agent"]["status"], 404);
    assert_eq!(r["agent"]["body"]["object"], "error");
    assert_eq!(r["conversation"]["status"], 404);
    assert_eq!(
        r["other_tenant"]["status"], 404,
        "bob cannot append to alice's conversation"
    );

    let sessions = |key: String| {
        let (http, base) = (srv.http.clone(), srv.base.clone());
        async move {
            let v: Value = http
                .get(format!("{base}/v1/sessions"))
                .bearer_auth(key)
                .send()
                .await
                .expect("list")
                .json()
                .await
                .expect("json");
            v["sessions"].as_array().map_or(0, Vec::len)
        }
    };
    assert_eq!(sessions(alice.clone()).await, 1);
    assert_eq!(sessions(bob).await, 0);
    // Refusals decided in front of the routes speak Mistral's envelope here too.
    let resp = srv
        .http
        .get(format!("{}/mistral/v1/conversations/{id}", srv.base))
        .header("host", "rebound.example")
        .bearer_auth(&alice)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["object"], "error", "{body}");
}
