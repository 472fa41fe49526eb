//! Helpers shared by the CLI's integration tests: run the real `runcell` binary.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod cluster;
pub mod serve;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

pub const PROBES: &str = include_str!("../fixtures/probes.py");

/// One data dir per test binary, removed at exit by the OS's tmp cleaning; workspaces inside it
/// are removed by runcell itself after every run (which the leftover test checks).
pub fn data_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::Builder::new()
            .prefix("runcell-test-")
            .tempdir()
            .expect("tempdir");
        d.keep()
    })
}

pub fn runcell() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data_dir()).env("NO_COLOR", "1");
    c
}

/// Runs `code` with `runcell run --json` and returns the Execution and the exit code.
pub fn run_json(lang: &str, code: &str, extra: &[&str]) -> (Value, i32) {
    let out = run_raw(lang, code, &["--json"], extra);
    assert!(
        out.status.code().is_some(),
        "runcell died of a signal: {out:?}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "runcell --json printed no Execution ({e}): stdout={stdout} stderr={}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out.status.code().unwrap_or(-1))
}

pub fn run_raw(lang: &str, code: &str, flags: &[&str], extra: &[&str]) -> Output {
    let mut child = runcell()
        .args(["run", "--lang", lang])
        .args(flags)
        .args(extra)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runcell");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(code.as_bytes()).expect("write program");
    }
    child.wait_with_output().expect("wait runcell")
}

/// A Python program that runs the given probes inside the sandbox, one JSON line each.
pub fn probe_program(probes: &[(&str, Vec<String>)]) -> String {
    let list: Vec<Value> = probes
        .iter()
        .map(|(n, a)| serde_json::json!([n, a]))
        .collect();
    let batch = serde_json::to_string(&list).expect("json");
    format!(
        "import sys\nsys.argv = ['probes.py', '--batch', {}]\n{PROBES}",
        serde_json::to_string(&batch).expect("json")
    )
}

/// Parses probe output lines into (probe, args) -> (result, detail).
pub fn parse_probes(stdout: &str) -> Vec<(String, Vec<String>, String, Value)> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("probe line");
            (
                v["probe"].as_str().unwrap_or_default().to_owned(),
                v["args"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|x| x.as_str().unwrap_or_default().to_owned())
                            .collect()
                    })
                    .unwrap_or_default(),
                v["result"].as_str().unwrap_or_default().to_owned(),
                v["detail"].clone(),
            )
        })
        .collect()
}

/// Runs one probe on the host, as the positive control: Debian's python3 as root.
pub fn control(name: &str, args: &[&str]) -> (String, Value) {
    control_with(name, args, &[])
}

pub fn control_with(name: &str, args: &[&str], env: &[(&str, &str)]) -> (String, Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("probes.py");
    std::fs::write(&script, PROBES).expect("write probes");
    let out = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(name)
        .args(args)
        .envs(env.iter().copied())
        // Relative paths in probes (mknod) land in the scratch directory.
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .output()
        .expect("run control");
    let line = String::from_utf8_lossy(&out.stdout);
    let parsed = parse_probes(&line);
    let (_, _, r, d) = parsed
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("control {name} printed nothing: {out:?}"));
    (r, d)
}

/// A host process whose command line (arguments joined by spaces) contains `needle`, other than
/// cargo's (whose command line may name the test).
pub fn find_process(needle: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let cmdline = String::from_utf8_lossy(&c).replace('\0', " ");
                cmdline.contains(needle) && !cmdline.contains("cargo")
            })
        })
}
