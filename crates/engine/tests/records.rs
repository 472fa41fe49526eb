//! What an engine keeps in its store: sessions recorded when created and forgotten when they
//! end (a refused record refuses the request whole), dead sessions only the store remembers
//! found, listed, counted and expired, uploads and executions recorded, recovery at start.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use runcell_engine::testing::{engine_with_store, TestEngine};
use runcell_engine::{CreateSession, EngineError, SessionStatus};
use runcell_store::{
    AuditEntry, DomainStore, ExecutionRow, Expected, NewExecution, SessionRecord, Store,
    StoreError, TenantSettings, UploadRecord, VerifyReport,
};

fn cache() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn create(engine: &TestEngine, owner: &str) -> String {
    engine
        .sessions()
        .create(CreateSession {
            owner: owner.into(),
            metadata: [("k".to_owned(), "v".to_owned())].into(),
            ..CreateSession::default()
        })
        .expect("create")
        .id
}

#[test]
fn a_session_is_recorded_while_it_lives_with_its_uploads_and_executions() {
    let store = Store::open_in_memory().expect("store");
    let engine = engine_with_store(cache(), store.domain());
    let id = create(&engine, "acme");
    let rec = store
        .get_session("acme", &id)
        .expect("get")
        .expect("recorded when created");
    assert_eq!(rec.status, "ready");
    assert_eq!(rec.metadata_json, r#"{"k":"v"}"#);
    assert_eq!(
        Path::new(&rec.workspace_path),
        engine.workspace_path(&id),
        "the workspace it records is the one on disk"
    );
    assert!(engine.workspace_path(&id).is_dir());

    let entry = engine.upload_file(&id, "up.txt", b"hi").expect("upload");
    assert_eq!(entry.path, "up.txt");
    let ups = store.uploads(&id).expect("uploads");
    assert_eq!(ups.len(), 1, "{ups:?}");
    assert_eq!(
        ups[0].sha256,
        "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"
    );
    engine.write_file(&id, "tool.txt", b"x").expect("write");
    assert_eq!(
        store.uploads(&id).expect("uploads").len(),
        1,
        "a tool's write is no upload"
    );

    let e = engine
        .sessions()
        .execute(&id, "1 + 1", None, None)
        .expect("execute");
    let page = engine
        .executions("acme", Some(&id), 10, None)
        .expect("executions");
    assert_eq!(page.executions.len(), 1, "{:?}", page.executions);
    assert_eq!(page.executions[0]["id"], e.id.as_str());
    assert_eq!(page.executions[0]["code"], "1 + 1");
    assert!(engine.execution("acme", &e.id).expect("get").is_some());
    assert!(
        engine.execution("other", &e.id).expect("get").is_none(),
        "another tenant's execution is none"
    );
    let report = engine.verify_audit("acme").expect("verify");
    assert!(report.ok && report.checked == 1, "{report:?}");

    assert!(engine.sessions().find("acme", &id).is_some());
    assert!(
        engine.sessions().find("other", &id).is_none(),
        "another tenant's session is none"
    );
    assert_eq!(engine.sessions().list_owned("other").len(), 0);
    engine.sessions().delete(&id).expect("delete");
    assert!(
        store.get_session("acme", &id).expect("get").is_none(),
        "forgotten when deleted"
    );
    assert!(!engine.workspace_path(&id).exists());
}

/// A dead session's record as recovery leaves it, with `engine`'s default limits, expiring
/// at `expires_at`.
fn dead_record(engine: &TestEngine, id: &str, expires_at: DateTime<Utc>) -> SessionRecord {
    let now = Utc::now();
    SessionRecord {
        id: id.into(),
        tenant: "acme".into(),
        language: "python".into(),
        status: "dead".into(),
        created_at: now,
        last_active_at: now,
        expires_at,
        limits_json: serde_json::to_string(&engine.config().limits.defaults).expect("limits"),
        metadata_json: "{}".into(),
        workspace_path: "/nowhere".into(),
        start: "zygote".into(),
    }
}

#[test]
fn dead_sessions_the_store_remembers_are_found_listed_counted_and_expire() {
    let store = Store::open_in_memory().expect("store");
    let engine = engine_with_store(cache(), store.domain());
    let live = create(&engine, "acme");
    let now = Utc::now();
    let fresh = dead_record(&engine, "ses_deadfresh", now + chrono::Duration::hours(1));
    let mut old = fresh.clone();
    old.id = "ses_deadold".into();
    old.expires_at = now - chrono::Duration::seconds(1);
    store.put_session(&fresh).expect("put");
    store.put_session(&old).expect("put");

    let listed: Vec<(String, SessionStatus)> = engine
        .sessions()
        .list_owned("acme")
        .into_iter()
        .map(|s| (s.id, s.status))
        .collect();
    assert_eq!(
        listed,
        [
            (live.clone(), SessionStatus::Ready),
            ("ses_deadfresh".to_owned(), SessionStatus::Dead)
        ],
        "live first, then the dead the store remembers; the expired one is not listed"
    );
    assert!(
        store
            .get_session("acme", "ses_deadold")
            .expect("get")
            .is_none(),
        "an expired dead session is forgotten"
    );
    assert_eq!(engine.sessions().dead_count(), 1);
    let found = engine
        .sessions()
        .find("acme", "ses_deadfresh")
        .expect("found");
    assert_eq!(found.status, SessionStatus::Dead);
    assert!(engine.sessions().find("other", "ses_deadfresh").is_none());

    // Deleting it forgets it: it was the store's alone.
    engine.sessions().delete("ses_deadfresh").expect("delete");
    assert_eq!(engine.sessions().dead_count(), 0);
    assert!(matches!(
        engine.sessions().delete("ses_deadfresh"),
        Err(EngineError::NotFound(_))
    ));
}

#[test]
fn recovery_marks_a_session_without_its_workspace_dead() {
    let store = Store::open_in_memory().expect("store");
    let engine = engine_with_store(cache(), store.domain());
    let mut gone = dead_record(&engine, "ses_gone", Utc::now() + chrono::Duration::hours(1));
    gone.status = "ready".into();
    let mut bad = gone.clone();
    bad.id = "ses_badlimits".into();
    bad.limits_json = "{}".into();
    store.put_session(&gone).expect("put");
    store.put_session(&bad).expect("put");
    assert_eq!(
        engine.sessions().recover_previous().expect("recover"),
        (0, 2)
    );
    for id in ["ses_gone", "ses_badlimits"] {
        let rec = store.get_session("acme", id).expect("get").expect("kept");
        assert_eq!(rec.status, "dead", "{id}");
    }
    assert_eq!(engine.sessions().dead_count(), 2);
    // Nothing of them is live: a second start finds nothing to recover.
    assert_eq!(engine.sessions().recover_previous().expect("again"), (0, 0));
}

#[test]
fn an_audited_engine_records_executions_and_no_session() {
    let store = Store::open_in_memory().expect("store");
    let config = runcell_engine::testing::engine_config(cache());
    let engine =
        TestEngine(runcell_engine::Engine::audited(config, store.domain()).expect("engine"));
    let id = create(&engine, "acme");
    engine
        .sessions()
        .execute(&id, "1", None, None)
        .expect("execute");
    assert!(store.get_session("acme", &id).expect("get").is_none());
    engine.upload_file(&id, "a.txt", b"a").expect("upload");
    let page = engine.executions("acme", None, 10, None).expect("list");
    assert_eq!(page.executions.len(), 1);
    assert_eq!(
        engine.sessions().recover_previous().expect("recover"),
        (0, 0)
    );
}

/// A store whose session writes can be refused, over a real one.
#[derive(Debug)]
struct Refusing {
    inner: Arc<dyn DomainStore>,
    refuse: AtomicBool,
}

impl Refusing {
    fn check(&self) -> runcell_store::Result<()> {
        match self.refuse.load(Ordering::SeqCst) {
            true => Err(StoreError::Unsupported("refused by the test".into())),
            false => Ok(()),
        }
    }
}

impl DomainStore for Refusing {
    fn tenant_settings(&self, tenant: &str) -> runcell_store::Result<TenantSettings> {
        self.inner.tenant_settings(tenant)
    }
    fn put_session(&self, session: &SessionRecord) -> runcell_store::Result<()> {
        self.check()?;
        self.inner.put_session(session)
    }
    fn update_session_status(
        &self,
        id: &str,
        status: &str,
        last_active_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> runcell_store::Result<bool> {
        self.inner
            .update_session_status(id, status, last_active_at, expires_at)
    }
    fn get_session(&self, tenant: &str, id: &str) -> runcell_store::Result<Option<SessionRecord>> {
        self.inner.get_session(tenant, id)
    }
    fn list_sessions(&self, tenant: &str) -> runcell_store::Result<Vec<SessionRecord>> {
        self.inner.list_sessions(tenant)
    }
    fn delete_session(&self, id: &str) -> runcell_store::Result<bool> {
        self.check()?;
        self.inner.delete_session(id)
    }
    fn sessions_with_status(&self, statuses: &[&str]) -> runcell_store::Result<Vec<SessionRecord>> {
        self.inner.sessions_with_status(statuses)
    }
    fn record_upload(
        &self,
        session_id: &str,
        path: &str,
        size: u64,
        sha256_hex: &str,
        at: DateTime<Utc>,
    ) -> runcell_store::Result<()> {
        self.inner
            .record_upload(session_id, path, size, sha256_hex, at)
    }
    fn uploads(&self, session_id: &str) -> runcell_store::Result<Vec<UploadRecord>> {
        self.inner.uploads(session_id)
    }
    fn append_execution(&self, rec: &NewExecution) -> runcell_store::Result<AuditEntry> {
        self.inner.append_execution(rec)
    }
    fn list_executions(
        &self,
        tenant: &str,
        session_id: Option<&str>,
        limit: usize,
        before: Option<&str>,
    ) -> runcell_store::Result<(Vec<ExecutionRow>, Option<String>)> {
        self.inner
            .list_executions(tenant, session_id, limit, before)
    }
    fn get_execution(&self, tenant: &str, id: &str) -> runcell_store::Result<Option<ExecutionRow>> {
        self.inner.get_execution(tenant, id)
    }
    fn verify_extends(
        &self,
        tenant: Option<&str>,
        expected: &[Expected],
    ) -> runcell_store::Result<VerifyReport> {
        self.inner.verify_extends(tenant, expected)
    }
}

#[test]
fn a_record_the_store_refuses_refuses_the_create_and_the_delete() {
    let store = Store::open_in_memory().expect("store");
    let refusing = Arc::new(Refusing {
        inner: store.domain(),
        refuse: AtomicBool::new(true),
    });
    let engine = engine_with_store(cache(), refusing.clone());
    let err = engine
        .sessions()
        .create(CreateSession::default())
        .expect_err("refused");
    assert!(
        matches!(err, EngineError::Store(StoreError::Unsupported(_))),
        "{err:?}"
    );
    assert!(
        engine.sessions().list().is_empty(),
        "a session the store does not know is ended at once"
    );
    let left: Vec<_> = std::fs::read_dir(engine.config().workspaces_dir())
        .expect("workspaces")
        .collect();
    assert!(left.is_empty(), "its workspace is gone: {left:?}");

    refusing.refuse.store(false, Ordering::SeqCst);
    let id = create(&engine, "acme");
    refusing.refuse.store(true, Ordering::SeqCst);
    assert!(engine.sessions().delete(&id).is_err());
    assert!(
        engine.sessions().get(&id).is_ok(),
        "a delete the store refuses changes nothing"
    );
    assert!(store.get_session("acme", &id).expect("get").is_some());
    // A connection's teardown ends it all the same; its record stays behind.
    engine.sessions().close(&id).expect("close");
    assert!(engine.sessions().get(&id).is_err());
    assert!(!engine.workspace_path(&id).exists());
    assert!(store.get_session("acme", &id).expect("get").is_some());
}
