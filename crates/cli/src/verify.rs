//! `runcell verify FILE [STATEMENT]`: checks a file against its signed provenance statement
//! (`GET /v1/sessions/{id}/files/{path}?provenance`) and the server's published audit key,
//! and a PNG or JPEG's embedded C2PA manifest (result images, `?c2pa` copies) against the
//! server's C2PA CA (`GET /v1/audit/c2pa-ca`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use runcell_store::audit::provenance::Provenance;
use runcell_store::audit::signed::AuditPublicKey;

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The file to check.
    file: PathBuf,
    /// Its provenance statement, as `?provenance` returned it (default: FILE.provenance.json,
    /// when it exists; a PNG or JPEG with a C2PA manifest needs none).
    statement: Option<PathBuf>,
    /// The Ed25519 public key the statement must be signed with: 64 hex characters, or a file
    /// holding them or the JSON of `GET /v1/audit/public-key` / `runcell audit public-key`.
    #[arg(long, value_name = "KEY", conflicts_with = "server")]
    public_key: Option<String>,
    /// Fetch the public key from this server's `GET /v1/audit/public-key` instead (and the
    /// C2PA trust anchor from its `GET /v1/audit/c2pa-ca`).
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// The CA certificate (PEM file, as `GET /v1/audit/c2pa-ca` serves it) an embedded C2PA
    /// manifest's signing chain must end at.
    #[arg(long, value_name = "FILE")]
    c2pa_ca: Option<PathBuf>,
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
    let explicit = args.statement.is_some();
    let statement_path = args.statement.clone().unwrap_or_else(|| {
        let mut name = args.file.clone().into_os_string();
        name.push(".provenance.json");
        PathBuf::from(name)
    });
    let manifest = c2pa_probe(&content);
    // A statement named on the command line must be there; the default one only when the
    // file has no C2PA manifest to check instead.
    let statement = if explicit || statement_path.exists() || !matches!(manifest, Probe::Found(_)) {
        Some(read_statement(&statement_path, &manifest)?)
    } else {
        None
    };
    let c2pa = match &manifest {
        Probe::Found(mime) => Some(check_c2pa(data_dir, &args, mime, &content)?),
        Probe::Unreadable(why) => {
            eprintln!(
                "note: {} has no readable C2PA manifest ({why})",
                args.file.display()
            );
            None
        }
        Probe::None => None,
    };
    let mut v = serde_json::json!({ "file": args.file.display().to_string() });
    let mut ok = true;
    if let Some(statement) = &statement {
        let key = public_key(data_dir, &args)?;
        for (k, val) in [
            ("path", statement.path.as_str().into()),
            ("sha256", statement.sha256.as_str().into()),
            ("execution_id", statement.execution_id.as_str().into()),
            ("session_id", statement.session_id.clone().into()),
            ("tenant", statement.tenant.as_str().into()),
            ("time", statement.time.as_str().into()),
            ("key_id", statement.key_id.as_str().into()),
        ] {
            v[k] = val;
        }
        match key.verify_provenance(statement, &content) {
            Ok(()) => eprintln!(
                "verified: {} is {} as execution {} left it ({}), signed by key {}",
                args.file.display(),
                statement.path,
                statement.execution_id,
                statement.time,
                statement.key_id
            ),
            Err(why) => {
                eprintln!("verification failed: {why}");
                v["error"] = why.into();
                ok = false;
            }
        }
    }
    if let Some((report, trusted)) = c2pa {
        let r = &report;
        match (&r.runcell, trusted) {
            (Some(o), true) => eprintln!(
                "C2PA manifest: {}, signed by {} (trusted), execution {} of session {} \
                 (tenant {}), code SHA-256 {}, at {}",
                r.claim_generator.as_deref().unwrap_or("?"),
                r.issuer.as_deref().unwrap_or("?"),
                o.execution_id,
                o.session_id.as_deref().unwrap_or("-"),
                o.tenant,
                o.code_sha256,
                o.time
            ),
            _ => {
                let codes: Vec<&str> = r.failures.iter().map(|f| f.code.as_str()).collect();
                let why = match (&r.runcell, codes.is_empty()) {
                    (None, _) => format!(
                        "the C2PA manifest ({}) is not runcell's: it has no {} assertion",
                        r.state,
                        runcell_c2pa::ASSERTION
                    ),
                    (_, false) => format!("the C2PA manifest is {}: {}", r.state, codes.join(", ")),
                    (_, true) => format!("the C2PA manifest is {}", r.state),
                };
                eprintln!("verification failed: {why}");
                if v.get("error").is_none() {
                    v["error"] = why.into();
                }
                ok = false;
            }
        }
        v["c2pa"] = serde_json::to_value(&report)?;
    }
    v["ok"] = ok.into();
    println!("{v}");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What a first look for a C2PA manifest found.
