//! The default Python runtime: a virtual environment built from the embedded lock file
//! (`runtime/python.lock`) on top of the system's `/usr/bin/python3`, kept under
//! `<data_dir>/runtimes/<name>` and bound read-only at [`SANDBOX_PYTHON_PREFIX`] inside every
//! sandbox.
//!
//! Layout of the runtimes root:
//! - `<name>/` a complete runtime; complete means its [`MARKER`] file exists. The marker is
//!   written last inside a `.tmp-*` build directory, which is then renamed into place, so a
//!   crash never leaves a directory that looks complete.
//! - `.tmp-*` build (or removal) directories; stale ones are deleted by the next install.
//! - `.install.lock` the file that installs and removals take an exclusive `flock` on.
//!
//! The venv's `bin/python` is a symlink to `/usr/bin/python3` (read-only in the sandbox as
//! well) and `pyvenv.cfg` sits next to `bin/`, so the venv works from any mount point. Bytecode
//! is compiled ahead of time (the sandbox cannot write `__pycache__`), and the whole tree is made
//! world-readable because the sandbox user reads it through the "other" permission bits.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The lock file, embedded at build time.
pub const PYTHON_LOCK: &str = include_str!("../../../runtime/python.lock");

/// Where the runtime appears inside every sandbox (read-only bind of the venv).
pub const SANDBOX_PYTHON_PREFIX: &str = "/opt/runcell/python";

/// The interpreter inside the sandbox.
pub const SANDBOX_PYTHON_BIN: &str = "/opt/runcell/python/bin/python3";

/// Environment a sandboxed run of the runtime should get: the runtime is read-only, so Python
/// must not try to write bytecode (it is all compiled ahead of time); matplotlib must not look
/// for a display, and keeps its font cache in /tmp rather than the user's workspace.
pub const SANDBOX_PYTHON_ENV: &[(&str, &str)] = &[
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("PYTHONNOUSERSITE", "1"),
    ("MPLBACKEND", "Agg"),
    ("MPLCONFIGDIR", "/tmp/.matplotlib"),
];

/// The system interpreter every runtime is built on.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";
/// Written last into a runtime; holds its [`Marker`] as JSON.
const MARKER: &str = ".runcell-complete";
/// The file installs and removals `flock`.
const INSTALL_LOCK: &str = ".install.lock";
/// Prefix of build and removal directories (never a runtime).
const TMP_PREFIX: &str = ".tmp-";
/// The lock file as copied into each runtime (provenance, and pip's `-r` argument).
const LOCK_COPY: &str = "python.lock";
/// pip's cache and matplotlib's config dir during the build; removed before the rename.
const PIP_CACHE: &str = ".pip-cache";
const MPL_CONFIG: &str = ".mplconfig";
/// Marker format version.
const MARKER_FORMAT: u32 = 1;
/// Number of [`InstallEvent::Step`]s an install reports.
const TOTAL_STEPS: usize = 5;
/// How many output lines of a failed step end up in the error.
const TAIL_LINES: usize = 30;
/// Top-level modules the smoke test imports (one per top-level package of the lock).
const SMOKE_TEST: &str = "\
import matplotlib
matplotlib.use('Agg')
import io, numpy, pandas, scipy, sympy, sklearn, seaborn, openpyxl, PIL, pypdf, tabulate
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot(numpy.arange(3), pandas.Series([1, 2, 3]))
fig.savefig(io.BytesIO(), format='png')
print('runtime ok: numpy', numpy.__version__, 'pandas', pandas.__version__,
      'matplotlib', matplotlib.__version__)
";

/// An installed runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// Directory name under the runtimes root, e.g. `python-3.11-0123456789ab`.
    pub name: String,
    /// The runtime's directory on the host (bind it at [`SANDBOX_PYTHON_PREFIX`]).
    pub path: PathBuf,
    /// Full version of the interpreter it was built with, e.g. `3.11.2`.
    pub python_version: String,
    /// Hex sha256 of the lock file it was built from.
    pub lock_hash: String,
    /// `(name, version)` of every installed distribution, from the lock.
    pub packages: Vec<(String, String)>,
    /// Total size of its regular files.
    pub size_bytes: u64,
}

/// Install progress, for the CLI's progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallEvent<'a> {
    /// Step `index` of `total` starts (`index` counts from 1).
    Step {
        index: usize,
        total: usize,
        message: &'a str,
    },
    /// One line of output of the running step (pip's, mostly).
    Output(&'a str),
}

