//! A kernel beside a session on its workspace (`SessionManager::create_sibling`, E2B's code
//! contexts) and a lifetime set while a session lives (`set_idle_timeout`, E2B's timeout).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use runcell_engine::{EngineError, Language};

fn run(engine: &runcell_engine::Engine, id: &str, code: &str) -> runcell_engine::Execution {
    engine
        .sessions()
        .execute(id, code, None, None)
        .expect("execute")
}

#[test]
fn a_sibling_kernel_shares_the_files_not_the_variables_and_keeps_them_after_the_parent() {
    let engine = common::engine();
    let parent = common::create(&engine);
    let mut env = BTreeMap::new();
    env.insert("SIBLING_VAR".to_owned(), "yes".to_owned());
    let sibling = engine
        .sessions()
        .create_sibling(&parent, Language::Python, env, BTreeMap::new())
        .expect("sibling");
    assert_ne!(sibling.id, parent);
    assert_eq!(
        sibling.owner,
        engine.sessions().get(&parent).expect("parent").owner
    );
    run(
        &engine,
        &parent,
        "v = 'parent'\nopen('shared.txt', 'w').write('from the parent')",
    );
    let ex = run(&engine, &sibling.id, "open('shared.txt').read()");
    assert_eq!(common::main_text(&ex), "'from the parent'");
    let ex = run(&engine, &sibling.id, "v");
    assert_eq!(ex.error.map(|e| e.name).as_deref(), Some("NameError"));
    let ex = run(&engine, &sibling.id, "import os; os.environ['SIBLING_VAR']");
    assert_eq!(common::main_text(&ex), "'yes'");
    // A bash kernel on the same files.
    let bash = engine
        .sessions()
        .create_sibling(&parent, Language::Bash, BTreeMap::new(), BTreeMap::new())
        .expect("bash sibling");
    assert_eq!(
        run(&engine, &bash.id, "cat shared.txt").stdout,
        "from the parent"
    );
    // The parent gone, the sibling still has the workspace (it ends when both are gone).
    engine.sessions().delete(&parent).expect("delete parent");
    let ex = run(&engine, &sibling.id, "open('shared.txt').read()");
    assert_eq!(common::main_text(&ex), "'from the parent'");
    engine
        .sessions()
        .delete(&sibling.id)
        .expect("delete sibling");
    engine
        .sessions()
        .delete(&bash.id)
        .expect("delete bash sibling");
    assert!(matches!(
        engine.sessions().create_sibling(
            &parent,
            Language::Python,
            BTreeMap::new(),
            BTreeMap::new()
        ),
        Err(EngineError::NotFound(_))
    ));
}

#[test]
fn an_idle_timeout_set_later_counts_from_then_within_the_servers_maximum() {
    let engine = common::engine();
    let id = common::create(&engine);
    let before = chrono::Utc::now();
    let info = engine
        .sessions()
        .set_idle_timeout(&id, Duration::from_secs(90))
        .expect("set");
    assert_eq!(info.limits.idle_timeout_s, 90);
    let left = (info.expires_at - before).num_seconds();
    assert!((89..=91).contains(&left), "{left}");
    let max = engine.config().limits.max.idle_timeout_s;
    let info = engine
        .sessions()
        .set_idle_timeout(&id, Duration::from_secs(max + 1000))
        .expect("set");
    assert_eq!(info.limits.idle_timeout_s, max);
    assert_eq!(
        engine
            .sessions()
            .get(&id)
            .expect("get")
            .limits
            .idle_timeout_s,
        max
    );
}

#[test]
fn a_watched_command_streams_takes_variables_and_can_be_ended() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let engine = common::engine();
    let id = common::create(&engine);
    let mut env = BTreeMap::new();
    env.insert("GREETING".to_owned(), "hi".to_owned());
    let mut chunks = Vec::new();
    let out = engine
        .run_watched(
            &id,
            &runcell_engine::WatchedCommand {
                command: "echo $GREETING; echo oops >&2; exit 3".into(),
                env,
                ..Default::default()
            },
            &mut |stream, data| chunks.push((stream, String::from_utf8_lossy(data).into_owned())),
        )
        .expect("run");
    assert_eq!((out.stdout.as_str(), out.exit_code), ("hi\n", 3));
    assert!(
        chunks.contains(&(runcell_engine::Stream::Stdout, "hi\n".to_owned())),
        "{chunks:?}"
    );
    assert!(
        chunks.contains(&(runcell_engine::Stream::Stderr, "oops\n".to_owned())),
        "{chunks:?}"
    );
    // Ended from elsewhere: killed, well before its own end.
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        flag.store(true, Ordering::SeqCst);
    });
    let started = std::time::Instant::now();
    let out = engine
        .run_watched(
            &id,
            &runcell_engine::WatchedCommand {
                command: "sleep 30".into(),
                cancel: Some(cancel),
                ..Default::default()
            },
            &mut |_, _| {},
        )
        .expect("run");
    stopper.join().expect("stopper");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(out.usage.killed_by.is_some(), "{out:?}");
    assert_ne!(out.exit_code, 0);
}
