//! The sandbox crate on its own, through its public API and the `runcell-sandbox-init` helper.
//! The test harness is multi-threaded, so these runs take the exec'd-helper path (the CLI's
//! tests take the forked one).

use std::time::Duration;

use runcell_sandbox::{
    ExitStatus, KillReason, Launch, Limits, RunOptions, Sandbox, SandboxError, Stream, UidLease,
    Workspace,
};

fn sandbox() -> Sandbox {
    Sandbox::new(env!("CARGO_BIN_EXE_runcell-sandbox-init").into()).expect("sandbox")
}

fn workspace(dir: &tempfile::TempDir, size: u64) -> Workspace {
    let lease = UidLease::acquire(&dir.path().join("uids")).expect("lease");
    Workspace::create(&dir.path().join("ws"), size, lease).expect("workspace")
}

fn launch<'a>(ws: &'a Workspace, argv: &[&str]) -> Launch<'a> {
    Launch {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        workspace: ws,
        ro_binds: vec![],
        limits: Limits::default(),
        channel: false,
        egress_port: None,
    }
}

#[test]
fn runs_a_program_with_stdin_and_streams_its_output() {
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 16 << 20);
    ws.write_file("in/data.txt", b"from the host\n")
        .expect("write");
    let mut streamed = Vec::new();
    let out = sandbox()
        .run(
            &launch(
                &ws,
                &[
                    "/bin/sh",
                    "-c",
                    "cat in/data.txt; cat; echo err >&2; id -u; exit 3",
                ],
            ),
            &RunOptions {
                stdin: b"via stdin\n".to_vec(),
                ..RunOptions::default()
            },
            &mut |s, d| streamed.push((s, d.to_vec())),
        )
        .expect("run");
    assert_eq!(out.exit, ExitStatus::Code(3));
    assert_eq!(out.killed_by, None);
    assert_eq!(out.stdout.render(), "from the host\nvia stdin\n1000\n");
    assert_eq!(out.stderr.render(), "err\n");
    let live: Vec<u8> = streamed
        .iter()
        .filter(|(s, _)| *s == Stream::Stdout)
        .flat_map(|(_, d)| d.clone())
        .collect();
    assert_eq!(live, b"from the host\nvia stdin\n1000\n");
    assert!(out.usage.wall > Duration::ZERO);
}

#[test]
fn setup_failures_are_reported_with_their_step() {
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 1 << 20);
    let err = sandbox()
        .run(
            &launch(&ws, &["no-such-program"]),
            &RunOptions::default(),
            &mut |_, _| {},
        )
        .expect_err("missing program");
    match err {
        SandboxError::Setup(msg) => {
            assert_eq!(msg, "step 8 (exec): no-such-program: command not found")
        }
        other => panic!("{other:?}"),
    }
    let mut l = launch(&ws, &["/bin/true"]);
    l.ro_binds = vec![runcell_sandbox::Bind {
        source: "/nonexistent/source".into(),
        target: "/opt/x".into(),
    }];
    let err = sandbox()
        .run(&l, &RunOptions::default(), &mut |_, _| {})
        .expect_err("missing bind");
    let msg = err.to_string();
    assert!(
        msg.starts_with("the sandbox could not be set up: step 3 (mounts): cannot find bind source /nonexistent/source"),
        "{msg}"
    );
}

#[test]
fn workspace_is_size_capped_by_the_kernel() {
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 4 << 20);
    let out = sandbox()
        .run(
            &launch(
                &ws,
                &["/bin/sh", "-c", "head -c 8M /dev/zero > big; echo rc=$?; head -c 1M /dev/zero > small; echo rc=$?"],
            ),
            &RunOptions::default(),
            &mut |_, _| {},
        )
        .expect("run");
    let stdout = out.stdout.render();
    assert_eq!(
        stdout, "rc=1\nrc=1\n",
        "both writes hit the 4 MiB cap: {out:?}"
    );
    assert!(out.stderr.render().contains("No space left on device"));
    let files = ws.snapshot().expect("snapshot").files;
    assert!(files["big"].size <= 4 << 20);
}

#[test]
fn planted_symlinks_are_never_followed_by_the_host() {
    let dir = tempfile::tempdir().expect("tmp");
    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, "host secret").expect("write");
    let ws = workspace(&dir, 1 << 20);
    let target = outside.to_str().expect("utf8");
    let script = format!("ln -s {target} link.txt; mkdir d; ln -s / d/root; ln -s /etc sub");
    let out = sandbox()
        .run(
            &launch(&ws, &["/bin/sh", "-c", &script]),
            &RunOptions::default(),
            &mut |_, _| {},
        )
        .expect("run");
    assert_eq!(out.exit, ExitStatus::Code(0), "{out:?}");
    // Writing through the planted links fails instead of touching the host.
    assert!(ws.write_file("link.txt", b"x").is_err());
    assert!(ws.write_file("sub/passwd", b"x").is_err());
    assert!(ws.write_file("d/root/etc/x", b"x").is_err());
    assert_eq!(
        std::fs::read_to_string(&outside).expect("read"),
        "host secret"
    );
    // Listing skips them.
    let files = ws.snapshot().expect("snapshot").files;
    assert!(files.is_empty(), "{files:?}");
}

