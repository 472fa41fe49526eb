use super::*;

const PNG: &[u8] = include_bytes!("../tests/fixtures/plot.png");
const JPEG: &[u8] = include_bytes!("../tests/fixtures/plot.jpg");

fn creds(n: u8) -> Credentials {
    Credentials::from_secrets([n; 32], [n + 100; 32], &format!("test{n}")).expect("credentials")
}

fn origin() -> Origin {
    Origin {
        execution_id: "ex_1".into(),
        session_id: Some("ses_1".into()),
        tenant: "acme".into(),
        code_sha256: "ab".repeat(32),
        time: "2026-01-01T00:00:00.000Z".into(),
        path: None,
        source_sha256: None,
    }
}

fn codes(r: &Report) -> Vec<&str> {
    r.failures.iter().map(|s| s.code.as_str()).collect()
}

#[test]
fn a_signed_png_and_jpeg_validate_against_the_ca_and_name_the_execution() {
    let c = creds(1);
    for (mime, image) in [("image/png", PNG), ("image/jpeg", JPEG)] {
        assert_eq!(
            read(mime, image, Some(c.ca_pem())).expect("read"),
            None,
            "{mime}: unsigned"
        );
        let signed = c.sign(mime, image, &origin()).expect("sign");
        assert_ne!(signed, image);
        let r = read(mime, &signed, Some(c.ca_pem()))
            .expect("read")
            .expect("a manifest");
        assert_eq!(r.state, "Trusted", "{mime}: {r:#?}");
        assert!(r.failures.is_empty(), "{mime}: {r:#?}");
        assert_eq!(
            r.claim_generator.as_deref(),
            Some(concat!("runcell/", env!("CARGO_PKG_VERSION")))
        );
        assert_eq!(r.runcell.as_ref(), Some(&origin()), "{mime}");
        assert_eq!(r.issuer.as_deref(), Some("runcell"), "{mime}: {r:#?}");

        // No trust anchor: the signature and the hashes still check.
        let r = read(mime, &signed, None).expect("read").expect("manifest");
        assert_eq!(r.state, "Valid", "{mime}: {r:#?}");

        // Another server's CA does not vouch for this one's images.
        let r = read(mime, &signed, Some(creds(2).ca_pem()))
            .expect("read")
            .expect("manifest");
        assert_ne!(r.state, "Trusted", "{mime}: {r:#?}");
        assert_eq!(codes(&r), ["signingCredential.untrusted"], "{mime}: {r:#?}");
    }
}

#[test]
fn one_changed_byte_of_the_image_fails_validation() {
    let c = creds(1);
    for (mime, image) in [("image/png", PNG), ("image/jpeg", JPEG)] {
        let signed = c.sign(mime, image, &origin()).expect("sign");
        // The last bytes are the image's own (PNG: IEND's CRC; JPEG: its end marker comes
        // after the scan), outside the manifest: a byte of the pixel data is changed instead.
        let at = signed.len() - 20;
        let mut tampered = signed.clone();
        tampered[at] ^= 0x01;
        let r = read(mime, &tampered, Some(c.ca_pem()))
            .expect("read")
            .expect("manifest");
        assert_eq!(r.state, "Invalid", "{mime}: {r:#?}");
        assert!(
            codes(&r).contains(&"assertion.dataHash.mismatch"),
            "{mime}: {r:#?}"
        );
    }
}

#[test]
fn the_same_secrets_make_the_same_certificates() {
    assert_eq!(creds(1).chain_pem(), creds(1).chain_pem());
    assert_ne!(creds(1).ca_pem(), creds(2).ca_pem());
}

#[test]
fn what_cannot_be_signed_is_an_error_not_a_panic() {
    let c = creds(1);
    assert!(matches!(
        c.sign("image/gif", PNG, &origin()),
        Err(Error::Format(m)) if m == "image/gif"
    ));
    assert!(c
        .sign("image/png", b"\x89PNG not really", &origin())
        .is_err());
    assert!(c
        .sign("image/jpeg", b"\xff\xd8\xff\xe0 fake jpeg", &origin())
        .is_err());
}
