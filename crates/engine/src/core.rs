//! The engine's shared core: configuration, the sandbox factory, limits, starting kernels
//! (from the zygote or cold), and the one function every finished execution goes through
//! (audit).

pub(crate) use crate::error::{io_error, no_space};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use runcell_kernel::{CellOptions, Kernel};
use runcell_sandbox::{Launch, Sandbox, Workspace, Zygote};

use crate::audit::{AuditSink, Auditor, Reply};
use crate::error::Invalid;
use crate::launch::{Host, Program};
use crate::limits::{Ledger, LimitPolicy, LimitsRequest, SessionLimits};
use crate::model::Start;
use crate::model::{Execution, Language};
use crate::records::Records;
use crate::zygote::{ZygoteSlot, ZygoteStatus};
use crate::{chain, EngineError};

/// How long a kernel may take to say it is ready.
const KERNEL_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where workspaces live under a data dir: one directory per session (`ses_…`) and per
/// one-shot run (`ex_…`), named by its id.
pub fn workspaces_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("workspaces")
}

/// Host paths and the sandbox factory an engine runs with.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// runcell's data directory (workspaces live under it).
    pub data_dir: PathBuf,
    /// The binary that serves as the sandbox init helper.
    pub init_exe: PathBuf,
    /// Host runtime state (uid leases); on tmpfs so it never outlives a reboot.
    pub run_dir: PathBuf,
    /// The Python runtime (a venv with the data-science stack), bound read-only at
    /// `/opt/runcell/python`. Without one, Python runs on the host's `/usr/bin/python3`.
    pub python_runtime: Option<PathBuf>,
    /// Modules a preloaded zygote imports before forking Python sessions (DESIGN.md §4);
    /// `None` starts every session cold. Needs `python_runtime`.
    pub preload: Option<Vec<String>>,
    /// Defaults, maxima and the committed-memory budget of every sandbox (`serve --max-*`);
    /// by default no larger than this host can give.
    pub limits: LimitPolicy,
    /// Session workspaces as filesystem images on disk (durable; the default) where the host
    /// can mount them, or tmpfs (`serve --workspaces-in-memory`: lost at a reboot, and counted
    /// in the session's memory).
    pub workspaces_on_disk: bool,
    /// What sessions' network allowlists may name and which address ranges the egress proxy
    /// may reach (`serve --egress-allow`, `--egress-allow-cidr`); by default nothing.
    pub network: crate::network::NetworkConfig,
    /// Embeds a signed C2PA manifest in every PNG and JPEG result (`crate::stamp`); none:
    /// images are returned as the kernel sent them (`runcell run`, `repl`).
    pub image_signer: Option<Arc<dyn crate::stamp::ImageSigner>>,
    /// Marks the zygote's memory mergeable, so that the host's KSM daemon may merge the
    /// byte-identical pages that sessions copied from it (`serve --merge-session-pages`;
    /// off by default: merged pages let one session time whether another holds a page).
    pub merge_session_pages: bool,
    /// Where durable sessions' snapshots are kept (`crate::snapshots`); none: the data
    /// dir's `snapshots/`, which no other node reads.
    pub snapshots: Option<Arc<dyn crate::snapshots::SnapshotStore>>,
}

impl EngineConfig {
    pub fn new(data_dir: PathBuf, init_exe: PathBuf) -> Self {
        // Sandbox specs take absolute paths only; a relative data dir would fail every run.
        let data_dir = std::path::absolute(&data_dir).unwrap_or(data_dir);
        Self {
            data_dir,
            init_exe,
            run_dir: PathBuf::from("/run/runcell"),
            python_runtime: None,
            preload: None,
            limits: LimitPolicy::default(),
            workspaces_on_disk: true,
            network: Default::default(),
            image_signer: None,
            merge_session_pages: false,
            snapshots: None,
        }
    }

    /// Where this engine's workspaces live ([`workspaces_dir`] of its data dir).
    pub fn workspaces_dir(&self) -> PathBuf {
        workspaces_dir(&self.data_dir)
    }

    /// Where workspace images and their spares are kept (workspaces on disk).
    pub fn workspace_images_dir(&self) -> PathBuf {
        self.data_dir.join("workspace-images")
    }

