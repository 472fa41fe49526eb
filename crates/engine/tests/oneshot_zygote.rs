//! One-shot Python runs forked from the zygote: the program behaves as under `python3 FILE`
//! (compared with a cold one-shot, which is a fresh `python3 FILE` in the same sandbox), and the
//! hostile probes meet exactly the walls a cold one-shot meets, each with a positive control on
//! the host.

use std::path::Path;
use std::process::Command;

use runcell_engine::{Engine, Language, LimitsRequest, OneShot, Start};
use serde_json::Value;

const PROBES: &str = include_str!("../../cli/tests/fixtures/probes.py");

fn zygote_engine() -> runcell_engine::testing::TestEngine {
    runcell_engine::testing::zygote_engine(Path::new(env!("CARGO_TARGET_TMPDIR")))
}

struct Ran {
    exec: Value,
    exit_code: i32,
}

fn run(engine: &Engine, req: &OneShot) -> Ran {
    // With the pool started, each run waits for its prepared sandboxes (made in the
    // background), so that it takes one rather than a fresh fork.
    let _ = engine.wait_for_one_shots(std::time::Duration::from_secs(60));
    let out = engine.run_once(req, &mut |_, _| {}).expect("run_once");
    Ran {
        exec: serde_json::to_value(&out.execution).expect("json"),
        exit_code: out.exit_code,
    }
}

fn python(code: &str, start: Start) -> OneShot {
    let mut req = OneShot::new(Language::Python, code);
    req.start = start;
    req
}

/// Whether the run's interpreter held pandas before the program imported anything: only a
/// fork of the zygote does.
fn forked(engine: &Engine, start: Start) -> bool {
    let r = run(
        engine,
        &python("import sys\nprint('pandas' in sys.modules)", start),
    );
    r.exec["stdout"] == "True\n"
}

/// Programs whose observable behaviour (stdout, stderr, exit code, files) must be that of
/// `python3 main.py ARGS` with that stdin.
fn behaviour_cases() -> Vec<(&'static str, &'static str, Vec<&'static str>, &'static str)> {
    vec![
        (
            "argv, path and main module",
            "import sys, __main__\nprint(sys.argv, sys.path[0], __name__, __file__)\n\
             print(sorted(k for k in globals()), __package__, __spec__, __cached__)\n\
             print(type(__loader__).__name__, __main__.__file__, sys.orig_argv[1:])",
            vec!["a", "b c"],
            "",
        ),
        (
            "stdin",
            "import sys\ndata = sys.stdin.read()\nprint(len(data), data.split())\nprint(input.__name__)",
            vec![],
            "3 4\nfive\n",
        ),
        ("input()", "a = input()\nb = input()\nprint(int(a) + int(b))", vec![], "3\n4\n"),
        ("exit code", "import sys\nprint('x')\nsys.exit(3)", vec![], ""),
        ("exit None", "import sys\nsys.exit()", vec![], ""),
        ("exit message", "import sys\nsys.exit('bad input')", vec![], ""),
        ("exit float", "raise SystemExit(2.5)", vec![], ""),
        ("exit big", "import sys\nsys.exit(256 + 7)", vec![], ""),
        ("exit negative", "import sys\nsys.exit(-1)", vec![], ""),
        ("os._exit", "import os\nprint('a', flush=True)\nos._exit(4)", vec![], ""),
        (
            "uncaught exception",
            "def f(x):\n    return 1 / x\n\nprint('before')\nf(0)",
            vec![],
            "",
        ),
        (
            "chained exception",
            "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('v') from e",
            vec![],
            "",
        ),
        ("syntax error", "print('never')\ndef f(:\n    pass", vec![], ""),
        ("keyboard interrupt", "raise KeyboardInterrupt", vec![], ""),
        (
            "atexit and threads",
            "import atexit, threading, time\natexit.register(lambda: print('atexit'))\n\
             def late():\n    time.sleep(0.2)\n    print('thread')\n\
             threading.Thread(target=late).start()\nprint('main')",
            vec![],
            "",
        ),
        (
            "atexit after sys.exit",
            "import atexit, sys\natexit.register(print, 'bye')\natexit.register(print, 'first')\nsys.exit(5)",
            vec![],
            "",
        ),
        (
            "unclosed file is flushed",
            "f = open('/workspace/out.txt', 'w')\nf.write('x' * 100)\n\
             import atexit\natexit.register(lambda: None)",
            vec![],
            "",
        ),
        (
            "pickle of a __main__ class",
            "import pickle\nclass P:\n    pass\nprint(type(pickle.loads(pickle.dumps(P()))).__name__)",
            vec![],
            "",
        ),
        (
            "custom excepthook",
            "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__, v)\nraise OSError('o')",
            vec![],
            "",
        ),
        (
            "environment",
            "import os\nprint(sorted(os.environ.items()))\nprint(os.getcwd())",
            vec![],
            "",
        ),
    ]
}

