//! `runcell keys create|list|update|revoke` and `runcell audit list|show|verify|checkpoint|public-key` (and `replay`, `replay.rs`):
//! operator commands on the database, no server needed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use runcell_store::Store;

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Create an API key; the key is printed once, alone on the last line of stdout.
    Create {
        #[arg(long)]
        name: String,
        /// The tenant the key acts for (sessions, files, executions are per tenant).
        #[arg(long, default_value = "default")]
        tenant: String,
        /// `runcell` (`rc_...`), or `e2b` (`e2b_` and hex digits: the E2B SDKs accept only
        /// keys of that shape as `E2B_API_KEY`; docs/e2b.md).
        #[arg(long, default_value = "runcell", value_parser = ["runcell", "e2b"])]
        format: String,
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        settings: TenantArgs,
    },
    /// List keys (never their secret), with their tenant's quota and default start.
    List,
    /// Change a key's approval default or egress bound, or the quota or default start of its tenant (every
    /// key of the tenant shares those).
    Update {
        /// The key's id, or the name of the only active key so named.
        key_id_or_name: String,
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        settings: TenantArgs,
    },
    /// Revoke a key by id or name.
    Revoke { id_or_name: String },
}

/// What is the key's own, not its tenant's.
#[derive(Debug, Default, clap::Args)]
pub struct KeyArgs {
    /// Whether the agent endpoints' cells (the chat, /anthropic, /openai/v1, /gemini,
    /// /mistral) wait for `POST /v1/approvals/{id}` when a request made with this key does
    /// not say: `always` (a floor: a request asking for `never` is refused with 403), `never`
    /// (requests may still ask for `always`), or `none` (no default: as `never`).
    #[arg(long, value_name = "always|never|none", value_parser = ["always", "never", "none"])]
    approval: Option<String>,
    /// The domains any network asked for with this key may name (comma-separated,
    /// repeatable; `pypi.org`, `*.example.com`, an IP literal), within the server's own
    /// `serve --egress-allow`: a key only narrows the server's bound (a pattern beyond it
    /// allows nothing more), so a request passes when every domain it names is in both.
    /// `none`: no network with this key; `server`: no bound of the key's own (the server's,
    /// as for a key made without this flag).
    #[arg(long, value_delimiter = ',', value_name = "DOMAIN,...|none|server")]
    egress_allow: Option<Vec<String>>,
}

impl KeyArgs {
    /// The change asked for: `Some(None)` clears the default.
    fn approval(&self) -> Option<Option<runcell_store::ApprovalMode>> {
        self.approval
            .as_deref()
            .map(runcell_store::ApprovalMode::parse)
    }
}

/// The change of egress bound asked for: `Some(None)` clears the key's own bound (the
/// server's applies), `Some(Some([]))` allows no network; the patterns checked and normalized.
fn egress_change(args: &KeyArgs) -> anyhow::Result<Option<Option<Vec<String>>>> {
    let Some(list) = &args.egress_allow else {
        return Ok(None);
    };
    match list.as_slice() {
        [word] if word == "server" => return Ok(Some(None)),
        [word] if word == "none" => return Ok(Some(Some(Vec::new()))),
        _ => {}
    }
    if let Some(word) = list.iter().find(|p| *p == "server" || *p == "none") {
        bail!("--egress-allow {word} stands alone: it cannot be listed with domains");
    }
    runcell_engine::KeyEgressBound::normalize(list)
        .map(|b| Some(Some(b)))
        .map_err(|e| anyhow::anyhow!("--egress-allow: {e}"))
}

/// A key's egress bound, as `keys list` shows it: `server` (none of its own), `none` (no
/// network), or its patterns.
fn show_egress(k: &runcell_store::KeyInfo) -> String {
    match &k.egress_allow {
        None => "server".to_owned(),
        Some(b) if b.is_empty() => "none".to_owned(),
        Some(b) => b.join(","),
    }
}

/// Sets key `id`'s egress bound as `change` says and tells the operator what it now is.
fn set_egress(
    store: &Store,
    id: &str,
    change: Option<Vec<String>>,
) -> anyhow::Result<runcell_store::KeyInfo> {
    let k = store
        .set_key_egress(id, change.as_deref())?
        .with_context(|| format!("the key {id} vanished"))?;
    let what = match &k.egress_allow {
        None => "the server's bound (serve --egress-allow)".to_owned(),
        Some(b) if b.is_empty() => "no network".to_owned(),
        Some(b) => format!("{} (within the server's --egress-allow)", b.join(", ")),
    };
    eprintln!("key {} ({}): egress {what}", k.id, k.name);
    Ok(k)
}

/// A key's approval default, as `keys list` shows it.
fn show_approval(k: &runcell_store::KeyInfo) -> &'static str {
    k.approval
        .map_or("none", runcell_store::ApprovalMode::as_str)
}

