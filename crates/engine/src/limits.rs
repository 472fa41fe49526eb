//! Session limits in one place (DESIGN.md §7): what a caller may ask for, the defaults a
//! request does not name, the server's maxima (never silently clamped: a request over one is
//! refused, naming it), tenants' quotas and the committed-memory budget that admission control
//! keeps under what the host can hold.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use runcell_sandbox::Limits;
use serde::{Deserialize, Serialize};

use crate::error::{Amount, Committed, Invalid, Limit, Quota};
use crate::EngineError;

/// The hard ceiling of any execution's time limit a server may configure (a week): beyond
/// it a timeout is a mistake, not a policy.
pub const MAX_TIMEOUT_CEILING: Duration = Duration::from_secs(7 * 24 * 3600);
/// The default maximum of an execution's time limit (`serve --max-exec-timeout-s`). An
/// hour: long enough for a model training run or a large data job, short enough that a
/// runaway loop is not left burning a CPU all day.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// The default maximum idle timeout (`serve --max-idle-timeout-s`): a day. An idle session
/// holds its memory and its workspace (RAM); a day covers "come back after lunch" and
/// "tomorrow morning" without letting forgotten sessions pile up for a week.
pub const MAX_IDLE_S: u64 = 24 * 3600;
/// The default maximum of `pause_after_s` (`serve --max-pause-after-s`): a day, as for the
/// idle timeout (a session not paused holds its memory).
pub const MAX_PAUSE_AFTER_S: u64 = 24 * 3600;
/// The default maximum of `expire_after_s` (`serve --max-expire-after-s`): 90 days. A paused
/// session holds only disk (its workspace image and snapshot).
pub const MAX_EXPIRE_AFTER_S: u64 = 90 * 24 * 3600;
/// The default maximum of processes and threads per session.
pub const MAX_PIDS: u64 = 4096;
/// A one-shot run's time limit when it names none (DESIGN.md §7), at most the maximum.
pub const ONE_SHOT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of stdout, and of stderr, one execution keeps (DESIGN.md §7): the head and the tail,
/// with a `[… N bytes truncated …]` line between them.
pub const OUTPUT_CAP_BYTES: usize = 1 << 20;

/// The size of a sandbox's /tmp and of its /dev/shm, each (DESIGN.md §7), at most its memory.
const TMP_BYTES: u64 = 256 << 20;
/// Open files per sandbox process: ample for a data job's files and sockets, still a bound on
/// a descriptor leak (the server's own hard limit must be at least this, docs/operations.md).
const NOFILE: u64 = 4096;

/// The smallest values a request may ask for (below them nothing useful runs).
const MIN_MEMORY_MB: u64 = 16;
const MIN_PIDS: u64 = 8;
const MIN_CPU: f64 = 0.01;

/// Limits a caller may ask for; `None` takes the server's default (DESIGN.md §7).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    #[serde(default, deserialize_with = "whole_number")]
    pub memory_mb: Option<u64>,
    pub cpu: Option<f64>,
    #[serde(default, deserialize_with = "whole_number")]
    pub pids: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    pub disk_mb: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    pub exec_timeout_s: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    pub idle_timeout_s: Option<u64>,
    /// Seconds idle before the session pauses by itself (docs/api.md, "Pause and resume").
    #[serde(default, deserialize_with = "whole_number")]
    pub pause_after_s: Option<u64>,
    /// Seconds a paused session is kept before it expires (its files and snapshot go).
    #[serde(default, deserialize_with = "whole_number")]
    pub expire_after_s: Option<u64>,
}

impl From<&SessionLimits> for LimitsRequest {
    /// A request for exactly these limits (a fork asks for its source's).
    fn from(l: &SessionLimits) -> Self {
        LimitsRequest {
            memory_mb: Some(l.memory_mb),
            cpu: Some(l.cpu),
            pids: Some(l.pids),
            disk_mb: Some(l.disk_mb),
            exec_timeout_s: Some(l.exec_timeout_s),
            idle_timeout_s: Some(l.idle_timeout_s),
            pause_after_s: Some(l.pause_after_s),
            expire_after_s: Some(l.expire_after_s),
        }
    }
}

