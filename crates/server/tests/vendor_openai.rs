//! `/openai/v1` as OpenAI's official Python SDK speaks it (tests/vendor-clients/
//! openai_client.py, strict response validation), against the app on port 0 whose model is a
//! scripted stand-in: the seeds' examples run real code in a runcell session (a container),
//! and the answers quote what that code computed.

mod common;

#[path = "common/vendor.rs"]
mod vendor;

use runcell_agent::ProviderKind;
use serde_json::{json, Value};
use vendor::{scripted, section, Step};

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

async fn sdk(scenario: &str, srv: &common::Server, key: &str) -> Value {
    let (scenario, base, key) = (
        scenario.to_owned(),
        format!("{}/openai/v1", srv.base),
        key.to_owned(),
    );
    tokio::task::spawn_blocking(move || {
        vendor::run_sdk("openai_client.py", &[&scenario, &base, &key])
    })
    .await
    .expect("the SDK client")
}

fn python(code: &str) -> Step {
    Step::Call("python", json!({"code": code}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fibonacci_and_a_follow_up_share_the_container_of_the_keys_tenant() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match (task, outputs) {
        ("Calculate the first 10 Fibonacci numbers", []) => python(
            "a, b = 0, 1\nout = []\nfor _ in range(10):\n    out.append(a)\n    a, b = b, a + b\nprint(*out)",
        ),
        ("Now the 30th one", []) => python("a, b = 0, 1\nfor _ in range(30):\n    a, b = b, a + b\na"),
        (_, [out, ..]) => {
            let got = section(out, "stdout");
            Step::Say(format!("The result: {}.", if got.is_empty() { section(out, "result") } else { got }))
        }
        (t, []) => Step::Say(format!("unexpected task {t:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let (_, key) = srv.store.create_key("app", "acme").expect("key");
    let r = sdk("fibonacci", &srv, &key).await;

    assert_eq!(r["logs"], "0 1 1 2 3 5 8 13 21 34\n", "{r}");
    assert_eq!(r["answer"], "The result: 0 1 1 2 3 5 8 13 21 34.");
    assert_eq!(
        r["follow_answer"], "The result: 832040.",
        "the value of the last expression"
    );
    assert_eq!(
        r["follow_container"], r["container"],
        "auto reuses the conversation's container"
    );
    assert_eq!(r["retrieved"][1], r["answer"]);
    assert_eq!(r["usage"], json!([201, 20, 221]));
    let requests = stand_in.requests();
    assert_eq!(requests[0].body["model"], "gpt-4.1");
    // The follow-up carried the first exchange.
    let history = requests[2].body["messages"].to_string();
    assert!(history.contains("0 1 1 2 3 5 8 13 21 34"), "{history}");

    let session = r["container"]
        .as_str()
        .expect("container")
        .replace("cntr_", "ses_");
    let (rows, _) = srv
        .store
        .list_executions("acme", None, 10, None)
        .expect("executions");
    assert!(
        rows.iter()
            .any(|e| e.session_id.as_deref() == Some(session.as_str())
                && e.code.contains("range(10)"))
    );

    let r = sdk("wrong_key", &srv, "not-a-key").await;
    assert_eq!(
        r,
        json!({"status": 401, "code": "invalid_api_key", "sdk": "3.57.0"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bar_chart_is_cited_and_downloaded_from_the_container() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("bar chart") => python(
            "import matplotlib.pyplot as plt\nplt.bar(['North', 'South', 'East'], [120, 95, 143])\nplt.savefig('/mnt/data/chart.png')\nplt.show()",
        ),
        [_, ..] => Step::Say("Here is the chart: sandbox:/mnt/data/chart.png".into()),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("chart", &srv, "unused").await;

    let files = r["files"].as_array().expect("files");
    assert_eq!(files.len(), 1, "{r}");
    assert_eq!(files[0]["filename"], "chart.png");
    assert_eq!(files[0]["cited"], "sandbox:/mnt/data/chart.png");
    assert_eq!(files[0]["png"], true);
    assert_eq!(files[0]["meta"][0], "/mnt/data/chart.png");
    assert_eq!(files[0]["meta"][1], files[0]["bytes"]);
    assert_eq!(files[0]["meta"][2], "assistant");
    assert_eq!(
        r["images"],
        json!(["logs", "image"]),
        "the figure shown is an image output"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_and_their_files_serve_monthly_sales_statistics() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("monthly sales") => python(
            "import pandas as pd\ndf = pd.read_csv('/mnt/data/sales.csv')\ns = df['sales']\nprint(f\"mean={s.mean():.2f} median={s.median():.1f} std={s.std():.2f} best={df.loc[s.idxmax(), 'month']}\")",
        ),
        [out, ..] => Step::Say(format!("Monthly sales: {}", section(out, "stdout"))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("containers", &srv, "unused").await;

    let sales = [1200.0, 1350.0, 980.0, 1610.0, 1475.0, 1720.0_f64];
    let mean = sales.iter().sum::<f64>() / 6.0;
    let std = (sales.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 5.0).sqrt();
    let expected = format!("mean={mean:.2} median=1412.5 std={std:.2} best=Jun");
    assert_eq!(
        r["logs"].as_str().map(str::trim),
        Some(expected.as_str()),
        "{r}"
    );
    assert_eq!(r["answer"], format!("Monthly sales: {expected}"));
    let container = r["container"].as_array().expect("container");
    assert_eq!(container[1], "analysis");
    assert_eq!(container[2], "running");
    assert_eq!(container[3], 5);
    assert_eq!(container[4], "container");
    assert_eq!(r["call_container"], container[0]);
    assert_eq!(
        r["file"],
        json!(["/mnt/data/sales.csv", 65, "user", "container.file"])
    );
    assert_eq!(r["by_id"], json!(["/mnt/data/extra.txt", 19]));
    assert_eq!(
        r["listed"],
        json!(["/mnt/data/extra.txt", "/mnt/data/sales.csv"])
    );
    assert!(r["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("month,sales")));
    assert_eq!(r["boxes"], json!([container[0]]));
    assert_eq!(r["after_delete"], json!(["/mnt/data/extra.txt"]));
    assert_eq!(r["retrieved"], json!([404, "not_found"]));
    assert!(
        srv.engine.sessions().list().is_empty(),
        "the deleted container's session is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_palindrome_check_that_madam_breaks_is_fixed() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, outputs| {
        match outputs.len() {
        0 => python("def is_palindrome(s):\n    return s == s[::-1]\n\nprint(is_palindrome('racecar'), is_palindrome('Madam'))"),
        1 => python("def is_palindrome(s):\n    s = s.lower()\n    return s == s[::-1]\n\nprint(is_palindrome('racecar'), is_palindrome('Madam'))"),
        _ => Step::Say(format!(
            "Before the fix: {}; after the fix: {}.",
            section(&outputs[0], "stdout"),
            section(&outputs[1], "stdout")
        )),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("palindrome", &srv, "unused").await;
    assert_eq!(r["runs"], json!(["True False\n", "True True\n"]), "{r}");
    assert_eq!(
        r["answer"],
        "Before the fix: True False; after the fix: True True."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_linear_system_streams_as_responses_events() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.starts_with("Solve") => python(
            "import numpy as np\nx, y = np.linalg.solve([[2, 1], [1, -1]], [5, 1])\nprint(f'x = {x:g}, y = {y:g}')",
        ),
        [out, ..] => Step::Say(format!("The solution: {}", section(out, "stdout"))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("linear", &srv, "unused").await;

    assert_eq!(r["logs"], "x = 2, y = 1\n", "{r}");
    assert_eq!(r["answer"], "The solution: x = 2, y = 1");
    assert_eq!(r["status"], "completed");
    assert_eq!(
        r["raw_events"],
        json!([
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.code_interpreter_call.in_progress",
            "response.code_interpreter_call_code.delta",
            "response.code_interpreter_call_code.done",
            "response.code_interpreter_call.interpreting",
            "response.code_interpreter_call.completed",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]),
        "{r}"
    );
    let events: Vec<&str> = r["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(events.contains(&"response.completed"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_call_stops_the_response_and_its_output_continues_it() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, outputs| match outputs {
        [] => python("print(6 * 7)"),
        [out] => Step::Call(
            "record_result",
            json!({"value": section(out, "stdout").parse::<i64>().unwrap_or(-1)}),
        ),
        [out, recorded, ..] => {
            Step::Say(format!("Recorded {}: {recorded}", section(out, "stdout")))
        }
    });
    let srv = server(&stand_in).await;
    let r = sdk("function_tool", &srv, "unused").await;
    assert_eq!(r["call"], json!(["record_result", {"value": 42}]), "{r}");
    assert_eq!(r["answer"], "Recorded 42: recorded as #7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openais_envelope_and_status() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, _| Step::Say("unreachable".into()));
    let srv = server(&stand_in).await;
    let r = sdk("errors", &srv, "unused").await;
    for (name, class, status, param) in [
        (
            "unknown_tool",
            "BadRequestError",
            400,
            json!("tools[0].type"),
        ),
        ("bad_container", "NotFoundError", 404, Value::Null),
        (
            "bad_previous",
            "NotFoundError",
            404,
            json!("previous_response_id"),
        ),
        ("no_container", "NotFoundError", 404, Value::Null),
        ("no_file", "NotFoundError", 404, Value::Null),
        ("bad_memory", "BadRequestError", 400, json!("memory_limit")),
        ("unknown_route", "NotFoundError", 404, Value::Null),
        ("too_large", "APIStatusError", 413, Value::Null),
    ] {
        let e = &r[name];
        assert_eq!(e["class"], class, "{name}: {e}");
        assert_eq!(e["status"], status, "{name}: {e}");
        assert_eq!(e["param"], param, "{name}: {e}");
        assert_eq!(e["type"], "invalid_request_error", "{name}: {e}");
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}: {e}"
        );
    }
    assert!(stand_in.requests().is_empty());
    assert!(
        srv.engine.sessions().list().is_empty(),
        "no session is left behind"
    );
}
