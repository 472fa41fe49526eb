//! `/anthropic` as Anthropic's official Python SDK speaks it (tests/vendor-clients/
//! anthropic_client.py, strict response validation), against the app on port 0 whose model
//! is a scripted stand-in: each seed's example runs real code in a runcell session, and the
//! answers quote what that code computed.

mod common;

#[path = "common/vendor.rs"]
mod vendor;

use runcell_agent::ProviderKind;
use serde_json::{json, Value};
use vendor::{scripted, section, Step};

/// A server whose vendor prefixes talk to `stand_in`.
async fn server(
    stand_in: &runcell_agent::testing::StandIn,
    kind: ProviderKind,
    pin: bool,
) -> common::Server {
    let provider = stand_in.config(kind);
    common::start_with(move |s| {
        s.with_vendor(runcell_server::VendorConfig {
            provider,
            pin_model: pin,
            max_steps: 8,
        })
    })
    .await
}

async fn sdk(scenario: &str, srv: &common::Server, key: &str) -> Value {
    let (scenario, base, key) = (
        scenario.to_owned(),
        format!("{}/anthropic", srv.base),
        key.to_owned(),
    );
    tokio::task::spawn_blocking(move || {
        vendor::run_sdk("anthropic_client.py", &[&scenario, &base, &key])
    })
    .await
    .expect("the SDK client")
}

const FIB_SCRIPT: &str = "python3 - <<'EOF'\na, b = 0, 1\nout = []\nfor _ in range(10):\n    out.append(a)\n    a, b = b, a + b\nprint(*out)\nEOF";

