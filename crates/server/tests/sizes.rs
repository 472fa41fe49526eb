//! Bounds of a request and big workspaces, over HTTP: uploads of many parts cost no
//! directory walk each, a workspace far past the old walk bound lists, uploads and diffs
//! correctly, and every bound is refused with a message quoting it.

mod common;

use reqwest::StatusCode;
use serde_json::{json, Value};

async fn new_session(srv: &common::Server, body: Value) -> (StatusCode, Value) {
    let resp = srv
        .http
        .post(format!("{}/v1/sessions", srv.base))
        .json(&body)
        .send()
        .await
        .expect("create");
    (resp.status(), resp.json().await.unwrap_or(Value::Null))
}

async fn execute(srv: &common::Server, id: &str, code: &str) -> Value {
    let resp = srv
        .http
        .post(format!("{}/v1/sessions/{id}/execute", srv.base))
        .json(&json!({ "code": code, "timeout_s": 600 }))
        .send()
        .await
        .expect("execute");
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.expect("json")
}

/// An upload of N parts walks the workspace no time at all (it walked the directory once a
/// part: O(N²), 45 s for 5,000 parts), and every part is listed, with its size.
#[tokio::test(flavor = "multi_thread")]
async fn a_multipart_upload_of_5000_parts_walks_no_directory() {
    let srv = common::start().await;
    let (s, v) = new_session(&srv, json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let scans = srv.engine.workspace_scans(&id).expect("scans");
    // Written out by hand: reqwest's Form nests one stream per part, 5,000 deep.
    let mut body = String::new();
    for i in 0..5000 {
        body.push_str(&format!(
            "--XBOUNDARY\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f{i:04}.txt\"\r\n\r\n{i}\n\r\n"
        ));
    }
    body.push_str("--XBOUNDARY--\r\n");
    let resp = srv
        .http
        .post(format!("{}/v1/sessions/{id}/files?path=many", srv.base))
        .header("content-type", "multipart/form-data; boundary=XBOUNDARY")
        .body(body)
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let v: Value = resp.json().await.expect("json");
    let files = v["files"].as_array().expect("files");
    assert_eq!(files.len(), 5000);
    assert_eq!(files[4999]["path"], "many/f4999.txt");
    assert_eq!(files[4999]["size"], 5, "\"4999\\n\"");
    assert_eq!(
        srv.engine.workspace_scans(&id).expect("scans"),
        scans,
        "an upload walks no directory"
    );
    let resp = srv
        .http
        .get(format!("{}/v1/sessions/{id}/files?path=many", srv.base))
        .send()
        .await
        .expect("list");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["files"].as_array().map(Vec::len), Some(5000));
}

/// 150,000 files (past the 100,000 entries walks used to stop at): an upload answers 201
/// (it answered 500 "the upload vanished"), the listing has them all, and a cell that
/// touches one file reports that one change, no false deletion.
#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_of_150000_files_uploads_lists_and_diffs_correctly() {
    let srv = common::start().await;
    let (s, v) = new_session(&srv, json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let made = execute(
        &srv,
        &id,
        "import os\nos.makedirs('big', exist_ok=True)\n\
         for i in range(150000):\n    open(f'big/{i:06}', 'w').close()\n\
         len(os.listdir('big'))",
    )
    .await;
    assert_eq!(made["results"][0]["data"]["text/plain"], "150000", "{made}");
    assert_eq!(
        made["truncated"]["files"], true,
        "150,000 created: listed in part"
    );
    assert_eq!(
        made["files"].as_array().map(Vec::len),
        Some(runcell_engine::MAX_FILE_CHANGES)
    );
    let resp = srv
        .http
        .put(format!(
            "{}/v1/sessions/{id}/files/big/zz-upload.txt",
            srv.base
        ))
        .body("uploaded")
        .send()
        .await
        .expect("upload");
    let status = resp.status();
    let body: Value = resp.json().await.expect("json");
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["path"], "big/zz-upload.txt");
    assert_eq!(body["size"], 8);
    let touched = execute(&srv, &id, "open('big/000007', 'w').write('x')").await;
    let files = touched["files"].as_array().expect("files");
    assert!(
        files.iter().all(|f| f["change"] != "deleted"),
        "no false deletion: {:?}",
        &files[..files.len().min(5)]
    );
    assert_eq!(files.len(), 1, "{:?}", &files[..files.len().min(5)]);
    assert_eq!(files[0]["path"], "big/000007");
    assert_eq!(files[0]["change"], "modified");
    assert_eq!(touched["truncated"]["files"], false);
    let resp = srv
        .http
        .get(format!("{}/v1/sessions/{id}/files?path=big", srv.base))
        .send()
        .await
        .expect("list");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["files"].as_array().map(Vec::len), Some(150_001));
}

fn error_of(status: StatusCode, body: &Value, want: StatusCode, code: &str) -> String {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    body["error"]["message"]
        .as_str()
        .expect("message")
        .to_owned()
}

/// Metadata and env are bounded (they were not: 60 MB of metadata were taken, and every
/// listing returned them; a 200 KB variable failed the kernel's start with a 500), a
/// body over the limit names the body limit, and `timeout_s: 0` says what it must be.
#[tokio::test(flavor = "multi_thread")]
async fn every_bound_is_refused_quoting_itself() {
    let srv = common::start().await;
    let big = "v".repeat(1 << 20);
    let (s, v) = new_session(&srv, json!({"metadata": {"k": big}})).await;
    let m = error_of(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(m.contains("over the limit of 512 characters"), "{m}");
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let (s, v) = new_session(&srv, json!({ "metadata": many })).await;
    let m = error_of(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(m.contains("65 keys, over the limit of 64"), "{m}");
    // A variable the kernel's execve would refuse (E2BIG: it was a 500).
    let (s, v) = new_session(&srv, json!({"env": {"BIG": "x".repeat(200_000)}})).await;
    let m = error_of(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(m.contains("over the limit of 32768 bytes"), "{m}");
    let (s, v) = new_session(&srv, json!({"metadata": {"user": "alice"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();

    let resp = srv
        .http
        .post(format!("{}/v1/sessions/{id}/execute", srv.base))
        .header("content-type", "application/json")
        .body(vec![b' '; runcell_server::MAX_BODY_BYTES + 1])
        .send()
        .await
        .expect("execute");
    let (s, v) = (resp.status(), resp.json().await.expect("json"));
    let m = error_of(s, &v, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert!(
        m.contains("request body") && m.contains(&runcell_server::MAX_BODY_BYTES.to_string()),
        "{m}"
    );
    assert!(!m.contains("files are limited"), "{m}");

    let resp = srv
        .http
        .post(format!("{}/v1/sessions/{id}/execute", srv.base))
        .json(&json!({"code": "1", "timeout_s": 0}))
        .send()
        .await
        .expect("execute");
    let (s, v) = (resp.status(), resp.json().await.expect("json"));
    let m = error_of(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(m.contains("positive") && !m.contains("between 0"), "{m}");

    // Every write may be a 507 on a full disk, and the document says so.
    let doc: Value = srv
        .http
        .get(format!("{}/openapi.json", srv.base))
        .send()
        .await
        .expect("openapi")
        .json()
        .await
        .expect("json");
    for (path, method) in [
        ("/v1/sessions", "post"),
        ("/v1/sessions/{id}/execute", "post"),
        ("/v1/sessions/{id}/files/{path}", "put"),
        ("/v1/execute", "post"),
    ] {
        assert!(
            doc["paths"][path][method]["responses"]["507"].is_object(),
            "{method} {path} documents no 507"
        );
    }
}
