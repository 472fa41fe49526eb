//! The Kubernetes manifests in deploy/: every entry point (`kubectl apply -k deploy/`, and each
//! overlay) is rendered and checked by tests/deploy/check.py (what the manifests promise each
//! other: resource lists, patches, selectors, probes, Secrets), then every resource it renders
//! is validated against Kubernetes' own schemas by `kubernetes-validate --strict` (PyPI,
//! pinned in tests/deploy/requirements.txt, in a venv under target/). Where `kubectl` is
//! installed, `kubectl kustomize` renders each entry point too: it must give the same
//! resources, and they are validated the same way.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The oldest Kubernetes the manifests are for, and the newest kubernetes-validate knows.
const VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];
const ENTRIES: [(&str, &str); 3] = [
    ("default", "."),
    ("cloudnative-pg", "overlays/cloudnative-pg"),
    ("external-postgres", "overlays/external-postgres"),
];

fn target_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is target/tmp.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_owned()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deploy")
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// A venv with the pinned validator: made, or made again when the pins changed.
fn venv() -> PathBuf {
    let dir = target_dir().join("deploy-venv");
    let requirements = fixtures().join("requirements.txt");
    let mut pins = std::fs::read(&requirements).expect("requirements.txt");
    pins.extend_from_slice(format!("\n# venv at {}\n", dir.display()).as_bytes());
    let stamp = dir.join("installed-requirements.txt");
    if std::fs::read(&stamp).ok().as_deref() == Some(&pins[..]) {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&dir)
        .status()
        .expect("run python3 -m venv (apt-get install -y python3-venv)");
    assert!(status.success(), "python3 -m venv failed");
    let status = Command::new(dir.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&requirements)
        .status()
        .expect("run pip");
    assert!(
        status.success(),
        "pip install -r {}",
        requirements.display()
    );
    std::fs::write(&stamp, &pins).expect("stamp");
    dir
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Every `*.yaml` under `dir`, validated strictly; a resource without a schema (the
/// CloudNativePG Cluster, checked by check.py instead) is the only warning allowed.
fn validate(venv: &Path, dir: &Path) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("rendered dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "nothing rendered in {}", dir.display());
    for version in VERSIONS {
        let out = run(Command::new(venv.join("bin/kubernetes-validate"))
            .args(["--strict", "-k", version])
            .args(&files));
        for line in out.lines() {
            let schemaless_cluster = line.starts_with("WARN")
                && line.contains("kind Cluster with api version postgresql.cnpg.io/v1");
            assert!(
                line.starts_with("INFO") || schemaless_cluster,
                "kubernetes {version}: {line}"
            );
        }
        let passed = out.lines().filter(|l| l.contains(" passed for ")).count();
        let skipped = out.lines().filter(|l| l.starts_with("WARN")).count();
        assert_eq!(passed + skipped, files.len(), "{out}");
    }
}

/// `kind namespace name` of every resource in a multi-document YAML, via the venv's PyYAML.
fn resources_of(venv: &Path, yaml: &Path) -> BTreeSet<String> {
    let script = "import sys, yaml\nfor d in yaml.safe_load_all(open(sys.argv[1])):\n    \
                  m = d['metadata']\n    print(d['kind'], m.get('namespace', '-'), m['name'])";
    run(Command::new(venv.join("bin/python"))
        .args(["-c", script])
        .arg(yaml))
    .lines()
    .map(str::to_owned)
    .collect()
}

#[test]
fn the_manifests_render_and_validate() {
    let venv = venv();
    let out = tempfile::tempdir().expect("tempdir");
    let listing = run(Command::new(venv.join("bin/python"))
        .arg(fixtures().join("check.py"))
        .arg(deploy_dir())
        .arg(out.path()));
    for (entry, _) in ENTRIES {
        validate(&venv, &out.path().join(entry));
    }
    let kubectl = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !kubectl {
        eprintln!("kubectl is not installed: the manifests were rendered by check.py alone");
        return;
    }
    for (entry, dir) in ENTRIES {
        let rendered = out.path().join(format!("{entry}.kubectl.yaml"));
        let yaml = run(Command::new("kubectl")
            .arg("kustomize")
            .arg(deploy_dir().join(dir)));
        std::fs::write(&rendered, yaml).expect("write");
        let ours: BTreeSet<String> = listing
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{entry} ")))
            .map(str::to_owned)
            .collect();
        assert_eq!(resources_of(&venv, &rendered), ours, "{entry}");
        let split = out.path().join(format!("{entry}.kubectl"));
        std::fs::create_dir(&split).expect("mkdir");
        let script =
            "import sys, yaml\nfor i, d in enumerate(yaml.safe_load_all(open(sys.argv[1]))):\n    \
                      yaml.safe_dump(d, open(f'{sys.argv[2]}/{i:02}.yaml', 'w'))";
        run(Command::new(venv.join("bin/python"))
            .args(["-c", script])
            .arg(&rendered)
            .arg(&split));
        validate(&venv, &split);
    }
}
