//! Prometheus metrics: sessions by state, executions by status, latencies, sandbox kills.

use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use runcell_engine::{Execution, SessionStatus};

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Mutex<Registry>,
    sessions: Family<Labels, Gauge>,
    executions: Family<Labels, Counter>,
    kills: Family<Labels, Counter>,
    execution_seconds: Histogram,
    session_start_seconds: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("runcell");
        let sessions = Family::<Labels, Gauge>::default();
        let executions = Family::<Labels, Counter>::default();
        let kills = Family::<Labels, Counter>::default();
        // 1 ms .. ~65 s
        let execution_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        let session_start_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register("sessions", "Live sessions by state", sessions.clone());
        registry.register(
            "executions",
            "Finished executions by status",
            executions.clone(),
        );
        registry.register(
            "sandbox_kills",
            "Sandboxes killed, by reason (timeout, oom, pids, output, signal)",
            kills.clone(),
        );
        registry.register(
            "execution_duration_seconds",
            "Wall time of executions",
            execution_seconds.clone(),
        );
        registry.register(
            "session_start_duration_seconds",
            "Time to create a session until its kernel is ready",
            session_start_seconds.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            sessions,
            executions,
            kills,
            execution_seconds,
            session_start_seconds,
        }
    }
}

impl Metrics {
    pub fn observe_execution(&self, e: &Execution) {
        let status = serde_json::to_value(e.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        self.executions
            .get_or_create(&vec![("status", status)])
            .inc();
        self.execution_seconds
            .observe(e.usage.wall_ms as f64 / 1000.0);
        if let Some(k) = e.usage.killed_by {
            let reason = serde_json::to_value(k)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            self.kills.get_or_create(&vec![("reason", reason)]).inc();
        }
    }

    pub fn observe_session_start(&self, seconds: f64) {
        self.session_start_seconds.observe(seconds);
    }

    /// The Prometheus text exposition, with session gauges set from `sessions` now.
    pub fn render(&self, sessions: &[SessionStatus]) -> String {
        for state in ["starting", "ready", "busy", "paused", "dead", "expired"] {
            let n = sessions
                .iter()
                .filter(|s| {
                    serde_json::to_value(s)
                        .ok()
                        .as_ref()
                        .and_then(|v| v.as_str())
                        == Some(state)
                })
                .count();
            self.sessions
                .get_or_create(&vec![("state", state.to_owned())])
                .set(n as i64);
        }
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}
