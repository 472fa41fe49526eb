//! runcell's certificate authority for the domains whose requests get a secret header: one per
//! server, kept in its data directory (the private key readable by the server's user only,
//! never bound into a sandbox), and the leaf certificates it mints for those domains on demand.
//!
//! Sandboxes with a network policy trust it (the engine binds its certificate in and points
//! every client's trust store at a bundle holding it); nothing else does.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration as Span, OffsetDateTime};

/// The file names in the authority's directory.
const CERT_FILE: &str = "ca.pem";
const KEY_FILE: &str = "ca-key.pem";
/// Leaves kept at once: a session's secret domains are few (256 patterns at most); past this
/// many, the cache starts over (a leaf is a millisecond to mint again).
const MAX_LEAVES: usize = 1024;
/// A leaf's validity: long enough for any session's connection, short enough that a copied
/// leaf key (it never leaves the host) would not be worth much.
const LEAF_DAYS: i64 = 7;
/// The authority's validity. A new one is made when this one is within a month of its end.
const CA_YEARS: i64 = 10;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the egress certificate authority in {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot use a generated key: {0}")]
    Key(String),
}

/// runcell's egress CA: signs leaves; its certificate is what sandboxes trust.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, Arc<rustls::sign::CertifiedKey>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    /// The authority kept in `dir` (`ca.pem`, `ca-key.pem`), made there first if there is none
    /// (or the one there expires within a month).
    pub fn load_or_create(dir: &Path) -> Result<Authority, CaError> {
        let io = |action, path: &Path| {
            let path = path.to_owned();
            move |source| CaError::Io {
                action,
                path,
                source,
            }
        };
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        // Only the server's user reads the directory (the key is in it).
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io("restrict", dir))?;
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        if cert_path.exists() && key_path.exists() {
            let cert_pem = fs::read_to_string(&cert_path).map_err(io("read", &cert_path))?;
            let key_pem = fs::read_to_string(&key_path).map_err(io("read", &key_path))?;
            let invalid = |reason: String| CaError::Invalid {
                path: dir.to_owned(),
                reason,
            };
            let key =
                KeyPair::from_pem(&key_pem).map_err(|e| invalid(format!("{KEY_FILE}: {e}")))?;
            let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
                .map_err(|e| invalid(format!("{CERT_FILE}: {e}")))?;
            // runcell made it valid for CA_YEARS from when it wrote the file.
            let age = fs::metadata(&cert_path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .unwrap_or_default();
            if age.as_secs() < ((365 * CA_YEARS - 30) * 86_400) as u64 {
                let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
                    .map_err(|e| invalid(format!("{CERT_FILE}: {e}")))?;
                return Ok(Authority::from_parts(issuer, cert_pem, cert_der));
            }
            tracing::info!(dir = %dir.display(), "the egress CA expires within a month; making a new one");
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "runcell");
        name.push(
            DnType::CommonName,
            format!("runcell egress CA ({})", hostname()),
        );
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Span::days(1);
        params.not_after = now + Span::days(365 * CA_YEARS);
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        // The key first, created private; then the certificate, which says the pair is whole.
        write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)
            .map_err(io("write", &key_path))?;
        write_new(&cert_path, cert_pem.as_bytes(), 0o644).map_err(io("write", &cert_path))?;
        let issuer = Issuer::new(params, key);
        Ok(Authority::from_parts(issuer, cert_pem, cert.der().clone()))
    }

    fn from_parts(
        issuer: Issuer<'static, KeyPair>,
        cert_pem: String,
        cert_der: CertificateDer<'static>,
    ) -> Authority {
        Authority {
            issuer,
            cert_pem,
            cert_der,
            leaves: Mutex::new(HashMap::new()),
        }
    }

    /// The authority's certificate (PEM), what sandboxes trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A leaf for `host` (a DNS name or an IP literal, as the proxy normalized it), with the
    /// authority's certificate after it; minted on first use and cached.
    pub(crate) fn leaf(&self, host: &str) -> Result<Arc<rustls::sign::CertifiedKey>, CaError> {
        if let Some(k) = lock(&self.leaves).get(host) {
            return Ok(k.clone());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host);
        params.distinguished_name = name;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Span::hours(1);
        params.not_after = now + Span::days(LEAF_DAYS);
        let cert = params.signed_by(&key, &self.issuer)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der)
            .map_err(|e| CaError::Key(e.to_string()))?;
        let certified = Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert.der().clone(), self.cert_der.clone()],
            signing,
        ));
        let mut leaves = lock(&self.leaves);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), certified.clone());
        Ok(certified)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes `path` anew (replacing what was there) with `mode`, through a temporary file and a
/// rename, so a crash never leaves half a key.
fn write_new(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_kept_and_reloaded_with_a_private_key() {
        let dir = std::env::temp_dir().join(format!("runcell-ca-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = Authority::load_or_create(&dir).expect("create");
        let mode = fs::metadata(dir.join(KEY_FILE))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = Authority::load_or_create(&dir).expect("reload");
        assert_eq!(a.cert_pem(), b.cert_pem(), "the same authority comes back");
        let leaf = b.leaf("api.example.com").expect("leaf");
        assert_eq!(leaf.cert.len(), 2);
        assert_eq!(leaf.cert[1], a.cert_der);
        let again = b.leaf("api.example.com").expect("cached");
        assert!(Arc::ptr_eq(&leaf, &again));
        b.leaf("127.0.0.2").expect("an IP leaf");
        fs::write(dir.join(KEY_FILE), "not a key").expect("corrupt");
        let err = Authority::load_or_create(&dir).expect_err("a corrupt key is refused");
        assert!(err.to_string().contains("ca-key.pem"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }
}
