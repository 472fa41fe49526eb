//! Zygote-born Python sessions (DESIGN.md §4): preloaded, reseeded, confined exactly like cold
//! ones (the same probes give the same outcomes), invisible to each other, and never broken
//! when the zygote dies.

mod common;

use std::time::Duration;

use common::create;
use runcell_engine::{CreateSession, Execution, ExecutionStatus, ZygoteStatus};

const PROBES: &str = include_str!("../../cli/tests/fixtures/probes.py");

fn exec(engine: &runcell_engine::Engine, id: &str, code: &str) -> Execution {
    let e = engine
        .sessions()
        .execute(id, code, None, None)
        .expect("execute");
    assert_eq!(e.status, ExecutionStatus::Ok, "{code}: {e:?}");
    e
}

/// The main result's text, on one line (the kernel pretty-prints long values over several).
fn main_text(e: &Execution) -> String {
    common::main_text(e).replace('\n', "")
}

fn preloaded(engine: &runcell_engine::Engine, id: &str) -> bool {
    match main_text(&exec(engine, id, "import sys\n'pandas' in sys.modules")).as_str() {
        "True" => true,
        "False" => false,
        other => panic!("{other}"),
    }
}

/// Every probe of the hostile fixture that makes sense inside a session, as (name, args).
fn probe_table() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("proc_status", vec![]),
        ("uid_map", vec![]),
        ("gid_map", vec![]),
        ("ids", vec![]),
        ("read", vec!["/etc/shadow"]),
        ("read", vec!["/root/.bashrc"]),
        ("listdir", vec!["/root"]),
        ("write", vec!["/usr/x"]),
        ("write", vec!["/opt/runcell/python/x"]),
        ("write", vec!["/opt/runcell/kernel/x"]),
        ("mount", vec!["/nonexistent"]),
        ("unshare_user", vec![]),
        ("unshare_mount", vec![]),
        ("clone_newuser", vec![]),
        ("clone3", vec![]),
        ("ptrace_traceme", vec![]),
        ("ptrace_parent", vec![]),
        ("keyctl", vec![]),
        ("bpf", vec![]),
        ("perf_event_open", vec![]),
        ("userfaultfd", vec![]),
        ("io_uring_setup", vec![]),
        ("kexec_load", vec![]),
        ("init_module", vec![]),
        ("reboot", vec![]),
        ("settimeofday", vec![]),
        ("process_vm_readv", vec![]),
        ("pidfd_getfd", vec![]),
        ("open_by_handle_at", vec![]),
        ("mknod", vec!["/tmp/null"]),
        ("setuid_binary", vec!["/usr/bin/mount", "/tmp"]),
        ("open_fds", vec![]),
        ("setns", vec![]),
        ("chroot", vec![]),
        ("socket", vec!["packet", "raw"]),
        ("socket", vec!["netlink", "dgram"]),
        ("socket", vec!["vsock", "stream"]),
        ("socket", vec!["alg", "seqpacket"]),
        ("socket", vec!["inet", "raw", "1"]),
        ("socket", vec!["inet", "stream"]),
        ("socket", vec!["inet", "stream", "262"]),
        ("socket", vec!["inet", "dgram", "136"]),
        ("socketpair", vec!["unix", "stream", "1"]),
        ("syncfs_badfd", vec![]),
        ("tcp_connect", vec!["169.254.169.254", "80"]),
        ("hostname", vec![]),
        ("net_interfaces", vec![]),
        ("env", vec![]),
        ("pid1", vec![]),
    ]
}

fn run_probes(engine: &runcell_engine::Engine, id: &str) -> Vec<String> {
    exec(
        engine,
        id,
        &PROBES.replace("if __name__ == \"__main__\":\n    main()", ""),
    );
    probe_table()
        .into_iter()
        .map(|(name, args)| {
            let code = format!("repr(probe({name:?}, {args:?}))");
            format!("{name} {args:?} -> {}", main_text(&exec(engine, id, &code)))
        })
        .collect()
}

/// Host uids of sandboxes (2000000000 and up) replaced by a placeholder.
fn mask_host_ids(s: &str) -> String {
    s.split('\'')
        .map(|t| {
            if t.len() == 10 && t.starts_with("20") && t.bytes().all(|b| b.is_ascii_digit()) {
                "HOST_ID"
            } else {
                t
            }
        })
        .collect::<Vec<_>>()
        .join("'")
}