/// An integer as JSON Schema counts them: `4` or `4.0` (a number with no fraction), which
/// JSON clients and generated ones may send alike.
pub fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Int(u64),
        Float(f64),
    }
    match Option::<Number>::deserialize(d)? {
        None => Ok(None),
        Some(Number::Int(v)) => Ok(Some(v)),
        Some(Number::Float(v)) if v.fract() == 0.0 && (0.0..u64::MAX as f64).contains(&v) => {
            Ok(Some(v as u64))
        }
        Some(Number::Float(v)) => Err(D::Error::custom(format!(
            "invalid value {v}: expected a whole number of at least 0"
        ))),
    }
}

/// A session's resolved limits, as reported in its Session object.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionLimits {
    pub memory_mb: u64,
    pub cpu: f64,
    pub pids: u64,
    pub disk_mb: u64,
    pub exec_timeout_s: u64,
    /// An idle session that has not paused first ends after this.
    pub idle_timeout_s: u64,
    /// An idle session pauses after this (its sandbox and memory are freed).
    #[serde(default = "default_pause_after_s")]
    pub pause_after_s: u64,
    /// A paused session expires after this.
    #[serde(default = "default_expire_after_s")]
    pub expire_after_s: u64,
}

/// Sessions recorded before pausing existed take the defaults.
fn default_pause_after_s() -> u64 {
    SessionLimits::DESIGN_DEFAULTS.pause_after_s
}

fn default_expire_after_s() -> u64 {
    SessionLimits::DESIGN_DEFAULTS.expire_after_s
}

impl SessionLimits {
    /// DESIGN.md §7: 1 GiB, 1 CPU, 128 pids, a 1 GiB workspace, 30 s per execution, 20 min idle.
    pub const DESIGN_DEFAULTS: SessionLimits = SessionLimits {
        memory_mb: 1024,
        cpu: 1.0,
        pids: 128,
        disk_mb: 1024,
        exec_timeout_s: 30,
        idle_timeout_s: 20 * 60,
        pause_after_s: 300,
        expire_after_s: 30 * 24 * 3600,
    };

    /// What the sandbox enforces for each process of this session (or one-shot run): the one
    /// place where the engine's limits become the sandbox's.
    pub(crate) fn sandbox_limits(&self) -> Limits {
        let memory_bytes = self.memory_mb << 20;
        // /tmp and /dev/shm count against memory; never let them exceed it.
        let tmp_bytes = TMP_BYTES.min(memory_bytes);
        Limits {
            memory_bytes,
            pids: self.pids,
            cpu_millis: (self.cpu * 1000.0).round() as u64,
            tmp_bytes,
            nofile: NOFILE,
            // Only a backstop behind the tmpfs sizes, above both so that a full workspace or
            // /tmp says ENOSPC (what it is) rather than EFBIG.
            fsize_bytes: self.disk_bytes().max(tmp_bytes).saturating_mul(2),
        }
    }

    /// The size of the workspace (a tmpfs of its own).
    pub(crate) fn disk_bytes(&self) -> u64 {
        self.disk_mb << 20
    }
}

/// The most one session (or one-shot run) may ask for: `serve --max-*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Maxima {
    pub memory_mb: u64,
    pub cpu: f64,
    pub pids: u64,
    pub disk_mb: u64,
    pub exec_timeout_s: u64,
    pub idle_timeout_s: u64,
    pub pause_after_s: u64,
    pub expire_after_s: u64,
}

/// What this host can give, read once at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCapacity {
    /// Physical memory, or the memory limit of the cgroup runcell itself runs in if smaller.
    pub memory_mb: u64,
    /// CPUs runcell may run on (affinity and cgroup quota included).
    pub cpus: u64,
}

