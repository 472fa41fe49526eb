//! Nodes on one real PostgreSQL, driven through every node: new sessions are placed on the
//! live node with the most room (or where pinned, `x-runcell-node`), a full node is never
//! chosen and an unreachable one is passed over; MCP tool calls for a session of another
//! node run there; and a key's own bounds hold on a request forwarded to another node as
//! they do at that node.

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
