//! The bridge between the store's synchronous API and the async driver, and the connections.
//!
//! The store's callers are synchronous (engine threads, `spawn_blocking` closures, the CLI),
//! so [`Pg::run`] hands each call to a small runtime the store owns and waits for its result
//! on the calling thread. The driver's I/O never runs on a caller's runtime: a caller that
//! blocks one of its own async worker threads (which it should not) slows itself down but
//! cannot starve the connections, and no caller needs a runtime at all.
//!
//! Connections are kept in a small pool: at most [`POOL_SIZE`] per store, each opened on
//! first need and dropped once the driver reports it closed (a server restart, say), so the
//! next call connects again instead of failing forever.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures_util::future::{select, Either};
use futures_util::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, Config, NoTls, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Result, StoreError};
use crate::lease::LeaseClock;

use super::tls;

/// Connections one store keeps open at most. Three nodes take 24 of PostgreSQL's default 100.
pub(super) const POOL_SIZE: usize = 8;
/// How long a call waits for a free connection before it fails as unavailable.
const CHECKOUT_WAIT: Duration = Duration::from_secs(10);
/// How long opening a connection may take (when the URL does not say `connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one call may take in all (waiting for a connection, connecting, the queries):
/// the longest a request waits on a database that stopped answering.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a call in progress looks whether its node's lease still holds.
const LEASE_CHECK: Duration = Duration::from_millis(100);

/// The runtime the driver runs on, and the pool.
pub(super) struct Pg {
    /// Always `Some` until dropped.
    rt: Option<tokio::runtime::Runtime>,
    pool: Arc<Pool>,
    /// A node's lease: a call fails as soon as it lapses (see [`Pg::run`]).
    lease: OnceLock<Arc<LeaseClock>>,
}

impl Drop for Pg {
    /// Without waiting for the runtime's tasks (the connections, the heartbeat): a store may
    /// be dropped on an async caller's thread, where waiting is not allowed (tokio panics).
    /// The connections close with it.
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Pg {
    /// Parses `url` (`postgres://...` or `host=... dbname=...`) and starts the runtime; no
    /// connection is opened yet. Also returns where it points (database and hosts, never the
    /// password), for messages.
    pub(super) fn new(url: &str) -> Result<(Pg, String)> {
        let (url, mode, root) = tls::split(url)?;
        let mut config: Config = url
            .parse()
            .map_err(|_| StoreError::Invalid("the database URL is not a PostgreSQL URL".into()))?;
        config.ssl_mode(mode.ssl_mode());
        let tls = tls::connector(mode, root.as_deref())?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("runcell");
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(dir) => dir.display().to_string(),
            })
            .collect();
        let target = format!(
            "{} on {}",
            config.get_dbname().unwrap_or("(default database)"),
            hosts.join(",")
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            // The driver's work is I/O and a little encoding: two threads keep up with a node.
            .worker_threads(2)
            .thread_name("runcell-store-pg")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|source| StoreError::Io {
                path: "(postgresql runtime)".into(),
                source,
            })?;
        let pool = Arc::new(Pool {
            config,
            tls,
            mode,
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(POOL_SIZE)),
        });
        Ok((
            Pg {
                rt: Some(rt),
                pool,
                lease: OnceLock::new(),
            },
            target,
        ))
    }

    /// From now on, calls fail once `lease` is not held (a node's store).
    pub(super) fn guard_with(&self, lease: Arc<LeaseClock>) {
        let _ = self.lease.set(lease);
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.rt
            .as_ref()
            .unwrap_or_else(|| unreachable!("the runtime goes only with the store"))
            .handle()
    }

    /// Runs `task` on the store's runtime until it ends or the store is dropped.
    pub(super) fn spawn<F>(&self, task: impl FnOnce(Arc<Pool>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle().spawn(task(self.pool.clone()));
    }

    /// Runs `call` with a connection, on the store's runtime, and waits for it here. A panic
    /// inside goes on in the caller.
    ///
    /// A call that takes longer than [`CALL_TIMEOUT`] fails as unavailable: a database cut
    /// off without a reset (a partition, a stopped server) never answers, and a request
    /// must not wait for it forever. A node's call also fails, with the lease's
    /// [`StoreError::Fenced`], as soon as its lease is not held: a node cut off from the
    /// database answers within its lease, before the others could call it dead, rather
    /// than after the call's bound.
    pub(super) fn run<T, F, Fut>(&self, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Pool>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        self.run_within(CALL_TIMEOUT, call)
    }

    /// [`Pg::run`] with its own bound (verifying a long chain may take longer).
    pub(super) fn run_within<T, F, Fut>(&self, bound: Duration, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Pool>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let pool = self.pool.clone();
        let lease = self.lease.get().cloned();
        if let Some(l) = &lease {
            l.state().check()?;
        }
        let fut = AssertUnwindSafe(call(self.pool.clone())).catch_unwind();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle().spawn(async move {
            let lapsed = async move {
                match lease {
                    Some(l) => loop {
                        if let Err(e) = l.state().check() {
                            break e;
                        }
                        tokio::time::sleep(LEASE_CHECK).await;
                    },
                    None => std::future::pending().await,
                }
            };
            let call = tokio::time::timeout(bound, fut);
            let (r, abandoned) = match select(pin!(call), pin!(lapsed)).await {
                Either::Left((Ok(r), _)) => (r, false),
                Either::Left((Err(_), _)) => (
                    Ok(Err(StoreError::Unavailable {
                        reason: format!("the database did not answer within {} s", bound.as_secs()),
                        source: None,
                    })),
                    true,
                ),
                Either::Right((fenced, _)) => (Ok(Err(fenced)), true),
            };
            if abandoned {
                // The call's connection went back to the pool when the call was dropped;
                // it may be a stuck one, and so may the others.
                pool.drop_idle();
            }
            let _ = tx.send(r);
        });
        match rx.recv() {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            // Only if the runtime dropped the task: it is being shut down.
            Err(_) => Err(StoreError::Unavailable {
                reason: "the store is shutting down".into(),
                source: None,
            }),
        }
    }
}