fn fib_model(task: &str, outputs: &[String]) -> Step {
    match (task, outputs) {
        ("Calculate the first 10 Fibonacci numbers", []) => {
            Step::Call("bash_code_execution", json!({"command": FIB_SCRIPT}))
        }
        ("Now the 30th one", []) => Step::Call(
            "bash_code_execution",
            json!({"command": "python3 -c 'a, b = 0, 1\nfor _ in range(30): a, b = b, a + b\nprint(a)'"}),
        ),
        (_, [out, ..]) => Step::Say(format!("The result: {}.", section(out, "stdout"))),
        (t, []) => Step::Say(format!("unexpected task {t:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fibonacci_runs_in_a_container_of_the_keys_tenant_and_the_conversation_goes_on() {
    let stand_in = scripted(ProviderKind::OpenAi, fib_model);
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let (_, key) = srv.store.create_key("app", "acme").expect("key");
    let r = sdk("fibonacci", &srv, &key).await;

    assert_eq!(
        r["stdout"].as_str().map(str::trim),
        Some("0 1 1 2 3 5 8 13 21 34"),
        "{r}"
    );
    assert_eq!(r["return_code"], 0);
    assert_eq!(r["tool"], "bash_code_execution");
    assert_eq!(r["answer"], "The result: 0 1 1 2 3 5 8 13 21 34.");
    assert_eq!(r["follow_stdout"].as_str().map(str::trim), Some("832040"));
    assert_eq!(r["follow_answer"], "The result: 832040.");
    assert_eq!(r["model"], "claude-sonnet-5-5");
    assert_eq!(
        r["usage"],
        json!([201, 20]),
        "the first request's two model calls, summed: {r}"
    );

    // The model got the request's model name, runcell's sub-tools, and, the second time,
    // the first exchange as the SDK sent it back.
    let requests = stand_in.requests();
    assert_eq!(requests.len(), 4, "two model calls per request");
    assert_eq!(requests[0].body["model"], "claude-sonnet-5-5");
    let tools: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(
        tools,
        ["bash_code_execution", "text_editor_code_execution"],
        "2025-08-25 has no stateful Python"
    );
    let history = requests[2].body["messages"].to_string();
    assert!(history.contains("0 1 1 2 3 5 8 13 21 34"), "{history}");
    assert!(history.contains("srvtoolu_call_0"), "{history}");

    // The container is a session of the key's tenant, listed and audited like any other.
    let container = r["container"].as_str().expect("container");
    let session = container.replace("container_", "ses_");
    let sessions: Value = srv
        .http
        .get(format!("{}/v1/sessions", srv.base))
        .bearer_auth(&key)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let listed = sessions["sessions"].as_array().expect("sessions");
    assert_eq!(listed.len(), 1, "{sessions}");
    assert_eq!(listed[0]["id"], session.as_str());
    assert_eq!(listed[0]["metadata"]["source"], "anthropic");
    let (rows, _) = srv
        .store
        .list_executions("acme", None, 10, None)
        .expect("executions");
    assert!(
        rows.iter().any(|e| e.code == FIB_SCRIPT),
        "the cell is in the audit log"
    );

    // Another tenant cannot reach that container: it does not exist for them.
    let (_, other) = srv.store.create_key("other", "globex").expect("key");
    let resp = srv
        .http
        .post(format!("{}/anthropic/v1/messages", srv.base))
        .header("x-api-key", &other)
        .json(
            &json!({"model": "m", "max_tokens": 10, "container": container,
            "tools": [{"type": "code_execution_20250825", "name": "code_execution"}],
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "not_found_error");

    // A wrong key is refused in Anthropic's words.
    let r = sdk("wrong_key", &srv, "not-a-key").await;
    assert_eq!(r["messages"][0], 401, "{r}");
    assert_eq!(r["messages"][1], "authentication_error");
    assert_eq!(r["files"], json!([401, "authentication_error"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monthly_sales_statistics_are_computed_on_an_uploaded_file() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| match outputs {
        [] if task.contains("monthly sales") => {
            // The model finds the file where the note says it is.
            let path = task
                .split("in the container at ")
                .nth(1)
                .and_then(|r| r.split(']').next())
                .unwrap_or("MISSING");
            Step::Call(
                "code_execution",
                json!({"code": format!("import pandas as pd\ndf = pd.read_csv('{path}')\ns = df['sales']\nprint(f\"mean={{s.mean():.2f}} median={{s.median():.1f}} std={{s.std():.2f}} best={{df.loc[s.idxmax(), 'month']}}\")")}),
            )
        }
        [out, ..] => Step::Say(format!("Monthly sales: {}", section(out, "stdout"))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    });
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("sales", &srv, "unused").await;

    let sales = [1200.0, 1350.0, 980.0, 1610.0, 1475.0, 1720.0_f64];
    let mean = sales.iter().sum::<f64>() / 6.0;
    let std = (sales.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 5.0).sqrt();
    let expected = format!("mean={mean:.2} median=1412.5 std={std:.2} best=Jun");
    assert_eq!(
        r["stdout"].as_str().map(str::trim),
        Some(expected.as_str()),
        "{r}"
    );
    assert_eq!(r["answer"], format!("Monthly sales: {expected}"));
    assert_eq!(r["return_code"], 0);
    let task = stand_in.requests()[0].body["messages"][1]["content"].clone();
    assert!(
        task.as_str()
            .is_some_and(|t| t.contains("/workspace/sales.csv")),
        "{task}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bar_chart_written_to_output_dir_comes_back_as_a_downloadable_file() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| match outputs {
        [] if task.contains("bar chart") => Step::Call(
            "bash_code_execution",
            json!({"command": "python3 - <<'EOF'\nimport os\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.bar(['North', 'South', 'East'], [120, 95, 143])\nplt.savefig(os.path.join(os.environ['OUTPUT_DIR'], 'chart.png'))\nprint('saved chart.png')\nEOF"}),
        ),
        [out, ..] => Step::Say(format!("Done. {}", section(out, "files saved"))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    });
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("chart", &srv, "unused").await;

    let files = r["files"].as_array().expect("files");
    assert_eq!(files.len(), 1, "{r}");
    let f = &files[0];
    assert_eq!(f["filename"], "chart.png");
    assert_eq!(f["mime_type"], "image/png");
    assert_eq!(f["png"], true);
    assert_eq!(f["downloaded"], f["size_bytes"]);
    assert!(f["size_bytes"].as_u64().is_some_and(|n| n > 1000), "{f}");
    let id = f["id"].as_str().expect("id");
    assert!(
        r["answer"]
            .as_str()
            .is_some_and(|a| a.contains(id) && a.contains("chart.png")),
        "the model was told the file id: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_palindrome_check_that_madam_breaks_is_fixed_with_the_editor() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, outputs| {
        let editor = "text_editor_code_execution";
        match outputs.len() {
            0 => Step::Call(
                editor,
                json!({"command": "create", "path": "/workspace/palindrome.py",
                "file_text": "def is_palindrome(s):\n    return s == s[::-1]\n\nprint(is_palindrome('racecar'), is_palindrome('Madam'))\n"}),
            ),
            1 | 3 => Step::Call(
                "bash_code_execution",
                json!({"command": "python3 palindrome.py"}),
            ),
            2 => Step::Call(
                editor,
                json!({"command": "str_replace", "path": "/workspace/palindrome.py",
                "old_str": "    return s == s[::-1]", "new_str": "    s = s.lower()\n    return s == s[::-1]"}),
            ),
            4 => Step::Call(editor, json!({"command": "view", "path": "palindrome.py"})),
            5 => Step::Call(
                editor,
                json!({"command": "view", "path": "/workspace/missing.py"}),
            ),
            _ => Step::Say(format!(
                "Before the fix: {}; after the fix: {}.",
                section(&outputs[1], "stdout"),
                section(&outputs[3], "stdout")
            )),
        }
    });
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("palindrome", &srv, "unused").await;

    assert_eq!(r["runs"], json!(["True False\n", "True True\n"]), "{r}");
    assert_eq!(
        r["answer"],
        "Before the fix: True False; after the fix: True True."
    );
    assert_eq!(r["is_file_update"], false);
    assert_eq!(r["replace_start"], 2);
    assert_eq!(
        r["replace_lines"],
        json!([
            "-    return s == s[::-1]",
            "+    s = s.lower()",
            "+    return s == s[::-1]"
        ])
    );
    assert!(
        r["view"]
            .as_str()
            .is_some_and(|v| v.contains("s = s.lower()")),
        "{r}"
    );
    assert_eq!(r["view_total_lines"], 5);
    assert_eq!(r["error_code"], "file_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_linear_system_streams_as_anthropic_events_from_an_anthropic_model() {
    let stand_in = scripted(ProviderKind::Anthropic, |task, outputs| match outputs {
        [] if task.starts_with("Solve") => Step::Call(
            "code_execution",
            json!({"code": "import numpy as np\nx, y = np.linalg.solve([[2, 1], [1, -1]], [5, 1])\nprint(f'x = {x:g}, y = {y:g}')"}),
        ),
        [out, ..] => Step::Say(format!("The solution: {}", section(out, "stdout"))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    });
    let srv = server(&stand_in, ProviderKind::Anthropic, true).await;
    let r = sdk("linear", &srv, "unused").await;

    assert_eq!(r["stdout"], "x = 2, y = 1\n", "{r}");
    assert_eq!(r["answer"], "The solution: x = 2, y = 1");
    assert_eq!(r["stop_reason"], "end_turn");
    assert!(r["container"]
        .as_str()
        .is_some_and(|c| c.starts_with("container_")));
    assert_eq!(
        r["raw_events"],
        json!([
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]),
        "server_tool_use (input as JSON), its result, the answer: {r}"
    );
    let events: Vec<&str> = r["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        events.contains(&"text") && events.contains(&"input_json"),
        "the SDK's helper events: {events:?}"
    );
    // The operator pinned the model: the request's name did not reach the provider.
    let requests = stand_in.requests();
    assert_eq!(requests[0].body["model"], "test-model");
    assert_eq!(requests[0].path, "/v1/messages");
    let tools: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        tools,
        [
            "bash_code_execution",
            "text_editor_code_execution",
            "code_execution"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_passed_back_keeps_python_state_and_a_new_one_starts_clean() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match (task, outputs) {
            ("Set x to 42", []) => Step::Call(
                "code_execution",
                json!({"code": "x = 42\nprint('x is set')"}),
            ),
            ("Use x", []) => Step::Call("code_execution", json!({"code": "print(x + 1)"})),
            (_, [out, ..]) => Step::Say(out.clone()),
            (t, []) => Step::Say(format!("unexpected task {t:?}")),
        }
    });
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("state", &srv, "unused").await;

    let c = r["containers"].as_array().expect("containers");
    assert_eq!(c[0], c[1], "{r}");
    assert_eq!(c[0], c[2]);
    assert_ne!(c[0], c[3]);
    assert_eq!(r["again"], json!(["43\n", 0]));
    assert_eq!(r["object_form"], "43\n");
    assert_eq!(r["fresh"][1], 1);
    assert!(
        r["fresh"][0]
            .as_str()
            .is_some_and(|e| e.contains("NameError")),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_tool_stops_the_turn_and_its_result_continues_it() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, outputs| match outputs {
        [] => Step::Call("code_execution", json!({"code": "print(6 * 7)"})),
        [out] => Step::Call(
            "record_result",
            json!({"value": section(out, "stdout").parse::<i64>().unwrap_or(-1)}),
        ),
        [out, recorded, ..] => {
            Step::Say(format!("Recorded {}: {recorded}", section(out, "stdout")))
        }
    });
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("tool_use", &srv, "unused").await;

    assert_eq!(r["call"], json!(["record_result", {"value": 42}]), "{r}");
    assert_eq!(r["computed"], "42\n");
    assert_eq!(r["answer"], "Recorded 42: recorded as #7");
    assert_eq!(r["stop_reason"], "end_turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_api_round_trips_with_the_ga_and_beta_resources() {
    // No model needed: the Files API works without one.
    let srv = common::start().await;
    let r = sdk("files", &srv, "unused").await;

    let up = r["uploaded"].as_array().expect("uploaded");
    let listed = r["listed"].as_array().expect("listed");
    assert_eq!(listed.len(), 2, "{r}");
    assert_eq!(&listed[0], &up[1], "newest first");
    assert_eq!(r["beta_listed"], r["listed"]);
    assert_eq!(
        r["paged"], r["listed"],
        "the SDK's auto-paging, one file a page"
    );
    assert_eq!(r["meta"], json!(["notes.txt", "text/plain", 12, true]));
    assert_eq!(r["body"], "hello files\n");
    assert_eq!(r["deleted"], json!([up[0], "file_deleted"]));
    assert_eq!(r["gone"], json!([404, "not_found_error"]));
    assert_eq!(r["after"], json!([]));
    assert_eq!(r["sdk"], "2.10.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_anthropics_envelope_and_status() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, _| Step::Say("unreachable".into()));
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("errors", &srv, "unused").await;

    for (name, class, status, kind) in [
        (
            "unknown_tool",
            "BadRequestError",
            400,
            "invalid_request_error",
        ),
        ("bad_container", "NotFoundError", 404, "not_found_error"),
        (
            "malformed_container",
            "NotFoundError",
            404,
            "not_found_error",
        ),
        (
            "missing_max_tokens",
            "BadRequestError",
            400,
            "invalid_request_error",
        ),
        ("bad_role", "BadRequestError", 400, "invalid_request_error"),
        ("no_such_file", "NotFoundError", 404, "not_found_error"),
        ("no_such_upload", "NotFoundError", 404, "not_found_error"),
        ("unknown_route", "NotFoundError", 404, "not_found_error"),
        (
            "too_large",
            "ContentTooLargeError",
            413,
            "request_too_large",
        ),
    ] {
        let e = &r[name];
        assert_eq!(e["class"], class, "{name}: {e}");
        assert_eq!(e["status"], status, "{name}: {e}");
        assert_eq!(e["type"], kind, "{name}: {e}");
        assert_eq!(e["envelope"], "error", "{name}: {e}");
        assert!(
            e["request_id"]
                .as_str()
                .is_some_and(|i| i.starts_with("req_")),
            "{name}: {e}"
        );
    }
    assert!(r["unknown_tool"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("web_search_20250305")));
    assert!(r["missing_max_tokens"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("max_tokens")));
    assert_eq!(
        r["bad_role"]["message"],
        "messages.0.role: unknown variant `robot`, expected `user` or `assistant`",
        "Anthropic's paths, and no parser positions"
    );
    // Refusals decided in front of the routes speak Anthropic's envelope here too.
    let resp = srv
        .http
        .get(format!("{}/anthropic/v1/files", srv.base))
        .header("host", "rebound.example")
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "permission_error", "{body}");
    // None of them reached the model, and none started a session.
    assert!(stand_in.requests().is_empty());
    assert!(srv.engine.sessions().list().is_empty());
}

// Programmatic tool calling: the client's `lookup` (allowed_callers code_execution_20260120)
// is a function of the model's Python; the SDK client answers its calls across round trips.

const PTC_LOOP: &str = "import json\nfrom runcell_tools import lookup\n\ntotal = 0\nfor i in range(1, 6):\n    total += json.loads(lookup(id=i))[\"balance\"]\nprint(f\"total balance of 5 customers: {total}\")";
const PTC_GATHER: &str = "import asyncio, json\nfrom runcell_tools import lookup\n\nrows = await asyncio.gather(*(lookup(id=i) for i in (1, 2, 3)))\nprint(\", \".join(json.loads(r)[\"name\"].split()[0] for r in rows))";
const PTC_ERROR: &str = "from runcell_tools import lookup, ToolError\n\ntry:\n    lookup(id=4)\nexcept ToolError as e:\n    print(f\"lookup failed: {e}\")";
const PTC_UNDECLARED: &str = "import json\nimport runcell_tools\ntry:\n    from runcell_tools import notify\nexcept ImportError as e:\n    print(\"import refused:\", type(e).__name__)\ntry:\n    runcell_tools._call(\"notify\", {\"text\": \"hi\"})\nexcept runcell_tools.ToolRefused as e:\n    print(\"call refused:\", type(e).__name__)\nprint(\"lookup still works:\", json.loads(runcell_tools.lookup(id=1))[\"name\"])";

const PTC_HURRY: &str = "from runcell_tools import lookup, ToolTimeout\n\ntry:\n    lookup(id=1)\nexcept ToolTimeout as e:\n    print(f\"no answer in time: {type(e).__name__}\")";

/// What only the client holds: the model must never see any of it.
const CLIENT_RECORDS: [&str; 5] = [
    "Ada Lovelace",
    "Grace Hopper",
    "Alan Turing",
    "Edsger Dijkstra",
    "Barbara Liskov",
];

fn ptc_model(task: &str, outputs: &[String]) -> Step {
    let code = match task {
        "Sum the balances of customers 1 to 5" => PTC_LOOP,
        "Name customers 1 to 3 at once" => PTC_GATHER,
        "Look up customer 4" => PTC_ERROR,
        "Notify from code" => PTC_UNDECLARED,
        "Look up customer 1 in a hurry" => PTC_HURRY,
        "What was the total?" => return Step::Say("As computed above.".into()),
        t => return Step::Say(format!("unexpected task {t:?}")),
    };
    match outputs {
        [] => Step::Call("code_execution", json!({"code": code})),
        [out, ..] => Step::Say(format!("Done: {}", section(out, "stdout"))),
    }
}

/// Every model request of the run, as text, holds none of the client's records.
fn assert_model_saw_no_record(stand_in: &runcell_agent::testing::StandIn) {
    for (n, req) in stand_in.requests().iter().enumerate() {
        let body = req.body.to_string();
        for name in CLIENT_RECORDS {
            assert!(
                !body.contains(name),
                "model request {n} holds the tool output {name:?}: {body}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_calls_the_clients_tool_in_a_loop_and_the_model_sees_only_the_sum() {
    let stand_in = scripted(ProviderKind::OpenAi, ptc_model);
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let (_, key) = srv.store.create_key("app", "acme").expect("key");
    let r = sdk("ptc_loop", &srv, &key).await;

    let rounds: Vec<Value> = (1..=5).map(|i| json!([["lookup", {"id": i}]])).collect();
    assert_eq!(r["rounds"], json!(rounds), "one call per reply: {r}");
    assert_eq!(r["stdout"], "total balance of 5 customers: 1500\n", "{r}");
    assert_eq!(r["return_code"], 0);
    assert_eq!(r["answer"], "Done: total balance of 5 customers: 1500");
    assert_eq!(r["stop_reason"], "end_turn");
    assert_eq!(r["code"], PTC_LOOP);
    // The blocks of each reply: the code and its first call, one call each, the result.
    let kinds: Vec<Vec<&str>> = r["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .map(|m| {
            m.as_array()
                .into_iter()
                .flatten()
                .map(|b| {
                    b["type"]
                        .as_str()
                        .or(b["stop_reason"].as_str())
                        .unwrap_or("?")
                })
                .collect()
        })
        .collect();
    let mut expected = vec![vec!["server_tool_use", "tool_use", "tool_use"]];
    expected.extend((0..4).map(|_| vec!["tool_use", "tool_use"]));
    expected.push(vec!["code_execution_tool_result", "text", "end_turn"]);
    assert_eq!(kinds, expected, "{r}");
    if std::env::var_os("RUNCELL_SHOW_REPLIES").is_some() {
        eprintln!(
            "{}",
            serde_json::to_string_pretty(&r["replies"]).unwrap_or_default()
        );
    }

    // Six requests of the client, two model calls: the first and the one after the code;
    // then the follow-up question, with the exchange sent back.
    assert_eq!(
        r["follow"],
        json!(["end_turn", "As computed above."]),
        "{r}"
    );
    let requests = stand_in.requests();
    assert_eq!(
        requests.len(),
        3,
        "the model is not called while the code runs"
    );
    assert_model_saw_no_record(&stand_in);
    assert!(requests[1].body.to_string().contains("1500"));
    // The history as the model reads it: the code call, its output, the answer, the question.
    let msgs = requests[2].body["messages"].as_array().expect("messages");
    let roles: Vec<&str> = msgs.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "assistant", "user"],
        "{msgs:?}"
    );
    assert_eq!(
        msgs[2]["tool_calls"][0]["function"]["name"],
        "code_execution"
    );
    assert_eq!(msgs[3]["tool_call_id"], msgs[2]["tool_calls"][0]["id"]);
    assert!(msgs[3]["content"]
        .as_str()
        .is_some_and(|t| t.contains("total balance of 5 customers: 1500")));
    // `lookup` is the code's, `notify` the model's; the code tool says how to call it.
    let tools = requests[0].body["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "bash_code_execution",
            "text_editor_code_execution",
            "code_execution",
            "notify"
        ]
    );
    let described = tools[2]["function"]["description"].as_str().unwrap_or("");
    assert!(
        described.contains("from runcell_tools import lookup")
            && described.contains("- lookup(id: integer): A customer record by id, as JSON"),
        "{described}"
    );

    // The cell's record has the five calls, as the audit log does.
    let session = r["container"]
        .as_str()
        .expect("container")
        .replace("container_", "ses_");
    let (rows, _) = srv
        .store
        .list_executions("acme", Some(&session), 10, None)
        .expect("executions");
    let cell = rows.iter().find(|e| e.code == PTC_LOOP).expect("the cell");
    let cell: Value = serde_json::from_str(&cell.execution_json).expect("json");
    let calls: Vec<&Value> = cell["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(calls.len(), 5, "{cell}");
    assert!(
        calls
            .iter()
            .all(|c| c["name"] == "lookup" && c["error"].is_null()),
        "{cell}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_loop_streams_its_tool_use_blocks_as_events() {
    let stand_in = scripted(ProviderKind::Anthropic, ptc_model);
    let srv = server(&stand_in, ProviderKind::Anthropic, true).await;
    let r = sdk("ptc_loop", &srv, "unused").await;
    let r_stream = {
        let base = format!("{}/anthropic", srv.base);
        tokio::task::spawn_blocking(move || {
            vendor::run_sdk(
                "anthropic_client.py",
                &["ptc_loop", &base, "unused", "stream"],
            )
        })
        .await
        .expect("the SDK client")
    };
    for r in [&r, &r_stream] {
        assert_eq!(r["stdout"], "total balance of 5 customers: 1500\n", "{r}");
        assert_eq!(r["rounds"].as_array().map(Vec::len), Some(5), "{r}");
        assert_eq!(r["answer"], "Done: total balance of 5 customers: 1500");
    }
    assert_eq!(
        stand_in.requests().len(),
        6,
        "three model calls per conversation (the last one the follow-up)"
    );
    assert_model_saw_no_record(&stand_in);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gathered_calls_come_together_and_an_error_result_is_an_exception() {
    let stand_in = scripted(ProviderKind::OpenAi, ptc_model);
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;

    let r = sdk("ptc_gather", &srv, "unused").await;
    assert_eq!(r["stdout"], "Ada, Grace, Alan\n", "{r}");
    if std::env::var_os("RUNCELL_SHOW_REPLIES").is_some() {
        eprintln!("gather rounds: {}", r["rounds"]);
    }
    let rounds = r["rounds"].as_array().expect("rounds");
    let calls: usize = rounds
        .iter()
        .map(|c| c.as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(calls, 3, "{r}");
    // Made at once, they wait together: one reply holds them (a loaded machine may split
    // them over a few).
    assert!((1..=3).contains(&rounds.len()), "{r}");

    let r = sdk("ptc_error", &srv, "unused").await;
    assert_eq!(r["rounds"], json!([[["lookup", {"id": 4}]]]), "{r}");
    assert_eq!(r["stdout"], "lookup failed: record 4 is locked\n", "{r}");
    assert_eq!(r["answer"], "Done: lookup failed: record 4 is locked");
    assert_model_saw_no_record(&stand_in);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_the_code_may_not_call_is_refused_inside_the_code() {
    let stand_in = scripted(ProviderKind::OpenAi, ptc_model);
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("ptc_undeclared", &srv, "unused").await;
    // `notify` is the model's own (allowed_callers direct): no tool_use for it ever reached
    // the client; `lookup`, in the same cell, did (the positive control).
    assert_eq!(r["rounds"], json!([[["lookup", {"id": 1}]]]), "{r}");
    assert_eq!(
        r["stdout"],
        "import refused: ImportError\ncall refused: ToolRefused\nlookup still works: Ada Lovelace\n",
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_foreign_and_containerless_answers_are_refused_and_change_nothing() {
    let stand_in = scripted(ProviderKind::OpenAi, ptc_model);
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("ptc_refusals", &srv, "unused").await;
    let refused = |name: &str, says: &str| {
        let e = &r[name];
        assert_eq!(e[0], 400, "{name}: {r}");
        assert_eq!(e[1], "invalid_request_error", "{name}: {r}");
        assert!(
            e[2].as_str().is_some_and(|m| m.contains(says)),
            "{name}: {e}"
        );
    };
    refused("forged", "is not a tool call of code in container");
    refused(
        "unexpected",
        "unexpected tool_use_id found in tool_result blocks: toolu_nope",
    );
    refused("other_container", "is not a tool call of code in container");
    refused("no_container", "container:");
    // The real answer still goes to the code, which goes on to the next record.
    assert_eq!(r["after"], json!(["tool_use", [{"id": 2}]]), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_nobody_answers_times_out_as_an_exception_in_the_code() {
    let stand_in = scripted(ProviderKind::OpenAi, ptc_model);
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let (_, key) = srv.store.create_key("app", "acme").expect("key");
    let (base, k) = (format!("{}/anthropic", srv.base), key.clone());
    let r = tokio::task::spawn_blocking(move || {
        vendor::run_sdk("anthropic_client.py", &["ptc_timeout", &base, &k, &k])
    })
    .await
    .expect("the SDK client");
    assert_eq!(r["stdout"], "no answer in time: ToolTimeout\n", "{r}");
    let calls = r["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{r}");
    assert!(
        calls[0]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("timeout")),
        "{r}"
    );
    // The answer that came too late is no answer: the call no longer waits.
    assert_eq!(r["late"][0], 400, "{r}");
    assert!(
        r["late"][2]
            .as_str()
            .is_some_and(|m| m.contains("timed out")),
        "{r}"
    );
    assert_eq!(r["zero"][0], 400, "{r}");
    assert!(
        r["zero"][1]
            .as_str()
            .is_some_and(|m| m.starts_with("tool_timeout_s:")),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_calling_the_code_and_a_direct_tool_is_answered_in_one_message() {
    // The model calls the code (which calls `lookup`) and `notify` in one reply; the client
    // answers both at once; the model then gets notify's result and the code's output only.
    let stand_in = runcell_agent::testing::StandIn::start(|n, req| {
        let message = if n == 0 {
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "code_execution",
                 "arguments": json!({"code": "import json\nfrom runcell_tools import lookup\nprint('balance of 3:', json.loads(lookup(id=3))['balance'])"}).to_string()}},
                {"id": "call_b", "type": "function", "function": {"name": "notify",
                 "arguments": json!({"text": "starting"}).to_string()}}]})
        } else {
            let said: Vec<String> = req.body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["role"] == "tool")
                .map(|m| section(m["content"].as_str().unwrap_or(""), "stdout"))
                .collect();
            let notified = req.body.to_string().contains("notified");
            json!({"role": "assistant", "content": format!("{} (notified: {notified})", said.join(""))})
        };
        let finish = if n == 0 { "tool_calls" } else { "stop" };
        (
            200,
            vec![],
            json!({"id": format!("c{n}"), "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}})
            .to_string(),
        )
    });
    let srv = server(&stand_in, ProviderKind::OpenAi, false).await;
    let r = sdk("ptc_mixed", &srv, "unused").await;
    assert_eq!(
        r["first"],
        json!([
            ["server_tool_use", "code_execution", null],
            ["tool_use", "lookup", "code_execution_20260120"],
            ["tool_use", "notify", null]
        ]),
        "{r}"
    );
    assert_eq!(r["stdout"], "balance of 3: 75\n", "{r}");
    assert_eq!(r["answer"], "balance of 3: 75 (notified: true)", "{r}");
    assert_eq!(r["stop_reason"], "end_turn");
    assert_eq!(stand_in.requests().len(), 2);
    assert_model_saw_no_record(&stand_in);
}
