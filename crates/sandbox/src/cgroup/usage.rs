//! Usage accounting: the cgroup files a run's CPU time, peak memory, OOM kills and refused
//! forks are read from, kept open between reads.

use std::fs;
use std::path::Path;

use super::files::keyed_u64;

/// Resources a cgroup consumed. Best effort: anything the kernel does not report is 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// CPU time, user + system, in nanoseconds.
    pub cpu_ns: u64,
    /// Highest memory usage seen (v2 without `memory.peak`: current usage).
    pub peak_memory_bytes: u64,
    /// Processes the kernel OOM killer killed in the cgroup.
    pub oom_kills: u64,
    /// Forks refused because the pids limit was reached.
    pub pids_limit_hits: u64,
}

/// How a number is found in a cgroup file.
#[derive(Debug, Clone, Copy)]
pub(super) enum Field {
    /// The whole file is one number (`cpuacct.usage`).
    Plain,
    /// The value of the `key N` line of a flat keyed file (`pids.events`).
    Keyed(&'static str),
}

/// One open cgroup file and how to read its number.
#[derive(Debug)]
pub(super) struct UsageFile {
    file: fs::File,
    field: Field,
}

impl UsageFile {
    /// Read-write where the caller may reset the value through it (v2 resets `memory.peak`
    /// per open file, so the resetting descriptor must be the reading one).
    pub(super) fn open(path: &Path, field: Field, writable: bool) -> Option<UsageFile> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .ok()
            .or_else(|| writable.then(|| fs::File::open(path).ok()).flatten())?;
        Some(UsageFile { file, field })
    }

    /// The current value: a cgroup file regenerates its text on every read from offset 0.
    pub(super) fn read(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 1024];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        if n == buf.len() {
            // Longer than any file read here today (a kernel adding many keys): read it all,
            // by offset like the first chunk.
            let mut all = buf.to_vec();
            loop {
                let mut more = [0u8; 1024];
                let m = self.file.read_at(&mut more, all.len() as u64).ok()?;
                if m == 0 {
                    break;
                }
                all.extend_from_slice(&more[..m]);
            }
            return self.parse(std::str::from_utf8(&all).ok()?);
        }
        self.parse(std::str::from_utf8(&buf[..n]).ok()?)
    }

    fn parse(&self, text: &str) -> Option<u64> {
        match self.field {
            Field::Plain => text.trim().parse().ok(),
            Field::Keyed(key) => keyed_u64(text, key),
        }
    }

    pub(super) fn reset(&self) {
        use std::os::unix::fs::FileExt;
        let _ = self.file.write_at(b"0", 0);
    }
}

/// The files [`super::Cgroup::usage`] reads, each `None` where the host lacks it.
#[derive(Debug, Default)]
pub(super) struct UsageFiles {
    /// CPU time; `cpu_scale` converts its unit to nanoseconds.
    pub(super) cpu: Option<UsageFile>,
    pub(super) cpu_scale: u64,
    /// Peak memory, also where the peak is reset (v2 without `memory.peak`: current usage).
    pub(super) peak: Option<UsageFile>,
    pub(super) oom_kills: Option<UsageFile>,
    pub(super) pids_limit_hits: Option<UsageFile>,
}
