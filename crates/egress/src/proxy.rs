//! The proxy itself: one accept loop per sandbox socket, one task per connection, on a runtime
//! of its own (one worker thread, started by the first sandbox with a policy: sessions without
//! one never pay for it).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::task::JoinSet;

use crate::addr::{host_addresses, refusal, Cidr};
use crate::http::{self, Head, HeadError};
use crate::intercept::{intercept, Interception};
use crate::policy::{normalize_host, split_host_header, Policy};
use crate::state::{lock, Conn, EgressLimits, SessionState};
use crate::tls::{self, Hello};

/// Connections recorded per execution (see [`SessionEgress::take_records`]).
pub const MAX_RECORDS: usize = 1000;

/// One connection a sandbox made through the proxy, as the Execution records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub domain: String,
    pub port: u16,
    pub allowed: bool,
    /// From the sandbox to the destination.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Why it was refused (or cut short), as the 403's body said.
    pub refused: Option<String>,
}

/// The proxy: the operator's address ranges and limits, and the runtime (started on first use).
#[derive(Debug, Clone)]
pub struct Egress {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    allowed_cidrs: Vec<Cidr>,
    pub(crate) limits: EgressLimits,
    runtime: OnceLock<Handle>,
    /// HTTPS to domains with a secret header; without it their tunnels stay end to end (and
    /// the secret is added to plain HTTP only).
    interception: Option<Interception>,
}

impl Egress {
    /// `allowed_cidrs`: ranges the proxy may connect to although they are special (loopback,
    /// private, link-local) or the host's own (`serve --egress-allow-cidr`).
    pub fn new(allowed_cidrs: Vec<Cidr>, limits: EgressLimits) -> Egress {
        Egress {
            inner: Arc::new(Inner {
                allowed_cidrs,
                limits,
                runtime: OnceLock::new(),
                interception: None,
            }),
        }
    }

    /// The same, and opening HTTPS to the domains that have a secret header (see
    /// [`Interception`]).
    pub fn intercepting(
        allowed_cidrs: Vec<Cidr>,
        limits: EgressLimits,
        interception: Interception,
    ) -> Egress {
        Egress {
            inner: Arc::new(Inner {
                allowed_cidrs,
                limits,
                runtime: OnceLock::new(),
                interception: Some(interception),
            }),
        }
    }

    /// The interception's CA and trust, if HTTPS to secret domains is opened.
    pub fn interception(&self) -> Option<&Interception> {
        self.inner.interception.as_ref()
    }

    /// The state of one session (its policy, its connections), shared by each of its sandboxes.
    pub fn session(&self, policy: Policy) -> SessionEgress {
        SessionEgress {
            egress: self.clone(),
            state: Arc::new(SessionState {
                policy,
                open: AtomicUsize::new(0),
                window_bytes: AtomicU64::new(0),
                records: Mutex::new(Vec::new()),
            }),
        }
    }

