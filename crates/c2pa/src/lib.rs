//! C2PA manifests in the PNG and JPEG images an execution produced, so that anyone holding
//! such an image can check, with a standard C2PA tool, that runcell made it and in which
//! execution (issue 24; docs/operations.md, "C2PA manifests in images").
//!
//! - [`Credentials`]: the server's certificate chain. C2PA signatures carry an X.509 chain,
//!   so each server has its own small CA ("runcell CA") and a signing certificate issued by it.
//!   Both keys are Ed25519 and derived from the audit signing key (`keys/audit-signing.key`,
//!   see [`Credentials::from_secrets`]), and every field of both certificates is a function of
//!   those keys: the same data dir always yields byte-identical certificates, so there is no
//!   second secret to back up and nothing to keep in step. A verifier trusts the CA
//!   (`GET /v1/audit/c2pa-ca`) as it trusts the audit public key.
//! - [`Credentials::sign`]: an image with a manifest embedded: claim generator
//!   `runcell/<version>`, a `c2pa.created` action by the software agent runcell with IPTC's
//!   digital source type `algorithmicMedia`, and the assertion [`ASSERTION`] naming the
//!   execution (id, session, tenant, SHA-256 of the code, time; for a workspace file its path
//!   and the SHA-256 of its bytes as the sandbox left them).
//! - [`read`]: what a manifest in an image says and whether it validates, optionally against a
//!   trust anchor (`runcell verify`).

use std::io::Cursor;
use std::sync::Arc;

use c2pa::{Builder, Context, Reader};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The label of runcell's own assertion in every manifest it signs.
pub const ASSERTION: &str = "org.runcell.execution";

/// The image formats runcell embeds manifests in.
pub const FORMATS: [&str; 2] = ["image/png", "image/jpeg"];

/// IPTC's digital source type for media made by an algorithm (a plot from code).
const ALGORITHMIC_MEDIA: &str = "http://cv.iptc.org/newscodes/digitalsourcetype/algorithmicMedia";

/// The extended key usage C2PA validators accept for a signing certificate
/// (id-kp-documentSigning, RFC 9336).
const DOCUMENT_SIGNING: [u64; 9] = [1, 3, 6, 1, 5, 5, 7, 3, 36];
/// C2PA's own signing EKU (c2pa-kp-claimSigning).
const C2PA_SIGNING: [u64; 9] = [1, 3, 6, 1, 4, 1, 62558, 2, 1];

/// What went wrong building credentials, signing or reading.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot build the C2PA certificate chain: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("{0} is not an image format runcell signs (image/png, image/jpeg)")]
    Format(String),
    #[error("C2PA: {0}")]
    C2pa(#[from] c2pa::Error),
}

/// Which execution produced an image: what runcell's assertion says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub execution_id: String,
    pub session_id: Option<String>,
    pub tenant: String,
    /// SHA-256 of the code that ran, hex.
    pub code_sha256: String,
    /// When runcell received the image from the kernel (a display output) or when the
    /// execution that left the workspace file finished, RFC 3339.
    pub time: String,
    /// For a workspace file signed on download: its path in the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// For a workspace file: SHA-256 of its bytes as the sandbox left them (`files[].sha256`
    /// and the `?provenance` statement name these; the signed copy's bytes differ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_sha256: Option<String>,
}

/// The server's C2PA signing identity: a CA certificate and a signing certificate it issued,
/// with the signing key.
pub struct Credentials {
    signer: c2pa::BoxedSigner,
    ca_pem: String,
    /// Signing certificate then CA, PEM: what each manifest carries.
    chain_pem: String,
    context: Arc<Context>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a key.
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

/// An Ed25519 private key from its 32-byte seed, as PKCS #8 v1 DER (RFC 8410).
fn ed25519_pkcs8(seed: &[u8; 32]) -> Vec<u8> {
    let mut der = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend_from_slice(seed);
    der
}

/// A positive 16-byte serial number from a public key (so a certificate is a function of its
/// key: the same data dir always makes the same certificates).
fn serial(public_key: &[u8]) -> SerialNumber {
    let mut s = Sha256::digest(public_key)[..16].to_vec();
    s[0] &= 0x7f;
    s[0] |= 0x01;
    SerialNumber::from_slice(&s)
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "runcell");
    dn.push(DnType::CommonName, common_name);
    dn
}

