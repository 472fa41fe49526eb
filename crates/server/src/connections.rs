//! The accept loop and what bounds a connection: how many may be open (past the cap, a 503,
//! then the kernel's backlog), how long a client may take to send a request's head, how
//! long an idle keep-alive connection stays, how slowly a body may arrive. Without these a
//! flood of idle connections took the server's memory and its last descriptors, and sessions
//! whose kernel needed one died.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::{ApiError, BodyTooSlow};

/// How connections are bounded (`runcell serve --max-connections`, `--header-timeout`,
/// `--keep-alive-timeout`, `--body-timeout`, `--body-min-rate`).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections served at once; past it a few more are answered 503 and the rest wait in
    /// the kernel's listen backlog until one closes.
    pub max_connections: usize,
    /// From a connection's opening, or the first byte of a request, to the end of its head.
    pub header_timeout: Duration,
    /// How long a connection may sit between requests.
    pub keep_alive_timeout: Duration,
    /// What a request body may take before the minimum rate applies...
    pub body_timeout: Duration,
    /// ...and then at least this many bytes per second on average (every byte received buys
    /// `1/rate` s more): a 100 MiB upload at the default takes up to 3.6 h, a slow-loris
    /// trickle is cut after `body_timeout`.
    pub body_min_rate: u64,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            body_min_rate: 8 << 10,
        }
    }
}

/// Descriptors the server itself needs beside connections and sessions: the database and its
/// WAL, listeners, the zygote, logs, one-shot runs, the runtime's own.
pub const RESERVED_FDS: u64 = 128;
/// Descriptors one live session may hold on the host at its busiest, with room to spare:
/// measured 7 idle before its first cell (kernel channel socket, two output pipes, pidfd,
/// uid lease, ...), 15 once cells ran (its cgroup's stat files stay open), 24 while a cell
/// and a shell command run at once (the command's sandbox, its pipes and pidfd, the
/// workspace snapshot's directory walk).
pub const FDS_PER_SESSION: u64 = 32;
/// The most connections answered 503 at once: a refusal takes a descriptor too, briefly.
const MAX_REFUSING: usize = 32;
/// How long a refused connection may take to send the request it gets the 503 for.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What one server can hold at once within its open-files limit: every live session keeps
/// [`FDS_PER_SESSION`] descriptors it can count on, so a flood of connections never starves
/// a session's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub max_connections: usize,
    pub max_sessions: usize,
}

impl Capacity {
    /// The budget of `open_files` descriptors (`RLIMIT_NOFILE`) with `warm` sessions kept
    /// started ahead of demand: [`RESERVED_FDS`] for the server, `max_connections` (by
    /// default a quarter of what is left, at most 1024) plus those being refused, and the
    /// rest for sessions, at most one per host uid.
    pub fn derive(
        open_files: u64,
        warm: usize,
        max_connections: Option<usize>,
    ) -> Result<Capacity, String> {
        let avail = open_files.saturating_sub(RESERVED_FDS + warm as u64 * FDS_PER_SESSION);
        let connections = max_connections.unwrap_or_else(|| (avail / 4).clamp(8, 1024) as usize);
        let for_sessions = avail.saturating_sub((connections + refusing(connections)) as u64);
        let by_uids = runcell_engine::MAX_SANDBOXES as u64 / 2;
        let sessions = (for_sessions / FDS_PER_SESSION).min(by_uids);
        if connections == 0 || sessions == 0 {
            return Err(format!(
                "an open-files limit of {open_files} leaves no room for {connections} \
                 connections and a session (each session needs {FDS_PER_SESSION}, the server \
                 {RESERVED_FDS}, warm sessions theirs): raise `ulimit -n` or lower \
                 --max-connections or --warm-sessions"
            ));
        }
        Ok(Capacity {
            max_connections: connections,
            max_sessions: sessions as usize,
        })
    }
}

fn refusing(max_connections: usize) -> usize {
    (max_connections / 16).clamp(1, MAX_REFUSING)
}