    fn handle(&self) -> io::Result<Handle> {
        if let Some(h) = self.inner.runtime.get() {
            return Ok(h.clone());
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("runcell-egress".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("runcell-egress-worker")
                    .enable_all()
                    .build();
                match rt {
                    Ok(rt) => {
                        let _ = tx.send(Ok(rt.handle().clone()));
                        // Lives as long as the process: sessions come and go.
                        rt.block_on(std::future::pending::<()>());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })?;
        let handle = rx
            .recv()
            .map_err(|_| io::Error::other("the egress runtime did not start"))??;
        Ok(self.inner.runtime.get_or_init(|| handle).clone())
    }
}

/// One session's view of the proxy. Cloning shares the state.
#[derive(Debug, Clone)]
pub struct SessionEgress {
    egress: Egress,
    state: Arc<SessionState>,
}

/// Serving one sandbox's socket; dropping it stops the accept loop and ends its connections.
#[derive(Debug)]
pub struct Serving {
    task: tokio::task::AbortHandle,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SessionEgress {
    pub fn policy(&self) -> &Policy {
        &self.state.policy
    }

    /// The same policy with records and counters of its own: for a sandbox beside the
    /// session's (a command), whose connections are its own execution's.
    pub fn sibling(&self) -> SessionEgress {
        self.egress.session(self.state.policy.clone())
    }

    /// Serves `listener` (a sandbox's egress socket) until the returned guard is dropped.
    pub fn serve(&self, listener: std::net::TcpListener) -> io::Result<Serving> {
        let handle = self.egress.handle()?;
        listener.set_nonblocking(true)?;
        let _entered = handle.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let state = self.state.clone();
        let inner = self.egress.inner.clone();
        let task = handle.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            conns.spawn(connection(stream, state.clone(), inner.clone()));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "egress accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Serving {
            task: task.abort_handle(),
        })
    }

    /// The connections made since the last call (one execution's), with their bytes so far; and
    /// a new byte window.
    pub fn take_records(&self) -> Vec<ConnectionRecord> {
        self.state.window_bytes.store(0, Ordering::Relaxed);
        let taken = std::mem::take(&mut *lock(&self.state.records));
        taken
            .iter()
            .map(|c| {
                let refused = lock(&c.refused).clone();
                ConnectionRecord {
                    domain: c.domain.clone(),
                    port: c.port,
                    allowed: refused.is_none(),
                    bytes_out: c.bytes_out.load(Ordering::Relaxed),
                    bytes_in: c.bytes_in.load(Ordering::Relaxed),
                    refused,
                }
            })
            .collect()
    }
}

/// Counts an open connection for as long as it lives.
struct OpenGuard<'a>(&'a AtomicUsize);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A refusal: the status and the sentence the 403 (or 4xx/5xx) body carries.
struct Refusal {
    status: u16,
    reason: &'static str,
    message: String,
}

fn forbidden(message: String) -> Refusal {
    Refusal {
        status: 403,
        reason: "Forbidden",
        message,
    }
}

async fn connection(mut client: TcpStream, state: Arc<SessionState>, inner: Arc<Inner>) {
    let open = state.open.fetch_add(1, Ordering::Relaxed) + 1;
    let _guard = OpenGuard(&state.open);
    let t = inner.limits.step_timeout;
    let (head, rest) = match read_head(&mut client, t).await {
        Ok(h) => h,
        Err(Some(refusal)) => return refuse(&mut client, None, refusal).await,
        Err(None) => return,
    };
    let conn = Arc::new(Conn {
        domain: normalize_host(&head.host).unwrap_or_else(|| head.host.clone()),
        port: head.port,
        refused: Mutex::new(None),
        bytes_out: AtomicU64::new(0),
        bytes_in: AtomicU64::new(0),
    });
    {
        // A loop of refused connections must not grow the Execution (and the audit log)
        // without bound: past this many, connections still run, unrecorded.
        let mut records = lock(&state.records);
        if records.len() < MAX_RECORDS {
            records.push(conn.clone());
        }
    }
    if open > inner.limits.max_connections {
        let msg = format!(
            "runcell egress: refused {}:{}: this session already has {} connections open (the limit)",
            conn.domain, conn.port, inner.limits.max_connections
        );
        return refuse(&mut client, Some(&conn), forbidden(msg)).await;
    }
    let upstream = match check_and_connect(&head, &conn.domain, &state.policy, &inner).await {
        Ok(u) => u,
        Err(refusal) => return refuse(&mut client, Some(&conn), refusal).await,
    };
    let opened = inner
        .interception
        .as_ref()
        .filter(|_| state.policy.secrets_for(&conn.domain).next().is_some());
    let result = if let (None, Some(icpt)) = (&head.path, opened) {
        // A domain with a secret header: its HTTPS is opened here (crate::intercept).
        match client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
        {
            Ok(()) => {
                intercept(
                    client,
                    rest,
                    upstream,
                    head.port,
                    conn.clone(),
                    state.clone(),
                    inner.limits,
                    icpt,
                )
                .await
            }
            Err(e) => Err(e),
        }
    } else if head.path.is_none() {
        tunnel(client, upstream, rest, &head, &conn, &state, &inner).await
    } else {
        let secrets: Vec<(&str, &str)> = state
            .policy
            .secrets_for(&conn.domain)
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        let mut first = head.upstream(&secrets);
        first.extend_from_slice(&rest);
        pipe(client, upstream, first, &conn, &state, &inner).await
    };
    if let Err(e) = result {
        tracing::debug!(domain = %conn.domain, port = conn.port, error = %e, "egress connection ended");
    }
}

