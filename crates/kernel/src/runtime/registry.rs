//! The runtimes kept under `<data_dir>/runtimes`: listing, removing, and the install protocol
//! around a build (one installer at a time, a `.tmp-` build directory, the completion marker
//! written last, a rename into place).

use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::{io_err, RuntimeError};
use super::lock::PYTHON_LOCK;
use super::python::{system_python_minor_from_path, system_python_version};
use super::venv::{build_python, finish, remove_any, Built, InstallEvent, TOTAL_STEPS};

/// Written last into a runtime; holds its [`Marker`] as JSON.
const MARKER: &str = ".runcell-complete";

/// The file installs and removals `flock`.
const INSTALL_LOCK: &str = ".install.lock";

/// Prefix of build and removal directories (never a runtime).
const TMP_PREFIX: &str = ".tmp-";

/// Marker format version.
const MARKER_FORMAT: u32 = 1;

/// An installed runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// Directory name under the runtimes root, e.g. `python-3.11-0123456789ab`.
    pub name: String,
    /// The runtime's directory on the host (bind it at [`super::SANDBOX_PYTHON_PREFIX`]).
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

/// Builds a runtime tree into the given (not yet existing) directory.
type Build<'b> =
    dyn FnMut(&Path, &mut dyn FnMut(InstallEvent<'_>)) -> Result<Built, RuntimeError> + 'b;

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

/// Makes a built tree final ([`finish`]), then writes its marker (last: from then on the
/// runtime is complete).
fn finalize(dir: &Path, name: &str, lock_hash: &str, built: Built) -> Result<Marker, RuntimeError> {
    let size_bytes = finish(dir)?;
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

#[cfg(test)]
mod tests {
    use super::super::python::SYSTEM_PYTHON;
    use super::*;
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

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