impl HostCapacity {
    pub fn detect() -> HostCapacity {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let total_kb = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        // A container's limit is what the host can give *us*.
        let cgroup = [
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        ]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .map(|b| b >> 20)
        .min();
        let memory_mb = match (total_kb.map(|k| k >> 10), cgroup) {
            (Some(t), Some(c)) => t.min(c),
            (Some(t), None) => t,
            // No /proc (unlikely on a host that passed the doctor's checks): DESIGN's default.
            (None, c) => c.unwrap_or(SessionLimits::DESIGN_DEFAULTS.memory_mb),
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        HostCapacity { memory_mb, cpus }
    }

    /// Memory kept out of the sandboxes' budget: the server itself, the kernel, the page
    /// cache of the runtime every session maps, and workspace files written from the host
    /// side (uploads are charged to the server, not to a sandbox). A tenth of the memory, at
    /// least 1 GiB, at most half of it.
    pub fn reserve_mb(&self) -> u64 {
        (self.memory_mb / 10).max(1024).min(self.memory_mb / 2)
    }

    /// The default committed-memory budget: the memory less [`HostCapacity::reserve_mb`].
    pub fn sandbox_memory_mb(&self) -> u64 {
        self.memory_mb - self.reserve_mb()
    }
}

/// A server's limit policy: the defaults, the maxima and the committed-memory budget.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitPolicy {
    /// What a request that names no limit gets (each at most its maximum).
    pub defaults: SessionLimits,
    pub max: Maxima,
    /// Sum of the memory limits of every live sandbox (sessions, warm ones included, and
    /// one-shot runs) the server admits; past it a start is refused (503), never
    /// overcommitted into the OOM killer.
    pub committed_memory_mb: u64,
    /// Whether the refusal messages name `serve`'s flags (a server) or not (`runcell run`).
    pub server: bool,
}

impl Default for LimitPolicy {
    fn default() -> Self {
        Self::for_host(HostCapacity::detect())
    }
}

impl LimitPolicy {
    /// Maxima no larger than `host` can give: memory and the RAM-backed workspace at most the
    /// sandbox budget, CPUs at most the host's; DESIGN's defaults, each within its maximum.
    pub fn for_host(host: HostCapacity) -> LimitPolicy {
        let budget = host.sandbox_memory_mb().max(MIN_MEMORY_MB);
        let max = Maxima {
            memory_mb: budget,
            cpu: host.cpus.max(1) as f64,
            pids: MAX_PIDS,
            // The workspace is a tmpfs: its pages are RAM.
            disk_mb: budget,
            exec_timeout_s: MAX_TIMEOUT.as_secs(),
            idle_timeout_s: MAX_IDLE_S,
            pause_after_s: MAX_PAUSE_AFTER_S,
            expire_after_s: MAX_EXPIRE_AFTER_S,
        };
        LimitPolicy {
            defaults: SessionLimits::DESIGN_DEFAULTS.within(&max),
            max,
            committed_memory_mb: budget,
            server: false,
        }
    }