    /// The directories under which workspaces are mounted (sessions', one-shots', spare
    /// images): what the sandboxes' spawning mount namespaces leave out (the zygote's and the
    /// cold helpers').
    pub(crate) fn workspace_mount_dirs(&self) -> Vec<PathBuf> {
        vec![self.workspaces_dir(), self.workspace_images_dir()]
    }

    /// The host directory of session (or one-shot run) `id`'s workspace.
    pub fn workspace_path(&self, id: &str) -> PathBuf {
        self.workspaces_dir().join(id)
    }
}

pub(crate) struct Core {
    pub(crate) config: EngineConfig,
    pub(crate) sandbox: Sandbox,
    /// Host directory holding the kernel code, bound read-only into sessions; written when the
    /// first kernel starts, so one-shot runs (`runcell run`) never pay for it.
    kernel_dir: std::sync::Mutex<Option<PathBuf>>,
    pub(crate) zygote: Arc<ZygoteSlot>,
    /// The store, and how much of the domain is kept there; none: nothing is recorded.
    pub(crate) records: Option<Records>,
    /// The store's audit chains (from `records`).
    audit: Option<Arc<dyn AuditSink>>,
    /// Records sessions' executions off their workers (see `audit`); with `audit`.
    auditor: Option<Auditor>,
    /// Session cells running now (the audit writer waits for them a little).
    pub(crate) cells_running: Arc<std::sync::atomic::AtomicUsize>,
    /// Committed sandbox memory and tenants' live sessions (admission control, quotas).
    pub(crate) ledger: Arc<Ledger>,
    /// Where session workspaces live on disk; `None` on a host without loop devices or
    /// e2fsprogs, whose sessions get a tmpfs workspace as before (in memory, lost at reboot).
    pub(crate) images: Option<runcell_sandbox::WorkspaceImages>,
    /// The egress bounds and proxy (crate::network).
    pub(crate) network: crate::network::Network,
    /// The server's MCP dispatcher, given to every session cell (mcp_tools.rs).
    pub(crate) mcp_tools: crate::mcp_tools::McpTools,
    /// A zygote with nothing preloaded beyond the kernel module, for one-shots that import
    /// nothing heavy (crate::oneshot_pool); started with the one-shot pool.
    pub(crate) light_zygote: Arc<ZygoteSlot>,
    /// The top-level names of the runtime's site-packages (read once, on the first one-shot
    /// that asks), which decide between the light and the full zygote.
    pub(crate) third_party: std::sync::OnceLock<std::collections::HashSet<String>>,
    /// Prepared one-shot sandboxes and the reaper (crate::oneshot_pool).
    pub(crate) one_shots: crate::oneshot_pool::OneShotPool,
    /// Where snapshots are kept (the config's store, or the data dir's own).
    pub(crate) snapshots: Arc<dyn crate::snapshots::SnapshotStore>,
}

impl Core {
    pub(crate) fn new(config: EngineConfig, records: Option<Records>) -> Result<Core, EngineError> {
        config
            .limits
            .validate()
            .map_err(|m| EngineError::InvalidRequest(Invalid::Policy(m)))?;
        let network = crate::network::Network::new(&config.network, &config.data_dir)?;
        let cgroups = runcell_sandbox::cgroup::Hierarchy::detect();
        let blocking: Vec<_> = runcell_sandbox::doctor::check_mandatory_with(&cgroups)
            .into_iter()
            .filter(|l| l.blocks())
            .collect();
        if !blocking.is_empty() {
            return Err(EngineError::IsolationMissing { layers: blocking });
        }
        let cgroups = cgroups
            .map_err(|e| EngineError::unavailable(runcell_sandbox::SandboxError::NoCgroups(e)))?;
        // Cold sandboxes, like the zygote's, are cloned from a mount namespace that does not
        // hold one mount per live workspace (runcell_sandbox::Sandbox::spawn_without_mounts_below).
        let sandbox = Sandbox::with_cgroups(config.init_exe.clone(), cgroups)
            .spawn_without_mounts_below(config.workspace_mount_dirs());
        for dir in [config.workspaces_dir(), config.data_dir.join("tmp")] {
            create_dir(&dir)?;
        }
        let images = match config
            .workspaces_on_disk
            .then(|| runcell_sandbox::WorkspaceImages::open(&config.workspace_images_dir()))
        {
            None => {
                tracing::info!("session workspaces in memory (tmpfs), as configured");
                None
            }
            Some(Ok(i)) => Some(i),
            Some(Err(e)) => {
                tracing::warn!(
                    error = %chain(&e),
                    "session workspaces stay in memory (tmpfs): counted in each session's memory limit and lost at a reboot"
                );
                None
            }
        };
        // A killed `runcell run` leaves its workspace and its cgroup; the workspace says so.
        if sweep_stale_one_shots(&config) > 0 {
            sweep_stale_cgroups(&sandbox, &config);
        }
        let cells_running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let audit = records.as_ref().map(Records::audit_sink);
        let auditor = audit
            .clone()
            .map(|a| Auditor::start(a, cells_running.clone()))
            .transpose()?;
        let snapshots = config
            .snapshots
            .clone()
            .unwrap_or_else(|| Arc::new(crate::snapshots::DirSnapshots::local(&config.data_dir)));
        Ok(Core {
            snapshots,
            zygote: Arc::new(ZygoteSlot::new()),
            config,
            sandbox,
            kernel_dir: std::sync::Mutex::new(None),
            records,
            audit,
            auditor,
            cells_running,
            ledger: Arc::default(),
            images,
            network,
            mcp_tools: Default::default(),
            light_zygote: Arc::new(ZygoteSlot::new()),
            third_party: Default::default(),
            one_shots: Default::default(),
        })
    }

