//! Shared set-up for the engine's integration tests: an engine on a scratch data dir, with the
//! default Python runtime (installed once into the target directory, then reused).
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::PathBuf;
use std::sync::OnceLock;

use runcell_engine::{Engine, EngineConfig};

/// The init helper the sandbox execs: the sandbox crate's small binary (built by
/// `cargo test --workspace`), built on demand when this crate is tested alone.
pub fn init_exe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        if let Some(p) = runcell_sandbox::find_init_exe() {
            return p;
        }
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "runcell-sandbox",
                "--bin",
                "runcell-sandbox-init",
            ])
            .status()
            .expect("cargo build");
        assert!(status.success());
        runcell_sandbox::find_init_exe().expect("runcell-sandbox-init")
    })
    .clone()
}

/// The default runtime, installed on first use into `target/tmp` and shared by every test.
pub fn python_runtime() -> PathBuf {
    static RT: OnceLock<PathBuf> = OnceLock::new();
    RT.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("runcell-test-runtimes");
        let runtimes = runcell_kernel::runtime::Runtimes::new(&root);
        let info = runtimes
            .ensure_default(&mut |_| {})
            .expect("install the default Python runtime");
        info.path
    })
    .clone()
}

/// A fresh engine with the Python runtime, on its own data dir.
pub fn engine() -> Engine {
    let dir = tempfile::Builder::new()
        .prefix("runcell-engine-test-")
        .tempdir()
        .expect("tempdir")
        .keep();
    let mut config = EngineConfig::new(dir, init_exe());
    config.python_runtime = Some(python_runtime());
    Engine::new(config).expect("engine")
}
