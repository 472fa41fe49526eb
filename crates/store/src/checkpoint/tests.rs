//! The checkpointer under a real store: the WAL stays bounded under a steady stream of
//! appends, and a `kill -9` while checkpoints run loses no acknowledged append.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use chrono::Utc;

use super::*;
use crate::sqlite::SqliteStore;
use crate::{DomainStore, Durability, NewExecution};

/// Small enough that a test's appends pass both limits many times over.
const TEST_LIMITS: WalLimits = WalLimits {
    checkpoint_pages: 64,
    restart_pages: 256,
};

fn exec(tenant: &str, id: &str) -> NewExecution {
    NewExecution {
        tenant: tenant.into(),
        execution_id: id.into(),
        session_id: Some("ses_test".into()),
        status: "ok".into(),
        code: "1+1".into(),
        execution_json: format!(r#"{{"id":"{id}","results":[{{"text/plain":"2"}}]}}"#),
        created_at: Utc::now(),
    }
}

fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    p.into()
}

#[test]
fn the_wal_stays_bounded_under_a_steady_stream_of_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("runcell.db");
    let store =
        Arc::new(SqliteStore::open_tuned(&path, Durability::Process, TEST_LIMITS).expect("open"));
    // Four appenders with no pause between appends: a passive checkpoint never finds the
    // log quiet, so only the commits' catch-up lets it start over. Without it the log
    // ends at about 50 000 frames.
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..3000 {
                    store
                        .append_execution(&exec(&format!("t{t}"), &format!("ex_{t}_{i}")))
                        .expect("append");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("appender");
    }
    // The file keeps the length of the longest log it held (SQLite overwrites it from the
    // start, it does not truncate it).
    let frame = 4096 + 24;
    let frames = std::fs::metadata(wal_path(&path)).expect("wal").len() / frame;
    // The commit that passes the limit finishes the checkpoint (waiting for a pass of the
    // thread if one runs), so the log ends at most one batch's frames past it.
    let bound = 2 * TEST_LIMITS.restart_pages as u64;
    assert!(
        frames <= bound,
        "the WAL grew to {frames} frames (bound {bound})"
    );
    assert_eq!(store.verify_chain(None).expect("verify").checked, 12000);
}

/// Env var naming the database the helper process appends to.
const CHILD_DB: &str = "RUNCELL_STORE_TEST_CHILD_DB";

#[test]
#[ignore = "the helper process of kill_9_after_acknowledged_appends_loses_nothing"]
fn append_until_killed() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return;
    };
    let store = Arc::new(
        SqliteStore::open_tuned(Path::new(&path), Durability::Process, TEST_LIMITS).expect("open"),
    );
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0.. {
                    let (tenant, id) = (format!("t{t}"), format!("ex_{t}_{i}"));
                    let entry = store.append_execution(&exec(&tenant, &id)).expect("append");
                    // One write per line, so lines of different threads do not mix.
                    let line = format!("acked {tenant} {id} {}\n", entry.seq);
                    std::io::stdout()
                        .write_all(line.as_bytes())
                        .expect("stdout");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("appender");
    }
}

#[test]
fn kill_9_after_acknowledged_appends_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("runcell.db");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "checkpoint::tests::append_until_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the appender");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut acked = Vec::new();
    // Enough appends for checkpoints of both kinds to have run, and probably to be running
    // when the kill comes.
    while acked.len() < 3000 {
        let line = lines
            .next()
            .expect("the appender stopped early")
            .expect("line");
        if let Some(rest) = line.strip_prefix("acked ") {
            acked.push(rest.to_owned());
        }
    }
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    // What was printed before the kill was acknowledged too.
    acked.extend(
        lines
            .map_while(std::result::Result::ok)
            .filter_map(|l| l.strip_prefix("acked ").map(str::to_owned)),
    );

    let store = SqliteStore::open(&path).expect("reopen");
    for a in &acked {
        let [tenant, id, seq] = a.split(' ').collect::<Vec<_>>()[..] else {
            panic!("malformed line {a:?}");
        };
        let row = store
            .get_execution(tenant, id)
            .expect("get")
            .unwrap_or_else(|| panic!("acknowledged execution {id} is lost"));
        assert_eq!(row.seq.to_string(), seq, "{id}");
    }
    let report = store.verify_chain(None).expect("verify");
    assert!(report.ok, "{report:?}");
    assert!(report.checked >= acked.len() as u64);
}