/// Errors of installing, reading and removing runtimes.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot run {}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unexpected version output from {}: {output:?}", path.display())]
    PythonVersion { path: PathBuf, output: String },
    #[error("cannot {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{step} failed ({status}); last output:\n{tail}")]
    StepFailed {
        step: &'static str,
        status: ExitStatus,
        tail: String,
    },
    #[error("invalid lock file line {line}: {reason}")]
    Lock { line: usize, reason: String },
    #[error("cannot write runtime marker {}", path.display())]
    Marker {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid runtime name {0:?}")]
    InvalidName(String),
    #[error("no runtime {}", path.display())]
    NotFound { path: PathBuf },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The metadata in a runtime's marker file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Marker {
    format: u32,
    name: String,
    python_version: String,
    lock_hash: String,
    packages: Vec<(String, String)>,
    size_bytes: u64,
    installed_unix: u64,
}

/// What a build produced, besides the tree itself.
#[derive(Debug)]
struct Built {
    python_version: String,
    packages: Vec<(String, String)>,
}

/// Builds a runtime tree into the given (not yet existing) directory.
type Build<'b> =
    dyn FnMut(&Path, &mut dyn FnMut(InstallEvent<'_>)) -> Result<Built, RuntimeError> + 'b;

/// One distribution of the lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pin {
    name: String,
    version: String,
    hashes: Vec<String>,
}

/// The runtimes kept under `<data_dir>/runtimes`.
#[derive(Debug, Clone)]
pub struct Runtimes {
    root: PathBuf,
}

impl Runtimes {
    /// Runtimes under `<data_dir>/runtimes` (nothing is created until an install).
    pub fn new(data_dir: &Path) -> Runtimes {
        Runtimes {
            root: data_dir.join("runtimes"),
        }
    }

    /// The runtimes root, `<data_dir>/runtimes`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The default runtime's directory name: `python-<X.Y>-<first 12 hex of sha256(lock)>`;
    /// it changes whenever the lock or the system Python's minor version changes.
    pub fn default_name() -> Result<String, RuntimeError> {
        // The name needs only X.Y, which the interpreter's file name says (python3 ->
        // python3.11) without starting it: this runs on every `runcell run`, where a Python
        // start-up would cost as much as the whole sandbox.
        let version = match system_python_minor_from_path() {
            Some(minor) => minor,
            None => system_python_version()?,
        };
        Ok(name_for(&version, PYTHON_LOCK))
    }

    /// The installed default runtime, if complete.
    pub fn default_runtime(&self) -> Option<RuntimeInfo> {
        let name = Self::default_name().ok()?;
        self.complete(&name)
            .filter(|info| info.lock_hash == sha256_hex(PYTHON_LOCK.as_bytes()))
    }

    /// Installs the default runtime unless it is already complete. Safe to call from several
    /// threads and processes at once: one installs, the others wait and then return its result.
    pub fn ensure_default(
        &self,
        progress: &mut dyn FnMut(InstallEvent<'_>),
    ) -> Result<RuntimeInfo, RuntimeError> {
        let name = Self::default_name()?;
        let lock_hash = sha256_hex(PYTHON_LOCK.as_bytes());
        self.ensure_with(&name, &lock_hash, progress, &mut |dir, progress| {
            build_python(dir, PYTHON_LOCK, progress)
        })
    }

    /// Every complete runtime under the root, sorted by name.
    pub fn list(&self) -> Vec<RuntimeInfo> {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut out: Vec<RuntimeInfo> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .filter_map(|name| self.complete(&name))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes runtime `name` (complete or not). The directory is first renamed out of the way,
    /// so it never looks complete while half deleted.
    pub fn remove(&self, name: &str) -> Result<(), RuntimeError> {
        validate_name(name)?;
        let path = self.root.join(name);
        let _lock = self.lock_install(&mut |_| {})?;
        match fs::symlink_metadata(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(RuntimeError::NotFound { path });
            }
            Err(e) => return Err(io_err("inspect", &path)(e)),
        }
        let trash = self
            .root
            .join(format!("{TMP_PREFIX}remove-{name}-{}", std::process::id()));
        fs::rename(&path, &trash).map_err(io_err("move aside", &path))?;
        remove_any(&trash).map_err(io_err("remove", &trash))?;
        tracing::info!(runtime = name, "removed runtime");
        Ok(())
    }

    /// The complete runtime `name`, if any.
    fn complete(&self, name: &str) -> Option<RuntimeInfo> {
        let path = self.root.join(name);
        let text = fs::read_to_string(path.join(MARKER)).ok()?;
        let marker: Marker = match serde_json::from_str(&text) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable runtime marker");
                return None;
            }
        };
        if marker.format != MARKER_FORMAT || marker.name != name {
            return None;
        }
        Some(RuntimeInfo {
            name: marker.name,
            path,
            python_version: marker.python_version,
            lock_hash: marker.lock_hash,
            packages: marker.packages,
            size_bytes: marker.size_bytes,
        })
    }

    /// Takes the exclusive install lock, telling `progress` when it has to wait for it.
    fn lock_install(
        &self,
        progress: &mut dyn FnMut(InstallEvent<'_>),
    ) -> Result<File, RuntimeError> {
        fs::create_dir_all(&self.root).map_err(io_err("create", &self.root))?;
        let path = self.root.join(INSTALL_LOCK);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("open", &path))?;
        // File::lock / try_lock are flock(2) on Linux, per open file description, so they also
        // exclude other threads of this process (each opens its own description).
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                progress(InstallEvent::Output(
                    "another runcell process is installing a runtime; waiting for it",
                ));
                file.lock().map_err(io_err("lock", &path))?;
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err("lock", &path)(e)),
        }
        Ok(file)
    }

    /// The install protocol around `build`: fast path, lock, re-check, build into a `.tmp-`
    /// directory, finalize (permissions, size, marker), rename into place.
    fn ensure_with(
        &self,
        name: &str,
        lock_hash: &str,
        progress: &mut dyn FnMut(InstallEvent<'_>),
        build: &mut Build<'_>,
    ) -> Result<RuntimeInfo, RuntimeError> {
        if let Some(info) = self.complete(name) {
            return Ok(info);
        }
        let _lock = self.lock_install(progress)?;
        if let Some(info) = self.complete(name) {
            return Ok(info);
        }
        let started = Instant::now();
        // Holding the lock, nobody else is building: every .tmp- entry is left from a crash.
        self.remove_stale();
        let final_path = self.root.join(name);
        if fs::symlink_metadata(&final_path).is_ok() {
            tracing::warn!(path = %final_path.display(), "replacing an incomplete runtime");
            let trash = self.root.join(format!(
                "{TMP_PREFIX}incomplete-{name}-{}",
                std::process::id()
            ));
            fs::rename(&final_path, &trash).map_err(io_err("move aside", &final_path))?;
            remove_any(&trash).map_err(io_err("remove", &trash))?;
        }
        let tmp = self
            .root
            .join(format!("{TMP_PREFIX}{name}-{}", std::process::id()));
        let result = build(&tmp, progress).and_then(|built| {
            progress(InstallEvent::Step {
                index: TOTAL_STEPS,
                total: TOTAL_STEPS,
                message: "finalizing",
            });
            finalize(&tmp, name, lock_hash, built)
        });
        let marker = match result {
            Ok(marker) => marker,
            Err(e) => {
                if let Err(rm) = remove_any(&tmp) {
                    tracing::warn!(path = %tmp.display(), error = %rm, "cannot remove failed build");
                }
                return Err(e);
            }
        };
        fs::rename(&tmp, &final_path).map_err(io_err("rename into place", &tmp))?;
        if let Ok(dir) = File::open(&self.root) {
            let _ = dir.sync_all();
        }
        tracing::info!(
            runtime = name,
            size_bytes = marker.size_bytes,
            seconds = started.elapsed().as_secs_f64(),
            "installed runtime"
        );
        self.complete(name).ok_or_else(|| RuntimeError::Io {
            action: "read back",
            path: final_path.join(MARKER),
            source: io::Error::new(io::ErrorKind::InvalidData, "marker missing after install"),
        })
    }

    /// Deletes `.tmp-*` entries (only call with the install lock held).
    fn remove_stale(&self) {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let path = entry.path();
                tracing::info!(path = %path.display(), "removing stale runtime build");
                if let Err(e) = remove_any(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove stale build");
                }
            }
        }
    }
}

