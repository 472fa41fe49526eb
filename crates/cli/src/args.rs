//! Flags and inputs `run` and `repl` share.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use runcell_engine::{InputFile, Language};

#[derive(Debug, clap::Args)]
pub struct SandboxArgs {
    /// The language.
    #[arg(long, default_value = "python", value_parser = parse_lang)]
    pub lang: Language,
    /// Memory limit in MiB (page cache and /tmp included).
    #[arg(long, value_name = "MB")]
    pub memory: Option<u64>,
    /// A file copied into /workspace before the code starts (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Print Execution objects as JSON instead of the output.
    #[arg(long)]
    pub json: bool,
}

fn parse_lang(s: &str) -> Result<Language, String> {
    s.parse()
}

impl SandboxArgs {
    /// The `--file`s, read, each named after its file name in /workspace.
    pub fn input_files(&self) -> anyhow::Result<Vec<InputFile>> {
        self.files
            .iter()
            .map(|f| {
                let content = std::fs::read(f)
                    .with_context(|| format!("cannot read --file {}", f.display()))?;
                let name = f
                    .file_name()
                    .and_then(|n| n.to_str())
                    .with_context(|| format!("--file {} has no usable file name", f.display()))?;
                Ok(InputFile {
                    path: name.to_owned(),
                    content,
                })
            })
            .collect()
    }
}

/// `--timeout S` as a duration (positive); the engine refuses one over its maximum (an hour)
/// rather than shortening it.
pub fn timeout(seconds: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(seconds) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(invalid("--timeout must be a positive number of seconds")),
    }
}

/// A value of a flag or of the config file that runcell refuses: the hint points at `--help`.
#[derive(Debug)]
pub struct InvalidArgs(pub String);

impl std::fmt::Display for InvalidArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid request: {}", self.0)
    }
}

impl std::error::Error for InvalidArgs {}

/// `Err(invalid(...))`: an [`InvalidArgs`], as the commands return it.
pub fn invalid(message: impl Into<String>) -> anyhow::Error {
    InvalidArgs(message.into()).into()
}
