//! The bash and JavaScript kernels' own test suites, run under cargo test.

use std::path::Path;
use std::process::Command;

fn check(cmd: &mut Command) {
    let out = cmd.output().expect("run the kernel's test suite");
    assert!(
        out.status.success(),
        "{cmd:?}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bash_kernel_suite_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bash");
    check(
        Command::new("/usr/bin/python3")
            .arg(dir.join("test_runcell_bash_kernel.py"))
            .current_dir(&dir),
    );
}

#[test]
fn bash_snapshot_suite_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bash");
    check(
        Command::new("/usr/bin/python3")
            .arg(dir.join("test_runcell_bash_snapshot.py"))
            .current_dir(&dir),
    );
}

#[test]
fn javascript_kernel_suite_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("javascript");
    check(
        Command::new("/usr/bin/node")
            .args(["--test", "test_runcell_js_kernel.js"])
            .current_dir(&dir),
    );
}
