//! Signed checkpoints: a small statement of where each tenant's chain stood, signed with
//! Ed25519, meant to be stored somewhere the database's editors cannot reach.
//!
//! ```json
//! {"type":"runcell.audit.checkpoint","version":1,"scope":"all",
//!  "time":"2026-01-01T00:00:00.000000000Z","key_id":"3f1c…",
//!  "tenants":[{"tenant":"default","count":42,"head":"9a0b…"}],
//!  "signature":"<128 hex characters>"}
//! ```
//!
//! `scope` is `all` when the statement lists every tenant the server had (so a tenant deleted
//! whole later is detected: it is in the list and gone from the database) or `tenant` for one
//! tenant's statement (what a key holder gets over HTTP). The signature is Ed25519 over
//!
//! ```text
//! field("runcell-audit-checkpoint-v1") || field(scope) || field(time) || field(key_id)
//!   || be_u64(number of tenants) || for each tenant, in the listed order:
//!      field(tenant) || be_u64(count) || field(head)
//! ```
//!
//! with `field` as in the chain's encoding (length, then bytes). `key_id` is the first 16 hex
//! characters of SHA-256 of the 32-byte public key.

use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::field;
use super::keys::{parse32, random32, read32, write_new};
use crate::error::Result;
use crate::validate::hex;
use crate::ChainHead;

/// The `type` of every checkpoint.
pub const CHECKPOINT_TYPE: &str = "runcell.audit.checkpoint";
const DOMAIN: &str = "runcell-audit-checkpoint-v1";

/// What a checkpoint covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every tenant the chain had when it was taken.
    All,
    /// The tenants listed only.
    Tenant,
}

impl Scope {
    fn as_str(self) -> &'static str {
        match self {
            Scope::All => "all",
            Scope::Tenant => "tenant",
        }
    }
}

/// A signed statement of each listed tenant's chain: record `count` has hash `head`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Always [`CHECKPOINT_TYPE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// Format version, 1.
    pub version: u32,
    /// What the list covers.
    pub scope: Scope,
    /// When it was taken (RFC 3339 UTC).
    pub time: String,
    /// The signing key's id (see the module docs).
    pub key_id: String,
    /// Each tenant's chain, by name.
    pub tenants: Vec<ChainHead>,
    /// Ed25519 signature over the canonical encoding, hex.
    pub signature: String,
}

impl Checkpoint {
    /// The positions it fixes, for [`crate::DomainStore::verify_extends`].
    pub fn expected(&self) -> Vec<crate::Expected> {
        self.tenants
            .iter()
            .map(|h| crate::Expected {
                head: h.clone(),
                source: format!("checkpoint of {}", self.time),
            })
            .collect()
    }
}

fn canonical(scope: Scope, time: &str, key_id: &str, tenants: &[ChainHead]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut out = |b: &[u8]| buf.extend_from_slice(b);
    field(&mut out, DOMAIN);
    field(&mut out, scope.as_str());
    field(&mut out, time);
    field(&mut out, key_id);
    out(&(tenants.len() as u64).to_be_bytes());
    for t in tenants {
        field(&mut out, &t.tenant);
        out(&t.count.to_be_bytes());
        field(&mut out, &t.head);
    }
    buf
}

/// The key checkpoints are signed with.
#[derive(Debug)]
pub struct AuditSigner {
    key: SigningKey,
}

impl AuditSigner {
    /// Loads the signing key at `path`, creating it (0600) if it does not exist.
    pub fn load_or_create(path: &Path) -> Result<AuditSigner> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => Self::load(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let seed = random32()?;
                match write_new(path, &hex(&seed), true) {
                    Ok(()) => Ok(AuditSigner {
                        key: SigningKey::from_bytes(&seed),
                    }),
                    // Another process created it meanwhile: use theirs.
                    Err(_) if path.exists() => Self::load(path),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(crate::StoreError::AuditKey {
                path: path.to_owned(),
                problem: "cannot read".into(),
                source: Some(e),
            }),
        }
    }

    /// Loads the signing key at `path`.
    pub fn load(path: &Path) -> Result<AuditSigner> {
        Ok(AuditSigner {
            key: SigningKey::from_bytes(&read32(path)?),
        })
    }

    /// A signer with a fresh random key, kept nowhere (for tests).
    pub fn ephemeral() -> Result<AuditSigner> {
        Ok(AuditSigner {
            key: SigningKey::from_bytes(&random32()?),
        })
    }

    pub(super) fn key(&self) -> &SigningKey {
        &self.key
    }

