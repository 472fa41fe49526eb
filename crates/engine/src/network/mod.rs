//! A session's network: none by default; with an allowlist, one egress proxy per session
//! (`runcell-egress`) reached through a socket on the sandbox's own loopback, and a record of
//! every connection in each Execution. The operator bounds what any session may ask.

use std::path::Path;

use runcell_egress::{Cidr, DomainSecret, Egress, EgressLimits, PolicyBounds, SessionEgress};

use crate::error::{EngineError, Invalid, Limit};

pub(crate) mod policy;
pub use policy::{DomainSecretSpec, NetworkConfig, NetworkConnection, NetworkPolicy};

/// The loopback port of every sandbox's egress socket (each sandbox has a loopback of its own).
pub const EGRESS_PORT: u16 = 3128;
/// Where `pip install` puts packages in a session with a network policy: in its workspace (so
/// they survive restarts and pauses and count against its disk), on the kernel's `sys.path`
/// and on `PYTHONPATH`. Never the shared runtime, which is read-only anyway.
pub const PACKAGES_DIR: &str = "/workspace/.runcell/site-packages";

/// The engine's side of egress: the bounds, and the proxy (started by the first session that
/// needs it).
#[derive(Debug)]
pub(crate) struct Network {
    bounds: PolicyBounds,
    egress: Egress,
}

impl Network {
    pub(crate) fn new(config: &NetworkConfig) -> Result<Network, EngineError> {
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
        Ok(Network {
            bounds: PolicyBounds { domains },
            egress: Egress::new(cidrs, EgressLimits::default()),
        })
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

/// What a program with a network policy finds in its environment: every client's proxy
/// variables pointing at the sandbox's egress socket, and pip told to install into the
/// workspace and to fail at once (no retries) when the proxy refuses.
pub(crate) fn proxy_env() -> Vec<(String, String)> {
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
        ("PIP_TARGET", PACKAGES_DIR.into()),
        // `pip install` of a package the runtime has is an upgrade into the target.
        ("PIP_UPGRADE", "1".into()),
        // Subprocesses (`python3 -c`, a bash cell) import what was installed; the Python
        // kernel puts it on its own sys.path at start (a zygote-born one computed sys.path
        // before this environment existed).
        ("PYTHONPATH", PACKAGES_DIR.into()),
    ];
    let mut env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    // The sandbox's /etc/ssl/certs is the host's: where the host trusts a bundle of its own
    // (an intercepting egress, a private CA), clients that carry their own roots (pip's
    // certifi, requests) are pointed at it, as the host's pip is.
    if Path::new(SYSTEM_BUNDLE).is_file() {
        for var in [
            "PIP_CERT",
            "REQUESTS_CA_BUNDLE",
            "SSL_CERT_FILE",
            "NODE_EXTRA_CA_CERTS",
        ] {
            env.push((var.to_owned(), SYSTEM_BUNDLE.to_owned()));
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