/// The pool's engine: one prepared one-shot of each zygote's, waited for.
fn pooled_engine() -> runcell_engine::testing::TestEngine {
    let engine = zygote_engine();
    engine.start_one_shot_pool(1);
    assert!(
        engine.wait_for_one_shots(std::time::Duration::from_secs(120)),
        "the pool did not fill: {:?}",
        engine.one_shots_ready()
    );
    engine
}

/// How long the program's process has existed when it runs (from /proc: its start time in
/// clock ticks since boot against the uptime): a prepared sandbox's program was forked before
/// the run was asked for.
const AGE: &str = "def _age():\n    import os\n    ticks = os.sysconf('SC_CLK_TCK')\n    start = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n    return float(open('/proc/uptime').read().split()[0]) - start / ticks\n";

#[test]
fn zygote_one_shots_behave_as_python3_file_py() {
    let engine = zygote_engine();
    assert!(forked(&engine, Start::Zygote), "not forked from the zygote");
    assert!(!forked(&engine, Start::Cold), "a cold run was preloaded");
    behaves_as_python3(&engine);
}

#[test]
fn prepared_one_shots_behave_as_python3_file_py_and_are_used_once() {
    let engine = pooled_engine();
    // A program that imports only the standard library runs from the light zygote (no
    // pandas), one that imports pandas from the full one; both in prepared sandboxes, whose
    // programs were forked well before the run.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let light = run(
        &engine,
        &python(
            &format!("{AGE}import sys\nprint('pandas' in sys.modules, 'runcell_kernel' in sys.modules, _age() > 1)"),
            Start::Zygote,
        ),
    );
    assert_eq!(
        light.exec["stdout"], "False True True\n",
        "{:#}",
        light.exec
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let full = run(
        &engine,
        &python(
            &format!("{AGE}import sys, pandas\nprint('sklearn' in sys.modules, _age() > 1)"),
            Start::Zygote,
        ),
    );
    assert_eq!(full.exec["stdout"], "True True\n", "{:#}", full.exec);
    // The control: a cold run's process is new.
    let cold = run(
        &engine,
        &python(&format!("{AGE}print(_age() < 1)"), Start::Cold),
    );
    assert_eq!(cold.exec["stdout"], "True\n", "{:#}", cold.exec);

    // What one run leaves (files in /workspace and /tmp, a process in a session of its own,
    // an environment variable) no later run sees: each sandbox serves one run.
    let leave = "import os, subprocess\nopen('/workspace/left.txt', 'w').write('x')\nopen('/tmp/left.txt', 'w').write('x')\nsubprocess.Popen(['sleep', '300'], start_new_session=True)\nos.environ['LEFT'] = '1'\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()))";
    let look = "import os\nprint(os.path.exists('/workspace/left.txt'), os.path.exists('/tmp/left.txt'), 'LEFT' in os.environ, os.getpid(), sorted(p for p in os.listdir('/proc') if p.isdigit()))";
    for code in [leave, look] {
        let req = python(code, Start::Zygote);
        let r = run(&engine, &req);
        assert_eq!(r.exit_code, 0, "{:#}", r.exec);
        if code == leave {
            // The positive control: the leftovers were there within the run.
            assert_eq!(r.exec["stdout"], "['1', '2', '3']\n", "{:#}", r.exec);
        } else {
            assert_eq!(
                r.exec["stdout"], "False False False 2 ['1', '2']\n",
                "{:#}",
                r.exec
            );
        }
    }
    behaves_as_python3(&engine);
}