#[test]
fn repeated_snapshots_see_every_change_at_every_depth() {
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 1 << 20);
    let run = |script: &str| {
        let out = sandbox()
            .run(
                &launch(&ws, &["/bin/sh", "-c", script]),
                &RunOptions::default(),
                &mut |_, _| {},
            )
            .expect("run");
        assert_eq!(out.exit, ExitStatus::Code(0), "{out:?}");
    };
    let names = |ws: &runcell_sandbox::Workspace| -> Vec<(String, u64)> {
        let files = ws.snapshot().expect("snapshot");
        assert!(files.complete);
        files.files.into_iter().map(|(k, v)| (k, v.size)).collect()
    };
    assert_eq!(names(&ws), Vec::<(String, u64)>::new());
    run("echo hi > a.txt; mkdir -p d/e; printf 12345 > d/e/deep.txt");
    assert_eq!(
        names(&ws),
        [("a.txt".to_owned(), 3), ("d/e/deep.txt".to_owned(), 5)]
    );
    // The second and later snapshots read the same open root again from its start.
    run("rm a.txt; printf 1234567 > d/e/deep.txt; echo x > b.txt");
    assert_eq!(
        names(&ws),
        [("b.txt".to_owned(), 2), ("d/e/deep.txt".to_owned(), 7)]
    );
    run("rm -r d b.txt");
    assert_eq!(names(&ws), Vec::<(String, u64)>::new());
}

#[test]
fn deadline_kills_the_tree_and_reports_timeout() {
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 1 << 20);
    let out = sandbox()
        .run(
            &launch(
                &ws,
                &["/bin/sh", "-c", "(trap '' TERM; sleep 100) & sleep 100"],
            ),
            &RunOptions {
                timeout: Duration::from_millis(500),
                ..RunOptions::default()
            },
            &mut |_, _| {},
        )
        .expect("run");
    assert_eq!(out.killed_by, Some(KillReason::Timeout));
    assert_eq!(out.exit, ExitStatus::Signal(libc_sigkill()));
    assert!(out.usage.wall < Duration::from_secs(5));
}

/// A running sandbox's stdout, read until the program closes it.
fn stdout_to_end(running: &mut runcell_sandbox::Running) -> String {
    use std::io::Read;
    let mut out = String::new();
    running
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("stdout");
    out
}

fn libc_sigkill() -> i32 {
    9
}

#[test]
fn the_channel_reaches_the_program_at_fd_3_and_closes_with_it() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 1 << 20);
    let mut l = launch(
        &ws,
        &[
            "/usr/bin/python3",
            "-c",
            "import os\nmsg = os.read(3, 100)\nos.write(3, b'echo:' + msg)\nprint(sorted(os.listdir('/proc/self/fd')))",
        ],
    );
    l.channel = true;
    let sandbox = sandbox();
    let mut running = sandbox.spawn(&l).expect("spawn");
    let mut chan = running.channel.take().expect("channel");
    chan.write_all(b"ping").expect("write");
    let mut reply = Vec::new();
    chan.read_to_end(&mut reply)
        .expect("read until the program exits");
    assert_eq!(reply, b"echo:ping");
    let out = stdout_to_end(&mut running);
    drop(running.stdin.take());
    let finished = running.finish().expect("finish");
    assert_eq!(finished.exit, ExitStatus::Code(0));
    // stdio, the channel, and the descriptor listdir itself holds: nothing else leaked in.
    assert_eq!(out.trim(), "['0', '1', '2', '3', '4']");
}

