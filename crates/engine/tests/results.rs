//! What one execution may give back and bring in: results bounded in number and size while
//! they are read (a `display()` flood, frames a cell forges on the kernel's channel), with
//! the `truncated.results` marker; code bounded in size. Positive controls: a figure and a
//! DataFrame come back whole.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{create, main_text};
use runcell_engine::tools::ToolCall;
use runcell_engine::{
    CancelToken, EngineError, ExecEvent, Execution, ExecutionStatus, KilledBy, OneShot,
    MAX_CODE_BYTES, MAX_COMMAND_BYTES, MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES,
};

/// The tests of this file one at a time: they measure this process's memory, which the
/// others would add to.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn exec(engine: &runcell_engine::Engine, id: &str, code: &str) -> Execution {
    engine
        .sessions()
        .execute(id, code, None, None)
        .expect("execute")
}

/// Bytes of the results as the reply carries them (MIME types and values).
fn results_bytes(e: &Execution) -> usize {
    e.results
        .iter()
        .flat_map(|r| r.data.iter())
        .map(|(k, v)| k.len() + v.len())
        .sum()
}

/// The note that ends the results when some were dropped.
fn marker(e: &Execution) -> String {
    e.results
        .last()
        .and_then(|r| r.data.get("text/plain").cloned())
        .unwrap_or_default()
}

/// This process's resident memory in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb << 10
}

/// Runs `f` while a thread samples this process's RSS; `f`'s value and the peak growth.
fn with_peak_rss<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let base = rss();
    let peak = Arc::new(AtomicU64::new(base));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let value = f();
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    (value, peak.load(Ordering::Relaxed).saturating_sub(base))
}

/// Python that defines `forge(message)`: writes one frame straight to the kernel's channel
/// (fd 3), past the kernel and its limits, as hostile code can; and `current_id()`, the
/// running cell's id, found in the kernel's memory (frames naming another cell are dropped).
const FORGE: &str = r#"
import gc, json, os, struct
def current_id():
    return next(o for o in gc.get_objects() if type(o).__name__ == 'Kernel' and hasattr(o, 'current_id')).current_id
def raw(data):
    view = memoryview(data)
    while view:
        view = view[os.write(3, view):]
def forge(message):
    body = json.dumps(message).encode()
    raw(struct.pack('>I', len(body)) + body)
"#;

#[test]
fn a_display_flood_keeps_the_limits_and_says_what_it_dropped() {
    let _serial = serial();
    let engine = common::engine();
    let id = create(&engine);
    // The IPython-free display() the kernel provides, as a notebook would call it.
    let code = "from IPython.display import HTML, display\nfor i in range(300):\n    display(HTML('x' * 1_000_000))\n'done'";
    let streamed = Arc::new(Mutex::new((0usize, 0usize)));
    let sink = {
        let streamed = streamed.clone();
        Box::new(move |e: ExecEvent<'_>| {
            if let ExecEvent::Result(r) = e {
                let mut s = streamed.lock().expect("lock");
                s.0 += 1;
                s.1 += r.data.values().map(String::len).sum::<usize>();
            }
        })
    };
    let e = engine
        .sessions()
        .execute(&id, code, None, Some(sink))
        .expect("execute");
    assert_eq!(e.status, ExecutionStatus::Ok, "{:?}", e.error);
    assert!(e.truncated.results);
    // 16 displays of ~1 MB fill the 16 MiB; the small main result after them still fits.
    assert_eq!(
        e.results.len(),
        16 + 1 + 1,
        "16 displays, the result, the note"
    );
    assert_eq!(main_text(&e), "'done'");
    assert!(
        results_bytes(&e) <= MAX_RESULTS_BYTES,
        "{}",
        results_bytes(&e)
    );
    let note = marker(&e);
    assert!(
        note.starts_with("[… 284 results / ") && note.contains(" bytes dropped …]"),
        "{note}"
    );
    assert!(note.contains("at most 64 results"), "{note}");
    // The stream carried the same bounded results, the note last.
    let (n, bytes) = *streamed.lock().expect("lock");
    assert_eq!(n, e.results.len());
    assert!(bytes <= MAX_RESULTS_BYTES + 1024, "{bytes}");
    // The next cell starts afresh.
    let next = exec(&engine, &id, "display(1)\n2");
    assert!(!next.truncated.results);
    assert_eq!(next.results.len(), 2);
}

