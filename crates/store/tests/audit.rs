//! The audit chain on SQLite alone: durability across SIGKILL and the in-memory store (the
//! rest runs against both backends in both.rs).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use runcell_store::Store;

/// Appends `ex_1..=ex_n` for tenant "t".
fn append_n(s: &Store, n: i64) {
    for i in 1..=n {
        let e = s
            .append_execution(&exec("t", &format!("ex_{i}"), Some("ses_1"), i))
            .expect("append");
        assert_eq!(e.seq, u64::try_from(i).expect("positive"));
        assert_eq!(e.hash.len(), 64);
    }
}

const CHILD_DB_ENV: &str = "RUNCELL_STORE_TEST_CHILD_DB";

/// Runs only as the child of `append_survives_sigkill`: appends one row, says so, then waits
/// to be killed.
#[test]
fn durability_child() {
    let Ok(path) = std::env::var(CHILD_DB_ENV) else {
        return;
    };
    let s = open(Path::new(&path));
    let e = s
        .append_execution(&exec("t", "ex_acked", None, 99))
        .expect("append");
    println!("\nAPPENDED seq={}", e.seq);
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

#[test]
fn append_survives_sigkill() {
    let db = temp_db();
    {
        let s = open(&db.path);
        append_n(&s, 2);
    }
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "durability_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB_ENV, &db.path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut acked = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read");
        if line.contains("APPENDED seq=3") {
            acked = true;
            break;
        }
    }
    // Child::kill sends SIGKILL: no destructors, no checkpoint, no close.
    child.kill().expect("kill");
    let status = child.wait().expect("wait");
    assert!(acked, "child never acknowledged the append ({status})");

    let s = open(&db.path);
    let row = s
        .get_execution("t", "ex_acked")
        .expect("get")
        .expect("acknowledged row survived");
    assert_eq!(row.seq, 3);
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 3, "{r:?}");
}

#[test]
fn in_memory_store_works_too() {
    let s = Store::open_in_memory().expect("mem");
    append_n(&s, 4);
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 4);
}
