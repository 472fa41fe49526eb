//! What one execution may return and store, over HTTP: a `display()` flood and a flood of
//! frames forged on the kernel's channel give a bounded reply, stream and audit record, with
//! `truncated.results` and the note, while the server's memory stays bounded; code over the
//! cap is a 413 `payload_too_large` on every route that takes code.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::start;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The results' MIME values, in bytes.
fn results_bytes(e: &Value) -> usize {
    e["results"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["data"].as_object().into_iter().flatten())
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum()
}

/// The note that ends the results when some were dropped.
fn note(e: &Value) -> String {
    e["results"]
        .as_array()
        .and_then(|r| r.last())
        .and_then(|r| r["data"]["text/plain"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// This process's resident memory (the server runs in it).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        << 10
}

/// Samples [`rss`] until dropped; `peak_growth` says the most it rose above the start.
struct RssSampler {
    base: u64,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssSampler {
    fn start() -> Self {
        let base = rss();
        let (peak, stop) = (
            Arc::new(AtomicU64::new(base)),
            Arc::new(AtomicBool::new(false)),
        );
        let (p, s) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        RssSampler { base, peak, stop }
    }

    fn peak_growth(&self) -> u64 {
        self.peak.load(Ordering::Relaxed).saturating_sub(self.base)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

const MIB: usize = 1 << 20;

/// Python that writes display frames of ~1 MB straight to the kernel's channel (fd 3),
/// past the kernel's own limits, as hostile code can (naming the running cell, found in the
/// kernel's memory: frames naming another are dropped).
const FORGED_FLOOD: &str = r#"
import gc, json, os, struct
cell = next(o for o in gc.get_objects() if type(o).__name__ == 'Kernel' and hasattr(o, 'current_id')).current_id
body = json.dumps({'type': 'display', 'id': cell, 'data': {'text/html': 'x' * 1_000_000}}).encode()
frame = struct.pack('>I', len(body)) + body
for i in range(300):
    view = memoryview(frame)
    while view:
        view = view[os.write(3, view):]
"#;

#[tokio::test(flavor = "multi_thread")]
async fn floods_of_results_give_a_bounded_reply_stream_and_record_in_bounded_memory() {
    let srv = start().await;
    let (s, v) = srv.post_json("/v1/sessions", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let execute = format!("{}/v1/sessions/{id}/execute", srv.base);

    // display() as a notebook calls it; the kernel keeps to the limits and counts the rest.
    let flood = "from IPython.display import HTML, display\nfor i in range(300):\n    display(HTML('x' * 1_000_000))";
    let resp = srv
        .http
        .post(&execute)
        .json(&json!({ "code": flood }))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.bytes().await.expect("body");
    assert!(body.len() < 17 * MIB, "a reply of {} bytes", body.len());
    let e: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(e["status"], "ok", "{}", e["error"]);
    assert_eq!(e["truncated"]["results"], true);
    assert!(note(&e).starts_with("[… 284 results / "), "{}", note(&e));

    // The same flood forged on the channel: the host drops it while reading, so the server's
    // memory stays bounded during it, not only afterwards.
    let sampler = RssSampler::start();
    let resp = srv
        .http
        .post(&execute)
        .json(&json!({ "code": FORGED_FLOOD }))
        .send()
        .await
        .expect("send");
    let body = resp.bytes().await.expect("body");
    let growth = sampler.peak_growth();
    drop(sampler);
    assert!(body.len() < 17 * MIB, "a reply of {} bytes", body.len());
    assert!(
        growth < 200 << 20,
        "the server grew by {} MiB",
        growth >> 20
    );
    let forged: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(forged["truncated"]["results"], true);
    assert_eq!(forged["results"].as_array().map(Vec::len), Some(17));
    assert!(
        note(&forged).starts_with("[… 284 results / "),
        "{}",
        note(&forged)
    );

    // Streamed: no result event beyond the limits, the note last before `end`.
    let resp = srv
        .http
        .post(&execute)
        .header("accept", "application/x-ndjson")
        .json(&json!({ "code": FORGED_FLOOD }))
        .send()
        .await
        .expect("stream");
    let text = resp.text().await.expect("stream body");
    // The results once as events and once in `end`'s Execution.
    assert!(text.len() < 34 * MIB, "a stream of {} bytes", text.len());
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    let results: Vec<&Value> = events.iter().filter(|e| e["type"] == "result").collect();
    assert_eq!(results.len(), 17);
    let last = results.last().expect("the note");
    assert!(
        last["data"]["text/plain"]
            .as_str()
            .is_some_and(|t| t.starts_with("[… 284 results / ")),
        "{last}"
    );
    let end = events.last().expect("end");
    assert_eq!(end["type"], "end");
    assert_eq!(end["execution"]["truncated"]["results"], true);

    // The audit record holds what the reply held: bounded.
    let ex = forged["id"].as_str().expect("id");
    let (s, stored) = srv.get_json(&format!("/v1/executions/{ex}")).await;
    assert_eq!(s, StatusCode::OK, "{stored}");
    assert!(results_bytes(&stored) <= 16 * MIB);
    assert_eq!(stored["truncated"]["results"], true);
    assert_eq!(stored["code"], FORGED_FLOOD);

    // Positive control: ordinary results come back whole, unmarked.
    let (s, ok) = srv
        .post_json(
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": "display({'text/html': '<b>x</b>', 'text/plain': 'x'}, raw=True)\n1 + 1"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{ok}");
    assert_eq!(ok["truncated"]["results"], false);
    assert_eq!(ok["results"].as_array().map(Vec::len), Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn code_over_the_cap_is_payload_too_large_on_every_route() {
    let srv = start().await;
    let (_, v) = srv.post_json("/v1/sessions", json!({})).await;
    let id = v["id"].as_str().expect("id").to_owned();
    let big = format!("#{}", "x".repeat(MIB));
    for (path, body) in [
        (
            format!("/v1/sessions/{id}/execute"),
            json!({ "code": big.clone() }),
        ),
        ("/v1/execute".to_owned(), json!({ "code": big.clone() })),
        (
            format!("/v1/sessions/{id}/commands"),
            json!({ "command": big.clone() }),
        ),
    ] {
        let (s, v) = srv.post_json(&path, body).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {v}");
        assert_eq!(v["error"]["code"], "payload_too_large", "{path}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        let limit = if path.ends_with("/commands") {
            "131071"
        } else {
            "1048576"
        };
        assert!(
            message.contains(&format!("1048577 bytes, over the limit of {limit} bytes")),
            "{path}: {message}"
        );
    }
    // Streamed, the refusal comes before the stream starts.
    let resp = srv
        .http
        .post(format!("{}/v1/sessions/{id}/execute", srv.base))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "code": big }))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Nothing over the cap was recorded; the session still runs code.
    let (s, list) = srv.get_json("/v1/executions").await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(
        list["executions"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    let (s, ok) = srv
        .post_json(
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": "6 * 7"}),
        )
        .await;
    assert_eq!((s, ok["status"].as_str()), (StatusCode::OK, Some("ok")));
}

impl common::Server {
    async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("send");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("send");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}