#[test]
fn forged_result_frames_are_bounded_by_the_host_while_they_are_read() {
    let _serial = serial();
    let engine = common::engine();
    let id = create(&engine);
    exec(&engine, &id, FORGE);
    // 300 frames of 1 MB straight on the channel: the kernel's own limits never see them.
    let flood = "for i in range(300):\n    forge({'type': 'display', 'id': current_id(), 'data': {'text/html': 'x' * 1_000_000}})";
    let (e, growth) = with_peak_rss(|| exec(&engine, &id, flood));
    assert_eq!(e.status, ExecutionStatus::Ok, "{:?}", e.error);
    assert!(e.truncated.results);
    assert_eq!(e.results.len(), 16 + 1, "{}", e.results.len());
    assert!(results_bytes(&e) <= MAX_RESULTS_BYTES);
    assert!(
        marker(&e).starts_with("[… 284 results / "),
        "{}",
        marker(&e)
    );
    // Held while it ran: about the 16 MiB kept, never the 300 MB sent.
    assert!(growth < 150 << 20, "the host grew by {} MiB", growth >> 20);

    // More results than the count limit, each tiny.
    let many = exec(
        &engine,
        &id,
        "for i in range(100):\n    forge({'type': 'display', 'id': current_id(), 'data': {'text/plain': str(i)}})",
    );
    assert_eq!(many.results.len(), MAX_RESULTS + 1);
    assert!(
        marker(&many).starts_with("[… 36 results / "),
        "{}",
        marker(&many)
    );

    // A kernel sends one error per cell; forged ones after it are dropped and counted too
    // (each would be an event of the stream).
    let errors = exec(
        &engine,
        &id,
        "for i in range(50):\n    forge({'type': 'error', 'id': current_id(), 'name': f'E{i}', 'value': 'v' * 1_000_000, 'traceback': ''})",
    );
    assert_eq!(errors.error.as_ref().map(|e| e.name.as_str()), Some("E0"));
    assert!(
        marker(&errors).starts_with("[… 49 results / "),
        "{}",
        marker(&errors)
    );

    // One frame over the per-result limit (and under the frame limit) is read past
    // unbuffered; the kernel lives on with its state.
    let big = format!(
        "raw(struct.pack('>I', {n}) + b'x' * {n})\nimport sys\nsys.modules['__main__'].alive = 1\n'after'",
        n = MAX_RESULT_BYTES + 4096
    );
    let (skipped, growth) = with_peak_rss(|| exec(&engine, &id, &big));
    assert_eq!(skipped.status, ExecutionStatus::Ok, "{:?}", skipped.error);
    assert!(skipped.truncated.results);
    assert_eq!(main_text(&skipped), "'after'");
    assert!(
        marker(&skipped).starts_with(&format!("[… 1 result / {} bytes", MAX_RESULT_BYTES + 4096)),
        "{}",
        marker(&skipped)
    );
    assert!(growth < 64 << 20, "the host grew by {} MiB", growth >> 20);
    assert_eq!(main_text(&exec(&engine, &id, "alive")), "1");
}

#[test]
fn a_forged_giant_frame_kills_the_kernel_with_a_clear_error_and_the_session_restarts() {
    let _serial = serial();
    let engine = common::engine();
    let id = create(&engine);
    exec(&engine, &id, &format!("{FORGE}\nx = 1"));
    // A length prefix of 4 GiB and nothing after it: refused from the prefix alone.
    let (e, growth) = with_peak_rss(|| {
        exec(
            &engine,
            &id,
            "raw(b'\\xff\\xff\\xff\\xff')\nimport time\ntime.sleep(30)",
        )
    });
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    assert_eq!(e.usage.killed_by, Some(KilledBy::Output));
    let err = e.error.expect("error");
    assert_eq!(err.name, "ProtocolError");
    assert!(
        err.value
            .contains("frame of 4294967295 bytes exceeds the 67108864 byte limit")
            && err.value.contains("The session was restarted"),
        "{}",
        err.value
    );
    assert!(
        e.usage.wall_ms < 10_000,
        "killed at once, not at the deadline"
    );
    assert!(growth < 64 << 20, "the host grew by {} MiB", growth >> 20);
    // The session lives on, restarted: state is gone.
    let next = exec(&engine, &id, "'x' in dir()");
    assert_eq!(main_text(&next), "False");
}