/// `python-<X.Y>-<first 12 hex of sha256(lock)>`; `version` may be `X.Y` or `X.Y.Z`.
pub fn name_for(version: &str, lock: &str) -> String {
    let minor: Vec<&str> = version.split('.').take(2).collect();
    let hash = sha256_hex(lock.as_bytes());
    format!("python-{}-{}", minor.join("."), &hash[..12])
}

fn sha256_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// `X.Y` from the file `/usr/bin/python3` resolves to (`python3.11`), if it is named so.
fn system_python_minor_from_path() -> Option<String> {
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
fn system_python_version() -> Result<String, RuntimeError> {
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

/// A runtime name is one plain path component that is not hidden (which also refuses the
/// install lock and `.tmp-` directories).
fn validate_name(name: &str) -> Result<(), RuntimeError> {
    let bad = name.is_empty()
        || name.starts_with('.')
        || name.contains("..")
        || name
            .chars()
            .any(|c| c == '/' || c == '\\' || c == '\0' || c.is_control());
    if bad {
        Err(RuntimeError::InvalidName(name.to_string()))
    } else {
        Ok(())
    }
}

/// Parses a hash-pinned requirements file: `name==version` followed by one or more
/// `--hash=sha256:<hex>`, with `\` continuations and `#` comments.
fn parse_lock(lock: &str) -> Result<Vec<Pin>, RuntimeError> {
    let mut pins = Vec::new();
    let mut logical = String::new();
    let mut start = 0;
    for (i, raw) in lock.lines().enumerate() {
        let line = match raw.find('#') {
            Some(0) => "",
            Some(p) if raw[..p].ends_with(char::is_whitespace) => &raw[..p],
            _ => raw,
        };
        if logical.is_empty() {
            start = i + 1;
        }
        let (body, continued) = match line.trim_end().strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        logical.push_str(body);
        logical.push(' ');
        if continued {
            continue;
        }
        if !logical.trim().is_empty() {
            pins.push(parse_pin(&logical, start)?);
        }
        logical.clear();
    }
    if !logical.trim().is_empty() {
        return Err(RuntimeError::Lock {
            line: start,
            reason: "continuation at end of file".into(),
        });
    }
    Ok(pins)
}

fn parse_pin(text: &str, line: usize) -> Result<Pin, RuntimeError> {
    let err = |reason: String| RuntimeError::Lock { line, reason };
    let mut tokens = text.split_whitespace();
    let requirement = tokens.next().unwrap_or_default();
    let (name, version) = requirement
        .split_once("==")
        .ok_or_else(|| err(format!("{requirement:?} is not pinned with ==")))
        .and_then(|(n, v)| {
            let ok_name = !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            let ok_version = !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._+!-".contains(c));
            if ok_name && ok_version {
                Ok((n, v))
            } else {
                Err(err(format!(
                    "{requirement:?} is not a plain name==version pin"
                )))
            }
        })?;
    let mut hashes = Vec::new();
    for token in tokens {
        let hex = token
            .strip_prefix("--hash=sha256:")
            .ok_or_else(|| err(format!("unexpected {token:?}")))?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err(format!("bad sha256 {hex:?}")));
        }
        hashes.push(hex.to_ascii_lowercase());
    }
    if hashes.is_empty() {
        return Err(err(format!("{requirement} has no --hash")));
    }
    Ok(Pin {
        name: normalize(name),
        version: version.to_string(),
        hashes,
    })
}

