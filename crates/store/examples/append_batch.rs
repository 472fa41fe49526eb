//! CPU per audit append by batch size: one thread appends 20 000 executions (a `1+1`-sized
//! record) in batches of 1, 2, 4, 8, 16 and 32 through `append_executions`, alternating the
//! sizes over ROUNDS rounds, and prints the CPU time per append of each.
//!
//! cargo run --release -p runcell-store --example append_batch -- [ROUNDS=3]

use std::time::Instant;

use chrono::Utc;
use runcell_store::{NewExecution, Store};

/// This thread's CPU time, in nanoseconds.
fn thread_cpu_ns() -> u128 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    stat.split_whitespace()
        .next()
        .expect("runtime")
        .parse()
        .expect("ns")
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(3, |a| a.parse().expect("ROUNDS"));
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let store = Store::open(&dir.path().join("runcell.db")).expect("open");
    let json = format!(
        r#"{{"id":"ID","session_id":"ses_0123456789abcdef","language":"python","execution_count":1,"status":"ok","stdout":"","stderr":"","truncated":{{"stdout":false,"stderr":false}},"results":[{{"is_main_result":true,"data":{{"text/plain":"2"}}}}],"error":null,"files":[],"usage":{{"wall_ms":0,"cpu_ms":0,"peak_memory_bytes":{}}},"started_at":"2026-11-30T01:00:00.000Z","finished_at":"2026-11-30T01:00:00.000Z"}}"#,
        64 << 20
    );
    let mut n = 0u64;
    println!("| round | batch | µs CPU / append | µs wall / append |");
    println!("|--:|--:|--:|--:|");
    for round in 1..=rounds {
        for batch in [1usize, 2, 4, 8, 16, 32] {
            let total = 20_000 / batch * batch;
            let (c0, t0) = (thread_cpu_ns(), Instant::now());
            for _ in 0..total / batch {
                let recs: Vec<NewExecution> = (0..batch)
                    .map(|_| {
                        n += 1;
                        let id = format!("ex_{:016}", n);
                        NewExecution {
                            tenant: "t".into(),
                            execution_id: id.clone(),
                            session_id: Some("ses_0123456789abcdef".into()),
                            status: "ok".into(),
                            code: "1+1".into(),
                            execution_json: json.replace("ID", &id),
                            created_at: Utc::now(),
                        }
                    })
                    .collect();
                for r in store.append_executions(&recs) {
                    r.expect("append");
                }
            }
            let cpu = (thread_cpu_ns() - c0) as f64 / 1e3 / total as f64;
            let wall = t0.elapsed().as_secs_f64() * 1e6 / total as f64;
            println!("| {round} | {batch} | {cpu:.1} | {wall:.1} |");
        }
    }
}