impl Credentials {
    /// The credentials of the keys with these two seeds (Ed25519): the CA's and the signing
    /// certificate's. `server` names the server in the certificates' subjects (its audit
    /// public key id, so two servers' chains are told apart).
    pub fn from_secrets(
        ca_seed: [u8; 32],
        leaf_seed: [u8; 32],
        server: &str,
    ) -> Result<Self, Error> {
        let ca_key = KeyPair::try_from(ed25519_pkcs8(&ca_seed))?;
        let leaf_key = KeyPair::try_from(ed25519_pkcs8(&leaf_seed))?;

        let mut ca = CertificateParams::default();
        ca.distinguished_name = name(&format!("runcell CA {server}"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.serial_number = Some(serial(ca_key.public_key_raw()));
        // Fixed dates keep the certificates reproducible; C2PA checks validity at signing time.
        ca.not_before = rcgen::date_time_ymd(2025, 1, 1);
        ca.not_after = rcgen::date_time_ymd(2075, 1, 1);
        let ca_cert = ca.self_signed(&ca_key)?;

        let mut leaf = CertificateParams::default();
        leaf.distinguished_name = name(&format!("runcell {server}"));
        leaf.is_ca = IsCa::ExplicitNoCa;
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // C2PA's certificate profile requires one of its signing EKUs (valid_eku_oids) and an
        // authority key identifier on a certificate that is not self-signed.
        leaf.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::Other(C2PA_SIGNING.to_vec()),
            ExtendedKeyUsagePurpose::Other(DOCUMENT_SIGNING.to_vec()),
            ExtendedKeyUsagePurpose::EmailProtection,
        ];
        leaf.use_authority_key_identifier_extension = true;
        leaf.serial_number = Some(serial(leaf_key.public_key_raw()));
        leaf.not_before = rcgen::date_time_ymd(2025, 1, 1);
        leaf.not_after = rcgen::date_time_ymd(2075, 1, 1);
        let issuer = Issuer::new(ca, &ca_key);
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer)?;

        let ca_pem = ca_cert.pem();
        let chain_pem = format!("{}{}", leaf_cert.pem(), ca_pem);
        let signer = c2pa::create_signer::from_keys(
            chain_pem.as_bytes(),
            leaf_key.serialize_pem().as_bytes(),
            c2pa::SigningAlg::Ed25519,
            None,
        )?;
        Ok(Credentials {
            signer,
            ca_pem,
            chain_pem,
            context: Arc::new(Context::new().with_settings(settings(None).to_string())?),
        })
    }

    /// The CA certificate, PEM: the trust anchor for this server's manifests.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The signing certificate and the CA, PEM.
    pub fn chain_pem(&self) -> &str {
        &self.chain_pem
    }

    /// `image` (a PNG or JPEG, by `mime`) with a manifest embedded that names `origin`.
    /// Any manifest the image already carried is kept as the new one's parent ingredient
    /// (the C2PA SDK's default), so an image re-signed is still checkable.
    pub fn sign(&self, mime: &str, image: &[u8], origin: &Origin) -> Result<Vec<u8>, Error> {
        if !FORMATS.contains(&mime) {
            return Err(Error::Format(mime.to_owned()));
        }
        let version = env!("CARGO_PKG_VERSION");
        let definition = json!({
            "claim_generator_info": [{"name": "runcell", "version": version}],
            "title": origin.path.as_deref().unwrap_or(&origin.execution_id),
            "assertions": [
                {"label": "c2pa.actions", "data": {"actions": [{
                    "action": "c2pa.created",
                    "softwareAgent": {"name": "runcell", "version": version},
                    "digitalSourceType": ALGORITHMIC_MEDIA,
                    "when": origin.time,
                }]}},
                {"label": ASSERTION, "data": origin},
            ],
        });
        let mut builder =
            Builder::from_shared_context(&self.context).with_definition(definition.to_string())?;
        let mut source = Cursor::new(image);
        let mut dest = Cursor::new(Vec::with_capacity(image.len() + 16 * 1024));
        builder.sign(self.signer.as_ref(), mime, &mut source, &mut dest)?;
        Ok(dest.into_inner())
    }
}

