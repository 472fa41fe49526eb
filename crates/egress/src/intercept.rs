//! HTTPS to a domain with a secret header: the proxy ends the sandbox's TLS itself (with a leaf
//! from runcell's [`Authority`]), reads each HTTP/1.1 request, checks its Host, adds the
//! header, and sends it on over a TLS connection of its own to the real host, whose certificate
//! it verifies (webpki's roots, the system store, `serve --egress-ca-file`). Only these
//! domains are opened: every other tunnel stays end to end (docs/sandbox.md says why).

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream as ClientTls;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use crate::ca::Authority;
use crate::policy::{normalize_host, split_host_header};
use crate::state::{count, lock, Conn, EgressLimits, SessionState};

/// What the proxy needs to open HTTPS for secret domains: runcell's CA and the roots it
/// verifies real hosts against.
pub struct Interception {
    authority: Authority,
    upstream: Arc<rustls::ClientConfig>,
    /// Where the upstream roots came from, for a refusal's body.
    roots: String,
}

impl std::fmt::Debug for Interception {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interception")
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

impl Interception {
    /// `authority` signs the sandbox-side leaves; upstream hosts are verified against webpki's
    /// roots, the system's store, and each PEM file of `extra_roots` (every certificate in it).
    pub fn new(authority: Authority, extra_roots: &[PathBuf]) -> Result<Interception, TrustError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "egress: part of the system's certificate store could not be read");
        }
        let (system, _) = roots.add_parsable_certificates(native.certs);
        let mut from = vec![
            "webpki roots".to_owned(),
            format!("{system} from the system store"),
        ];
        for path in extra_roots {
            let n = add_pem_file(&mut roots, path)?;
            from.push(format!("{n} from {}", path.display()));
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interception {
            authority,
            upstream: Arc::new(upstream),
            roots: from.join(", "),
        })
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

fn add_pem_file(roots: &mut rustls::RootCertStore, path: &Path) -> Result<usize, TrustError> {
    let data = std::fs::read(path).map_err(|source| TrustError::Read {
        path: path.to_owned(),
        source,
    })?;
    let invalid = |reason: String| TrustError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(&data) {
        let cert = cert.map_err(|e| invalid(format!("not a PEM certificate file: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| invalid(format!("a certificate rustls cannot use as a root: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(invalid("no PEM certificate in it".into()));
    }
    Ok(n)
}

/// The response body: the destination's, or one of the proxy's own.
type Body = Either<Incoming, Full<Bytes>>;

/// Counts a client's bytes against its connection and the session's window; what the `CONNECT`
/// head's read took past the head comes first.
struct Metered {
    io: TcpStream,
    prefix: Vec<u8>,
    at: usize,
    conn: Arc<Conn>,
    state: Arc<SessionState>,
    max_bytes: u64,
}

impl AsyncRead for Metered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if me.at < me.prefix.len() {
            let n = buf.remaining().min(me.prefix.len() - me.at);
            buf.put_slice(&me.prefix[me.at..me.at + n]);
            me.at += n;
            return Poll::Ready(count(&me.conn.bytes_out, n, &me.state, me.max_bytes));
        }
        let before = buf.filled().len();
        match Pin::new(&mut me.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                Poll::Ready(count(&me.conn.bytes_out, n, &me.state, me.max_bytes))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        match Pin::new(&mut me.io).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                Poll::Ready(count(&me.conn.bytes_in, n, &me.state, me.max_bytes).map(|()| n))
            }
            other => other,
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The tunnel's `CONNECT` has been answered; `client` is about to start TLS. `upstream` is the
/// checked TCP connection to the destination.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn intercept(
    client: TcpStream,
    prefix: Vec<u8>,
    upstream: TcpStream,
    port: u16,
    conn: Arc<Conn>,
    state: Arc<SessionState>,
    limits: EgressLimits,
    icpt: &Interception,
) -> io::Result<()> {
    let host = conn.domain.clone();
    let t = limits.step_timeout;
    let refuse = |why: String| {
        *lock(&conn.refused) = Some(why.clone());
        io::Error::new(io::ErrorKind::PermissionDenied, why)
    };
    let metered = Metered {
        io: client,
        prefix,
        at: 0,
        conn: conn.clone(),
        state: state.clone(),
        max_bytes: limits.max_bytes_per_execution,
    };
    let start = match tokio::time::timeout(
        t,
        LazyConfigAcceptor::new(rustls::server::Acceptor::default(), metered),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(refuse(format!(
                "runcell egress: refused the tunnel to {host}:{port}: it carries HTTPS only (its domain has a secret header), and this is not a TLS ClientHello: {e}"
            )))
        }
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "no ClientHello")),
    };
    let hello = start.client_hello();
    if let Some(name) = hello.server_name() {
        if normalize_host(name).as_deref() != Some(host.as_str()) {
            return Err(refuse(format!(
                "runcell egress: refused the tunnel to {host}:{port}: its TLS server name is {name:?}"
            )));
        }
    }
    let offers_http1 = hello
        .alpn()
        .is_none_or(|mut protocols| protocols.any(|p| p == b"http/1.1"));
    if !offers_http1 {
        return Err(refuse(format!(
            "runcell egress: refused the tunnel to {host}:{port}: the client offers no HTTP/1.1 (ALPN), and requests to a domain with a secret header are read as HTTP/1.1"
        )));
    }
    let leaf = icpt
        .authority
        .leaf(&host)
        .map_err(|e| io::Error::other(format!("egress leaf for {host}: {e}")))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(leaf)));
    // HTTP/2 is refused by offering only HTTP/1.1: a client that asked for both settles on it.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = match tokio::time::timeout(t, start.into_stream(Arc::new(server))).await {
        Ok(r) => r?,
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake")),
    };
    let addr = upstream.peer_addr()?;
    let relay = Arc::new(Relay {
        host: host.clone(),
        port,
        addr,
        secrets: secret_headers(&state, &host),
        sender: tokio::sync::Mutex::new(None),
        tasks: std::sync::Mutex::new(Vec::new()),
        connector: TlsConnector::from(icpt.upstream.clone()),
        roots: icpt.roots.clone(),
        timeout: t,
        conn: conn.clone(),
    });
    // The first upstream connection is the one the checks made; a failure to verify it is the
    // answer to the first request (the sandbox's client gets a 502 saying why).
    let first = relay.handshake(upstream).await;
    let upstream_error = match first {
        Ok(sender) => {
            *relay.sender.lock().await = Some(sender);
            None
        }
        Err(why) => {
            *lock(&conn.refused) = Some(why.clone());
            Some(why)
        }
    };
    let service = {
        let relay = relay.clone();
        hyper::service::service_fn(move |req| {
            let relay = relay.clone();
            let upstream_error = upstream_error.clone();
            async move {
                Ok::<_, Infallible>(match upstream_error {
                    Some(why) => own(StatusCode::BAD_GATEWAY, &why),
                    None => relay.forward(req).await,
                })
            }
        })
    };
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await
        .map_err(io::Error::other)
}

