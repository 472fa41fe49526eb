//! One-shot executions: a fresh sandbox and workspace per run, destroyed afterwards
//! (`runcell run`, `POST /v1/execute`).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use runcell_sandbox::{
    Bind, ExitStatus, FileStat, KillReason, Launch, Limits, RunOptions, Sandbox, Stream, UidLease,
    Workspace,
};

use crate::model::{
    new_id, ErrorInfo, Execution, ExecutionStatus, FileChange, FileChangeKind, Language, Truncated,
    UsageInfo,
};
use crate::EngineError;

/// Where the program file is bound, read-only, inside the sandbox.
const INPUT_DIR: &str = "/opt/runcell/input";

/// Limits a caller may ask for; `None` takes the default (DESIGN.md §7).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitsRequest {
    pub memory_mb: Option<u64>,
    pub cpu: Option<f64>,
    pub pids: Option<u64>,
    pub disk_mb: Option<u64>,
}

/// Bounds on what a request may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
pub const MAX_MEMORY_MB: u64 = 64 << 10;
pub const MAX_DISK_MB: u64 = 64 << 10;
pub const MAX_PIDS: u64 = 4096;

/// A file placed in /workspace before the program starts.
#[derive(Debug, Clone)]
pub struct InputFile {
    pub path: String,
    pub content: Vec<u8>,
}

/// A one-shot execution request.
#[derive(Debug, Clone)]
pub struct OneShot {
    pub language: Language,
    pub code: String,
    pub files: Vec<InputFile>,
    pub stdin: Vec<u8>,
    pub timeout: Duration,
    pub limits: LimitsRequest,
    /// Bytes kept per stream.
    pub output_cap: usize,
}

impl OneShot {
    pub fn new(language: Language, code: impl Into<String>) -> Self {
        Self {
            language,
            code: code.into(),
            files: Vec::new(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(60),
            limits: LimitsRequest::default(),
            output_cap: 1 << 20,
        }
    }
}

/// Host paths and the sandbox factory an engine runs with.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// runcell's data directory (workspaces live under it).
    pub data_dir: PathBuf,
    /// The binary that serves as the sandbox init helper.
    pub init_exe: PathBuf,
    /// Host runtime state (uid leases); on tmpfs so it never outlives a reboot.
    pub run_dir: PathBuf,
}

impl EngineConfig {
    pub fn new(data_dir: PathBuf, init_exe: PathBuf) -> Self {
        Self {
            data_dir,
            init_exe,
            run_dir: PathBuf::from("/run/runcell"),
        }
    }
}

