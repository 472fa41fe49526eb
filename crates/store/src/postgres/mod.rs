//! The PostgreSQL backend, for several nodes sharing one database. [`PgStore`] runs the
//! async driver on a runtime of its own behind the store's synchronous API (`pool.rs`);
//! `schema.rs` migrates and settles the chain key, `records.rs` holds keys, tenants, sessions
//! and uploads, `chain.rs` the audit chains; this file maps [`DomainStore`] and [`Backend`]
//! onto them.
//!
//! What differs from SQLite, on purpose: every node appends to the same per-tenant chains, so
//! an append locks its tenant's chain head row and the chain stays one line whichever node
//! writes; every node must be given the same chain key file (the database records its id and
//! refuses any other); [`Backend::keys_generation`] counts this node's key changes only
//! (authentication caches on other nodes expire on their own).

mod chain;
mod nodes;
mod pool;
mod records;
mod schema;
mod takeover;
mod tls;

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::audit::ChainKey;
use crate::error::{Result, StoreError};
use crate::group::GroupCommit;
use crate::pending::{pending_append, PendingAppend};
use crate::{
    validate, AuditEntry, Backend, ChainHead, DomainStore, ExecutionRow, Expected, KeyInfo,
    NewExecution, SessionNode, SessionRecord, TenantChange, TenantSettings, UploadRecord,
    VerifyReport,
};
pub use nodes::NODE_TIMEOUT;
use pool::Pg;
use records::Owner;

