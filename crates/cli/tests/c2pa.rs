//! C2PA manifests in the images a real `runcell serve` returns (issue 24): a matplotlib figure
//! and a PIL JPEG displayed by a cell, and the same kinds saved to the workspace and fetched
//! with `?c2pa`, are read by the C2PA SDK's own Python bindings (`c2pa-python`, pinned in
//! tests/c2pa/requirements.txt, in a venv under target/) with the server's CA
//! (`GET /v1/audit/c2pa-ca`) as trust anchor: Trusted, no failure, runcell's assertion naming
//! the execution. One changed byte fails validation; another server's CA does not vouch for
//! them; `runcell verify` says the same. The signed images still open as images (in the
//! sandbox, with PIL).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A figure and a JPEG as display outputs, and the same kinds saved as workspace files.
const CODE: &str = r#"
import io
import matplotlib.pyplot as plt
from PIL import Image as PILImage
from IPython.display import Image, display
fig, ax = plt.subplots(figsize=(3, 2))
ax.plot([1, 2, 3], [4, 1, 5])
ax.set_title('signed')
fig.savefig('chart.png')
plt.show()
im = PILImage.new('RGB', (40, 30), (200, 30, 30))
im.save('photo.jpg', quality=85)
buf = io.BytesIO()
im.save(buf, format='JPEG', quality=85)
display(Image(data=buf.getvalue()))
open('notes.txt', 'w').write('not an image')
"#;

fn sha256_hex(d: &[u8]) -> String {
    Sha256::digest(d)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Python of a venv with the pinned c2pa-python, made (again) when the pin changed.
fn c2pa_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let requirements =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c2pa/requirements.txt");
            // CARGO_TARGET_TMPDIR is target/tmp.
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .parent()
                .expect("target dir")
                .join("c2pa-venv");
            let pins = std::fs::read(&requirements).expect("requirements.txt");
            let stamp = dir.join("installed-requirements.txt");
            if std::fs::read(&stamp).ok().as_deref() != Some(&pins[..]) {
                let _ = std::fs::remove_dir_all(&dir);
                let ok = Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&dir)
                    .status()
                    .expect("run python3 -m venv (apt-get install -y python3-venv)");
                assert!(ok.success(), "python3 -m venv failed");
                let ok = Command::new(dir.join("bin/pip"))
                    .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
                    .arg(&requirements)
                    .status()
                    .expect("run pip");
                assert!(ok.success(), "pip install -r {}", requirements.display());
                std::fs::write(&stamp, &pins).expect("stamp");
            }
            dir.join("bin/python")
        })
        .clone()
}

/// check.py's report on `image` (`mime`), trusting `ca` if given.
fn check(image: &Path, mime: &str, ca: Option<&Path>) -> Value {
    let mut cmd = Command::new(c2pa_python());
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c2pa/check.py"))
        .arg(image)
        .arg(mime);
    if let Some(ca) = ca {
        cmd.arg(ca);
    }
    let out = cmd.output().expect("run check.py");
    assert!(
        out.status.success(),
        "check.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&out.stdout)))
}

fn b64(s: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s.as_str().expect("base64 text"))
        .expect("base64")
}

/// A byte in the middle of the image's own data (never the embedded manifest, which a
/// validator would reject for another reason) changed.
fn tampered(image: &[u8]) -> Vec<u8> {
    let mut t = image.to_vec();
    let at = t.len() - 40;
    t[at] ^= 0x01;
    t
}

