//! The engines the commands run: this binary as the sandbox init helper, the default Python
//! runtime (installed first where a command needs it), and a store where the command records.

use std::path::PathBuf;

/// The engine, with this binary as the sandbox init helper and the default Python runtime if
/// it is installed.
pub(crate) fn engine(data_dir: &std::path::Path) -> anyhow::Result<runcell_engine::Engine> {
    let runtime = runcell_kernel::runtime::Runtimes::new(data_dir).default_runtime();
    engine_on(data_dir, runtime.map(|r| r.path))
}

/// [`engine`], whose one-shot runs may ask for `network`'s domains (`runcell run --allow-domain`).
pub(crate) fn engine_with_network(
    data_dir: &std::path::Path,
    network: runcell_engine::NetworkConfig,
) -> anyhow::Result<runcell_engine::Engine> {
    use anyhow::Context;
    let runtime = runcell_kernel::runtime::Runtimes::new(data_dir).default_runtime();
    let exe = std::env::current_exe().context("cannot locate the runcell binary")?;
    let mut config = runcell_engine::EngineConfig::new(data_dir.to_owned(), exe);
    config.python_runtime = runtime.map(|r| r.path);
    config.network = network;
    Ok(runcell_engine::Engine::new(config)?)
}

/// The engine with the default Python runtime, installed first if missing (with progress).
pub(crate) fn engine_with_runtime(
    data_dir: &std::path::Path,
) -> anyhow::Result<runcell_engine::Engine> {
    let info = crate::runtime::ensure_default(data_dir)?;
    engine_on(data_dir, Some(info.path))
}

/// The engine `ask` runs: the default runtime (installed if missing), and every execution
/// recorded in the data dir's database before anyone sees it.
pub(crate) fn audited_engine(
    data_dir: &std::path::Path,
    store: &runcell_store::Store,
) -> anyhow::Result<runcell_engine::Engine> {
    let config = config_with_runtime(data_dir, None, Default::default())?;
    Ok(runcell_engine::Engine::audited(config, store.domain())?)
}

/// What a server hands its engine besides limits and network.
pub(crate) struct ServingExtras {
    /// Signs every PNG and JPEG result (C2PA).
    pub(crate) image_signer: Option<std::sync::Arc<dyn runcell_engine::ImageSigner>>,
    /// Where durable sessions' snapshots are kept (`--snapshot-dir`, `--snapshot-store`).
    pub(crate) snapshots: Option<std::sync::Arc<dyn runcell_engine::snapshots::SnapshotStore>>,
    /// The zygote's memory marked for KSM (`--merge-session-pages`).
    pub(crate) merge_session_pages: bool,
}

/// The engine `serve` runs, with the server's limit policy: the default runtime (installed if
/// missing), and its sessions, uploads and executions recorded in the data dir's database.
pub(crate) fn serving_engine(
    data_dir: &std::path::Path,
    store: &runcell_store::Store,
    preload: Option<Vec<String>>,
    limits: runcell_engine::LimitPolicy,
    workspaces_on_disk: bool,
    network: runcell_engine::NetworkConfig,
    extras: ServingExtras,
) -> anyhow::Result<runcell_engine::Engine> {
    let mut config = config_with_runtime(data_dir, preload, limits)?;
    config.workspaces_on_disk = workspaces_on_disk;
    config.network = network;
    config.merge_session_pages = extras.merge_session_pages;
    config.image_signer = extras.image_signer;
    config.snapshots = extras.snapshots;
    Ok(runcell_engine::Engine::with_store(config, store.domain())?)
}

/// This binary as the sandbox init helper and the default runtime, installed if missing.
pub(crate) fn config_with_runtime(
    data_dir: &std::path::Path,
    preload: Option<Vec<String>>,
    limits: runcell_engine::LimitPolicy,
) -> anyhow::Result<runcell_engine::EngineConfig> {
    use anyhow::Context;
    let runtime = crate::runtime::ensure_default(data_dir)?;
    let exe = std::env::current_exe().context("cannot locate the runcell binary")?;
    let mut config = runcell_engine::EngineConfig::new(data_dir.to_owned(), exe);
    config.python_runtime = Some(runtime.path);
    config.preload = preload;
    config.limits = limits;
    Ok(config)
}

pub(crate) fn engine_on(
    data_dir: &std::path::Path,
    python_runtime: Option<PathBuf>,
) -> anyhow::Result<runcell_engine::Engine> {
    use anyhow::Context;
    let exe = std::env::current_exe().context("cannot locate the runcell binary")?;
    let mut config = runcell_engine::EngineConfig::new(data_dir.to_owned(), exe);
    config.python_runtime = python_runtime;
    Ok(runcell_engine::Engine::new(config)?)
}
