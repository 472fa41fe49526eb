//! Outputs people can use and trust (issue 24), end to end over HTTP and MCP: a figure's chart
//! data, every rich MIME type from the kernel to the API and to a model's tool result, and
//! signed provenance of the files an execution produced.

mod common;

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use runcell_store::audit::provenance::Provenance;
use runcell_store::audit::signed::{AuditPublicKey, AuditSigner};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Code that displays every rich type, then a bar chart.
const RICH: &str = r#"
import matplotlib.pyplot as plt
from IPython.display import SVG, Markdown, JSON, Latex, Image
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'))
display(Markdown('# Title\n*x*'))
display(JSON({'answer': 42}))
display(Latex('$x^2$'))
display(Image(data=b'\xff\xd8\xff\xe0 fake jpeg'))
display({'application/vnd.vegalite.v5+json': {'mark': 'bar', 'data': {'values': [{'a': 1}, {'a': 2}]}},
         'application/vnd.plotly.v1+json': {'data': [{'type': 'bar', 'y': [4, 5, 6]}]},
         'text/plain': 'specs'}, raw=True)
display({'application/pdf': b'%PDF-1.4 tiny', 'text/plain': 'a pdf'}, raw=True)
plt.bar(['a', 'b'], [3, 5], label='votes')
plt.title('poll')
plt.show()
"#;

async fn new_session(srv: &common::Server) -> String {
    let s: Value = srv
        .http
        .post(format!("{}/v1/sessions", srv.base))
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    s["id"].as_str().expect("id").to_owned()
}