    /// Checks the policy makes sense: every default within its maximum and the valid range,
    /// and no session allowed that the budget could never admit.
    pub fn validate(&self) -> Result<(), String> {
        let (d, m) = (&self.defaults, &self.max);
        let checks: [(&str, f64, f64, f64); 8] = [
            (
                "memory_mb",
                d.memory_mb as f64,
                m.memory_mb as f64,
                MIN_MEMORY_MB as f64,
            ),
            ("cpu", d.cpu, m.cpu, MIN_CPU),
            ("pids", d.pids as f64, m.pids as f64, MIN_PIDS as f64),
            ("disk_mb", d.disk_mb as f64, m.disk_mb as f64, 1.0),
            (
                "exec_timeout_s",
                d.exec_timeout_s as f64,
                m.exec_timeout_s as f64,
                1.0,
            ),
            (
                "idle_timeout_s",
                d.idle_timeout_s as f64,
                m.idle_timeout_s as f64,
                1.0,
            ),
            (
                "pause_after_s",
                d.pause_after_s as f64,
                m.pause_after_s as f64,
                1.0,
            ),
            (
                "expire_after_s",
                d.expire_after_s as f64,
                m.expire_after_s as f64,
                1.0,
            ),
        ];
        for (name, default, max, min) in checks {
            if !(max.is_finite() && max >= min) {
                return Err(format!("max_{name} must be at least {min}"));
            }
            if !(default.is_finite() && default >= min) {
                return Err(format!("default_{name} must be at least {min}"));
            }
            if default > max {
                return Err(format!("default_{name} {default} exceeds max_{name} {max}"));
            }
        }
        if m.exec_timeout_s > MAX_TIMEOUT_CEILING.as_secs() {
            return Err(format!(
                "max_exec_timeout_s must be at most {}",
                MAX_TIMEOUT_CEILING.as_secs()
            ));
        }
        if m.memory_mb > self.committed_memory_mb {
            return Err(format!(
                "max_memory_mb {} exceeds max_committed_memory_mb {}: a session that large could never start",
                m.memory_mb, self.committed_memory_mb
            ));
        }
        Ok(())
    }

