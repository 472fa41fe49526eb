//! `/gemini` as Google's official Gen AI SDK speaks it (tests/vendor-clients/gemini_client.py,
//! replies read through the SDK's typed models), against the app on port 0 whose model is a
//! scripted stand-in: the seeds' examples run real code in a runcell session, and the answers
//! quote what that code computed.

mod common;

#[path = "common/vendor.rs"]
mod vendor;

use runcell_agent::ProviderKind;
use serde_json::{json, Value};
use vendor::{scripted, shown, Step};

async fn server(stand_in: &runcell_agent::testing::StandIn) -> common::Server {
    server_of(stand_in, ProviderKind::OpenAi).await
}

/// The app whose vendor model is `stand_in`, speaking `kind`'s API.
async fn server_of(
    stand_in: &runcell_agent::testing::StandIn,
    kind: ProviderKind,
) -> common::Server {
    let provider = stand_in.config(kind);
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
        format!("{}/gemini", srv.base),
        key.to_owned(),
    );
    let arg = arg.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut args = vec![scenario.as_str(), base.as_str(), key.as_str()];
        if let Some(a) = &arg {
            args.push(a);
        }
        vendor::run_sdk("gemini_client.py", &args)
    })
    .await
    .expect("the SDK client")
}

fn python(code: &str) -> Step {
    Step::Call("python", json!({"code": code}))
}

