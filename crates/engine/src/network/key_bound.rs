//! An API key's own egress bound (`runcell keys create|update --egress-allow`): what any network
//! a request made with that key asks for must stay within, on top of the server's bound. A key
//! only narrows: the server's bound is checked as well (by [`super::Network::session`]), so a
//! request passes exactly when each of its patterns lies in both (the intersection; see
//! `runcell_egress::PolicyBounds::first_uncovered`).

use runcell_egress::{DomainPattern, PolicyBounds};

use crate::error::{EngineError, Invalid, Limit};
use crate::network::policy::NetworkPolicy;

/// A key's bound, ready to check requests against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEgressBound {
    bound: PolicyBounds,
    /// How refusals name the key: `key_... (name)`.
    key: String,
}

impl KeyEgressBound {
    /// The patterns as the store keeps them: each checked for its form, in its canonical
    /// spelling (`PyPI.org.` → `pypi.org`), duplicates dropped, in the order given. The error
    /// names the pattern and what is wrong with it.
    pub fn normalize(patterns: &[String]) -> Result<Vec<String>, String> {
        PolicyBounds::parse(patterns)
            .map(|b| b.domains.iter().map(ToString::to_string).collect())
            .map_err(|e| e.to_string())
    }

    /// The bound of the key `key` (how refusals name it) from its stored patterns. A pattern
    /// that does not parse (the store was written by hand) allows nothing: the bound only
    /// narrows, never fails open.
    pub fn new(patterns: &[String], key: impl Into<String>) -> KeyEgressBound {
        let key = key.into();
        let domains = patterns
            .iter()
            .filter_map(|p| match DomainPattern::parse(p) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!(key = %key, "a stored egress pattern is ignored: {e}");
                    None
                }
            })
            .collect();
        KeyEgressBound {
            bound: PolicyBounds { domains },
            key,
        }
    }

    /// Whether `policy` stays within this key's bound: `Ok` for no network; a malformed
    /// pattern is 400 `invalid_request` (as the server's check says it), one beyond the key's
    /// bound 400 `limit_exceeded` naming the pattern and the key.
    pub fn check(&self, policy: &NetworkPolicy) -> Result<(), EngineError> {
        let NetworkPolicy::Allowlist {
            allowed_domains, ..
        } = policy
        else {
            return Ok(());
        };
        let requested = runcell_egress::parse_all(allowed_domains)
            .map_err(|e| EngineError::InvalidRequest(Invalid::Network(e.to_string())))?;
        match self.bound.first_uncovered(&requested) {
            None => Ok(()),
            Some(p) if self.bound.domains.is_empty() => Err(EngineError::LimitExceeded(
                Limit::Network(format!(
                    "domain {:?} refused: API key {} allows no network (runcell keys update --egress-allow)",
                    p.to_string(),
                    self.key
                )),
            )),
            Some(p) => Err(EngineError::LimitExceeded(Limit::Network(format!(
                "domain {:?} is beyond what API key {} allows ({}; runcell keys update --egress-allow)",
                p.to_string(),
                self.key,
                self.describe()
            )))),
        }
    }

    /// The key's patterns as a refusal lists them.
    fn describe(&self) -> String {
        let list: Vec<String> = self.bound.domains.iter().map(ToString::to_string).collect();
        list.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowlist(domains: &[&str]) -> NetworkPolicy {
        NetworkPolicy::Allowlist {
            allowed_domains: domains.iter().map(|d| d.to_string()).collect(),
            domain_secrets: Vec::new(),
        }
    }

    fn strings(ps: &[&str]) -> Vec<String> {
        ps.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_key_bound_admits_what_it_covers_and_names_itself_when_it_refuses() {
        let key = KeyEgressBound::new(&strings(&["pypi.org", "*.example.com"]), "key_a (agent)");
        assert!(key.check(&NetworkPolicy::Disabled).is_ok());
        assert!(key
            .check(&allowlist(&["pypi.org", "x.example.com"]))
            .is_ok());
        assert!(key.check(&allowlist(&["*.api.example.com"])).is_ok());
        let e = key
            .check(&allowlist(&["pypi.org", "example.com"]))
            .expect_err("beyond");
        let EngineError::LimitExceeded(limit @ Limit::Network(_)) = &e else {
            panic!("{e:?}")
        };
        // What the API's message says (the limit's text).
        assert_eq!(
            limit.to_string(),
            "network: domain \"example.com\" is beyond what API key key_a (agent) allows (pypi.org, *.example.com; runcell keys update --egress-allow)"
        );
        // Malformed before beyond: the caller's mistake whatever the key allows.
        let e = key
            .check(&allowlist(&["other.org", "a..b"]))
            .expect_err("malformed");
        assert!(
            matches!(e, EngineError::InvalidRequest(Invalid::Network(_))),
            "{e:?}"
        );
    }

    #[test]
    fn an_empty_key_bound_allows_no_network_and_a_bad_stored_pattern_allows_nothing() {
        let none = KeyEgressBound::new(&[], "key_b (b)");
        assert!(none.check(&NetworkPolicy::Disabled).is_ok());
        let e = none
            .check(&allowlist(&["pypi.org"]))
            .expect_err("no network");
        assert!(
            e.to_string()
                .contains("API key key_b (b) allows no network"),
            "{e}"
        );
        let odd = KeyEgressBound::new(&strings(&["a..b", "pypi.org"]), "key_c (c)");
        assert!(odd.check(&allowlist(&["pypi.org"])).is_ok());
        assert!(odd.check(&allowlist(&["a.b"])).is_err());
    }

    #[test]
    fn patterns_are_normalized_for_the_store() {
        assert_eq!(
            KeyEgressBound::normalize(&strings(&[
                "PyPI.org.",
                "pypi.org",
                "*.Example.com",
                "[::1]"
            ])),
            Ok(strings(&["pypi.org", "*.example.com", "::1"]))
        );
        let e = KeyEgressBound::normalize(&strings(&["pypi.org", "*x.com"])).expect_err("bad");
        assert!(e.contains("\"*x.com\""), "{e}");
        assert_eq!(KeyEgressBound::normalize(&[]), Ok(Vec::new()));
    }
}
