//! The real `runcell serve` under a result flood: a cell that sends 300 MB of displays (through
//! `display()` and forged straight onto the kernel's channel) gets a bounded reply, and the
//! server process's memory, sampled from /proc while the flood runs, stays bounded.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::serve::Serve;
use serde_json::{json, Value};

fn serve(data: &Path) -> Serve {
    common::serve::serve(data, &[])
}

/// A process's resident memory in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        << 10
}

/// Runs `f` while a thread samples `pid`'s RSS; `f`'s value and the peak growth.
fn with_peak_rss<T>(pid: u32, f: impl FnOnce() -> T) -> (T, u64) {
    let base = rss(pid);
    let peak = Arc::new(AtomicU64::new(base));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let value = f();
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    (value, peak.load(Ordering::Relaxed).saturating_sub(base))
}

const MIB: usize = 1 << 20;

#[test]
fn a_result_flood_leaves_the_server_bounded() {
    let data = common::serve::data_dir("runcell-flood-test-");
    let srv = serve(&data);
    let pid = srv.child.id();
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let session: Value = http
        .post(format!("{}/v1/sessions", srv.base))
        .json(&json!({}))
        .send()
        .and_then(|r| r.json())
        .expect("session");
    let url = format!(
        "{}/v1/sessions/{}/execute",
        srv.base,
        session["id"].as_str().expect("id")
    );
    let floods = [
        "from IPython.display import HTML, display\nfor i in range(300):\n    display(HTML('x' * 1_000_000))",
        // Past the kernel: frames written to its channel (fd 3) by the cell itself.
        "import gc, json, os, struct\ncell = next(o for o in gc.get_objects() if type(o).__name__ == 'Kernel' and hasattr(o, 'current_id')).current_id\nbody = json.dumps({'type': 'display', 'id': cell, 'data': {'text/html': 'x' * 1_000_000}}).encode()\nframe = struct.pack('>I', len(body)) + body\nfor i in range(300):\n    view = memoryview(frame)\n    while view:\n        view = view[os.write(3, view):]",
    ];
    for code in floods {
        for stream in [false, true] {
            let (body, growth) = with_peak_rss(pid, || {
                let mut req = http.post(&url).json(&json!({ "code": code }));
                if stream {
                    req = req.header("accept", "application/x-ndjson");
                }
                req.send().and_then(|r| r.bytes()).expect("reply")
            });
            assert!(
                growth < 200 << 20,
                "the server grew by {} MiB (stream: {stream}) for {code}",
                growth >> 20
            );
            // The stream carries the results twice: as events and in `end`'s Execution.
            let cap = if stream { 34 * MIB } else { 17 * MIB };
            assert!(body.len() < cap, "{} bytes (stream: {stream})", body.len());
            let last = std::str::from_utf8(&body)
                .expect("utf-8")
                .lines()
                .last()
                .expect("a line")
                .to_owned();
            let v: Value = serde_json::from_str(&last).expect("json");
            let e = if stream { &v["execution"] } else { &v };
            assert_eq!(e["status"], "ok", "{}", e["error"]);
            assert_eq!(e["truncated"]["results"], true);
            let note = e["results"]
                .as_array()
                .and_then(|r| r.last())
                .and_then(|r| r["data"]["text/plain"].as_str())
                .unwrap_or_default();
            assert!(note.starts_with("[… 284 results / "), "{note}");
        }
    }
}