    /// A new workspace at `path` for a session: on disk where the host allows it.
    pub(crate) fn create_workspace(
        &self,
        path: &Path,
        size_bytes: u64,
        lease: runcell_sandbox::UidLease,
    ) -> Result<Workspace, EngineError> {
        match &self.images {
            Some(images) => images.create(path, size_bytes, lease),
            None => Workspace::create(path, size_bytes, lease),
        }
        .map_err(workspace_error)
    }

    /// Takes over the workspace a dead process left at `path` (mounted still, or only its
    /// image after a reboot).
    pub(crate) fn adopt_workspace(
        &self,
        path: &Path,
        lease: runcell_sandbox::UidLease,
    ) -> Result<Workspace, runcell_sandbox::WorkspaceError> {
        match &self.images {
            Some(images) => images.adopt(path, lease),
            None => Workspace::adopt(path, lease),
        }
    }

    /// The store sessions are recorded in, if they are.
    pub(crate) fn session_store(&self) -> Option<&dyn runcell_store::DomainStore> {
        self.records.as_ref().and_then(Records::of_sessions)
    }

    /// Every finished execution passes here, before its caller sees it.
    pub(crate) fn audit(
        &self,
        owner: &str,
        execution: &Execution,
        code: &str,
    ) -> Result<(), EngineError> {
        match &self.audit {
            Some(a) => a.record(owner, execution, code).map_err(EngineError::from),
            None => Ok(()),
        }
    }