/// A tenant's quota and default start, read at every session start (the API's, MCP's and the
/// chat's): past the quota a start is refused with 400 `limit_exceeded` until one of its
/// sessions ends.
#[derive(Debug, Default, clap::Args)]
pub struct TenantArgs {
    /// At most this many live sessions for the tenant; `none` removes the quota.
    #[arg(long, value_name = "N|none", value_parser = parse_quota)]
    max_sessions: Option<Quota>,
    /// At most this much memory (MiB) in the tenant's live sessions' limits together;
    /// `none` removes the quota.
    #[arg(long, value_name = "MB|none", value_parser = parse_quota)]
    max_memory_mb: Option<Quota>,
    /// How the tenant's Python sessions start when they do not say: `cold` (an interpreter
    /// of their own: own hash secret and address-space layout) or `zygote`; `none` restores
    /// the server's default (the zygote).
    #[arg(long, value_name = "zygote|cold|none", value_parser = ["zygote", "cold", "none"])]
    start: Option<String>,
}

/// A quota value on the command line: a number, or `none` to clear it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota(Option<u64>);

fn parse_quota(s: &str) -> Result<Quota, String> {
    match s {
        "none" => Ok(Quota(None)),
        n => n
            .parse::<u64>()
            .map(|v| Quota(Some(v)))
            .map_err(|_| format!("{n:?} is neither a whole number nor `none`")),
    }
}

impl TenantArgs {
    fn change(&self) -> runcell_store::TenantChange {
        runcell_store::TenantChange {
            max_sessions: self.max_sessions.map(|q| q.0),
            max_memory_mb: self.max_memory_mb.map(|q| q.0),
            start: self
                .start
                .as_ref()
                .map(|s| (s != "none").then(|| s.clone())),
        }
    }

    fn is_empty(&self) -> bool {
        self.max_sessions.is_none() && self.max_memory_mb.is_none() && self.start.is_none()
    }
}

/// `max_sessions=5 max_memory_mb=none start=cold`, as `keys list` shows a tenant's settings.
fn show_tenant(q: &runcell_store::TenantSettings) -> String {
    let v = |x: Option<u64>| x.map_or("none".to_owned(), |n| n.to_string());
    format!(
        "max_sessions={} max_memory_mb={} start={}",
        v(q.max_sessions),
        v(q.max_memory_mb),
        q.start.as_deref().unwrap_or("default")
    )
}

