//! The secret the nodes of one cluster share, and what it signs: the requests they forward
//! to each other (crate::forward), in place of the client's key.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a signature's time may be from the owner's clock: bounds how long a captured
/// forwarded request could be replayed (node links belong on a private network all the same).
const SIGNATURE_SKEW_S: i64 = 30;

/// The secret the nodes of one cluster share, which signs the requests they forward to each
/// other (`serve --cluster-secret-file FILE` or `RUNCELL_CLUSTER_SECRET`).
pub struct ClusterSecret(Vec<u8>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// A secret shorter than this is refused: it would be guessable offline from one captured
/// signature.
pub const MIN_CLUSTER_SECRET_BYTES: usize = 32;

impl ClusterSecret {
    /// `secret` as read from the file or variable (surrounding whitespace, e.g. the file's
    /// final newline, is not part of it).
    pub fn new(secret: &[u8]) -> Result<Self, String> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_CLUSTER_SECRET_BYTES {
            return Err(format!(
                "the cluster secret must be at least {MIN_CLUSTER_SECRET_BYTES} bytes (it has {}): \
                 e.g. openssl rand -hex 32",
                secret.len()
            ));
        }
        Ok(Self(secret.to_vec()))
    }

    fn mac(
        &self,
        node: &str,
        tenant: &str,
        key: &str,
        method: &str,
        path: &str,
        t: i64,
    ) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        // Each field ends with a NUL, which none of them can hold, so no two field lists sign
        // the same bytes. A version tag first: a signature of the earlier field list (without
        // the key) can never pass for one of this list.
        mac.update(b"runcell-forward-2\0");
        for field in [node, tenant, key, method, path, &t.to_string()] {
            mac.update(field.as_bytes());
            mac.update(b"\0");
        }
        mac
    }

    /// The `x-runcell-node-signature` value for a request forwarded by `node` for `tenant`,
    /// whose client presented the API key with id `key` (empty: no key).
    pub(crate) fn sign(
        &self,
        node: &str,
        tenant: &str,
        key: &str,
        method: &str,
        path: &str,
        t: i64,
    ) -> String {
        let tag = self
            .mac(node, tenant, key, method, path, t)
            .finalize()
            .into_bytes();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        format!("t={t},s={hex}")
    }

    /// Whether `signature` is this cluster's for those fields, made within
    /// [`SIGNATURE_SKEW_S`] of `now`.
    #[allow(clippy::too_many_arguments, reason = "the signed fields, each named")]
    pub(crate) fn verify(
        &self,
        signature: &str,
        node: &str,
        tenant: &str,
        key: &str,
        method: &str,
        path: &str,
        now: i64,
    ) -> bool {
        let Some((t, tag)) = signature
            .strip_prefix("t=")
            .and_then(|rest| rest.split_once(",s="))
        else {
            return false;
        };
        let (Ok(t), Some(tag)) = (t.parse::<i64>(), unhex(tag)) else {
            return false;
        };
        (now - t).abs() <= SIGNATURE_SKEW_S
            // Constant time: the comparison tells nothing about how close a guess was.
            && self.mac(node, tenant, key, method, path, t).verify_slice(&tag).is_ok()
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Who a node forwarded this request for, once its signature checked out: the tenant, and
/// the key the client presented there, loaded here (so its bounds hold as for a request made
/// here); put in the request's extensions by `forward::to_owner` alone (never read from a
/// header by a handler).
#[derive(Debug, Clone)]
pub(crate) struct ForwardedTenant {
    pub tenant: String,
    pub key: Option<crate::caller::KeyRef>,
}

#[cfg(test)]
mod tests {
    use super::ClusterSecret;
    use hmac::{Hmac, Mac};
    use sha2::Sha256;

    #[test]
    fn signatures() {
        let s = ClusterSecret::new(&[b'k'; 32]).expect("secret");
        let sig = s.sign("http://a:1", "t1", "key_1", "GET", "/v1/sessions/x", 1000);
        let ok = |sig: &str, node, tenant, key, method, path, now| {
            s.verify(sig, node, tenant, key, method, path, now)
        };
        assert!(ok(
            &sig,
            "http://a:1",
            "t1",
            "key_1",
            "GET",
            "/v1/sessions/x",
            1010
        ));
        // Any other tenant, key (or none), path, method, node, or a stale time: refused.
        let refused = [
            ("http://a:1", "t2", "key_1", "GET", "/v1/sessions/x", 1010),
            ("http://a:1", "t1", "key_2", "GET", "/v1/sessions/x", 1010),
            ("http://a:1", "t1", "", "GET", "/v1/sessions/x", 1010),
            ("http://a:1", "t1", "key_1", "GET", "/v1/sessions/y", 1010),
            ("http://a:1", "t1", "key_1", "POST", "/v1/sessions/x", 1010),
            ("http://b:1", "t1", "key_1", "GET", "/v1/sessions/x", 1010),
            ("http://a:1", "t1", "key_1", "GET", "/v1/sessions/x", 1031),
        ];
        for (node, tenant, key, method, path, now) in refused {
            assert!(
                !ok(&sig, node, tenant, key, method, path, now),
                "{node} {tenant} {key:?} {method} {path} {now}"
            );
        }
        // Fields cannot be shifted into each other: the key's id moved into the tenant.
        let none = s.sign("http://a:1", "t1key_1", "", "GET", "/v1/sessions/x", 1000);
        assert!(!ok(
            &none,
            "http://a:1",
            "t1",
            "key_1",
            "GET",
            "/v1/sessions/x",
            1000
        ));
        // The earlier signature, of the field list without the key, is no longer accepted.
        let mut old = Hmac::<Sha256>::new_from_slice(&[b'k'; 32]).expect("hmac");
        for field in ["http://a:1", "t1", "GET", "/v1/sessions/x", "1000"] {
            old.update(field.as_bytes());
            old.update(b"\0");
        }
        let hex: String = old
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let old = format!("t=1000,s={hex}");
        assert!(!ok(
            &old,
            "http://a:1",
            "t1",
            "",
            "GET",
            "/v1/sessions/x",
            1000
        ));
        // Another cluster's secret, and malformed values.
        let other = ClusterSecret::new(&[b'o'; 32]).expect("secret");
        assert!(!other.verify(
            &sig,
            "http://a:1",
            "t1",
            "key_1",
            "GET",
            "/v1/sessions/x",
            1010
        ));
        for bad in ["", "t=1000", "t=x,s=00", "t=1000,s=zz", "t=1000,s=0"] {
            assert!(!ok(
                bad,
                "http://a:1",
                "t1",
                "key_1",
                "GET",
                "/v1/sessions/x",
                1000
            ));
        }
        assert!(ClusterSecret::new(b"short\n").is_err());
    }
}