fn behaves_as_python3(engine: &Engine) {
    for (what, code, args, stdin) in behaviour_cases() {
        let mut got = Vec::new();
        for start in [Start::Cold, Start::Zygote] {
            let mut req = python(code, start);
            req.args = args.iter().map(|a| a.to_string()).collect();
            req.stdin = stdin.as_bytes().to_vec();
            let r = run(engine, &req);
            let files: Vec<(Value, Value)> = r.exec["files"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| (f["path"].clone(), f["size"].clone()))
                .collect();
            got.push((
                r.exit_code,
                r.exec["status"].clone(),
                r.exec["stdout"].clone(),
                r.exec["stderr"].clone(),
                r.exec["error"]["name"].clone(),
                files,
            ));
        }
        assert_eq!(
            got[0], got[1],
            "{what}: cold (left) and zygote (right) differ"
        );
    }
    // The exact outcomes python3 gives, not merely equal ones.
    let exit = |code: &str, stdin: &str| {
        let mut req = python(code, Start::Zygote);
        req.stdin = stdin.as_bytes().to_vec();
        run(engine, &req)
    };
    let r = exit("import sys\nsys.exit(3)", "");
    assert_eq!((r.exit_code, &r.exec["status"]), (3, &"error".into()));
    let r = exit("1/0", "");
    assert_eq!(r.exit_code, 1);
    let stderr = r.exec["stderr"].as_str().unwrap_or_default();
    assert_eq!(
        stderr,
        "Traceback (most recent call last):\n  File \"/opt/runcell/input/main.py\", line 1, in <module>\n    1/0\n    ~^~\nZeroDivisionError: division by zero\n"
    );
    assert_eq!(r.exec["error"]["name"], "ZeroDivisionError");
    let r = exit("import sys\nsys.exit('bad input')", "");
    assert_eq!(
        (r.exit_code, r.exec["stderr"].as_str()),
        (1, Some("bad input\n"))
    );
    let r = exit("raise KeyboardInterrupt", "");
    assert_eq!(r.exit_code, 128 + libc::SIGINT, "{:#}", r.exec);
    let r = exit("print(sum(map(int, input().split())))", "2 3 4\n");
    assert_eq!((r.exit_code, r.exec["stdout"].as_str()), (0, Some("9\n")));

    // Every fork reseeds: two runs never share a random stream.
    let code = "import random, numpy as np\nprint(random.random(), np.random.rand())";
    let (a, b) = (exit(code, ""), exit(code, ""));
    assert_ne!(a.exec["stdout"], b.exec["stdout"]);
}

/// A probe of the fixture inside a zygote one-shot (its arguments on the command line, as
/// `python3 probes.py NAME ARGS`).
fn probe_inside(engine: &Engine, name: &str, args: &[&str]) -> (String, Value) {
    let mut req = python(PROBES, Start::Zygote);
    req.args = std::iter::once(name)
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    let r = run(engine, &req);
    let line = r.exec["stdout"].as_str().unwrap_or_default().to_owned();
    let v: Value = serde_json::from_str(line.trim())
        .unwrap_or_else(|e| panic!("probe {name} printed {line:?} ({e}): {:#}", r.exec));
    (
        v["result"].as_str().unwrap_or_default().to_owned(),
        v["detail"].clone(),
    )
}

