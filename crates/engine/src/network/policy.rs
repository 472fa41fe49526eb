//! A session's network policy and what an execution records of its connections, in the API's
//! shapes (no engine state here: the model and the errors use these).

use serde::{Deserialize, Serialize, Serializer};

/// A session's `network` (OpenAI's container shape).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", try_from = "RawPolicy")]
pub enum NetworkPolicy {
    /// No network at all (the default): the sandbox has only its loopback.
    #[default]
    Disabled,
    /// HTTP(S) through runcell's proxy to these domains only.
    Allowlist {
        /// `pypi.org` (that name), `*.example.com` (any name below it) or an IP literal; each
        /// within what the server allows (`serve --egress-allow`).
        allowed_domains: Vec<String>,
        /// Headers the proxy adds to requests for a domain; the value never enters the
        /// sandbox, and reads back as `"<redacted>"`.
        #[serde(default)]
        domain_secrets: Vec<DomainSecretSpec>,
    },
}

/// What a request's `network` may hold: read whole, so that a field the type does not take
/// (`allowed_domains` on `disabled`) is refused rather than ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(rename = "type")]
    kind: PolicyKind,
    #[serde(default, deserialize_with = "present")]
    allowed_domains: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    domain_secrets: Option<Vec<DomainSecretSpec>>,
}

/// A field that may be missing but, when given, is a list: `null` is refused (the document
/// says array), not read as "missing".
fn present<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Vec::<T>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum PolicyKind {
    Disabled,
    Allowlist,
}

impl TryFrom<RawPolicy> for NetworkPolicy {
    type Error = &'static str;
    fn try_from(raw: RawPolicy) -> Result<NetworkPolicy, &'static str> {
        match (raw.kind, raw.allowed_domains, raw.domain_secrets) {
            (PolicyKind::Disabled, None, None) => Ok(NetworkPolicy::Disabled),
            (PolicyKind::Disabled, _, _) => {
                Err("a disabled network takes no allowed_domains or domain_secrets")
            }
            (PolicyKind::Allowlist, Some(allowed_domains), secrets) => {
                Ok(NetworkPolicy::Allowlist {
                    allowed_domains,
                    domain_secrets: secrets.unwrap_or_default(),
                })
            }
            (PolicyKind::Allowlist, None, _) => Err("an allowlist needs allowed_domains"),
        }
    }
}

/// One `domain_secrets` entry.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainSecretSpec {
    /// One exact domain of `allowed_domains`.
    pub domain: String,
    /// The header's name (`Authorization`).
    pub name: String,
    #[serde(serialize_with = "redacted")]
    pub value: String,
}

impl std::fmt::Debug for DomainSecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainSecretSpec")
            .field("domain", &self.domain)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn redacted<S: Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<redacted>")
}

impl NetworkPolicy {
    pub fn is_disabled(&self) -> bool {
        matches!(self, NetworkPolicy::Disabled)
    }
}

/// One connection an execution made (or tried), in the Execution and the audit log.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkConnection {
    pub domain: String,
    pub port: u16,
    pub allowed: bool,
    /// From the sandbox to the destination.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// The operator's egress settings (`serve --egress-allow`, `--egress-allow-cidr`,
/// `--egress-ca-file`, `--pip-index-url`).
#[derive(Debug, Clone, Default)]
pub struct NetworkConfig {
    /// Patterns any session's allowlist must stay within; empty: no session gets a network.
    pub allow_domains: Vec<String>,
    /// Address ranges the proxy may reach although they are special or the host's own.
    pub allow_cidrs: Vec<String>,
    /// PEM files of roots the proxy also trusts when it verifies the real host of a domain
    /// with a secret header (beside webpki's roots and the system's store).
    pub ca_files: Vec<std::path::PathBuf>,
    /// The package index pip in a session with a network uses (`PIP_INDEX_URL`); its domain
    /// must still be in the session's allowlist.
    pub pip_index_url: Option<String>,
}