/// PEP 503 normalized distribution name.
fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if "-_.".contains(c) {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// A command on a Python interpreter with an environment that cannot redirect it.
fn python_command(program: &Path) -> Command {
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

/// Runs `cmd`, passing each line of its stdout and stderr to `progress` as it comes.
fn run_streaming(
    step: &'static str,
    mut cmd: Command,
    progress: &mut dyn FnMut(InstallEvent<'_>),
) -> Result<(), RuntimeError> {
    let program = PathBuf::from(cmd.get_program());
    tracing::debug!(?cmd, "running {step}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RuntimeError::Spawn {
            path: program,
            source,
        })?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut tail: VecDeque<String> = VecDeque::with_capacity(TAIL_LINES);
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::scope(|scope| {
        for stream in [stdout.map(boxed), stderr.map(boxed)].into_iter().flatten() {
            let tx = tx.clone();
            scope.spawn(move || forward_lines(stream, &tx));
        }
        drop(tx);
        for line in rx {
            progress(InstallEvent::Output(&line));
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    });
    let status = child.wait().map_err(|source| RuntimeError::Spawn {
        path: PathBuf::from(cmd.get_program()),
        source,
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(RuntimeError::StepFailed {
            step,
            status,
            tail: Vec::from(tail).join("\n"),
        })
    }
}

fn boxed<R: Read + Send + 'static>(r: R) -> Box<dyn Read + Send> {
    Box::new(r)
}

fn forward_lines(stream: Box<dyn Read + Send>, tx: &mpsc::Sender<String>) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end_matches(['\n', '\r']);
                if !line.trim().is_empty() && tx.send(line.to_string()).is_err() {
                    return;
                }
            }
        }
    }
}