#[test]
fn zygote_sessions_are_preloaded_reseeded_and_confined_like_cold_ones() {
    let cold_engine = common::engine();
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let cold = create(&cold_engine);
    let (a, b) = (create(&engine), create(&engine));
    assert!(
        !preloaded(&cold_engine, &cold),
        "a cold session imported pandas"
    );
    assert!(
        preloaded(&engine, &a),
        "the session was not born of the zygote"
    );

    // The same probes, the same outcomes (uids, maps, capabilities, seccomp, every refused
    // call, the environment, pid 1), and the exact ones the hostile suite expects.
    let (c, z) = (run_probes(&cold_engine, &cold), run_probes(&engine, &a));
    assert_eq!(c.len(), z.len());
    for (c, z) in c.iter().zip(&z) {
        // Every sandbox maps uid 1000 to its own host uid: equal once those are masked.
        assert_eq!(
            mask_host_ids(c),
            mask_host_ids(z),
            "cold and zygote-born sessions differ"
        );
    }
    assert_ne!(c[1], z[1], "two sandboxes share a host uid: {}", c[1]);
    for (probe, want) in [
        ("proc_status []", "'CapEff': '0000000000000000', 'CapBnd': '0000000000000000', 'CapAmb': '0000000000000000', 'NoNewPrivs': '1', 'Seccomp': '2'"),
        ("ids []", "[1000, 1000, 1000, []]"),
        ("read [\"/etc/shadow\"]", "errno:ENOENT"),
        ("write [\"/opt/runcell/python/x\"]", "errno:EROFS"),
        ("unshare_user []", "errno:EPERM"),
        ("clone3 []", "errno:ENOSYS"),
        ("ptrace_parent []", "errno:EPERM"),
        ("setuid_binary [\"/usr/bin/mount\", \"/tmp\"]", "exit:32"),
        ("socket [\"netlink\", \"dgram\"]", "errno:EPERM"),
        ("tcp_connect [\"169.254.169.254\", \"80\"]", "errno:ENETUNREACH"),
        ("socket [\"inet\", \"stream\"]", "('ok', None)"),
        ("socket [\"inet\", \"stream\", \"262\"]", "errno:EPROTONOSUPPORT"),
        ("socket [\"inet\", \"dgram\", \"136\"]", "errno:EPROTONOSUPPORT"),
        ("syncfs_badfd []", "('ok', None)"),
        ("pid1 []", "('ok', 'runcell-init')"),
        ("hostname []", "'runcell'"),
        ("net_interfaces []", "['lo']"),
    ] {
        let line = z
            .iter()
            .find(|l| l.starts_with(&format!("{probe} -> ")))
            .unwrap_or_else(|| panic!("no probe {probe}"));
        assert!(line.contains(want), "{line} lacks {want}");
    }

    // More than one CPU: a cold start, so numpy's BLAS pool gets its size (the zygote's is 1).
    let wide = engine
        .sessions()
        .create(CreateSession {
            limits: runcell_engine::LimitsRequest {
                cpu: Some(2.0),
                ..Default::default()
            },
            ..CreateSession::default()
        })
        .expect("create")
        .id;
    assert!(!preloaded(&engine, &wide));
    assert_eq!(
        main_text(&exec(
            &engine,
            &wide,
            "import os\nos.environ['OPENBLAS_NUM_THREADS']"
        )),
        "'2'"
    );

    // Dumpable like a cold (exec'd) program: its own /proc/self files are its own.
    let dumpable = "import ctypes\nctypes.CDLL(None).prctl(3, 0, 0, 0, 0)";
    assert_eq!(main_text(&exec(&cold_engine, &cold, dumpable)), "1");
    assert_eq!(main_text(&exec(&engine, &a, dumpable)), "1");

    // Reseeded: the zygote's RNG states are shared by every fork until reseeded.
    let code = "import random, numpy as np\n(random.random(), np.random.rand(), np.random.default_rng().random())";
    let (x, y) = (
        main_text(&exec(&engine, &a, code)),
        main_text(&exec(&engine, &b, code)),
    );
    let (x, y) = (x.trim_matches(['(', ')']), y.trim_matches(['(', ')']));
    for (p, q) in x.split(", ").zip(y.split(", ")) {
        assert_ne!(p, q, "{x} vs {y}");
    }
}

