//! Nodes on one real PostgreSQL, driven through every node: new sessions are placed on the
//! live node with the most room (or where pinned, `x-runcell-node`), a full node is never
//! chosen and an unreachable one is passed over; MCP tool calls for a session of another
//! node run there; and a key's own bounds hold on a request forwarded to another node as
//! they do at that node.

#[path = "../../server/tests/common/clients.rs"]
mod clients;
mod common;

use std::time::Duration;

use common::cluster::Cluster;
use serde_json::{json, Value};

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// `POST /v1/sessions` at `base`, pinned to `pin` if given: the status, the node that
/// answered (`x-runcell-node`) and the body.
fn create(base: &str, key: &str, pin: Option<&str>, body: Value) -> (u16, String, Value) {
    let mut r = http()
        .post(format!("{base}/v1/sessions"))
        .bearer_auth(key)
        .json(&body);
    if let Some(p) = pin {
        r = r.header("x-runcell-node", p);
    }
    let r = r.send().expect("create");
    let status = r.status().as_u16();
    let node = r
        .headers()
        .get("x-runcell-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, node, r.json().expect("json"))
}

/// A session's GET through `base`: the node that answered it.
fn answered_by(base: &str, key: &str, id: &str) -> String {
    let r = http()
        .get(format!("{base}/v1/sessions/{id}"))
        .bearer_auth(key)
        .send()
        .expect("get");
    assert_eq!(r.status(), 200, "GET {id} through {base}");
    r.headers()
        .get("x-runcell-node")
        .and_then(|v| v.to_str().ok())
        .expect("x-runcell-node")
        .to_owned()
}

/// The MCP Python SDK's client at `url` with `key`, making `calls` in one connection: its
/// report (fixtures/mcp_calls.py).
fn mcp_calls(url: &str, key: &str, calls: Value) -> Vec<Value> {
    let out = std::process::Command::new(clients::sdk_python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/mcp_calls.py"
        ))
        .args([url, key, &calls.to_string()])
        .output()
        .expect("run mcp_calls.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mcp_calls.py failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("report");
    report["calls"].as_array().expect("calls").clone()
}

const NODE: [&str; 2] = ["--no-zygote", "--warm-sessions"];

#[test]
fn new_sessions_go_to_the_node_with_the_most_room_or_where_pinned() {
    let cluster = Cluster::new();
    let key = cluster.key("ci", &[]);
    let flags = |memory: &'static str, more: &[&'static str]| -> Vec<&'static str> {
        let mut f = vec![NODE[0], NODE[1], "0", "--max-committed-memory-mb", memory];
        f.extend(more);
        f
    };
    // A has the most memory but room for one session; B more memory than C.
    let a = cluster.node(&flags("16384", &["--max-sessions", "1"]));
    let b = cluster.node(&flags("8192", &[]));
    let c = cluster.node(&flags("4096", &[]));

    // Pinned to A through C: made on A, and served by A through any node.
    let (status, node, s1) = create(&c.serve.base, &key, Some(a.url()), json!({}));
    assert_eq!((status, node.as_str()), (201, a.url()), "{s1}");
    let s1 = s1["id"].as_str().expect("id").to_owned();
    for through in [&a, &b, &c] {
        assert_eq!(answered_by(&through.serve.base, &key, &s1), a.url());
    }

    // A is full now: a create through A goes to B (the most memory of those with room), and
    // so does one through C.
    for through in [&a, &c] {
        let (status, node, s) = create(&through.serve.base, &key, None, json!({}));
        assert_eq!(
            (status, node.as_str()),
            (201, b.url()),
            "through {}: {s}",
            through.url()
        );
        let id = s["id"].as_str().expect("id");
        assert_eq!(answered_by(&c.serve.base, &key, id), b.url());
    }
    // A session asking for more memory goes to the node that can still commit it: B has
    // 8192 - 2 x 1024 = 6144 MiB left, C 4096, so 4000 MiB goes to B.
    let (status, node, s) = create(
        &a.serve.base,
        &key,
        None,
        json!({"limits": {"memory_mb": 4000}}),
    );
    assert_eq!((status, node.as_str()), (201, b.url()), "{s}");
    // B has 2144 MiB left, C 4096: 3000 MiB goes to C.
    let (status, node, s) = create(
        &a.serve.base,
        &key,
        None,
        json!({"limits": {"memory_mb": 3000}}),
    );
    assert_eq!((status, node.as_str()), (201, c.url()), "{s}");

    // Pinned to the full A: A's own refusal, through B.
    let (status, node, e) = create(&b.serve.base, &key, Some(a.url()), json!({}));
    assert_eq!((status, node.as_str()), (503, a.url()), "{e}");
    assert_eq!(e["error"]["code"], "unavailable", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("this server runs at most 1 sessions at once")),
        "{e}"
    );
    // Pinned to no node of the cluster: 409, whichever node is asked.
    let (status, _, e) = create(&b.serve.base, &key, Some("http://127.0.0.1:1"), json!({}));
    assert_eq!(status, 409, "{e}");
    assert_eq!(
        e["error"]["message"],
        "x-runcell-node: http://127.0.0.1:1 is not a live node of this cluster (name a node by its --node-url)"
    );
    // Placement authenticates first: no key, no look-up.
    let r = http()
        .post(format!("{}/v1/sessions", b.serve.base))
        .json(&json!({}))
        .send()
        .expect("create");
    assert_eq!(r.status(), 401);

    // D has the most room of all: chosen; once killed (still live in the store for 10 s),
    // it is passed over for the next at once.
    let mut d = cluster.node(&flags("32768", &[]));
    let (status, node, s) = create(&c.serve.base, &key, None, json!({}));
    assert_eq!((status, node.as_str()), (201, d.url()), "{s}");
    d.serve.kill9();
    let (status, node, s) = create(&c.serve.base, &key, None, json!({}));
    assert_eq!(status, 201, "{s}");
    assert_ne!(node, d.url(), "{s}");
    // The next: B (2144 MiB left) before C (1096).
    assert_eq!(node, b.url(), "{s}");
    // Pinned to the dead D: it cannot be reached, said at once.
    let (status, _, e) = create(&c.serve.base, &key, Some(d.url()), json!({}));
    assert_eq!(status, 503, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!(
                "the node this session is pinned to ({}) cannot be reached",
                d.url()
            ))),
        "{e}"
    );
}

