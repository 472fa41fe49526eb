//! `runcell serve --config FILE`: the same settings as `serve`'s flags, in TOML. Each key is a
//! flag's long name with `_` for `-`; a flag given on the command line wins over the file; a
//! key the server does not know is an error naming it (a typo must not pass silently).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

/// The file's keys (docs/operations.md shows an example).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    pub listen: Option<SocketAddr>,
    /// Used when neither `--data-dir` nor `RUNCELL_DATA_DIR` is given.
    pub data_dir: Option<PathBuf>,
    pub preload: Option<Vec<String>>,
    pub no_zygote: Option<bool>,
    pub warm_sessions: Option<u16>,
    pub warm_one_shots: Option<u16>,
    pub max_batch_runs: Option<u16>,
    pub max_tests_per_run: Option<u16>,
    pub scheduling: Option<String>,
    pub agent_provider: Option<String>,
    pub agent_model: Option<String>,
    pub agent_base_url: Option<String>,
    pub agent_max_steps: Option<usize>,
    /// Added to `--allowed-hosts`.
    pub allowed_hosts: Option<Vec<String>>,
    /// Added to `--egress-allow` and `--egress-allow-cidr`.
    pub egress_allow: Option<Vec<String>>,
    pub egress_allow_cidr: Option<Vec<String>>,
    /// Added to `--egress-ca-file`.
    pub egress_ca_file: Option<Vec<PathBuf>>,
    pub pip_index_url: Option<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub audit_checkpoint_every: Option<u64>,
    pub audit_checkpoint_interval_s: Option<u64>,
    pub audit_checkpoint_file: Option<PathBuf>,
    pub max_connections: Option<u32>,
    pub max_sessions: Option<u32>,
    pub header_timeout: Option<u64>,
    pub keep_alive_timeout: Option<u64>,
    pub body_timeout: Option<u64>,
    pub body_min_rate: Option<u64>,
    pub max_memory_mb: Option<u64>,
    pub max_cpu: Option<f64>,
    pub max_pids: Option<u64>,
    pub max_disk_mb: Option<u64>,
    pub max_exec_timeout_s: Option<u64>,
    pub max_idle_timeout_s: Option<u64>,
    pub max_pause_after_s: Option<u64>,
    pub max_expire_after_s: Option<u64>,
    pub max_committed_memory_mb: Option<u64>,
    pub default_memory_mb: Option<u64>,
    pub default_cpu: Option<f64>,
    pub default_pids: Option<u64>,
    pub default_disk_mb: Option<u64>,
    pub default_exec_timeout_s: Option<u64>,
    pub default_idle_timeout_s: Option<u64>,
    pub default_pause_after_s: Option<u64>,
    pub default_expire_after_s: Option<u64>,
    /// `[mcp_servers.NAME]` tables; a `--mcp-server` of the same name replaces one.
    pub mcp_servers: Option<std::collections::BTreeMap<String, McpServerFile>>,
}

/// One `[mcp_servers.NAME]` table: `command` (stdio) or `url` (streamable HTTP), who may use
/// it and its bounds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerFile {
    /// The program and its arguments: `["github-mcp-server", "stdio"]`, or one string split
    /// into words as `--mcp-server` splits it.
    pub command: Option<CommandLine>,
    pub url: Option<String>,
    /// Tenant names, or `["*"]` for every tenant [default: none].
    pub tenants: Option<Vec<String>>,
    /// Seconds a call may take [default: 60].
    pub timeout_s: Option<u64>,
    /// Calls in flight at once, over all sessions [default: 8].
    pub max_concurrency: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum CommandLine {
    Words(Vec<String>),
    Line(String),
}

impl ServeFile {
    pub fn read(path: &Path) -> anyhow::Result<ServeFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --config {}", path.display()))?;
        toml::from_str(&text).map_err(|e| {
            // toml's message names the key and shows the line (`unknown field `x`, expected
            // one of ...`); keep it whole, on its own lines.
            anyhow::anyhow!(
                "invalid configuration in {}: {}",
                path.display(),
                e.to_string().trim_end()
            )
        })
    }
}

/// `path` made absolute against the working directory (not resolved: symlinks stay as named).
pub(crate) fn absolute_data_dir(path: &Path) -> anyhow::Result<PathBuf> {
    if path.as_os_str().is_empty() {
        anyhow::bail!("the data dir must not be empty");
    }
    std::path::absolute(path)
        .map_err(|e| anyhow::anyhow!("cannot make the data dir {} absolute: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named_and_known_ones_read() {
        let f: ServeFile =
            toml::from_str("listen = \"127.0.0.1:9\"\nmax_memory_mb = 512\n").expect("known keys");
        assert_eq!(f.max_memory_mb, Some(512));
        let e = toml::from_str::<ServeFile>("max_memroy_mb = 512\n").expect_err("a typo");
        assert!(e.to_string().contains("max_memroy_mb"), "{e}");
    }

    #[test]
    fn mcp_servers_are_tables() {
        let f: ServeFile = toml::from_str(
            "[mcp_servers.github]\ncommand = [\"gh-mcp\", \"stdio\"]\ntenants = [\"acme\"]\n\
             [mcp_servers.docs]\nurl = \"http://127.0.0.1:9/mcp\"\ntimeout_s = 5\n",
        )
        .expect("tables");
        let servers = f.mcp_servers.expect("mcp_servers");
        assert!(
            matches!(&servers["github"].command, Some(CommandLine::Words(w)) if w[0] == "gh-mcp")
        );
        assert_eq!(servers["docs"].timeout_s, Some(5));
        let e =
            toml::from_str::<ServeFile>("[mcp_servers.a]\ncomand = \"x\"\n").expect_err("a typo");
        assert!(e.to_string().contains("comand"), "{e}");
    }
}