/// The sessions `key` lists at `/v1/sessions`.
async fn sessions_of(srv: &common::Server, key: &str) -> Vec<Value> {
    let v: Value = srv
        .http
        .get(format!("{}/v1/sessions", srv.base))
        .bearer_auth(key)
        .send()
        .await
        .expect("list sessions")
        .json()
        .await
        .expect("json");
    v["sessions"]
        .as_array()
        .or_else(|| v.as_array())
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interaction_chain_computes_fibonacci_and_keeps_its_session() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match (task, outputs) {
            ("Calculate the first 20 Fibonacci numbers", []) => python(
                "fib = [0, 1]\nwhile len(fib) < 20:\n    fib.append(fib[-1] + fib[-2])\nprint(fib)",
            ),
            ("Now sum them", []) => python("sum(fib)"),
            ("Now sum them", [out, ..]) => Step::Say(format!("The sum is {}.", shown(out))),
            (_, [out, ..]) => Step::Say(format!("The numbers: {}", shown(out))),
            (t, []) => Step::Say(format!("unexpected task {t:?}")),
        }
    });
    let srv = server(&stand_in).await;
    let (_, key) = srv.store.create_key("app", "acme").expect("key");
    let r = sdk("fibonacci", &srv, &key, None).await;

    let fib =
        "[0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181]";
    assert_eq!(
        r["steps"],
        json!([
            "user_input",
            "code_execution_call",
            "code_execution_result",
            "model_output"
        ]),
        "{r}"
    );
    assert_eq!(r["language"], "python");
    assert_eq!(r["result"], format!("{fib}\n"));
    assert_eq!(r["is_error"], false);
    assert_eq!(r["answer"], format!("The numbers: {fib}"));
    assert_eq!(r["usage"], json!([201, 20, 221]));
    assert_eq!(
        r["follow_answer"], "The sum is 10945.",
        "the follow-up ran in the same session: `fib` was still defined"
    );
    assert_eq!(r["follow_previous"], r["retrieved"][0]);
    assert_eq!(r["retrieved"][1], r["answer"]);
    // The follow-up carried the first exchange to the model.
    let requests = stand_in.requests();
    assert_eq!(requests[0].body["model"], "gemini-3-flash-preview");
    let history = requests[2].body["messages"].to_string();
    assert!(history.contains("4181"), "{history}");

    // One session of the key's tenant, listed and audited.
    let listed = sessions_of(&srv, &key).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let session = listed[0]["id"].as_str().expect("id").to_owned();
    let (rows, _) = srv
        .store
        .list_executions("acme", None, 10, None)
        .expect("executions");
    let cells: Vec<&str> = rows
        .iter()
        .filter(|e| e.session_id.as_deref() == Some(session.as_str()))
        .map(|e| e.code.as_str())
        .collect();
    assert_eq!(cells.len(), 2, "{cells:?}");
    assert!(cells.contains(&"sum(fib)"), "{cells:?}");

    let r = sdk("wrong_key", &srv, "not-a-key", None).await;
    assert_eq!(r["generate"]["code"], 401, "{r}");
    assert_eq!(r["generate"]["status"], "UNAUTHENTICATED");
    assert_eq!(r["interaction"]["code"], 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_content_computes_sales_statistics_and_a_chat_keeps_the_session() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("monthly sales") => python(
            "import statistics as st\nsales = {'Jan': 120, 'Feb': 135, 'Mar': 128, 'Apr': 160, 'May': 172, 'Jun': 155}\nv = list(sales.values())\nprint(f'mean={st.mean(v):.2f} median={st.median(v):.1f} stdev={st.stdev(v):.2f}')",
        ),
        [] if task.contains("above the mean") => {
            python("print([m for m, x in sales.items() if x > st.mean(sales.values())])")
        }
        [out, ..] => Step::Say(format!("Computed: {}", shown(out))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("sales", &srv, "unused", None).await;

    assert_eq!(
        r["kinds"],
        json!(["executable_code", "code_execution_result", "text"]),
        "{r}"
    );
    assert_eq!(r["outcome"], "OUTCOME_OK");
    assert_eq!(r["output"], "mean=145.00 median=145.0 stdev=20.34\n");
    assert_eq!(
        r["answer"],
        "Computed: mean=145.00 median=145.0 stdev=20.34"
    );
    assert_eq!(r["finish"], "STOP");
    assert!(r["code"].as_str().is_some_and(|c| c.contains("st.stdev")));
    assert_eq!(r["usage"], json!([201, 221]));
    assert_eq!(
        r["follow_output"], "['Apr', 'May', 'Jun']\n",
        "the chat's second turn ran where `sales` was defined"
    );
    assert_eq!(r["follow_answer"], "Computed: ['Apr', 'May', 'Jun']");
    // A conversation without a model turn yet starts a session (the generate_content call,
    // the chat's first turn); the chat's second turn found its session by its history.
    assert_eq!(srv.engine.sessions().list().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_csv_is_a_file_the_code_reads() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("input_file_0.csv (text/csv)") => python(
            "import pandas as pd\ndf = pd.read_csv('input_file_0.csv')\ns = df['sales']\nprint(f\"mean={s.mean():.2f} median={s.median():.1f} std={s.std():.2f} best={df.loc[s.idxmax(), 'month']}\")",
        ),
        [out, ..] => Step::Say(format!("Monthly sales: {}", shown(out))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("sales_file", &srv, "unused", None).await;
    assert_eq!(
        r["output"], "mean=145.00 median=145.0 std=20.34 best=May\n",
        "{r}"
    );
    assert_eq!(
        r["answer"],
        "Monthly sales: mean=145.00 median=145.0 std=20.34 best=May"
    );
}

/// The upstream model is Gemini itself here (`serve --agent-provider gemini`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bar_chart_comes_back_as_an_inline_png_under_v1beta() {
    let stand_in = scripted(ProviderKind::Gemini, |task, outputs| {
        match outputs {
        [] if task.contains("bar chart") => python(
            "import matplotlib.pyplot as plt\nplt.bar(['North', 'South', 'East'], [120, 95, 143])\nplt.title('Sales per region')\nplt.show()",
        ),
        [_, ..] => Step::Say("Here is the chart.".into()),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server_of(&stand_in, ProviderKind::Gemini).await;
    let r = sdk("chart", &srv, "unused", Some("v1beta")).await;

    assert_eq!(
        r["kinds"],
        json!([
            "executable_code",
            "code_execution_result",
            "inline_data",
            "text"
        ]),
        "{r}"
    );
    assert_eq!(r["mime"], "image/png");
    assert_eq!(r["png"], true);
    assert!(r["bytes"].as_u64().unwrap_or(0) > 1000, "{r}");
    assert_eq!(r["answer"], "Here is the chart.");
    // The model saw the figure, after the function's response.
    let requests = stand_in.requests();
    assert_eq!(
        requests[0].path,
        "/v1beta/models/gemini-2.5-flash:generateContent"
    );
    let parts = requests[1].body["contents"][2]["parts"].clone();
    assert_eq!(parts[0]["functionResponse"]["id"], "fc_0", "{parts}");
    assert_eq!(parts[1]["inlineData"]["mimeType"], "image/png", "{parts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_palindrome_check_fails_on_madam_and_the_model_retries() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("palindrome") => python(
            "def is_palindrome(s):\n    return s == s[::-1]\nfor w in ['racecar', 'Madam', 'hello']:\n    print(w, is_palindrome(w))\nassert is_palindrome('Madam'), 'Madam is not seen as a palindrome'",
        ),
        [_] => python(
            "def is_palindrome(s):\n    s = s.lower()\n    return s == s[::-1]\nfor w in ['racecar', 'Madam', 'hello']:\n    print(w, is_palindrome(w))",
        ),
        [_, out, ..] => Step::Say(format!("Ignoring case: {}", shown(out).replace('\n', ", "))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("palindrome", &srv, "unused", None).await;

    assert_eq!(
        r["outcomes"],
        json!(["OUTCOME_FAILED", "OUTCOME_OK"]),
        "{r}"
    );
    let first = r["outputs"][0].as_str().unwrap_or("");
    assert!(
        first.starts_with("racecar True\nMadam False\nhello False\n"),
        "{first}"
    );
    assert!(first.contains("AssertionError"), "{first}");
    assert_eq!(r["outputs"][1], "racecar True\nMadam True\nhello False\n");
    assert_eq!(
        r["answer"],
        "Ignoring case: racecar True, Madam True, hello False"
    );
    assert_eq!(r["finish"], "STOP");
    // One event per part, and the last with the finish reason.
    assert_eq!(r["chunks"], 6, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_interaction_solves_the_linear_system_and_is_kept() {
    let stand_in = scripted(ProviderKind::OpenAi, |task, outputs| {
        match outputs {
        [] if task.contains("linear system") => python(
            "import numpy as np\nA = np.array([[1, 1, 1], [0, 2, 5], [2, 5, -1]])\nb = np.array([6, -4, 27])\nsol = np.linalg.solve(A, b)\nprint(sol)",
        ),
        [] if task == "Check it" => python("print(np.allclose(A @ sol, b))"),
        [out, ..] => Step::Say(format!("x, y, z = {}", shown(out))),
        [] => Step::Say(format!("unexpected task {task:?}")),
    }
    });
    let srv = server(&stand_in).await;
    let r = sdk("linear", &srv, "unused", None).await;

    let step = ["step.start", "step.stop"];
    let mut expected = vec!["interaction.created"];
    expected.extend(step);
    expected.extend(step);
    expected.extend(step);
    expected.extend([
        "step.start",
        "step.delta",
        "step.stop",
        "interaction.completed",
    ]);
    assert_eq!(r["events"], json!(expected), "{r}");
    assert_eq!(
        r["starts"],
        json!([
            "user_input",
            "code_execution_call",
            "code_execution_result",
            "model_output"
        ])
    );
    assert_eq!(r["text"], "x, y, z = [ 5.  3. -2.]");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["result"], "[ 5.  3. -2.]\n");
    assert_eq!(
        r["follow_answer"], "x, y, z = True",
        "the streamed interaction was kept, and its session: `A`, `sol` and `b` were defined"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_five_retries_the_model_answers_without_code() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, outputs| {
        if outputs.len() < 6 {
            python(&format!("print('attempt {}')\n1 / 0", outputs.len() + 1))
        } else {
            Step::Say(format!("Every one of {} attempts failed.", outputs.len()))
        }
    });
    let srv = server(&stand_in).await;
    let r = sdk("outcomes", &srv, "unused", Some("Divide by zero")).await;

    assert_eq!(r["outcomes"], json!(vec!["OUTCOME_FAILED"; 6]), "{r}");
    let last = r["outputs"][5].as_str().unwrap_or("");
    assert!(
        last.starts_with("attempt 6\n") && last.contains("ZeroDivisionError"),
        "{last}"
    );
    assert_eq!(r["answer"], "Every one of 6 attempts failed.");
    let requests = stand_in.requests();
    assert_eq!(requests.len(), 7);
    assert!(
        requests[5].body.get("tools").is_some(),
        "the fifth retry could run"
    );
    assert!(
        requests[6].body.get("tools").is_none(),
        "after it no code can run: {}",
        requests[6].body
    );
    let told = requests[6].body["messages"].to_string();
    assert!(told.contains("no more code can run"), "{told}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_has_thirty_seconds() {
    let stand_in = scripted(ProviderKind::OpenAi, |_, outputs| match outputs {
        [] => python("import time\nprint('started', flush=True)\ntime.sleep(50)"),
        [out, ..] => Step::Say(format!("It did not finish: {}", shown(out))),
    });
    let srv = server(&stand_in).await;
    let started = std::time::Instant::now();
    let r = sdk("outcomes", &srv, "unused", Some("Sleep a while")).await;
    let took = started.elapsed();

    assert_eq!(r["outcomes"], json!(["OUTCOME_DEADLINE_EXCEEDED"]), "{r}");
    assert!(
        r["outputs"][0]
            .as_str()
            .unwrap_or("")
            .starts_with("started\n"),
        "{r}"
    );
    assert_eq!(r["answer"], "It did not finish: started");
    assert!(
        took >= std::time::Duration::from_secs(30) && took < std::time::Duration::from_secs(50),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_geminis_envelope_and_other_tenants_see_nothing() {
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

    assert_eq!(r["tool"]["code"], 400, "{r}");
    assert_eq!(r["tool"]["status"], "INVALID_ARGUMENT");
    assert_eq!(r["interaction_tool"]["code"], 400);
    assert_eq!(r["previous"]["code"], 404);
    assert_eq!(
        r["other_tenant"]["code"], 404,
        "bob cannot read alice's interaction"
    );
    assert_eq!(sessions_of(&srv, &bob).await.len(), 0);
    assert_eq!(sessions_of(&srv, &alice).await.len(), 1);

    // The raw envelope, and `?key=` as the key.
    let resp = srv
        .http
        .post(format!(
            "{}/gemini/v1beta/models/m:generateContent?key={alice}",
            srv.base
        ))
        .json(&json!({"contents": []}))
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(
        body,
        json!({"error": {"code": 400, "message": "contents is not specified", "status": "INVALID_ARGUMENT"}})
    );
    let resp = srv
        .http
        .post(format!("{}/gemini/v1beta/models/m:countTokens", srv.base))
        .header("x-goog-api-key", &alice)
        .json(&json!({}))
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["status"], "NOT_FOUND");
    // Refusals decided in front of the routes speak Gemini's envelope here too.
    let resp = srv
        .http
        .get(format!("{}/gemini/v1beta/interactions/{id}", srv.base))
        .header("host", "rebound.example")
        .header("x-goog-api-key", &alice)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 403);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["status"], "PERMISSION_DENIED", "{body}");
}
