//! `runcell keys create|list|revoke` and `runcell audit list|show|verify|checkpoint|public-key`:
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
    },
    /// List keys (never their secret).
    List,
    /// Revoke a key by id or name.
    Revoke { id_or_name: String },
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
}

fn open(data_dir: &Path) -> anyhow::Result<Store> {
    crate::audit::open_store(data_dir)
}

pub fn keys(data_dir: &Path, cmd: KeysCommand) -> anyhow::Result<ExitCode> {
    let store = open(data_dir)?;
    match cmd {
        KeysCommand::Create { name, tenant } => {
            let (info, key) = store.create_key(&name, &tenant)?;
            eprintln!(
                "created key {} ({}) for tenant {}; it is shown once:",
                info.id, info.name, info.tenant
            );
            println!("{key}");
        }
        KeysCommand::List => {
            for k in store.list_keys()? {
                let state = match k.revoked_at {
                    Some(t) => format!("revoked {}", t.to_rfc3339()),
                    None => "active".into(),
                };
                println!(
                    "{}  {:20}  tenant={:12}  {}…  created {}  {}",
                    k.id,
                    k.name,
                    k.tenant,
                    k.prefix,
                    k.created_at.to_rfc3339(),
                    state
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
    }
    Ok(ExitCode::SUCCESS)
}
