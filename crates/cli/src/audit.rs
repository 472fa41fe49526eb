//! The audit key files every command uses, and `runcell audit checkpoint|public-key|verify
//! --checkpoint`: signed checkpoints made and checked on the data dir, no server needed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;

use anyhow::{bail, Context};
use runcell_store::audit::keys::{self, CHAIN_KEY_FILE, SIGNING_KEY_FILE};
use runcell_store::audit::signed::{AuditPublicKey, AuditSigner, Checkpoint};
use runcell_store::{Expected, Store};

/// Where the audit keys are, when not in `<data dir>/keys/`, and the database, when not
/// the data dir's SQLite file (the global flags).
#[derive(Debug, Default, Clone)]
pub struct KeyFiles {
    pub chain: Option<PathBuf>,
    pub signing: Option<PathBuf>,
    pub database: Option<String>,
}

static KEY_FILES: OnceLock<KeyFiles> = OnceLock::new();

/// Set once from the command line, before any command runs.
pub fn set_key_files(files: KeyFiles) {
    let _ = KEY_FILES.set(files);
}

fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("runcell.db")
}

fn chain_key_file(data_dir: &Path) -> PathBuf {
    KEY_FILES
        .get()
        .and_then(|k| k.chain.clone())
        .unwrap_or_else(|| keys::default_dir(&db_path(data_dir)).join(CHAIN_KEY_FILE))
}

pub fn signing_key_file(data_dir: &Path) -> PathBuf {
    KEY_FILES
        .get()
        .and_then(|k| k.signing.clone())
        .unwrap_or_else(|| keys::default_dir(&db_path(data_dir)).join(SIGNING_KEY_FILE))
}

/// The database (`--database`, or the data dir's SQLite file), its audit chain keyed with the
/// chain key file.
pub fn open_store(data_dir: &Path) -> anyhow::Result<Store> {
    open_store_as(data_dir, None)
}

/// [`open_store`] for `runcell serve`: on PostgreSQL the store is node `node_url`'s (or, without
/// one, this host's and data dir's), which registers and beats, and owns the sessions it makes.
pub fn open_serving_store(data_dir: &Path, node_url: Option<&str>) -> anyhow::Result<Store> {
    if KEY_FILES.get().and_then(|k| k.database.as_ref()).is_none() {
        if node_url.is_some() {
            return Err(crate::args::invalid(
                "--node-url needs --database postgres://... (nodes share a PostgreSQL database)",
            ));
        }
        return open_store(data_dir);
    }
    let node = match node_url {
        Some(url) => url.to_owned(),
        None => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}:{}", host.trim(), data_dir.display())
        }
    };
    open_store_as(data_dir, Some(&node))
}

fn open_store_as(data_dir: &Path, node: Option<&str>) -> anyhow::Result<Store> {
    if let Some(url) = KEY_FILES.get().and_then(|k| k.database.as_deref()) {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(crate::args::invalid(
                "--database must be a PostgreSQL URL (postgres://...); without it runcell uses \
                 SQLite in the data dir",
            ));
        }
        let key = chain_key_file(data_dir);
        return match node {
            Some(node) => Store::open_postgres_node(url, &key, node),
            None => Store::open_postgres(url, &key),
        }
        .context("cannot open the PostgreSQL database");
    }
    Store::open_keyed(
        &db_path(data_dir),
        runcell_store::Durability::default(),
        &chain_key_file(data_dir),
    )
    .context("cannot open the database")
}

/// The checkpoint signing key, created if missing.
pub fn signer(data_dir: &Path) -> anyhow::Result<AuditSigner> {
    let path = signing_key_file(data_dir);
    AuditSigner::load_or_create(&path).context("cannot load the audit signing key")
}

/// `runcell audit checkpoint`: one signed checkpoint, a JSON line on stdout.
pub fn checkpoint(data_dir: &Path, tenant: Option<&str>) -> anyhow::Result<ExitCode> {
    let store = open_store(data_dir)?;
    let signer = signer(data_dir)?;
    let cp = signer.checkpoint(&*store, tenant)?;
    println!("{}", serde_json::to_string(&cp)?);
    Ok(ExitCode::SUCCESS)
}

