//! The end of a workspace: its lazy unmount and, for one on disk, the removal of what is left
//! (the filesystem's last descriptors, its image) on one thread off the dropping one's path.
//! Used by [`crate::workspace::Workspace`]'s drop and by the image store alike.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::sys::cstr;

/// What is left of a dropped workspace on disk once its mount point is gone: descriptors on
/// its filesystem (the last one closed shuts the filesystem down: its journal flushed, its
/// loop device released) and its image (whose unlink frees the blocks). 40-100 ms together
/// on a busy host, done by one thread off the dropping one's path.
pub(crate) struct Remains {
    pub(crate) holders: Vec<Box<dyn Send>>,
    pub(crate) image: PathBuf,
}

struct Removals {
    queue: Mutex<(std::collections::VecDeque<Remains>, usize)>,
    /// Signals the thread (work queued) and waiters (a removal done).
    changed: std::sync::Condvar,
}

static REMOVALS: std::sync::OnceLock<Option<Arc<Removals>>> = std::sync::OnceLock::new();

fn removals() -> Option<&'static Arc<Removals>> {
    REMOVALS
        .get_or_init(|| {
            let r = Arc::new(Removals {
                queue: Mutex::default(),
                changed: std::sync::Condvar::new(),
            });
            let worker = r.clone();
            std::thread::Builder::new()
                .name("workspace-removal".into())
                .spawn(move || remove_forever(&worker))
                .ok()
                .map(|_| r)
        })
        .as_ref()
}

fn remove_forever(r: &Removals) {
    loop {
        let remains = {
            let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(next) = q.0.pop_front() {
                    q.1 += 1;
                    break next;
                }
                q = r.changed.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        remove_now(remains);
        r.queue.lock().unwrap_or_else(|p| p.into_inner()).1 -= 1;
        r.changed.notify_all();
    }
}

fn remove_now(remains: Remains) {
    drop(remains.holders);
    let _ = fs::remove_file(&remains.image);
}

/// Finishes the removal of a workspace whose mount point is already gone, soon, on the
/// removal thread (at once if there is none).
pub(crate) fn remove_later(remains: Remains) {
    match removals() {
        Some(r) => {
            r.queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .0
                .push_back(remains);
            r.changed.notify_all();
        }
        None => remove_now(remains),
    }
}

/// Waits up to `timeout` for the removals queued so far; whether they are all done.
pub(crate) fn wait_removals(timeout: std::time::Duration) -> bool {
    let Some(r) = REMOVALS.get().and_then(Option::as_ref) else {
        return true;
    };
    let q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
    let (q, _) = r
        .changed
        .wait_timeout_while(q, timeout, |q| !q.0.is_empty() || q.1 > 0)
        .unwrap_or_else(|p| p.into_inner());
    q.0.is_empty() && q.1 == 0
}

/// Lazy unmount (a lingering reference cannot keep it busy); errors mean nothing is mounted.
pub(crate) fn unmount(path: &Path) {
    if let Ok(c) = cstr(path) {
        // SAFETY: a valid path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
