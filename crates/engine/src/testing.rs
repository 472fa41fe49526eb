//! Test support (feature `test-support`): the init helper and the default Python runtime for
//! tests of this crate and the crates above it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{Engine, EngineConfig};

/// The init helper the sandbox execs: the sandbox crate's small binary (built by
/// `cargo test --workspace`), built on demand when a crate is tested alone.
pub fn init_exe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        if let Some(p) = runcell_sandbox::find_init_exe() {
            return p;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args([
                "build",
                "-p",
                "runcell-sandbox",
                "--bin",
                "runcell-sandbox-init",
            ])
            .status()
            .expect("cargo build runcell-sandbox-init");
        assert!(status.success(), "cannot build runcell-sandbox-init");
        runcell_sandbox::find_init_exe().expect("runcell-sandbox-init")
    })
    .clone()
}

/// The default runtime, installed once under `cache` (pass `env!("CARGO_TARGET_TMPDIR")`) and
/// shared by every test; concurrent installers wait for each other.
pub fn python_runtime(cache: &Path) -> PathBuf {
    static RT: OnceLock<PathBuf> = OnceLock::new();
    RT.get_or_init(|| {
        runcell_kernel::runtime::Runtimes::new(&cache.join("runcell-test-runtimes"))
            .ensure_default(&mut |_| {})
            .expect("install the default Python runtime")
            .path
    })
    .clone()
}

/// A fresh data dir (named `prefix…`) whose `runtimes` is the shared test runtime under `cache`,
/// for tests of the real binary (`runcell serve`, `mcp`, `ask`): no second install.
pub fn data_dir_with_runtime(cache: &Path, prefix: &str) -> PathBuf {
    python_runtime(cache);
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("tempdir")
        .keep();
    std::os::unix::fs::symlink(
        cache.join("runcell-test-runtimes/runtimes"),
        dir.join("runtimes"),
    )
    .expect("link runtimes");
    dir
}

/// An engine on a fresh data dir, with the Python runtime cached under `cache`.
pub fn engine_config(cache: &Path) -> EngineConfig {
    let dir = tempfile::Builder::new()
        .prefix("runcell-test-")
        .tempdir()
        .expect("tempdir")
        .keep();
    let mut config = EngineConfig::new(dir, init_exe());
    config.python_runtime = Some(python_runtime(cache));
    config
}

/// [`engine_config`] made into an engine that ends its sessions when dropped, so a test leaves
/// no sandbox or workspace mount behind.
pub fn engine(cache: &Path) -> TestEngine {
    TestEngine(Engine::new(engine_config(cache)).expect("engine"))
}

/// [`engine`] recording its sessions, uploads and executions in `store`, as a server's does
/// ([`Engine::with_store`]).
pub fn engine_with_store(
    cache: &Path,
    store: std::sync::Arc<dyn runcell_store::DomainStore>,
) -> TestEngine {
    TestEngine(Engine::with_store(engine_config(cache), store).expect("engine"))
}

/// [`engine`] with a zygote preloading the default modules, once it is ready (panics if it
/// cannot start: the tests using it are about the zygote).
pub fn zygote_engine(cache: &Path) -> TestEngine {
    let mut config = engine_config(cache);
    config.preload = Some(
        crate::DEFAULT_PRELOAD
            .iter()
            .map(|m| m.to_string())
            .collect(),
    );
    let engine = TestEngine(Engine::new(config).expect("engine"));
    let status = engine.wait_for_zygote(std::time::Duration::from_secs(180));
    assert!(
        matches!(status, crate::ZygoteStatus::Ready { .. }),
        "zygote: {status:?}"
    );
    engine
}

/// An engine that shuts its sessions down on drop.
#[derive(Debug)]
pub struct TestEngine(pub Engine);

impl std::ops::Deref for TestEngine {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.0
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        self.0.sessions().shutdown();
        // The data dir is the test's own (a fresh temporary directory): leave nothing behind.
        let _ = std::fs::remove_dir_all(&self.0.config().data_dir);
    }
}