    /// Each limit a request may name, with the least and the most [`LimitPolicy::resolve`]
    /// accepts (the OpenAPI document states them).
    pub fn ranges(&self) -> [(&'static str, f64, f64); 8] {
        let m = &self.max;
        [
            ("memory_mb", MIN_MEMORY_MB as f64, m.memory_mb as f64),
            ("cpu", MIN_CPU, m.cpu),
            ("pids", MIN_PIDS as f64, m.pids as f64),
            ("disk_mb", 1.0, m.disk_mb as f64),
            ("exec_timeout_s", 1.0, m.exec_timeout_s as f64),
            ("idle_timeout_s", 1.0, m.idle_timeout_s as f64),
            ("pause_after_s", 1.0, m.pause_after_s as f64),
            ("expire_after_s", 1.0, m.expire_after_s as f64),
        ]
    }

    /// `name value exceeds this server's maximum of max (serve --max-name)`.
    fn over(
        &self,
        name: &'static str,
        value: impl Into<Amount>,
        max: impl Into<Amount>,
    ) -> EngineError {
        EngineError::LimitExceeded(Limit::OverMaximum {
            limit: name,
            value: value.into(),
            maximum: max.into(),
            option: self
                .server
                .then(|| format!("--max-{}", name.replace('_', "-"))),
        })
    }

    /// A whole-number limit: `asked`, or `default` when not named; below `min` is the caller's
    /// mistake (400 `invalid_request`), over `max` is refused as over the maximum.
    fn whole(
        &self,
        name: &'static str,
        asked: Option<u64>,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, EngineError> {
        let value = asked.unwrap_or(default);
        if value < min {
            return Err(EngineError::InvalidRequest(Invalid::BelowMinimum {
                limit: name,
                minimum: min.into(),
            }));
        }
        if value > max {
            return Err(self.over(name, value, max));
        }
        Ok(value)
    }

    /// A session's limits for `req`: the defaults for what it does not name; refused (never
    /// clamped) when a value is over its maximum or out of range.
    pub fn resolve(&self, req: &LimitsRequest) -> Result<SessionLimits, EngineError> {
        let d = &self.defaults;
        let m = &self.max;
        let memory_mb = self.whole(
            "memory_mb",
            req.memory_mb,
            d.memory_mb,
            MIN_MEMORY_MB,
            m.memory_mb,
        )?;
        let cpu = req.cpu.unwrap_or(d.cpu);
        if !(cpu.is_finite() && cpu >= MIN_CPU) {
            return Err(EngineError::InvalidRequest(Invalid::BelowMinimum {
                limit: "cpu",
                minimum: MIN_CPU.into(),
            }));
        }
        if cpu > m.cpu {
            return Err(self.over("cpu", cpu, m.cpu));
        }
        let pids = self.whole("pids", req.pids, d.pids, MIN_PIDS, m.pids)?;
        let disk_mb = self.whole("disk_mb", req.disk_mb, d.disk_mb, 1, m.disk_mb)?;
        let exec_timeout_s = self.whole(
            "exec_timeout_s",
            req.exec_timeout_s,
            d.exec_timeout_s,
            1,
            m.exec_timeout_s,
        )?;
        let idle_timeout_s = self.whole(
            "idle_timeout_s",
            req.idle_timeout_s,
            d.idle_timeout_s,
            1,
            m.idle_timeout_s,
        )?;
        let pause_after_s = self.whole(
            "pause_after_s",
            req.pause_after_s,
            d.pause_after_s,
            1,
            m.pause_after_s,
        )?;
        let expire_after_s = self.whole(
            "expire_after_s",
            req.expire_after_s,
            d.expire_after_s,
            1,
            m.expire_after_s,
        )?;
        Ok(SessionLimits {
            memory_mb,
            cpu,
            pids,
            disk_mb,
            exec_timeout_s,
            idle_timeout_s,
            pause_after_s,
            expire_after_s,
        })
    }

    /// Checks one execution's (or command's, or one-shot run's) time limit.
    pub fn check_timeout(&self, timeout: Duration) -> Result<Duration, EngineError> {
        if timeout.is_zero() {
            return Err(EngineError::InvalidRequest(Invalid::NotPositive {
                limit: "timeout_s",
            }));
        }
        if timeout > Duration::from_secs(self.max.exec_timeout_s) {
            return Err(EngineError::LimitExceeded(Limit::OverMaximum {
                limit: "timeout_s",
                value: timeout.as_secs_f64().into(),
                maximum: self.max.exec_timeout_s.into(),
                option: self.server.then(|| "--max-exec-timeout-s".to_owned()),
            }));
        }
        Ok(timeout)
    }

    /// A one-shot run's default time limit: [`ONE_SHOT_TIMEOUT`], at most the maximum.
    pub fn one_shot_timeout(&self) -> Duration {
        ONE_SHOT_TIMEOUT.min(Duration::from_secs(self.max.exec_timeout_s))
    }
}

impl SessionLimits {
    /// Each value lowered to its maximum (for defaults only: requests are refused instead).
    pub fn within(self, m: &Maxima) -> SessionLimits {
        SessionLimits {
            memory_mb: self.memory_mb.min(m.memory_mb),
            cpu: self.cpu.min(m.cpu),
            pids: self.pids.min(m.pids),
            disk_mb: self.disk_mb.min(m.disk_mb),
            exec_timeout_s: self.exec_timeout_s.min(m.exec_timeout_s),
            idle_timeout_s: self.idle_timeout_s.min(m.idle_timeout_s),
            pause_after_s: self.pause_after_s.min(m.pause_after_s),
            expire_after_s: self.expire_after_s.min(m.expire_after_s),
        }
    }
}

/// What a tenant's sessions are held to and start with: at most `max_sessions` live sessions
/// and `max_memory_mb` in the sum of their memory limits (`None`: no quota), and how its
/// sessions start when they do not say (`None`: from the zygote for Python). Read from the
/// store at every session start (`records.rs`), so `runcell keys update` takes effect at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantPolicy {
    pub max_sessions: Option<u64>,
    pub max_memory_mb: Option<u64>,
    pub start: Option<crate::model::Start>,
}

/// How long a client refused for capacity should wait before trying again.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Committed sandbox memory and each tenant's live sessions: what admission control and the
/// quotas count. Every started sandbox holds a [`Reservation`] until it is gone.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    committed_mb: u64,
    /// Live sessions and their memory, by owner.
    owners: HashMap<String, (u64, u64)>,
}

