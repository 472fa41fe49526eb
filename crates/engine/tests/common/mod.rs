//! Shared set-up for the engine's integration tests.

/// A fresh engine with the default Python runtime (installed once into the target dir).
pub fn engine() -> runcell_engine::testing::TestEngine {
    runcell_engine::testing::engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")))
}

/// A Python session with the defaults; its id.
#[allow(dead_code)] // not every test binary creates sessions this way
pub fn create(engine: &runcell_engine::Engine) -> String {
    engine
        .sessions()
        .create(runcell_engine::CreateSession::default())
        .expect("create session")
        .id
}

/// The main result's text/plain ("" without one).
#[allow(dead_code)]
pub fn main_text(e: &runcell_engine::Execution) -> String {
    e.results
        .iter()
        .find(|r| r.is_main_result)
        .and_then(|r| r.data.get("text/plain").cloned())
        .unwrap_or_default()
}

/// The mount points `/proc/PID/mountinfo` lists (PID may be `self`).
#[allow(dead_code)]
pub fn mount_points(pid: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(std::path::PathBuf::from))
        .collect()
}