/// The same probe on the host (the positive control).
fn probe_on_host(name: &str, args: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("probes.py");
    std::fs::write(&script, PROBES).expect("write probes");
    let out = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(name)
        .args(args)
        .current_dir(dir.path())
        .output()
        .expect("run control");
    let v: Value = serde_json::from_slice(out.stdout.trim_ascii()).expect("control line");
    (
        v["result"].as_str().unwrap_or_default().to_owned(),
        v["detail"].clone(),
    )
}

#[test]
fn hostile_programs_in_zygote_one_shots_meet_the_walls_of_cold_ones() {
    let engine = zygote_engine();
    assert!(forked(&engine, Start::Zygote), "not forked from the zygote");
    meet_the_walls(&engine);
}

#[test]
fn hostile_programs_in_prepared_one_shots_meet_the_same_walls() {
    let engine = pooled_engine();
    meet_the_walls(&engine);
}

fn meet_the_walls(engine: &Engine) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port().to_string();

    // File escapes and the network: (probe, args, inside, what the host control shows).
    let secret = tempfile::NamedTempFile::new().expect("host file");
    let secret_path = secret.path().to_str().expect("utf8").to_owned();
    let table: Vec<(&str, Vec<&str>, &str, &str)> = vec![
        ("read", vec!["/etc/shadow"], "errno:ENOENT", "ok"),
        ("read", vec![&secret_path], "errno:ENOENT", "ok"),
        // No host control for writes: as root it would create /usr/x on the host.
        ("write", vec!["/usr/x"], "errno:EROFS", "-"),
        ("write", vec!["/opt/runcell/python/x"], "errno:EROFS", "-"),
        ("unshare_user", vec![], "errno:EPERM", "ok"),
        ("mount", vec!["/nonexistent"], "errno:EPERM", "errno:ENOENT"),
        ("ptrace_parent", vec![], "errno:EPERM", "-"),
        (
            "tcp_connect",
            vec!["127.0.0.1", &port],
            "errno:ECONNREFUSED",
            "ok",
        ),
        (
            "tcp_connect",
            vec!["169.254.169.254", "80"],
            "errno:ENETUNREACH",
            "-",
        ),
        ("socket", vec!["netlink", "dgram"], "errno:EPERM", "ok"),
    ];
    for (name, args, inside, host) in &table {
        let (got, detail) = probe_inside(engine, name, args);
        assert_eq!(&got, inside, "{name} {args:?} inside: {detail}");
        if *host != "-" {
            let (got, detail) = probe_on_host(name, args);
            // Host root is not refused where the sandbox user is: the call got past the wall.
            assert!(
                &got == host || (host.starts_with("errno") && got == "ok"),
                "{name} {args:?} on the host: {got} {detail}"
            );
        }
    }
    // Pid 1 runs under a filter of its own (one program, narrower than the program's), the
    // program under the allow-list and its errno filters: the kernel counts each process's
    // filters in /proc/PID/status.
    let filters = "print(' '.join(l.split()[1] for f in ('/proc/1/status', '/proc/self/status') \
                   for l in open(f) if l.startswith('Seccomp_filters')))";
    let r = run(engine, &python(filters, Start::Zygote));
    let programs = runcell_sandbox::seccomp::build().expect("filter").len();
    assert_eq!(r.exec["stdout"], format!("1 {programs}\n"), "{:#}", r.exec);
    let (_, ifaces) = probe_inside(engine, "net_interfaces", &[]);
    assert_eq!(ifaces, serde_json::json!(["lo"]));
    let (_, host_ifaces) = probe_on_host("net_interfaces", &[]);
    assert!(host_ifaces.as_array().is_some_and(|a| a.len() > 1));
    drop(listener);

    // Fork bomb: the pids limit kills the tree; a few forks are fine.
    let mut bomb = python(
        "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(100)\n    except OSError:\n        pass\n",
        Start::Zygote,
    );
    bomb.timeout = std::time::Duration::from_secs(20);
    let r = run(engine, &bomb);
    assert_eq!(r.exec["usage"]["killed_by"], "pids", "{:#}", r.exec);
    assert_eq!(r.exit_code, 137);
    let r = run(
        engine,
        &python(
            "import os\nfor _ in range(20):\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0)\nprint('forked')",
            Start::Zygote,
        ),
    );
    assert_eq!(r.exec["stdout"], "forked\n", "{:#}", r.exec);

    // Memory: touching 512 MiB under a 200 MiB limit is an OOM kill; 32 MiB is fine.
    let bomb = "b = bytearray(512 * 1024 * 1024)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('survived')";
    for (code, killed) in [(bomb.to_owned(), true), (bomb.replace("512", "32"), false)] {
        let mut req = python(&code, Start::Zygote);
        req.limits = LimitsRequest {
            memory_mb: Some(200),
            ..LimitsRequest::default()
        };
        let r = run(engine, &req);
        if killed {
            assert_eq!(r.exec["usage"]["killed_by"], "oom", "{:#}", r.exec);
            assert_eq!(r.exec["error"]["name"], "MemoryError");
        } else {
            assert_eq!(r.exec["stdout"], "survived\n", "{:#}", r.exec);
        }
    }

    // Output flood: 64 MiB against a 64 KiB cap keeps head and tail and says so.
    let mut flood = python(
        "import sys\nchunk = 'y' * 65535 + '\\n'\nfor _ in range(1024):\n    sys.stdout.write(chunk)\nprint('end')",
        Start::Zygote,
    );
    flood.output_cap = 64 << 10;
    let r = run(engine, &flood);
    assert_eq!(r.exec["truncated"]["stdout"], true, "{:#}", r.exec["usage"]);
    let out = r.exec["stdout"].as_str().unwrap_or_default();
    assert!(out.len() < 80 << 10 && out.ends_with("end\n") && out.contains("truncated"));
    assert_eq!(r.exit_code, 0);

    // Sleep past the deadline: killed at it.
    let mut sleeper = python("import time\ntime.sleep(30)", Start::Zygote);
    sleeper.timeout = std::time::Duration::from_secs(1);
    let r = run(engine, &sleeper);
    assert_eq!(r.exec["status"], "timeout", "{:#}", r.exec);
    assert_eq!(r.exec["usage"]["killed_by"], "timeout");
}