/// The session's secret headers for `host`, ready to insert (marked sensitive: never logged).
fn secret_headers(state: &SessionState, host: &str) -> Vec<(HeaderName, HeaderValue)> {
    state
        .policy
        .secrets_for(host)
        .filter_map(|s| {
            let name = HeaderName::from_bytes(s.name.as_bytes()).ok()?;
            let mut value = HeaderValue::from_str(&s.value).ok()?;
            value.set_sensitive(true);
            Some((name, value))
        })
        .collect()
}

/// One intercepted connection's way on: requests go out one at a time over one upstream
/// connection, reopened (to the same checked address) when the destination closes it.
struct Relay {
    host: String,
    port: u16,
    addr: SocketAddr,
    secrets: Vec<(HeaderName, HeaderValue)>,
    sender: tokio::sync::Mutex<Option<SendRequest<Incoming>>>,
    /// The upstream connections' tasks, ended with the relay.
    tasks: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    connector: TlsConnector,
    roots: String,
    timeout: std::time::Duration,
    conn: Arc<Conn>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

impl Relay {
    /// TLS to the destination, verified, then HTTP/1.1 over it.
    async fn handshake(&self, tcp: TcpStream) -> Result<SendRequest<Incoming>, String> {
        let (host, port) = (&self.host, self.port);
        let name = ServerName::try_from(host.clone())
            .map_err(|e| format!("runcell egress: {host} is not a TLS server name: {e}"))?;
        let tls: ClientTls<TcpStream> =
            match tokio::time::timeout(self.timeout, self.connector.connect(name, tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err(format!(
                        "runcell egress: the TLS connection to {host}:{port} failed: {e} (the proxy verifies {host} against {})",
                        self.roots
                    ))
                }
                Err(_) => {
                    return Err(format!(
                        "runcell egress: the TLS handshake with {host}:{port} timed out"
                    ))
                }
            };
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("runcell egress: HTTP with {host}:{port}: {e}"))?;
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "egress upstream connection ended");
            }
        });
        lock(&self.tasks).push(task.abort_handle());
        Ok(sender)
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Response<Body> {
        if let Err(why) = self.check_host(&req) {
            *lock(&self.conn.refused) = Some(why.clone());
            return own(StatusCode::FORBIDDEN, &why);
        }
        prepare(&mut req, &self.secrets);
        let mut slot = self.sender.lock().await;
        // Twice at most: a request the destination's closed keep-alive connection never took
        // (hyper hands it back unsent) goes once more over a new connection; one it took and
        // dropped is not sent again (it may not be idempotent).
        for attempt in 0..2 {
            let reusable = match slot.as_mut() {
                Some(s) => s.ready().await.is_ok(),
                None => false,
            };
            if !reusable {
                match self.reopen().await {
                    Ok(s) => *slot = Some(s),
                    Err(why) => {
                        *slot = None;
                        return own(StatusCode::BAD_GATEWAY, &why);
                    }
                }
            }
            let Some(sender) = slot.as_mut() else {
                break;
            };
            match sender.try_send_request(req).await {
                Ok(resp) => return resp.map(Either::Left),
                Err(mut e) => {
                    *slot = None;
                    match e.take_message() {
                        Some(unsent) if attempt == 0 => req = unsent,
                        _ => {
                            return own(
                                StatusCode::BAD_GATEWAY,
                                &format!(
                                    "runcell egress: {}:{} did not answer the request: {}",
                                    self.host,
                                    self.port,
                                    e.error()
                                ),
                            )
                        }
                    }
                }
            }
        }
        own(
            StatusCode::BAD_GATEWAY,
            "runcell egress: no upstream connection",
        )
    }

    /// A new connection to the checked address (never a new lookup).
    async fn reopen(&self) -> Result<SendRequest<Incoming>, String> {
        match tokio::time::timeout(self.timeout, TcpStream::connect(self.addr)).await {
            Ok(Ok(tcp)) => self.handshake(tcp).await,
            Ok(Err(e)) => Err(format!(
                "runcell egress: cannot connect to {}:{} again: {e}",
                self.host, self.port
            )),
            Err(_) => Err(format!(
                "runcell egress: connecting to {}:{} again timed out",
                self.host, self.port
            )),
        }
    }

    /// Inside the tunnel, each request names its host again (Host, or an absolute URL): it
    /// must be the one the tunnel was allowed for, or the secret would go to a name the
    /// destination serves beside it.
    fn check_host(&self, req: &Request<Incoming>) -> Result<(), String> {
        let refuse = |said: &str| {
            Err(format!(
                "runcell egress: refused a request inside the tunnel to {}:{}: it names {said:?}",
                self.host, self.port
            ))
        };
        let named = match (
            req.uri().authority(),
            req.headers().get(hyper::header::HOST),
        ) {
            (Some(a), _) => a.as_str().to_owned(),
            (None, Some(h)) => match h.to_str() {
                Ok(h) => h.to_owned(),
                Err(_) => return refuse("a Host header that is not text"),
            },
            (None, None) => return refuse("no Host"),
        };
        match split_host_header(&named) {
            Some((name, port)) if name == self.host && port.unwrap_or(443) == self.port => Ok(()),
            _ => refuse(&named),
        }
    }
}

/// The request as it goes upstream: origin-form, no hop-by-hop headers (nor any the client
/// named in Connection), no Upgrade (the relay reads HTTP/1.1 only), and the secrets in place
/// of any header of theirs the client sent.
fn prepare(req: &mut Request<Incoming>, secrets: &[(HeaderName, HeaderValue)]) {
    if let Some(pq) = req.uri().path_and_query().cloned() {
        if req.uri().authority().is_some() {
            if let Ok(uri) = hyper::Uri::builder().path_and_query(pq).build() {
                *req.uri_mut() = uri;
            }
        }
    }
    let headers = req.headers_mut();
    let listed: Vec<HeaderName> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "upgrade",
    ] {
        headers.remove(name);
    }
    for (name, _) in secrets {
        headers.remove(name);
    }
    for (name, value) in secrets {
        headers.append(name.clone(), value.clone());
    }
}

/// One of the proxy's own answers, and the end of the connection after it.
fn own(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(format!(
        "{message}\n"
    )))));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    h.insert("x-runcell-egress", HeaderValue::from_static("refused"));
    resp
}
