//! `runcell serve`: the HTTP API on one node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use runcell_agent::{ProviderConfig, ProviderKind};
use runcell_sandbox::doctor::{self, State};

use crate::args::invalid;
use crate::config::ServeFile;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1:8080]. Beyond loopback, API keys are required
    /// (`runcell keys create`).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A TOML file with any of these settings, keyed by flag name with `_` for `-`
    /// (`max_memory_mb = 4096`); flags given here win over it (docs/operations.md).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Modules the zygote imports before forking Python sessions (comma-separated)
    /// [default: numpy,pandas,matplotlib,matplotlib.pyplot,sklearn.ensemble,cloudpickle].
    #[arg(long, value_delimiter = ',')]
    preload: Option<Vec<String>>,
    /// Start every Python session cold, without the preloaded zygote.
    #[arg(long)]
    no_zygote: bool,
    /// Keep session workspaces in memory (tmpfs) instead of filesystem images on disk: lost at
    /// a reboot, and counted in each session's memory limit (docs/operations.md).
    #[arg(long)]
    workspaces_in_memory: bool,
    /// Let the host's KSM daemon merge the identical memory pages of Python sessions (those
    /// they copied from the zygote: ~19 of 21 MiB after a pandas + matplotlib cell). Needs KSM
    /// running (`echo 1 > /sys/kernel/mm/ksm/run`); costs the daemon's CPU, and lets a
    /// session learn by timing whether another holds a given page: for sessions that trust
    /// each other (docs/operations.md).
    #[arg(long)]
    merge_session_pages: bool,
    /// Python sessions kept started ahead of demand (forked from the zygote), so creating one
    /// with the default limits and no environment takes no fork; 0 turns this off [default: 2].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=64))]
    warm_sessions: Option<u16>,
    /// Python one-shot sandboxes (`POST /v1/execute`, `/v1/batch`) kept made ahead of demand
    /// from each zygote, each used by one run and destroyed after it; 0 makes every one-shot's
    /// sandbox on demand, from the sessions' zygote only [default: 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=64))]
    warm_one_shots: Option<u16>,
    /// Runs one `POST /v1/batch` may hold (1-1000) [default: 1000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1000))]
    max_batch_runs: Option<u16>,
    /// Test cases one one-shot run may carry (0-100) [default: 100].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=100))]
    max_tests_per_run: Option<u16>,
    /// Turns the web page's chat and the vendor-compatible APIs (/anthropic, /openai/v1, /gemini,
    /// /mistral) on: the model API the agent loop talks to (openai: any Chat Completions
    /// endpoint; anthropic: Messages; gemini: generateContent). The key comes from
    /// OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY, as for `runcell ask`.
    #[arg(long, value_name = "PROVIDER", value_parser = crate::ask::parse_provider, env = "RUNCELL_AGENT_PROVIDER")]
    agent_provider: Option<ProviderKind>,
    #[arg(long, value_name = "M", env = "RUNCELL_AGENT_MODEL",
        help = format!("The chat's model (default: {}); named, it also answers every /anthropic request whatever model that names, which otherwise goes to the provider as is", runcell_agent::default_models()))]
    agent_model: Option<String>,
    /// The chat's API base URL, e.g. http://localhost:11434/v1 for Ollama (no key needed then).
    #[arg(long, value_name = "URL", env = "RUNCELL_AGENT_BASE_URL")]
    agent_base_url: Option<String>,
    /// Model replies at most per chat question [default: 12].
    #[arg(long, value_name = "N")]
    agent_max_steps: Option<usize>,
    /// CPU scheduling policy of the server and its sessions: `batch` (woken threads do not
    /// preempt running ones: fewer context switches, more executions per second) or
    /// `normal` (the default policy: lower latency when sessions keep the CPUs busy)
    /// [default: batch].
    #[arg(long, value_enum, value_name = "POLICY")]
    scheduling: Option<Scheduling>,
    /// Host names the server also answers to (comma-separated, repeatable), e.g. the public
    /// name a reverse proxy forwards: `NAME` on any port, `NAME:PORT` on that port. Without
    /// it, a request naming any host but localhost or the listener's address, with the
    /// listener's port, is refused (403: DNS rebinding).
    #[arg(long, value_delimiter = ',', value_name = "HOST[:PORT]")]
    allowed_hosts: Vec<runcell_server::AllowedHost>,
    /// Domains a session's network allowlist may name (comma-separated, repeatable):
    /// `pypi.org`, `*.example.com` (any name below it), `*` (any); beyond them a session is
    /// refused (400 `limit_exceeded`). Without it no session gets a network (docs/sandbox.md).
    #[arg(long, value_delimiter = ',', value_name = "DOMAIN")]
    egress_allow: Vec<String>,
    /// An address range the egress proxy may connect to although it is loopback, private,
    /// link-local (cloud metadata) or this host's own, e.g. 10.1.0.0/16 for an internal
    /// mirror (comma-separated, repeatable) [default: none].
    #[arg(long, value_delimiter = ',', value_name = "CIDR")]
    egress_allow_cidr: Vec<String>,
    /// A PEM file of roots the egress proxy also trusts when it verifies the real host of a
    /// domain with a secret header (whose HTTPS it opens), beside webpki's roots and this
    /// host's store: a private CA, or a test server's (repeatable).
    #[arg(long, value_name = "FILE")]
    egress_ca_file: Vec<PathBuf>,
    /// The package index pip uses in sessions with a network (PIP_INDEX_URL), e.g. a mirror's
    /// `https://mirror.internal/simple`; its domain must still be in the session's allowlist
    /// [default: PyPI].
    #[arg(long, value_name = "URL")]
    pip_index_url: Option<String>,
    /// Serves /metrics on this address, without a key, and not on --listen (where, once keys
    /// exist, it otherwise needs one).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Take a signed audit checkpoint after every N executions recorded; 0 turns this off
    /// [default: 1000].
    #[arg(long, value_name = "N")]
    audit_checkpoint_every: Option<u64>,
    /// Take a signed audit checkpoint at most this many seconds after the last one when
    /// executions were recorded since; 0 turns this off [default: 600].
    #[arg(long, value_name = "S")]
    audit_checkpoint_interval_s: Option<u64>,
    /// Append every checkpoint the server takes to FILE, one JSON per line (each is also
    /// logged); keep it, or ship it, where the database's editors cannot reach.
    #[arg(long, value_name = "FILE")]
    audit_checkpoint_file: Option<PathBuf>,
    /// Connections served at once; past it a few more are answered 503 and the rest wait in
    /// the listen backlog. Default: a quarter of the descriptors left beside the server's
    /// own, at most 1024; sessions get the rest (the session cap is derived from it).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
    /// Live sessions this node runs at most (below the cap its descriptors allow): past it a
    /// create is refused (503), and in a cluster new sessions are placed on other nodes.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions: Option<u32>,
    /// Seconds a client has to send a request's head, from connecting or its first byte
    /// [default: 30].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout: Option<u64>,
    /// Seconds an idle keep-alive connection stays open between requests [default: 60].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    keep_alive_timeout: Option<u64>,
    /// Seconds a request body may take before --body-min-rate applies [default: 30].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    body_timeout: Option<u64>,
    /// Bytes per second a request body must average after --body-timeout (each byte buys
    /// 1/RATE s more): slower uploads are cut with 408 [default: 8192].
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    body_min_rate: Option<u64>,
    /// This node's URL as the other nodes on the same `--database` reach it (e.g.
    /// http://runcell-0.runcell-nodes:8080): its id in the database, where it registers and
    /// beats every 2 s; its sessions read as `dead` on every node 10 s after it stops
    /// [default: the host name and data dir].
    #[arg(long, value_name = "URL", env = "RUNCELL_NODE_URL")]
    node_url: Option<String>,
    /// A file holding the secret all nodes on the same `--database` share (32 bytes or more,
    /// e.g. `openssl rand -hex 32`): it signs the requests they forward to each other, in
    /// place of the client's key. Required on PostgreSQL; `RUNCELL_CLUSTER_SECRET` may hold
    /// the secret itself instead.
    #[arg(long, value_name = "FILE", env = "RUNCELL_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// A directory every node mounts (NFS, a ReadWriteMany volume) for durable sessions'
    /// snapshots and, beside them, their workspace files: a live node resumes a dead node's
    /// sessions from there [default: the data dir's snapshots/, this node's alone].
    #[arg(
        long,
        value_name = "PATH",
        env = "RUNCELL_SNAPSHOT_DIR",
        conflicts_with = "snapshot_store"
    )]
    snapshot_dir: Option<PathBuf>,
    /// `s3://BUCKET[/PREFIX]`: --snapshot-dir's part in S3-compatible object storage, with the
    /// AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL
    /// for MinIO and the like; an http:// endpoint is allowed as given).
    #[arg(long, value_name = "URL", env = "RUNCELL_SNAPSHOT_STORE")]
    snapshot_store: Option<String>,
    /// An MCP server whose tools sessions' code may call (`from runcell_tools.mcp import
    /// NAME`), repeatable: `NAME=COMMAND ARGS...` (stdio: a program runcell starts on this host,
    /// the line split into words as a shell would, never run by one) or `NAME=URL` (streamable
    /// HTTP). NAME is a Python identifier. No tenant may use it until --mcp-server-tenants
    /// names one (docs/tools.md).
    #[arg(long, value_name = "NAME=COMMAND...|NAME=URL")]
    mcp_server: Vec<String>,
    /// The tenants whose sessions may use an MCP server: `NAME=TENANT,...`, or `NAME=*` for
    /// every tenant (repeatable) [default: none]. Without keys the tenant is `default`.
    #[arg(long, value_name = "NAME=TENANT,...")]
    mcp_server_tenants: Vec<String>,
    #[command(flatten)]
    limits: LimitArgs,
}

