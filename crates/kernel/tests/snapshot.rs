//! Snapshots through real sandboxed kernels (issue 17): a session's state written by its
//! kernel, its bytes carried by the host to another session's workspace (as a pause and a
//! resume will), and read back by a cold kernel and by one forked from a preloaded zygote.
//! The host only moves bytes; every refusal comes from the kernel, before any unpickling.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use runcell_kernel::runtime::{Runtimes, SANDBOX_PYTHON_BIN, SANDBOX_PYTHON_PREFIX};
use runcell_kernel::{
    CellOptions, CellStatus, IncompatibleField, Kernel, SnapshotError, SnapshotOptions,
    SnapshotRefusal, BASH, KERNEL_FILES, PYTHON, SANDBOX_KERNEL_DIR,
};
use runcell_sandbox::{Bind, Launch, Limits, Sandbox, UidLease, Workspace, Zygote, ZygoteConfig};

const SNAP: &str = "/workspace/state.snap";
const READY: Duration = Duration::from_secs(60);

/// The init helper the sandbox execs (built on demand when this crate is tested alone).
fn init_exe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        if let Some(p) = runcell_sandbox::find_init_exe() {
            return p;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args([
                "build",
                "-p",
                "runcell-sandbox",
                "--bin",
                "runcell-sandbox-init",
            ])
            .status()
            .expect("cargo build runcell-sandbox-init");
        assert!(status.success(), "cannot build runcell-sandbox-init");
        runcell_sandbox::find_init_exe().expect("runcell-sandbox-init")
    })
    .clone()
}

/// The default runtime (shared with the other kernel tests) and the kernel files, once.
fn setup() -> &'static (PathBuf, PathBuf, String) {
    static SETUP: OnceLock<(PathBuf, PathBuf, String)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let info = Runtimes::new(&tmp.join("runcell-test-runtimes"))
            .ensure_default(&mut |_| {})
            .expect("install the default runtime");
        let kernels = tempfile::Builder::new()
            .prefix("runcell-snapshot-kernels-")
            .tempdir()
            .expect("tempdir")
            .keep();
        for (name, code) in KERNEL_FILES {
            std::fs::write(kernels.join(name), code).expect("write kernel");
            std::fs::set_permissions(kernels.join(name), std::fs::Permissions::from_mode(0o644))
                .expect("chmod");
        }
        // The sandbox user reads them through the "other" bits.
        std::fs::set_permissions(&kernels, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let minor: Vec<&str> = info.python_version.split('.').take(2).collect();
        (info.path, kernels, minor.join("."))
    })
}

