//! C2PA manifests in a cell's PNG and JPEG results (issue 24; docs/operations.md, "C2PA
//! manifests in images").
//!
//! The images a kernel displays (`results[].data["image/png"]`, `["image/jpeg"]`) come to the
//! host as bytes in a protocol message; signing them is the host signing what it received,
//! not acting on a file the sandbox wrote (DESIGN.md §3). The engine knows no C2PA: the
//! server hands it an [`ImageSigner`] (`runcell-c2pa`, wired by the CLI), and each result is
//! signed on the session's own thread before anyone sees it: the NDJSON event, the Execution,
//! the audit record, MCP and the vendor APIs all carry the same signed bytes.
//!
//! The work is bounded by the results' own bounds (64 results of at most 8 MiB each per
//! cell): one parse and one SHA-256 of each image, and an Ed25519 signature.

use std::collections::HashMap;
use std::fmt::Debug;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::model::ResultItem;

/// Which execution an image came from: what the embedded manifest says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageOrigin {
    pub execution_id: String,
    pub session_id: Option<String>,
    /// The session's owner.
    pub tenant: String,
    /// SHA-256 of the cell's code, hex.
    pub code_sha256: String,
    /// When runcell received the image (a result) or when the execution that left the file
    /// finished (a workspace file), RFC 3339.
    pub time: String,
    /// A workspace file's path and the SHA-256 of its bytes as the sandbox left them; none
    /// for a result.
    pub file: Option<(String, String)>,
}

/// Embeds a signed C2PA manifest in an image.
pub trait ImageSigner: Send + Sync + Debug {
    /// `image` (`mime` is `image/png` or `image/jpeg`) with a manifest naming `origin`; an
    /// image the signer cannot parse is an error, and the caller keeps it as it was.
    fn sign(&self, mime: &str, image: &[u8], origin: &ImageOrigin) -> Result<Vec<u8>, String>;

    /// The trust anchor verifiers need (the CA certificate, PEM).
    fn trust_anchor_pem(&self) -> &str;
}

/// The MIME types signed.
pub const SIGNED_IMAGE_TYPES: [&str; 2] = ["image/png", "image/jpeg"];

/// Signs one cell's image results. An image seen twice in a cell (streamed as an event, then
/// in the Execution) is signed once, so both carry the same bytes.
pub(crate) struct Stamper<'a> {
    signer: &'a dyn ImageSigner,
    origin: ImageOrigin,
    /// SHA-256 of the image as received → its signed copy, base64.
    signed: HashMap<[u8; 32], String>,
}

impl<'a> Stamper<'a> {
    pub(crate) fn new(
        signer: &'a dyn ImageSigner,
        execution_id: &str,
        session_id: Option<&str>,
        tenant: &str,
        code: &str,
    ) -> Stamper<'a> {
        Stamper {
            signer,
            origin: ImageOrigin {
                execution_id: execution_id.to_owned(),
                session_id: session_id.map(str::to_owned),
                tenant: tenant.to_owned(),
                code_sha256: crate::hashing::sha256_hex(code.as_bytes()),
                time: String::new(),
                file: None,
            },
            signed: HashMap::new(),
        }
    }

    /// Whether `item` holds an image this signs.
    pub(crate) fn wants(item: &ResultItem) -> bool {
        SIGNED_IMAGE_TYPES
            .iter()
            .any(|m| item.data.contains_key(*m))
    }

    /// Replaces `item`'s PNG and JPEG with signed copies. One that is not valid base64 or
    /// that the signer cannot parse stays as it came (logged: an image a viewer may not show
    /// either), since a result is never dropped for want of a signature.
    pub(crate) fn stamp(&mut self, item: &mut ResultItem) {
        for mime in SIGNED_IMAGE_TYPES {
            let Some(b64) = item.data.get_mut(mime) else {
                continue;
            };
            let b64_engine = base64::engine::general_purpose::STANDARD;
            let Ok(raw) = b64_engine.decode(b64.trim()) else {
                tracing::debug!(mime, "a result image that is not base64 is left unsigned");
                continue;
            };
            let digest: [u8; 32] = Sha256::digest(&raw).into();
            if let Some(done) = self.signed.get(&digest) {
                b64.clone_from(done);
                continue;
            }
            self.origin.time =
                chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            match self.signer.sign(mime, &raw, &self.origin) {
                Ok(signed) => {
                    let encoded = b64_engine.encode(signed);
                    self.signed.insert(digest, encoded.clone());
                    *b64 = encoded;
                }
                Err(why) => {
                    tracing::debug!(mime, error = %why, "a result image is left unsigned");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Appends the origin to the image, or refuses anything not starting with "IMG".
    #[derive(Debug, Default)]
    struct Fake(AtomicUsize);

    impl ImageSigner for Fake {
        fn sign(&self, mime: &str, image: &[u8], o: &ImageOrigin) -> Result<Vec<u8>, String> {
            if !image.starts_with(b"IMG") {
                return Err("not an image".into());
            }
            self.0.fetch_add(1, Ordering::SeqCst);
            let mut out = image.to_vec();
            out.extend(
                format!("|{mime}|{}|{}|{}", o.execution_id, o.tenant, o.code_sha256).bytes(),
            );
            Ok(out)
        }
        fn trust_anchor_pem(&self) -> &str {
            ""
        }
    }

    fn item(pairs: &[(&str, &[u8])]) -> ResultItem {
        let e = base64::engine::general_purpose::STANDARD;
        let data: BTreeMap<String, String> = pairs
            .iter()
            .map(|(m, b)| ((*m).to_owned(), e.encode(b)))
            .collect();
        ResultItem::new(false, data)
    }

    fn decoded(item: &ResultItem, mime: &str) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(&item.data[mime])
            .expect("base64")
    }

    #[test]
    fn png_and_jpeg_are_signed_once_and_the_rest_is_left_alone() {
        let signer = Fake::default();
        let mut s = Stamper::new(&signer, "ex_1", Some("ses_1"), "acme", "plot()");
        let code_hash = crate::hashing::sha256_hex(b"plot()");
        let mut a = item(&[("image/png", b"IMGpng"), ("text/plain", b"<Figure>")]);
        assert!(Stamper::wants(&a));
        s.stamp(&mut a);
        assert_eq!(
            decoded(&a, "image/png"),
            format!("IMGpng|image/png|ex_1|acme|{code_hash}").into_bytes()
        );
        assert_eq!(a.data["text/plain"], item(&[("t", b"<Figure>")]).data["t"]);
        // The same image again (the Execution after the streamed event): the same bytes,
        // without a second signature.
        let mut again = item(&[("image/png", b"IMGpng")]);
        s.stamp(&mut again);
        assert_eq!(again.data["image/png"], a.data["image/png"]);
        assert_eq!(signer.0.load(Ordering::SeqCst), 1);

        let mut j = item(&[("image/jpeg", b"IMGjpg")]);
        s.stamp(&mut j);
        assert!(decoded(&j, "image/jpeg").starts_with(b"IMGjpg|image/jpeg|ex_1"));

        // What the signer refuses, and what is not base64, stay as they came.
        let mut bad = item(&[("image/png", b"not an image")]);
        let before = bad.clone();
        s.stamp(&mut bad);
        assert_eq!(bad, before);
        let mut garbled = ResultItem::new(
            false,
            BTreeMap::from([("image/png".to_owned(), "%%%".to_owned())]),
        );
        s.stamp(&mut garbled);
        assert_eq!(garbled.data["image/png"], "%%%");
        assert!(!Stamper::wants(&item(&[("image/svg+xml", b"<svg/>")])));
    }
}
