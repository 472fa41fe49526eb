//! Audit appends under concurrency, the way session workers make them: THREADS threads each
//! append one execution after another for SECONDS, sleeping PAUSE_US between two appends (a
//! cell's run; 0: the store saturated). Prints appends/s, the process's CPU per append and the
//! append latency percentiles.
//!
//! cargo run --release -p runcell-store --example append_load -- [THREADS=16] [SECONDS=10] [PAUSE_US=0]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use runcell_store::{NewExecution, Store};

/// utime + stime of this process, in clock ticks (100 per second on Linux).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
    let f: Vec<&str> = stat
        .rsplit(')')
        .next()
        .expect("comm")
        .split_whitespace()
        .collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map_or(16, |a| a.parse().expect("THREADS"));
    let seconds: u64 = args.next().map_or(10, |a| a.parse().expect("SECONDS"));
    let pause = Duration::from_micros(args.next().map_or(0, |a| a.parse().expect("PAUSE_US")));
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let store = Store::open(&dir.path().join("runcell.db")).expect("open");
    let stop = Arc::new(AtomicBool::new(false));
    let (t0, c0) = (Instant::now(), cpu_ticks());
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                    let id = format!("ex_{t}_{i}");
                    let json = format!(
                        r#"{{"id":"{id}","session_id":"ses_{t}","language":"python","execution_count":{i},"status":"ok","stdout":"","stderr":"","truncated":{{"stdout":false,"stderr":false}},"results":[{{"is_main_result":true,"data":{{"text/plain":"2"}}}}],"error":null,"files":[],"usage":{{"wall_ms":0,"cpu_ms":0,"peak_memory_bytes":9000000,"killed_by":null}},"started_at":"2026-11-29T23:00:00.000000000Z","finished_at":"2026-11-29T23:00:00.000100000Z"}}"#
                    );
                    let rec = NewExecution {
                        tenant: "default".into(),
                        execution_id: id,
                        session_id: Some(format!("ses_{t}")),
                        status: "ok".into(),
                        code: "1+1".into(),
                        execution_json: json,
                        created_at: Utc::now(),
                    };
                    let s = Instant::now();
                    store.append_execution(&rec).expect("append");
                    lat.push(s.elapsed());
                    i += 1;
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<Duration> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    let (wall, cpu) = (t0.elapsed(), cpu_ticks() - c0);
    lat.sort();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
    let n = lat.len() as f64;
    println!(
        "{:.0} appends/s  cpu {:.1} us/append  p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        n / wall.as_secs_f64(),
        cpu as f64 * 1e4 / n,
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
}