/// The `proc_paths` probe in a session: what it can learn of where runcell lives on the host.
fn proc_paths(engine: &runcell_engine::Engine, id: &str) -> serde_json::Value {
    let code = format!(
        "{}\nimport json\nprint(json.dumps(probe('proc_paths', [])[1]))",
        PROBES.replace("if __name__ == \"__main__\":\n    main()", "")
    );
    let e = exec(engine, id, &code);
    serde_json::from_str(e.stdout.trim()).unwrap_or_else(|err| panic!("{err}: {e:?}"))
}

#[test]
fn no_session_sees_a_host_path_of_runcell() {
    let cold_engine = common::engine();
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let (cold, z) = (create(&cold_engine), create(&engine));
    assert!(
        preloaded(&engine, &z),
        "the session was not born of the zygote"
    );
    let init = runcell_engine::testing::init_exe();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace root");
    let host_paths = [
        init.to_string_lossy().into_owned(),
        repo.to_string_lossy().into_owned(),
        env!("CARGO_TARGET_TMPDIR").to_owned(),
        // The data dirs of the test engines.
        std::env::temp_dir()
            .join("runcell-test-")
            .to_string_lossy()
            .into_owned(),
    ];
    let (c, zy) = (proc_paths(&cold_engine, &cold), proc_paths(&engine, &z));
    for (who, got) in [("cold", &c), ("zygote-born", &zy)] {
        let text = got.to_string();
        for p in &host_paths {
            assert!(
                !text.contains(p.as_str()),
                "a {who} session sees {p}: {got:#}"
            );
        }
        // Pid 1 says what it is, and its binary is not the program's to read.
        assert_eq!(
            got["pid1_cmdline"],
            serde_json::json!(["runcell-init"]),
            "{who}"
        );
        assert_eq!(got["pid1_comm"], "runcell-init", "{who}");
        assert_eq!(got["pid1_exe"], "errno:EACCES", "{who}");
    }
    // A zygote-born program is runcell's init binary, exec'd from a detached mount: named
    // relative to it. Its command line and name are those a cold one has (as much as fits).
    let name = init.file_name().expect("name").to_string_lossy();
    assert_eq!(zy["self_exe"], format!("/{name}"));
    assert_eq!(zy["self_comm"], c["self_comm"]);
    let (cc, zc) = (
        c["self_cmdline"].as_array().expect("cmdline"),
        zy["self_cmdline"].as_array().expect("cmdline"),
    );
    assert!(!zc.is_empty() && cc.starts_with(zc), "{cc:?} vs {zc:?}");

    // The control: the same probe pointed at this test process (exec'd by its host path) does
    // report host paths.
    let me = std::process::id().to_string();
    let out = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(format!(
            "{}\nimport json\nprint(json.dumps(probe('proc_paths', ['{me}'])[1]))",
            PROBES.replace("if __name__ == \"__main__\":\n    main()", "")
        ))
        .output()
        .expect("control");
    let host: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert!(
        host["pid1_exe"]
            .as_str()
            .is_some_and(|e| e.starts_with(&*repo.to_string_lossy())),
        "{host:#}"
    );
}

