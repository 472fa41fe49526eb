//! What one sandbox gets: the program, its environment, its mounts and its limits.
//!
//! The supervisor hands a [`Spec`] to the single-threaded init helper over the helper's control
//! socket as NUL-separated `key value` pairs: no byte but NUL needs escaping, no wire format is
//! involved, and nothing of it shows in the helper's command line (which pid 1 inside inherits
//! and the program could read).

use std::path::PathBuf;

/// The first argument that turns a runcell binary into the sandbox init helper.
pub const INIT_ARG: &str = "__sandbox-init";

/// The user and group id the sandboxed program runs as, inside its user namespace.
pub const SANDBOX_UID: u32 = 1000;
/// The in-sandbox name of [`SANDBOX_UID`].
pub const SANDBOX_USER: &str = "sandbox";
/// The hostname every sandbox sees.
pub const HOSTNAME: &str = "runcell";
/// Where the session's files live inside the sandbox (and the working directory).
pub const WORKSPACE: &str = "/workspace";

/// A read-only bind mount of a host path into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Absolute host path (file or directory).
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
}

/// Resource limits enforced inside the sandbox (the cgroup limits are applied by the
/// supervisor; these are the ones the init helper applies itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InnerLimits {
    /// Size of the `/tmp` and `/dev/shm` tmpfs mounts, each (bytes). Charged to the cgroup.
    pub tmp_bytes: u64,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// RLIMIT_FSIZE: the largest file one write may produce (bytes).
    pub fsize_bytes: u64,
    /// RLIMIT_NPROC, a backstop behind the cgroup pids limit (the host uid is per sandbox).
    pub nproc: u64,
}

/// Everything the init helper needs to build one sandbox and exec the program in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The program (absolute path inside the sandbox) and its arguments.
    pub argv: Vec<String>,
    /// The program's complete environment; nothing is inherited from the host.
    pub env: Vec<(String, String)>,
    /// Host directory bound read-write at `/workspace`.
    pub workspace: PathBuf,
    /// Read-only binds beyond the system directories (runtimes, the program file).
    pub ro_binds: Vec<Bind>,
    /// The unprivileged host uid (and gid) that the sandbox user maps to.
    pub host_uid: u32,
    /// `cgroup.procs` files the helper writes its own pid into before creating namespaces.
    pub cgroup_procs: Vec<PathBuf>,
    pub limits: InnerLimits,
    /// Whether the program gets a private channel (a Unix stream socket) to the supervisor at
    /// fd 3, beside stdio: how a kernel talks to the host without mixing with the user's output.
    pub channel: bool,
    /// A TCP port on the sandbox's loopback where pid 1 listens, before the program starts, for
    /// the host's egress proxy to take over ([`crate::Running::egress_listener`]). `None`: no
    /// socket at all (no network policy).
    pub egress_port: Option<u16>,
}

