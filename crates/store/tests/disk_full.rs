//! The store on a full filesystem: it opens (for this process alone when the WAL index
//! cannot be created), reads work, writes fail as `Full` with nothing written, and work again
//! once space is freed. Runs as root: it mounts a small tmpfs.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use runcell_store::{Store, StoreError};

struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount() -> SmallDisk {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(ok.success(), "mount a tmpfs (the test runs as root)");
        SmallDisk(dir)
    }

    fn fill(&self) {
        let mut f = std::fs::File::create(self.0.join("filler")).expect("filler");
        while f.write(&[0u8; 4096]).is_ok_and(|n| n > 0) {}
        while f.write(&[0]).is_ok_and(|n| n == 1) {}
    }

    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).expect("free");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn shm(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-shm");
    PathBuf::from(p)
}

#[test]
fn a_full_disk_opens_reads_refuses_writes_as_full_and_recovers() {
    let disk = SmallDisk::mount();
    let db = disk.0.join("runcell.db");
    {
        let s = Store::open(&db).expect("open");
        s.put_session(&session("t", "ses_1", 0)).expect("put");
        s.append_execution(&exec("t", "ex_1", Some("ses_1"), 1))
            .expect("append");
        assert!(!s.is_exclusive());
    }
    // Closed cleanly: the WAL index is gone, and there is no room to make it again.
    assert!(!shm(&db).exists());
    disk.fill();

    let s = Store::open(&db).expect("a full disk must not keep the store from opening");
    assert!(s.is_exclusive(), "no room for the shared WAL index");
    assert!(s.get_session("t", "ses_1").expect("read").is_some());
    assert_eq!(
        s.list_executions("t", None, 10, None)
            .expect("list")
            .0
            .len(),
        1
    );
    assert!(s.verify_chain(Some("t")).expect("verify").ok);
    let put = s.put_session(&session("t", "ses_2", 5));
    assert!(
        matches!(&put, Err(e @ StoreError::Full(_)) if e.is_storage_full()),
        "{put:?}"
    );
    let append = s.append_execution(&exec("t", "ex_2", Some("ses_1"), 2));
    assert!(
        append.as_ref().is_err_and(StoreError::is_storage_full),
        "{append:?}"
    );
    assert!(s.get_session("t", "ses_2").expect("read").is_none());

    disk.free();
    s.put_session(&session("t", "ses_2", 5))
        .expect("writes work again once space is freed");
    s.append_execution(&exec("t", "ex_2", Some("ses_1"), 2))
        .expect("append after freeing space");
    assert!(s.verify_chain(Some("t")).expect("verify").ok);
    drop(s);

    // And the next open shares the database again.
    let s = Store::open(&db).expect("open");
    assert!(!s.is_exclusive());
    assert_eq!(
        s.list_executions("t", None, 10, None)
            .expect("list")
            .0
            .len(),
        2
    );
}