    /// [`Core::audit`] through the batched writer, waiting for the record: runs that finish
    /// together (a batch's, concurrent `POST /v1/execute`s) share one commit instead of paying
    /// one each, and nothing is acknowledged before it is recorded (DESIGN.md §9). Gives the
    /// execution back.
    pub(crate) fn audit_shared(
        &self,
        owner: &str,
        execution: Execution,
        code: &str,
    ) -> Result<Execution, EngineError> {
        let Some(a) = &self.auditor else {
            return Ok(execution);
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        a.record(
            owner.to_owned(),
            execution,
            code.to_owned(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv()
            .unwrap_or_else(|_| Err(crate::error::RecordError::NoAnswer.into()))
    }

    /// Like [`Core::audit`] without waiting: `then` gets the execution back once it is
    /// recorded (at once when nothing records).
    pub(crate) fn audit_then(
        &self,
        owner: String,
        execution: Execution,
        code: String,
        then: Reply,
    ) {
        match &self.auditor {
            Some(a) => a.record(owner, execution, code, then),
            None => then(Ok(execution)),
        }
    }

    pub(crate) fn cell_options(&self) -> CellOptions {
        CellOptions {
            output_cap: crate::limits::OUTPUT_CAP_BYTES,
            ..CellOptions::default()
        }
    }

    pub(crate) fn resolve_session_limits(
        &self,
        req: &LimitsRequest,
    ) -> Result<SessionLimits, EngineError> {
        self.config.limits.resolve(req)
    }

    /// The tenant's policy, from the store sessions are recorded in (none: no quota).
    pub(crate) fn tenant_policy(
        &self,
        owner: &str,
    ) -> Result<crate::limits::TenantPolicy, EngineError> {
        match self.session_store() {
            Some(store) => crate::records::tenant_policy(store, owner).map_err(|source| {
                // A database that cannot answer now (restarting, cut off, or this node's
                // lease lapsed) is the store's word (503), not a broken policy.
                match source.downcast::<runcell_store::StoreError>() {
                    Ok(e)
                        if e.is_unavailable()
                            || matches!(*e, runcell_store::StoreError::Fenced(_)) =>
                    {
                        EngineError::Store(*e)
                    }
                    Ok(e) => EngineError::TenantPolicy {
                        owner: owner.to_owned(),
                        source: e,
                    },
                    Err(source) => EngineError::TenantPolicy {
                        owner: owner.to_owned(),
                        source,
                    },
                }
            }),
            None => Ok(Default::default()),
        }
    }

    /// The kernel code's host directory, written on first use.
    pub(crate) fn kernel_dir(&self) -> Result<PathBuf, EngineError> {
        let mut dir = self.kernel_dir.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = &*dir {
            return Ok(d.clone());
        }
        let d = write_kernel(&self.config.data_dir)?;
        *dir = Some(d.clone());
        Ok(d)
    }

    /// The sandbox for `program` on `workspace` under `limits` (see [`crate::launch::launch`]).
    pub(crate) fn launch<'w>(
        &self,
        program: Program<'_>,
        workspace: &'w Workspace,
        limits: &SessionLimits,
        extra_env: &[(String, String)],
        network: bool,
    ) -> Result<Launch<'w>, EngineError> {
        let kernel_dir = || self.kernel_dir();
        let host = Host {
            python_runtime: self.config.python_runtime.as_deref(),
            kernel_dir: &kernel_dir,
            trust_dir: self.network.trust_dir(),
            pip_index_url: self.network.pip_index_url(),
        };
        crate::launch::launch(&host, program, workspace, limits, extra_env, network)
    }

    /// Whether Python sessions are meant to come from a zygote: preloading is configured and
    /// there is a runtime to preload from.
    fn zygote_enabled(&self) -> bool {
        self.config.preload.is_some() && self.config.python_runtime.is_some()
    }

    pub(crate) fn zygote_status(&self) -> ZygoteStatus {
        if !self.zygote_enabled() {
            return ZygoteStatus::Off;
        }
        self.zygote.status()
    }

    /// The live zygote, if there is one. Otherwise (re)starts it in the background when due and
    /// returns `None`: the caller starts cold this time.
    pub(crate) fn zygote(self: &Arc<Self>) -> Option<Arc<Zygote>> {
        if !self.zygote_enabled() {
            return None;
        }
        let core = Arc::clone(self);
        self.zygote.live_or_start(move || core.start_zygote())
    }

    /// Marks the zygote as unusable after a failed fork, so the next session restarts it.
    pub(crate) fn zygote_failed(&self, error: String) {
        self.zygote.failed(error);
    }

    /// Waits (up to `timeout`) for the zygote to be ready; for tests and benchmarks.
    pub(crate) fn wait_zygote(self: &Arc<Self>, timeout: Duration) -> ZygoteStatus {
        let end = std::time::Instant::now() + timeout;
        loop {
            let _ = self.zygote();
            let status = self.zygote_status();
            if !matches!(status, ZygoteStatus::Starting) || std::time::Instant::now() >= end {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The live light zygote (nothing preloaded but the kernel module), if the one-shot pool
    /// runs and it is ready; otherwise (re)starts it in the background when due.
    pub(crate) fn light_zygote(self: &Arc<Self>) -> Option<Arc<Zygote>> {
        if !self.zygote_enabled() || !self.one_shots.active() {
            return None;
        }
        let core = Arc::clone(self);
        self.light_zygote.live_or_start(move || {
            core.start_zygote_with(
                crate::zygote::LIGHT_PRELOAD
                    .iter()
                    .map(|m| m.to_string())
                    .collect(),
                false,
            )
        })
    }

    /// The light zygote's pid while it is ready.
    pub(crate) fn light_zygote_pid(&self) -> Option<u32> {
        self.light_zygote.live().map(|z| z.pid())
    }

    /// The runtime's site-packages names (see [`Core::third_party`]).
    pub(crate) fn third_party(&self) -> &std::collections::HashSet<String> {
        self.third_party.get_or_init(|| {
            self.config
                .python_runtime
                .as_ref()
                .and_then(|rt| {
                    let version = crate::zygote::python_version(rt).ok()?;
                    Some(crate::oneshot_pool::site_packages_names(rt, &version))
                })
                .unwrap_or_default()
        })
    }

    fn start_zygote(&self) -> Result<Zygote, String> {
        self.start_zygote_with(
            self.config.preload.clone().unwrap_or_default(),
            self.config.merge_session_pages,
        )
    }

    /// A zygote preloading `preload`; `merge_pages`: its heap marked for KSM
    /// (`--merge-session-pages`, sessions only: a one-shot lives too briefly to be merged).
    fn start_zygote_with(&self, preload: Vec<String>, merge_pages: bool) -> Result<Zygote, String> {
        let runtime = self
            .config
            .python_runtime
            .as_ref()
            .ok_or("no Python runtime")?;
        let version = crate::zygote::python_version(runtime)?;
        let kernel_dir = self.kernel_dir().map_err(|e| chain(&e))?;
        let config = crate::launch::zygote_config(
            runtime,
            kernel_dir,
            &version,
            preload,
            merge_pages,
            self.config.workspace_mount_dirs(),
        );
        Zygote::start(&self.config.init_exe, &config, crate::zygote::START_TIMEOUT)
            .map_err(|e| chain(&e))
    }

    /// Starts a kernel for `language` in a new sandbox on `workspace`; says how it started
    /// (`Start::Cold` asks never to fork from the zygote).
    pub(crate) fn start_kernel(
        self: &Arc<Self>,
        workspace: &Workspace,
        language: Language,
        limits: &SessionLimits,
        extra_env: &[(String, String)],
        start: Start,
        egress: Option<&runcell_egress::SessionEgress>,
    ) -> Result<(Kernel, Start), EngineError> {
        let (mut kernel, how) =
            self.start_kernel_sandbox(workspace, language, limits, extra_env, start, egress)?;
        if let Some(egress) = egress {
            // Pid 1 made the socket before the kernel started, which it has (it is ready).
            let serving = kernel
                .egress_listener(KERNEL_READY_TIMEOUT)
                .map_err(EngineError::sandbox)
                .and_then(|l| {
                    egress
                        .serve(l)
                        .map_err(|e| EngineError::unavailable(runcell_sandbox::SandboxError::Io(e)))
                })?;
            kernel.keep_alongside(Box::new(serving));
        }
        Ok((kernel, how))
    }

    fn start_kernel_sandbox(
        self: &Arc<Self>,
        workspace: &Workspace,
        language: Language,
        limits: &SessionLimits,
        extra_env: &[(String, String)],
        start: Start,
        egress: Option<&runcell_egress::SessionEgress>,
    ) -> Result<(Kernel, Start), EngineError> {
        let launch = self.launch(
            Program::Kernel(language),
            workspace,
            limits,
            extra_env,
            egress.is_some(),
        )?;
        // The zygote's BLAS runs one thread (it is fixed when numpy loads): sessions granted
        // more than one CPU start cold, with a BLAS pool their size.
        // A cold start is the session's own interpreter: its own hash secret and address-space
        // layout, which every fork of one zygote shares (docs/sandbox.md).
        if language == Language::Python
            && launch.limits.cpu_millis <= 1000
            && start == Start::Zygote
        {
            if let Some(zygote) = self.zygote() {
                match Kernel::start_in(&self.sandbox, &zygote, &launch, KERNEL_READY_TIMEOUT) {
                    Ok(k) => return Ok((k, Start::Zygote)),
                    // Slower, never broken: a cold start follows, and a zygote that could not
                    // fork, or whose fork never became a kernel, is restarted. Other failures
                    // (the cgroup, descriptors) are the host's; the cold start meets them too.
                    Err(
                        e @ (runcell_kernel::KernelError::Start(
                            runcell_sandbox::SandboxError::Zygote(_),
                        )
                        | runcell_kernel::KernelError::NotReady(_)),
                    ) => self.zygote_failed(chain(&e)),
                    Err(e) => {
                        tracing::warn!(error = %chain(&e), "zygote start failed; starting cold")
                    }
                }
            }
        }
        Kernel::start(&self.sandbox, &launch, KERNEL_READY_TIMEOUT)
            .map(|k| (k, Start::Cold))
            .map_err(EngineError::sandbox)
    }
}

/// One-shot workspaces whose runcell process was killed before it could clean up: their uid
/// lease is free again (nobody holds its lock), so nobody uses them. Unmount and remove them.
/// Returns how many it removed.
fn sweep_stale_one_shots(config: &EngineConfig) -> usize {
    let Ok(dir) = fs::read_dir(config.workspaces_dir()) else {
        return 0;
    };
    let mut removed = 0;
    let leases = config.run_dir.join("uids");
    for entry in dir.flatten() {
        let path = entry.path();
        let one_shot = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("ex_"));
        let Some(uid) = one_shot
            .then(|| runcell_sandbox::Workspace::owner_of(&path))
            .flatten()
        else {
            continue;
        };
        let Ok(lease) = runcell_sandbox::UidLease::acquire_uid(&leases, uid) else {
            continue; // in use by a running `runcell run`
        };
        match runcell_sandbox::Workspace::adopt(&path, lease) {
            Ok(ws) => drop(ws), // unmounts and removes it
            Err(_) => {
                let _ = fs::remove_dir_all(&path);
            }
        }
        tracing::info!(path = %path.display(), "removed a stale one-shot workspace");
        removed += 1;
    }
    removed
}

/// Empty run cgroups left by a killed supervisor (their uid lease is free): removed.
pub(crate) fn sweep_stale_cgroups(sandbox: &Sandbox, config: &EngineConfig) -> usize {
    let leases = config.run_dir.join("uids");
    let removed = sandbox
        .cgroups()
        .sweep_stale(&|uid| runcell_sandbox::UidLease::acquire_uid(&leases, uid).is_ok());
    if removed > 0 {
        tracing::info!(removed, "removed run cgroups left by a killed runcell");
    }
    removed
}

/// A workspace that could not be made: no room in the data dir for its mount point, or the
/// host cannot give one now.
pub(crate) fn workspace_error(e: runcell_sandbox::WorkspaceError) -> EngineError {
    match &e {
        runcell_sandbox::WorkspaceError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::StorageFull =>
        {
            tracing::warn!(error = %chain(&e), "the data dir is full");
            no_space("create")
        }
        _ => EngineError::unavailable(e),
    }
}

fn create_dir(dir: &Path) -> Result<(), EngineError> {
    fs::create_dir_all(dir).map_err(|source| EngineError::Io {
        action: "create",
        path: dir.to_owned(),
        source,
    })
}

/// Writes the embedded kernels where sandboxes can bind them: a directory named after their
/// content's hash, so a new runcell never runs an old kernel file and concurrent servers agree.
fn write_kernel(data_dir: &Path) -> Result<PathBuf, EngineError> {
    use std::os::unix::fs::PermissionsExt;
    // The programs and the modules they load from beside them (see KERNEL_FILES).
    let files = runcell_kernel::KERNEL_FILES;
    let all: Vec<u8> = files
        .iter()
        .flat_map(|(name, code)| [name.as_bytes(), b"\0", code.as_bytes(), b"\0"].concat())
        .collect();
    let dir = data_dir.join("kernel").join(crate::short_hash(&all));
    let current = files
        .iter()
        .all(|(name, code)| fs::read(dir.join(name)).ok().as_deref() == Some(code.as_bytes()));
    if current {
        return Ok(dir);
    }
    create_dir(&dir)?;
    for (name, code) in files {
        let file = dir.join(name);
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        fs::write(&tmp, code).map_err(io_error("write", &tmp))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644))
            .map_err(io_error("chmod", &tmp))?;
        fs::rename(&tmp, &file).map_err(io_error("rename", &file))?;
    }
    // The sandbox user reads them through the "other" bits of every directory on the way.
    for d in [data_dir.join("kernel"), dir.clone()] {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755))
            .map_err(io_error("chmod", &d))?;
    }
    Ok(dir)
}