/// Reads the request head. `Err(None)`: the client went away, nothing to answer.
async fn read_head(
    client: &mut TcpStream,
    t: Duration,
) -> Result<(Head, Vec<u8>), Option<Refusal>> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = match tokio::time::timeout(t, client.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Err(None),
            Ok(Ok(n)) => n,
            Err(_) => {
                return Err(Some(Refusal {
                    status: 408,
                    reason: "Request Timeout",
                    message: "runcell egress: no complete request head in time".into(),
                }))
            }
        };
        buf.extend_from_slice(&chunk[..n]);
        match http::parse(&buf) {
            Ok((head, len)) => return Ok((head, buf.split_off(len))),
            Err(HeadError::Partial) if buf.len() < http::MAX_HEAD => continue,
            Err(HeadError::Partial) => {
                return Err(Some(Refusal {
                    status: 431,
                    reason: "Request Header Fields Too Large",
                    message: format!(
                        "runcell egress: the request head is over {} bytes",
                        http::MAX_HEAD
                    ),
                }))
            }
            Err(e) => {
                return Err(Some(Refusal {
                    status: 400,
                    reason: "Bad Request",
                    message: format!("runcell egress: {e}"),
                }))
            }
        }
    }
}

/// The checks in order: the name (and, for plain HTTP, that Host agrees), the policy, then
/// every address the name resolves to; connects to a checked address, never resolving again.
async fn check_and_connect(
    head: &Head,
    host: &str,
    policy: &Policy,
    inner: &Inner,
) -> Result<TcpStream, Refusal> {
    let what = format!("{} {}:{}", head.method, host, head.port);
    if normalize_host(&head.host).is_none() {
        return Err(forbidden(format!(
            "runcell egress: refused {what}: not a valid host name"
        )));
    }
    if head.path.is_some() {
        let header = head
            .header("host")
            .map(|v| String::from_utf8_lossy(v).into_owned());
        if let Some(h) = header {
            let matches = split_host_header(&h)
                .is_some_and(|(name, port)| name == host && port.unwrap_or(80) == head.port);
            if !matches {
                return Err(forbidden(format!(
                    "runcell egress: refused {what}: the Host header says {h:?}, the URL another destination"
                )));
            }
        }
    }
    if !policy.allows(host) {
        return Err(forbidden(format!(
            "runcell egress: refused {what}: {host} is not in this session's network allowlist (allowed_domains: {})",
            if policy.allowed.is_empty() { "none".to_owned() } else { policy.describe() }
        )));
    }
    let t = inner.limits.step_timeout;
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, head.port)],
        Err(_) => match tokio::time::timeout(t, tokio::net::lookup_host((host, head.port))).await {
            Ok(Ok(a)) => a.collect(),
            Ok(Err(e)) => {
                return Err(Refusal {
                    status: 502,
                    reason: "Bad Gateway",
                    message: format!("runcell egress: cannot resolve {host}: {e}"),
                })
            }
            Err(_) => {
                return Err(Refusal {
                    status: 504,
                    reason: "Gateway Timeout",
                    message: format!("runcell egress: resolving {host} timed out"),
                })
            }
        },
    };
    let own = host_addresses();
    let mut refused = None;
    let mut last_err = None;
    for addr in addrs {
        if let Some(why) = refusal(addr.ip(), &inner.allowed_cidrs, &own) {
            refused.get_or_insert((addr.ip(), why));
            continue;
        }
        match tokio::time::timeout(t, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last_err = Some(format!("{addr}: {e}")),
            Err(_) => last_err = Some(format!("{addr}: timed out")),
        }
    }
    match (last_err, refused) {
        (Some(e), _) => Err(Refusal {
            status: 502,
            reason: "Bad Gateway",
            message: format!("runcell egress: cannot connect to {host}:{}: {e}", head.port),
        }),
        (None, Some((ip, why))) => Err(forbidden(format!(
            "runcell egress: refused {what}: {host} resolves to {ip}, {why} (the server's address policy; serve --egress-allow-cidr allows a range)"
        ))),
        (None, None) => Err(Refusal {
            status: 502,
            reason: "Bad Gateway",
            message: format!("runcell egress: {host} has no address"),
        }),
    }
}