/// A spec that could not be decoded from the helper's command line.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("missing value for spec key {0:?}")]
    MissingValue(String),
    #[error("unknown spec key {0:?}")]
    UnknownKey(String),
    #[error("invalid number {value:?} for spec key {key:?}")]
    BadNumber { key: String, value: String },
    #[error("spec has no program to run")]
    NoProgram,
    #[error("spec field {0} must be an absolute path")]
    NotAbsolute(&'static str),
    #[error("spec value for {0} contains a NUL byte")]
    Nul(&'static str),
}

impl Spec {
    /// Encodes the spec as helper arguments (after [`INIT_ARG`]).
    pub fn to_args(&self) -> Result<Vec<String>, SpecError> {
        let mut out = Vec::new();
        let mut push = |key: &str, value: String| {
            out.push(key.to_owned());
            out.push(value);
        };
        for a in &self.argv {
            push("arg", a.clone());
        }
        for (k, v) in &self.env {
            if k.contains('=') || k.is_empty() {
                return Err(SpecError::Nul("env name"));
            }
            push("env", format!("{k}={v}"));
        }
        push("workspace", path_str(&self.workspace, "workspace")?);
        for b in &self.ro_binds {
            push("ro-src", path_str(&b.source, "ro-bind source")?);
            push("ro-dst", path_str(&b.target, "ro-bind target")?);
        }
        push("host-uid", self.host_uid.to_string());
        for p in &self.cgroup_procs {
            push("cgroup-procs", path_str(p, "cgroup procs")?);
        }
        push("tmp-bytes", self.limits.tmp_bytes.to_string());
        push("nofile", self.limits.nofile.to_string());
        push("fsize-bytes", self.limits.fsize_bytes.to_string());
        push("nproc", self.limits.nproc.to_string());
        push("channel", u8::from(self.channel).to_string());
        if let Some(port) = self.egress_port {
            push("egress-port", port.to_string());
        }
        if out.iter().any(|s| s.contains('\0')) {
            return Err(SpecError::Nul("argument"));
        }
        Ok(out)
    }

    /// The pairs of [`Spec::to_args`], NUL-terminated, as sent to the helper.
    pub fn to_bytes(&self) -> Result<Vec<u8>, SpecError> {
        let mut out = Vec::new();
        for a in self.to_args()? {
            out.extend_from_slice(a.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// Decodes what [`Spec::to_bytes`] produced.
    pub fn from_bytes(bytes: &[u8]) -> Result<Spec, SpecError> {
        let text = std::str::from_utf8(bytes).map_err(|_| SpecError::Nul("utf-8"))?;
        let text = text.strip_suffix('\0').unwrap_or(text);
        if text.is_empty() {
            return Err(SpecError::NoProgram);
        }
        Spec::from_args(text.split('\0').map(str::to_owned))
    }

    /// Decodes what [`Spec::to_args`] produced.
    pub fn from_args<I: IntoIterator<Item = String>>(args: I) -> Result<Spec, SpecError> {
        let mut spec = Spec {
            argv: Vec::new(),
            env: Vec::new(),
            workspace: PathBuf::new(),
            ro_binds: Vec::new(),
            host_uid: 0,
            cgroup_procs: Vec::new(),
            // Set once every limit has been read.
            limits: InnerLimits {
                tmp_bytes: 0,
                nofile: 0,
                fsize_bytes: 0,
                nproc: 0,
            },
            channel: false,
            egress_port: None,
        };
        // Every limit must be named: a spec never falls back to numbers of its own.
        let [mut tmp, mut nofile, mut fsize, mut nproc] = [None; 4];
        let mut pending_src: Option<PathBuf> = None;
        let mut it = args.into_iter();
        while let Some(key) = it.next() {
            let value = it
                .next()
                .ok_or_else(|| SpecError::MissingValue(key.clone()))?;
            let number = |v: &str| {
                v.parse::<u64>().map_err(|_| SpecError::BadNumber {
                    key: key.clone(),
                    value: v.to_owned(),
                })
            };
            match key.as_str() {
                "arg" => spec.argv.push(value),
                "env" => {
                    let (k, v) = value.split_once('=').unwrap_or((value.as_str(), ""));
                    spec.env.push((k.to_owned(), v.to_owned()));
                }
                "workspace" => spec.workspace = PathBuf::from(value),
                "ro-src" => pending_src = Some(PathBuf::from(value)),
                "ro-dst" => {
                    let source = pending_src
                        .take()
                        .ok_or_else(|| SpecError::MissingValue("ro-src".into()))?;
                    spec.ro_binds.push(Bind {
                        source,
                        target: PathBuf::from(value),
                    });
                }
                "host-uid" => {
                    spec.host_uid =
                        u32::try_from(number(&value)?).map_err(|_| SpecError::BadNumber {
                            key: key.clone(),
                            value: value.clone(),
                        })?
                }
                "cgroup-procs" => spec.cgroup_procs.push(PathBuf::from(value)),
                "tmp-bytes" => tmp = Some(number(&value)?),
                "nofile" => nofile = Some(number(&value)?),
                "fsize-bytes" => fsize = Some(number(&value)?),
                "nproc" => nproc = Some(number(&value)?),
                "channel" => spec.channel = number(&value)? == 1,
                "egress-port" => {
                    spec.egress_port =
                        Some(
                            u16::try_from(number(&value)?).map_err(|_| SpecError::BadNumber {
                                key: key.clone(),
                                value: value.clone(),
                            })?,
                        )
                }
                _ => return Err(SpecError::UnknownKey(key)),
            }
        }
        let named =
            |v: Option<u64>, key: &str| v.ok_or_else(|| SpecError::MissingValue(key.into()));
        spec.limits = InnerLimits {
            tmp_bytes: named(tmp, "tmp-bytes")?,
            nofile: named(nofile, "nofile")?,
            fsize_bytes: named(fsize, "fsize-bytes")?,
            nproc: named(nproc, "nproc")?,
        };
        spec.validate()?;
        Ok(spec)
    }

    pub(crate) fn validate(&self) -> Result<(), SpecError> {
        if self.argv.is_empty() {
            return Err(SpecError::NoProgram);
        }
        if !self.workspace.is_absolute() {
            return Err(SpecError::NotAbsolute("workspace"));
        }
        for b in &self.ro_binds {
            if !b.source.is_absolute() || !b.target.is_absolute() {
                return Err(SpecError::NotAbsolute("ro-bind"));
            }
        }
        Ok(())
    }
}

fn path_str(p: &std::path::Path, what: &'static str) -> Result<String, SpecError> {
    p.to_str().map(str::to_owned).ok_or(SpecError::Nul(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Spec {
        Spec {
            argv: vec![
                "/usr/bin/python3".into(),
                "-c".into(),
                "print('a b\\n=c')".into(),
            ],
            env: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("X".into(), "a=b\nc".into()),
            ],
            workspace: "/tmp/ws".into(),
            ro_binds: vec![Bind {
                source: "/opt/py".into(),
                target: "/opt/runcell/python".into(),
            }],
            host_uid: 2_000_000_123,
            cgroup_procs: vec!["/sys/fs/cgroup/memory/runcell/x/cgroup.procs".into()],
            limits: InnerLimits {
                tmp_bytes: 1,
                nofile: 2,
                fsize_bytes: 3,
                nproc: 4,
            },
            channel: true,
            egress_port: Some(3128),
        }
    }

    #[test]
    fn round_trips_through_arguments() {
        let spec = sample();
        let args = spec.to_args().expect("encode");
        assert_eq!(Spec::from_args(args).expect("decode"), spec);
        let bytes = spec.to_bytes().expect("bytes");
        assert_eq!(Spec::from_bytes(&bytes).expect("decode bytes"), spec);
        assert!(Spec::from_bytes(b"").is_err());
    }

    #[test]
    fn rejects_malformed_arguments() {
        let err = Spec::from_args(["arg".to_string()]).expect_err("odd count");
        assert_eq!(err.to_string(), "missing value for spec key \"arg\"");
        let err = Spec::from_args(["bogus".to_string(), "1".to_string()]).expect_err("key");
        assert_eq!(err.to_string(), "unknown spec key \"bogus\"");
        let mut args = sample().to_args().expect("encode");
        let pos = args.iter().position(|a| a == "nofile").expect("nofile");
        args[pos + 1] = "-1".into();
        assert!(matches!(
            Spec::from_args(args),
            Err(SpecError::BadNumber { .. })
        ));
        let mut args = sample().to_args().expect("encode");
        let pos = args.iter().position(|a| a == "nproc").expect("nproc");
        args.drain(pos..pos + 2);
        let err = Spec::from_args(args).expect_err("no nproc");
        assert_eq!(err.to_string(), "missing value for spec key \"nproc\"");
        let mut relative = sample();
        relative.workspace = "ws".into();
        let args = relative.to_args().expect("encode");
        assert!(matches!(
            Spec::from_args(args),
            Err(SpecError::NotAbsolute("workspace"))
        ));
    }
}