/// Whether a reservation may go past the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Refused past the budget or the quota. (Sessions of a previous run come back paused,
    /// holding no memory: a resume is checked like a create.)
    Checked,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Memory committed now (MiB).
    pub(crate) fn committed_mb(&self) -> u64 {
        self.lock().committed_mb
    }

    /// Whether `memory_mb` more fits the budget now.
    pub(crate) fn fits(&self, memory_mb: u64, budget_mb: u64) -> bool {
        self.lock().committed_mb.saturating_add(memory_mb) <= budget_mb
    }

    /// Reserves `memory_mb` of the budget (no owner: a warm session or a one-shot run).
    pub(crate) fn reserve(
        self: &Arc<Self>,
        memory_mb: u64,
        budget_mb: u64,
        admit: Admit,
    ) -> Result<Reservation, EngineError> {
        let mut c = self.lock();
        if admit == Admit::Checked && c.committed_mb.saturating_add(memory_mb) > budget_mb {
            return Err(at_capacity(memory_mb, c.committed_mb, budget_mb));
        }
        c.committed_mb += memory_mb;
        Ok(Reservation {
            ledger: self.clone(),
            memory_mb,
            owner: None,
        })
    }

    /// Whether `owner` may start one more session of `memory_mb` under `quota` now.
    pub(crate) fn check_quota(
        &self,
        owner: &str,
        quota: &TenantPolicy,
        memory_mb: u64,
    ) -> Result<(), EngineError> {
        quota_check(&self.lock(), owner, quota, memory_mb)
    }

    /// Counts `r` (reserved for no one yet) as one of `owner`'s live sessions, if its quota
    /// allows.
    pub(crate) fn assign(
        &self,
        r: &mut Reservation,
        owner: &str,
        quota: &TenantPolicy,
        admit: Admit,
    ) -> Result<(), EngineError> {
        let mut c = self.lock();
        if admit == Admit::Checked {
            quota_check(&c, owner, quota, r.memory_mb)?;
        }
        let e = c.owners.entry(owner.to_owned()).or_default();
        e.0 += 1;
        e.1 += r.memory_mb;
        r.owner = Some(owner.to_owned());
        Ok(())
    }
}

fn quota_check(
    c: &Counts,
    owner: &str,
    quota: &TenantPolicy,
    memory_mb: u64,
) -> Result<(), EngineError> {
    let (n, mem) = c.owners.get(owner).copied().unwrap_or((0, 0));
    if let Some(max) = quota.max_sessions.filter(|&max| n >= max) {
        return Err(EngineError::QuotaExceeded(Quota::Sessions {
            owner: owner.to_owned(),
            live: n,
            maximum: max,
        }));
    }
    if let Some(max) = quota
        .max_memory_mb
        .filter(|&max| mem.saturating_add(memory_mb) > max)
    {
        return Err(EngineError::QuotaExceeded(Quota::MemoryMb {
            owner: owner.to_owned(),
            live_mb: mem,
            asked_mb: memory_mb,
            maximum_mb: max,
        }));
    }
    Ok(())
}

fn at_capacity(memory_mb: u64, committed_mb: u64, budget_mb: u64) -> EngineError {
    EngineError::OverCommitted(Committed {
        asked_mb: memory_mb,
        committed_mb,
        budget_mb,
    })
}