/// The server's limits: the most a session may ask for (a request over one is refused with
/// 400 `limit_exceeded`, never clamped), what it gets when it does not ask, and the memory
/// all sandboxes together may commit (past it a start is 503 `unavailable`).
#[derive(Debug, Default, clap::Args)]
struct LimitArgs {
    /// Most memory a session may ask for, MiB [default: --max-committed-memory-mb].
    #[arg(long, value_name = "MB")]
    max_memory_mb: Option<u64>,
    /// Most CPUs a session may ask for [default: the host's CPUs].
    #[arg(long, value_name = "N")]
    max_cpu: Option<f64>,
    /// Most processes and threads a session may ask for [default: 4096].
    #[arg(long, value_name = "N")]
    max_pids: Option<u64>,
    /// Largest workspace a session may ask for, MiB (a RAM-backed tmpfs) [default: the host's
    /// memory less a reserve].
    #[arg(long, value_name = "MB")]
    max_disk_mb: Option<u64>,
    /// Longest time limit an execution may ask for, seconds [default: 3600].
    #[arg(long, value_name = "S")]
    max_exec_timeout_s: Option<u64>,
    /// Longest idle timeout a session may ask for, seconds [default: 86400].
    #[arg(long, value_name = "S")]
    max_idle_timeout_s: Option<u64>,
    /// Longest idle time before pausing a session may ask for, seconds [default: 86400].
    #[arg(long, value_name = "S")]
    max_pause_after_s: Option<u64>,
    /// Longest time a paused session may ask to be kept, seconds [default: 7776000, 90 days].
    #[arg(long, value_name = "S")]
    max_expire_after_s: Option<u64>,
    /// Memory all live sandboxes together may be granted (sessions, warm ones, one-shot
    /// runs), MiB; a start past it is refused, never overcommitted [default: the host's
    /// memory less a tenth, at least 1 GiB].
    #[arg(long, value_name = "MB")]
    max_committed_memory_mb: Option<u64>,
    /// A session's memory when it does not ask, MiB [default: 1024].
    #[arg(long, value_name = "MB")]
    default_memory_mb: Option<u64>,
    /// A session's CPUs when it does not ask [default: 1].
    #[arg(long, value_name = "N")]
    default_cpu: Option<f64>,
    /// A session's processes and threads when it does not ask [default: 128].
    #[arg(long, value_name = "N")]
    default_pids: Option<u64>,
    /// A session's workspace size when it does not ask, MiB [default: 1024].
    #[arg(long, value_name = "MB")]
    default_disk_mb: Option<u64>,
    /// An execution's time limit when it does not ask, seconds [default: 30].
    #[arg(long, value_name = "S")]
    default_exec_timeout_s: Option<u64>,
    /// A session's idle timeout when it does not ask, seconds [default: 1200].
    #[arg(long, value_name = "S")]
    default_idle_timeout_s: Option<u64>,
    /// Seconds idle before a session pauses, when it does not ask [default: 300].
    #[arg(long, value_name = "S")]
    default_pause_after_s: Option<u64>,
    /// Seconds a paused session is kept, when it does not ask [default: 2592000, 30 days].
    #[arg(long, value_name = "S")]
    default_expire_after_s: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scheduling {
    Batch,
    Normal,
}

/// The server's limit policy: flags, then the file, then what the host can give.
fn limit_policy(
    flags: &LimitArgs,
    file: &ServeFile,
) -> anyhow::Result<runcell_engine::LimitPolicy> {
    use runcell_engine::{HostCapacity, LimitPolicy, SessionLimits};
    let host = HostCapacity::detect();
    let mut p = LimitPolicy::for_host(host);
    p.server = true;
    if let Some(v) = flags
        .max_committed_memory_mb
        .or(file.max_committed_memory_mb)
    {
        p.committed_memory_mb = v;
        // One session may have all of a smaller budget, not more.
        p.max.memory_mb = p.max.memory_mb.min(v);
    }
    let m = &mut p.max;
    m.memory_mb = flags
        .max_memory_mb
        .or(file.max_memory_mb)
        .unwrap_or(m.memory_mb);
    m.cpu = flags.max_cpu.or(file.max_cpu).unwrap_or(m.cpu);
    m.pids = flags.max_pids.or(file.max_pids).unwrap_or(m.pids);
    m.disk_mb = flags.max_disk_mb.or(file.max_disk_mb).unwrap_or(m.disk_mb);
    m.exec_timeout_s = flags
        .max_exec_timeout_s
        .or(file.max_exec_timeout_s)
        .unwrap_or(m.exec_timeout_s);
    m.idle_timeout_s = flags
        .max_idle_timeout_s
        .or(file.max_idle_timeout_s)
        .unwrap_or(m.idle_timeout_s);
    m.pause_after_s = flags
        .max_pause_after_s
        .or(file.max_pause_after_s)
        .unwrap_or(m.pause_after_s);
    m.expire_after_s = flags
        .max_expire_after_s
        .or(file.max_expire_after_s)
        .unwrap_or(m.expire_after_s);
    // A default nobody set is DESIGN's, lowered to its maximum; one that was set is checked.
    let d = SessionLimits::DESIGN_DEFAULTS.within(m);
    p.defaults = SessionLimits {
        memory_mb: flags
            .default_memory_mb
            .or(file.default_memory_mb)
            .unwrap_or(d.memory_mb),
        cpu: flags.default_cpu.or(file.default_cpu).unwrap_or(d.cpu),
        pids: flags.default_pids.or(file.default_pids).unwrap_or(d.pids),
        disk_mb: flags
            .default_disk_mb
            .or(file.default_disk_mb)
            .unwrap_or(d.disk_mb),
        exec_timeout_s: flags
            .default_exec_timeout_s
            .or(file.default_exec_timeout_s)
            .unwrap_or(d.exec_timeout_s),
        idle_timeout_s: flags
            .default_idle_timeout_s
            .or(file.default_idle_timeout_s)
            .unwrap_or(d.idle_timeout_s),
        pause_after_s: flags
            .default_pause_after_s
            .or(file.default_pause_after_s)
            .unwrap_or(d.pause_after_s),
        expire_after_s: flags
            .default_expire_after_s
            .or(file.default_expire_after_s)
            .unwrap_or(d.expire_after_s),
    };
    p.validate().map_err(|e| invalid(format!("limits: {e}")))?;
    // The operator may know better (a shared config file, a host about to grow); say so.
    if p.committed_memory_mb > host.memory_mb {
        tracing::warn!(
            committed_mb = p.committed_memory_mb,
            host_mb = host.memory_mb,
            "max_committed_memory_mb is more than this host's memory: sandboxes can be OOM-killed"
        );
    }
    if p.max.cpu > host.cpus as f64 {
        tracing::warn!(
            max_cpu = p.max.cpu,
            cpus = host.cpus,
            "max_cpu is more than this host's CPUs"
        );
    }
    Ok(p)
}

/// The MCP servers of the file's `[mcp_servers.NAME]` tables, then of `--mcp-server` (which
/// replaces a table of the same name), with their tenants (`--mcp-server-tenants` wins over a
/// table's `tenants`).
fn mcp_servers(
    flags: &[String],
    tenant_flags: &[String],
    file: &ServeFile,
) -> anyhow::Result<Vec<runcell_server::mcp_servers::McpServerConfig>> {
    use runcell_server::mcp_servers::{self as mcp, McpServerConfig, TenantAccess};
    let mut servers: std::collections::BTreeMap<String, McpServerConfig> = Default::default();
    for (name, table) in file.mcp_servers.iter().flatten() {
        let transport = match (&table.command, &table.url) {
            (Some(command), None) => {
                let words = match command {
                    crate::config::CommandLine::Words(w) => w.clone(),
                    crate::config::CommandLine::Line(line) => shlex_words(name, line)?,
                };
                mcp::stdio(name, words)?
            }
            (None, Some(url)) => mcp::http(name, url)?,
            _ => {
                return Err(invalid(format!(
                    "[mcp_servers.{name}] needs exactly one of command and url"
                )))
            }
        };
        let mut config = McpServerConfig::new(name, transport)?;
        if let Some(t) = &table.tenants {
            config.tenants = TenantAccess::from_names(t.iter().cloned())?;
        }
        if let Some(s) = table.timeout_s {
            config = config.with_call_timeout(s)?;
        }
        if let Some(n) = table.max_concurrency {
            config = config.with_max_concurrency(n)?;
        }
        servers.insert(name.clone(), config);
    }
    for flag in flags {
        let config = McpServerConfig::parse_flag(flag)?;
        if flags
            .iter()
            .filter(|f| f.split('=').next().map(str::trim) == Some(config.name.as_str()))
            .count()
            > 1
        {
            return Err(mcp::McpConfigError::Duplicate(config.name).into());
        }
        servers.insert(config.name.clone(), config);
    }
    for flag in tenant_flags {
        let (name, access) = mcp::parse_tenants_flag(flag)?;
        let server = servers
            .get_mut(&name)
            .ok_or(mcp::McpConfigError::UnknownServer(name))?;
        server.tenants = access;
    }
    Ok(servers.into_values().collect())
}

/// A table's `command = "..."`, split as `--mcp-server` splits it.
fn shlex_words(name: &str, line: &str) -> anyhow::Result<Vec<String>> {
    // The same rule as the flag's: parse it as one.
    match runcell_server::mcp_servers::McpServerConfig::parse_flag(&format!("{name}={line}"))?
        .transport
    {
        runcell_server::mcp_servers::McpTransport::Stdio { program, mut args } => {
            args.insert(0, program);
            Ok(args)
        }
        runcell_server::mcp_servers::McpTransport::Http { .. } => Err(invalid(format!(
            "[mcp_servers.{name}] command is a URL: use url = \"{line}\""
        ))),
    }
}

/// `explicit_data_dir`: `--data-dir` or `RUNCELL_DATA_DIR`, which win over the file's.
pub fn serve(
    explicit_data_dir: Option<&Path>,
    default_data_dir: PathBuf,
    args: ServeArgs,
) -> anyhow::Result<ExitCode> {
    let file = match &args.config {
        Some(path) => ServeFile::read(path)?,
        None => ServeFile::default(),
    };
    let data_dir = match (explicit_data_dir, &file.data_dir) {
        (Some(dir), _) => dir.to_owned(),
        // Relative to the working directory, as `--data-dir` is.
        (None, Some(dir)) => crate::config::absolute_data_dir(dir)?,
        (None, None) => default_data_dir,
    };
    let data_dir = data_dir.as_path();
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let scheduling = match (args.scheduling, &file.scheduling) {
        (Some(s), _) => s,
        (None, Some(name)) => <Scheduling as clap::ValueEnum>::from_str(name, false)
            .map_err(|_| invalid(format!("scheduling {name:?}: batch or normal")))?,
        (None, None) => Scheduling::Batch,
    };
    let warm_sessions = args.warm_sessions.or(file.warm_sessions).unwrap_or(2);
    if warm_sessions > 64 {
        return Err(invalid("warm_sessions must be at most 64"));
    }
    let warm_one_shots = args.warm_one_shots.or(file.warm_one_shots).unwrap_or(4);
    if warm_one_shots > 64 {
        return Err(invalid("warm_one_shots must be at most 64"));
    }
    let max_batch_runs = args.max_batch_runs.or(file.max_batch_runs).unwrap_or(1000);
    if !(1..=1000).contains(&max_batch_runs) {
        return Err(invalid("max_batch_runs must be 1 to 1000"));
    }
    let max_tests_per_run = args
        .max_tests_per_run
        .or(file.max_tests_per_run)
        .unwrap_or(100);
    if max_tests_per_run > 100 {
        return Err(invalid("max_tests_per_run must be at most 100"));
    }
    let agent_provider = match (args.agent_provider, &file.agent_provider) {
        (Some(k), _) => Some(k),
        (None, Some(name)) => Some(
            crate::ask::parse_provider(name)
                .map_err(|e| invalid(format!("agent_provider: {e}")))?,
        ),
        (None, None) => None,
    };
    let agent_model = args.agent_model.or(file.agent_model.clone());
    let agent_base_url = args.agent_base_url.or(file.agent_base_url.clone());
    if agent_provider.is_none() && (agent_model.is_some() || agent_base_url.is_some()) {
        return Err(invalid(
            "--agent-model and --agent-base-url need --agent-provider",
        ));
    }
    let agent_max_steps = args.agent_max_steps.or(file.agent_max_steps).unwrap_or(12);
    let no_zygote = args.no_zygote || file.no_zygote.unwrap_or(false);
    let preload = args.preload.or(file.preload.clone()).unwrap_or_else(|| {
        runcell_engine::DEFAULT_PRELOAD
            .iter()
            .map(|m| m.to_string())
            .collect()
    });
    let limits = limit_policy(&args.limits, &file)?;
    let mcp_servers = std::sync::Arc::new(
        mcp_servers(&args.mcp_server, &args.mcp_server_tenants, &file)
            .and_then(|c| Ok(runcell_server::mcp_servers::McpServers::new(c)?))
            // Each a configuration mistake: the usage exit code, the message naming the server.
            .map_err(|e| invalid(format!("{e:#}")))?,
    );
    for server in mcp_servers.configs() {
        if server.tenants == runcell_server::mcp_servers::TenantAccess::Only(Default::default()) {
            tracing::warn!(
                server = %server.name,
                "MCP server configured but no tenant may use it: add --mcp-server-tenants {}=TENANT (or =*)",
                server.name
            );
        }
    }
    let mut allowed_hosts = args.allowed_hosts;
    for name in file.allowed_hosts.iter().flatten() {
        allowed_hosts.push(
            name.parse()
                .map_err(|e| invalid(format!("allowed_hosts {name:?}: {e}")))?,
        );
    }
    // The other nodes forward requests to this one under its node URL's name.
    if let Some(node) = &args.node_url {
        let authority = node
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid("--node-url must be http://HOST:PORT"))?;
        allowed_hosts.push(
            authority
                .parse()
                .map_err(|e| invalid(format!("--node-url {node:?}: {e}")))?,
        );
    }
    // Before any thread exists: every thread and process started from here on inherits it.
    if let Err(e) = runcell_sandbox::set_batch_scheduling(scheduling == Scheduling::Batch) {
        tracing::warn!(error = %e, policy = ?scheduling, "cannot set the scheduling policy");
    }
    let open_files = match runcell_sandbox::raise_nofile_soft_limit() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open files limit");
            1024
        }
    };
    // Sessions and connections share the descriptors: each gets a budget, so a flood of
    // connections never leaves a session's kernel without one.
    let capacity = runcell_server::Capacity::derive(
        open_files,
        warm_sessions.into(),
        args.max_connections
            .or(file.max_connections)
            .map(|n| n as usize),
    )
    .map_err(invalid)?;
    tracing::info!(
        open_files,
        max_connections = capacity.max_connections,
        max_sessions = capacity.max_sessions,
        "capacity"
    );
    let serve_options = runcell_server::ServeOptions {
        max_connections: capacity.max_connections,
        header_timeout: std::time::Duration::from_secs(
            args.header_timeout.or(file.header_timeout).unwrap_or(30),
        ),
        keep_alive_timeout: std::time::Duration::from_secs(
            args.keep_alive_timeout
                .or(file.keep_alive_timeout)
                .unwrap_or(60),
        ),
        body_timeout: std::time::Duration::from_secs(
            args.body_timeout.or(file.body_timeout).unwrap_or(30),
        ),
        body_min_rate: args.body_min_rate.or(file.body_min_rate).unwrap_or(8192),
    };
    // Every layer's state, for the operator: degraded layers are named, missing mandatory
    // layers stop the server.
    for layer in doctor::check() {
        match layer.state {
            State::Available => tracing::info!(layer = layer.name, "{}", layer.detail),
            State::Degraded | State::Missing if !layer.mandatory => {
                tracing::warn!(
                    layer = layer.name,
                    state = layer.state.as_str(),
                    "{}",
                    layer.detail
                )
            }
            _ => tracing::error!(
                layer = layer.name,
                state = layer.state.as_str(),
                "{}",
                layer.detail
            ),
        }
    }
    let store = crate::audit::open_serving_store(data_dir, args.node_url.as_deref())?;
    if store.is_exclusive() {
        tracing::warn!(
            data_dir = %data_dir.display(),
            "the data dir's filesystem is full: the database is open for this server alone \
             (runcell keys and runcell audit wait until it stops); reads are served, writes get \
             507 insufficient_storage until space is freed, then work again; restart the \
             server afterwards to share the database again"
        );
    }
    let signer = std::sync::Arc::new(crate::audit::signer(data_dir)?);
    let cluster_secret = cluster_secret(args.cluster_secret_file.as_deref())?;
    if store.node_id().is_some() && cluster_secret.is_none() {
        bail!(
            "nodes on a shared --database forward requests to each other signed with a secret \
             they share: --cluster-secret-file FILE (or RUNCELL_CLUSTER_SECRET), e.g. from \
             `openssl rand -hex 32`"
        );
    }
    let checkpoint_interval_s = args
        .audit_checkpoint_interval_s
        .or(file.audit_checkpoint_interval_s)
        .unwrap_or(600);
    let checkpoints = runcell_server::audit::CheckpointPolicy {
        every: args
            .audit_checkpoint_every
            .or(file.audit_checkpoint_every)
            .unwrap_or(1000),
        interval: (checkpoint_interval_s > 0)
            .then(|| std::time::Duration::from_secs(checkpoint_interval_s)),
        file: args
            .audit_checkpoint_file
            .clone()
            .or(file.audit_checkpoint_file.clone()),
    };
    let has_keys = store.has_active_keys()?;
    if !has_keys && !listen.ip().is_loopback() {
        bail!(
            "refusing to listen on {listen} without API keys: create one with `runcell keys create --name NAME`, or listen on 127.0.0.1"
        );
    }
    // A misconfigured chat (no key, say) stops the server now rather than failing each question.
    let chat = match agent_provider {
        Some(kind) => {
            if agent_max_steps == 0 {
                return Err(invalid("--agent-max-steps must be at least 1"));
            }
            // A model the operator named answers every vendor-prefix request whatever model
            // it names; otherwise the request's model goes to the provider.
            let pin_model = agent_model.is_some();
            let provider = ProviderConfig::from_env(kind, agent_model, agent_base_url)
                .context("cannot configure the chat's model provider")?;
            tracing::info!(provider = kind.name(), model = %provider.model, base_url = %provider.base_url, pin_model, "chat and vendor APIs enabled");
            Some((
                runcell_server::ChatConfig {
                    provider: provider.clone(),
                    max_steps: agent_max_steps,
                },
                runcell_server::VendorConfig {
                    provider,
                    pin_model,
                    max_steps: agent_max_steps,
                },
            ))
        }
        None => {
            tracing::info!("chat disabled: no --agent-provider");
            None
        }
    };
    let preload = (!no_zygote).then_some(preload);
    if args.merge_session_pages {
        warn_unless_ksm_runs();
    }
    tracing::info!(
        committed_memory_mb = limits.committed_memory_mb,
        max = ?limits.max,
        defaults = ?limits.defaults,
        "session limits"
    );
    let snapshots = snapshot_store(
        data_dir,
        args.snapshot_dir.clone(),
        args.snapshot_store.as_deref(),
    )?;
    if snapshots.is_some() && store.node_id().is_none() {
        tracing::warn!("a shared snapshot store without nodes (--database postgres://...): no other node will resume this node's sessions");
    }
    let engine = crate::engines::serving_engine(
        data_dir,
        &store,
        preload,
        limits,
        !args.workspaces_in_memory,
        runcell_engine::NetworkConfig {
            allow_domains: [
                args.egress_allow,
                file.egress_allow.clone().unwrap_or_default(),
            ]
            .concat(),
            allow_cidrs: [
                args.egress_allow_cidr,
                file.egress_allow_cidr.clone().unwrap_or_default(),
            ]
            .concat(),
            ca_files: [
                args.egress_ca_file,
                file.egress_ca_file.clone().unwrap_or_default(),
            ]
            .concat(),
            pip_index_url: args.pip_index_url.or_else(|| file.pip_index_url.clone()),
        },
        crate::engines::ServingExtras {
            // Every PNG and JPEG result carries a C2PA manifest signed by this server.
            image_signer: Some(crate::c2pa::image_signer(&signer)?),
            snapshots,
            merge_session_pages: args.merge_session_pages,
        },
    )?;
    engine.sweep_stale_cgroups();
    let max_sessions = match args.max_sessions.or(file.max_sessions) {
        Some(n) => capacity.max_sessions.min(n as usize),
        None => capacity.max_sessions,
    };
    engine.sessions().set_max_sessions(max_sessions);

    let (recovered, dead) = engine.sessions().recover_previous()?;
    if recovered + dead > 0 {
        tracing::warn!(
            recovered,
            dead,
            "sessions of a previous run: recovered ones have their files and a fresh kernel"
        );
    }
    // Only now: a warm session must not take the uid of a workspace being recovered.
    engine.sessions().start_warm_pool(warm_sessions.into());
    engine.start_one_shot_pool(warm_one_shots.into());
    engine.sessions().start_spare_workspaces();
    // `runcell run` on this data dir hands its runs to this server (crate::local).
    let local_socket = match crate::local::listen(engine.clone(), data_dir) {
        Ok(path) => Some(path),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "`runcell run` cannot use this server (it runs its programs itself)");
            None
        }
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("runcell-http")
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let metrics_listener = match args.metrics_listen.or(file.metrics_listen) {
            Some(at) => {
                let l = tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("cannot listen on {at} for metrics"))?;
                tracing::info!(addr = %l.local_addr()?, "metrics on their own listener");
                Some(l)
            }
            None => None,
        };
        if has_keys {
            tracing::info!(%addr, "runcell listening; API keys required");
        } else {
            tracing::warn!(%addr, "runcell listening without API keys (loopback only): anyone on this machine can run code");
        }
        // A node of a cluster is placeable once it serves: its room is in the store first.
        store.report_room(engine.sessions().room());
        eprintln!("runcell serving on http://{addr}");
        tracing::info!(
            "E2B SDKs: E2B_API_URL=http://{addr}/e2b E2B_SANDBOX_URL=http://{addr}/e2b/sandbox (docs/e2b.md)"
        );
        runcell_server::audit::spawn_checkpoints(store.clone(), signer.clone(), checkpoints);
        let mut state = runcell_server::state(engine.clone(), store, addr)
            .with_batch_limits(max_batch_runs.into(), max_tests_per_run.into())
            .with_allowed_hosts(allowed_hosts)
            .with_audit_signer(signer)
            .with_mcp_servers(mcp_servers.clone());
        mcp_servers.connect_in_background();
        if let Some((chat, vendor)) = chat {
            state = state.with_chat(chat).with_vendor(vendor);
        }
        if let Some(secret) = cluster_secret {
            state = state.with_cluster_secret(secret);
        }
        // A node of a cluster tells the others its room, for placing new sessions.
        runcell_server::spawn_room_reports(&state);
        let metrics = match metrics_listener {
            Some(l) => {
                let app = runcell_server::metrics_app(&state, l.local_addr()?);
                state = state.without_metrics();
                // Ends with the main listener: scrapes in flight need no draining.
                // A scraper or two: its few connections fit in the server's reserve.
                let options = runcell_server::ServeOptions {
                    max_connections: 16,
                    ..serve_options.clone()
                };
                Some(tokio::spawn(runcell_server::serve_with(
                    l,
                    app,
                    std::future::pending(),
                    options,
                )))
            }
            None => None,
        };
        let router = runcell_server::app(state);
        runcell_server::serve_with(listener, router, shutdown_signal(), serve_options).await?;
        if let Some(m) = metrics {
            m.abort();
        }
        tracing::info!("shutting down: ending sessions");
        if let Some(path) = &local_socket {
            // No new local runs; those in progress finish.
            let _ = std::fs::remove_file(path);
        }
        tokio::task::spawn_blocking(move || engine.sessions().shutdown()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    // Open MCP event streams would keep graceful shutdown waiting forever.
    runcell_server::mcp::end_streams();
}

