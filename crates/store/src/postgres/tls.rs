//! TLS to PostgreSQL, as libpq's `sslmode` and `sslrootcert` say, over rustls.
//!
//! tokio-postgres itself knows `sslmode=disable|prefer|require` and no certificate options,
//! so both are taken off the URL here ([`split`]) and become the connector:
//!
//! | `sslmode` | TLS | the server's certificate |
//! | --- | --- | --- |
//! | `disable` | never | — |
//! | `prefer` (the default) | if the server offers it, else plain | not checked (libpq's rule) |
//! | `require` | always | not checked, unless `sslrootcert` names a file: then as `verify-ca` |
//! | `verify-ca` | always | signed by a root of `sslrootcert` (or the system's) |
//! | `verify-full` | always | as `verify-ca`, and issued for the host connected to |
//!
//! `sslrootcert=FILE` is a PEM file of root certificates; without it, or with
//! `sslrootcert=system`, the verifying modes use the system's roots (`rustls-native-certs`).
//! An unchecked certificate still encrypts the link, against a passive eavesdropper only.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Result, StoreError};

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(s: &str) -> Result<Mode> {
        Ok(match s {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            other => {
                return Err(StoreError::Invalid(format!(
                    "sslmode {other:?} is not one of disable, prefer, require, verify-ca, \
                     verify-full (libpq's `allow` is not supported: use prefer)"
                )))
            }
        })
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Prefer => "prefer",
            Mode::Require => "require",
            Mode::VerifyCa => "verify-ca",
            Mode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether TLS is tried, and whether it must succeed.
    pub(super) fn ssl_mode(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// `url` without its `sslmode` and `sslrootcert`, and what they said. Both URL
/// (`postgres://...?sslmode=verify-full&sslrootcert=/etc/ca.pem`) and key/value
/// (`host=... sslmode=verify-full`) forms.
pub(super) fn split(url: &str) -> Result<(String, Mode, Option<String>)> {
    let (mut mode, mut root) = (None, None);
    let mut take = |k: &str, v: String| -> bool {
        match k {
            "sslmode" => mode = Some(v),
            "sslrootcert" => root = Some(v),
            _ => return false,
        }
        true
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|p| match p.split_once('=') {
                        Some((k, v)) => !take(k, percent_decode(v)),
                        None => true,
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        url.split_whitespace()
            .filter(|p| match p.split_once('=') {
                Some((k, v)) => !take(k, v.trim_matches('\'').to_owned()),
                None => true,
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mode = match mode {
        Some(m) => Mode::parse(&m)?,
        None => Mode::Prefer,
    };
    Ok((rest, mode, root))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector for `mode`, its roots from `root` (a PEM file, or `system`); `None` for
/// `disable`.
pub(super) fn connector(mode: Mode, root: Option<&str>) -> Result<Option<MakeRustlsConnect>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Unsupported(format!("TLS set-up: {e}")))?;
    let file_given = root.is_some_and(|r| r != "system");
    let unchecked = mode == Mode::Prefer || (mode == Mode::Require && !file_given);
    let config = match mode {
        Mode::Disable => return Ok(None),
        _ if unchecked => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
            .with_no_client_auth(),
        Mode::Prefer | Mode::Require | Mode::VerifyCa => {
            let inner = WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(root)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| StoreError::Invalid(format!("sslrootcert: {e}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(inner)))
                .with_no_client_auth()
        }
        Mode::VerifyFull => builder
            .with_root_certificates(roots(root)?)
            .with_no_client_auth(),
    };
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// The roots of `root` (a PEM file), or the system's.
fn roots(root: Option<&str>) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match root.filter(|r| *r != "system") {
        Some(file) => {
            let bad = |why: String| StoreError::Invalid(format!("sslrootcert {file}: {why}"));
            let certs = CertificateDer::pem_file_iter(PathBuf::from(file))
                .map_err(|e| bad(format!("cannot read it ({e})")))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("not PEM certificates ({e})")))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(bad("holds no usable certificate".into()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(StoreError::Invalid(
                    "sslmode asks to verify the database's certificate, and this system has \
                     no root certificates: name a file with sslrootcert=FILE"
                        .into(),
                ));
            }
        }
    }
    Ok(store)
}

/// `prefer` and `require` without a root file: any certificate (libpq's rule), the
/// handshake's signatures still checked.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must reach a root, whatever host name the certificate is for.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::{split, Mode};

    #[test]
    fn sslmode_and_sslrootcert_come_off_the_url() {
        let (rest, mode, root) = split(
            "postgres://u@db:5432/x?connect_timeout=3&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .expect("split");
        assert_eq!(rest, "postgres://u@db:5432/x?connect_timeout=3");
        assert_eq!(mode, Mode::VerifyFull);
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));
        let (rest, mode, root) = split("postgres://u@db/x?sslmode=disable").expect("split");
        assert_eq!(
            (rest.as_str(), mode, root),
            ("postgres://u@db/x", Mode::Disable, None)
        );
        let (rest, mode, _) = split("postgres://u@db/x").expect("split");
        assert_eq!((rest.as_str(), mode), ("postgres://u@db/x", Mode::Prefer));
        let (rest, mode, root) =
            split("host=db dbname=x sslmode=require sslrootcert=/ca.pem").expect("split");
        assert_eq!(rest, "host=db dbname=x");
        assert_eq!(mode, Mode::Require);
        assert_eq!(root.as_deref(), Some("/ca.pem"));
        for bad in [
            "postgres://db/x?sslmode=allow",
            "postgres://db/x?sslmode=VERIFY",
        ] {
            assert!(split(bad).is_err(), "{bad}");
        }
    }
}