/// Builds the venv of `lock` into `dir` (which must not exist): venv, pip install, bytecode,
/// smoke test. Reports steps 1 to `TOTAL_STEPS - 1`.
fn build_python(
    dir: &Path,
    lock: &str,
    progress: &mut dyn FnMut(InstallEvent<'_>),
) -> Result<Built, RuntimeError> {
    let pins = parse_lock(lock)?;
    let python_version = system_python_version()?;
    let step = |progress: &mut dyn FnMut(InstallEvent<'_>), index: usize, message: &str| {
        tracing::info!(step = index, "{message}");
        progress(InstallEvent::Step {
            index,
            total: TOTAL_STEPS,
            message,
        });
    };

    step(
        progress,
        1,
        &format!("creating a Python {python_version} virtual environment"),
    );
    let mut venv = python_command(Path::new(SYSTEM_PYTHON));
    venv.args(["-m", "venv", "--prompt", "runcell"]).arg(dir);
    run_streaming("creating the virtual environment", venv, progress)?;
    let python = dir.join("bin").join("python");

    step(
        progress,
        2,
        &format!("downloading and installing {} packages", pins.len()),
    );
    let lock_path = dir.join(LOCK_COPY);
    fs::write(&lock_path, lock).map_err(io_err("write", &lock_path))?;
    let mut pip = python_command(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--no-input",
        "--disable-pip-version-check",
        "--no-color",
        "--progress-bar",
        "off",
        "--require-hashes",
        "--only-binary=:all:",
        "--no-deps",
        "--no-compile",
        "-r",
    ])
    .arg(&lock_path)
    .env("PIP_CACHE_DIR", dir.join(PIP_CACHE));
    run_streaming("pip install", pip, progress)?;

    step(progress, 3, "compiling bytecode");
    let mut compile = python_command(&python);
    compile
        .args([
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "--invalidation-mode",
            "unchecked-hash",
            "-s",
        ])
        .arg(dir)
        .args(["-p", SANDBOX_PYTHON_PREFIX])
        .arg(dir.join("lib"));
    run_streaming("compiling bytecode", compile, progress)?;

    step(progress, 4, "checking that the packages import");
    let mut smoke = python_command(&python);
    smoke
        .args(["-c", SMOKE_TEST])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("MPLBACKEND", "Agg")
        .env("MPLCONFIGDIR", dir.join(MPL_CONFIG));
    run_streaming("the import smoke test", smoke, progress)?;

    Ok(Built {
        python_version,
        packages: pins.into_iter().map(|p| (p.name, p.version)).collect(),
    })
}

/// Makes a built tree final: drops caches, points scripts at the sandbox prefix, makes it
/// world-readable, measures it and writes the marker (last).
fn finalize(dir: &Path, name: &str, lock_hash: &str, built: Built) -> Result<Marker, RuntimeError> {
    for scratch in [PIP_CACHE, MPL_CONFIG] {
        let path = dir.join(scratch);
        match remove_any(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &path)(e)),
        }
    }
    relocate(dir)?;
    let size_bytes = make_world_readable(dir)?;
    let marker = Marker {
        format: MARKER_FORMAT,
        name: name.to_string(),
        python_version: built.python_version,
        lock_hash: lock_hash.to_string(),
        packages: built.packages,
        size_bytes,
        installed_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let path = dir.join(MARKER);
    let json = serde_json::to_vec_pretty(&marker).map_err(|source| RuntimeError::Marker {
        path: path.clone(),
        source,
    })?;
    let mut file = File::create(&path).map_err(io_err("create", &path))?;
    file.write_all(&json)
        .and_then(|()| file.sync_all())
        .map_err(io_err("write", &path))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644))
        .map_err(io_err("chmod", &path))?;
    Ok(marker)
}

/// Rewrites the build directory's path to [`SANDBOX_PYTHON_PREFIX`] in `bin/` scripts
/// (shebangs, activate) and `pyvenv.cfg`: the runtime only ever runs there.
fn relocate(dir: &Path) -> Result<(), RuntimeError> {
    let from = dir.to_string_lossy().into_owned();
    let mut files = vec![dir.join("pyvenv.cfg")];
    let bin = dir.join("bin");
    if let Ok(entries) = fs::read_dir(&bin) {
        files.extend(entries.filter_map(Result::ok).map(|e| e.path()));
    }
    for path in files {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > 1 << 20 {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue; // binary
        };
        if text.contains(&from) {
            fs::write(&path, text.replace(&from, SANDBOX_PYTHON_PREFIX))
                .map_err(io_err("rewrite", &path))?;
        }
    }
    Ok(())
}