#[test]
fn two_zygote_sessions_see_nothing_of_each_other() {
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    // A carries a secret in its environment, in a spec much longer than the next one.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    let secret = format!("s3cret-{}-{nanos}", std::process::id());
    let a = engine
        .sessions()
        .create(CreateSession {
            // Padding first (variables are sent in order), so that the secret sits far past
            // where any shorter request that follows ends.
            env: [
                ("AAA_PADDING".to_owned(), "x".repeat(16 << 10)),
                ("RUNCELL_TEST_SECRET".to_owned(), secret.clone()),
            ]
            .into(),
            ..CreateSession::default()
        })
        .expect("create a")
        .id;
    let b = create(&engine);
    assert!(preloaded(&engine, &a) && preloaded(&engine, &b));
    // Nothing of A's request is in B's memory (B is a fork of the zygote that received A's
    // spec just before B's); A itself, the control, finds its secret in its own memory. The
    // scanning code holds the secret's head in clear and its tail XOR-ed, so the secret itself
    // is never in the scanner's memory unless it was there already.
    let (head, tail) = secret.split_at(7);
    let tail_x: String = tail.bytes().map(|b| format!("{:02x}", b ^ 0x5a)).collect();
    let scan = format!(
        r#"
def scan(head, tail_x):
    found = 0
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms or "[vvar]" in line or "[vsyscall]" in line:
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            # In windows (overlapping by a match's length): a mapping can be larger than
            # the session's memory (the preloaded libraries reserve some).
            window, keep = 16 << 20, len(head) + len(tail_x)
            at = lo
            while at < hi:
                try:
                    mem.seek(at)
                    data = mem.read(min(window + keep, hi - at))
                except (OSError, ValueError, OverflowError):
                    break
                i = data.find(head)
                while 0 <= i < window:
                    after = data[i + len(head):i + len(head) + len(tail_x)]
                    if bytes(c ^ 0x5a for c in after) == tail_x:
                        found += 1
                    i = data.find(head, i + 1)
                at += window
    return found
scan(b"{head}", bytes.fromhex("{tail_x}")) > 0
"#
    );
    assert_eq!(
        main_text(&exec(&engine, &a, &scan)),
        "True",
        "control: A finds its own secret"
    );
    assert_eq!(
        main_text(&exec(&engine, &b, &scan)),
        "False",
        "A's secret is in B's memory"
    );
    traces_stay_in_their_session(&engine, &a, &b);
}

/// A leaves traces everywhere it can (files, an abstract socket, a loopback listener, a child
/// process) and sees them; B sees none of them.
fn traces_stay_in_their_session(engine: &runcell_engine::Engine, a: &str, b: &str) {
    exec(
        engine,
        a,
        r#"
import os, socket, subprocess
for p in ("/workspace/a.txt", "/tmp/a.txt", "/dev/shm/a.txt"):
    open(p, "w").write("secret")
abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
abstract.bind("\0runcell-a")
abstract.listen()
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", 7777))
tcp.listen()
child = subprocess.Popen(["sleep", "60"])
"#,
    );
    // Controls: A sees its own traces.
    let seen_by_a = main_text(&exec(
        engine,
        a,
        r#"
import os, socket
c = socket.create_connection(("127.0.0.1", 7777)); c.close()
u = socket.socket(socket.AF_UNIX); u.connect("\0runcell-a"); u.close()
[os.path.exists(p) for p in ("/workspace/a.txt", "/tmp/a.txt", "/dev/shm/a.txt")] + [len([p for p in os.listdir("/proc") if p.isdigit()])]
"#,
    ));
    assert_eq!(seen_by_a, "[True, True, True, 3]");
    // B sees none of them.
    let seen_by_b = main_text(&exec(
        engine,
        b,
        r#"
import os, socket
def refused(fn):
    try:
        fn()
        return "connected"
    except OSError as e:
        return type(e).__name__
def tcp():
    socket.create_connection(("127.0.0.1", 7777), timeout=2).close()
def abstract():
    u = socket.socket(socket.AF_UNIX); u.connect("\0runcell-a"); u.close()
[os.path.exists(p) for p in ("/workspace/a.txt", "/tmp/a.txt", "/dev/shm/a.txt")] + [refused(tcp), refused(abstract), sorted(int(p) for p in os.listdir("/proc") if p.isdigit())]
"#,
    ));
    assert_eq!(
        seen_by_b,
        "[False, False, False, 'ConnectionRefusedError', 'ConnectionRefusedError', [1, 2]]"
    );
}

#[test]
fn a_dead_zygote_means_cold_starts_then_a_new_zygote() {
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let ZygoteStatus::Ready { pid, .. } = engine.zygote_status() else {
        panic!("not ready");
    };
    let live = create(&engine);
    assert!(preloaded(&engine, &live));
    // SAFETY: killing the zygote process this engine started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    // Sessions it forked before are not its children: they live on.
    assert_eq!(main_text(&exec(&engine, &live, "6 * 7")), "42");
    // The next session starts cold (and works); a new zygote starts meanwhile.
    let cold = create(&engine);
    assert!(!preloaded(&engine, &cold));
    assert_eq!(
        main_text(&exec(&engine, &cold, "import pandas\npandas.__name__")),
        "'pandas'"
    );
    let status = engine.wait_for_zygote(Duration::from_secs(180));
    let ZygoteStatus::Ready { pid: new_pid, .. } = status else {
        panic!("no new zygote: {status:?}");
    };
    assert_ne!(new_pid, pid);
    let again = create(&engine);
    assert!(preloaded(&engine, &again));
}

