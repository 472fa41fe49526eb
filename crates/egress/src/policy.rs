//! What a session may reach: domain patterns, checked against the server's bounds when the
//! session is created, and against each request's destination by the proxy.

use std::fmt;
use std::net::IpAddr;

/// At most this many patterns (and secrets) per session: a policy is a short list, not a feed.
pub const MAX_PATTERNS: usize = 256;
/// The longest secret value a header may carry.
const MAX_SECRET_BYTES: usize = 8192;

/// One entry of an allowlist: `pypi.org` (that name exactly), `*.example.com` (any name below
/// example.com, not example.com itself), `*` (any name; only as a server bound) or an IP literal
/// (that address, as a `CONNECT` target or absolute-form host).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DomainPattern {
    Exact(String),
    /// `*.suffix`: stores `suffix`.
    Below(String),
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid domain pattern {pattern:?}: {reason}")]
pub struct PatternError {
    pub pattern: String,
    pub reason: &'static str,
}

impl DomainPattern {
    pub fn parse(text: &str) -> Result<DomainPattern, PatternError> {
        let bad = |reason| PatternError {
            pattern: text.to_owned(),
            reason,
        };
        if text == "*" {
            return Ok(DomainPattern::Any);
        }
        let lower = text.trim_end_matches('.').to_ascii_lowercase();
        if let Some(rest) = lower.strip_prefix("*.") {
            return check_name(rest)
                .map(|()| DomainPattern::Below(rest.to_owned()))
                .map_err(bad);
        }
        let literal = lower.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            return Ok(DomainPattern::Exact(ip.to_string()));
        }
        check_name(&lower)
            .map(|()| DomainPattern::Exact(lower))
            .map_err(bad)
    }

    /// Whether `host` (lowercase, no trailing dot; see [`normalize_host`]) is allowed.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            DomainPattern::Exact(name) => name == host,
            DomainPattern::Below(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            DomainPattern::Any => true,
        }
    }

    /// Whether everything `other` allows, this allows too (a bound covering a request).
    pub fn covers(&self, other: &DomainPattern) -> bool {
        match (self, other) {
            (DomainPattern::Any, _) => true,
            (_, DomainPattern::Any) => false,
            (_, DomainPattern::Exact(name)) => self.matches(name),
            (DomainPattern::Below(mine), DomainPattern::Below(theirs)) => {
                mine == theirs || DomainPattern::Below(mine.clone()).matches(theirs)
            }
            (DomainPattern::Exact(_), DomainPattern::Below(_)) => false,
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DomainPattern::Exact(name) => f.write_str(name),
            DomainPattern::Below(suffix) => write!(f, "*.{suffix}"),
            DomainPattern::Any => f.write_str("*"),
        }
    }
}

/// A DNS name as the proxy compares it: 1-253 characters of letters, digits, `-` and `.`, labels
/// of 1-63 that neither start nor end with `-`, not all digits in the last label (that would be
/// an IP literal spelled oddly, such as `127.1`).
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("a name is 1 to 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each label is 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err("only letters, digits, '-' and '.' (and a leading '*.')");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label neither starts nor ends with '-'");
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("not an IP address (write it in full, e.g. 127.0.0.1)");
    }
    Ok(())
}

/// A request's host as the proxy compares it with patterns: lowercase, no trailing dot, IP
/// literals in their canonical form (`[::1]` -> `::1`). `None` if it is neither a valid name
/// nor an address.
pub(crate) fn normalize_host(host: &str) -> Option<String> {
    let lower = host.trim_end_matches('.').to_ascii_lowercase();
    let literal = lower.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Some(ip.to_string());
    }
    check_name(&lower).ok().map(|()| lower)
}

