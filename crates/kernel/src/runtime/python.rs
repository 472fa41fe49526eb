//! The system interpreter every runtime is built on, and commands on an interpreter that its
//! caller's environment cannot redirect.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::error::RuntimeError;

/// The system interpreter every runtime is built on.
pub(super) const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// `X.Y` from the file `/usr/bin/python3` resolves to (`python3.11`), if it is named so.
pub(super) fn system_python_minor_from_path() -> Option<String> {
    let real = std::fs::canonicalize(SYSTEM_PYTHON).ok()?;
    let minor = real
        .file_name()?
        .to_str()?
        .strip_prefix("python")?
        .to_owned();
    let mut parts = minor.split('.');
    let ok = parts
        .next()
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts.next().is_none();
    ok.then_some(minor)
}

/// `X.Y.Z` of `/usr/bin/python3`, asked once per process.
pub(super) fn system_python_version() -> Result<String, RuntimeError> {
    static VERSION: OnceLock<String> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(v.clone());
    }
    let path = PathBuf::from(SYSTEM_PYTHON);
    let out = python_command(&path)
        .args([
            "-I",
            "-c",
            "import sys; print('%d.%d.%d' % sys.version_info[:3])",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| RuntimeError::Spawn {
            path: path.clone(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let valid = text.split('.').count() == 3
        && text
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !out.status.success() || !valid {
        let mut output = text;
        output.push_str(&String::from_utf8_lossy(&out.stderr));
        return Err(RuntimeError::PythonVersion { path, output });
    }
    Ok(VERSION.get_or_init(|| text).clone())
}

/// A command on a Python interpreter with an environment that cannot redirect it.
pub(super) fn python_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for var in [
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPYCACHEPREFIX",
        "SOURCE_DATE_EPOCH",
        "VIRTUAL_ENV",
        "PIP_TARGET",
        "PIP_PREFIX",
        "PIP_ROOT",
        "PIP_USER",
        "PIP_SRC",
        "PIP_REQUIREMENT",
        "PIP_CONSTRAINT",
        "PIP_NO_BINARY",
        "PIP_EDITABLE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("PYTHONNOUSERSITE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null());
    cmd
}
