//! Test support (feature `test-support`): a scripted stand-in for a provider's HTTP API on
//! 127.0.0.1:0 (HTTP/1.1 parsed by hand, one request per connection), for this crate's tests
//! and the CLI's `runcell ask` tests.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{ProviderConfig, ProviderKind};
use serde_json::Value;

#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub headers: HashMap<String, String>,
    /// The body as JSON (Null when it is not JSON).
    pub body: Value,
    pub at: Instant,
}

/// Status, extra headers, body (sent as is).
pub type Reply = (u16, Vec<(&'static str, String)>, String);

#[derive(Debug)]
pub struct StandIn {
    pub base: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl StandIn {
    /// Answers the n-th request (0-based) with `script(n, request)`.
    pub fn start(script: impl Fn(usize, &Request) -> Reply + Send + 'static) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let Some(req) = read_request(&mut conn) else {
                    continue;
                };
                let n = {
                    let mut all = seen.lock().expect("lock");
                    all.push(req.clone());
                    all.len() - 1
                };
                let (status, headers, body) = script(n, &req);
                let mut head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(body.as_bytes());
                let _ = conn.flush();
            }
        });
        StandIn {
            base: format!("http://{addr}"),
            requests,
        }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("lock").clone()
    }

    /// A provider config pointed at this stand-in, with short retry waits.
    pub fn config(&self, kind: ProviderKind) -> ProviderConfig {
        ProviderConfig {
            kind,
            base_url: match kind {
                ProviderKind::OpenAi => format!("{}/v1", self.base),
                ProviderKind::Anthropic => self.base.clone(),
                ProviderKind::Gemini => format!("{}/v1beta", self.base),
            },
            api_key: Some("test-key".into()),
            model: "test-model".into(),
            max_retries: 3,
            retry_base: Duration::from_millis(50),
            max_retry_after: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
            max_tokens: 1024,
        }
    }
}

fn read_request(conn: &mut TcpStream) -> Option<Request> {
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: Instant::now(),
    })
}