/// `name[:port]` of a Host header, normalized like a request's host.
pub(crate) fn split_host_header(h: &str) -> Option<(String, Option<u16>)> {
    let h = h.trim();
    let (name, port) = if let Some(rest) = h.strip_prefix('[') {
        let (n, after) = rest.split_once(']')?;
        (n, after.strip_prefix(':'))
    } else {
        match h.rsplit_once(':') {
            Some((n, p)) if !n.contains(':') => (n, Some(p)),
            _ => (h, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    Some((normalize_host(name)?, port))
}

/// A header the proxy adds to every request for `domain` (exact name); the sandbox never sees
/// the value.
#[derive(Clone, PartialEq, Eq)]
pub struct DomainSecret {
    pub domain: String,
    pub name: String,
    pub value: String,
}

impl fmt::Debug for DomainSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DomainSecret")
            .field("domain", &self.domain)
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// A session's network policy, once validated: what the proxy enforces.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub allowed: Vec<DomainPattern>,
    pub secrets: Vec<DomainSecret>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Pattern(#[from] PatternError),
    #[error("at most {MAX_PATTERNS} allowed domains and {MAX_PATTERNS} domain secrets")]
    TooMany,
    #[error("domain {0:?} is beyond what this server allows (serve --egress-allow)")]
    BeyondBound(String),
    #[error("domain secret for {0:?}: the domain is not in allowed_domains")]
    SecretNotAllowed(String),
    #[error("domain secret for {domain:?}: {reason}")]
    BadSecret {
        domain: String,
        reason: &'static str,
    },
}

impl PolicyError {
    /// A request beyond the server's bound (`limit_exceeded`), rather than a malformed one.
    pub fn is_beyond_bound(&self) -> bool {
        matches!(self, PolicyError::BeyondBound(_))
    }
}

/// What a server lets any session ask for (`serve --egress-allow`); empty: nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyBounds {
    pub domains: Vec<DomainPattern>,
}

impl PolicyBounds {
    /// The bound `patterns` spell (a server's `--egress-allow`, or an API key's own), each
    /// checked for its form, duplicates dropped, in the order given.
    pub fn parse(patterns: &[String]) -> Result<PolicyBounds, PatternError> {
        Ok(PolicyBounds {
            domains: parse_all(patterns)?,
        })
    }

    /// The first of `requested` no single pattern of this bound covers ([`DomainPattern::covers`]).
    ///
    /// Covering one pattern at a time is the same as covering with the bound's union: a name
    /// pattern is covered by a union exactly when one member matches the name, and a
    /// `*.suffix` pattern, which allows names at any depth below `suffix`, is covered only by
    /// `*`, `*.suffix` itself or `*.` of a parent of `suffix` (finitely many names and other
    /// subtrees never exhaust it). So two bounds checked one after the other (a server's, then
    /// a key's) admit exactly what their intersection admits.
    pub fn first_uncovered<'a>(&self, requested: &'a [DomainPattern]) -> Option<&'a DomainPattern> {
        requested
            .iter()
            .find(|p| !self.domains.iter().any(|b| b.covers(p)))
    }

    /// Validates a session's request: every pattern well-formed and covered by a bound, every
    /// secret for an allowed exact name, with a header name and value that are valid HTTP.
    pub fn check(
        &self,
        allowed: &[String],
        secrets: &[DomainSecret],
    ) -> Result<Policy, PolicyError> {
        if allowed.len() > MAX_PATTERNS || secrets.len() > MAX_PATTERNS {
            return Err(PolicyError::TooMany);
        }
        let patterns = parse_all(allowed)?;
        if let Some(p) = self.first_uncovered(&patterns) {
            return Err(PolicyError::BeyondBound(p.to_string()));
        }
        let mut checked = Vec::with_capacity(secrets.len());
        for s in secrets {
            let bad = |reason| PolicyError::BadSecret {
                domain: s.domain.clone(),
                reason,
            };
            let domain = match DomainPattern::parse(&s.domain)? {
                DomainPattern::Exact(d) => d,
                _ => return Err(bad("a secret is for one exact domain")),
            };
            if !patterns.iter().any(|p| p.matches(&domain)) {
                return Err(PolicyError::SecretNotAllowed(s.domain.clone()));
            }
            if s.name.is_empty()
                || !s
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            {
                return Err(bad("the header name must be an HTTP token"));
            }
            if is_hop_header(&s.name) || s.name.eq_ignore_ascii_case("host") {
                return Err(bad("the header name is one the proxy manages"));
            }
            if s.value.is_empty()
                || s.value.len() > MAX_SECRET_BYTES
                || s.value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f)
            {
                return Err(bad(
                    "the value must be 1 to 8192 bytes with no control characters",
                ));
            }
            checked.push(DomainSecret {
                domain,
                name: s.name.clone(),
                value: s.value.clone(),
            });
        }
        Ok(Policy {
            allowed: patterns,
            secrets: checked,
        })
    }
}

