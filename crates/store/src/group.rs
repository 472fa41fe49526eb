//! Group commit: appends that arrive while another commit is in progress share the next one.
//!
//! Every caller queues its item and waits. Whoever finds no commit in progress becomes the
//! leader: it takes everything queued, commits it in one transaction (its own item
//! included), hands each waiter its result and wakes them. A caller returns only once the
//! transaction holding its item has committed (or failed), so "durable when the call returns"
//! holds exactly as for one commit per item; what is saved is a transaction, a WAL write of
//! the same pages and a wake-up of the writer per item. Under no contention a batch is one
//! item and the leader is the caller itself: no thread hop is added.

use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::error::{Result, StoreError};

/// Commits queued items in batches; `T` is what one caller appends, `R` what it gets back.
#[derive(Debug)]
pub(crate) struct GroupCommit<T, R> {
    state: Mutex<State<T, R>>,
    /// Signalled whenever a batch's results are in.
    done: Condvar,
}

#[derive(Debug)]
struct State<T, R> {
    next_ticket: u64,
    /// Items waiting for the next batch, with their tickets, in arrival order.
    queue: Vec<(u64, T)>,
    /// Whether a leader is committing a batch now.
    committing: bool,
    /// Results not yet collected by their callers, by ticket.
    results: HashMap<u64, Result<R>>,
}

impl<T, R> GroupCommit<T, R> {
    pub(crate) fn new() -> Self {
        GroupCommit {
            state: Mutex::new(State {
                next_ticket: 0,
                queue: Vec::new(),
                committing: false,
                results: HashMap::new(),
            }),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T, R>> {
        // Nothing panics while holding this lock (the batch runs outside it).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `item` and returns its result once the batch holding it is committed.
    /// `commit` gets a batch in arrival order and returns one result per item, in order.
    pub(crate) fn submit(&self, item: T, commit: impl Fn(Vec<T>) -> Vec<Result<R>>) -> Result<R> {
        let mut st = self.lock();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push((ticket, item));
        loop {
            if let Some(r) = st.results.remove(&ticket) {
                return r;
            }
            if st.committing {
                st = self.done.wait(st).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Lead: commit everything queued so far (our item is in it or already done).
            st.committing = true;
            let (tickets, items): (Vec<u64>, Vec<T>) =
                std::mem::take(&mut st.queue).into_iter().unzip();
            drop(st);
            let n = items.len();
            let results = panic::catch_unwind(AssertUnwindSafe(|| commit(items)))
                .ok()
                .filter(|r| r.len() == n);
            st = self.lock();
            st.committing = false;
            match results {
                Some(results) => st.results.extend(tickets.into_iter().zip(results)),
                // A bug in `commit`: every caller of the batch learns it failed (none waits
                // forever), and whether it was recorded is unknown to them.
                None => st.results.extend(tickets.into_iter().map(|t| {
                    (
                        t,
                        Err(StoreError::Corrupt(
                            "the batch holding this append failed unexpectedly".into(),
                        )),
                    )
                })),
            }
            self.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn every_caller_gets_its_own_result_and_batches_form() {
        let group = Arc::new(GroupCommit::<u32, u32>::new());
        let commits = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8u32)
            .map(|t| {
                let (group, commits) = (group.clone(), commits.clone());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let item = t * 1000 + i;
                        let r = group.submit(item, |batch| {
                            commits.fetch_add(1, Ordering::SeqCst);
                            // Slow enough that the other threads queue up meanwhile.
                            std::thread::sleep(Duration::from_millis(1));
                            batch.into_iter().map(|x| Ok(x * 2)).collect()
                        });
                        assert_eq!(r.expect("ok"), item * 2);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let commits = commits.load(Ordering::SeqCst);
        assert!(
            commits < 400,
            "{commits} commits for 400 items: no batching"
        );
        assert!(group.lock().results.is_empty());
    }

    #[test]
    fn a_panicking_batch_fails_its_callers_without_hanging() {
        let group = GroupCommit::<u32, u32>::new();
        let r = group.submit(1, |_| panic!("boom"));
        assert!(matches!(r, Err(StoreError::Corrupt(_))), "{r:?}");
        // The next one leads a fresh batch.
        assert_eq!(
            group
                .submit(2, |b| b.into_iter().map(Ok).collect())
                .expect("ok"),
            2
        );
    }
}
