//! Signed provenance statements: which execution produced a file, signed with the audit
//! checkpoint key, so the file can be checked anywhere against the published public key.
//!
//! ```json
//! {"type":"runcell.provenance","version":1,"path":"chart.png","size":20311,
//!  "sha256":"<64 hex>","mime":"image/png","execution_id":"ex_…","code_sha256":"<64 hex>",
//!  "session_id":"ses_…","tenant":"default","time":"2026-01-01T00:00:00.000Z",
//!  "key_id":"3f1c…","signature":"<128 hex characters>"}
//! ```
//!
//! `time` is when the execution finished (the file's content is what it left). The signature
//! is Ed25519 over
//!
//! ```text
//! field("runcell-provenance-v1") || field(path) || be_u64(size) || field(sha256) || field(mime)
//!   || field(execution_id) || field(code_sha256) || field(session_id, "" for none)
//!   || field(tenant) || field(time) || field(key_id)
//! ```
//!
//! with `field` as in the chain's encoding (length, then bytes).

use ed25519_dalek::{Signature, Signer, Verifier};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::field;
use super::signed::{parse_sig, AuditPublicKey, AuditSigner};
use crate::validate::hex;

/// The `type` of every provenance statement.
pub const PROVENANCE_TYPE: &str = "runcell.provenance";
const DOMAIN: &str = "runcell-provenance-v1";

/// What a statement says of a file, before it is signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOrigin {
    pub path: String,
    pub size: u64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
    pub mime: String,
    pub execution_id: String,
    /// SHA-256 of the code that ran, hex.
    pub code_sha256: String,
    pub session_id: Option<String>,
    pub tenant: String,
    /// When the execution finished, RFC 3339.
    pub time: String,
}

/// A signed statement of a file's origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// Always [`PROVENANCE_TYPE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// Format version, 1.
    pub version: u32,
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub mime: String,
    pub execution_id: String,
    pub code_sha256: String,
    pub session_id: Option<String>,
    pub tenant: String,
    pub time: String,
    /// The signing key's id (first 16 hex characters of SHA-256 of the public key).
    pub key_id: String,
    /// Ed25519 signature over the canonical encoding, hex.
    pub signature: String,
}

fn canonical(p: &Provenance) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut out = |b: &[u8]| buf.extend_from_slice(b);
    field(&mut out, DOMAIN);
    field(&mut out, &p.path);
    out(&p.size.to_be_bytes());
    field(&mut out, &p.sha256);
    field(&mut out, &p.mime);
    field(&mut out, &p.execution_id);
    field(&mut out, &p.code_sha256);
    field(&mut out, p.session_id.as_deref().unwrap_or(""));
    field(&mut out, &p.tenant);
    field(&mut out, &p.time);
    field(&mut out, &p.key_id);
    buf
}

impl AuditSigner {
    /// Signs a statement of `origin`.
    pub fn sign_provenance(&self, origin: FileOrigin) -> Provenance {
        let mut p = Provenance {
            kind: PROVENANCE_TYPE.into(),
            version: 1,
            path: origin.path,
            size: origin.size,
            sha256: origin.sha256,
            mime: origin.mime,
            execution_id: origin.execution_id,
            code_sha256: origin.code_sha256,
            session_id: origin.session_id,
            tenant: origin.tenant,
            time: origin.time,
            key_id: self.public_key().id(),
            signature: String::new(),
        };
        p.signature = hex(&self.key().sign(&canonical(&p)).to_bytes());
        p
    }
}

impl AuditPublicKey {
    /// Checks that `p` is signed by this key and that `content` is the file it describes; the
    /// error says why not.
    pub fn verify_provenance(
        &self,
        p: &Provenance,
        content: &[u8],
    ) -> std::result::Result<(), String> {
        if p.kind != PROVENANCE_TYPE {
            return Err(format!("not a provenance statement (type {:?})", p.kind));
        }
        if p.version != 1 {
            return Err(format!("unknown provenance version {}", p.version));
        }
        if p.key_id != self.id() {
            return Err(format!(
                "signed by another key (key id {}, this public key is {})",
                p.key_id,
                self.id()
            ));
        }
        let sig = parse_sig(&p.signature).ok_or("the signature is not 128 hex characters")?;
        self.verifying_key()
            .verify(&canonical(p), &Signature::from_bytes(&sig))
            .map_err(|_| "the signature does not verify: the statement was altered".to_owned())?;
        let actual = hex(&Sha256::digest(content));
        if actual != p.sha256 || content.len() as u64 != p.size {
            return Err(format!(
                "the file is not the one the statement describes: its SHA-256 is {actual} \
                 ({} bytes), the statement's {} ({} bytes)",
                content.len(),
                p.sha256,
                p.size
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(content: &[u8]) -> FileOrigin {
        FileOrigin {
            path: "out/chart.png".into(),
            size: content.len() as u64,
            sha256: hex(&Sha256::digest(content)),
            mime: "image/png".into(),
            execution_id: "ex_1".into(),
            code_sha256: hex(&Sha256::digest(b"print(1)")),
            session_id: Some("ses_1".into()),
            tenant: "acme".into(),
            time: "2026-01-01T00:00:00.000Z".into(),
        }
    }

    #[test]
    fn a_statement_verifies_its_file_and_nothing_else() {
        let s = AuditSigner::ephemeral().expect("key");
        let pk = s.public_key();
        let content = b"\x89PNG fake image".to_vec();
        let p = s.sign_provenance(origin(&content));
        pk.verify_provenance(&p, &content).expect("verifies");
        let back: Provenance =
            serde_json::from_str(&serde_json::to_string(&p).expect("json")).expect("parse");
        pk.verify_provenance(&back, &content).expect("round trip");

        let mut tampered = content.clone();
        tampered[3] ^= 1;
        let why = pk.verify_provenance(&p, &tampered).expect_err("one byte");
        assert!(why.contains("not the one the statement describes"), "{why}");

        for edit in [
            |p: &mut Provenance| p.execution_id = "ex_2".into(),
            |p: &mut Provenance| p.tenant = "other".into(),
            |p: &mut Provenance| p.session_id = None,
            |p: &mut Provenance| p.code_sha256 = "00".repeat(32),
            |p: &mut Provenance| p.time = "2027-01-01T00:00:00.000Z".into(),
            |p: &mut Provenance| p.path = "x.png".into(),
        ] {
            let mut q = p.clone();
            edit(&mut q);
            let why = pk.verify_provenance(&q, &content).expect_err("edited");
            assert!(why.contains("altered"), "{why}");
        }
        let other = AuditSigner::ephemeral().expect("key").public_key();
        assert!(other
            .verify_provenance(&p, &content)
            .expect_err("other key")
            .contains("another key"));
    }
}