/// Sets directories to 0755 and files to 0644 (0755 if any execute bit was set), leaving
/// symlinks alone; returns the total size of the regular files.
fn make_world_readable(dir: &Path) -> Result<u64, RuntimeError> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).map_err(io_err("chmod", &d))?;
        for entry in fs::read_dir(&d).map_err(io_err("read", &d))? {
            let entry = entry.map_err(io_err("read", &d))?;
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).map_err(io_err("inspect", &path))?;
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                total += meta.len();
                let mode = if meta.permissions().mode() & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                };
                if meta.permissions().mode() & 0o7777 != mode {
                    fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                        .map_err(io_err("chmod", &path))?;
                }
            }
        }
    }
    Ok(total)
}

/// Removes a file, symlink or directory tree.
fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    const TOP_LEVEL: [&str; 11] = [
        "numpy",
        "pandas",
        "matplotlib",
        "scipy",
        "sympy",
        "scikit-learn",
        "seaborn",
        "openpyxl",
        "pillow",
        "pypdf",
        "tabulate",
    ];

    #[test]
    fn lock_pins_every_distribution_with_hashes() {
        let pins = parse_lock(PYTHON_LOCK).expect("lock parses");
        assert!(pins.len() >= TOP_LEVEL.len());
        for pin in &pins {
            assert!(!pin.version.is_empty(), "{pin:?}");
            assert!(!pin.hashes.is_empty(), "{pin:?}");
        }
        for name in TOP_LEVEL {
            assert!(
                pins.iter().any(|p| p.name == name),
                "{name} missing from lock"
            );
        }
        for dep in [
            "python-dateutil",
            "tzdata",
            "contourpy",
            "joblib",
            "mpmath",
            "et-xmlfile",
        ] {
            assert!(
                pins.iter().any(|p| p.name == dep),
                "{dep} missing from lock"
            );
        }
        let mut names: Vec<&str> = pins.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), pins.len(), "duplicate pins");
        // Every non-comment physical line belongs to a pin.
        let logical = PYTHON_LOCK
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .filter(|l| !l.trim_start().starts_with("--hash="))
            .count();
        assert_eq!(logical, pins.len());
    }

    #[test]
    fn lock_parser_rejects_unpinned_or_unhashed_lines() {
        let hash = "--hash=sha256:".to_string() + &"a".repeat(64);
        assert!(parse_lock(&format!("numpy>=2 {hash}\n")).is_err());
        assert!(parse_lock("numpy==2.0.0\n").is_err());
        assert!(parse_lock("numpy==2.0.0 --hash=sha256:abc\n").is_err());
        assert!(parse_lock(&format!("numpy==2.0.0 --index-url=x {hash}\n")).is_err());
        assert!(parse_lock("numpy==2.0.0 \\\n").is_err());
        let pins = parse_lock(&format!(
            "# c\nEt_XMLFile==2.0.0 \\\n    {hash} \\\n    {hash}  # trailing\n\n"
        ))
        .expect("valid");
        assert_eq!(pins.len(), 1);
        assert_eq!(pins[0].name, "et-xmlfile");
        assert_eq!(pins[0].version, "2.0.0");
        assert_eq!(pins[0].hashes.len(), 2);
    }

    #[test]
    fn names_are_stable_and_follow_the_lock() {
        let a = name_for("3.11.2", PYTHON_LOCK);
        assert_eq!(a, name_for("3.11.9", PYTHON_LOCK));
        assert_eq!(a, name_for("3.11", PYTHON_LOCK));
        assert!(a.starts_with("python-3.11-"));
        assert_eq!(a.len(), "python-3.11-".len() + 12);
        assert_ne!(a, name_for("3.11.2", &format!("{PYTHON_LOCK}\n")));
        assert_ne!(a, name_for("3.12.0", PYTHON_LOCK));
        assert_eq!(
            name_for("3.11.2", ""),
            "python-3.11-e3b0c44298fc" // sha256 of nothing
        );
        validate_name(&a).expect("generated names are valid");
    }

    #[test]
    fn default_name_queries_the_system_python() {
        if !Path::new(SYSTEM_PYTHON).exists() {
            return;
        }
        let name = Runtimes::default_name().expect("default name");
        assert_eq!(name, Runtimes::default_name().expect("again"));
        // The file name and the interpreter agree on X.Y.
        let asked = system_python_version().expect("version");
        assert_eq!(name, name_for(&asked, PYTHON_LOCK));
        assert!(name.starts_with("python-3."), "{name}");
        assert!(name.ends_with(&sha256_hex(PYTHON_LOCK.as_bytes())[..12]));
    }

    #[test]
    fn remove_rejects_bad_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtimes = Runtimes::new(dir.path());
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/abs",
            "a..b",
            ".install.lock",
            ".tmp-python-3.11-x-1",
            "a\0b",
            "a\nb",
        ] {
            assert!(
                matches!(runtimes.remove(bad), Err(RuntimeError::InvalidName(_))),
                "{bad:?} accepted"
            );
        }
        assert!(matches!(
            runtimes.remove("python-3.11-000000000000"),
            Err(RuntimeError::NotFound { .. })
        ));
    }

    /// A stand-in build: a small tree with unfriendly permissions, slow enough to overlap.
    fn fake_build(builds: &AtomicUsize) -> Box<Build<'_>> {
        Box::new(
            move |dir: &Path, progress: &mut dyn FnMut(InstallEvent<'_>)| {
                builds.fetch_add(1, Ordering::SeqCst);
                progress(InstallEvent::Step {
                    index: 1,
                    total: TOTAL_STEPS,
                    message: "fake",
                });
                fs::create_dir_all(dir.join("lib/sub")).map_err(io_err("create", dir))?;
                fs::set_permissions(dir.join("lib/sub"), fs::Permissions::from_mode(0o700))
                    .map_err(io_err("chmod", dir))?;
                fs::write(dir.join("lib/sub/a.py"), "x = 1\n").map_err(io_err("write", dir))?;
                fs::set_permissions(dir.join("lib/sub/a.py"), fs::Permissions::from_mode(0o600))
                    .map_err(io_err("chmod", dir))?;
                fs::write(dir.join("run"), "#!/bin/sh\n").map_err(io_err("write", dir))?;
                fs::set_permissions(dir.join("run"), fs::Permissions::from_mode(0o700))
                    .map_err(io_err("chmod", dir))?;
                std::thread::sleep(Duration::from_millis(300));
                Ok(Built {
                    python_version: "3.11.2".into(),
                    packages: vec![("numpy".into(), "2.0.0".into())],
                })
            },
        )
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn concurrent_installs_build_once_and_leave_a_readable_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtimes = Runtimes::new(dir.path());
        // Leftovers of a crashed build are never listed and get cleaned up.
        fs::create_dir_all(runtimes.root().join(".tmp-python-3.11-abc-1/lib"))
            .expect("stale build");
        assert!(runtimes.list().is_empty());
        let builds = AtomicUsize::new(0);
        let results: Vec<RuntimeInfo> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        let mut build = fake_build(&builds);
                        runtimes.ensure_with("rt-1", "hash", &mut |_| {}, &mut *build)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread").expect("install"))
                .collect()
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        let info = &results[0];
        assert_eq!(info.name, "rt-1");
        assert_eq!(info.path, runtimes.root().join("rt-1"));
        assert_eq!(info.lock_hash, "hash");
        assert_eq!(info.size_bytes, 6 + 10);
        assert_eq!(mode(&info.path), 0o755);
        assert_eq!(mode(&info.path.join("lib/sub")), 0o755);
        assert_eq!(mode(&info.path.join("lib/sub/a.py")), 0o644);
        assert_eq!(mode(&info.path.join("run")), 0o755);
        let names: Vec<String> = fs::read_dir(runtimes.root())
            .expect("root")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(TMP_PREFIX)),
            "{names:?}"
        );
        assert_eq!(runtimes.list(), vec![info.clone()]);

        // A second call is a no-op.
        let mut events = 0;
        let again = runtimes
            .ensure_with(
                "rt-1",
                "hash",
                &mut |_| events += 1,
                &mut fake_build(&builds),
            )
            .expect("again");
        assert_eq!(&again, info);
        assert_eq!(events, 0);
        assert_eq!(builds.load(Ordering::SeqCst), 1);

        runtimes.remove("rt-1").expect("remove");
        assert!(runtimes.list().is_empty());
        assert!(!info.path.exists());
    }

    #[test]
    fn failed_builds_leave_nothing_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtimes = Runtimes::new(dir.path());
        // An incomplete directory under the final name (no marker) is not a runtime.
        fs::create_dir_all(runtimes.root().join("rt-2/lib")).expect("incomplete");
        assert!(runtimes.list().is_empty());
        let err = runtimes
            .ensure_with("rt-2", "hash", &mut |_| {}, &mut |dir, _| {
                fs::create_dir_all(dir).map_err(io_err("create", dir))?;
                Err(RuntimeError::InvalidName("boom".into()))
            })
            .expect_err("build fails");
        assert!(matches!(err, RuntimeError::InvalidName(_)));
        let left: Vec<_> = fs::read_dir(runtimes.root())
            .expect("root")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from(INSTALL_LOCK)]);
        assert!(runtimes.list().is_empty());
    }

    #[test]
    fn relocate_points_scripts_at_the_sandbox_prefix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = dir.path().join(".tmp-x-1");
        fs::create_dir_all(rt.join("bin")).expect("bin");
        let shebang = format!("#!{}/bin/python\nimport x\n", rt.display());
        fs::write(rt.join("bin/pip"), &shebang).expect("pip");
        fs::write(
            rt.join("pyvenv.cfg"),
            format!("home = /usr/bin\ncommand = {}\n", rt.display()),
        )
        .expect("cfg");
        std::os::unix::fs::symlink("/usr/bin/python3", rt.join("bin/python")).expect("link");
        relocate(&rt).expect("relocate");
        assert_eq!(
            fs::read_to_string(rt.join("bin/pip")).expect("pip"),
            "#!/opt/runcell/python/bin/python\nimport x\n"
        );
        assert!(fs::read_to_string(rt.join("pyvenv.cfg"))
            .expect("cfg")
            .contains("command = /opt/runcell/python\n"));
        assert_eq!(
            fs::read_link(rt.join("bin/python")).expect("link"),
            Path::new("/usr/bin/python3")
        );
    }

    /// Really installs the default runtime (downloads ~100 MB): `RUNCELL_TEST_INSTALL=1`.
    /// `RUNCELL_TEST_INSTALL_DIR` keeps the data dir there instead of a temporary one.
    #[test]
    fn real_install_when_asked() {
        if std::env::var_os("RUNCELL_TEST_INSTALL").is_none_or(|v| v != "1") {
            return;
        }
        let temp = tempfile::tempdir().expect("tempdir");
        let data = std::env::var_os("RUNCELL_TEST_INSTALL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| temp.path().to_path_buf());
        let runtimes = Runtimes::new(&data);
        let started = Instant::now();
        let steps = [AtomicUsize::new(0), AtomicUsize::new(0)];
        let results: Vec<RuntimeInfo> = std::thread::scope(|s| {
            let handles: Vec<_> = steps
                .iter()
                .enumerate()
                .map(|(i, count)| {
                    let runtimes = &runtimes;
                    s.spawn(move || {
                        runtimes.ensure_default(&mut |event| {
                            match event {
                                InstallEvent::Step { .. } => {
                                    count.fetch_add(1, Ordering::SeqCst);
                                }
                                InstallEvent::Output(_) => {}
                            }
                            eprintln!("[{i}] {event:?}");
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread").expect("install"))
                .collect()
        });
        let took = started.elapsed();
        let info = &results[0];
        assert_eq!(&results[1], info);
        eprintln!(
            "installed {} in {:.1}s, {} bytes ({} MiB), {} packages",
            info.name,
            took.as_secs_f64(),
            info.size_bytes,
            info.size_bytes >> 20,
            info.packages.len()
        );
        let counts: Vec<usize> = steps.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        assert!(
            counts == [TOTAL_STEPS, 0] || counts == [0, TOTAL_STEPS] || counts == [0, 0],
            "{counts:?}"
        );
        assert_eq!(runtimes.default_runtime().as_ref(), Some(info));
        assert_eq!(runtimes.list(), vec![info.clone()]);

        let again = Instant::now();
        let mut events = 0;
        let second = runtimes
            .ensure_default(&mut |_| events += 1)
            .expect("again");
        assert_eq!(&second, info);
        assert_eq!(events, 0);
        assert!(again.elapsed() < Duration::from_secs(1));

        let out = Command::new(info.path.join("bin/python"))
            .args(["-c", "import sys, numpy, sklearn; print(sys.prefix)"])
            .output()
            .expect("run python");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            info.path.to_string_lossy()
        );
    }
}
