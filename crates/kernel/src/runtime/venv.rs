//! Building one runtime: a virtual environment on the system Python with the lock's packages,
//! compiled ahead of time, smoke-tested, pointed at the path it runs at in the sandbox
//! ([`SANDBOX_PYTHON_PREFIX`]) and made readable to the sandbox user.

use std::collections::VecDeque;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use super::error::{io_err, RuntimeError};
use super::lock::parse_lock;
use super::python::{python_command, system_python_version, SYSTEM_PYTHON};

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

/// The lock file as copied into each runtime (provenance, and pip's `-r` argument).
pub(super) const LOCK_COPY: &str = "python.lock";

/// pip's cache and matplotlib's config dir during the build; removed before the rename.
pub(super) const PIP_CACHE: &str = ".pip-cache";
const MPL_CONFIG: &str = ".mplconfig";

/// Number of [`InstallEvent::Step`]s an install reports.
pub(super) const TOTAL_STEPS: usize = 5;

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

/// What a build produced, besides the tree itself.
#[derive(Debug)]
pub(super) struct Built {
    pub(super) python_version: String,
    pub(super) packages: Vec<(String, String)>,
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
pub(super) fn build_python(
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

/// Makes a built tree final but for its marker: drops the build's scratch directories, points
/// scripts at the sandbox prefix and makes it world-readable. Returns the size of its files.
pub(super) fn finish(dir: &Path) -> Result<u64, RuntimeError> {
    for scratch in [PIP_CACHE, MPL_CONFIG] {
        let path = dir.join(scratch);
        match remove_any(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &path)(e)),
        }
    }
    relocate(dir)?;
    make_world_readable(dir)
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
pub(super) fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
