//! A session's network: none by default; with an allowlist, one egress proxy per session
//! (`runcell-egress`) reached through a socket on the sandbox's own loopback, and a record of
//! every connection in each Execution. The operator bounds what any session may ask.

use std::path::{Path, PathBuf};

use runcell_egress::{
    Authority, Cidr, DomainSecret, Egress, EgressLimits, Interception, PolicyBounds, SessionEgress,
};

use crate::error::{EngineError, Invalid, Limit};

mod key_bound;
pub(crate) mod policy;
pub use key_bound::KeyEgressBound;
pub use policy::{DomainSecretSpec, NetworkConfig, NetworkConnection, NetworkPolicy};

/// The loopback port of every sandbox's egress socket (each sandbox has a loopback of its own).
pub const EGRESS_PORT: u16 = 3128;
/// Where `pip install` puts packages in a session with a network policy: in its workspace (so
/// they survive restarts and pauses and count against its disk), on the kernel's `sys.path`
/// and on `PYTHONPATH`. Never the shared runtime, which is read-only anyway.
pub const PACKAGES_DIR: &str = "/workspace/.runcell/site-packages";
/// Where a sandbox with a network finds the certificates it trusts, read-only: runcell's
/// egress CA ([`CA_FILE`]) and the system's bundle with it ([`BUNDLE_FILE`]).
pub const TRUST_DIR: &str = "/opt/runcell/trust";
/// runcell's egress CA (PEM), what `NODE_EXTRA_CA_CERTS` names.
pub const CA_FILE: &str = "/opt/runcell/trust/runcell-egress-ca.pem";
/// The system's CA bundle and runcell's egress CA, what every other client is pointed at
/// (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `PIP_CERT`, `CURL_CA_BUNDLE`, ...).
pub const BUNDLE_FILE: &str = "/opt/runcell/trust/ca-bundle.pem";

/// The engine's side of egress: the bounds, and the proxy (started by the first session that
/// needs it).
#[derive(Debug)]
pub(crate) struct Network {
    bounds: PolicyBounds,
    egress: Egress,
    /// The host directory bound at [`TRUST_DIR`]; `None` when no session may have a network.
    trust_dir: Option<PathBuf>,
    pip_index_url: Option<String>,
}

impl Network {
    /// Where the server keeps its egress CA (the key never leaves it) and the trust files
    /// sandboxes get.
    fn egress_dir(data_dir: &Path) -> PathBuf {
        data_dir.join("egress")
    }