#[test]
fn a_zygote_session_leaves_no_process_when_deleted() {
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let id = create(&engine);
    exec(
        &engine,
        &id,
        "import subprocess\np = subprocess.Popen(['sleep', '600'])",
    );
    let ZygoteStatus::Ready { pid, .. } = engine.zygote_status() else {
        panic!("not ready");
    };
    let children = || -> Vec<String> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    assert_eq!(
        children().len(),
        1,
        "the session's pid 1 is the zygote's child"
    );
    // The zygote joined the session's cgroups only to clone pid 1 there: it is back in its own
    // (this process's), so the session's limits and its kill do not reach it.
    let cgroups =
        |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    assert_eq!(cgroups(&pid.to_string()), cgroups("self"));
    let pid1 = children()[0].clone();
    assert_ne!(
        cgroups(&pid1),
        cgroups("self"),
        "positive control: pid 1 is elsewhere"
    );
    engine.sessions().delete(&id).expect("delete");
    // The zygote reaps its children within its 200 ms poll.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !children().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(children(), Vec::<String>::new(), "left behind or unreaped");
    // The session's kill did not reach the zygote.
    assert!(matches!(engine.zygote_status(), ZygoteStatus::Ready { pid: p, .. } if p == pid));
    let next = create(&engine);
    assert!(preloaded(&engine, &next));
}

/// Sandboxes are cloned from the zygote's own copy of the host's mount namespace, which holds
/// no workspace: not those mounted after it started (each request brings its workspace's
/// mount, detached), nor those mounted before (a restarted zygote detaches them), so a clone
/// copies a short, fixed list of mounts however many sessions live. And each session still
/// gets its own workspace, the host's.
#[test]
fn the_zygote_clones_sandboxes_from_a_namespace_without_workspaces() {
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let ZygoteStatus::Ready { pid, .. } = engine.zygote_status() else {
        panic!("not ready");
    };
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("ns");
    assert_ne!(
        ns(&pid.to_string()),
        ns("self"),
        "the zygote's own namespace"
    );
    let workspaces = std::fs::canonicalize(engine.config().workspaces_dir()).expect("dir");
    // Spare workspace images (when workspaces are on disk) are mounted there ahead of use.
    let images = engine.config().workspace_images_dir();
    let images = std::fs::canonicalize(&images).unwrap_or(images);
    let a = create(&engine);
    assert!(preloaded(&engine, &a));
    exec(&engine, &a, "open('a.txt', 'w').write('from a')");
    let a_dir = workspaces.join(&a);
    assert_eq!(
        std::fs::read_to_string(a_dir.join("a.txt")).expect("a.txt on the host"),
        "from a"
    );
    // Positive control: the host has the workspace mounted.
    assert!(common::mount_points("self").contains(&a_dir), "{a_dir:?}");
    let in_zygote = |pid: u32| -> Vec<_> {
        common::mount_points(&pid.to_string())
            .into_iter()
            .filter(|p| p.starts_with(&workspaces) || p.starts_with(&images))
            .collect()
    };
    assert_eq!(in_zygote(pid), Vec::<std::path::PathBuf>::new());

    // A new zygote starts while `a`'s workspace is mounted, and drops it from its namespace.
    // SAFETY: killing the zygote process this engine started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    let status = engine.wait_for_zygote(Duration::from_secs(180));
    let ZygoteStatus::Ready { pid: new_pid, .. } = status else {
        panic!("no new zygote: {status:?}");
    };
    assert_ne!(new_pid, pid);
    assert!(common::mount_points("self").contains(&a_dir), "{a_dir:?}");
    assert_eq!(in_zygote(new_pid), Vec::<std::path::PathBuf>::new());
    let b = create(&engine);
    assert!(preloaded(&engine, &b));
    let has = |id: &str, name: &str| {
        let code = format!("import os\nos.path.exists('/workspace/{name}')");
        main_text(&exec(&engine, id, &code))
    };
    assert_eq!(has(&b, "a.txt"), "False", "b sees its own workspace");
    exec(&engine, &b, "open('b.txt', 'w').write('from b')");
    assert_eq!(has(&b, "b.txt"), "True");
    assert_eq!(has(&a, "a.txt"), "True", "a still sees its own");
    assert_eq!(has(&a, "b.txt"), "False");
    assert_eq!(
        std::fs::read_to_string(workspaces.join(&b).join("b.txt")).expect("b.txt on the host"),
        "from b"
    );
}

