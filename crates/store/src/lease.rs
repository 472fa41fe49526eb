//! A node's lease on its sessions: what a server asks before it acts on a session it holds,
//! or makes a new one, when nodes share a database (`postgres/nodes.rs` keeps it).
//!
//! Every heartbeat that the database confirms renews the lease for [`LEASE`], counted from
//! when the beat was *sent* on this node's own clock, so the lease always ends before the
//! database's clock can call the node dead ([`NODE_TIMEOUT`], counted from when the
//! beat *arrived*). Between the two, no other node may take a session of this one yet, and
//! this one no longer acts on them: there is no moment at which two nodes both think they
//! own a session. A node the database has called dead (or whose id a newer process took)
//! has lost its epoch for good: the database refuses its writes, and only a restart (a new
//! epoch) serves again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};

/// Silence after which a node is dead (the `interval '10 seconds'` of the PostgreSQL
/// backend's queries, on the database's clock).
pub const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a confirmed heartbeat lets a node act on its sessions: three beats (2 s apart)
/// may be lost before it stops, and it stops 4 s before other nodes call it dead (10 s), room
/// for a request that began within the lease to finish writing.
pub const LEASE: Duration = Duration::from_secs(6);

/// Whether this node may act on its sessions now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Renewed within [`LEASE`], or no lease is needed (a store of its own, SQLite, or a
    /// command that is no node).
    Held,
    /// Not renewed for `renewed_ago` (at least [`LEASE`]): the database is unreachable or too
    /// slow. The node serves again once a beat gets through, if its epoch still holds.
    Lapsed {
        /// Since the last beat the database confirmed was sent.
        renewed_ago: Duration,
        /// This node's epoch.
        epoch: i64,
    },
    /// The database no longer counts this epoch as alive: it was silent past
    /// [`NODE_TIMEOUT`] (its sessions were reported dead), or its id was registered
    /// again by a newer process. It never serves its sessions again.
    Lost {
        /// This node's (former) epoch.
        epoch: i64,
    },
}

impl Lease {
    /// `Ok` when held; else [`StoreError::Fenced`] saying why, in words for a client.
    pub fn check(self) -> Result<()> {
        match self {
            Lease::Held => Ok(()),
            Lease::Lapsed { renewed_ago, epoch } => Err(StoreError::Fenced(format!(
                "this node cannot prove it still owns its sessions: it has not renewed its \
                 lease with the database for {} s (epoch {epoch}; a node silent for {} s is \
                 declared dead); retry shortly",
                renewed_ago.as_secs(),
                NODE_TIMEOUT.as_secs()
            ))),
            Lease::Lost { epoch } => Err(StoreError::Fenced(lost(epoch))),
        }
    }
}

/// Why a node whose epoch ended cannot act.
pub(crate) fn lost(epoch: i64) -> String {
    format!(
        "this node no longer owns its sessions: the cluster declared its epoch {epoch} dead \
         (its heartbeat stopped for over {} s) or a newer process took its node id; it must \
         be restarted to serve again",
        NODE_TIMEOUT.as_secs()
    )
}

/// This node's lease on its sessions (see [`crate::Lease`]), as the heartbeat renews it.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    epoch: i64,
    /// When the last beat the database confirmed was sent (or the registration).
    renewed: Mutex<Instant>,
    /// The database no longer counts this epoch as alive: for good.
    lost: AtomicBool,
}

impl LeaseClock {
    /// A lease renewed at `at` (when the registration was sent).
    pub(crate) fn new(epoch: i64, at: Instant) -> LeaseClock {
        LeaseClock {
            epoch,
            renewed: Mutex::new(at),
            lost: AtomicBool::new(false),
        }
    }

    pub(crate) fn state(&self) -> Lease {
        if self.lost.load(Ordering::Acquire) {
            return Lease::Lost { epoch: self.epoch };
        }
        let renewed_ago = self
            .renewed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed();
        if renewed_ago < LEASE {
            Lease::Held
        } else {
            Lease::Lapsed {
                renewed_ago,
                epoch: self.epoch,
            }
        }
    }

    pub(crate) fn renewed_at(&self, sent: Instant) {
        let mut r = self.renewed.lock().unwrap_or_else(PoisonError::into_inner);
        *r = (*r).max(sent);
    }

    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }
}