/// The snapshot store `--snapshot-dir` or `--snapshot-store` names; none: the data dir's own.
fn snapshot_store(
    data_dir: &Path,
    dir: Option<PathBuf>,
    url: Option<&str>,
) -> anyhow::Result<Option<std::sync::Arc<dyn runcell_engine::snapshots::SnapshotStore>>> {
    if let Some(dir) = dir {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("--snapshot-dir {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), "snapshots kept in a directory the nodes share");
        return Ok(Some(std::sync::Arc::new(
            runcell_engine::snapshots::DirSnapshots::shared(dir),
        )));
    }
    let Some(url) = url else { return Ok(None) };
    let tmp = data_dir.join("tmp");
    std::fs::create_dir_all(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let store = crate::snapshot_store::ObjectSnapshots::open(url, tmp)?;
    tracing::info!(url, "snapshots kept in object storage the nodes share");
    Ok(Some(std::sync::Arc::new(store)))
}

/// The cluster secret from `--cluster-secret-file`, else `RUNCELL_CLUSTER_SECRET`, if either.
fn cluster_secret(
    file: Option<&std::path::Path>,
) -> anyhow::Result<Option<runcell_server::ClusterSecret>> {
    let (bytes, from) = match file {
        Some(f) => (
            std::fs::read(f)
                .map_err(|e| invalid(format!("--cluster-secret-file {}: {e}", f.display())))?,
            format!("--cluster-secret-file {}", f.display()),
        ),
        None => match std::env::var_os("RUNCELL_CLUSTER_SECRET") {
            Some(v) => (v.into_encoded_bytes(), "RUNCELL_CLUSTER_SECRET".to_owned()),
            None => return Ok(None),
        },
    };
    runcell_server::ClusterSecret::new(&bytes)
        .map(Some)
        .map_err(|e| invalid(format!("{from}: {e}")))
}

/// `--merge-session-pages` marks the memory; merging it is the host's KSM daemon's work, a
/// host-wide setting runcell leaves to the operator.
fn warn_unless_ksm_runs() {
    match std::fs::read_to_string("/sys/kernel/mm/ksm/run") {
        Ok(run) if run.trim() == "1" => {
            tracing::info!("session pages are marked mergeable; KSM runs on this host")
        }
        Ok(_) => tracing::warn!(
            "--merge-session-pages: KSM is not running on this host, so nothing is merged (echo 1 > /sys/kernel/mm/ksm/run)"
        ),
        Err(e) => tracing::warn!(error = %e, "--merge-session-pages: this kernel has no KSM, so nothing is merged"),
    }
}