/// Open connections not in use, and permits for at most [`POOL_SIZE`] in use or idle.
pub(super) struct Pool {
    config: Config,
    /// How connections are encrypted (`None`: `sslmode=disable`).
    tls: Option<MakeRustlsConnect>,
    mode: tls::Mode,
    idle: Mutex<Vec<PgConn>>,
    slots: Arc<Semaphore>,
}

impl Pool {
    /// A connection: an idle one that is still open, or a new one.
    pub(super) async fn get(self: &Arc<Self>) -> Result<Conn> {
        let permit = tokio::time::timeout(CHECKOUT_WAIT, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| StoreError::Unavailable {
                reason: format!(
                    "no database connection free within {} s",
                    CHECKOUT_WAIT.as_secs()
                ),
                source: None,
            })?
            .map_err(|_| StoreError::Unavailable {
                reason: "the store is shutting down".into(),
                source: None,
            })?;
        let reused = loop {
            let c = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match c {
                Some(c) if c.client.is_closed() => continue,
                other => break other,
            }
        };
        let conn = match reused {
            Some(c) => c,
            None => self.connect().await?,
        };
        Ok(Conn {
            conn: Some(conn),
            pool: self.clone(),
            _permit: permit,
        })
    }

    /// A new connection of its own, outside the pool (the heartbeat's).
    pub(super) async fn connect(&self) -> Result<PgConn> {
        let refused = |e: tokio_postgres::Error| {
            // TLS refused (a certificate that does not verify, a server without TLS where
            // it is required) is said as such: it will not pass by retrying.
            let tls = {
                let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
                let mut found = false;
                while let Some(c) = cur {
                    found |= c.is::<rustls::Error>() || c.to_string().contains("TLS");
                    cur = c.source();
                }
                found
            };
            let reason = if tls {
                format!(
                    "cannot connect to PostgreSQL: TLS failed (sslmode={})",
                    self.mode.as_str()
                )
            } else {
                "cannot connect to PostgreSQL".into()
            };
            StoreError::Unavailable {
                reason,
                source: Some(e),
            }
        };
        // The connection's I/O; it ends when the client is dropped or the socket breaks, and
        // the client then reports itself closed.
        let client = match &self.tls {
            None => {
                let (client, connection) = self.config.connect(NoTls).await.map_err(refused)?;
                tokio::spawn(connection);
                client
            }
            Some(tls) => {
                let (client, connection) =
                    self.config.connect(tls.clone()).await.map_err(refused)?;
                tokio::spawn(connection);
                client
            }
        };
        Ok(PgConn {
            client,
            statements: HashMap::new(),
        })
    }

    /// Drops every idle connection: after a call timed out, the others may hang as well
    /// (a database cut off without a reset), and new ones find out at once.
    fn drop_idle(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// One connection and the statements prepared on it.
pub(super) struct PgConn {
    pub(super) client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl PgConn {
    /// The connection and its statement cache apart, so a transaction on the one can use
    /// the other.
    pub(super) fn split(&mut self) -> (&mut Client, Prepared<'_>) {
        (&mut self.client, Prepared(&mut self.statements))
    }
}

/// A connection's prepared statements, by their SQL: each is parsed once per connection.
pub(super) struct Prepared<'a>(&'a mut HashMap<&'static str, Statement>);

impl Prepared<'_> {
    /// `sql` prepared on `client` (the connection, or a transaction on it).
    pub(super) async fn get(
        &mut self,
        client: &impl tokio_postgres::GenericClient,
        sql: &'static str,
    ) -> Result<Statement> {
        if let Some(s) = self.0.get(sql) {
            return Ok(s.clone());
        }
        let s = client.prepare(sql).await?;
        self.0.insert(sql, s.clone());
        Ok(s)
    }
}

/// A connection taken from the pool; back to it when dropped, unless it closed.
pub(super) struct Conn {
    conn: Option<PgConn>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
}

impl std::ops::Deref for Conn {
    type Target = PgConn;
    fn deref(&self) -> &PgConn {
        self.conn.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut PgConn {
        self.conn.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take().filter(|c| !c.client.is_closed()) {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(c);
        }
    }
}
