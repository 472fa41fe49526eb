//! Client tools called from sandboxed code (issue 22, docs/tools.md), through the HTTP API as
//! a client uses it: NDJSON `tool_call` events answered with `tool_results`, and plain
//! executes answered `waiting` and continued; errors and time-outs as exceptions in the code;
//! and the refusals: undeclared tools, forged and foreign ids, oversized payloads, floods.

mod common;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

struct Client<'a> {
    srv: &'a common::Server,
    key: Option<String>,
}

impl Client<'_> {
    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .srv
            .http
            .request(method, format!("{}{path}", self.srv.base));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .req(reqwest::Method::POST, path)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn session(&self, language: &str) -> String {
        let (s, v) = self
            .post("/v1/sessions", json!({"language": language}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["id"].as_str().expect("id").to_owned()
    }

    /// A streamed execute; `answer` is asked for each `tool_call` event's answer (None: leave
    /// it unanswered). Returns every event.
    async fn stream(
        &self,
        session: &str,
        body: Value,
        mut answer: impl FnMut(&Value) -> Option<Value>,
    ) -> Vec<Value> {
        let mut resp = self
            .req(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/execute"),
            )
            .header("accept", "application/x-ndjson")
            .json(&body)
            .send()
            .await
            .expect("stream");
        assert_eq!(resp.status(), StatusCode::OK);
        let mut events = Vec::new();
        let mut buf = Vec::new();
        while let Some(chunk) = resp.chunk().await.expect("chunk") {
            buf.extend_from_slice(&chunk);
            while let Some(n) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=n).collect();
                let event: Value = serde_json::from_slice(&line).expect("an NDJSON line");
                if event["type"] == "tool_call" {
                    if let Some(mut result) = answer(&event) {
                        result["id"] = event["id"].clone();
                        let (s, v) = self
                            .post(&format!("/v1/sessions/{session}/tool_results"), result)
                            .await;
                        assert_eq!(s, StatusCode::OK, "{v}");
                        assert_eq!(v, json!({"id": event["id"], "status": "answered"}));
                    }
                }
                events.push(event);
            }
        }
        events
    }

    /// A plain execute, continued with `answer`'s results until it ends; the final Execution
    /// and how many `waiting` replies came before it.
    async fn run(
        &self,
        session: &str,
        body: Value,
        mut answer: impl FnMut(&Value) -> Value,
    ) -> (Value, usize) {
        let (s, mut e) = self
            .post(&format!("/v1/sessions/{session}/execute"), body)
            .await;
        assert_eq!(s, StatusCode::OK, "{e}");
        let mut rounds = 0;
        while e["status"] == "waiting" {
            rounds += 1;
            let pending = e["pending_tool_calls"].as_array().expect("pending").clone();
            assert!(!pending.is_empty(), "{e}");
            let results: Vec<Value> = pending
                .iter()
                .map(|c| {
                    let mut r = answer(c);
                    r["id"] = c["id"].clone();
                    r
                })
                .collect();
            let id = e["id"].as_str().expect("execution id").to_owned();
            let (s, next) = self
                .post(
                    &format!("/v1/executions/{id}/continue"),
                    json!({ "results": results }),
                )
                .await;
            assert_eq!(s, StatusCode::OK, "{next}");
            assert_eq!(next["id"], e["id"]);
            e = next;
        }
        (e, rounds)
    }
}

fn lookup_tool() -> Value {
    json!({
        "name": "lookup",
        "description": "A record by id.",
        "input_schema": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}},
                         "required": ["id"], "additionalProperties": false}
    })
}

/// The client's side of `lookup`: a record per id.
fn record(call: &Value) -> Value {
    let id = call["input"]["id"].as_i64().expect("id");
    json!({"output": {"id": id, "name": format!("item-{id}"), "price": id * 10}})
}

const LOOP_AND_GATHER: &str = r#"
import asyncio
from runcell_tools import lookup
total = 0
for i in range(50):
    total += lookup(id=i)["price"]
