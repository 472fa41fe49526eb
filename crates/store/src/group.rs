//! Group commit: appends that arrive while another commit is in progress share the next one.
//!
//! Every caller queues its item and waits. Whoever finds no commit in progress becomes the
//! leader: it takes everything queued, commits it in one transaction (its own item
//! included), hands each waiter its result and wakes them. A caller returns only once the
//! transaction holding its item has committed (or failed), so "durable when the call returns"
//! holds exactly as for one commit per item; what is saved is a transaction, a WAL write of
//! the same pages and a wake-up of the writer per item. Under no contention a batch is one
//! item and the leader is the caller itself: no thread hop is added.
//!
//! Each caller waits on a slot of its own, so a finished batch wakes exactly its own callers
//! and, when more items queued meanwhile, the first of them to lead the next batch. (One
//! condition variable for all, notified with `notify_all`, woke every waiter per batch, most
//! of them only to find their batch still pending and go back to sleep.)

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::error::{Result, StoreError};

/// Commits queued items in batches; `T` is what one caller appends, `R` what it gets back.
#[derive(Debug)]
pub(crate) struct GroupCommit<T, R> {
    state: Mutex<State<T, R>>,
}

#[derive(Debug)]
struct State<T, R> {
    /// Items waiting for the next batch, with their callers' slots, in arrival order.
    queue: Vec<(T, Arc<Slot<R>>)>,
    /// Whether a leader is committing a batch now.
    committing: bool,
}

/// Where one caller waits: its result, or the word that it should lead the next batch.
#[derive(Debug)]
struct Slot<R> {
    news: Mutex<News<R>>,
    ready: Condvar,
}

#[derive(Debug)]
enum News<R> {
    None,
    Lead,
    Done(Result<R>),
}

impl<R> Slot<R> {
    fn new() -> Self {
        Slot {
            news: Mutex::new(News::None),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, News<R>> {
        self.news.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn done(&self, r: Result<R>) {
        *self.lock() = News::Done(r);
        self.ready.notify_one();
    }

    /// Wakes the caller to lead, unless its result is already there.
    fn lead(&self) {
        let mut news = self.lock();
        if matches!(*news, News::None) {
            *news = News::Lead;
            self.ready.notify_one();
        }
    }

    /// The result, if it is in.
    fn take_done(&self) -> Option<Result<R>> {
        let mut news = self.lock();
        match std::mem::replace(&mut *news, News::None) {
            News::Done(r) => Some(r),
            other => {
                *news = other;
                None
            }
        }
    }

    /// Waits until there is news (a result, or the word to lead, which is consumed).
    fn wait(&self) {
        let mut news = self.lock();
        while matches!(*news, News::None) {
            news = self
                .ready
                .wait(news)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if matches!(*news, News::Lead) {
            *news = News::None;
        }
    }
}

impl<T, R> GroupCommit<T, R> {
    pub(crate) fn new() -> Self {
        GroupCommit {
            state: Mutex::new(State {
                queue: Vec::new(),
                committing: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T, R>> {
        // Nothing panics while holding this lock (the batch runs outside it).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `item` and returns its result once the batch holding it is committed.
    /// `commit` gets a batch in arrival order and returns one result per item, in order.
    pub(crate) fn submit(&self, item: T, commit: impl Fn(Vec<T>) -> Vec<Result<R>>) -> Result<R> {
        let slot = Arc::new(Slot::new());
        self.lock().queue.push((item, slot.clone()));
        loop {
            if let Some(r) = slot.take_done() {
                return r;
            }
            let mut st = self.lock();
            if st.committing {
                drop(st);
                slot.wait();
                continue;
            }
            if !st.queue.iter().any(|(_, s)| Arc::ptr_eq(s, &slot)) {
                // Another leader took our item and has finished: results are handed out
                // before `committing` is cleared, so ours is in the slot.
                continue;
            }
            // Lead: commit everything queued so far, our item included.
            st.committing = true;
            let (items, slots): (Vec<T>, Vec<Arc<Slot<R>>>) =
                std::mem::take(&mut st.queue).into_iter().unzip();
            drop(st);
            let n = items.len();
            let results = panic::catch_unwind(AssertUnwindSafe(|| commit(items)))
                .ok()
                .filter(|r| r.len() == n);
            let results: Vec<Result<R>> = match results {
                Some(results) => results,
                // A bug in `commit`: every caller of the batch learns it failed (none waits
                // forever), and whether it was recorded is unknown to them.
                None => (0..n)
                    .map(|_| {
                        Err(StoreError::Corrupt(
                            "the batch holding this append failed unexpectedly".into(),
                        ))
                    })
                    .collect(),
            };
            for (s, r) in slots.iter().zip(results) {
                s.done(r);
            }
            let mut st = self.lock();
            st.committing = false;
            if let Some((_, next)) = st.queue.first() {
                next.lead();
            }
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
        assert!(group.lock().queue.is_empty());
    }

    #[test]
    fn no_caller_is_left_waiting_under_churn() {
        // Batches of every size, fast commits, callers arriving while leadership changes
        // hands: every caller gets its own result, and all of them return.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let group = Arc::new(GroupCommit::<u64, u64>::new());
            let threads: Vec<_> = (0..16u64)
                .map(|t| {
                    let group = group.clone();
                    std::thread::spawn(move || {
                        for i in 0..300 {
                            let item = t * 1_000_000 + i;
                            let r = group.submit(item, |batch| {
                                if item % 7 == 0 {
                                    std::thread::yield_now();
                                }
                                batch.into_iter().map(|x| Ok(x + 1)).collect()
                            });
                            assert_eq!(r.expect("ok"), item + 1);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("thread");
            }
            let _ = tx.send(group.lock().queue.len());
        });
        let left = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a caller never returned");
        assert_eq!(left, 0);
    }

    #[test]
    fn an_item_queued_during_a_batch_is_committed_after_it_with_no_newcomer() {
        let group = Arc::new(GroupCommit::<u32, u32>::new());
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let a = {
            let group = group.clone();
            std::thread::spawn(move || {
                group.submit(1, |batch| {
                    let _ = started_tx.send(());
                    let _ = release_rx.lock().expect("lock").recv();
                    batch.into_iter().map(Ok).collect()
                })
            })
        };
        started_rx.recv().expect("A leads");
        let (b_tx, b_rx) = std::sync::mpsc::channel();
        {
            let group = group.clone();
            std::thread::spawn(move || {
                let _ = b_tx
                    .send(group.submit(2, |batch| batch.into_iter().map(|x| Ok(x * 10)).collect()));
            });
        }
        // B waits behind A's batch.
        while group.lock().queue.is_empty() {
            std::thread::yield_now();
        }
        release_tx.send(()).expect("release A");
        assert_eq!(a.join().expect("A").expect("A's result"), 1);
        // Nobody else arrives: B must lead its own batch once A's is done.
        let b = b_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("B was never woken to lead");
        assert_eq!(b.expect("B's result"), 20);
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
