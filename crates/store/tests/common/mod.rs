//! Helpers shared by the integration tests.
#![allow(dead_code)]

mod db;
mod pg;

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use db::*;
#[allow(unused_imports)]
pub use pg::*;

use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, TimeZone, Utc};
use runcell_store::{NewExecution, SessionRecord, Store};

pub fn t0() -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000, 123_456_789)
        .single()
        .expect("valid timestamp")
}

pub fn at(secs: i64) -> DateTime<Utc> {
    t0() + Duration::seconds(secs)
}

pub fn exec(tenant: &str, id: &str, session: Option<&str>, n: i64) -> NewExecution {
    NewExecution {
        tenant: tenant.into(),
        execution_id: id.into(),
        session_id: session.map(Into::into),
        status: "ok".into(),
        code: format!("print({n})"),
        execution_json: format!(r#"{{"id":"{id}","stdout":"{n}\n"}}"#),
        created_at: at(n),
    }
}

pub fn session(tenant: &str, id: &str, created: i64) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        tenant: tenant.into(),
        language: "python".into(),
        status: "ready".into(),
        created_at: at(created),
        last_active_at: at(created),
        expires_at: at(created + 900),
        limits_json: r#"{"memory_mb":512}"#.into(),
        metadata_json: r#"{"owner":"me"}"#.into(),
        workspace_path: format!("/var/lib/runcell/ws/{id}"),
        start: "zygote".into(),
    }
}

pub struct TempDb {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub fn temp_db() -> TempDb {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data").join("runcell.db");
    TempDb { _dir: dir, path }
}

pub fn open(path: &Path) -> Store {
    Store::open(path).expect("open store")
}

/// Every byte of the database and its WAL.
pub fn db_bytes(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(b) = std::fs::read(PathBuf::from(p)) {
            out.extend(b);
        }
    }
    out
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The chain key of the database at `path` (in `keys/` beside it), as a thief would read it.
pub fn stolen_chain_key(path: &Path) -> runcell_store::audit::ChainKey {
    let file = runcell_store::audit::keys::default_dir(path)
        .join(runcell_store::audit::keys::CHAIN_KEY_FILE);
    runcell_store::audit::ChainKey::read(&file).expect("chain key")
}