/// `CONNECT`: established, then the client's first bytes are checked before any is forwarded:
/// a TLS ClientHello must name the host the tunnel was allowed for.
async fn tunnel(
    mut client: TcpStream,
    upstream: TcpStream,
    mut first: Vec<u8>,
    head: &Head,
    conn: &Conn,
    state: &SessionState,
    inner: &Inner,
) -> io::Result<()> {
    client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await?;
    let host = conn.domain.as_str();
    let (up_r, mut up_w) = upstream.into_split();
    let (mut cl_r, mut cl_w) = client.into_split();
    // The destination may speak first (SSH, SMTP): its bytes flow at once.
    let down = async {
        let r = copy(up_r, &mut cl_w, &conn.bytes_in, state, inner).await;
        let _ = cl_w.shutdown().await;
        r
    };
    let up = async {
        let mut chunk = [0u8; 4096];
        loop {
            match tls::parse(&first) {
                Hello::Partial if first.len() < tls::MAX_HELLO => {}
                Hello::NotTls => break,
                Hello::Client { sni } => match sni {
                    Some(name) if normalize_host(&name).as_deref() != Some(host) => {
                        let why = format!(
                            "runcell egress: refused the tunnel to {host}:{}: its TLS server name is {name:?}",
                            head.port
                        );
                        *lock(&conn.refused) = Some(why.clone());
                        return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
                    }
                    _ => break,
                },
                Hello::Partial | Hello::Malformed => {
                    let why = format!(
                        "runcell egress: refused the tunnel to {host}:{}: a malformed TLS ClientHello",
                        head.port
                    );
                    *lock(&conn.refused) = Some(why.clone());
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
                }
            }
            let n = tokio::time::timeout(inner.limits.step_timeout, cl_r.read(&mut chunk))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no ClientHello"))??;
            if n == 0 {
                return Ok(());
            }
            first.extend_from_slice(&chunk[..n]);
        }
        count(&conn.bytes_out, first.len(), state, inner)?;
        up_w.write_all(&first).await?;
        let r = copy(cl_r, &mut up_w, &conn.bytes_out, state, inner).await;
        let _ = up_w.shutdown().await;
        r
    };
    tokio::try_join!(up, down).map(|_| ())
}

/// Plain HTTP: the rewritten head (and what followed it) first, then both ways.
async fn pipe(
    client: TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
    conn: &Conn,
    state: &SessionState,
    inner: &Inner,
) -> io::Result<()> {
    let (up_r, mut up_w) = upstream.into_split();
    let (cl_r, mut cl_w) = client.into_split();
    let up = async {
        count(&conn.bytes_out, first.len(), state, inner)?;
        up_w.write_all(&first).await?;
        let r = copy(cl_r, &mut up_w, &conn.bytes_out, state, inner).await;
        let _ = up_w.shutdown().await;
        r
    };
    let down = async {
        let r = copy(up_r, &mut cl_w, &conn.bytes_in, state, inner).await;
        let _ = cl_w.shutdown().await;
        r
    };
    tokio::try_join!(up, down).map(|_| ())
}

async fn copy(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    counter: &AtomicU64,
    state: &SessionState,
    inner: &Inner,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        count(counter, n, state, inner)?;
        to.write_all(&buf[..n]).await?;
    }
}

fn count(counter: &AtomicU64, n: usize, state: &SessionState, inner: &Inner) -> io::Result<()> {
    crate::state::count(counter, n, state, inner.limits.max_bytes_per_execution)
}

async fn refuse(client: &mut TcpStream, conn: Option<&Conn>, refusal: Refusal) {
    if let Some(c) = conn {
        *lock(&c.refused) = Some(refusal.message.clone());
        tracing::debug!(domain = %c.domain, port = c.port, refused = %refusal.message, "egress refused");
    }
    let body = format!("{}\n", refusal.message);
    // The reason phrase carries the sentence too: clients that report only the status line
    // of a failed CONNECT (Python's http.client, so pip and requests) show it.
    let reason = format!("{}: {}", refusal.reason, refusal.message);
    let _ = client
        .write_all(&http::response(refusal.status, &reason, &body))
        .await;
    let _ = client.shutdown().await;
}
