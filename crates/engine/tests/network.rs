//! Sessions and one-shot runs with a network policy: the egress proxy reached from inside,
//! what each Execution records, the server's bound, and `pip install` from the real registry.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use runcell_engine::testing::{engine_config, TestEngine};
use runcell_engine::{
    CreateSession, Engine, EngineError, Execution, ExecutionStatus, Language, NetworkConfig,
    NetworkConnection, NetworkPolicy, OneShot, Start,
};

fn cache() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn engine(allow: &[&str], cidrs: &[&str], zygote: bool) -> TestEngine {
    let mut config = engine_config(cache());
    config.network = NetworkConfig {
        allow_domains: allow.iter().map(|s| (*s).to_owned()).collect(),
        allow_cidrs: cidrs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    };
    if zygote {
        config.preload = Some(
            runcell_engine::DEFAULT_PRELOAD
                .iter()
                .map(|m| m.to_string())
                .collect(),
        );
    }
    let engine = TestEngine(Engine::new(config).expect("engine"));
    if zygote {
        let status = engine.wait_for_zygote(Duration::from_secs(180));
        assert!(
            matches!(status, runcell_engine::ZygoteStatus::Ready { .. }),
            "{status:?}"
        );
    }
    engine
}

fn allowlist(domains: &[&str]) -> NetworkPolicy {
    NetworkPolicy::Allowlist {
        allowed_domains: domains.iter().map(|s| (*s).to_owned()).collect(),
        domain_secrets: Vec::new(),
    }
}

/// An HTTP server on the host at 127.0.0.2 (not the sandbox's 127.0.0.1, which NO_PROXY keeps
/// direct) answering every request with `hello from the host`.
fn host_server() -> u16 {
    let l = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\nConnection: close\r\n\r\nhello from the host");
        }
    });
    port
}

fn exec(engine: &Engine, id: &str, code: &str) -> Execution {
    engine
        .sessions()
        .execute(id, code, None, None)
        .expect("execute")
}

fn fetch(port: u16, host: &str) -> String {
    format!(
        "import urllib.request, urllib.error\n\
         try:\n    print(urllib.request.urlopen('http://{host}:{port}/x', timeout=10).read().decode())\n\
         except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode().strip())"
    )
}

fn check_session(engine: &Engine, start: Start) {
    let port = host_server();
    let info = engine
        .sessions()
        .create(CreateSession {
            network: allowlist(&["127.0.0.2"]),
            start: Some(start),
            ..CreateSession::default()
        })
        .expect("create");
    assert_eq!(info.start, start);
    let e = exec(engine, &info.id, &fetch(port, "127.0.0.2"));
    assert_eq!(e.stdout, "hello from the host\n", "{e:?}");
    assert_eq!(e.network.len(), 1, "{:?}", e.network);
    let c = &e.network[0];
    assert_eq!(
        (c.domain.as_str(), c.port, c.allowed),
        ("127.0.0.2", port, true)
    );
    assert!(c.bytes_out > 0 && c.bytes_in > 19, "{c:?}");
    // Another address is refused with a 403 saying why, and recorded as refused.
    let e = exec(engine, &info.id, &fetch(port, "127.0.0.3"));
    assert_eq!(
        e.stdout,
        format!("403 runcell egress: refused GET 127.0.0.3:{port}: 127.0.0.3 is not in this session's network allowlist (allowed_domains: 127.0.0.2)\n")
    );
    assert_eq!(
        e.network,
        vec![NetworkConnection {
            domain: "127.0.0.3".into(),
            port,
            allowed: false,
            bytes_out: 0,
            bytes_in: 0
        }]
    );
    // A cell without connections records none.
    assert!(exec(engine, &info.id, "1").network.is_empty());
    // A command beside the kernel has the same way out (pip from the bash tool).
    let out = engine
        .run_command(
            &info.id,
            &format!("curl -s http://127.0.0.2:{port}/x || python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.2:{port}/x').read().decode(), end='')\""),
            None,
        )
        .expect("command");
    assert_eq!(out.stdout, "hello from the host", "{out:?}");
    // A restarted kernel is a new sandbox, with a new egress socket served by the same policy.
    engine.sessions().restart(&info.id).expect("restart");
    let e = exec(engine, &info.id, &fetch(port, "127.0.0.2"));
    assert_eq!(e.stdout, "hello from the host\n", "{e:?}");
    assert_eq!(e.network.len(), 1);
    engine.sessions().delete(&info.id).expect("delete");
}

#[test]
fn a_cold_session_reaches_what_its_allowlist_names_and_nothing_else() {
    check_session(
        &engine(&["127.0.0.2", "127.0.0.3"], &["127.0.0.0/8"], false),
        Start::Cold,
    );
}

