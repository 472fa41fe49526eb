//! Every sandbox the engine starts is described here: the program, its environment, its binds
//! and its limits. A session's kernel, a command beside it, a one-shot program and the zygote
//! all come from here ([`launch`], [`zygote_config`]), so what one sandbox sees cannot drift
//! from what another does.

use std::path::{Path, PathBuf};

use runcell_kernel::{runtime::SANDBOX_PYTHON_BIN, KernelProgram, SANDBOX_KERNEL_DIR};
use runcell_sandbox::{Bind, Launch, Workspace, ZygoteConfig};

use crate::limits::SessionLimits;
use crate::model::Language;
use crate::EngineError;

/// Where the Python runtime (a venv) appears inside every sandbox.
pub const SANDBOX_PYTHON: &str = runcell_kernel::runtime::SANDBOX_PYTHON_PREFIX;
/// Where a one-shot run's program file is bound, read-only, inside its sandbox.
const INPUT_DIR: &str = "/opt/runcell/input";
/// The shell that runs commands and one-shot bash programs.
const BASH: &str = "/bin/bash";

/// What a sandbox runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Program<'a> {
    /// A session's kernel, which talks to the host over a channel at fd 3.
    Kernel(Language),
    /// A shell command beside a session's kernel.
    Command(&'a str),
    /// A one-shot program: `dir` holds its file, named [`program_file`]; `args` follow it on
    /// the command line.
    OneShot {
        language: Language,
        dir: &'a Path,
        args: &'a [String],
    },
}

impl Language {
    /// This language's in-sandbox kernel (the kernel crate says how it is started).
    pub(crate) fn kernel(self) -> &'static KernelProgram {
        match self {
            Language::Python => &runcell_kernel::PYTHON,
            Language::Bash => &runcell_kernel::BASH,
            Language::Javascript => &runcell_kernel::JAVASCRIPT,
        }
    }
}

/// What a launch takes from the engine's host.
pub(crate) struct Host<'a> {
    /// The Python runtime (a venv) bound into every sandbox; none: the system's Python.
    pub(crate) python_runtime: Option<&'a Path>,
    /// The kernel code's host directory (written on first use, so asked only for kernels).
    pub(crate) kernel_dir: &'a dyn Fn() -> Result<PathBuf, EngineError>,
    /// The trust files for sandboxes with a network (crate::network::TRUST_DIR).
    pub(crate) trust_dir: Option<&'a Path>,
    /// `serve --pip-index-url`, for sandboxes with a network.
    pub(crate) pip_index_url: Option<&'a str>,
}

/// The sandbox for `program` on `workspace` under `limits`. `extra_env` (the session's
/// variables) comes after runcell's own and never replaces one of them. With `network`, pid 1
/// opens the egress socket and the proxy variables point at it (crate::network).
pub(crate) fn launch<'w>(
    host: &Host<'_>,
    program: Program<'_>,
    workspace: &'w Workspace,
    limits: &SessionLimits,
    extra_env: &[(String, String)],
    network: bool,
) -> Result<Launch<'w>, EngineError> {
    let limits = limits.sandbox_limits();
    // The runtime is bound for every program: `python3` in a bash cell or a command is the
    // same data-science Python as a Python session's.
    let (python, mut ro_binds) = python(host.python_runtime);
    let (argv, env_language, channel) = match program {
        Program::Kernel(language) => {
            ro_binds.push(Bind {
                source: (host.kernel_dir)()?,
                target: SANDBOX_KERNEL_DIR.into(),
            });
            (language.kernel().command(&python), language, true)
        }
        // The session's runtime is on PATH, so `python3` and `pip list` see the same
        // packages, with the same environment.
        Program::Command(command) => (
            vec![BASH.into(), "-c".into(), command.to_owned()],
            Language::Python,
            false,
        ),
        Program::OneShot {
            language,
            dir,
            args,
        } => {
            ro_binds.push(Bind {
                source: dir.to_owned(),
                target: INPUT_DIR.into(),
            });
            let program = format!("{INPUT_DIR}/{}", program_file(language));
            let interpreter = match language {
                Language::Python => python,
                Language::Bash => BASH.into(),
                Language::Javascript => runcell_kernel::NODE.into(),
            };
            let argv = [interpreter, program]
                .into_iter()
                .chain(args.iter().cloned())
                .collect();
            (argv, language, false)
        }
    };
    let mut env = base_env(
        env_language,
        limits.cpu_millis,
        host.python_runtime.is_some(),
    );
    if network {
        env.extend(crate::network::proxy_env(
            host.trust_dir.is_some(),
            host.pip_index_url,
        ));
        if let Some(dir) = host.trust_dir {
            ro_binds.push(Bind {
                source: dir.to_owned(),
                target: crate::network::TRUST_DIR.into(),
            });
        }
    }
    for (k, v) in extra_env {
        if !env.iter().any(|(ek, _)| ek == k) {
            env.push((k.clone(), v.clone()));
        }
    }
    Ok(Launch {
        argv,
        env,
        workspace,
        ro_binds,
        limits,
        channel,
        egress_port: network.then_some(crate::network::EGRESS_PORT),
    })
}

