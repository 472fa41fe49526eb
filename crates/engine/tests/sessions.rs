//! Stateful Python sessions through the engine: the acceptance cases, the deadline / memory /
//! crash / restart paths, files, and the hostile probes from inside a session.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::main_text;
use runcell_engine::{
    CreateSession, EngineError, Execution, ExecutionStatus, KilledBy, LimitsRequest,
};
use serde_json::Value;

fn create(engine: &runcell_engine::Engine, limits: LimitsRequest) -> String {
    engine
        .sessions()
        .create(CreateSession {
            limits,
            ..CreateSession::default()
        })
        .expect("create session")
        .id
}

fn exec(engine: &runcell_engine::Engine, id: &str, code: &str) -> Execution {
    engine
        .sessions()
        .execute(id, code, None, None)
        .expect("execute")
}

#[test]
fn acceptance_cases_pass_through_the_engine() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/acceptance");
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cases.json")).expect("shared/acceptance/cases.json"),
    )
    .expect("cases json");
    let engine = common::engine();
    let mut failures = Vec::new();
    for case in cases.as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let id = create(&engine, LimitsRequest::default());
        for f in case["upload"].as_array().into_iter().flatten() {
            let f = f.as_str().expect("file");
            let data = std::fs::read(dir.join("files").join(f)).expect("upload file");
            engine.write_file(&id, f, &data).expect("upload");
        }
        for (i, cell) in case["cells"].as_array().expect("cells").iter().enumerate() {
            let e = exec(&engine, &id, cell["code"].as_str().expect("code"));
            let mut fail = |what: String| failures.push(format!("{name} cell {i}: {what}"));
            let want_status = cell["status"].as_str().unwrap_or("ok");
            let got_status = serde_json::to_value(e.status).expect("status");
            if got_status != want_status {
                fail(format!(
                    "status {got_status} != {want_status}: {:?} {}",
                    e.error, e.stderr
                ));
            }
            for s in cell["stdout_contains"].as_array().into_iter().flatten() {
                let s = s.as_str().expect("str");
                if !e.stdout.contains(s) {
                    fail(format!("stdout lacks {s:?}: {:?}", e.stdout));
                }
            }
            for s in cell["main_result_contains"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let s = s.as_str().expect("str");
                if !main_text(&e).contains(s) {
                    fail(format!("main result lacks {s:?}: {:?}", e.results));
                }
            }
            if cell["has_png"].as_bool() == Some(true) {
                let png = e.results.iter().find_map(|r| r.data.get("image/png"));
                let ok = png
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .is_some_and(|bytes| bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
                if !ok {
                    fail("no decodable image/png result".into());
                }
            }
            if cell["has_html"].as_bool() == Some(true)
                && !e.results.iter().any(|r| r.data.contains_key("text/html"))
            {
                fail("no text/html result".into());
            }
            if let Some(n) = cell["error_name"].as_str() {
                if e.error.as_ref().map(|x| x.name.as_str()) != Some(n) {
                    fail(format!("error {:?} != {n}", e.error));
                }
            }
            for f in cell["files"].as_array().into_iter().flatten() {
                let f = f.as_str().expect("str");
                if !e.files.iter().any(|x| x.path == f) {
                    fail(format!("files lack {f}: {:?}", e.files));
                }
            }
        }
        engine.sessions().delete(&id).expect("delete");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn state_counts_tracebacks_and_results_behave_like_jupyter() {
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    let a = exec(&engine, &id, "x = 41");
    assert!(a.results.is_empty());
    let b = exec(&engine, &id, "print('side'); x + 1");
    assert_eq!(
        (b.stdout.as_str(), main_text(&b).as_str()),
        ("side\n", "42")
    );
    assert_eq!((a.execution_count, b.execution_count), (1, 2));
    let c = exec(&engine, &id, "def f():\n    return 1 / 0\nf()");
    assert_eq!(c.status, ExecutionStatus::Error);
    let err = c.error.expect("error");
    assert_eq!(err.name, "ZeroDivisionError");
    assert!(err.traceback.contains("<cell-3>") && err.traceback.contains("return 1 / 0"));
    assert!(
        !err.traceback.contains("runcell_kernel"),
        "{}",
        err.traceback
    );
    let d = exec(
        &engine,
        &id,
        "import os; os.system('echo from a subprocess'); x",
    );
    assert_eq!(d.stdout, "from a subprocess\n");
    assert_eq!(main_text(&d), "41");
}

/// A cell's CPU is its own: counted from its start, whatever the session used before.
#[test]
fn cpu_usage_is_per_cell() {
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    let spin =
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4:\n    pass";
    let busy = exec(&engine, &id, spin);
    assert_eq!(busy.status, ExecutionStatus::Ok, "{busy:?}");
    assert!((300..2000).contains(&busy.usage.cpu_ms), "{:?}", busy.usage);
    // After 400 ms of CPU in the session, a sleeping cell reports almost none.
    let idle = exec(&engine, &id, "import time\ntime.sleep(0.3)");
    assert!(idle.usage.cpu_ms < 100, "{:?}", idle.usage);
    assert!(idle.usage.peak_memory_bytes > 0, "{:?}", idle.usage);
}

#[test]
fn a_deadline_interrupts_and_keeps_state() {
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    exec(&engine, &id, "x = 'kept'");
    let started = Instant::now();
    let e = engine
        .sessions()
        .execute(
            &id,
            "import time\ntime.sleep(60)",
            Some(Duration::from_secs(1)),
            None,
        )
        .expect("execute");
    assert_eq!(e.status, ExecutionStatus::Timeout, "{e:?}");
    assert_eq!(e.usage.killed_by, None);
    assert_eq!(
        e.error.as_ref().map(|x| x.name.as_str()),
        Some("TimeoutError")
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(main_text(&exec(&engine, &id, "x")), "'kept'");
}

#[test]
fn a_cell_that_ignores_the_interrupt_is_killed_and_the_session_restarts() {
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    exec(&engine, &id, "x = 1");
    let stubborn = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass";
    let e = engine
        .sessions()
        .execute(&id, stubborn, Some(Duration::from_secs(1)), None)
        .expect("execute");
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    assert_eq!(e.usage.killed_by, Some(KilledBy::Timeout));
    let err = e.error.expect("error");
    assert!(
        err.value.contains("The session was restarted"),
        "{}",
        err.value
    );
    // A clean kernel: the old variable is gone, the session works.
    let next = exec(&engine, &id, "x");
    assert_eq!(next.error.map(|x| x.name), Some("NameError".into()));
    assert_eq!(main_text(&exec(&engine, &id, "2 + 2")), "4");
}

#[test]
fn out_of_memory_and_crashes_are_reported_and_the_next_cell_runs() {
    let engine = common::engine();
    let id = create(
        &engine,
        LimitsRequest {
            memory_mb: Some(256),
            ..LimitsRequest::default()
        },
    );
    let e = exec(&engine, &id, "b = bytearray(600 * 1024 * 1024)");
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    assert_eq!(e.usage.killed_by, Some(KilledBy::Oom));
    assert_eq!(e.error.map(|x| x.name), Some("MemoryError".into()));
    assert_eq!(main_text(&exec(&engine, &id, "'alive'")), "'alive'");

    let e = exec(&engine, &id, "import ctypes\nctypes.string_at(0)");
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    assert_eq!(e.usage.killed_by, Some(KilledBy::Signal));
    assert_eq!(e.error.map(|x| x.name), Some("KernelDied".into()));
    assert_eq!(
        main_text(&exec(&engine, &id, "'alive again'")),
        "'alive again'"
    );
}

#[test]
fn numpy_random_numbers_differ_between_sessions() {
    let engine = common::engine();
    let code = "import numpy as np\nnp.random.rand()";
    let a = create(&engine, LimitsRequest::default());
    let b = create(&engine, LimitsRequest::default());
    let (x, y) = (
        main_text(&exec(&engine, &a, code)),
        main_text(&exec(&engine, &b, code)),
    );
    assert!(!x.is_empty() && x != y, "{x} vs {y}");
}

#[test]
fn interrupt_and_fifo_order() {
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    exec(&engine, &id, "log = []");
    let e2 = engine.clone();
    let id2 = id.clone();
    let slow = std::thread::spawn(move || {
        e2.sessions()
            .execute(
                &id2,
                "import time\nlog.append('first')\ntime.sleep(30)",
                None,
                None,
            )
            .expect("slow")
    });
    std::thread::sleep(Duration::from_millis(300));
    let e3 = engine.clone();
    let id3 = id.clone();
    let queued = std::thread::spawn(move || {
        e3.sessions()
            .execute(&id3, "log.append('second'); log", None, None)
            .expect("queued")
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(engine.sessions().interrupt(&id).expect("interrupt"));
    let slow = slow.join().expect("join");
    assert_eq!(slow.status, ExecutionStatus::Interrupted, "{slow:?}");
    assert_eq!(slow.error.map(|x| x.name), Some("KeyboardInterrupt".into()));
    let queued = queued.join().expect("join");
    assert_eq!(main_text(&queued), "['first', 'second']");
}

#[test]
fn files_upload_list_download_delete_and_path_attacks() {
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    engine
        .write_file(&id, "data/in.csv", b"a,b\n1,2\n")
        .expect("upload");
    let e = exec(
        &engine,
        &id,
        "import pandas as pd\ndf = pd.read_csv('data/in.csv')\ndf.to_csv('out.csv', index=False)\nimport os\nos.symlink('/etc/passwd', 'link')\nos.symlink('/', 'rootlink')\nint(df.b.sum())",
    );
    assert_eq!(main_text(&e), "2", "{e:?}");
    let paths: Vec<String> = engine
        .list_files(&id, "")
        .expect("list")
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert_eq!(paths, ["data/in.csv", "out.csv"]);
    assert_eq!(
        engine.read_file(&id, "out.csv").expect("download"),
        b"a,b\n1,2\n"
    );
    for bad in ["/etc/passwd", "../x", "a/../../x", "a\0b", ""] {
        assert!(
            matches!(
                engine.read_file(&id, bad),
                Err(EngineError::InvalidRequest(_))
            ),
            "{bad:?}"
        );
    }
    // Planted symlinks are never followed, for files or directories.
    assert!(engine.read_file(&id, "link").is_err());
    assert!(engine.read_file(&id, "rootlink/etc/passwd").is_err());
    assert!(engine.write_file(&id, "rootlink/tmp/x", b"x").is_err());
    assert!(engine.list_files(&id, "rootlink").is_err());
    engine.delete_file(&id, "out.csv").expect("delete");
    assert!(matches!(
        engine.read_file(&id, "out.csv"),
        Err(EngineError::NotFound(_))
    ));
    // The symlink itself can be deleted; its target is untouched.
    engine.delete_file(&id, "link").expect("delete link");
    assert!(std::path::Path::new("/etc/passwd").exists());
}

#[test]
fn the_workspace_cap_is_enospc_and_idle_sessions_expire() {
    let engine = common::engine();
    let id = create(
        &engine,
        LimitsRequest {
            disk_mb: Some(8),
            idle_timeout_s: Some(1),
            ..LimitsRequest::default()
        },
    );
    let e = exec(
        &engine,
        &id,
        "try:\n    open('big', 'wb').write(b'x' * (16 << 20))\nexcept OSError as e:\n    print(e.errno)",
    );
    assert_eq!(e.stdout, "28\n", "ENOSPC at the cap: {e:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.sessions().get(&id).is_ok() {
        assert!(Instant::now() < deadline, "the idle session did not expire");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn hostile_probes_fail_inside_a_session_too() {
    const PROBES: &str = include_str!("../../cli/tests/fixtures/probes.py");
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    exec(
        &engine,
        &id,
        &PROBES.replace("if __name__ == \"__main__\":\n    main()", ""),
    );
    let table: Vec<(&str, Vec<&str>, &str)> = vec![
        ("unshare_user", vec![], "errno:EPERM"),
        ("mount", vec!["/nonexistent"], "errno:EPERM"),
        ("clone3", vec![], "errno:ENOSYS"),
        ("ptrace_traceme", vec![], "errno:EPERM"),
        ("bpf", vec![], "errno:EPERM"),
        ("socket", vec!["netlink", "dgram"], "errno:EPERM"),
        ("read", vec!["/etc/shadow"], "errno:ENOENT"),
        ("write", vec!["/usr/x"], "errno:EROFS"),
        ("write", vec!["/opt/runcell/python/x"], "errno:EROFS"),
        (
            "tcp_connect",
            vec!["169.254.169.254", "80"],
            "errno:ENETUNREACH",
        ),
        ("socket", vec!["inet", "stream"], "ok"),
    ];
    for (name, args, want) in table {
        let code = format!("probe({name:?}, {args:?})[0]");
        let got = main_text(&exec(&engine, &id, &code));
        assert_eq!(
            got,
            format!("{want:?}").replace('"', "'"),
            "{name} {args:?}"
        );
    }
    let status = exec(&engine, &id, "probe('proc_status', [])[1]");
    let text = main_text(&status);
    for want in [
        "'CapEff': '0000000000000000'",
        "'NoNewPrivs': '1'",
        "'Seccomp': '2'",
    ] {
        assert!(text.contains(want), "{text}");
    }
}

#[test]
fn deleting_a_session_leaves_no_mount_process_or_directory() {
    let engine = common::engine();
    let id = create(&engine, LimitsRequest::default());
    exec(&engine, &id, "open('f', 'w').write('x')");
    let ws = engine.workspace_path(&id);
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .contains(ws.to_str().expect("utf8"))
    };
    assert!(mounted() && ws.exists());
    engine.sessions().delete(&id).expect("delete");
    // delete returns once the kernel's sandbox and the workspace are gone.
    assert!(!mounted(), "the workspace is still mounted");
    assert!(!ws.exists(), "the workspace directory is still there");
    assert!(matches!(
        engine.sessions().get(&id),
        Err(EngineError::NotFound(_))
    ));
}

fn create_lang(engine: &runcell_engine::Engine, language: runcell_engine::Language) -> String {
    engine
        .sessions()
        .create(CreateSession {
            language: Some(language),
            ..CreateSession::default()
        })
        .expect("create session")
        .id
}

#[test]
fn bash_sessions_keep_cwd_variables_and_functions() {
    let engine = common::engine();
    let id = create_lang(&engine, runcell_engine::Language::Bash);
    exec(
        &engine,
        &id,
        "mkdir -p sub && cd sub\nGREETING=hello\ngreet() { echo \"$GREETING $1\"; }",
    );
    let e = exec(&engine, &id, "pwd; greet world; echo oops >&2");
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    assert_eq!(e.stdout, "/workspace/sub\nhello world\n");
    assert_eq!(e.stderr, "oops\n");
    assert_eq!(e.language, runcell_engine::Language::Bash);
    let e = exec(&engine, &id, "echo before; false");
    assert_eq!(e.status, ExecutionStatus::Error);
    let err = e.error.expect("error");
    assert_eq!((err.name.as_str(), err.value.as_str()), ("ExitCode", "1"));
    assert_eq!(e.stdout, "before\n");
    // `exit` does not end the session.
    let e = exec(&engine, &id, "exit 3");
    assert_eq!(
        e.error.map(|x| (x.name, x.value)),
        Some(("ExitCode".into(), "3".into()))
    );
    assert_eq!(exec(&engine, &id, "pwd").stdout, "/workspace/sub\n");
    // The deadline interrupts the running command and keeps the shell.
    let e = engine
        .sessions()
        .execute(&id, "sleep 30", Some(Duration::from_secs(1)), None)
        .expect("execute");
    assert_eq!(e.status, ExecutionStatus::Timeout, "{e:?}");
    assert_eq!(exec(&engine, &id, "greet again").stdout, "hello again\n");
}

#[test]
fn javascript_sessions_keep_declarations_and_await_at_top_level() {
    let engine = common::engine();
    let id = create_lang(&engine, runcell_engine::Language::Javascript);
    exec(&engine, &id, "let count = 41;\nfunction inc(n) { return n + 1; }\nclass Box { constructor(v) { this.v = v } }");
    let e = exec(
        &engine,
        &id,
        "const got = await new Promise(r => setTimeout(() => r(inc(count)), 50));\nnew Box(got).v",
    );
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    assert_eq!(main_text(&e), "42");
    assert_eq!(main_text(&exec(&engine, &id, "got + 1")), "43");
    let e = exec(
        &engine,
        &id,
        "console.log('printed first'); console.error('to stderr'); undefined.x",
    );
    assert_eq!(e.status, ExecutionStatus::Error);
    assert_eq!(e.stdout, "printed first\n");
    assert_eq!(e.stderr, "to stderr\n");
    let err = e.error.expect("error");
    assert_eq!(err.name, "TypeError");
    assert!(
        !err.traceback.contains("runcell_js_kernel"),
        "{}",
        err.traceback
    );
    assert_eq!(e.language, runcell_engine::Language::Javascript);
}

#[test]
fn bash_and_javascript_sessions_are_confined_too() {
    let engine = common::engine();
    let sh = create_lang(&engine, runcell_engine::Language::Bash);
    let programs = runcell_sandbox::seccomp::build().expect("filter").len();
    let filters = format!("Seccomp_filters: 1\nSeccomp_filters: {programs}");
    for (cmd, want) in [
        ("cat /etc/shadow 2>&1; true", "No such file or directory"),
        ("unshare -U true 2>&1; true", "Operation not permitted"),
        ("mount -t tmpfs none /tmp 2>&1; true", "must be superuser"),
        ("touch /usr/x 2>&1; true", "Read-only file system"),
        ("id -u; hostname", "1000\nruncell"),
        (
            "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t' ' '",
            "CapEff: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2",
        ),
        // Pid 1 under its own one-program filter, the program (grep) under the program's.
        (
            "grep -h Seccomp_filters /proc/1/status /proc/self/status | tr -s '\\t' ' '",
            filters.as_str(),
        ),
    ] {
        let e = exec(&engine, &sh, cmd);
        assert!(e.stdout.contains(want), "{cmd}: {:?}", e.stdout);
    }
    let js = create_lang(&engine, runcell_engine::Language::Javascript);
    for (code, want) in [
        ("try { require('fs').readFileSync('/etc/shadow') } catch (e) { e.code }", "'ENOENT'"),
        ("try { require('fs').writeFileSync('/usr/x', 'x') } catch (e) { e.code }", "'EROFS'"),
        ("process.getuid()", "1000"),
        ("require('os').hostname()", "'runcell'"),
        ("await new Promise(r => require('net').connect(80, '169.254.169.254').on('error', e => r(e.code)))", "'ENETUNREACH'"),
    ] {
        let e = exec(&engine, &js, code);
        assert_eq!(main_text(&e), want, "{code}: {e:?}");
    }
}

/// The processes of the host whose real uid is `uid` (a session's host uid: its sandbox's).
fn pids_of_uid(uid: u32) -> Vec<String> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{name}/status")).unwrap_or_default();
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next().map(str::to_owned));
        if real == Some(uid.to_string()) {
            pids.push(name);
        }
    }
    pids
}

fn parent_of(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1).map(str::to_owned)
}

/// A bash session's sandbox is cold (an exec'd helper; bash has no zygote), and its helper runs
/// in the engine's own copy of the host's mount namespace, without the workspaces: not the
/// host's, and with none of the mounts under the workspaces' directory (there, the session's
/// own and another live session's), while the host has both mounted (the positive control).
#[test]
fn a_cold_sessions_helper_runs_in_a_mount_namespace_without_the_workspaces() {
    use std::os::unix::fs::MetadataExt;
    let engine = common::engine();
    let other = create_lang(&engine, runcell_engine::Language::Bash);
    let id = create_lang(&engine, runcell_engine::Language::Bash);
    let e = exec(&engine, &id, "echo here > mine.txt; cat mine.txt");
    assert_eq!(e.stdout, "here\n", "{e:?}");
    let workspaces = std::fs::canonicalize(engine.config().workspaces_dir()).expect("dir");
    let mount_points = |pid: &str| -> Vec<std::path::PathBuf> {
        common::mount_points(pid)
            .into_iter()
            .filter(|p| p.starts_with(&workspaces) && *p != workspaces)
            .collect()
    };
    let host = mount_points("self");
    for s in [&id, &other] {
        assert!(
            host.contains(&workspaces.join(s)),
            "{s} on the host: {host:?}"
        );
    }
    // The sandbox's processes run as the workspace's owner; the helper is pid 1's parent.
    let uid = std::fs::metadata(engine.workspace_path(&id))
        .expect("workspace")
        .uid();
    let helper = pids_of_uid(uid)
        .iter()
        .filter_map(|p| parent_of(p))
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .split(|&b| b == 0)
                .any(|a| a == b"__sandbox-init")
        })
        .expect("the session's helper");
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("ns");
    assert_ne!(ns(&helper), ns("self"), "the helper's own namespace");
    assert_eq!(mount_points(&helper), Vec::<std::path::PathBuf>::new());
    // And the session still has its own workspace, the host's.
    assert_eq!(
        std::fs::read_to_string(engine.workspace_path(&id).join("mine.txt")).expect("on host"),
        "here\n"
    );
}