#[test]
fn result_images_and_c2pa_copies_validate_with_the_c2pa_sdk() {
    let data = common::serve::data_dir("runcell-c2pa-test-");
    let srv = common::serve::serve(&data, &[]);
    let base = &srv.base;
    let http = reqwest::blocking::Client::new();
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let out = |name: &str, bytes: &[u8]| {
        let p = tmp.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    };

    let ca = http
        .get(format!("{base}/v1/audit/c2pa-ca"))
        .send()
        .expect("ca");
    assert_eq!(ca.status(), 200);
    assert_eq!(ca.headers()["content-type"], "application/x-pem-file");
    let ca_pem = ca.text().expect("pem");
    assert!(
        ca_pem.starts_with("-----BEGIN CERTIFICATE-----"),
        "{ca_pem}"
    );
    let ca_path = out("ca.pem", ca_pem.as_bytes());

    let sid = http
        .post(format!("{base}/v1/sessions"))
        .json(&json!({}))
        .send()
        .expect("create")
        .json::<Value>()
        .expect("json")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    // Streamed: the result events carry the same signed bytes as the Execution at the end.
    let body = http
        .post(format!("{base}/v1/sessions/{sid}/execute"))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "code": CODE }))
        .send()
        .expect("execute")
        .text()
        .expect("ndjson");
    let events: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
        .collect();
    let end = events.last().expect("events");
    assert_eq!(end["type"], "end", "{body}");
    let e = &end["execution"];
    assert_eq!(e["status"], "ok", "{e:#}");
    let streamed: Vec<&Value> = events.iter().filter(|v| v["type"] == "result").collect();
    let results = e["results"].as_array().expect("results");
    assert_eq!(streamed.len(), results.len(), "{body}");
    for (s, r) in streamed.iter().zip(results) {
        assert_eq!(
            s["data"], r["data"],
            "the streamed result is the Execution's"
        );
    }
    let image = |mime: &str| -> Vec<u8> {
        results
            .iter()
            .find_map(|r| r["data"].get(mime))
            .map(b64)
            .unwrap_or_else(|| panic!("no {mime} result in {results:#?}"))
    };
    let png = image("image/png");
    let jpeg = image("image/jpeg");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert!(jpeg.starts_with(&[0xff, 0xd8, 0xff]));

    let code_sha256 = sha256_hex(CODE.as_bytes());
    let exec_id = e["id"].as_str().expect("id").to_owned();
    let file_sha = |path: &str| -> String {
        e["files"]
            .as_array()
            .expect("files")
            .iter()
            .find(|f| f["path"] == path)
            .and_then(|f| f["sha256"].as_str())
            .unwrap_or_else(|| panic!("no {path} in {e:#}"))
            .to_owned()
    };
    let copy = |path: &str| -> Vec<u8> {
        let r = http
            .get(format!("{base}/v1/sessions/{sid}/files/{path}?c2pa"))
            .send()
            .expect("?c2pa");
        assert_eq!(r.status(), 200, "{path}");
        r.bytes().expect("bytes").to_vec()
    };
    let chart_copy = copy("chart.png");
    let photo_copy = copy("photo.jpg");

    let cases = [
        ("result.png", "image/png", png.clone(), None),
        ("result.jpg", "image/jpeg", jpeg.clone(), None),
        (
            "chart.png",
            "image/png",
            chart_copy.clone(),
            Some("chart.png"),
        ),
        (
            "photo.jpg",
            "image/jpeg",
            photo_copy.clone(),
            Some("photo.jpg"),
        ),
    ];
    for (name, mime, bytes, path) in &cases {
        let file = out(name, bytes);
        let r = check(&file, mime, Some(&ca_path));
        assert_eq!(r["state"], "Trusted", "{name}: {r:#}");
        assert_eq!(r["failures"], json!([]), "{name}: {r:#}");
        assert!(
            r["successes"]
                .as_array()
                .expect("successes")
                .contains(&json!("assertion.dataHash.match")),
            "{name}: {r:#}"
        );
        assert_eq!(r["generator"][0]["name"], "runcell", "{name}");
        assert_eq!(r["generator"][0]["version"], env!("CARGO_PKG_VERSION"));
        let created = &r["actions"][0];
        assert_eq!(created["action"], "c2pa.created", "{name}: {r:#}");
        assert_eq!(created["softwareAgent"]["name"], "runcell");
        assert_eq!(
            created["digitalSourceType"],
            "http://cv.iptc.org/newscodes/digitalsourcetype/algorithmicMedia"
        );
        assert_eq!(r["signer"]["alg"], "Ed25519", "{name}: {r:#}");
        let a = &r["runcell"];
        assert_eq!(a["execution_id"], exec_id.as_str(), "{name}: {r:#}");
        assert_eq!(a["session_id"], sid.as_str());
        assert_eq!(a["tenant"], "default");
        assert_eq!(a["code_sha256"], code_sha256.as_str());
        let time = a["time"].as_str().expect("time");
        assert!(
            time.len() == 24 && time.ends_with('Z') && &time[10..11] == "T",
            "{a}"
        );
        match path {
            // A workspace file's copy names the file and the bytes the sandbox left, which
            // are what `files[].sha256` and `?provenance` recorded.
            Some(p) => {
                assert_eq!(a["path"], *p);
                assert_eq!(a["source_sha256"], file_sha(p).as_str());
                assert_ne!(sha256_hex(bytes), file_sha(p), "the copy's bytes differ");
            }
            None => assert!(a.get("path").is_none() && a.get("source_sha256").is_none()),
        }

        // Without a trust anchor the signature and the hashes still check; the SDK does
        // not call the signer trusted.
        let r = check(&file, mime, None);
        assert_eq!(r["state"], "Valid", "{name}: {r:#}");
        assert_eq!(r["failures"], json!([]), "{name}: {r:#}");

        // One changed byte of the image.
        let bad = out(&format!("tampered-{name}"), &tampered(bytes));
        let r = check(&bad, mime, Some(&ca_path));
        assert_eq!(r["state"], "Invalid", "{name}: {r:#}");
        assert!(
            r["failures"]
                .as_array()
                .expect("failures")
                .contains(&json!("assertion.dataHash.mismatch")),
            "{name}: {r:#}"
        );

        // runcell verify: the manifest, against the server's CA.
        let v = common::serve::runcell(&data)
            .args(["verify", file.to_str().expect("utf-8"), "--server", base])
            .output()
            .expect("verify");
        let report: Value = serde_json::from_slice(&v.stdout).expect("verify's JSON");
        assert!(
            v.status.success(),
            "{name}: {report:#} {}",
            String::from_utf8_lossy(&v.stderr)
        );
        assert_eq!(report["c2pa"]["state"], "Trusted", "{report:#}");
        assert_eq!(report["c2pa"]["runcell"]["execution_id"], exec_id.as_str());
        assert!(
            String::from_utf8_lossy(&v.stderr).contains(&format!("execution {exec_id}")),
            "{}",
            String::from_utf8_lossy(&v.stderr)
        );
        let v = common::serve::runcell(&data)
            .args(["verify", bad.to_str().expect("utf-8"), "--server", base])
            .output()
            .expect("verify");
        assert_eq!(v.status.code(), Some(1), "{name}");
        let report: Value = serde_json::from_slice(&v.stdout).expect("verify's JSON");
        assert_eq!(report["ok"], false);
        let why = report["error"].as_str().expect("error");
        assert!(why.contains("assertion.dataHash.mismatch"), "{why}");
    }

    // Another server's CA does not vouch for these images (the same SDK, the same image).
    let other = common::serve::data_dir("runcell-c2pa-other-");
    let other_ca = {
        let srv2 = common::serve::serve(&other, &[]);
        http.get(format!("{}/v1/audit/c2pa-ca", srv2.base))
            .send()
            .expect("ca")
            .text()
            .expect("pem")
    };
    assert_ne!(other_ca, ca_pem);
    let other_ca_path = out("other-ca.pem", other_ca.as_bytes());
    // The SDK's states: the signature and hashes hold ("Valid", not "Trusted"), and the one
    // failure is the untrusted signer.
    let r = check(&out("again.png", &png), "image/png", Some(&other_ca_path));
    assert_eq!(r["state"], "Valid", "{r:#}");
    assert_eq!(
        r["failures"],
        json!(["signingCredential.untrusted"]),
        "{r:#}"
    );
    let v = common::serve::runcell(&data)
        .args([
            "verify",
            tmp.path().join("result.png").to_str().expect("utf-8"),
        ])
        .arg("--c2pa-ca")
        .arg(&other_ca_path)
        .output()
        .expect("verify");
    assert_eq!(v.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&v.stdout).expect("verify's JSON");
    assert!(
        report["error"]
            .as_str()
            .is_some_and(|w| w.contains("signingCredential.untrusted")),
        "{report:#}"
    );

    // `?c2pa` is for PNG and JPEG only.
    let r = http
        .get(format!("{base}/v1/sessions/{sid}/files/notes.txt?c2pa"))
        .send()
        .expect("?c2pa");
    assert_eq!(r.status(), 400);
    let err: Value = r.json().expect("json");
    assert_eq!(err["error"]["code"], "invalid_request", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("PNG and JPEG")),
        "{err}"
    );

    // The signed images are still images: PIL opens each inside the sandbox.
    let mut code = String::from("import base64\nfrom PIL import Image\nseen = []\n");
    for (name, _, bytes, _) in &cases {
        let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
        code.push_str(&format!(
            "open('signed-{name}', 'wb').write(base64.b64decode('{encoded}'))\n\
             im = Image.open('signed-{name}'); im.load(); seen.append(im.format)\n"
        ));
    }
    code.push_str("seen");
    let opened: Value = http
        .post(format!("{base}/v1/sessions/{sid}/execute"))
        .json(&json!({ "code": code }))
        .send()
        .expect("execute")
        .json()
        .expect("json");
    assert_eq!(opened["status"], "ok", "{opened:#}");
    assert_eq!(
        opened["results"][0]["data"]["text/plain"], "['PNG', 'JPEG', 'PNG', 'JPEG']",
        "{opened:#}"
    );
}