fn env() -> Vec<(String, String)> {
    [
        ("PATH", format!("{SANDBOX_PYTHON_PREFIX}/bin:/usr/bin:/bin")),
        ("HOME", "/tmp".into()),
        ("LANG", "C.UTF-8".into()),
        ("PYTHONDONTWRITEBYTECODE", "1".into()),
        ("MPLBACKEND", "Agg".into()),
        ("MPLCONFIGDIR", "/tmp/.matplotlib".into()),
        ("OPENBLAS_NUM_THREADS", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn binds() -> Vec<Bind> {
    let (runtime, kernels, _) = setup();
    vec![
        Bind {
            source: runtime.clone(),
            target: SANDBOX_PYTHON_PREFIX.into(),
        },
        Bind {
            source: kernels.clone(),
            target: SANDBOX_KERNEL_DIR.into(),
        },
    ]
}

/// A session: its workspace (with its own temporary directory) and its kernel.
struct Session {
    kernel: Kernel,
    ws: Workspace,
    _dir: tempfile::TempDir,
}

enum Start<'a> {
    Cold(&'a str),
    Zygote(&'a Zygote),
}

fn session(sandbox: &Sandbox, start: Start<'_>) -> Session {
    let dir = tempfile::tempdir().expect("tmp");
    let lease = UidLease::acquire(&dir.path().join("uids")).expect("lease");
    let ws = Workspace::create(&dir.path().join("ws"), 256 << 20, lease).expect("workspace");
    let program = match start {
        Start::Cold("bash") => BASH.command(SANDBOX_PYTHON_BIN),
        _ => PYTHON.command(SANDBOX_PYTHON_BIN),
    };
    let launch = Launch {
        argv: program,
        env: env(),
        workspace: &ws,
        ro_binds: binds(),
        limits: Limits::default(),
        channel: true,
        egress_port: None,
    };
    let kernel = match start {
        Start::Cold(_) => Kernel::start(sandbox, &launch, READY),
        Start::Zygote(z) => Kernel::start_in(sandbox, z, &launch, READY),
    }
    .expect("start the kernel");
    Session {
        kernel,
        ws,
        _dir: dir,
    }
}

fn zygote() -> Zygote {
    let (runtime, kernels, minor) = setup();
    let config = ZygoteConfig {
        python: format!("{SANDBOX_PYTHON_PREFIX}/bin/python3").into(),
        libpython: runcell_sandbox::zygote::libpython_for(minor),
        binds: vec![
            (runtime.clone(), SANDBOX_PYTHON_PREFIX.into()),
            (kernels.clone(), SANDBOX_KERNEL_DIR.into()),
        ],
        env: env(),
        kernel_dir: SANDBOX_KERNEL_DIR.into(),
        kernel_module: PYTHON.module().into(),
        preload: vec!["numpy".into(), "pandas".into()],
        detach_below: Vec::new(),
    };
    Zygote::start(&init_exe(), &config, Duration::from_secs(180)).expect("zygote")
}

/// The main result's text of a cell that must succeed.
fn run(s: &mut Session, code: &str) -> String {
    let out = s
        .kernel
        .execute("ex", code, &CellOptions::default(), &mut |_| {})
        .expect("execute");
    assert_eq!(
        out.status,
        CellStatus::Ok,
        "{code}: {:?} {}",
        out.error,
        out.stderr.render()
    );
    out.results
        .iter()
        .find(|(main, _)| *main)
        .and_then(|(_, data)| data.get("text/plain").cloned())
        .unwrap_or_default()
}

/// The host's part of a pause and resume: the snapshot's bytes, out of one workspace and
/// into another, never looked into.
fn carry(from: &Session, to: &Session) -> Vec<u8> {
    let bytes = from.ws.read_file("state.snap", 1 << 30).expect("read");
    to.ws.write_file("state.snap", &bytes).expect("write");
    bytes
}

const STATE: &str = r#"
import numpy as np
import pandas as pd
from math import sqrt
from sklearn.linear_model import LogisticRegression
rng = np.random.default_rng(0)
df = pd.DataFrame({"a": rng.normal(size=500), "b": rng.integers(0, 3, 500)})
arr = np.arange(6.0)
y = 2
def f(x):
    return x * y
g = lambda x: sqrt(x) + f(1)
class Point:
    def __init__(self, x):
        self.x = x
p = Point(4)
model = LogisticRegression().fit(df[["a", "b"]].to_numpy(), (df["a"] > 0).astype(int))
log = open("log.txt", "w")
gen = (i for i in range(3))
"#;

const CHECK: &str = "(df.shape, float(arr.sum()), f(3), g(9), isinstance(p, Point), p.x, \
                     model.predict(df[['a', 'b']].to_numpy()[:5]).tolist(), pd.__name__)";

#[test]
fn python_state_restores_into_a_cold_and_a_zygote_forked_kernel() {
    let sandbox = Sandbox::new(init_exe()).expect("sandbox");
    let opts = SnapshotOptions::default();
    let mut a = session(&sandbox, Start::Cold("python"));
    run(&mut a, STATE);
    let expected = run(&mut a, CHECK);
    let report = a.kernel.snapshot(SNAP, &opts).expect("snapshot");
    let skipped: Vec<(&str, &str)> = report
        .skipped
        .iter()
        .map(|s| (s.name.as_str(), s.reason.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [("log", "open file 'log.txt'"), ("gen", "generator")],
        "{report:?}"
    );
    for name in [
        "np", "pd", "sqrt", "df", "arr", "f", "g", "Point", "p", "model",
    ] {
        assert!(report.names.iter().any(|n| n == name), "{name}: {report:?}");
    }
    let zygote = zygote();
    for start in [Start::Zygote(&zygote), Start::Cold("python")] {
        let mut b = session(&sandbox, start);
        let bytes = carry(&a, &b);
        assert_eq!(bytes.len() as u64, report.bytes);
        let restored = b.kernel.restore(SNAP, &opts).expect("restore");
        assert!(restored.skipped.is_empty(), "{restored:?}");
        assert_eq!(restored.names.len(), report.names.len());
        assert_eq!(run(&mut b, CHECK), expected);
        // The restored function reads the session's namespace.
        run(&mut b, "y = 10");
        assert_eq!(run(&mut b, "f(3)"), "30");
        // Not an execution: the session's count is its own.
        assert_eq!(b.kernel.execution_count(), 3);
    }
}

#[test]
fn damaged_foreign_and_missing_snapshots_are_refused_by_the_kernel() {
    let sandbox = Sandbox::new(init_exe()).expect("sandbox");
    let opts = SnapshotOptions::default();
    let mut a = session(&sandbox, Start::Cold("python"));
    run(&mut a, "x = list(range(100))");
    a.kernel.snapshot(SNAP, &opts).expect("snapshot");
    let good = a.ws.read_file("state.snap", 1 << 20).expect("read");
    let mut b = session(&sandbox, Start::Cold("python"));
    let mut refused = |data: Option<&[u8]>| {
        if let Some(d) = data {
            b.ws.write_file("state.snap", d).expect("write");
        } else {
            let _ = b.ws.delete("state.snap");
        }
        match b.kernel.restore(SNAP, &opts) {
            Err(SnapshotError::Refused(r)) => r,
            other => panic!("{other:?}"),
        }
    };
    assert!(matches!(
        refused(Some(&good[..good.len() - 7])),
        SnapshotRefusal::Truncated { .. }
    ));
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x20;
    assert!(matches!(
        refused(Some(&flipped)),
        SnapshotRefusal::Corrupt { .. }
    ));
    assert!(matches!(
        refused(Some(b"not a snapshot at all")),
        SnapshotRefusal::Corrupt { .. }
    ));
    let mut other_format = good.clone();
    other_format[16..20].copy_from_slice(&7u32.to_be_bytes());
    assert_eq!(
        refused(Some(&other_format)),
        SnapshotRefusal::Incompatible {
            field: IncompatibleField::FormatVersion,
            found: "7".into(),
            expected: "1".into(),
        }
    );
    assert!(matches!(refused(None), SnapshotRefusal::Missing { .. }));
    // Nothing was loaded, and the kernel lives on.
    assert!(run(&mut b, "'x' in globals()") == "False");
    assert!(matches!(
        b.kernel.restore("relative/path", &opts),
        Err(SnapshotError::InvalidPath(_))
    ));
    // A snapshot where the sandbox cannot write is the kernel's error, not a crash.
    match a.kernel.snapshot("/usr/state.snap", &opts) {
        Err(SnapshotError::Failed { name, value }) => {
            assert_eq!(name, "SnapshotError");
            assert!(value.contains("Error"), "{value}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(run(&mut a, "len(x)"), "100");
}

#[test]
fn a_snapshot_interrupted_at_its_deadline_leaves_the_kernel_and_the_old_file() {
    let sandbox = Sandbox::new(init_exe()).expect("sandbox");
    let mut a = session(&sandbox, Start::Cold("python"));
    run(
        &mut a,
        "import time\nclass Slow:\n    def __reduce__(self):\n        time.sleep(30)\n        return (int, ())\nok = 1",
    );
    a.kernel
        .snapshot(SNAP, &SnapshotOptions::default())
        .expect("snapshot");
    let before = a.ws.read_file("state.snap", 1 << 20).expect("read");
    run(&mut a, "slow = Slow()");
    let opts = SnapshotOptions {
        timeout: Duration::from_millis(300),
        grace: Duration::from_secs(5),
    };
    assert!(matches!(
        a.kernel.snapshot(SNAP, &opts),
        Err(SnapshotError::TimedOut(_))
    ));
    assert_eq!(a.ws.read_file("state.snap", 1 << 20).expect("read"), before);
    assert_eq!(run(&mut a, "ok"), "1");
}

#[test]
fn bash_state_restores_into_a_fresh_sandboxed_kernel() {
    let sandbox = Sandbox::new(init_exe()).expect("sandbox");
    let opts = SnapshotOptions::default();
    let mut a = session(&sandbox, Start::Cold("bash"));
    run(
        &mut a,
        "list=(a 'b c')\nexport TOKEN=t1\nhi() { echo \"hi $1\"; }\nalias say='echo said'\nmkdir -p w && cd w\nreadonly RO=1",
    );
    let report = a.kernel.snapshot(SNAP, &opts).expect("snapshot");
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert_eq!(report.skipped[0].name, "RO");
    let mut b = session(&sandbox, Start::Cold("bash"));
    carry(&a, &b);
    // The workspace's files come back with a resume; the directory must be there for `cd`.
    b.ws.write_file("w/.keep", b"").expect("write");
    let restored = b.kernel.restore(SNAP, &opts).expect("restore");
    assert!(restored.skipped.is_empty(), "{restored:?}");
    let out = b
        .kernel
        .execute(
            "ex",
            "echo \"${list[1]}|$TOKEN|$(hi you)|$(pwd)\"; say",
            &CellOptions::default(),
            &mut |_| {},
        )
        .expect("execute");
    assert_eq!(out.status, CellStatus::Ok, "{:?}", out.error);
    assert_eq!(out.stdout.render(), "b c|t1|hi you|/workspace/w\nsaid\n");
    // A Python snapshot is not a bash one.
    let mut p = session(&sandbox, Start::Cold("python"));
    run(&mut p, "x = 1");
    p.kernel.snapshot(SNAP, &opts).expect("snapshot");
    carry(&p, &b);
    match b.kernel.restore(SNAP, &opts) {
        Err(SnapshotError::Refused(SnapshotRefusal::Incompatible { field, .. })) => {
            assert_eq!(field, IncompatibleField::Language)
        }
        other => panic!("{other:?}"),
    }
}