#[test]
fn a_figure_and_a_dataframe_come_back_whole() {
    let _serial = serial();
    let engine = common::engine();
    let id = create(&engine);
    let e = exec(
        &engine,
        &id,
        "import matplotlib.pyplot as plt, pandas as pd\nfig, ax = plt.subplots(figsize=(8, 6), dpi=150)\nax.plot(range(1000), [i * i for i in range(1000)])\nplt.show()\npd.DataFrame({'a': range(100), 'b': [str(i) * 20 for i in range(100)]})",
    );
    assert_eq!(e.status, ExecutionStatus::Ok, "{:?}", e.error);
    assert!(!e.truncated.results);
    assert_eq!(e.results.len(), 2, "{:?}", e.results.len());
    let png = e.results[0]
        .data
        .get("image/png")
        .expect("the figure's PNG");
    assert!(png.len() > 10_000, "{}", png.len());
    let html = e.results[1]
        .data
        .get("text/html")
        .expect("the DataFrame's HTML");
    assert!(html.contains("<table") && html.contains("99"), "{html}");
}

#[test]
fn code_over_the_limit_is_refused_everywhere_and_code_at_it_runs() {
    let _serial = serial();
    let engine = common::engine();
    let id = create(&engine);
    let too_big = format!("x = 1\n#{}", "y".repeat(MAX_CODE_BYTES));
    let refused_at = |limit: usize, r: Result<_, EngineError>| match r {
        Err(EngineError::PayloadTooLarge(m)) => {
            assert_eq!(m.limit, limit, "{m}");
            assert!(
                m.to_string()
                    .contains(&format!("over the limit of {limit} bytes")),
                "{m}"
            )
        }
        Err(other) => panic!("expected PayloadTooLarge, got {other:?}"),
        Ok(_) => panic!("accepted code over the limit"),
    };
    let refused = |r| refused_at(MAX_CODE_BYTES, r);
    refused(
        engine
            .sessions()
            .execute(&id, &too_big, None, None)
            .map(|_| ()),
    );
    refused(
        engine
            .run_once(
                &OneShot::new(runcell_engine::Language::Python, too_big.clone()),
                &mut |_, _| {},
            )
            .map(|_| ()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        refused(
            engine
                .sessions()
                .execute_async(&id, too_big.clone(), None, CancelToken::new())
                .map(|_| ()),
        )
    });
    // A command runs as `bash -c COMMAND`: one argument, which Linux caps at 128 KiB. At the
    // cap it runs; over it, it is refused (it was an internal error from the exec).
    let command = |n: usize| format!("echo {}| wc -c", "y".repeat(n - 12));
    let at = engine
        .run_command(&id, &command(MAX_COMMAND_BYTES), None)
        .expect("a command at the cap");
    assert_eq!(at.stdout.trim(), (MAX_COMMAND_BYTES - 11).to_string());
    refused_at(
        MAX_COMMAND_BYTES,
        engine
            .run_command(&id, &command(MAX_COMMAND_BYTES + 1), None)
            .map(|_| ()),
    );
    // A model's tool call (MCP, the chat, `runcell ask`) is told, as a failed call.
    for (tool, field, limit) in [
        ("python", "code", MAX_CODE_BYTES),
        ("bash", "command", MAX_COMMAND_BYTES),
    ] {
        let call =
            ToolCall::parse(tool, serde_json::json!({ field: too_big.clone() })).expect("call");
        let out = engine
            .run_tool(&id, &call, CancelToken::new())
            .expect("a tool output");
        assert!(out.is_error, "{tool}");
        assert!(
            out.text
                .contains(&format!("over the limit of {limit} bytes")),
            "{tool}: {}",
            out.text
        );
    }
    // Exactly at the limit is fine.
    let at = format!("x = 1\n#{}\nx", "y".repeat(MAX_CODE_BYTES - 9));
    assert_eq!(at.len(), MAX_CODE_BYTES);
    assert_eq!(main_text(&exec(&engine, &id, &at)), "1");
}
