//! The operator's MCP servers as configured (`serve --mcp-server NAME=COMMAND ARGS...` or
//! `NAME=URL`, `--mcp-server-tenants NAME=TENANT,...`, or `[mcp_servers.NAME]` in the config
//! file): parsed and checked once, at start-up, so a mistake stops the server with a message
//! naming the server instead of failing each call.

use std::collections::BTreeSet;
use std::time::Duration;

/// A call with no answer by then fails as an exception in the cell (the server stays up).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Calls in flight to one server at once, over every session; the rest wait their turn
/// (within their own deadline).
pub const DEFAULT_MAX_CONCURRENCY: usize = 8;
/// The longest server name (it becomes a Python module name).
const MAX_NAME_LEN: usize = 64;

/// Python's keywords: a server so named could not be imported (`from runcell_tools.mcp import
/// class` is a syntax error).
const PYTHON_KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// How runcell reaches a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A program runcell starts on the host and speaks to over its stdin/stdout: the
    /// operator's command line, exactly as configured; nothing a session sends ever reaches it.
    Stdio { program: String, args: Vec<String> },
    /// A streamable HTTP endpoint (`http://` or `https://`).
    Http { url: String },
}

/// Which tenants' sessions may import a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantAccess {
    /// Every tenant (`*`).
    All,
    /// These tenants only; empty (the default) means none: an operator's MCP server holds the
    /// operator's credentials (a GitHub token, a database), so exposing one to every API key
    /// must be a decision, not an accident.
    Only(BTreeSet<String>),
}

impl TenantAccess {
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            TenantAccess::All => true,
            TenantAccess::Only(names) => names.contains(tenant),
        }
    }

    /// `*` alone is every tenant; anything else is a list of names.
    pub fn from_names<I: IntoIterator<Item = String>>(names: I) -> Result<Self, McpConfigError> {
        let mut set = BTreeSet::new();
        let mut all = false;
        for name in names {
            let name = name.trim().to_owned();
            if name == "*" {
                all = true;
            } else if name.is_empty() {
                return Err(McpConfigError::Tenants("an empty tenant name".into()));
            } else {
                set.insert(name);
            }
        }
        match (all, set.is_empty()) {
            (true, true) => Ok(TenantAccess::All),
            (true, false) => Err(McpConfigError::Tenants(
                "`*` (every tenant) cannot be listed with names".into(),
            )),
            (false, _) => Ok(TenantAccess::Only(set)),
        }
    }
}

/// One server: what it is, who may use it, and its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    pub name: String,
    pub transport: McpTransport,
    pub tenants: TenantAccess,
    pub call_timeout: Duration,
    pub max_concurrency: usize,
}

impl McpServerConfig {
    pub fn new(name: &str, transport: McpTransport) -> Result<Self, McpConfigError> {
        check_name(name)?;
        Ok(McpServerConfig {
            name: name.to_owned(),
            transport,
            tenants: TenantAccess::Only(BTreeSet::new()),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
        })
    }

    /// `--mcp-server NAME=URL` (streamable HTTP) or `NAME=COMMAND ARGS...` (stdio; the command
    /// line is split as a POSIX shell splits words, quotes and backslashes included, but never
    /// run by a shell: no variables, globs or pipes).
    pub fn parse_flag(flag: &str) -> Result<Self, McpConfigError> {
        let (name, spec) = flag
            .split_once('=')
            .ok_or_else(|| McpConfigError::Flag(flag.to_owned()))?;
        let name = name.trim();
        let spec = spec.trim();
        if spec.starts_with("http://") || spec.starts_with("https://") {
            return Self::new(name, http(name, spec)?);
        }
        let words = shlex::split(spec).ok_or_else(|| McpConfigError::Command {
            name: name.to_owned(),
            why: "unbalanced quotes or a trailing backslash".into(),
        })?;
        Self::new(name, stdio(name, words)?)
    }

    /// Sets the call timeout (1 s to 1 hour).
    pub fn with_call_timeout(mut self, seconds: u64) -> Result<Self, McpConfigError> {
        if !(1..=3600).contains(&seconds) {
            return Err(McpConfigError::Bound {
                name: self.name,
                what: "timeout_s must be 1 to 3600",
            });
        }
        self.call_timeout = Duration::from_secs(seconds);
        Ok(self)
    }

    /// Sets the calls in flight at once (1 to 256).
    pub fn with_max_concurrency(mut self, n: usize) -> Result<Self, McpConfigError> {
        if !(1..=256).contains(&n) {
            return Err(McpConfigError::Bound {
                name: self.name,
                what: "max_concurrency must be 1 to 256",
            });
        }
        self.max_concurrency = n;
        Ok(self)
    }
}

/// A stdio transport from a command line already split into words.
pub fn stdio(name: &str, mut words: Vec<String>) -> Result<McpTransport, McpConfigError> {
    if words.is_empty() || words[0].is_empty() {
        return Err(McpConfigError::Command {
            name: name.to_owned(),
            why: "no command".into(),
        });
    }
    let program = words.remove(0);
    Ok(McpTransport::Stdio {
        program,
        args: words,
    })
}