/// `POST {base}{path}` with `body`: the status and the body.
fn post(base: &str, path: &str, key: &str, pin: Option<&str>, body: Value) -> (u16, Value) {
    let mut r = http()
        .post(format!("{base}{path}"))
        .bearer_auth(key)
        .json(&body);
    if let Some(p) = pin {
        r = r.header("x-runcell-node", p);
    }
    let r = r.send().expect("post");
    (r.status().as_u16(), r.json().expect("json"))
}

/// A key narrowed to no network asks, through a node that is not the session's (or the new
/// session's) node, for what its bound refuses: the owner refuses it exactly as it does when
/// asked itself, because the forwarded request names the key and the owner loads its bound.
/// The unnarrowed key of the same tenant, through the same node, is served (the control).
#[test]
fn a_keys_egress_bound_holds_on_requests_forwarded_to_another_node() {
    let cluster = Cluster::new();
    let broad = cluster.key("broad", &[]);
    let narrow = cluster.key("narrow", &["--egress-allow", "none"]);
    let flags = [NODE[0], NODE[1], "0", "--egress-allow", "example.com"];
    let a = cluster.node(&flags);
    let b = cluster.node(&flags);
    let network = json!({"type": "allowlist", "allowed_domains": ["example.com"]});

    // A session on A that may reach example.com, made with the broad key.
    let (status, s) = post(
        &b.serve.base,
        "/v1/sessions",
        &broad,
        Some(a.url()),
        json!({"network": network}),
    );
    assert_eq!(status, 201, "{s}");
    let id = s["id"].as_str().expect("id").to_owned();
    assert_eq!(answered_by(&b.serve.base, &broad, &id), a.url());

    // Forking it asks for its network: refused for the narrow key at A, and the same
    // through B.
    let fork = format!("/v1/sessions/{id}/fork");
    let at_owner = post(&a.serve.base, &fork, &narrow, None, json!({}));
    assert_eq!(at_owner.0, 400, "{}", at_owner.1);
    assert_eq!(at_owner.1["error"]["code"], "limit_exceeded");
    let message = at_owner.1["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("example.com") && message.contains("(narrow)"),
        "{message}"
    );
    assert_eq!(
        post(&b.serve.base, &fork, &narrow, None, json!({})),
        at_owner
    );
    // The broad key forks it through B.
    let (status, f) = post(&b.serve.base, &fork, &broad, None, json!({}));
    assert_eq!(status, 201, "{f}");

    // A create asking for that network, pinned to A: the same 400 at A and through B.
    let body = json!({"network": network});
    let at_owner = post(
        &a.serve.base,
        "/v1/sessions",
        &narrow,
        Some(a.url()),
        body.clone(),
    );
    assert_eq!(at_owner.0, 400, "{}", at_owner.1);
    assert_eq!(at_owner.1["error"]["code"], "limit_exceeded");
    assert_eq!(
        post(&b.serve.base, "/v1/sessions", &narrow, Some(a.url()), body),
        at_owner
    );
    // Without a network the narrow key's create through B is made on A.
    let (status, s) = post(
        &b.serve.base,
        "/v1/sessions",
        &narrow,
        Some(a.url()),
        json!({}),
    );
    assert_eq!(status, 201, "{s}");
}