/// The SDK's settings: trust `trust_anchor` (PEM) if given, else check no trust; no
/// thumbnails (the feature is not built; the SDK warns on every call unless told so).
fn settings(trust_anchor: Option<&str>) -> Value {
    let mut s = json!({
        "builder": {"thumbnail": {"enabled": false}},
        "verify": {"verify_trust": trust_anchor.is_some()},
    });
    if let Some(pem) = trust_anchor {
        s["trust"] = json!({ "trust_anchors": pem });
    }
    s
}

/// What [`read`] found in an image.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `Trusted` (valid, and the chain ends at the trust anchor given), `Valid` (the
    /// signature and hashes check, the signer is not known to be trusted) or `Invalid`.
    pub state: String,
    /// The active manifest's claim generator (`runcell/0.1.0`).
    pub claim_generator: Option<String>,
    /// The signing certificate's issuer (`runcell CA …`).
    pub issuer: Option<String>,
    /// runcell's assertion, when the manifest has one.
    pub runcell: Option<Origin>,
    /// Every failure code the validator reported, with its explanation.
    pub failures: Vec<Status>,
}

/// One validation status code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    pub code: String,
    pub explanation: Option<String>,
}

/// Reads the C2PA manifest of `image` (format by `mime`, or sniffed from its bytes) and
/// validates it; with `trust_anchor` (PEM), a chain ending there is `Trusted`. `Ok(None)`:
/// the image carries no manifest.
pub fn read(mime: &str, image: &[u8], trust_anchor: Option<&str>) -> Result<Option<Report>, Error> {
    let context = Context::new().with_settings(settings(trust_anchor).to_string())?;
    let reader = match Reader::from_context(context).with_stream(mime, Cursor::new(image)) {
        Ok(r) => r,
        Err(c2pa::Error::JumbfNotFound) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let store: Value = serde_json::from_str(&reader.json()).unwrap_or(Value::Null);
    let active = store["active_manifest"]
        .as_str()
        .and_then(|label| store["manifests"].get(label))
        .cloned()
        .unwrap_or(Value::Null);
    let claim_generator = active["claim_generator_info"]
        .as_array()
        .and_then(|a| a.first())
        .map(|g| {
            format!(
                "{}/{}",
                g["name"].as_str().unwrap_or("?"),
                g["version"].as_str().unwrap_or("?")
            )
        });
    let runcell = active["assertions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["label"] == ASSERTION)
        .and_then(|a| serde_json::from_value(a["data"].clone()).ok());
    let mut failures = Vec::new();
    if let Some(results) = reader.validation_results() {
        if let Some(codes) = results.active_manifest() {
            for s in codes.failure() {
                failures.push(Status {
                    code: s.code().to_owned(),
                    explanation: s.explanation().map(str::to_owned),
                });
            }
        }
    } else if let Some(status) = reader.validation_status() {
        for s in status {
            failures.push(Status {
                code: s.code().to_owned(),
                explanation: s.explanation().map(str::to_owned),
            });
        }
    }
    Ok(Some(Report {
        state: format!("{:?}", reader.validation_state()),
        claim_generator,
        issuer: active["signature_info"]["issuer"]
            .as_str()
            .or_else(|| active["signature_info"]["common_name"].as_str())
            .map(str::to_owned),
        runcell,
        failures,
    }))
}

#[cfg(test)]
mod tests;