/// The domain entry point.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    sandbox: Sandbox,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Result<Engine, EngineError> {
        let blocking: Vec<String> = runcell_sandbox::doctor::check()
            .into_iter()
            .filter(|l| l.blocks())
            .map(|l| format!("{}: {}", l.name, l.detail))
            .collect();
        if !blocking.is_empty() {
            return Err(EngineError::Unavailable(blocking.join("; ")));
        }
        let sandbox = Sandbox::new(config.init_exe.clone())
            .map_err(|e| EngineError::Unavailable(chain(&e)))?;
        for dir in [
            config.data_dir.join("workspaces"),
            config.data_dir.join("tmp"),
        ] {
            fs::create_dir_all(&dir).map_err(|source| EngineError::Io {
                action: "create",
                path: dir.clone(),
                source,
            })?;
        }
        Ok(Engine { config, sandbox })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Runs `req` in a fresh sandbox. Output is streamed to `on_output` as it is produced (the
    /// head of each stream; the Execution holds head and tail).
    pub fn run_once(
        &self,
        req: &OneShot,
        on_output: &mut dyn FnMut(Stream, &[u8]),
    ) -> Result<OneShotOutcome, EngineError> {
        let limits = resolve_limits(&req.limits)?;
        if req.timeout.is_zero() || req.timeout > MAX_TIMEOUT {
            return Err(EngineError::InvalidRequest(format!(
                "timeout must be between 1 and {} seconds",
                MAX_TIMEOUT.as_secs()
            )));
        }
        let disk_bytes = req.limits.disk_mb.unwrap_or(1024) << 20;
        let id = new_id("ex");
        let lease = UidLease::acquire(&self.config.run_dir.join("uids"))
            .map_err(|e| EngineError::Unavailable(chain(&e)))?;
        let ws_path = self.config.data_dir.join("workspaces").join(&id);
        let workspace = Workspace::create(&ws_path, disk_bytes, lease)
            .map_err(|e| EngineError::Unavailable(chain(&e)))?;
        for f in &req.files {
            workspace
                .write_file(&f.path, &f.content)
                .map_err(|e| match e {
                    runcell_sandbox::WorkspaceError::InvalidPath { .. } => {
                        EngineError::InvalidRequest(e.to_string())
                    }
                    other => EngineError::InvalidRequest(chain(&other)),
                })?;
        }
        let before = workspace.snapshot().unwrap_or_default();

        let input = ProgramDir::create(&self.config.data_dir.join("tmp"), req.language, &req.code)?;
        let launch = Launch {
            argv: interpreter(req.language),
            env: base_env(req.language, limits.cpu_millis),
            workspace: &workspace,
            ro_binds: vec![Bind {
                source: input.path.clone(),
                target: INPUT_DIR.into(),
            }],
            limits,
        };
        let started_at = Utc::now();
        let outcome = self
            .sandbox
            .run(
                &launch,
                &RunOptions {
                    stdin: req.stdin.clone(),
                    timeout: req.timeout,
                    output_cap: req.output_cap,
                    ..RunOptions::default()
                },
                on_output,
            )
            .map_err(|e| EngineError::Sandbox(chain(&e)))?;
        let finished_at = Utc::now();
        let after = workspace.snapshot().unwrap_or_default();
        drop(input);
        drop(workspace);

        let stderr = outcome.stderr.render();
        let (status, error) = classify(req, &limits, outcome.exit, outcome.killed_by, &stderr);
        let execution = Execution {
            id,
            session_id: None,
            language: req.language,
            execution_count: 1,
            status,
            stdout: outcome.stdout.render(),
            stderr,
            truncated: Truncated {
                stdout: outcome.stdout.truncated(),
                stderr: outcome.stderr.truncated(),
            },
            results: Vec::new(),
            error,
            files: diff_files(&before, &after),
            usage: UsageInfo {
                wall_ms: outcome.usage.wall.as_millis() as u64,
                cpu_ms: outcome.usage.cpu.as_millis() as u64,
                peak_memory_bytes: outcome.usage.peak_memory_bytes,
                killed_by: outcome.killed_by.map(Into::into),
            },
            started_at,
            finished_at,
        };
        Ok(OneShotOutcome {
            execution,
            exit_code: outcome.exit.shell_code(),
        })
    }
}