/// Serves `router` on `listener` until `shutdown` resolves; requests in flight finish first.
pub(crate) async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    opts: ServeOptions,
) -> io::Result<()> {
    let opts = Arc::new(opts);
    let serving = Arc::new(Semaphore::new(opts.max_connections));
    let refusing = Arc::new(Semaphore::new(refusing(opts.max_connections)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    // Once per interval at most: a flood must not flood the log too.
    let mut last_warned: Option<Instant> = None;
    loop {
        // A slot first, then the connection: with every slot taken, clients wait in the
        // listen backlog instead of costing a descriptor each.
        let slot = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            p = serving.clone().acquire_owned() => Slot::Serve(p.map_err(io::Error::other)?),
            p = refusing.clone().acquire_owned() => Slot::Refuse(p.map_err(io::Error::other)?),
        };
        let tcp = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
        };
        // Streamed replies (NDJSON execution events, the chat) are many small writes:
        // without TCP_NODELAY a write behind an unacknowledged one waits for the peer's
        // delayed ACK.
        let _ = tcp.set_nodelay(true);
        let slot = match slot {
            // A connection may have closed while this one was accepted.
            Slot::Refuse(p) => match serving.clone().try_acquire_owned() {
                Ok(s) => {
                    drop(p);
                    Slot::Serve(s)
                }
                Err(_) => Slot::Refuse(p),
            },
            serve => serve,
        };
        match slot {
            Slot::Serve(permit) => {
                let conn = serve_connection(tcp, router.clone(), opts.clone());
                let watched = graceful.watcher();
                tokio::spawn(async move {
                    conn.run(watched).await;
                    drop(permit);
                });
            }
            Slot::Refuse(permit) => {
                let max = opts.max_connections;
                if last_warned.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    last_warned = Some(Instant::now());
                    tracing::warn!(
                        max_connections = max,
                        "connection cap reached: answering 503, then leaving clients in the listen backlog"
                    );
                }
                tokio::spawn(async move {
                    refuse(tcp, max).await;
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

enum Slot {
    Serve(OwnedSemaphorePermit),
    Refuse(OwnedSemaphorePermit),
}

/// Accept errors are the client's (reset before accepted) or transient (out of descriptors,
/// with every slot's descriptor counted: some other part of the process holds too many).
/// Neither ends the server.
async fn accept_error(e: io::Error) {
    if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
        tracing::warn!(error = %e, "cannot accept a connection: out of descriptors; waiting");
        tokio::time::sleep(Duration::from_millis(250)).await;
    } else {
        tracing::debug!(error = %e, "accept failed");
    }
}

/// One connection served under the deadlines of `opts`.
struct Served {
    conn: hyper::server::conn::http1::Connection<TokioIo<Watched>, ConnService>,
    activity: Arc<Activity>,
    opts: Arc<ServeOptions>,
}

fn serve_connection(tcp: TcpStream, router: Router, opts: Arc<ServeOptions>) -> Served {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        tcp,
        activity: activity.clone(),
    });
    let service = ConnService {
        router,
        activity: activity.clone(),
        opts: opts.clone(),
    };
    // HTTP/1.1 only, as under axum::serve's default features. The deadlines are this
    // module's (see `Activity`): hyper's own header timeout would also run while the
    // connection idles between requests.
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.header_read_timeout(None);
    let conn = builder.serve_connection(io, service);
    Served {
        conn,
        activity,
        opts,
    }
}

impl Served {
    async fn run(self, graceful: hyper_util::server::graceful::Watcher) {
        let Served {
            conn,
            activity,
            opts,
        } = self;
        let conn = graceful.watch(conn);
        tokio::select! {
            r = conn => if let Err(e) = r {
                tracing::trace!(error = %e, "connection ended with an error");
            },
            // Dropping the connection closes it: nothing is in flight on it.
            why = activity.expired(&opts) => tracing::debug!(reason = why, "connection closed"),
        }
    }
}

/// What a connection is doing, for its deadlines.
struct Activity {
    state: Mutex<ActivityState>,
    changed: Notify,
}

struct ActivityState {
    /// Requests whose response has not been sent in full. While there is one, no deadline
    /// runs: a long streamed execution is not an idle connection (its body has its own).
    in_flight: usize,
    /// Since when nothing is in flight (the connection's opening, then each last response).
    idle_since: Instant,
    /// The first byte of a request head read while idle.
    head_since: Option<Instant>,
    /// Whether a request came before: then idling is keep-alive, not a silent client.
    served: bool,
}

impl Activity {
    fn new() -> Self {
        Activity {
            state: Mutex::new(ActivityState {
                in_flight: 0,
                idle_since: Instant::now(),
                head_since: None,
                served: false,
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read_some(&self) {
        let mut s = self.lock();
        if s.in_flight == 0 && s.head_since.is_none() {
            s.head_since = Some(Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }

    fn request_started(self: &Arc<Self>) -> InFlight {
        let mut s = self.lock();
        s.in_flight += 1;
        s.head_since = None;
        s.served = true;
        InFlight(self.clone())
    }

    /// Resolves when the connection has outlived its deadline with nothing in flight, with
    /// the reason.
    async fn expired(&self, opts: &ServeOptions) -> &'static str {
        loop {
            let deadline = {
                let s = self.lock();
                if s.in_flight > 0 {
                    None
                } else if let Some(t) = s.head_since {
                    Some((t + opts.header_timeout, "request head not received in time"))
                } else if !s.served {
                    Some((
                        s.idle_since + opts.header_timeout,
                        "no request received in time",
                    ))
                } else {
                    Some((s.idle_since + opts.keep_alive_timeout, "idle keep-alive"))
                }
            };
            match deadline {
                None => self.changed.notified().await,
                Some((at, why)) => {
                    if Instant::now() >= at {
                        return why;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.changed.notified() => {}
                    }
                }
            }
        }
    }
}

/// A request in flight on its connection, until its response is sent (or dropped).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight -= 1;
        if s.in_flight == 0 {
            s.idle_since = Instant::now();
        }
        drop(s);
        self.0.changed.notify_one();
    }
}

/// The TCP stream, noting when a request's first bytes arrive.
struct Watched {
    tcp: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

/// The router behind one connection: request bodies under the minimum rate, responses
/// counted in flight until sent.
#[derive(Clone)]
struct ConnService {
    router: Router,
    activity: Arc<Activity>,
    opts: Arc<ServeOptions>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<CountedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let in_flight = self.activity.request_started();
        let req = req.map(|b| Body::new(MinRateBody::new(b, &self.opts)));
        let mut router = self.router.clone();
        Box::pin(async move {
            // A Router is always ready.
            let resp = tower_service::Service::call(&mut router, req)
                .await
                .unwrap_or_else(|e: Infallible| match e {});
            Ok(resp.map(|body| CountedBody {
                body,
                in_flight: Some(in_flight),
            }))
        })
    }
}

/// A response body that keeps its request in flight until it has been sent.
struct CountedBody {
    body: Body,
    in_flight: Option<InFlight>,
}

impl hyper::body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.in_flight = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body must come within `body_timeout` plus `1/rate` s per byte received; time the
/// handler spends not reading does not count.
struct MinRateBody {
    inner: Incoming,
    grace: Duration,
    rate: u64,
    received: u64,
    /// Time spent waiting for the client so far.
    waited: Duration,
    waiting_since: Option<Instant>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl MinRateBody {
    fn new(inner: Incoming, opts: &ServeOptions) -> Self {
        MinRateBody {
            inner,
            grace: opts.body_timeout,
            rate: opts.body_min_rate.max(1),
            received: 0,
            waited: Duration::ZERO,
            waiting_since: None,
            timer: None,
        }
    }

    fn stop_waiting(&mut self) {
        if let Some(since) = self.waiting_since.take() {
            self.waited += since.elapsed();
        }
    }
}

impl hyper::body::Body for MinRateBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                this.stop_waiting();
                if let Some(Ok(frame)) = &r {
                    if let Some(data) = frame.data_ref() {
                        this.received += data.len() as u64;
                    }
                }
                Poll::Ready(r.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                let since = *this.waiting_since.get_or_insert_with(Instant::now);
                let allowance =
                    this.grace + Duration::from_secs_f64(this.received as f64 / this.rate as f64);
                let deadline = since + allowance.saturating_sub(this.waited);
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTooSlow {
                        grace_s: this.grace.as_secs(),
                        rate: this.rate,
                    })))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Answers a connection past the cap with 503 `unavailable` once its request head is in,
/// then closes it: a client told to retry, not a connection reset.
async fn refuse(tcp: TcpStream, max: usize) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
        let mut resp = crate::vendor::refusal(
            req.uri().path(),
            ApiError::unavailable(format!(
                "this server serves at most {max} connections at once; retry shortly"
            )),
        );
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        Ok::<_, Infallible>(resp)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(REFUSE_TIMEOUT)
        .keep_alive(false);
    let conn = builder.serve_connection(TokioIo::new(tcp), service);
    let _ = tokio::time::timeout(REFUSE_TIMEOUT * 2, conn).await;
}
