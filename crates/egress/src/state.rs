//! What the proxy's paths share: a session's state and one connection's record, and the
//! byte window every connection counts against.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::policy::Policy;

/// Bounds on what one session's sandboxes may do through the proxy.
#[derive(Debug, Clone, Copy)]
pub struct EgressLimits {
    /// Connections open at once, per session.
    pub max_connections: usize,
    /// Bytes in both directions between two [`SessionEgress::take_records`] (one execution).
    pub max_bytes_per_execution: u64,
    /// For the request head, the TLS ClientHello, name resolution and the upstream connect, each.
    pub step_timeout: Duration,
}

impl Default for EgressLimits {
    fn default() -> EgressLimits {
        EgressLimits {
            max_connections: 64,
            max_bytes_per_execution: 1 << 30,
            step_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug)]
pub(crate) struct SessionState {
    pub(crate) policy: Policy,
    pub(crate) open: AtomicUsize,
    pub(crate) window_bytes: AtomicU64,
    pub(crate) records: Mutex<Vec<Arc<Conn>>>,
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) domain: String,
    pub(crate) port: u16,
    pub(crate) refused: Mutex<Option<String>>,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn count(
    counter: &AtomicU64,
    n: usize,
    state: &SessionState,
    max_bytes: u64,
) -> io::Result<()> {
    counter.fetch_add(n as u64, Ordering::Relaxed);
    let total = state.window_bytes.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
    if total > max_bytes {
        return Err(io::Error::other(format!(
            "over the egress limit of {} bytes per execution",
            max_bytes
        )));
    }
    Ok(())
}
