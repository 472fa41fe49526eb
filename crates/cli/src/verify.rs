//! `runcell verify FILE [STATEMENT]`: checks a file against its signed provenance statement
//! (`GET /v1/sessions/{id}/files/{path}?provenance`) and the server's published audit key.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use runcell_store::audit::provenance::Provenance;
use runcell_store::audit::signed::AuditPublicKey;

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The file to check.
    file: PathBuf,
    /// Its provenance statement, as `?provenance` returned it (default: FILE.provenance.json).
    statement: Option<PathBuf>,
    /// The Ed25519 public key the statement must be signed with: 64 hex characters, or a file
    /// holding them or the JSON of `GET /v1/audit/public-key` / `runcell audit public-key`.
    #[arg(long, value_name = "KEY", conflicts_with = "server")]
    public_key: Option<String>,
    /// Fetch the public key from this server's `GET /v1/audit/public-key` instead.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The API key for `--server` (the server asks for one once any key exists).
    #[arg(
        long,
        env = "RUNCELL_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
}

pub fn verify(data_dir: &Path, args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let content = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let statement_path = args.statement.clone().unwrap_or_else(|| {
        let mut name = args.file.clone().into_os_string();
        name.push(".provenance.json");
        PathBuf::from(name)
    });
    let text = std::fs::read_to_string(&statement_path).with_context(|| {
        format!(
            "cannot read the provenance statement {} (get it with GET \
             /v1/sessions/ID/files/PATH?provenance, or pass it as the second argument)",
            statement_path.display()
        )
    })?;
    let statement: Provenance = serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "{} is not a runcell provenance statement",
            statement_path.display()
        )
    })?;
    let key = public_key(data_dir, &args)?;
    let report = |ok: bool, reason: Option<&str>| {
        let mut v = serde_json::json!({
            "ok": ok, "file": args.file.display().to_string(), "path": statement.path,
            "sha256": statement.sha256, "execution_id": statement.execution_id,
            "session_id": statement.session_id, "tenant": statement.tenant,
            "time": statement.time, "key_id": statement.key_id,
        });
        if let Some(r) = reason {
            v["error"] = r.into();
        }
        v
    };
    match key.verify_provenance(&statement, &content) {
        Ok(()) => {
            println!("{}", report(true, None));
            eprintln!(
                "verified: {} is {} as execution {} left it ({}), signed by key {}",
                args.file.display(),
                statement.path,
                statement.execution_id,
                statement.time,
                statement.key_id
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            println!("{}", report(false, Some(&why)));
            eprintln!("verification failed: {why}");
            Ok(ExitCode::from(1))
        }
    }
}

fn public_key(data_dir: &Path, args: &VerifyArgs) -> anyhow::Result<AuditPublicKey> {
    if let Some(arg) = &args.public_key {
        return crate::audit::parse_public_key(arg);
    }
    if let Some(url) = &args.server {
        return fetch_public_key(url, args.api_key.as_deref());
    }
    let path = crate::audit::signing_key_file(data_dir);
    if !path.exists() {
        bail!(
            "no public key to check the statement with: pass --public-key or --server (this \
             data dir has no signing key at {})",
            path.display()
        );
    }
    eprintln!(
        "note: checking the signature with this data dir's own signing key; pass --public-key \
         or --server so a replaced key is caught too"
    );
    Ok(runcell_store::audit::signed::AuditSigner::load(&path)?.public_key())
}

fn fetch_public_key(server: &str, api_key: Option<&str>) -> anyhow::Result<AuditPublicKey> {
    let url = format!("{}/v1/audit/public-key", server.trim_end_matches('/'));
    let mut req = reqwest::blocking::Client::new().get(&url);
    if let Some(k) = api_key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().with_context(|| format!("cannot reach {url}"))?;
    let status = resp.status();
    let body = resp.text().with_context(|| format!("cannot read {url}"))?;
    if !status.is_success() {
        bail!("{url} answered {status}: {}", body.trim());
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("{url}: not JSON"))?;
    AuditPublicKey::from_hex(v["public_key"].as_str().unwrap_or_default())
        .with_context(|| format!("{url}: no Ed25519 public key in {}", body.trim()))
}
