//! The domain objects users see, shaped exactly as DESIGN.md §6 (the JSON is the contract).

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize, Serializer};

/// A language runcell can run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Bash,
    Javascript,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Javascript => "javascript",
        }
    }
}

impl std::str::FromStr for Language {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "python" | "python3" | "py" => Ok(Language::Python),
            "bash" | "sh" | "shell" => Ok(Language::Bash),
            "javascript" | "js" | "node" => Ok(Language::Javascript),
            other => Err(format!(
                "unknown language {other:?} (expected python, bash or javascript)"
            )),
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionStatus {
    Ok,
    Error,
    Timeout,
    Interrupted,
    Killed,
    /// Not finished: suspended on client tool calls (`pending_tool_calls`), answered with
    /// `POST /v1/executions/{id}/continue` (issue 22). Never recorded: only the end is.
    Waiting,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KilledBy {
    Timeout,
    Oom,
    Pids,
    Output,
    Signal,
}

impl From<runcell_sandbox::KillReason> for KilledBy {
    fn from(k: runcell_sandbox::KillReason) -> Self {
        use runcell_sandbox::KillReason as K;
        match k {
            K::Timeout => KilledBy::Timeout,
            K::Oom => KilledBy::Oom,
            K::Pids => KilledBy::Pids,
            K::Output => KilledBy::Output,
            K::Signal => KilledBy::Signal,
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncated {
    pub stdout: bool,
    pub stderr: bool,
    /// Results were dropped over the per-execution limits; the last result says how many.
    /// (Absent in records written before it existed.)
    #[serde(default)]
    pub results: bool,
    /// `files` lists only part of what changed: more than
    /// [`MAX_FILE_CHANGES`](crate::MAX_FILE_CHANGES) changes, or a workspace that could not
    /// be read whole (then nothing unseen is reported deleted). (Absent in records written
    /// before it existed.)
    #[serde(default)]
    pub files: bool,
}

/// A Jupyter MIME bundle, and the data of the chart it pictures.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultItem {
    pub is_main_result: bool,
    pub data: BTreeMap<String, String>,
    /// What a matplotlib figure plots (E2B's chart shape: `type`, `title`, axes, `elements`),
    /// beside its PNG; absent for anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub chart: Option<serde_json::Value>,
}

/// The key under which the Python kernel sends a figure's chart inside its bundle
/// (`crates/kernel/python/runcell_charts.py`); [`ResultItem::new`] moves it to `chart`.
const CHART_MIME: &str = "application/vnd.runcell.chart+json";

impl ResultItem {
    /// A result from a kernel's bundle: the chart it carries leaves `data` for `chart` (a
    /// chart that is not a JSON object is dropped).
    pub fn new(is_main_result: bool, mut data: BTreeMap<String, String>) -> ResultItem {
        let chart = data
            .remove(CHART_MIME)
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .filter(|chart| chart.is_object());
        ResultItem {
            is_main_result,
            data,
            chart,
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileChangeKind {
    Created,
    Modified,
    Deleted,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    pub path: String,
    pub size: u64,
    pub mime: String,
    pub change: FileChangeKind,
    /// SHA-256 of the content the run left, hex: absent for a deleted file, and for one the
    /// run's hashing budget did not reach (see [`MAX_HASHED_BYTES`](crate::MAX_HASHED_BYTES)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageInfo {
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub peak_memory_bytes: u64,
    pub killed_by: Option<KilledBy>,
}

/// One run of code, as returned by every interface.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execution {
    pub id: String,
    pub session_id: Option<String>,
    pub language: Language,
    pub execution_count: u64,
    pub status: ExecutionStatus,
    pub stdout: String,
    pub stderr: String,
    pub truncated: Truncated,
    pub results: Vec<ResultItem>,
    pub error: Option<ErrorInfo>,
    pub files: Vec<FileChange>,
    pub usage: UsageInfo,
    /// Every connection through the egress proxy during the execution (empty without a
    /// network policy).
    #[serde(default)]
    pub network: Vec<crate::network::policy::NetworkConnection>,
    /// Every tool call the code made (issue 22, docs/tools.md), refused ones included.
    #[serde(default)]
    pub tool_calls: Vec<crate::bridge::ToolCallRecord>,
    /// While `status` is `waiting`: the client tool calls waiting for their answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_tool_calls: Vec<crate::bridge::PendingToolCall>,
    #[serde(serialize_with = "rfc3339")]
    pub started_at: DateTime<Utc>,
    #[serde(serialize_with = "rfc3339")]
    pub finished_at: DateTime<Utc>,
    /// On the first execution after a session resumed by itself (a request to a paused
    /// session, a server restart): what came back of its variables (docs/api.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<crate::restored::Restored>,
}

pub(crate) fn rfc3339<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

const ID_ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// 16 random characters of [`ID_ALPHABET`] (80 bits).
fn random_chars() -> String {
    let mut bytes = [0u8; 16];
    // An id without entropy would collide; failing loudly beats that.
    getrandom::fill(&mut bytes).expect("the kernel's random source is unavailable");
    bytes
        .iter()
        .map(|b| ID_ALPHABET[(*b & 31) as usize] as char)
        .collect()
}

/// A new random id with a type prefix, e.g. `ses_3k9w...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_chars())
}

/// A new id that sorts by creation time, e.g. `ex_01k4...`: 10 characters of milliseconds since
/// the Unix epoch (50 bits, most significant first), then the 16 random characters of
/// [`new_id`]. Executions get these: the audit log indexes them, and an index whose new keys
/// land at its right edge dirties one page per commit instead of one random page per row.
pub fn new_ordered_id(prefix: &str) -> String {
    let ms = Utc::now().timestamp_millis().max(0) as u64;
    let time: String = (0..10)
        .rev()
        .map(|i| ID_ALPHABET[((ms >> (5 * i)) & 31) as usize] as char)
        .collect();
    format!("{prefix}_{time}{}", random_chars())
}

/// How a Python session's kernel starts (DESIGN.md §11).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// Forked from the preloaded zygote when it is ready (fast; the default for Python):
    /// every such session shares the zygote's hash secret and address-space layout.
    #[default]
    Zygote,
    /// A fresh interpreter of its own (its own ASLR layout and hash secret), slower to start.
    Cold,
}

impl Start {
    pub fn as_str(self) -> &'static str {
        match self {
            Start::Zygote => "zygote",
            Start::Cold => "cold",
        }
    }
}

impl std::str::FromStr for Start {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "zygote" => Ok(Start::Zygote),
            "cold" => Ok(Start::Cold),
            other => Err(format!("unknown start {other:?}: zygote or cold")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_serialises_to_the_documented_shape() {
        let t = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
            .expect("time")
            .with_timezone(&Utc);
        let e = Execution {
            id: "ex_1".into(),
            session_id: None,
            language: Language::Python,
            execution_count: 1,
            status: ExecutionStatus::Error,
            stdout: "a".into(),
            stderr: "b".into(),
            truncated: Truncated::default(),
            results: vec![],
            error: Some(ErrorInfo {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback: "tb".into(),
            }),
            files: vec![FileChange {
                path: "chart.png".into(),
                size: 3,
                mime: "image/png".into(),
                change: FileChangeKind::Created,
                sha256: Some("ab".repeat(32)),
            }],
            usage: UsageInfo {
                wall_ms: 1,
                cpu_ms: 2,
                peak_memory_bytes: 3,
                killed_by: Some(KilledBy::Oom),
            },
            network: vec![crate::network::policy::NetworkConnection {
                domain: "pypi.org".into(),
                port: 443,
                allowed: true,
                bytes_out: 10,
                bytes_in: 20,
            }],
            tool_calls: vec![crate::bridge::ToolCallRecord {
                id: "call_0".into(),
                name: "lookup".into(),
                input: serde_json::json!({"id": 3}),
                output_bytes: 12,
                duration_ms: 4,
                error: None,
            }],
            pending_tool_calls: Vec::new(),
            started_at: t,
            finished_at: t,
            restored: None,
        };
        let v = serde_json::to_value(&e).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"id":"ex_1","session_id":null,"language":"python","execution_count":1,
              "status":"error","stdout":"a","stderr":"b","truncated":{"stdout":false,"stderr":false,"results":false,"files":false},
              "results":[],"error":{"name":"ZeroDivisionError","value":"division by zero","traceback":"tb"},
              "files":[{"path":"chart.png","size":3,"mime":"image/png","change":"created","sha256":"ab".repeat(32)}],
              "usage":{"wall_ms":1,"cpu_ms":2,"peak_memory_bytes":3,"killed_by":"oom"},
              "network":[{"domain":"pypi.org","port":443,"allowed":true,"bytes_out":10,"bytes_in":20}],
              "tool_calls":[{"id":"call_0","name":"lookup","input":{"id":3},"output_bytes":12,"duration_ms":4,"error":null}],
              "started_at":"2026-01-02T03:04:05.678Z","finished_at":"2026-01-02T03:04:05.678Z"})
        );
    }

    #[test]
    fn a_bundles_chart_moves_to_the_result() {
        let bundle = |chart: &str| {
            BTreeMap::from([
                ("image/png".to_owned(), "iVBO".to_owned()),
                (CHART_MIME.to_owned(), chart.to_owned()),
            ])
        };
        let r = ResultItem::new(false, bundle(r#"{"type":"line","elements":[]}"#));
        assert_eq!(r.data.keys().collect::<Vec<_>>(), ["image/png"]);
        assert_eq!(
            serde_json::to_value(&r).expect("json"),
            serde_json::json!({"is_main_result":false,"data":{"image/png":"iVBO"},
              "chart":{"type":"line","elements":[]}})
        );
        for broken in ["[1]", "{", "null"] {
            let r = ResultItem::new(true, bundle(broken));
            assert_eq!((r.chart, r.data.len()), (None, 1), "{broken}");
        }
    }

    #[test]
    fn ids_are_prefixed_and_unique() {
        let a = new_id("ex");
        assert!(a.starts_with("ex_") && a.len() == 19);
        // Ordered ids: the same alphabet, later ones sort after earlier ones.
        let first = new_ordered_id("ex");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = new_ordered_id("ex");
        assert_eq!(first.len(), 29);
        assert!(first < second, "{first} !< {second}");
        assert!(second[3..].bytes().all(|b| ID_ALPHABET.contains(&b)));
        assert_ne!(a, new_id("ex"));
    }
}