/// The session workspaces on disk: a warm session has its own before anyone asks for it.
fn workspace_ids(engine: &runcell_engine::Engine) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(engine.config().workspaces_dir())
        .expect("workspaces dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("ses_"))
        .collect()
}

/// A zygote engine keeping `n` warm sessions, once they are ready.
fn warm_engine(n: usize) -> runcell_engine::testing::TestEngine {
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    engine.sessions().start_warm_pool(n);
    wait_warm(&engine, n);
    engine
}

fn wait_warm(engine: &runcell_engine::Engine, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while engine.sessions().warm_ready() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {n} warm sessions after 60 s",
            engine.sessions().warm_ready()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The children of the engine's zygote: the pid 1s of the sessions it forked.
fn zygote_children(engine: &runcell_engine::Engine) -> Vec<i32> {
    let ZygoteStatus::Ready { pid, .. } = engine.zygote_status() else {
        panic!("not ready");
    };
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().expect("pid"))
        .collect()
}

#[test]
fn warm_sessions_are_handed_out_once_refilled_and_isolated() {
    use std::os::unix::fs::MetadataExt;
    let engine = warm_engine(2);
    let warm = workspace_ids(&engine);
    assert_eq!(warm.len(), 2, "{warm:?}");
    let a = create(&engine);
    let b = create(&engine);
    assert!(
        warm.contains(&a) && warm.contains(&b) && a != b,
        "two default creates take the two warm sessions: {a} {b} {warm:?}"
    );
    assert!(preloaded(&engine, &a) && preloaded(&engine, &b));
    // Each is handed out once; the pool refills with new sessions.
    wait_warm(&engine, 2);
    let now = workspace_ids(&engine);
    assert_eq!(now.len(), 4, "{now:?}");
    assert_eq!(now.difference(&warm).count(), 2, "{now:?}");
    // Separate host uids, workspaces, and everything else.
    let owner = |id: &str| {
        std::fs::metadata(engine.workspace_path(id))
            .expect("workspace")
            .uid()
    };
    assert_ne!(owner(&a), owner(&b));
    traces_stay_in_their_session(&engine, &a, &b);
    // Each was reseeded when it was forked, not when it was handed out, and still differs.
    let draw = "import random, numpy\n(random.getrandbits(64), int(numpy.random.randint(1 << 62)))";
    assert_ne!(
        main_text(&exec(&engine, &a, draw)),
        main_text(&exec(&engine, &b, draw))
    );
}

#[test]
fn requests_the_warm_sessions_do_not_fit_are_forked() {
    let engine = warm_engine(1);
    let warm = workspace_ids(&engine);
    let create_with = |req: CreateSession| engine.sessions().create(req).expect("create");
    // An environment is fixed when the kernel starts: a fork of its own.
    let with_env = create_with(CreateSession {
        env: [("RUNCELL_TEST_VAR".to_owned(), "forty-two".to_owned())].into(),
        ..CreateSession::default()
    });
    assert!(!warm.contains(&with_env.id));
    assert_eq!(
        main_text(&exec(
            &engine,
            &with_env.id,
            "import os\nos.environ['RUNCELL_TEST_VAR']"
        )),
        "'forty-two'"
    );
    // So are the sandbox's limits.
    let bigger = create_with(CreateSession {
        limits: runcell_engine::LimitsRequest {
            memory_mb: Some(512),
            ..Default::default()
        },
        ..CreateSession::default()
    });
    assert!(!warm.contains(&bigger.id));
    assert_eq!(bigger.limits.memory_mb, 512);
    assert_eq!(
        engine.sessions().warm_ready(),
        1,
        "the warm one is untouched"
    );
    // Timeouts are the session's own: the warm session fits, with the requested timeouts.
    let timeouts = create_with(CreateSession {
        limits: runcell_engine::LimitsRequest {
            exec_timeout_s: Some(5),
            idle_timeout_s: Some(60),
            ..Default::default()
        },
        ..CreateSession::default()
    });
    assert!(warm.contains(&timeouts.id), "{warm:?} {}", timeouts.id);
    assert_eq!(
        (
            timeouts.limits.exec_timeout_s,
            timeouts.limits.idle_timeout_s
        ),
        (5, 60)
    );
    let slow = engine
        .sessions()
        .execute(&timeouts.id, "import time\ntime.sleep(30)", None, None)
        .expect("execute");
    assert_eq!(slow.status, ExecutionStatus::Timeout, "{slow:?}");
}