/// `runcell audit public-key`: the key checkpoints are signed with, to publish.
pub fn public_key(data_dir: &Path) -> anyhow::Result<ExitCode> {
    let pk = signer(data_dir)?.public_key();
    println!(
        "{}",
        serde_json::json!({"algorithm": "ed25519", "public_key": pk.to_hex(), "key_id": pk.id()})
    );
    Ok(ExitCode::SUCCESS)
}

/// A public key given as 64 hex characters, or a file holding them (or the JSON
/// `runcell audit public-key` and `GET /v1/audit/public-key` print).
pub fn parse_public_key(arg: &str) -> anyhow::Result<AuditPublicKey> {
    if let Some(pk) = AuditPublicKey::from_hex(arg) {
        return Ok(pk);
    }
    let text = std::fs::read_to_string(arg).with_context(|| {
        format!("--public-key {arg:?} is neither 64 hex characters nor a readable file")
    })?;
    let text = text.trim();
    let hex = if text.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(text).with_context(|| format!("{arg}: not JSON"))?;
        v["public_key"].as_str().unwrap_or_default().to_owned()
    } else {
        text.to_owned()
    };
    AuditPublicKey::from_hex(&hex)
        .with_context(|| format!("{arg}: not an Ed25519 public key (64 hex characters)"))
}

/// Every checkpoint in `file`: one per line (a JSON object, or a server log line ending in
/// one); blank lines skipped.
fn read_checkpoints(file: &Path) -> anyhow::Result<Vec<(usize, Checkpoint)>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the checkpoint file {}", file.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some(start) = line.find('{') else {
            bail!("{}:{}: not a checkpoint", file.display(), i + 1);
        };
        let cp: Checkpoint = serde_json::from_str(&line[start..])
            .with_context(|| format!("{}:{}: not a checkpoint", file.display(), i + 1))?;
        out.push((i + 1, cp));
    }
    if out.is_empty() {
        bail!("{}: no checkpoint in the file", file.display());
    }
    Ok(out)
}

/// `runcell audit verify [--checkpoint FILE [--public-key KEY]]`: the chains verify, and (with
/// checkpoints) still extend every checkpoint in the file, each signed by the public key.
pub fn verify(
    data_dir: &Path,
    tenant: Option<&str>,
    checkpoint: Option<&Path>,
    public_key: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let store = open_store(data_dir)?;
    let mut expected: Vec<Expected> = Vec::new();
    let mut checkpoints = 0usize;
    if let Some(file) = checkpoint {
        let pk = match public_key {
            Some(arg) => parse_public_key(arg)?,
            None => {
                let path = signing_key_file(data_dir);
                if !path.exists() {
                    bail!(
                        "no public key to check the checkpoints with: pass --public-key (this data \
                         dir has no signing key at {})",
                        path.display()
                    );
                }
                eprintln!(
                    "note: checking signatures with this data dir's own signing key; pass \
                     --public-key with the published key so a replaced key is caught too"
                );
                AuditSigner::load(&path)?.public_key()
            }
        };
        for (line, cp) in read_checkpoints(file)? {
            if let Err(why) = pk.verify(&cp) {
                let reason = format!("checkpoint {}:{line} rejected: {why}", file.display());
                println!(
                    "{}",
                    serde_json::json!({"ok": false, "checked": 0, "checkpoints": checkpoints, "error": reason})
                );
                eprintln!("audit verification failed: {reason}");
                return Ok(ExitCode::from(1));
            }
            checkpoints += 1;
            expected.extend(cp.expected());
        }
    }
    let report = store.verify_extends(tenant, &expected)?;
    let mut out = serde_json::to_value(&report)?;
    if checkpoint.is_some() {
        out["checkpoints"] = checkpoints.into();
    }
    println!("{out}");
    if !report.ok {
        if let Some(b) = &report.first_broken {
            eprintln!(
                "audit chain broken for tenant {} at {}: {}",
                b.tenant,
                if b.execution_id.is_empty() {
                    "-"
                } else {
                    &b.execution_id
                },
                b.reason
            );
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
