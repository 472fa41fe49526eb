//! The web page in a real browser: Debian's headless Chromium driven by playwright-core (from
//! npm, pinned in tests/browser/package-lock.json, installed under target/ on first use) runs
//! tests/browser/web.mjs against a server on 127.0.0.1:0, as an analyst would use the page.
//! Screenshots are kept in target/browser-artifacts/.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use runcell_agent::testing::StandIn;
use runcell_agent::ProviderKind;
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";

fn target_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is target/tmp.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_owned()
}

/// The browser, or a failure that says how to get it.
fn chromium() -> PathBuf {
    let exe =
        std::env::var_os("RUNCELL_TEST_CHROMIUM").map_or(PathBuf::from(CHROMIUM), PathBuf::from);
    assert!(
        exe.exists(),
        "the browser tests need Chromium at {}: install it with `apt-get install -y chromium` \
         (or point RUNCELL_TEST_CHROMIUM at a Chromium binary)",
        exe.display()
    );
    exe
}

/// A directory whose node_modules holds the pinned playwright-core: `npm ci` on first use.
fn playwright() -> PathBuf {
    let node = Command::new("node")
        .arg("--version")
        .output()
        .expect("run node (the browser tests need Node.js 20+ and npm)");
    let version = String::from_utf8_lossy(&node.stdout).trim().to_owned();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 20,
        "the browser tests need Node.js 20 or newer (playwright-core's minimum), found {version:?}"
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let dir = target_dir().join("browser-node");
    std::fs::create_dir_all(&dir).expect("create the node dir");
    let lock = std::fs::read(src.join("package-lock.json")).expect("package-lock.json");
    let installed = dir.join("node_modules/.package-lock.json");
    let current = std::fs::read(dir.join("package-lock.json")).ok();
    if current.as_deref() == Some(&lock[..]) && installed.exists() {
        return dir;
    }
    std::fs::copy(src.join("package.json"), dir.join("package.json")).expect("copy package.json");
    std::fs::write(dir.join("package-lock.json"), &lock).expect("copy package-lock.json");
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
        .current_dir(&dir)
        .status()
        .expect("run npm (the browser tests need Node.js and npm: apt-get install -y nodejs npm)");
    assert!(status.success(), "npm ci failed in {}", dir.display());
    dir
}

/// Runs web.mjs's `phase` against `base`; its output is shown, its exit status asserted.
fn run_phase(phase: &str, base: &str, extra: &[(&str, &str)]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/web.mjs");
    let artifacts = target_dir().join("browser-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifacts dir");
    let mut cmd = Command::new("node");
    cmd.arg(&script)
        .env("RUNCELL_URL", base)
        .env("PHASE", phase)
        .env("ARTIFACTS", &artifacts)
        .env("CHROMIUM", chromium())
        .env("PLAYWRIGHT_DIR", playwright());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- web.mjs {phase} stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(
        out.status.success(),
        "the browser test's {phase} phase failed ({}); screenshots in {}\n{stdout}\n{stderr}",
        out.status,
        artifacts.display()
    );
}

/// A Chat Completions reply calling the python tool with `code`.
fn python_call(id: &str, code: &str) -> String {
    let args = json!({ "code": code }).to_string();
    json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": "Let me look at the data.", "tool_calls": [{
            "id": id, "type": "function", "function": {"name": "python", "arguments": args}}]}}]})
    .to_string()
}

fn text_reply(text: &str) -> String {
    json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": text}}]})
    .to_string()
}

const CHAT_CODE: &str = "import pandas as pd\nimport matplotlib.pyplot as plt\n\
df = pd.read_csv('sales.csv')\nbest = df.loc[df.amount.idxmax(), 'month']\n\
print(f'BEST={best}')\ndf.plot.bar(x='month', y='amount')\nplt.savefig('by_month.png')\nplt.show()";

/// The number the stand-in can only know from the tool result: proof the code ran.
fn best_in(req: &Value) -> Option<String> {
    let text = req.to_string();
    // The last one: the tool result, after the code that prints it.
    let at = text.rfind("BEST=")? + "BEST=".len();
    Some(
        text[at..]
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_works_in_headless_chromium() {
    // Fail early and clearly when a tool is missing, before any server starts.
    chromium();
    tokio::task::spawn_blocking(playwright).await.expect("npm");

    let stand_in = StandIn::start(|n, req| match n {
        0 => (200, vec![], python_call("call_1", CHAT_CODE)),
        _ => {
            let best = best_in(&req.body).unwrap_or_else(|| "UNKNOWN".into());
            (
                200,
                vec![],
                text_reply(&format!(
                    "The best month is {best}. The chart is in by_month.png."
                )),
            )
        }
    });
    let srv = common::start_with_chat(Some(runcell_server::ChatConfig {
        provider: stand_in.config(ProviderKind::OpenAi),
        max_steps: 4,
    }))
    .await;
    let base = srv.base.clone();
    tokio::task::spawn_blocking(move || run_phase("analyst", &base, &[]))
        .await
        .expect("analyst phase");
    // Long output, elapsed time, a phone: in a session of its own.
    let base = srv.base.clone();
    tokio::task::spawn_blocking(move || run_phase("long", &base, &[]))
        .await
        .expect("long phase");
    // SVG, Markdown, JSON, LaTeX, Vega-Lite, PDF and a chart's data, rendered safely.
    let base = srv.base.clone();
    tokio::task::spawn_blocking(move || run_phase("rich", &base, &[]))
        .await
        .expect("rich phase");

    // What the browser did really reached the engine and the audit log.
    let (rows, _) = srv
        .store
        .list_executions(runcell_server::OPEN_TENANT, None, 100, None)
        .expect("executions");
    let codes: Vec<&str> = rows.iter().map(|r| r.code.as_str()).collect();
    assert!(
        codes.iter().any(|c| c.contains("plt.title('squares')")),
        "{codes:?}"
    );
    assert!(
        codes.iter().any(|c| c.contains("read_csv('sales.csv')")),
        "{codes:?}"
    );
    assert!(
        codes.iter().any(|c| c.contains("BEST=")),
        "the chat's cell is audited: {codes:?}"
    );
    let requests = stand_in.requests();
    assert_eq!(requests.len(), 2, "one tool call, one answer");
    assert_eq!(best_in(&requests[1].body).as_deref(), Some("Mar"));
    drop(srv);

    // A server that requires keys, and has no chat configured.
    let srv = common::start().await;
    let (_, key) = srv.store.create_key("browser", "acme").expect("key");
    let base = srv.base.clone();
    tokio::task::spawn_blocking(move || run_phase("keys", &base, &[("RUNCELL_KEY", &key)]))
        .await
        .expect("keys phase");
    let (rows, _) = srv
        .store
        .list_executions("acme", None, 10, None)
        .expect("executions");
    assert_eq!(rows.len(), 1, "the keyed cell ran as the key's tenant");
}