async fn execute(srv: &common::Server, sid: &str, code: &str) -> Value {
    let resp = srv
        .http
        .post(format!("{}/v1/sessions/{sid}/execute", srv.base))
        .json(&json!({ "code": code }))
        .send()
        .await
        .expect("execute");
    assert_eq!(resp.status(), 200);
    let e: Value = resp.json().await.expect("json");
    assert_eq!(e["status"], "ok", "{e:#}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rich_outputs_and_chart_data_reach_the_api_and_mcp() {
    let srv = common::start().await;
    let sid = new_session(&srv).await;
    let e = execute(&srv, &sid, RICH).await;
    let results = e["results"].as_array().expect("results");
    let with = |mime: &str| -> &Value {
        results
            .iter()
            .find(|r| r["data"].get(mime).is_some())
            .unwrap_or_else(|| panic!("no {mime} in {results:#?}"))
    };
    assert!(with("image/svg+xml")["data"]["image/svg+xml"]
        .as_str()
        .expect("svg")
        .starts_with("<svg"));
    assert_eq!(
        with("text/markdown")["data"]["text/markdown"],
        "# Title\n*x*"
    );
    assert_eq!(
        with("application/json")["data"]["application/json"],
        r#"{"answer": 42}"#
    );
    assert_eq!(with("text/latex")["data"]["text/latex"], "$x^2$");
    assert_eq!(
        with("image/jpeg")["data"]["image/jpeg"],
        "/9j/4CBmYWtlIGpwZWc="
    );
    assert_eq!(
        with("application/pdf")["data"]["application/pdf"],
        "JVBERi0xLjQgdGlueQ=="
    );
    let specs = with("application/vnd.vegalite.v5+json");
    assert!(specs["data"]["application/vnd.plotly.v1+json"].is_string());
    // The figure: its PNG and what it plots; the transport key never reaches clients.
    let figure = with("image/png");
    assert_eq!(
        figure["chart"]["elements"],
        json!([{"label": "a", "group": "votes", "value": 3}, {"label": "b", "group": "votes", "value": 5}])
    );
    assert_eq!(
        (&figure["chart"]["type"], &figure["chart"]["title"]),
        (&json!("bar"), &json!("poll"))
    );
    assert!(results.iter().all(|r| r["data"]
        .as_object()
        .expect("data")
        .keys()
        .all(|k| !k.contains("runcell"))));
    assert!(results.iter().filter(|r| r.get("chart").is_some()).count() == 1);
    // The audit record keeps the chart too.
    let id = e["id"].as_str().expect("id");
    let rec: Value = srv
        .http
        .get(format!("{}/v1/executions/{id}", srv.base))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(rec["results"], e["results"]);

    // MCP: the model reads the chart's values and each type as text, and sees the images.
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", srv.base)),
        ))
        .await
        .expect("initialize");
    let Value::Object(args) = json!({ "code": RICH }) else {
        unreachable!()
    };
    let r: CallToolResult = client
        .call_tool(CallToolRequestParams::new("python").with_arguments(args))
        .await
        .expect("tools/call");
    let text: String = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    for expected in [
        "chart:\nbar chart \"poll\": [votes] a=3; [votes] b=5",
        "display (SVG image):\n",
        "display (markdown):\n# Title\n*x*",
        "display (JSON):\n{\n  \"answer\": 42\n}",
        "display (LaTeX):\n$x^2$",
        "display (Vega-Lite chart):\nmark bar; 2 data values;",
        "display (PDF document):\n",
        "images: 2 JPEG/PNG images attached",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }
    let images: Vec<String> = r
        .content
        .iter()
        .filter_map(|c| c.as_image().map(|i| i.mime_type.clone()))
        .collect();
    assert_eq!(images, ["image/jpeg", "image/png"]);
    client.cancel().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_hashed_and_their_provenance_verifies_until_a_byte_changes() {
    let signer = Arc::new(AuditSigner::ephemeral().expect("key"));
    let srv = common::start_with({
        let signer = signer.clone();
        move |state| state.with_audit_signer(signer)
    })
    .await;
    let sid = new_session(&srv).await;
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig('out/chart.png')\n\
                open('notes.txt', 'w').write('hello')";
    let e = execute(
        &srv,
        &sid,
        &format!("import os\nos.makedirs('out')\n{code}"),
    )
    .await;
    let base = format!("{}/v1/sessions/{sid}/files", srv.base);
    let download = |path: &str| {
        let url = format!("{base}/{path}");
        let http = srv.http.clone();
        async move {
            let resp = http.get(url).send().await.expect("get");
            assert_eq!(resp.status(), 200);
            resp.bytes().await.expect("bytes").to_vec()
        }
    };
    let png = download("out/chart.png").await;
    let hex = |d: &[u8]| -> String {
        Sha256::digest(d)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let files = e["files"].as_array().expect("files");
    let entry = |p: &str| {
        files
            .iter()
            .find(|f| f["path"] == p)
            .expect("entry")
            .clone()
    };
    assert_eq!(entry("out/chart.png")["sha256"], hex(&png));
    assert_eq!(entry("notes.txt")["sha256"], hex(b"hello"));
    // In the audit record too.
    let rec: Value = srv
        .http
        .get(format!(
            "{}/v1/executions/{}",
            srv.base,
            e["id"].as_str().expect("id")
        ))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(rec["files"], e["files"]);

    let pk: Value = srv
        .http
        .get(format!("{}/v1/audit/public-key", srv.base))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let pk = AuditPublicKey::from_hex(pk["public_key"].as_str().expect("key")).expect("hex");
    let statement = |path: &str| {
        let url = format!("{base}/{path}?provenance");
        let http = srv.http.clone();
        async move { http.get(url).send().await.expect("get") }
    };
    let resp = statement("./out//chart.png").await;
    assert_eq!(resp.status(), 200);
    let p: Provenance = resp.json().await.expect("statement");
    assert_eq!(
        (p.path.as_str(), p.execution_id.as_str(), p.size),
        (
            "out/chart.png",
            e["id"].as_str().expect("id"),
            png.len() as u64
        )
    );
    assert_eq!(p.session_id.as_deref(), Some(sid.as_str()));
    assert_eq!(p.tenant, runcell_server::OPEN_TENANT);
    assert_eq!(
        p.code_sha256,
        hex(rec["code"].as_str().expect("code").as_bytes())
    );
    assert_eq!(p.time, e["finished_at"].as_str().expect("time"));
    pk.verify_provenance(&p, &png)
        .expect("the unmodified file verifies");
    let mut tampered = png.clone();
    tampered[100] ^= 0x01;
    let why = pk
        .verify_provenance(&p, &tampered)
        .expect_err("one byte changed");
    assert!(why.contains("not the one the statement describes"), "{why}");

    // A file changed since, or uploaded, has no statement; nor has a session's other file.
    execute(&srv, &sid, "open('notes.txt', 'a').write('!')").await;
    let resp = statement("notes.txt").await;
    assert_eq!(resp.status(), 200, "the append is itself an execution");
    let p: Provenance = resp.json().await.expect("statement");
    pk.verify_provenance(&p, b"hello!")
        .expect("the new content");
    let put = srv
        .http
        .put(format!("{base}/notes.txt"))
        .body("edited")
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 201);
    let resp = statement("notes.txt").await;
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "not_found");
    assert_eq!(statement("missing.txt").await.status(), 404);

    // A server without a signing key says so.
    let plain = common::start().await;
    let sid = new_session(&plain).await;
    execute(&plain, &sid, "open('a.txt', 'w').write('a')").await;
    let resp = plain
        .http
        .get(format!(
            "{}/v1/sessions/{sid}/files/a.txt?provenance",
            plain.base
        ))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.expect("json");
    assert!(body["error"]["message"]
        .as_str()
        .expect("message")
        .contains("no signing key"));
}