#[derive(Debug, clap::Subcommand)]
pub enum AuditCommand {
    /// Recent executions of a tenant, newest first.
    List {
        #[arg(long, default_value = "default")]
        tenant: String,
        #[arg(long)]
        session: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One execution, as JSON, with its code.
    Show {
        id: String,
        #[arg(long, default_value = "default")]
        tenant: String,
    },
    /// Re-check every tenant's hash chain; non-zero exit when a record was edited or deleted.
    Verify {
        #[arg(long)]
        tenant: Option<String>,
        /// Also prove the log still extends every signed checkpoint in FILE (one JSON per
        /// line, as `serve --audit-checkpoint-file` and `audit checkpoint` write them).
        #[arg(long, value_name = "FILE")]
        checkpoint: Option<PathBuf>,
        /// The published Ed25519 public key the checkpoints must be signed with: 64 hex
        /// characters, or a file holding them or the JSON of `audit public-key` (default: this
        /// data dir's own signing key).
        #[arg(long, value_name = "FILE|HEX", requires = "checkpoint")]
        public_key: Option<String>,
    },
    /// Print a signed checkpoint of every tenant's chain (or one tenant's), one JSON line, to
    /// keep somewhere the database's editors cannot reach.
    Checkpoint {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print the Ed25519 public key checkpoints are signed with, to publish.
    PublicKey,
    /// Re-run a recorded session's cells in a fresh sandbox and report, cell by cell, whether
    /// stdout, the main result, the error and the produced files match the record (exit code
    /// 1 when one differs).
    Replay(crate::replay::ReplayArgs),
}

fn open(data_dir: &Path) -> anyhow::Result<Store> {
    crate::audit::open_store(data_dir)
}

pub fn keys(data_dir: &Path, cmd: KeysCommand) -> anyhow::Result<ExitCode> {
    let store = open(data_dir)?;
    match cmd {
        KeysCommand::Create {
            name,
            tenant,
            format,
            key: key_args,
            settings,
        } => {
            let format = match format.as_str() {
                "e2b" => runcell_store::KeyFormat::E2b,
                _ => runcell_store::KeyFormat::Runcell,
            };
            // Checked before the key exists: a bad pattern makes no key.
            let egress = egress_change(&key_args)?;
            let (mut info, key) = store.create_key_in_format(&name, &tenant, format)?;
            if let Some(change) = egress {
                info = set_egress(&store, &info.id, change)?;
            }
            // Set before the key is shown: nobody can use it without its default meanwhile.
            if let Some(mode) = key_args.approval() {
                info = store
                    .set_key_approval(&info.id, mode)?
                    .with_context(|| format!("the key {} vanished as it was made", info.id))?;
            }
            eprintln!(
                "created key {} ({}) for tenant {}, approval {}; it is shown once:",
                info.id,
                info.name,
                info.tenant,
                show_approval(&info)
            );
            if !settings.is_empty() {
                let q = store.update_tenant(&info.tenant, &settings.change())?;
                eprintln!("tenant {}: {}", q.tenant, show_tenant(&q));
            }
            println!("{key}");
        }
        KeysCommand::Update {
            key_id_or_name,
            key: key_args,
            settings,
        } => {
            if settings.is_empty() && key_args.approval.is_none() && key_args.egress_allow.is_none()
            {
                bail!(
                    "nothing to update: give --approval (always, never or none), --egress-allow (domains, none or server), --max-sessions, --max-memory-mb (a number, or none) or --start"
                );
            }
            let egress = egress_change(&key_args)?;
            let key = store
                .find_key(&key_id_or_name)?
                .with_context(|| format!("no key matches {key_id_or_name:?}"))?;
            if let Some(change) = egress {
                set_egress(&store, &key.id, change)?;
            }
            if let Some(mode) = key_args.approval() {
                let k = store
                    .set_key_approval(&key.id, mode)?
                    .with_context(|| format!("no key matches {key_id_or_name:?}"))?;
                eprintln!("key {} ({}): approval {}", k.id, k.name, show_approval(&k));
            }
            if !settings.is_empty() {
                let q = store.update_tenant(&key.tenant, &settings.change())?;
                eprintln!(
                    "tenant {} (every key of the tenant): {}",
                    q.tenant,
                    show_tenant(&q)
                );
            }
        }
        KeysCommand::List => {
            let quotas: std::collections::HashMap<String, runcell_store::TenantSettings> = store
                .list_tenants()?
                .into_iter()
                .map(|q| (q.tenant.clone(), q))
                .collect();
            for k in store.list_keys()? {
                let quota = quotas.get(&k.tenant).cloned().unwrap_or_default();
                let state = match k.revoked_at {
                    Some(t) => format!("revoked {}", t.to_rfc3339()),
                    None => "active".into(),
                };
                println!(
                    "{}  {:20}  tenant={:12}  {}…  created {}  {}  approval={}  egress={}  {}",
                    k.id,
                    k.name,
                    k.tenant,
                    k.prefix,
                    k.created_at.to_rfc3339(),
                    state,
                    show_approval(&k),
                    show_egress(&k),
                    show_tenant(&quota)
                );
            }
        }
        KeysCommand::Revoke { id_or_name } => {
            if !store.revoke_key(&id_or_name)? {
                bail!("no active key matches {id_or_name:?}");
            }
            eprintln!("revoked {id_or_name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn audit(data_dir: &Path, cmd: AuditCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        AuditCommand::List {
            tenant,
            session,
            limit,
        } => {
            let store = open(data_dir)?;
            let (rows, _) = store.list_executions(&tenant, session.as_deref(), limit, None)?;
            for r in rows {
                let first_line = r.code.lines().next().unwrap_or("");
                println!(
                    "{:>5}  {}  {}  {:11}  {:22}  {}",
                    r.seq,
                    r.created_at.to_rfc3339(),
                    r.execution_id,
                    r.status,
                    r.session_id.as_deref().unwrap_or("-"),
                    first_line.chars().take(60).collect::<String>()
                );
            }
        }
        AuditCommand::Show { id, tenant } => {
            let store = open(data_dir)?;
            let row = store
                .get_execution(&tenant, &id)?
                .with_context(|| format!("no execution {id} for tenant {tenant}"))?;
            let mut v: serde_json::Value = serde_json::from_str(&row.execution_json)?;
            v["code"] = row.code.into();
            v["audit"] = serde_json::json!({"seq": row.seq, "hash": row.hash});
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        AuditCommand::Verify {
            tenant,
            checkpoint,
            public_key,
        } => {
            return crate::audit::verify(
                data_dir,
                tenant.as_deref(),
                checkpoint.as_deref(),
                public_key.as_deref(),
            )
        }
        AuditCommand::Checkpoint { tenant } => {
            return crate::audit::checkpoint(data_dir, tenant.as_deref())
        }
        AuditCommand::PublicKey => return crate::audit::public_key(data_dir),
        AuditCommand::Replay(args) => return crate::replay::replay(data_dir, args),
    }
    Ok(ExitCode::SUCCESS)
}