/// A streamable HTTP transport, its URL checked for a scheme and a host.
pub fn http(name: &str, url: &str) -> Result<McpTransport, McpConfigError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    let host = rest.and_then(|r| r.split(['/', '?', '#']).next());
    match host {
        Some(h) if !h.is_empty() && !url.chars().any(char::is_whitespace) => {
            Ok(McpTransport::Http {
                url: url.to_owned(),
            })
        }
        _ => Err(McpConfigError::Url {
            name: name.to_owned(),
            url: url.to_owned(),
        }),
    }
}

/// `--mcp-server-tenants NAME=TENANT,...` (or `NAME=*`).
pub fn parse_tenants_flag(flag: &str) -> Result<(String, TenantAccess), McpConfigError> {
    let (name, list) = flag
        .split_once('=')
        .ok_or_else(|| McpConfigError::Tenants(format!("{flag:?}: expected NAME=TENANT,...")))?;
    let access = TenantAccess::from_names(list.split(',').map(str::to_owned))?;
    Ok((name.trim().to_owned(), access))
}

/// A server name: an ASCII Python identifier that is not a keyword and does not start with
/// `_` (the module's private names), at most 64 characters: it is the module's name in
/// `from runcell_tools.mcp import NAME`.
pub fn check_name(name: &str) -> Result<(), McpConfigError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= MAX_NAME_LEN
        && !PYTHON_KEYWORDS.contains(&name);
    if ok {
        Ok(())
    } else {
        Err(McpConfigError::Name(name.to_owned()))
    }
}

/// Everything that can be wrong in the configuration, each naming the server.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum McpConfigError {
    #[error("--mcp-server {0:?}: expected NAME=COMMAND ARGS... or NAME=http(s)://URL")]
    Flag(String),
    #[error(
        "MCP server name {0:?}: it must be a Python identifier (a letter, then letters, digits \
         or _; at most 64 characters; not a Python keyword), as it is imported by that name"
    )]
    Name(String),
    #[error("MCP server {name:?}: command: {why}")]
    Command { name: String, why: String },
    #[error("MCP server {name:?}: {url:?} is not an http:// or https:// URL with a host")]
    Url { name: String, url: String },
    #[error("MCP server {name:?}: {what}")]
    Bound { name: String, what: &'static str },
    #[error("MCP server tenants: {0}")]
    Tenants(String),
    #[error("MCP server {0:?} is configured twice")]
    Duplicate(String),
    #[error("--mcp-server-tenants names {0:?}, which is not a configured MCP server")]
    UnknownServer(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_give_stdio_and_http_servers() {
        let s = McpServerConfig::parse_flag(
            r#"github=npx -y "@modelcontextprotocol/server-github" --label 'a b'"#,
        )
        .expect("parses");
        assert_eq!(s.name, "github");
        assert_eq!(
            s.transport,
            McpTransport::Stdio {
                program: "npx".into(),
                args: vec![
                    "-y".into(),
                    "@modelcontextprotocol/server-github".into(),
                    "--label".into(),
                    "a b".into()
                ]
            }
        );
        assert_eq!(s.tenants, TenantAccess::Only(BTreeSet::new()));
        let h = McpServerConfig::parse_flag("docs=https://mcp.example.com/mcp").expect("parses");
        assert_eq!(
            h.transport,
            McpTransport::Http {
                url: "https://mcp.example.com/mcp".into()
            }
        );
    }

    #[test]
    fn mistakes_are_named() {
        assert_eq!(
            McpServerConfig::parse_flag("github"),
            Err(McpConfigError::Flag("github".into()))
        );
        for bad in ["my-server", "1st", "class", "_x", "", "ü"] {
            assert_eq!(
                McpServerConfig::parse_flag(&format!("{bad}=cmd")),
                Err(McpConfigError::Name(bad.into())),
                "{bad}"
            );
        }
        assert!(matches!(
            McpServerConfig::parse_flag("a=\"unclosed"),
            Err(McpConfigError::Command { .. })
        ));
        assert!(matches!(
            McpServerConfig::parse_flag("a="),
            Err(McpConfigError::Command { .. })
        ));
        assert!(matches!(
            McpServerConfig::parse_flag("a=http://"),
            Err(McpConfigError::Url { .. })
        ));
        let msg = McpConfigError::Name("my-server".into()).to_string();
        assert!(msg.contains("Python identifier"), "{msg}");
    }

    #[test]
    fn tenants_are_names_or_everyone() {
        let (name, access) = parse_tenants_flag("github=acme, default").expect("parses");
        assert_eq!(name, "github");
        assert!(access.allows("acme") && access.allows("default") && !access.allows("other"));
        let (_, all) = parse_tenants_flag("github=*").expect("parses");
        assert!(all.allows("anyone"));
        assert!(parse_tenants_flag("github=*,acme").is_err());
        assert!(parse_tenants_flag("github=acme,,b").is_err());
        assert!(parse_tenants_flag("github").is_err());
        assert!(!TenantAccess::Only(BTreeSet::new()).allows("default"));
    }
}