/// Every pattern of `texts` parsed, duplicates dropped. Every pattern is checked for its form
/// before any is checked against a bound: a malformed one is the caller's mistake (400) whatever
/// a bound allows.
pub fn parse_all(texts: &[String]) -> Result<Vec<DomainPattern>, PatternError> {
    let mut patterns = Vec::with_capacity(texts.len());
    for text in texts {
        let p = DomainPattern::parse(text)?;
        if !patterns.contains(&p) {
            patterns.push(p);
        }
    }
    Ok(patterns)
}

impl Policy {
    pub fn allows(&self, host: &str) -> bool {
        self.allowed.iter().any(|p| p.matches(host))
    }

    pub(crate) fn secrets_for<'a>(
        &'a self,
        host: &'a str,
    ) -> impl Iterator<Item = &'a DomainSecret> {
        self.secrets.iter().filter(move |s| s.domain == host)
    }

    /// The allowlist as the 403 body prints it.
    pub(crate) fn describe(&self) -> String {
        let list: Vec<String> = self.allowed.iter().map(ToString::to_string).collect();
        list.join(", ")
    }
}

/// Headers about the connection to the proxy, never forwarded (RFC 9110 §7.6.1), and never a
/// secret's name.
pub(crate) fn is_hop_header(name: &str) -> bool {
    [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> DomainPattern {
        DomainPattern::parse(s).expect(s)
    }

    #[test]
    fn patterns_match_names_and_below() {
        assert!(p("PyPI.org.").matches("pypi.org"));
        assert!(!p("pypi.org").matches("evilpypi.org"));
        assert!(!p("pypi.org").matches("files.pypi.org"));
        assert!(p("*.example.com").matches("a.b.example.com"));
        assert!(!p("*.example.com").matches("example.com"));
        assert!(!p("*.example.com").matches("badexample.com"));
        assert!(p("[::1]").matches("::1"));
        assert_eq!(p("127.0.0.1"), DomainPattern::Exact("127.0.0.1".into()));
        for bad in [
            "", "a..b", "-a.com", "a b.com", "*.*.com", "127.1", "a.com/x", "*x.com", "é.com",
        ] {
            assert!(DomainPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bounds_cover_requests() {
        let bounds = PolicyBounds {
            domains: vec![p("pypi.org"), p("*.example.com")],
        };
        let ok = bounds
            .check(
                &[
                    "pypi.org".into(),
                    "*.a.example.com".into(),
                    "x.example.com".into(),
                ],
                &[],
            )
            .expect("within");
        assert_eq!(ok.allowed.len(), 3);
        for beyond in ["example.com", "*.com", "*", "files.pythonhosted.org"] {
            let err = bounds.check(&[beyond.into()], &[]).expect_err(beyond);
            assert!(err.is_beyond_bound(), "{beyond}: {err}");
        }
        let err = bounds.check(&["a..b".into()], &[]).expect_err("malformed");
        assert!(!err.is_beyond_bound());
        assert!(PolicyBounds::default()
            .check(&["pypi.org".into()], &[])
            .is_err());
        assert!(PolicyBounds {
            domains: vec![DomainPattern::Any]
        }
        .check(&["*".into()], &[])
        .is_ok());
    }

    /// Containment, as a key's bound inside the server's and a request inside both use it.
    #[test]
    fn containment_of_patterns_is_exact() {
        let covers = |outer: &str, inner: &str| p(outer).covers(&p(inner));
        // `*.example.com` is every name below example.com, at any depth, not example.com.
        assert!(covers("*.example.com", "*.example.com"));
        assert!(covers("*.example.com", "*.api.example.com"));
        assert!(covers("*.example.com", "a.example.com"));
        assert!(covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("*.example.com", "*.badexample.com"));
        // `example.com` is that one name: it covers neither its subdomains nor a wildcard.
        assert!(covers("example.com", "example.com"));
        assert!(!covers("example.com", "*.example.com"));
        assert!(!covers("example.com", "a.example.com"));
        // A narrower wildcard never covers a wider one, `*` only by `*`.
        assert!(!covers("*.api.example.com", "*.example.com"));
        assert!(covers("*", "*"));
        assert!(covers("*", "*.example.com"));
        assert!(!covers("*.example.com", "*"));
        // IP literals are exact names: only themselves (or `*`).
        assert!(covers("127.0.0.1", "127.0.0.1"));
        assert!(!covers("127.0.0.1", "127.0.0.2"));
        assert!(covers("*", "::1"));
    }

    /// A request passes a server's bound and then a key's exactly when each of its patterns
    /// lies in both: the intersection, whichever is wider where.
    #[test]
    fn two_bounds_admit_their_intersection() {
        let bound = |ps: &[&str]| {
            PolicyBounds::parse(&ps.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("bound")
        };
        let server = bound(&["*.example.com", "pypi.org", "files.pythonhosted.org"]);
        let key = bound(&[
            "*.api.example.com",
            "www.example.com",
            "pypi.org",
            "other.org",
        ]);
        let admitted = |r: &str| {
            let req = [p(r)];
            server.first_uncovered(&req).is_none() && key.first_uncovered(&req).is_none()
        };
        for inside in [
            "pypi.org",
            "www.example.com",
            "x.api.example.com",
            "*.api.example.com",
        ] {
            assert!(admitted(inside), "{inside}");
        }
        for outside in [
            "files.pythonhosted.org", // the server's, not the key's
            "other.org",              // the key's, not the server's
            "*.example.com",          // wider than the key's
            "api.example.com",        // *.api.example.com is below it, not it
            "mail.example.com",
        ] {
            assert!(!admitted(outside), "{outside}");
        }
        let req = [p("pypi.org"), p("other.org"), p("mail.example.com")];
        assert_eq!(key.first_uncovered(&req), Some(&p("mail.example.com")));
        assert_eq!(server.first_uncovered(&req), Some(&p("other.org")));
        assert_eq!(bound(&[]).first_uncovered(&req), Some(&p("pypi.org")));
        assert!(PolicyBounds::parse(&["a..b".to_owned()]).is_err());
        assert_eq!(
            bound(&["PyPI.org", "pypi.org."]).domains,
            vec![p("pypi.org")]
        );
    }

    #[test]
    fn secrets_are_for_allowed_exact_domains_with_valid_headers() {
        let bounds = PolicyBounds {
            domains: vec![DomainPattern::Any],
        };
        let secret = |domain: &str, name: &str, value: &str| DomainSecret {
            domain: domain.into(),
            name: name.into(),
            value: value.into(),
        };
        let allowed = ["api.example.com".to_string()];
        assert!(bounds
            .check(
                &allowed,
                &[secret("api.example.com", "Authorization", "Bearer x")]
            )
            .is_ok());
        for (s, why) in [
            (secret("other.com", "Authorization", "x"), "not allowed"),
            (secret("*.example.com", "Authorization", "x"), "a pattern"),
            (secret("api.example.com", "Bad Header", "x"), "name"),
            (secret("api.example.com", "Connection", "x"), "hop header"),
            (
                secret("api.example.com", "X-Key", "a\r\nInjected: 1"),
                "CRLF",
            ),
            (secret("api.example.com", "X-Key", ""), "empty"),
        ] {
            assert!(bounds.check(&allowed, &[s]).is_err(), "{why}");
        }
        let shown = format!("{:?}", secret("a", "b", "hunter2"));
        assert!(!shown.contains("hunter2"));
    }
}