/// A sandbox's share of the budget (and of its owner's quota), given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    ledger: Arc<Ledger>,
    memory_mb: u64,
    owner: Option<String>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut c = self.ledger.lock();
        c.committed_mb = c.committed_mb.saturating_sub(self.memory_mb);
        if let Some(o) = self.owner.take() {
            if let Some(e) = c.owners.get_mut(&o) {
                e.0 = e.0.saturating_sub(1);
                e.1 = e.1.saturating_sub(self.memory_mb);
                if e.0 == 0 {
                    c.owners.remove(&o);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> LimitPolicy {
        LimitPolicy::for_host(HostCapacity {
            memory_mb: 8192,
            cpus: 2,
        })
    }

    #[test]
    fn defaults_resolve_and_bad_values_are_refused() {
        let p = policy();
        let ok = p.resolve(&LimitsRequest::default()).expect("defaults");
        assert_eq!(ok, SessionLimits::DESIGN_DEFAULTS);
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
                p.resolve(&bad),
                Err(EngineError::InvalidRequest(_))
            ));
        }
    }

    #[test]
    fn maxima_follow_the_host_and_are_refused_past() {
        let p = policy();
        // 8 GiB less a 1 GiB reserve; two CPUs.
        assert_eq!(p.max.memory_mb, 7168);
        assert_eq!(p.max.disk_mb, 7168);
        assert_eq!(p.max.cpu, 2.0);
        assert_eq!(p.committed_memory_mb, 7168);
        let at = LimitsRequest {
            memory_mb: Some(7168),
            cpu: Some(2.0),
            ..Default::default()
        };
        assert_eq!(p.resolve(&at).expect("at the maximum").memory_mb, 7168);
        let over = LimitsRequest {
            cpu: Some(2.5),
            ..Default::default()
        };
        match p.resolve(&over) {
            Err(EngineError::LimitExceeded(m)) => {
                assert_eq!(m.to_string(), "cpu 2.5 exceeds this host's maximum of 2")
            }
            other => panic!("{other:?}"),
        }
        // A small host lowers the defaults to its maxima rather than refusing them.
        let tiny = LimitPolicy::for_host(HostCapacity {
            memory_mb: 1500,
            cpus: 1,
        });
        assert_eq!(tiny.defaults.memory_mb, 750);
        assert!(tiny.validate().is_ok());
    }

    #[test]
    fn sandbox_limits_keep_tmp_within_memory_and_fsize_above_every_tmpfs() {
        let d = SessionLimits::DESIGN_DEFAULTS.sandbox_limits();
        assert_eq!(
            d,
            Limits {
                memory_bytes: 1 << 30,
                pids: 128,
                cpu_millis: 1000,
                tmp_bytes: 256 << 20,
                nofile: 4096,
                fsize_bytes: 2 << 30,
            }
        );
        // A small session: /tmp no larger than its memory; a full tmpfs is ENOSPC, not EFBIG.
        let small = SessionLimits {
            memory_mb: 64,
            cpu: 0.25,
            disk_mb: 16,
            ..SessionLimits::DESIGN_DEFAULTS
        }
        .sandbox_limits();
        assert_eq!(small.tmp_bytes, 64 << 20);
        assert_eq!(small.fsize_bytes, 128 << 20);
        assert_eq!(small.cpu_millis, 250);
    }

    #[test]
    fn the_ledger_counts_budget_and_quotas_until_dropped() {
        let l = Arc::new(Ledger::default());
        let q = TenantPolicy {
            max_sessions: Some(1),
            ..Default::default()
        };
        let mut a = l.reserve(1024, 2048, Admit::Checked).expect("first");
        l.assign(&mut a, "t", &q, Admit::Checked).expect("quota");
        let mut b = l.reserve(1024, 2048, Admit::Checked).expect("second");
        assert!(matches!(
            l.assign(&mut b, "t", &q, Admit::Checked),
            Err(EngineError::QuotaExceeded(_))
        ));
        assert!(matches!(
            l.reserve(1, 2048, Admit::Checked),
            Err(EngineError::OverCommitted(_))
        ));
        drop(b);
        drop(a);
        assert_eq!(l.committed_mb(), 0);
        let mut c = l.reserve(2048, 2048, Admit::Checked).expect("all of it");
        l.assign(&mut c, "t", &q, Admit::Checked).expect("freed");
    }
}