#[test]
fn a_zygote_session_reaches_what_its_allowlist_names_and_nothing_else() {
    let engine = engine(&["127.0.0.2", "127.0.0.3"], &["127.0.0.0/8"], true);
    check_session(&engine, Start::Zygote);
    // The control: a session without a policy has no proxy and no proxy variables.
    let id = engine
        .sessions()
        .create(CreateSession::default())
        .expect("create")
        .id;
    let e = exec(&engine, &id, "import os, socket\nprint(os.environ.get('HTTP_PROXY'))\ntry:\n    socket.create_connection(('127.0.0.1', 3128), timeout=2)\nexcept OSError as e: print(e.errno)");
    assert_eq!(e.stdout, "None\n111\n");
}

#[test]
fn policies_beyond_the_bound_or_malformed_are_refused_before_anything_starts() {
    let engine = engine(&["pypi.org", "*.example.com"], &[], false);
    let create = |p: NetworkPolicy| {
        engine.sessions().create(CreateSession {
            network: p,
            language: Some(Language::Bash),
            ..CreateSession::default()
        })
    };
    let err = create(allowlist(&["github.com"])).expect_err("beyond");
    assert!(matches!(err, EngineError::LimitExceeded(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "limit exceeded: network: domain \"github.com\" is beyond what this server allows (serve --egress-allow)"
    );
    let err = create(allowlist(&["exa mple.com"])).expect_err("malformed");
    assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");
    assert!(create(allowlist(&["a.example.com", "PyPI.org"])).is_ok());
    assert!(engine.sessions().list().len() == 1);
    // No bound at all: any allowlist naming a domain is beyond it.
    let none = self::engine(&[], &[], false);
    let err = none
        .sessions()
        .create(CreateSession {
            network: allowlist(&["pypi.org"]),
            ..CreateSession::default()
        })
        .expect_err("no bound");
    assert!(matches!(err, EngineError::LimitExceeded(_)), "{err}");
}

#[test]
fn a_one_shot_run_takes_a_policy_too() {
    let port = host_server();
    let engine = engine(&["127.0.0.2"], &["127.0.0.0/8"], false);
    let mut req = OneShot::new(Language::Python, fetch(port, "127.0.0.2"));
    req.network = allowlist(&["127.0.0.2"]);
    let out = engine.run_once(&req, &mut |_, _| {}).expect("run");
    assert_eq!(
        out.execution.stdout, "hello from the host\n",
        "{:?}",
        out.execution
    );
    assert_eq!(out.execution.network.len(), 1);
    assert!(out.execution.network[0].allowed);
    // The control: without a policy, the same program has nowhere to go.
    let out = engine
        .run_once(
            &OneShot::new(Language::Python, fetch(port, "127.0.0.2")),
            &mut |_, _| {},
        )
        .expect("run");
    assert!(out.execution.stdout.is_empty(), "{:?}", out.execution);
    assert!(
        out.execution.stderr.contains("Connection refused")
            || out.execution.stderr.contains("Network is unreachable"),
        "{}",
        out.execution.stderr
    );
    assert!(out.execution.network.is_empty());
}

/// A run with a policy whose pid 1 does not reach its egress socket within the run's own
/// time (here a deadline of 1 ms; in life a sandbox starved by `cpu: 0.01`) ends as a timeout,
/// as a slow program does, not as a server error; the same run with its time succeeds (the
/// control).
#[test]
fn a_run_whose_sandbox_starts_slower_than_its_deadline_times_out() {
    let engine = engine(&["127.0.0.2"], &["127.0.0.0/8"], false);
    for language in [Language::Bash, Language::Python] {
        let code = match language {
            Language::Bash => "echo hi",
            _ => "print('hi')",
        };
        let mut req = OneShot::new(language, code);
        req.network = allowlist(&["127.0.0.2"]);
        req.timeout = Duration::from_millis(1);
        let out = engine
            .run_once(&req, &mut |_, _| {})
            .expect("a finished run");
        assert_eq!(
            out.execution.status,
            ExecutionStatus::Timeout,
            "{language:?}: {:?}",
            out.execution
        );
        req.timeout = Duration::from_secs(30);
        let out = engine.run_once(&req, &mut |_, _| {}).expect("run");
        assert_eq!(out.execution.stdout, "hi\n", "{:?}", out.execution);
    }
}

/// The real registry (reachable from this machine): a small pure-Python package the runtime
/// lacks lands in the workspace, importable in the next cell; without the index in the
/// allowlist, pip fails at once with the proxy's reason.
#[test]
fn pip_installs_from_the_registry_into_the_workspace() {
    let engine = engine(
        &["pypi.org", "files.pythonhosted.org", "127.0.0.2"],
        &[],
        true,
    );
    let id = engine
        .sessions()
        .create(CreateSession {
            network: allowlist(&["pypi.org", "files.pythonhosted.org"]),
            ..CreateSession::default()
        })
        .expect("create")
        .id;
    let e = exec(&engine, &id, "import termcolor");
    assert_eq!(
        e.error.as_ref().map(|e| e.name.as_str()),
        Some("ModuleNotFoundError")
    );
    let e = exec(
        &engine,
        &id,
        "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', 'termcolor==3.3.0'], capture_output=True, text=True)\nprint(r.returncode)\nprint(r.stdout[-300:], r.stderr[-2000:])",
    );
    assert!(e.stdout.starts_with("0\n"), "{}", e.stdout);
    assert!(
        e.network
            .iter()
            .any(|c| c.domain == "pypi.org" && c.allowed && c.bytes_in > 0),
        "{:?}",
        e.network
    );
    assert!(
        e.network
            .iter()
            .any(|c| c.domain == "files.pythonhosted.org" && c.allowed),
        "{:?}",
        e.network
    );
    let e = exec(&engine, &id, "import termcolor\ntermcolor.__file__");
    assert_eq!(
        runcell_engine_main_text(&e),
        "'/workspace/.runcell/site-packages/termcolor/__init__.py'"
    );
    // Not allowed: a clear error, fast (no retries).
    let id = engine
        .sessions()
        .create(CreateSession {
            network: allowlist(&["127.0.0.2"]),
            ..CreateSession::default()
        })
        .expect("create")
        .id;
    // Timed against pip's own start (`pip --version`, over a second on a busy machine): the
    // refusal adds well under 2 s to it.
    let e = exec(
        &engine,
        &id,
        "import subprocess, sys, time\nt0 = time.monotonic()\nsubprocess.run([sys.executable, '-m', 'pip', '--version'], capture_output=True)\nt1 = time.monotonic()\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', 'termcolor'], capture_output=True, text=True)\nt2 = time.monotonic()\nprint(r.returncode)\nprint(r.stderr)\nprint('extra', round((t2 - t1) - (t1 - t0), 3))",
    );
    assert!(e.stdout.starts_with("1\n"), "{}", e.stdout);
    assert!(
        e.stdout.contains("Tunnel connection failed: 403 Forbidden: runcell egress: refused CONNECT pypi.org:443: pypi.org is not in this session's network allowlist (allowed_domains: 127.0.0.2)"),
        "{}",
        e.stdout
    );
    let extra: f64 = e
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("extra "))
        .and_then(|v| v.parse().ok())
        .expect("timing");
    assert!(extra < 2.0, "the refusal took {extra} s beyond pip's start");
    assert!(
        e.network
            .iter()
            .all(|c| !c.allowed && c.domain == "pypi.org"),
        "{:?}",
        e.network
    );
}

fn runcell_engine_main_text(e: &Execution) -> String {
    e.results
        .iter()
        .find(|r| r.is_main_result)
        .and_then(|r| r.data.get("text/plain").cloned())
        .unwrap_or_default()
}

/// The real npm registry (reachable from this machine): `npm install` in a JavaScript
/// session's workspace puts a small package (not in Node) where the kernel's `require` finds
/// it in the next cell; without the registry in the allowlist npm fails on its first try,
/// saying why.
#[test]
fn npm_installs_from_the_registry_into_the_workspace() {
    let engine = engine(&["registry.npmjs.org", "127.0.0.2"], &[], false);
    let id = engine
        .sessions()
        .create(CreateSession {
            network: allowlist(&["registry.npmjs.org"]),
            language: Some(Language::Javascript),
            ..CreateSession::default()
        })
        .expect("create")
        .id;
    let e = exec(&engine, &id, "require('is-number')");
    assert!(
        e.error
            .as_ref()
            .is_some_and(|err| err.value.contains("Cannot find module 'is-number'")),
        "{e:?}"
    );
    let out = engine
        .run_command(&id, "npm install is-number@7.0.0 2>&1", None)
        .expect("npm");
    assert_eq!(out.exit_code, 0, "{out:?}");
    let e = exec(
        &engine,
        &id,
        "const isNumber = require('is-number'); [isNumber(5), isNumber('x'), require.resolve('is-number')]",
    );
    assert!(e.error.is_none(), "{e:?}");
    assert_eq!(
        runcell_engine_main_text(&e),
        "[ true, false, '/workspace/node_modules/is-number/index.js' ]"
    );
    // Not allowed: a clear error, fast.
    let id = engine
        .sessions()
        .create(CreateSession {
            network: allowlist(&["127.0.0.2"]),
            language: Some(Language::Javascript),
            ..CreateSession::default()
        })
        .expect("create")
        .id;
    // No timing here (a loaded machine makes npm's own start vary by seconds): the refusal is
    // the proxy's at the CONNECT, and `npm_config_fetch_retries=0` makes it npm's only try.
    let out = engine
        .run_command(
            &id,
            "npm install is-number@7.0.0 --loglevel=http 2>&1; echo \"exit $?\"",
            None,
        )
        .expect("npm");
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(text.contains("exit 1"), "{text}");
    assert!(
        text.contains("npm error 403 403 Forbidden: runcell egress: refused CONNECT registry.npmjs.org:443: registry.npmjs.org is not in this session's network allowlist (allowed_domains: 127.0.0.2)"),
        "{text}"
    );
    assert_eq!(
        text.matches("npm http fetch GET").count(),
        1,
        "one try, no retries: {text}"
    );
}