rows = await asyncio.gather(*(lookup(id=i) for i in range(20)))
print(total, [r["name"] for r in rows][-1], len(rows))
"#;

fn end_execution(events: &[Value]) -> Value {
    let end = events.last().expect("events");
    assert_eq!(end["type"], "end", "{end}");
    end["execution"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_calls_a_client_tool_in_a_loop_and_concurrently_over_ndjson() {
    let srv = common::start().await;
    let c = Client {
        srv: &srv,
        key: None,
    };
    let id = c.session("python").await;
    let events = c
        .stream(
            &id,
            json!({"code": LOOP_AND_GATHER, "tools": [lookup_tool()]}),
            |call| Some(record(call)),
        )
        .await;
    let e = end_execution(&events);
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(e["stdout"], "12250 item-19 20\n");
    let calls: Vec<&Value> = events.iter().filter(|e| e["type"] == "tool_call").collect();
    assert_eq!(calls.len(), 70);
    assert_eq!(calls[0]["name"], "lookup");
    assert_eq!(calls[0]["input"], json!({"id": 0}));
    // The Execution records each call; its ids are the events' ids.
    let recorded = e["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(recorded.len(), 70);
    assert_eq!(recorded[0]["id"], calls[0]["id"]);
    assert_eq!(recorded[0]["input"], json!({"id": 0}));
    assert_eq!(
        recorded[0]["output_bytes"],
        json!(r#"{"id":0,"name":"item-0","price":0}"#.len())
    );
    assert!(recorded.iter().all(|r| r["error"].is_null()));
    // And so does the audit log.
    let ex = e["id"].as_str().expect("id");
    let stored = srv
        .http
        .get(format!("{}/v1/executions/{ex}", srv.base))
        .send()
        .await
        .expect("get")
        .json::<Value>()
        .await
        .expect("json");
    assert_eq!(stored["tool_calls"].as_array().map(Vec::len), Some(70));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_execute_waits_and_continues_until_the_end() {
    let srv = common::start().await;
    let c = Client {
        srv: &srv,
        key: None,
    };
    let id = c.session("python").await;
    let (s, first) = c
        .post(
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": "from runcell_tools import lookup\nprint('before')\nr = lookup(id=7)\nprint('after', r['name'])", "tools": [lookup_tool()]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "waiting", "{first}");
    assert_eq!(first["session_id"], json!(id));
    let pending = first["pending_tool_calls"].as_array().expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["name"], "lookup");
    assert_eq!(pending[0]["input"], json!({"id": 7}));
    let call = pending[0]["id"].as_str().expect("call id");
    assert!(call.starts_with("call_") && call.len() == 37, "{call}");
    let ex = first["id"].as_str().expect("execution id");
    let (s, done) = c
        .post(
            &format!("/v1/executions/{ex}/continue"),
            json!({"results": [{"id": call, "output": {"name": "seven"}}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["stdout"], "before\nafter seven\n");
    assert_eq!(done["tool_calls"][0]["id"], json!(call));
    // Once ended, the execution is no longer waiting for anything.
    let (s, v) = c
        .post(
            &format!("/v1/executions/{ex}/continue"),
            json!({"results": []}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");

    // The loop and the gather over waiting/continue.
    let (e, rounds) = c
        .run(
            &id,
            json!({"code": LOOP_AND_GATHER, "tools": [lookup_tool()]}),
            record,
        )
        .await;
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(e["stdout"], "12250 item-19 20\n");
    assert_eq!(e["tool_calls"].as_array().map(Vec::len), Some(70));
    // 50 calls one after the other, then the 20 of the gather in one or a few rounds.
    assert!((51..=70).contains(&rounds), "{rounds} rounds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_cell_calls_tools_as_async_functions() {
    let srv = common::start().await;
    let c = Client {
        srv: &srv,
        key: None,
    };
    let id = c.session("javascript").await;
    let code = r#"
const one = await tools.lookup({id: 2});
const many = await Promise.all([0, 1, 2, 3, 4].map((i) => tools.lookup({id: i})));
let refused = '';
try { await tools.lookup({id: 'x'}); } catch (e) { refused = `${e.name}: ${e.message}`; }
let failed = '';
try { await tools.lookup({id: 99}); } catch (e) { failed = `${e.name}: ${e.message}`; }
console.log(one.name, many.map((r) => r.price).join(','), '|', refused, '|', failed);
"#;
    let events = c
        .stream(
            &id,
            json!({"code": code, "tools": [lookup_tool()]}),
            |call| {
                Some(if call["input"]["id"] == 99 {
                    json!({"error": "no record 99"})
                } else {
                    record(call)
                })
            },
        )
        .await;
    let e = end_execution(&events);
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(
        e["stdout"],
        "item-2 0,10,20,30,40 | TypeError: lookup(): 'id' must be integer, not string | ToolError: no record 99\n"
    );
    assert_eq!(e["tool_calls"].as_array().map(Vec::len), Some(7));
    // Over waiting/continue too.
    let (e, _) = c
        .run(
            &id,
            json!({"code": "const r = await tools.lookup({id: 5}); r.price", "tools": [lookup_tool()]}),
            record,
        )
        .await;
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(e["results"][0]["data"]["text/plain"], "50");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_time_outs_are_exceptions_in_the_code() {
    let srv = common::start().await;
    let c = Client {
        srv: &srv,
        key: None,
    };
    let id = c.session("python").await;
    let code = r#"
import runcell_tools
from runcell_tools import lookup
out = []
try:
    lookup(id=1)
except runcell_tools.ToolError as e:
    out.append(f"{type(e).__name__}: {e}")
try:
    lookup(id=2)
except TimeoutError as e:
    out.append(f"{type(e).__name__}: {e}")
for bad in ({"id": -1}, {"id": 1.5}, {}, {"id": 1, "other": 2}):
    try:
        lookup(**bad)
    except (TypeError, ValueError) as e:
        out.append(f"{type(e).__name__}: {e}")
print("\n".join(out))
"#;
    // id 1 fails, id 2 is never answered: the call's own time limit (1 s) ends it.
    let events = c
        .stream(
            &id,
            json!({"code": code, "tools": [lookup_tool()], "tool_timeout_s": 1}),
            |call| match call["input"]["id"].as_i64() {
                Some(1) => Some(json!({"error": {"code": 404, "message": "no record 1"}})),
                _ => None,
            },
        )
        .await;
    let e = end_execution(&events);
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(
        e["stdout"],
        "ToolError: {\"code\":404,\"message\":\"no record 1\"}\n\
         ToolTimeout: no answer to lookup within 1 s\n\
         ValueError: lookup(): 'id' must be ≥ 0, got -1\n\
         TypeError: lookup(): 'id' must be integer, not number\n\
         TypeError: lookup(): arguments is missing the required field 'id'\n\
         TypeError: lookup(): arguments has an unexpected field 'other'\n"
    );
    // Only the two valid calls left the sandbox.
    assert_eq!(
        events.iter().filter(|e| e["type"] == "tool_call").count(),
        2
    );
    let errors: Vec<&Value> = e["tool_calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| &c["error"])
        .collect();
    assert_eq!(
        errors,
        [
            &json!("error: {\"code\":404,\"message\":\"no record 1\"}"),
            &json!("timeout: no answer to lookup within 1 s")
        ]
    );
    // An uncaught one fails the cell with the tool's message.
    let (e, _) = c
        .run(
            &id,
            json!({"code": "lookup(id=3)", "tools": [lookup_tool()]}),
            |_| json!({"error": "backend down"}),
        )
        .await;
    assert_eq!(e["status"], "error", "{e}");
    assert_eq!(e["error"]["name"], "ToolError");
    assert_eq!(e["error"]["value"], "backend down");
    // A timed-out call over waiting/continue: `continue` with no results waits for the end.
    let (s, w) = c
        .post(
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": "try:\n    lookup(id=4)\nexcept TimeoutError as e:\n    print('timed out')", "tools": [lookup_tool()], "tool_timeout_s": 1}),
        )
        .await;
    assert_eq!(
        (s, &w["status"]),
        (StatusCode::OK, &json!("waiting")),
        "{w}"
    );
    let ex = w["id"].as_str().expect("id");
    let (s, done) = c
        .post(
            &format!("/v1/executions/{ex}/continue"),
            json!({"results": []}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(done["stdout"], "timed out\n", "{done}");
    // Waiting for a tool does not use up the cell's own time limit (3 s here, 5 s waited).
    let body =
        json!({"code": "print(lookup(id=5)['name'])", "tools": [lookup_tool()], "timeout_s": 3});
    let (s, w) = c.post(&format!("/v1/sessions/{id}/execute"), body).await;
    assert_eq!(w["status"], "waiting", "{s} {w}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ex = w["id"].as_str().expect("id");
    let call = w["pending_tool_calls"][0]["id"].clone();
    let (s, done) = c
        .post(
            &format!("/v1/executions/{ex}/continue"),
            json!({"results": [{"id": call, "output": {"name": "five"}}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (&done["status"], &done["stdout"]),
        (&json!("ok"), &json!("five\n")),
        "{done}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_can_call_only_the_tools_declared_for_its_execution() {
    let srv = common::start().await;
    let c = Client {
        srv: &srv,
        key: None,
    };
    let id = c.session("python").await;
    // The module's own check is bypassed (`_call`, the raw primitive): the host refuses.
    let code = r#"
import runcell_tools
out = []
from runcell_tools import lookup as kept
for name in ("delete_everything", "mcp.github.search", "lookup"):
    try:
        out.append(repr(runcell_tools._call(name, {"id": 1})))
    except runcell_tools.ToolRefused as e:
        out.append(f"refused: {e}")
try:
    from runcell_tools import delete_everything
except ImportError:
    out.append("no import")
print("\n".join(out))
"#;
    let events = c
        .stream(
            &id,
            json!({"code": code, "tools": [lookup_tool()]}),
            |call| Some(record(call)),
        )
        .await;
    let e = end_execution(&events);
    assert_eq!(
        e["stdout"],
        "refused: \"delete_everything\" is not a tool declared for this execution\n\
         refused: mcp.github.search: no MCP servers are configured for this session\n\
         {'id': 1, 'name': 'item-1', 'price': 10}\n\
         no import\n",
        "{e}"
    );
    // Nothing but the declared call reached the client (the positive control).
    let calls: Vec<&Value> = events.iter().filter(|e| e["type"] == "tool_call").collect();
    assert_eq!(calls.len(), 1, "{events:?}");
    assert_eq!(calls[0]["name"], "lookup");
    // The refusals are on record.
    let names: Vec<(&Value, bool)> = e["tool_calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| (&c["name"], c["error"].is_null()))
        .collect();
    assert_eq!(
        names,
        [
            (&json!("delete_everything"), false),
            (&json!("mcp.github.search"), false),
            (&json!("lookup"), true)
        ]
    );
    // A tool declared for one execution is not callable in the next.
    let events = c
        .stream(
            &id,
            json!({"code": "try:\n    kept(id=1)\nexcept runcell_tools.ToolRefused as e:\n    print(e)"}),
            |_| panic!("no call may reach the client"),
        )
        .await;
    assert_eq!(
        end_execution(&events)["stdout"],
        "lookup() is not a tool declared for this execution\n"
    );
    let events = c
        .stream(
            &id,
            json!({"code": "try:\n    runcell_tools._call('lookup', {'id': 1})\nexcept runcell_tools.ToolRefused as e:\n    print(e)"}),
            |_| panic!("no call may reach the client"),
        )
        .await;
    assert_eq!(
        end_execution(&events)["stdout"],
        "no tools were declared for this execution: \"lookup\" cannot be called\n"
    );
    // Declarations that are not tools are refused before anything runs.
    for (tools, why) in [
        (json!([{"name": "a b"}]), "is not a Python identifier"),
        (
            json!([{"name": "x", "input_schema": 3}]),
            "input_schema must be a JSON object",
        ),
    ] {
        let (s, v) = c
            .post(
                &format!("/v1/sessions/{id}/execute"),
                json!({"code": "1", "tools": tools}),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .expect("message")
                .contains(why),
            "{v}"
        );
    }
    // Two tools of one name conflict (409: the document cannot say "names differ").
    let (s, v) = c
        .post(
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": "1", "tools": [{"name": "x"}, {"name": "x", "description": "again"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "conflict", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("is declared twice"),
        "{v}"
    );
    let (s, v) = c
        .post(
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": "1", "tools": [lookup_tool()], "tool_timeout_s": 4000}),
        )
        .await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("limit_exceeded")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_ids_are_bound_to_their_session_execution_and_tenant() {
    let srv = common::start().await;
    let (_, key_a) = srv.store.create_key("a", "tenant-a").expect("key a");
    let (_, key_b) = srv.store.create_key("b", "tenant-b").expect("key b");
    let a = Client {
        srv: &srv,
        key: Some(key_a),
    };
    let b = Client {
        srv: &srv,
        key: Some(key_b),
    };
    let a1 = a.session("python").await;
    let a2 = a.session("python").await;
    let b1 = b.session("python").await;
    let (s, w) = a
        .post(
            &format!("/v1/sessions/{a1}/execute"),
            json!({"code": "from runcell_tools import lookup\nprint(lookup(id=1)['name'])", "tools": [lookup_tool()]}),
        )
        .await;
    assert_eq!(
        (s, &w["status"]),
        (StatusCode::OK, &json!("waiting")),
        "{w}"
    );
    let ex = w["id"].as_str().expect("id").to_owned();
    let call = w["pending_tool_calls"][0]["id"]
        .as_str()
        .expect("call")
        .to_owned();
    let answer = |id: &str| json!({"id": id, "output": {"name": "forged"}});
    // Forged ids, another session of the same tenant, another tenant: 404, nothing answered.
    let forged = format!("call_{}", "0".repeat(32));
    for (client, path, body) in [
        (
            &a,
            format!("/v1/sessions/{a1}/tool_results"),
            answer(&forged),
        ),
        (&a, format!("/v1/sessions/{a2}/tool_results"), answer(&call)),
        (&b, format!("/v1/sessions/{b1}/tool_results"), answer(&call)),
        (&b, format!("/v1/sessions/{a1}/tool_results"), answer(&call)),
        (
            &a,
            format!("/v1/executions/{ex}/continue"),
            json!({"results": [answer(&forged)]}),
        ),
        (
            &b,
            format!("/v1/executions/{ex}/continue"),
            json!({"results": [answer(&call)]}),
        ),
        // One good id beside a forged one: neither is applied.
        (
            &a,
            format!("/v1/executions/{ex}/continue"),
            json!({"results": [answer(&call), answer(&forged)]}),
        ),
    ] {
        let (s, v) = client.post(&path, body).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {v}");
        assert_eq!(v["error"]["code"], "not_found", "{v}");
    }
    // Bad answers: neither or both of output and error; an output over 1 MiB.
    for (body, status) in [
        (json!({"id": call}), StatusCode::BAD_REQUEST),
        (
            json!({"id": call, "output": 1, "error": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"id": call, "output": "x".repeat(1 << 20)}),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ] {
        let (s, v) = a
            .post(&format!("/v1/sessions/{a1}/tool_results"), body)
            .await;
        assert_eq!(s, status, "{v}");
    }
    // The execution is unaffected: its real answer (the positive control) goes through.
    let (s, v) = a
        .post(
            &format!("/v1/sessions/{a1}/tool_results"),
            json!({"id": call, "output": {"name": "real"}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, done) = a
        .post(
            &format!("/v1/executions/{ex}/continue"),
            json!({"results": []}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    assert_eq!(done["stdout"], "real\n", "{done}");
    // Answered once: a second answer is 404.
    let (s, _) = a
        .post(&format!("/v1/sessions/{a1}/tool_results"), answer(&call))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_arguments_and_floods_of_calls_are_refused() {
    let srv = common::start().await;
    let c = Client {
        srv: &srv,
        key: None,
    };
    let id = c.session("python").await;
    let code = r#"
import asyncio, runcell_tools
from runcell_tools import echo
out = []
try:
    echo(text="x" * (1 << 20))
except runcell_tools.ToolTooLarge as e:
    out.append(f"sandbox: {e}")
# Past the module's own bound (user code can change it), the host refuses.
runcell_tools.MAX_INPUT_BYTES = 1 << 30
try:
    echo(text="x" * (1 << 20))
except runcell_tools.ToolTooLarge as e:
    out.append(f"host: {e}")
async def flood():
    calls = [asyncio.ensure_future(echo(text=str(i))) for i in range(80)]
    # No call is answered before this line is seen, so the calls done here are the refused
    # ones: the client answers once the 16 past the bound came back (or 60 s went by).
    for _ in range(6000):
        if sum(c.done() for c in calls) >= 16:
            break
        await asyncio.sleep(0.01)
    print("refusals in", flush=True)
    return await asyncio.gather(*calls, return_exceptions=True)
got = asyncio.run(flood())
ok = [g for g in got if isinstance(g, dict)]
refused = {str(g) for g in got if isinstance(g, runcell_tools.ToolRefused)}
out.append(f"{len(ok)} answered, {len(got) - len(ok)} refused: {sorted(refused)}")
print("\n".join(out))
"#;
    let echo = json!({"name": "echo", "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}});
    // The client answers only once all of the flood's admitted calls wait and the code said
    // the refused ones came back (answering earlier frees room for calls still on their way).
    let mut waiting = Vec::new();
    let mut refusals_in = false;
    let mut resp = c
        .req(reqwest::Method::POST, &format!("/v1/sessions/{id}/execute"))
        .header("accept", "application/x-ndjson")
        .json(&json!({"code": code, "tools": [echo]}))
        .send()
        .await
        .expect("stream");
    let mut buf = Vec::new();
    let mut end = Value::Null;
    while let Some(chunk) = resp.chunk().await.expect("chunk") {
        buf.extend_from_slice(&chunk);
        while let Some(n) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=n).collect();
            let event: Value = serde_json::from_slice(&line).expect("line");
            if event["type"] == "tool_call" {
                waiting.push(event);
            } else if event["type"] == "stdout" {
                refusals_in |= event["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("refusals in"));
            } else if event["type"] == "end" {
                end = event;
            }
            if refusals_in && waiting.len() >= 64 {
                refusals_in = false;
                for call in &waiting {
                    let (s, v) = c
                        .post(
                            &format!("/v1/sessions/{id}/tool_results"),
                            json!({"id": call["id"], "output": {"text": call["input"]["text"]}}),
                        )
                        .await;
                    assert_eq!(s, StatusCode::OK, "{v}");
                }
            }
        }
    }
    assert_eq!(
        waiting.len(),
        64,
        "only the bound on pending calls reaches the client"
    );
    let e = &end["execution"];
    assert_eq!(
        e["stdout"],
        "refusals in\n\
         sandbox: echo(): the arguments are 1048588 bytes as JSON, over the 1048576-byte limit\n\
         host: the arguments of echo are 1048587 bytes as JSON, over the 1048576-byte limit\n\
         64 answered, 16 refused: ['too many tool calls waiting: at most 64 at once']\n",
        "{e}"
    );
}