/// The session's interpreter inside the sandbox and the binds it needs: the runtime's when one
/// is configured, else the system's.
fn python(runtime: Option<&Path>) -> (String, Vec<Bind>) {
    match runtime {
        Some(venv) => (
            SANDBOX_PYTHON_BIN.into(),
            vec![Bind {
                source: venv.to_owned(),
                target: SANDBOX_PYTHON.into(),
            }],
        ),
        None => (runcell_kernel::SYSTEM_PYTHON.into(), Vec::new()),
    }
}

/// The zygote's sandbox (DESIGN.md §4): the runtime's interpreter (Python `version`, `X.Y`)
/// with the kernel code, preloading `preload`, in a Python session's environment at the
/// default CPU quota: one BLAS thread, which is also what keeps the zygote single-threaded.
pub(crate) fn zygote_config(
    runtime: &Path,
    kernel_dir: PathBuf,
    version: &str,
    preload: Vec<String>,
    merge_session_pages: bool,
    workspace_dirs: Vec<PathBuf>,
) -> ZygoteConfig {
    let mut env = base_env(Language::Python, 1000, true);
    if merge_session_pages {
        // The kernel module marks the zygote's memory mergeable at its first fork
        // (runcell_kernel._mark_mergeable); sessions never see this: each gets its own
        // environment.
        env.push(("RUNCELL_ZYGOTE_MERGE_PAGES".into(), "1".into()));
    }
    ZygoteConfig {
        python: SANDBOX_PYTHON_BIN.into(),
        libpython: runcell_sandbox::zygote::libpython_for(version),
        binds: vec![
            (runtime.to_owned(), SANDBOX_PYTHON.into()),
            (kernel_dir, SANDBOX_KERNEL_DIR.into()),
        ],
        env,
        kernel_dir: SANDBOX_KERNEL_DIR.into(),
        kernel_module: runcell_kernel::PYTHON.module().into(),
        preload,
        detach_below: workspace_dirs,
    }
}

/// The name of a one-shot program's file, which its interpreter is given.
pub(crate) fn program_file(language: Language) -> &'static str {
    match language {
        Language::Python => "main.py",
        Language::Bash => "main.sh",
        Language::Javascript => "main.js",
    }
}

/// The whole environment a program sees. Nothing comes from the host.
pub(crate) fn base_env(
    language: Language,
    cpu_millis: u64,
    has_runtime: bool,
) -> Vec<(String, String)> {
    let threads = cpu_millis.div_ceil(1000).max(1).to_string();
    let path = if has_runtime {
        format!("{SANDBOX_PYTHON}/bin:/usr/local/bin:/usr/bin:/bin")
    } else {
        "/usr/local/bin:/usr/bin:/bin".to_owned()
    };
    let mut env: Vec<(&str, String)> = vec![
        ("PATH", path),
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
            // The runtime is read-only: compiled files could not be written anyway.
            ("PYTHONDONTWRITEBYTECODE", "1".into()),
            ("MPLBACKEND", "Agg".into()),
            ("MPLCONFIGDIR", "/tmp/.matplotlib".into()),
            // BLAS pools sized to the CPU quota, not to the host's cores.
            ("OPENBLAS_NUM_THREADS", threads.clone()),
            ("OMP_NUM_THREADS", threads.clone()),
            ("MKL_NUM_THREADS", threads),
        ]),
        Language::Javascript => env.push(("NODE_OPTIONS", "--max-old-space-size=4096".into())),
        Language::Bash => {}
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