/// A program whose child outlives it, printing and writing to its workspace without pause:
/// the run ends with the program (the child is stopped, then killed, with the sandbox),
/// neither waiting for the child nor hanging on the output pipe it still holds. From a
/// prepared sandbox, a zygote fork and a cold start alike.
#[test]
fn a_run_ends_with_its_program_whatever_its_children_do() {
    let code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n        print('child', flush=True)\n        with open('/workspace/grow.txt', 'a') as f:\n            f.write('x' * 100)\n        time.sleep(0.001)\ntime.sleep(0.3)\nprint('main done', flush=True)\n";
    let pooled = pooled_engine();
    let plain = zygote_engine();
    for (engine, start) in [
        (&*pooled, Start::Zygote),
        (&*plain, Start::Zygote),
        (&*plain, Start::Cold),
    ] {
        let began = std::time::Instant::now();
        let r = run(engine, &python(code, start));
        let took = began.elapsed();
        assert_eq!(r.exit_code, 0, "{start:?}: {:#}", r.exec);
        assert_eq!(r.exec["status"], "ok", "{start:?}: {:#}", r.exec);
        let out = r.exec["stdout"].as_str().unwrap_or_default();
        // The positive control: the child ran (and wrote) while the program did. (Their lines
        // may interleave: `print` writes the text and the newline apart.)
        assert!(out.starts_with("child\n"), "{start:?}: {out:?}");
        assert!(
            out.contains("main done"),
            "{start:?}: {} bytes, ending {:?}; {:#}",
            out.len(),
            &out[out.len().saturating_sub(100)..],
            r.exec["truncated"]
        );
        assert!(
            took < std::time::Duration::from_secs(20),
            "{start:?}: the run took {took:?} (its time limit is 60 s)"
        );
    }
}