enum Probe {
    /// A manifest, in an image of this type.
    Found(&'static str),
    /// A PNG or JPEG whose manifest (if any) cannot be read, and why.
    Unreadable(String),
    /// Not a PNG or JPEG, or one without a manifest.
    None,
}

fn c2pa_probe(content: &[u8]) -> Probe {
    let mime = if content.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if content.starts_with(&[0xff, 0xd8, 0xff]) {
        "image/jpeg"
    } else {
        return Probe::None;
    };
    match runcell_c2pa::read(mime, content, None) {
        Ok(Some(_)) => Probe::Found(mime),
        Ok(None) => Probe::None,
        Err(e) => Probe::Unreadable(e.to_string()),
    }
}

fn read_statement(path: &Path, manifest: &Probe) -> anyhow::Result<Provenance> {
    let text = std::fs::read_to_string(path).with_context(|| {
        let unreadable = match manifest {
            Probe::Unreadable(why) => format!("; its C2PA manifest cannot be read: {why}"),
            _ => String::new(),
        };
        format!(
            "cannot read the provenance statement {} (get it with GET \
             /v1/sessions/ID/files/PATH?provenance, or pass it as the second argument); the \
             file carries no C2PA manifest to check instead{unreadable}",
            path.display()
        )
    })?;
    serde_json::from_str(text.trim())
        .with_context(|| format!("{} is not a runcell provenance statement", path.display()))
}

/// The manifest's report, validated against the trust anchor, and whether it is runcell's
/// and trusted.
fn check_c2pa(
    data_dir: &Path,
    args: &VerifyArgs,
    mime: &str,
    content: &[u8],
) -> anyhow::Result<(runcell_c2pa::Report, bool)> {
    let anchor = trust_anchor(data_dir, args)?;
    let report = runcell_c2pa::read(mime, content, Some(&anchor))?
        .context("the C2PA manifest vanished between two reads of the same bytes")?;
    let trusted =
        report.state == "Trusted" && report.failures.is_empty() && report.runcell.is_some();
    Ok((report, trusted))
}

/// The CA a manifest's chain must end at: `--c2pa-ca`, the server's, or the data dir's own.
fn trust_anchor(data_dir: &Path, args: &VerifyArgs) -> anyhow::Result<String> {
    if let Some(path) = &args.c2pa_ca {
        return std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the C2PA CA certificate {}", path.display()));
    }
    if let Some(server) = &args.server {
        return fetch(server, "/v1/audit/c2pa-ca", args.api_key.as_deref());
    }
    let path = crate::audit::signing_key_file(data_dir);
    if !path.exists() {
        bail!(
            "no trust anchor to check the C2PA manifest with: pass --c2pa-ca or --server (this \
             data dir has no signing key at {})",
            path.display()
        );
    }
    eprintln!(
        "note: checking the C2PA manifest against this data dir's own CA; pass --c2pa-ca or \
         --server to check another server's"
    );
    let signer = runcell_store::audit::signed::AuditSigner::load(&path)?;
    Ok(crate::c2pa::credentials(&signer)?.ca_pem().to_owned())
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

/// The body of `GET {server}{path}`.
fn fetch(server: &str, path: &str, api_key: Option<&str>) -> anyhow::Result<String> {
    let url = format!("{}{path}", server.trim_end_matches('/'));
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
    Ok(body)
}

fn fetch_public_key(server: &str, api_key: Option<&str>) -> anyhow::Result<AuditPublicKey> {
    let body = fetch(server, "/v1/audit/public-key", api_key)?;
    let url = format!("{}/v1/audit/public-key", server.trim_end_matches('/'));
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("{url}: not JSON"))?;
    AuditPublicKey::from_hex(v["public_key"].as_str().unwrap_or_default())
        .with_context(|| format!("{url}: no Ed25519 public key in {}", body.trim()))
}