    pub(crate) fn new(config: &NetworkConfig, data_dir: &Path) -> Result<Network, EngineError> {
        let bad = |m: String| EngineError::InvalidRequest(Invalid::Policy(m));
        let domains = config
            .allow_domains
            .iter()
            .map(|d| {
                runcell_egress::DomainPattern::parse(d)
                    .map_err(|e| bad(format!("--egress-allow: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cidrs = config
            .allow_cidrs
            .iter()
            .map(|c| {
                c.parse::<Cidr>()
                    .map_err(|e| bad(format!("--egress-allow-cidr: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(url) = &config.pip_index_url {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(bad(format!(
                    "--pip-index-url {url:?}: an http:// or https:// URL"
                )));
            }
        }
        let limits = EgressLimits::default();
        // No session may have a network: nothing to trust, no CA to make.
        if domains.is_empty() {
            return Ok(Network {
                bounds: PolicyBounds { domains },
                egress: Egress::new(cidrs, limits),
                trust_dir: None,
                pip_index_url: config.pip_index_url.clone(),
            });
        }
        let dir = Network::egress_dir(data_dir);
        let authority = Authority::load_or_create(&dir.join("ca"))
            .map_err(|e| bad(format!("the egress CA: {e}")))?;
        let trust_dir = dir.join("trust");
        write_trust(&trust_dir, authority.cert_pem())
            .map_err(|e| bad(format!("cannot write {}: {e}", trust_dir.display())))?;
        let interception = Interception::new(authority, &config.ca_files)
            .map_err(|e| bad(format!("--egress-ca-file: {e}")))?;
        Ok(Network {
            bounds: PolicyBounds { domains },
            egress: Egress::intercepting(cidrs, limits, interception),
            trust_dir: Some(trust_dir),
            pip_index_url: config.pip_index_url.clone(),
        })
    }

    pub(crate) fn pip_index_url(&self) -> Option<&str> {
        self.pip_index_url.as_deref()
    }

    /// The host directory a sandbox with a network gets at [`TRUST_DIR`].
    pub(crate) fn trust_dir(&self) -> Option<&Path> {
        self.trust_dir.as_deref()
    }

    /// The proxy state of a session with `policy`, after checking it against the bounds;
    /// `None` for no network (nothing is started).
    pub(crate) fn session(
        &self,
        policy: &NetworkPolicy,
    ) -> Result<Option<SessionEgress>, EngineError> {
        let NetworkPolicy::Allowlist {
            allowed_domains,
            domain_secrets,
        } = policy
        else {
            return Ok(None);
        };
        let secrets: Vec<DomainSecret> = domain_secrets
            .iter()
            .map(|s| DomainSecret {
                domain: s.domain.clone(),
                name: s.name.clone(),
                value: s.value.clone(),
            })
            .collect();
        let checked = self.bounds.check(allowed_domains, &secrets).map_err(|e| {
            if e.is_beyond_bound() {
                EngineError::LimitExceeded(Limit::Network(e.to_string()))
            } else {
                EngineError::InvalidRequest(Invalid::Network(e.to_string()))
            }
        })?;
        Ok(Some(self.egress.session(checked)))
    }
}

/// A session's policy as kept for a restart of the server: with its secrets' values (the
/// API reads them back redacted), so it lives beside the CA's key, readable by the server's
/// user only, never in the store or the audit log.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptPolicy {
    allowed_domains: Vec<String>,
    domain_secrets: Vec<KeptSecret>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct KeptSecret {
    domain: String,
    name: String,
    value: String,
}

fn policy_file(data_dir: &Path, id: &str) -> PathBuf {
    Network::egress_dir(data_dir)
        .join("sessions")
        .join(format!("{id}.json"))
}

/// Keeps session `id`'s policy for a restart (nothing for a disabled one).
pub(crate) fn keep_policy(
    data_dir: &Path,
    id: &str,
    policy: &NetworkPolicy,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let NetworkPolicy::Allowlist {
        allowed_domains,
        domain_secrets,
    } = policy
    else {
        return Ok(());
    };
    let kept = KeptPolicy {
        allowed_domains: allowed_domains.clone(),
        domain_secrets: domain_secrets
            .iter()
            .map(|s| KeptSecret {
                domain: s.domain.clone(),
                name: s.name.clone(),
                value: s.value.clone(),
            })
            .collect(),
    };
    let path = policy_file(data_dir, id);
    let dir = path.parent().unwrap_or(data_dir);
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec(&kept).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)
}

/// The policy kept for session `id`, if any (a session recovered after a restart).
pub(crate) fn kept_policy(data_dir: &Path, id: &str) -> Option<NetworkPolicy> {
    let data = std::fs::read(policy_file(data_dir, id)).ok()?;
    let kept: KeptPolicy = match serde_json::from_slice(&data) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(session = %id, error = %e, "a kept network policy is unreadable; the session comes back without a network");
            return None;
        }
    };
    Some(NetworkPolicy::Allowlist {
        allowed_domains: kept.allowed_domains,
        domain_secrets: kept
            .domain_secrets
            .into_iter()
            .map(|s| DomainSecretSpec {
                domain: s.domain,
                name: s.name,
                value: s.value,
            })
            .collect(),
    })
}

/// Forgets session `id`'s kept policy (it ended).
pub(crate) fn forget_policy(data_dir: &Path, id: &str) {
    let _ = std::fs::remove_file(policy_file(data_dir, id));
}

/// The trust files, written anew at each start (the system's bundle may have changed): the
/// CA alone, and the system's bundle followed by it.
fn write_trust(dir: &Path, ca_pem: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let mut bundle = match std::fs::read_to_string(SYSTEM_BUNDLE) {
        Ok(system) => system,
        Err(e) => {
            tracing::warn!(error = %e, bundle = SYSTEM_BUNDLE, "no system CA bundle: sandboxes trust runcell's egress CA only");
            String::new()
        }
    };
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle
        .push_str("# runcell egress CA: HTTPS to domains with a secret header (docs/sandbox.md)\n");
    bundle.push_str(ca_pem);
    for (name, data) in [
        ("runcell-egress-ca.pem", ca_pem),
        ("ca-bundle.pem", bundle.as_str()),
    ] {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, data)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

/// What a program with a network policy finds in its environment: every client's proxy
/// variables pointing at the sandbox's egress socket, every client's trust store pointed at
/// the bundle with runcell's egress CA, pip told to install into the workspace (from the
/// operator's index, if any) and to fail at once (no retries) when the proxy refuses, and npm
/// told the same.
pub(crate) fn proxy_env(trust: bool, pip_index_url: Option<&str>) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{EGRESS_PORT}");
    let env: Vec<(&str, String)> = vec![
        ("HTTP_PROXY", proxy.clone()),
        ("HTTPS_PROXY", proxy.clone()),
        ("ALL_PROXY", proxy.clone()),
        ("http_proxy", proxy.clone()),
        ("https_proxy", proxy.clone()),
        ("all_proxy", proxy),
        // The sandbox's own servers stay direct.
        ("NO_PROXY", "localhost,127.0.0.1,::1".into()),
        ("no_proxy", "localhost,127.0.0.1,::1".into()),
        // Node's fetch (undici) ignores the variables above unless told (Node 24+).
        ("NODE_USE_ENV_PROXY", "1".into()),
        // One retry, at once: pip reports a refused connection only when it retries (with the
        // proxy's reason), and a refusal is final, so no backoff and no second retry.
        ("PIP_RETRIES", "1".into()),
        ("PIP_TIMEOUT", "15".into()),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1".into()),
        // Never a prompt (a 401 from an index would ask for a password on a stdin that is
        // not there): the error instead.
        ("PIP_NO_INPUT", "1".into()),
        ("PIP_TARGET", PACKAGES_DIR.into()),
        // `pip install` of a package the runtime has is an upgrade into the target.
        ("PIP_UPGRADE", "1".into()),
        // npm (its proxy comes from HTTPS_PROXY, its roots from NODE_EXTRA_CA_CERTS): packages
        // go where `npm install` runs, the workspace's node_modules by default, which the
        // JavaScript kernel resolves from; a refusal fails at once, and nothing is asked of
        // the registry beyond the install (no audit, funding or update notices).
        ("npm_config_fetch_retries", "0".into()),
        ("npm_config_fetch_timeout", "30000".into()),
        ("npm_config_audit", "false".into()),
        ("npm_config_fund", "false".into()),
        ("npm_config_update_notifier", "false".into()),
        ("npm_config_cache", "/tmp/.npm".into()),
        // Subprocesses (`python3 -c`, a bash cell) import what was installed; the Python
        // kernel puts it on its own sys.path at start (a zygote-born one computed sys.path
        // before this environment existed).
        ("PYTHONPATH", PACKAGES_DIR.into()),
    ];
    let mut env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    if let Some(url) = pip_index_url {
        env.push(("PIP_INDEX_URL".into(), url.to_owned()));
    }
    // Clients that carry their own roots (pip's and requests' certifi, Node's bundled store,
    // curl) are pointed at the system's bundle with runcell's egress CA after it: the
    // system's for every host (where the host trusts a CA of its own, an intercepting egress
    // or a private one, sandboxes do too, as the host's pip does), runcell's for the domains
    // whose HTTPS the proxy opens to add a secret header. OpenSSL (Python's ssl, urllib, curl)
    // reads SSL_CERT_FILE; certifi's own bundle in the runtime is left as it is.
    let bundle = if trust {
        Some(BUNDLE_FILE)
    } else {
        Path::new(SYSTEM_BUNDLE).is_file().then_some(SYSTEM_BUNDLE)
    };
    if let Some(bundle) = bundle {
        for var in [
            "PIP_CERT",
            "REQUESTS_CA_BUNDLE",
            "SSL_CERT_FILE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            // Node adds these to its own roots (npm and fetch alike).
            "NODE_EXTRA_CA_CERTS",
        ] {
            env.push((var.to_owned(), bundle.to_owned()));
        }
    }
    env
}

/// The system's CA bundle (Debian's path), the same inside the sandbox (a read-only bind).
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

pub(crate) fn connections(
    records: Vec<runcell_egress::ConnectionRecord>,
) -> Vec<NetworkConnection> {
    records
        .into_iter()
        .map(|r| NetworkConnection {
            domain: r.domain,
            port: r.port,
            allowed: r.allowed,
            bytes_out: r.bytes_out,
            bytes_in: r.bytes_in,
        })
        .collect()
}

/// Waits for pid 1's egress socket in a one-shot's or command's sandbox, up to `within` (the
/// run's own time), and has `egress` serve it. `None`: nothing to serve, and the run's end says
/// how it went: pid 1 is gone already (killed at its start, by its own memory bound say), or
/// it did not reach its socket within the run's time (a sandbox starved by its own bounds:
/// `cpu: 0.01` gives a cold sandbox's start ~1 ms of CPU per 100 ms), so the run meets its
/// deadline and ends as a timeout, as a slow program does.
pub(crate) fn serve_egress(
    running: &runcell_sandbox::Running,
    egress: &runcell_egress::SessionEgress,
    within: std::time::Duration,
) -> Result<Option<runcell_egress::Serving>, runcell_sandbox::SandboxError> {
    /// `ESRCH` on Linux: the process is gone.
    const ESRCH: i32 = 3;
    match running.egress_listener(within) {
        Ok(listener) => Ok(Some(egress.serve(listener)?)),
        Err(e) if e.raw_os_error() == Some(ESRCH) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(None),
        Err(e) => Err(e.into()),
    }
}