/// With an egress port, pid 1 listens on the sandbox's loopback before the program starts; the
/// host takes the socket and serves it, the program reaches it at once (its connection waits in
/// the backlog), never holds the descriptor, and cannot bind the port itself. Without one, the
/// same connect is refused: no socket exists.
#[test]
fn the_egress_socket_is_pid_1s_and_served_by_the_host() {
    use std::io::{Read, Write};
    let probe = "import socket, os\n\
        s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n\
        s.sendall(b'ping')\n\
        print(s.recv(100).decode())\n\
        b = socket.socket()\n\
        try:\n    b.bind(('127.0.0.1', 3128)); print('bound')\n\
        except OSError as e: print('bind', e.errno)\n\
        print(sorted(os.listdir('/proc/self/fd')))";
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 1 << 20);
    let mut l = launch(&ws, &["/usr/bin/python3", "-c", probe]);
    l.egress_port = Some(3128);
    let sandbox = sandbox();
    let mut running = sandbox.spawn(&l).expect("spawn");
    let listener = running
        .egress_listener(Duration::from_secs(5))
        .expect("pid 1's socket");
    let (mut conn, _) = listener.accept().expect("accept");
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).expect("read");
    // One write: the program reads once, and two could arrive as two reads.
    conn.write_all(&[b"pong:".as_slice(), &buf].concat())
        .expect("write");
    drop(conn);
    let out = stdout_to_end(&mut running);
    drop(running.stdin.take());
    let finished = running.finish().expect("finish");
    assert_eq!(finished.exit, ExitStatus::Code(0), "{out}");
    assert_eq!(out, "pong:ping\nbind 98\n['0', '1', '2', '3', '4', '5']\n");

    // (0-2, the two sockets, listdir's own: no descriptor 1000.)
    // The control: no port asked, no socket.
    let dir = tempfile::tempdir().expect("tmp");
    let ws = workspace(&dir, 1 << 20);
    let l = launch(
        &ws,
        &[
            "/usr/bin/python3",
            "-c",
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 3128), timeout=5)\nexcept OSError as e: print(e.errno)",
        ],
    );
    let out = sandbox
        .run(&l, &RunOptions::default(), &mut |_, _| {})
        .expect("run");
    assert_eq!(out.stdout.render(), "111\n");
}

/// The mount points `/proc/PID/mountinfo` lists.
fn mount_points(pid: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(std::path::PathBuf::from))
        .collect()
}

/// The exec'd helper of a running sandbox: the parent of its pid 1 (a parent of one of the
/// sandbox's processes whose command line is the init helper's).
fn helper_pid(running: &runcell_sandbox::Running) -> String {
    let parent = |pid: &str| -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        rest.split_whitespace().nth(1).map(str::to_owned)
    };
    for _ in 0..100 {
        for pid in running.pids() {
            if let Some(p) = parent(&pid.to_string()) {
                let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                if cmdline.split(|&b| b == 0).any(|a| a == b"__sandbox-init") {
                    return p;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no helper among the parents of {:?}", running.pids());
}

/// With `spawn_without_mounts_below`, the exec'd helper runs in a mount namespace that holds
/// none of the mounts below the workspaces' directory (here: another sandbox's workspace), so
/// the clone of its pid 1 does not copy them; the sandbox still gets its own workspace, which
/// went along detached. Without it (the positive control), the helper sees the host's mounts,
/// the other workspace included.
#[test]
fn cold_helpers_run_in_a_mount_namespace_without_the_workspaces() {
    let dir = tempfile::tempdir().expect("tmp");
    let workspaces = dir.path().join("workspaces");
    std::fs::create_dir(&workspaces).expect("mkdir");
    let lease = |n: &str| UidLease::acquire(&dir.path().join(n)).expect("lease");
    let other = Workspace::create(&workspaces.join("other"), 1 << 20, lease("u1")).expect("ws");
    other
        .write_file("other.txt", b"not yours\n")
        .expect("write");
    let mine = Workspace::create(&workspaces.join("mine"), 1 << 20, lease("u2")).expect("ws");
    mine.write_file("mine.txt", b"yours\n").expect("write");
    let workspaces = std::fs::canonicalize(&workspaces).expect("canonical");
    // Positive control: the host has both workspaces mounted.
    let host = mount_points("self");
    assert!(host.contains(&workspaces.join("other")), "{host:?}");
    assert!(host.contains(&workspaces.join("mine")), "{host:?}");

    let program = [
        "/bin/sh",
        "-c",
        "cat mine.txt; ls -a /workspace | tr '\\n' ' '; read x || true",
    ];
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("ns");
    for detached in [true, false] {
        let sandbox = if detached {
            sandbox().spawn_without_mounts_below(vec![workspaces.clone()])
        } else {
            sandbox()
        };
        if detached {
            assert_eq!(sandbox.spawn_namespace(), Some(Ok(())), "made as root");
        } else {
            assert_eq!(sandbox.spawn_namespace(), None);
        }
        let mut running = sandbox.spawn(&launch(&mine, &program)).expect("spawn");
        let helper = helper_pid(&running);
        let below: Vec<_> = mount_points(&helper)
            .into_iter()
            .filter(|p| p.starts_with(&workspaces) && *p != workspaces)
            .collect();
        if detached {
            assert_ne!(ns(&helper), ns("self"), "the helper's own namespace");
            assert_eq!(below, Vec::<std::path::PathBuf>::new());
        } else {
            assert_eq!(ns(&helper), ns("self"), "the host's namespace");
            assert!(below.contains(&workspaces.join("other")), "{below:?}");
        }
        drop(running.stdin.take());
        let out = stdout_to_end(&mut running);
        let finished = running.finish().expect("finish");
        assert_eq!(finished.exit, ExitStatus::Code(0), "{out}");
        assert_eq!(out, "yours\n. .. mine.txt ", "detached: {detached}");
    }
}