#[test]
fn a_warm_session_that_died_is_not_handed_out() {
    let engine = warm_engine(1);
    let warm = workspace_ids(&engine);
    let dead = warm.iter().next().expect("one warm session").clone();
    let pid1 = zygote_children(&engine);
    assert_eq!(pid1.len(), 1, "{pid1:?}");
    // SAFETY: killing the warm session's pid 1 (its whole sandbox goes with it).
    assert_eq!(unsafe { libc::kill(pid1[0], libc::SIGKILL) }, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while zygote_children(&engine).contains(&pid1[0]) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let id = create(&engine);
    assert_ne!(id, dead, "a dead warm session was handed out");
    assert_eq!(main_text(&exec(&engine, &id, "1 + 1")), "2");
    // The dead one was discarded with its workspace.
    assert!(!workspace_ids(&engine).contains(&dead));
}

#[test]
fn shutdown_ends_the_warm_sessions() {
    let engine = warm_engine(2);
    assert_eq!(
        zygote_children(&engine).len(),
        2,
        "control: two warm sandboxes"
    );
    engine.sessions().shutdown();
    assert_eq!(engine.sessions().warm_ready(), 0);
    assert_eq!(
        workspace_ids(&engine),
        Default::default(),
        "workspaces left"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !zygote_children(&engine).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        zygote_children(&engine),
        Vec::<i32>::new(),
        "sandboxes left"
    );
    // Nothing refills after a shutdown.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(engine.sessions().warm_ready(), 0);
}

/// A preload naming modules the runtime lacks (the default preload's scikit-learn on a runtime
/// without it): the zygote leaves them out and starts, so sessions are still forked, not cold.
#[test]
fn a_preload_module_the_runtime_lacks_is_skipped_and_the_zygote_starts() {
    let mut config =
        runcell_engine::testing::engine_config(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let mut preload: Vec<String> = runcell_engine::DEFAULT_PRELOAD
        .iter()
        .map(|m| m.to_string())
        .collect();
    preload.insert(1, "runcell_no_such_module".into());
    preload.push("json.runcell_no_such_submodule".into());
    config.preload = Some(preload);
    let engine =
        runcell_engine::testing::TestEngine(runcell_engine::Engine::new(config).expect("engine"));
    let status = engine.wait_for_zygote(Duration::from_secs(180));
    let ZygoteStatus::Ready {
        preloaded: held, ..
    } = &status
    else {
        panic!("the zygote did not start: {status:?}");
    };
    // The control: every module that exists is preloaded, in order; only the missing two
    // are left out.
    let expected: Vec<String> = runcell_engine::DEFAULT_PRELOAD
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(held, &expected);
    let s = engine
        .sessions()
        .create(CreateSession::default())
        .expect("create");
    assert_eq!(s.start, runcell_engine::Start::Zygote, "{s:?}");
    assert!(preloaded(&engine, &s.id), "pandas is in the forked session");
    let e = engine
        .sessions()
        .execute(&s.id, "import runcell_no_such_module", None, None)
        .expect("execute");
    assert_eq!(e.status, ExecutionStatus::Error, "{e:?}");
    assert_eq!(
        e.error.as_ref().map(|x| x.name.as_str()),
        Some("ModuleNotFoundError"),
        "{e:?}"
    );
}

/// The zygote renders one figure before it serves (so that matplotlib's first-render state is
/// shared): a session still starts with no figure and figure number 1, holds no descriptor of
/// a font file the zygote opened (a sandbox's confinement would have closed it under
/// FreeType's lazy reads), and renders text (titles, labels, a legend: fonts it opens itself)
/// to a whole PNG, in a session and in a one-shot alike. The zygote's heap, moved onto huge
/// pages where the kernel can, changes nothing the session sees.
#[test]
fn zygote_sessions_render_text_after_the_zygotes_warm_up() {
    let engine =
        runcell_engine::testing::zygote_engine(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let id = create(&engine);
    assert!(preloaded(&engine, &id));
    // Positive control for the warm-up: the zygote imported the Agg backend while rendering,
    // which pyplot's import alone does not.
    assert_eq!(
        main_text(&exec(
            &engine,
            &id,
            "import sys\n'matplotlib.backends.backend_agg' in sys.modules"
        )),
        "True"
    );
    assert_eq!(
        main_text(&exec(
            &engine,
            &id,
            "import matplotlib.pyplot as plt\nplt.get_fignums()"
        )),
        "[]"
    );
    let fonts = "import os\nsorted(t for t in (os.readlink(f'/proc/self/fd/{f}') for f in os.listdir('/proc/self/fd') if os.path.exists(f'/proc/self/fd/{f}')) if t.endswith(('.ttf', '.otf', '.afm')))";
    assert_eq!(main_text(&exec(&engine, &id, fonts)), "[]");
    let render = "import io, matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nn = fig.number\nax.plot([1, 2, 3], label='series')\nax.set_title('A title with text')\nax.set_xlabel('x label')\nax.legend()\nbuf = io.BytesIO()\nfig.savefig(buf, format='png', bbox_inches='tight')\nplt.close(fig)\ndata = buf.getvalue()\n(n, data[:8] == b'\\x89PNG\\r\\n\\x1a\\n', len(data) > 5000)";
    assert_eq!(main_text(&exec(&engine, &id, render)), "(1, True, True)");
    // Twice: the second render reuses the fonts the first opened in this session.
    assert_eq!(main_text(&exec(&engine, &id, render)), "(1, True, True)");

    let mut req = runcell_engine::OneShot::new(
        runcell_engine::Language::Python,
        render.replace("\n(n, ", "\nprint(n, "),
    );
    req.start = runcell_engine::Start::Zygote;
    let out = engine.run_once(&req, &mut |_, _| {}).expect("one-shot");
    assert_eq!(
        (out.execution.status, out.execution.stdout.as_str()),
        (ExecutionStatus::Ok, "1 True True\n"),
        "{:?}",
        out.execution
    );
}

/// Whether this session's heap is marked mergeable for KSM (`mg` in its VmFlags), from inside.
const HEAP_MERGEABLE: &str = "def heap_mergeable():\n    in_heap = False\n    for line in open('/proc/self/smaps'):\n        head = line.split()[0]\n        if not head.endswith(':'):\n            in_heap = line.rstrip().endswith('[heap]')\n        elif in_heap and head == 'VmFlags:':\n            return 'mg' in line.split()[1:]\nimport os, sys\n(heap_mergeable(), sys.modules['runcell_kernel']._merge_marked is not None and sys.modules['runcell_kernel']._merge_marked > 0, 'RUNCELL_ZYGOTE_MERGE_PAGES' in os.environ)";

/// `serve --merge-session-pages`: the zygote marks its memory mergeable once everything is
/// preloaded, and its sessions inherit the marking (KSM may then merge their identical
/// copies); without it nothing is marked. Neither session sees the zygote's switch.
#[test]
fn merge_session_pages_marks_the_zygotes_memory_only_when_asked() {
    if !std::path::Path::new("/sys/kernel/mm/ksm").exists() {
        eprintln!("skipped: this kernel has no KSM");
        return;
    }
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let plain = runcell_engine::testing::zygote_engine(cache);
    let mut config = runcell_engine::testing::engine_config(cache);
    config.preload = Some(
        runcell_engine::DEFAULT_PRELOAD
            .iter()
            .map(|m| m.to_string())
            .collect(),
    );
    config.merge_session_pages = true;
    let merging =
        runcell_engine::testing::TestEngine(runcell_engine::Engine::new(config).expect("engine"));
    assert!(matches!(
        merging.wait_for_zygote(Duration::from_secs(180)),
        ZygoteStatus::Ready { .. }
    ));
    let (a, b) = (create(&merging), create(&plain));
    assert!(preloaded(&merging, &a) && preloaded(&plain, &b));
    assert_eq!(
        main_text(&exec(&merging, &a, HEAP_MERGEABLE)),
        "(True, True, False)"
    );
    assert_eq!(
        main_text(&exec(&plain, &b, HEAP_MERGEABLE)),
        "(False, False, False)"
    );
    // Sessions on marked memory compute as before.
    let cell =
        "import numpy as np, pandas as pd\nfloat(pd.DataFrame({'x': np.arange(10)}).x.sum())";
    assert_eq!(main_text(&exec(&merging, &a, cell)), "45.0");
}