    /// A secret derived from this key for another `purpose` (SHA-256 over a domain tag, the
    /// purpose and the seed): the C2PA certificate keys (`runcell-c2pa`) come from here, so
    /// the audit key stays the one secret a data dir holds for signing. Different purposes
    /// give unrelated secrets, and none reveals the seed.
    pub fn derive_secret(&self, purpose: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"runcell-derived-secret-v1\0");
        h.update((purpose.len() as u64).to_be_bytes());
        h.update(purpose.as_bytes());
        h.update(self.key.to_bytes());
        h.finalize().into()
    }

    /// The public half, to publish.
    pub fn public_key(&self) -> AuditPublicKey {
        AuditPublicKey(self.key.verifying_key())
    }

    /// Signs a statement of `tenants` at `time` (RFC 3339 text).
    pub fn sign(&self, scope: Scope, time: String, mut tenants: Vec<ChainHead>) -> Checkpoint {
        tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        let key_id = self.public_key().id();
        let sig = self.key.sign(&canonical(scope, &time, &key_id, &tenants));
        Checkpoint {
            kind: CHECKPOINT_TYPE.into(),
            version: 1,
            scope,
            time,
            key_id,
            tenants,
            signature: hex(&sig.to_bytes()),
        }
    }

    /// Signs the chain heads of `tenant` (or of every tenant) in `store` as they are now.
    pub fn checkpoint(
        &self,
        store: &dyn crate::Backend,
        tenant: Option<&str>,
    ) -> Result<Checkpoint> {
        let heads = store.chain_heads(tenant)?;
        let scope = if tenant.is_some() {
            Scope::Tenant
        } else {
            Scope::All
        };
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        Ok(self.sign(scope, now, heads))
    }
}

/// An Ed25519 public key checkpoints are verified with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditPublicKey(VerifyingKey);

impl AuditPublicKey {
    /// From 64 hex characters.
    pub fn from_hex(s: &str) -> Option<AuditPublicKey> {
        VerifyingKey::from_bytes(&parse32(s.trim())?)
            .ok()
            .map(AuditPublicKey)
    }

    pub(super) fn verifying_key(&self) -> &VerifyingKey {
        &self.0
    }

    /// The key as 64 hex characters.
    pub fn to_hex(&self) -> String {
        hex(self.0.as_bytes())
    }

    /// The first 16 hex characters of SHA-256 of the key.
    pub fn id(&self) -> String {
        hex(&Sha256::digest(self.0.as_bytes())[..8])
    }

    /// Checks that `cp` is a well-formed checkpoint signed by this key; the error says why not.
    pub fn verify(&self, cp: &Checkpoint) -> std::result::Result<(), String> {
        if cp.kind != CHECKPOINT_TYPE {
            return Err(format!("not a checkpoint (type {:?})", cp.kind));
        }
        if cp.version != 1 {
            return Err(format!("unknown checkpoint version {}", cp.version));
        }
        if cp.key_id != self.id() {
            return Err(format!(
                "signed by another key (key id {}, this public key is {})",
                cp.key_id,
                self.id()
            ));
        }
        let sig = parse_sig(&cp.signature).ok_or("the signature is not 128 hex characters")?;
        self.0
            .verify(
                &canonical(cp.scope, &cp.time, &cp.key_id, &cp.tenants),
                &Signature::from_bytes(&sig),
            )
            .map_err(|_| "the signature does not verify: the checkpoint was altered".to_owned())
    }
}

pub(super) fn parse_sig(s: &str) -> Option<[u8; 64]> {
    if s.len() != 128 {
        return None;
    }
    let (a, b) = s.split_at(64);
    let mut out = [0u8; 64];
    out[..32].copy_from_slice(&parse32(a)?);
    out[32..].copy_from_slice(&parse32(b)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads() -> Vec<ChainHead> {
        vec![
            ChainHead {
                tenant: "b".into(),
                count: 2,
                head: "aa".repeat(32),
            },
            ChainHead {
                tenant: "a".into(),
                count: 7,
                head: "bb".repeat(32),
            },
        ]
    }

    #[test]
    fn a_signed_checkpoint_verifies_and_any_change_breaks_it() {
        let s = AuditSigner::ephemeral().expect("key");
        let pk = s.public_key();
        let cp = s.sign(Scope::All, "2026-01-01T00:00:00.000000000Z".into(), heads());
        assert_eq!(cp.tenants[0].tenant, "a", "sorted by tenant");
        pk.verify(&cp).expect("verifies");
        let json = serde_json::to_string(&cp).expect("json");
        let back: Checkpoint = serde_json::from_str(&json).expect("parse");
        pk.verify(&back).expect("round trip verifies");

        let mut c = cp.clone();
        c.tenants[0].count = 6;
        assert!(pk.verify(&c).expect_err("count").contains("altered"));
        let mut c = cp.clone();
        c.tenants[1].head = "cc".repeat(32);
        assert!(pk.verify(&c).expect_err("head").contains("altered"));
        let mut c = cp.clone();
        c.tenants.remove(0);
        assert!(pk.verify(&c).is_err());
        let mut c = cp.clone();
        c.scope = Scope::Tenant;
        assert!(pk.verify(&c).is_err());
        let mut c = cp.clone();
        c.time = "2027-01-01T00:00:00.000000000Z".into();
        assert!(pk.verify(&c).is_err());
        let mut c = cp.clone();
        c.signature.replace_range(
            0..2,
            if &c.signature[..2] == "00" {
                "01"
            } else {
                "00"
            },
        );
        assert!(pk.verify(&c).expect_err("sig").contains("altered"));
        let other = AuditSigner::ephemeral().expect("key").public_key();
        assert!(other
            .verify(&cp)
            .expect_err("other")
            .contains("another key"));
        assert_eq!(AuditPublicKey::from_hex(&pk.to_hex()), Some(pk));
    }
}