/// How long verifying the audit chains may take.
const VERIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// PostgreSQL storage: a pool of connections to one database, shared with other nodes.
pub struct PgStore {
    pg: Pg,
    /// What the chain's HMACs are keyed with (the same on every node).
    key: Arc<ChainKey>,
    /// Concurrent appends from this node, committed together.
    appends: GroupCommit<PendingAppend<'static>, AuditEntry>,
    keys_generation: AtomicU64,
    appended: AtomicU64,
    /// The database's name and hosts, for `Debug` (never the password).
    target: String,
    /// The node this store writes sessions as, if it is one.
    owner: Option<Owner>,
    /// That node's lease on its sessions, as its heartbeat renews it.
    lease: Option<Arc<crate::lease::LeaseClock>>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("database", &self.target)
            .field("node", &self.owner)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/dbname`, or
    /// `host=... dbname=...`; a host that is a directory is a Unix socket's), applies pending
    /// migrations and settles the chain key in `chain_key_file`: created if missing when the
    /// database has none yet; otherwise it must be the key the database is keyed with
    /// ([`StoreError::WrongChainKey`]), so every node needs a copy of the same file.
    ///
    /// A store opened this way is no node: it owns no session (for `runcell keys` and
    /// `runcell audit`); a server opens [`PgStore::open_node`].
    pub fn open(url: &str, chain_key_file: &Path) -> Result<PgStore> {
        let (pg, target) = Pg::new(url)?;
        let key_file = chain_key_file.to_owned();
        let key = pg.run(|pool| async move {
            let mut c = pool.get().await?;
            schema::migrate(&mut c.client).await?;
            schema::settle_chain_key(&mut c.client, &key_file).await
        })?;
        Ok(PgStore {
            pg,
            key: Arc::new(key),
            appends: GroupCommit::new(),
            keys_generation: AtomicU64::new(0),
            appended: AtomicU64::new(0),
            target,
            owner: None,
            lease: None,
        })
    }

    /// Like [`PgStore::open`], for the server of node `node` (its `--node-url`, or another
    /// name no other node uses): registers the node with a new epoch and keeps its heartbeat
    /// going while the store lives. The sessions it writes are the node's; it recovers,
    /// sweeps and changes only those (and those of dead nodes, which read as `dead` after
    /// [`NODE_TIMEOUT`] of silence, on every node).
    pub fn open_node(url: &str, chain_key_file: &Path, node: &str) -> Result<PgStore> {
        if node.is_empty() || node.len() > 1024 {
            return Err(StoreError::Invalid(
                "a node's id must be 1 to 1024 bytes".into(),
            ));
        }
        let mut store = PgStore::open(url, chain_key_file)?;
        let id = own(node);
        let sent = std::time::Instant::now();
        let epoch = store
            .pg
            .run(|pool| async move { nodes::register(&pool, &id).await })?;
        let owner = Owner {
            node: own(node),
            epoch,
        };
        let lease = Arc::new(crate::lease::LeaseClock::new(epoch, sent));
        let (beating, renewing) = (owner.clone(), lease.clone());
        store
            .pg
            .spawn(|pool| async move { nodes::heartbeat(pool, beating, renewing).await });
        store.pg.guard_with(lease.clone());
        store.owner = Some(owner);
        store.lease = Some(lease);
        Ok(store)
    }

    /// This node's id and epoch, if the store is a node's.
    pub fn node(&self) -> Option<(&str, i64)> {
        self.owner.as_ref().map(|o| (o.node.as_str(), o.epoch))
    }

    /// The schema version this binary migrates PostgreSQL to.
    pub fn schema_version() -> i64 {
        schema::known_version()
    }

    /// Commits `batch` in one transaction, or row by row if that fails: one result per row.
    fn commit(&self, batch: Vec<PendingAppend<'static>>) -> Vec<Result<AuditEntry>> {
        let n = batch.len();
        let (key, owner) = (self.key.clone(), self.owner.clone());
        let results = self.pg.run(|pool| async move {
            let mut c = pool.get().await?;
            Ok(chain::commit_appends(&mut c, &key, &batch, owner.as_ref()).await)
        });
        match results {
            Ok(r) => r,
            // No connection: every row fails the same way.
            Err(e) => {
                let again = |e: &StoreError| StoreError::Unavailable {
                    reason: e.to_string(),
                    source: None,
                };
                let mut out: Vec<_> = (1..n).map(|_| Err(again(&e))).collect();
                out.insert(0, Err(e));
                out
            }
        }
    }
}

/// Owned copies of borrowed arguments, for the store's runtime.
fn own(s: &str) -> String {
    s.to_owned()
}

impl DomainStore for PgStore {
    fn lease(&self) -> crate::Lease {
        self.lease
            .as_ref()
            .map_or(crate::Lease::Held, |l| l.state())
    }

    fn tenant_settings(&self, tenant: &str) -> Result<TenantSettings> {
        let tenant = own(tenant);
        self.pg.run(|pool| async move {
            records::tenant_settings(&mut *pool.get().await?, &tenant).await
        })
    }

    fn put_session(&self, s: &SessionRecord) -> Result<()> {
        let (s, owner) = (s.clone(), self.owner.clone());
        self.pg.run(|pool| async move {
            records::put_session(&mut *pool.get().await?, &s, owner.as_ref()).await
        })
    }

    fn update_session_status(
        &self,
        id: &str,
        status: &str,
        last_active_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<bool> {
        let (id, status, owner) = (own(id), own(status), self.owner.clone());
        self.pg.run(|pool| async move {
            let mut c = pool.get().await?;
            let owner = owner.as_ref();
            records::update_session_status(&mut c, &id, &status, last_active_at, expires_at, owner)
                .await
        })
    }

    fn get_session(&self, tenant: &str, id: &str) -> Result<Option<SessionRecord>> {
        let (tenant, id, owner) = (own(tenant), own(id), self.owner.clone());
        self.pg.run(|pool| async move {
            records::get_session(&mut *pool.get().await?, &tenant, &id, owner.as_ref()).await
        })
    }

    fn take_over_session(&self, id: &str, dead_node: &str) -> Result<bool> {
        let Some(owner) = self.owner.clone() else {
            return Ok(false);
        };
        let (id, dead_node) = (own(id), own(dead_node));
        self.pg.run(|pool| async move {
            takeover::take_over(&mut *pool.get().await?, &id, &dead_node, &owner).await
        })
    }

    fn list_sessions(&self, tenant: &str) -> Result<Vec<SessionRecord>> {
        let (tenant, owner) = (own(tenant), self.owner.clone());
        self.pg.run(|pool| async move {
            records::list_sessions(&mut *pool.get().await?, &tenant, owner.as_ref()).await
        })
    }

    fn delete_session(&self, id: &str) -> Result<bool> {
        let id = own(id);
        self.pg
            .run(|pool| async move { records::delete_session(&mut *pool.get().await?, &id).await })
    }

    fn sessions_with_status(&self, statuses: &[&str]) -> Result<Vec<SessionRecord>> {
        let statuses: Vec<String> = statuses.iter().map(|s| own(s)).collect();
        let owner = self.owner.clone();
        self.pg.run(|pool| async move {
            records::sessions_with_status(&mut *pool.get().await?, &statuses, owner.as_ref()).await
        })
    }

    fn record_upload(
        &self,
        session_id: &str,
        path: &str,
        size: u64,
        sha256_hex: &str,
        at: DateTime<Utc>,
    ) -> Result<()> {
        let (session_id, path, sha) = (own(session_id), own(path), own(sha256_hex));
        self.pg.run(|pool| async move {
            let mut c = pool.get().await?;
            records::record_upload(&mut c, &session_id, &path, size, &sha, at).await
        })
    }

    fn uploads(&self, session_id: &str) -> Result<Vec<UploadRecord>> {
        let session_id = own(session_id);
        self.pg
            .run(|pool| async move { records::uploads(&mut *pool.get().await?, &session_id).await })
    }

    fn append_execution(&self, rec: &NewExecution) -> Result<AuditEntry> {
        let pending = PendingAppend {
            rec: std::borrow::Cow::Owned(rec.clone()),
            ..pending_append(rec)?
        };
        // Concurrent appends from this node share one transaction (see `group`); each
        // returns once the commit holding its row is done.
        let entry = self.appends.submit(pending, |batch| self.commit(batch))?;
        self.appended.fetch_add(1, Ordering::Relaxed);
        Ok(entry)
    }

    fn append_executions(&self, recs: &[NewExecution]) -> Vec<Result<AuditEntry>> {
        // The valid records share one transaction; the invalid ones get their error alone.
        let mut results: Vec<Option<Result<AuditEntry>>> = Vec::with_capacity(recs.len());
        let mut batch = Vec::with_capacity(recs.len());
        for rec in recs {
            match pending_append(rec) {
                Ok(p) => {
                    batch.push(PendingAppend {
                        rec: std::borrow::Cow::Owned(rec.clone()),
                        created_at: p.created_at,
                    });
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let mut committed = if batch.is_empty() {
            Vec::new()
        } else {
            self.commit(batch)
        }
        .into_iter();
        let ok = committed.as_slice().iter().filter(|r| r.is_ok()).count();
        self.appended.fetch_add(ok as u64, Ordering::Relaxed);
        results
            .into_iter()
            .map(|r| {
                r.or_else(|| committed.next()).unwrap_or_else(|| {
                    Err(StoreError::Corrupt("a batch append lost a result".into()))
                })
            })
            .collect()
    }

    fn list_executions(
        &self,
        tenant: &str,
        session_id: Option<&str>,
        limit: usize,
        before: Option<&str>,
    ) -> Result<(Vec<ExecutionRow>, Option<String>)> {
        let (tenant, session_id, before) = (own(tenant), session_id.map(own), before.map(own));
        self.pg.run(|pool| async move {
            let mut c = pool.get().await?;
            chain::list_executions(
                &mut c,
                &tenant,
                session_id.as_deref(),
                limit,
                before.as_deref(),
            )
            .await
        })
    }

    fn get_execution(&self, tenant: &str, id: &str) -> Result<Option<ExecutionRow>> {
        let (tenant, id) = (own(tenant), own(id));
        self.pg.run(|pool| async move {
            chain::get_execution(&mut *pool.get().await?, &tenant, &id).await
        })
    }

    fn verify_extends(&self, tenant: Option<&str>, expected: &[Expected]) -> Result<VerifyReport> {
        let (tenant, expected, key) = (tenant.map(own), expected.to_vec(), self.key.clone());
        // A whole chain is read: longer than one request's bound.
        self.pg.run_within(VERIFY_TIMEOUT, |pool| async move {
            let mut c = pool.get().await?;
            chain::verify(&mut c, &key, tenant.as_deref(), &expected).await
        })
    }
}

impl Backend for PgStore {
    fn keys_generation(&self) -> u64 {
        self.keys_generation.load(Ordering::SeqCst)
    }

    fn create_key(&self, name: &str, tenant: &str) -> Result<(KeyInfo, String)> {
        self.create_key_in_format(name, tenant, crate::KeyFormat::Runcell)
    }

    fn create_key_in_format(
        &self,
        name: &str,
        tenant: &str,
        format: crate::KeyFormat,
    ) -> Result<(KeyInfo, String)> {
        // Before the change and after it (see the SQLite backend): a cached "no key needed"
        // cannot outlive it.
        self.keys_generation.fetch_add(1, Ordering::SeqCst);
        let (name, tenant) = (own(name), own(tenant));
        let r = self.pg.run(|pool| async move {
            records::create_key(&mut *pool.get().await?, &name, &tenant, format).await
        });
        self.keys_generation.fetch_add(1, Ordering::SeqCst);
        r
    }

    fn list_keys(&self) -> Result<Vec<KeyInfo>> {
        self.pg
            .run(|pool| async move { records::list_keys(&mut *pool.get().await?).await })
    }

    fn revoke_key(&self, id_or_name: &str) -> Result<bool> {
        let id_or_name = own(id_or_name);
        let r = self.pg.run(|pool| async move {
            records::revoke_key(&mut *pool.get().await?, &id_or_name).await
        });
        self.keys_generation.fetch_add(1, Ordering::SeqCst);
        r
    }

    fn authenticate(&self, key: &str) -> Result<Option<KeyInfo>> {
        let key = own(key);
        self.pg
            .run(|pool| async move { records::authenticate(&mut *pool.get().await?, &key).await })
    }

    fn has_active_keys(&self) -> Result<bool> {
        self.pg
            .run(|pool| async move { records::has_active_keys(&mut *pool.get().await?).await })
    }

    fn find_key(&self, id_or_name: &str) -> Result<Option<KeyInfo>> {
        let id_or_name = own(id_or_name);
        self.pg.run(
            |pool| async move { records::find_key(&mut *pool.get().await?, &id_or_name).await },
        )
    }

    fn set_key_approval(
        &self,
        id: &str,
        mode: Option<crate::ApprovalMode>,
    ) -> Result<Option<KeyInfo>> {
        let id = own(id);
        let r = self.pg.run(|pool| async move {
            records::set_key_approval(&mut *pool.get().await?, &id, mode).await
        });
        self.keys_generation.fetch_add(1, Ordering::SeqCst);
        r
    }

    fn set_key_egress(&self, id: &str, bound: Option<&[String]>) -> Result<Option<KeyInfo>> {
        if let Some(b) = bound {
            validate::egress_bound(b)?;
        }
        let (id, bound) = (own(id), bound.map(<[String]>::to_vec));
        let r = self.pg.run(|pool| async move {
            records::set_key_egress(&mut *pool.get().await?, &id, bound).await
        });
        self.keys_generation.fetch_add(1, Ordering::SeqCst);
        r
    }

    fn list_tenants(&self) -> Result<Vec<TenantSettings>> {
        self.pg
            .run(|pool| async move { records::list_tenants(&mut *pool.get().await?).await })
    }

    fn update_tenant(&self, tenant: &str, change: &TenantChange) -> Result<TenantSettings> {
        let (tenant, change) = (own(tenant), change.clone());
        self.pg.run(|pool| async move {
            records::update_tenant(&mut *pool.get().await?, &tenant, &change).await
        })
    }

    fn put_session_extra(&self, session_id: &str, kind: &str, json: &str) -> Result<()> {
        validate::session_extra(session_id, kind, json)?;
        let (session_id, kind, json) = (own(session_id), own(kind), own(json));
        self.pg.run(|pool| async move {
            let mut c = pool.get().await?;
            records::put_session_extra(&mut c, &session_id, &kind, &json).await
        })
    }

    fn session_extra(&self, session_id: &str, kind: &str) -> Result<Option<String>> {
        let (session_id, kind) = (own(session_id), own(kind));
        self.pg.run(|pool| async move {
            records::session_extra(&mut *pool.get().await?, &session_id, &kind).await
        })
    }

    fn chain_heads(&self, tenant: Option<&str>) -> Result<Vec<ChainHead>> {
        if let Some(t) = tenant {
            validate::name("tenant", t)?;
        }
        let tenant = tenant.map(own);
        self.pg.run(|pool| async move {
            chain::chain_heads(&mut *pool.get().await?, tenant.as_deref()).await
        })
    }

    fn appended_count(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    fn node_id(&self) -> Option<&str> {
        self.owner.as_ref().map(|o| o.node.as_str())
    }

    fn session_node(&self, id: &str) -> Result<Option<SessionNode>> {
        let id = own(id);
        self.pg
            .run(|pool| async move { nodes::session_node(&mut *pool.get().await?, &id).await })
    }
}