/// A finished one-shot run: the Execution and the program's exit code (128 + signal when it
/// died of one), which the Execution itself does not carry.
#[derive(Debug, Clone)]
pub struct OneShotOutcome {
    pub execution: Execution,
    pub exit_code: i32,
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

fn resolve_limits(req: &LimitsRequest) -> Result<Limits, EngineError> {
    let d = Limits::default();
    let memory_mb = req.memory_mb.unwrap_or(d.memory_bytes >> 20);
    if !(16..=MAX_MEMORY_MB).contains(&memory_mb) {
        return Err(EngineError::InvalidRequest(format!(
            "memory_mb must be between 16 and {MAX_MEMORY_MB}"
        )));
    }
    let cpu = req.cpu.unwrap_or(1.0);
    if !(cpu.is_finite() && (0.01..=64.0).contains(&cpu)) {
        return Err(EngineError::InvalidRequest(
            "cpu must be between 0.01 and 64".into(),
        ));
    }
    let pids = req.pids.unwrap_or(d.pids);
    if !(8..=MAX_PIDS).contains(&pids) {
        return Err(EngineError::InvalidRequest(format!(
            "pids must be between 8 and {MAX_PIDS}"
        )));
    }
    let disk_mb = req.disk_mb.unwrap_or(1024);
    if !(1..=MAX_DISK_MB).contains(&disk_mb) {
        return Err(EngineError::InvalidRequest(format!(
            "disk_mb must be between 1 and {MAX_DISK_MB}"
        )));
    }
    Ok(Limits {
        memory_bytes: memory_mb << 20,
        pids,
        cpu_millis: (cpu * 1000.0).round() as u64,
        // A file can be as large as the workspace, not larger.
        fsize_bytes: disk_mb << 20,
        // /tmp and /dev/shm count against memory; never let them exceed it.
        tmp_bytes: d.tmp_bytes.min(memory_mb << 20),
        ..d
    })
}

fn interpreter(language: Language) -> Vec<String> {
    let v: &[&str] = match language {
        Language::Python => &["/usr/bin/python3", "/opt/runcell/input/main.py"],
        Language::Bash => &["/bin/bash", "/opt/runcell/input/main.sh"],
        Language::Javascript => &["/usr/bin/node", "/opt/runcell/input/main.js"],
    };
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn program_file(language: Language) -> &'static str {
    match language {
        Language::Python => "main.py",
        Language::Bash => "main.sh",
        Language::Javascript => "main.js",
    }
}

/// The whole environment a program sees. Nothing comes from the host.
fn base_env(language: Language, cpu_millis: u64) -> Vec<(String, String)> {
    let threads = cpu_millis.div_ceil(1000).max(1).to_string();
    let mut env: Vec<(&str, String)> = vec![
        ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME", "/tmp".into()),
        ("USER", "sandbox".into()),
        ("LOGNAME", "sandbox".into()),
        ("HOSTNAME", "runcell".into()),
        ("LANG", "C.UTF-8".into()),
        ("TMPDIR", "/tmp".into()),
        // Prompts written for Anthropic's code execution tool save files here.
        ("OUTPUT_DIR", "/workspace".into()),
    ];
    match language {
        Language::Python => env.extend([
            ("PYTHONUNBUFFERED", "1".into()),
            ("PYTHONDONTWRITEBYTECODE", "1".into()),
            ("MPLBACKEND", "Agg".into()),
            ("MPLCONFIGDIR", "/tmp/.matplotlib".into()),
            // BLAS pools sized to the CPU quota, not to the host's cores.
            ("OPENBLAS_NUM_THREADS", threads.clone()),
            ("OMP_NUM_THREADS", threads),
        ]),
        Language::Javascript => env.push(("NODE_OPTIONS", "--max-old-space-size=4096".into())),
        Language::Bash => {}
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The program file on the host, bound read-only into the sandbox; removed on drop.
struct ProgramDir {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl ProgramDir {
    fn create(tmp: &Path, language: Language, code: &str) -> Result<ProgramDir, EngineError> {
        let io = |action, path: &Path| {
            let path = path.to_owned();
            move |source| EngineError::Io {
                action,
                path,
                source,
            }
        };
        let dir = tempfile::Builder::new()
            .prefix("program-")
            .tempdir_in(tmp)
            .map_err(io("create", tmp))?;
        let path = dir.path().to_owned();
        // The sandbox user is not the owner: it reads through the "other" bits.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(io("chmod", &path))?;
        let file = path.join(program_file(language));
        fs::write(&file, code).map_err(io("write", &file))?;
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644))
            .map_err(io("chmod", &file))?;
        Ok(ProgramDir { path, _dir: dir })
    }
}

fn classify(
    req: &OneShot,
    limits: &Limits,
    exit: ExitStatus,
    killed_by: Option<KillReason>,
    stderr: &str,
) -> (ExecutionStatus, Option<ErrorInfo>) {
    let err = |name: &str, value: String| {
        Some(ErrorInfo {
            name: name.into(),
            value,
            traceback: String::new(),
        })
    };
    match killed_by {
        Some(KillReason::Timeout) => (
            ExecutionStatus::Timeout,
            err(
                "TimeoutError",
                format!(
                    "the execution exceeded its {} s time limit",
                    req.timeout.as_secs_f64()
                ),
            ),
        ),
        Some(KillReason::Oom) => (
            ExecutionStatus::Killed,
            err(
                "MemoryError",
                format!(
                    "killed: the memory limit of {} MiB was exceeded",
                    limits.memory_bytes >> 20
                ),
            ),
        ),
        Some(KillReason::Pids) => (
            ExecutionStatus::Killed,
            err(
                "ProcessLimitError",
                format!("killed: the limit of {} processes was reached", limits.pids),
            ),
        ),
        Some(KillReason::Output) => (
            ExecutionStatus::Killed,
            err(
                "OutputLimitError",
                "killed: the program printed too much output".into(),
            ),
        ),
        Some(KillReason::Signal) => {
            let sig = match exit {
                ExitStatus::Signal(s) => s,
                ExitStatus::Code(c) => c,
            };
            (
                ExecutionStatus::Killed,
                err("Signal", format!("the program was killed by signal {sig}")),
            )
        }
        None => match exit {
            ExitStatus::Code(0) => (ExecutionStatus::Ok, None),
            ExitStatus::Code(code) => (
                ExecutionStatus::Error,
                Some(
                    (req.language == Language::Python)
                        .then(|| python_error(stderr))
                        .flatten()
                        .unwrap_or(ErrorInfo {
                            name: "ExitCode".into(),
                            value: code.to_string(),
                            traceback: String::new(),
                        }),
                ),
            ),
            ExitStatus::Signal(s) => (
                ExecutionStatus::Killed,
                err("Signal", format!("the program was killed by signal {s}")),
            ),
        },
    }
}

/// The last Python traceback in stderr, as name / value / traceback.
fn python_error(stderr: &str) -> Option<ErrorInfo> {
    let start = stderr.rfind("Traceback (most recent call last):")?;
    let tb = stderr[start..].trim_end();
    let last = tb.lines().last()?;
    let (name, value) = match last.split_once(": ") {
        Some((n, v)) => (n, v),
        None => (last, ""),
    };
    if name.is_empty() || name.contains(' ') {
        return None;
    }
    Some(ErrorInfo {
        name: name.rsplit('.').next().unwrap_or(name).to_owned(),
        value: value.to_owned(),
        traceback: tb.to_owned(),
    })
}

/// The files a run created, modified or deleted.
pub(crate) fn diff_files(
    before: &BTreeMap<String, FileStat>,
    after: &BTreeMap<String, FileStat>,
) -> Vec<FileChange> {
    let mut out = Vec::new();
    for (path, stat) in after {
        let change = match before.get(path) {
            None => FileChangeKind::Created,
            Some(old) if old != stat => FileChangeKind::Modified,
            Some(_) => continue,
        };
        out.push(FileChange {
            path: path.clone(),
            size: stat.size,
            mime: crate::mime_of(path),
            change,
        });
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        out.push(FileChange {
            path: path.clone(),
            size: 0,
            mime: crate::mime_of(path),
            change: FileChangeKind::Deleted,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_tracebacks_become_name_value_traceback() {
        let stderr = "noise\nTraceback (most recent call last):\n  File \"/opt/runcell/input/main.py\", line 1, in <module>\n    1/0\nZeroDivisionError: division by zero\n";
        let e = python_error(stderr).expect("error");
        assert_eq!(e.name, "ZeroDivisionError");
        assert_eq!(e.value, "division by zero");
        assert!(e.traceback.starts_with("Traceback") && e.traceback.ends_with("by zero"));
        let e = python_error("Traceback (most recent call last):\nKeyboardInterrupt\n").expect("e");
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            ("KeyboardInterrupt", "")
        );
        assert!(python_error("plain failure").is_none());
    }

    #[test]
    fn limits_are_validated() {
        let ok = resolve_limits(&LimitsRequest::default()).expect("defaults");
        assert_eq!(ok.memory_bytes, 1 << 30);
        assert_eq!(ok.cpu_millis, 1000);
        for bad in [
            LimitsRequest {
                memory_mb: Some(0),
                ..Default::default()
            },
            LimitsRequest {
                cpu: Some(f64::NAN),
                ..Default::default()
            },
            LimitsRequest {
                pids: Some(1),
                ..Default::default()
            },
            LimitsRequest {
                disk_mb: Some(0),
                ..Default::default()
            },
        ] {
            assert!(matches!(
                resolve_limits(&bad),
                Err(EngineError::InvalidRequest(_))
            ));
        }
    }

    #[test]
    fn file_diff_reports_created_modified_deleted() {
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let t1 = t0 + Duration::from_secs(1);
        let st = |size, modified| FileStat { size, modified };
        let before = BTreeMap::from([("a.txt".into(), st(1, t0)), ("b.csv".into(), st(2, t0))]);
        let after = BTreeMap::from([("a.txt".into(), st(1, t1)), ("c.png".into(), st(3, t1))]);
        let d = diff_files(&before, &after);
        let got: Vec<_> = d
            .iter()
            .map(|f| (f.path.as_str(), f.change, f.mime.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a.txt", FileChangeKind::Modified, "text/plain"),
                ("c.png", FileChangeKind::Created, "image/png"),
                ("b.csv", FileChangeKind::Deleted, "text/csv"),
            ]
        );
    }
}
