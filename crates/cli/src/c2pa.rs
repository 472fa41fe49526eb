//! The server's C2PA signing identity (`runcell-c2pa`), made from the audit signing key and
//! handed to the engine, which signs every PNG and JPEG result with it (docs/operations.md,
//! "C2PA manifests in images").

use std::sync::Arc;

use anyhow::Context;
use runcell_engine::{ImageOrigin, ImageSigner};
use runcell_store::audit::signed::AuditSigner;

/// The purposes the two certificate keys are derived for from the audit key.
const CA_PURPOSE: &str = "c2pa-ca";
const LEAF_PURPOSE: &str = "c2pa-signing";

/// [`runcell_c2pa::Credentials`] as the engine's [`ImageSigner`].
#[derive(Debug)]
pub(crate) struct C2paImages(runcell_c2pa::Credentials);

impl ImageSigner for C2paImages {
    fn sign(&self, mime: &str, image: &[u8], o: &ImageOrigin) -> Result<Vec<u8>, String> {
        let origin = runcell_c2pa::Origin {
            execution_id: o.execution_id.clone(),
            session_id: o.session_id.clone(),
            tenant: o.tenant.clone(),
            code_sha256: o.code_sha256.clone(),
            time: o.time.clone(),
            path: o.file.as_ref().map(|(p, _)| p.clone()),
            source_sha256: o.file.as_ref().map(|(_, h)| h.clone()),
        };
        self.0.sign(mime, image, &origin).map_err(|e| e.to_string())
    }

    fn trust_anchor_pem(&self) -> &str {
        self.0.ca_pem()
    }
}

/// The C2PA credentials of the data dir whose audit key is `audit`: the same key always gives
/// the same CA and signing certificate.
pub(crate) fn credentials(audit: &AuditSigner) -> anyhow::Result<runcell_c2pa::Credentials> {
    runcell_c2pa::Credentials::from_secrets(
        audit.derive_secret(CA_PURPOSE),
        audit.derive_secret(LEAF_PURPOSE),
        &audit.public_key().id(),
    )
    .context("cannot make the C2PA signing certificates")
}

/// The engine's image signer for a server whose audit key is `audit`.
pub(crate) fn image_signer(audit: &AuditSigner) -> anyhow::Result<Arc<dyn ImageSigner>> {
    Ok(Arc::new(C2paImages(credentials(audit)?)))
}