/// An MCP client talking to B calls the tools in a session that A holds (`session_id`): the
/// calls run on A, state and files carried from call to call and visible through `/v1` of
/// any node; a session of another tenant stays not found, and a client calling `tool-call`
/// itself gets the 404 of a route there is not.
#[test]
fn mcp_calls_for_a_session_of_another_node_run_there() {
    let cluster = Cluster::new();
    let key = cluster.key("ci", &[]);
    let other = cluster.key("other", &["--tenant", "team-b"]);
    let flags = [NODE[0], NODE[1], "0"];
    let a = cluster.node(&flags);
    let b = cluster.node(&flags);
    let (status, node, s) = create(&a.serve.base, &key, Some(a.url()), json!({}));
    assert_eq!((status, node.as_str()), (201, a.url()), "{s}");
    let id = s["id"].as_str().expect("id").to_owned();

    let calls = mcp_calls(
        &format!("{}/mcp", b.serve.base),
        &key,
        json!([
            ["python", {"code": "x = 6 * 7", "session_id": id}],
            ["python", {"code": "x + 1", "session_id": id}],
            ["bash", {"command": "echo kept > note.txt && hostname >/dev/null; echo done", "session_id": id}],
            ["text_editor", {"command": "view", "path": "note.txt", "session_id": id}],
            ["python", {"code": "1 / 0", "session_id": id}],
            ["@read", {"uri": format!("runcell://sessions/{id}/files/note.txt")}],
        ]),
    );
    // A file link of A's session, read through B.
    assert_eq!(calls[5]["text"], "kept\n", "{}", calls[5]);
    let calls = &calls[..5];
    for c in calls {
        assert_eq!(c["structured"]["session_id"], id.as_str(), "{c}");
    }
    assert_eq!(calls[0]["is_error"], false, "{}", calls[0]);
    assert_eq!(
        calls[1]["structured"]["results"][0]["data"]["text/plain"], "43",
        "{}",
        calls[1]
    );
    assert!(
        calls[2]["text"]
            .as_str()
            .is_some_and(|t| t.contains("done")),
        "{}",
        calls[2]
    );
    assert!(
        calls[3]["text"]
            .as_str()
            .is_some_and(|t| t.contains("kept")),
        "{}",
        calls[3]
    );
    assert_eq!(calls[4]["is_error"], true, "{}", calls[4]);
    assert!(
        calls[4]["text"]
            .as_str()
            .is_some_and(|t| t.contains("ZeroDivisionError")),
        "{}",
        calls[4]
    );
    // It ran on A: the file is there, read through /v1 of B (forwarded to A).
    let r = http()
        .get(format!("{}/v1/sessions/{id}/files/note.txt", b.serve.base))
        .bearer_auth(&key)
        .send()
        .expect("download");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-runcell-node"], a.url());
    assert_eq!(r.text().expect("text"), "kept\n");

    // Another tenant's client, through B: A's session is not found, the call runs nowhere.
    let calls = mcp_calls(
        &format!("{}/mcp", b.serve.base),
        &other,
        json!([["python", {"code": "x", "session_id": id}]]),
    );
    assert_eq!(calls[0]["is_error"], true, "{}", calls[0]);
    assert_eq!(
        calls[0]["text"],
        format!("error: session {id} not found"),
        "{}",
        calls[0]
    );
    // The node-to-node route is not a client's, at either node.
    for base in [&a.serve.base, &b.serve.base] {
        let r = http()
            .post(format!("{base}/v1/sessions/{id}/tool-call"))
            .bearer_auth(&key)
            .json(&json!({"name": "python", "arguments": {"code": "1"}}))
            .send()
            .expect("post");
        assert_eq!(r.status(), 404, "through {base}");
    }
}
