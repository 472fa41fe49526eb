//! The in-sandbox kernel's own test suite (`python/test_runcell_kernel.py`, stdlib unittest),
//! run with the host's plain python3 and with the default runtime (numpy, pandas,
//! matplotlib), so the pandas and matplotlib hooks are exercised too.

use std::path::Path;
use std::process::Command;

fn run_suite(python: &Path) {
    run_file(python, "test_runcell_kernel.py");
}

/// The snapshot suite (`python/test_runcell_snapshot.py`): with the plain host python3 its
/// cloudpickle, pandas and scikit-learn cases are skipped; the runtime runs them all.
fn run_snapshot_suite(python: &Path) {
    run_file(python, "test_runcell_snapshot.py");
}

fn run_file(python: &Path, file: &str) {
    let suite = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(file);
    let out = Command::new(python)
        .arg(&suite)
        .env("MPLBACKEND", "Agg")
        .env(
            "MPLCONFIGDIR",
            std::env::temp_dir().join("runcell-kernel-test-mpl"),
        )
        .output()
        .expect("run the kernel's test suite");
    assert!(
        out.status.success(),
        "{} {}:\n{}\n{}",
        python.display(),
        suite.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn kernel_suite_passes_with_the_plain_host_python() {
    run_suite(Path::new("/usr/bin/python3"));
}

#[test]
fn kernel_suite_passes_with_the_data_science_runtime() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("runcell-test-runtimes");
    let info = runcell_kernel::runtime::Runtimes::new(&root)
        .ensure_default(&mut |_| {})
        .expect("install the default runtime");
    run_suite(&info.path.join("bin/python3"));
}

#[test]
fn snapshot_suite_passes_with_the_plain_host_python() {
    run_snapshot_suite(Path::new("/usr/bin/python3"));
}

#[test]
fn snapshot_suite_passes_with_the_data_science_runtime() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("runcell-test-runtimes");
    let info = runcell_kernel::runtime::Runtimes::new(&root)
        .ensure_default(&mut |_| {})
        .expect("install the default runtime");
    run_snapshot_suite(&info.path.join("bin/python3"));
}

/// The MCP modules' suite (`python/test_runcell_tools_mcp.py`: names, annotations, argument
/// checks, results, the import hook), with the plain host python3: stdlib only.
#[test]
fn mcp_modules_suite_passes_with_the_plain_host_python() {
    run_file(Path::new("/usr/bin/python3"), "test_runcell_tools_mcp.py");
}
