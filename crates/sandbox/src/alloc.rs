//! The global allocator of the `runcell` binary, chosen once per process by its command line:
//! the server's allocator (mimalloc) for `runcell serve` and its zygote, the C library's
//! everywhere else.
//!
//! Why: mimalloc pays for its arena before `main` — it reserves 1 GiB, asks for transparent
//! huge pages on it, and its first allocations fault in three 2 MiB pages, each zeroed in
//! full (`thp_fault_alloc` +3 per process, even for `runcell --version`). A profile of `runcell
//! run print(1)` put that at a fifth of the CLI's own CPU, all of it before the sandbox is
//! cloned, and the clones (pid 1, the program) then copy-on-write into those huge pages. The
//! short-lived processes (`runcell run`, the exec'd `__sandbox-init` helpers, `keys`, ...) do a
//! few hundred small allocations; the server is where mimalloc measurably helps
//! (docs/benchmarks.md, "mimalloc as the server's allocator").
//!
//! The choice is made at the first allocation (before `main`: the runtime's own), from
//! `/proc/self/cmdline` read with plain system calls into a stack buffer, so deciding never
//! allocates. It never changes afterwards, so every block is freed by the allocator that made
//! it. Disabling mimalloc's huge pages through its options is not a way out: they are read
//! before `main` from the environment, and `allow_thp=0` turns huge pages off for the whole
//! process tree (`PR_SET_THP_DISABLE` is inherited), which the zygote relies on.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const SERVER: u8 = 2;

/// `A` for the server's processes, [`System`] for every other (see the module's text).
#[derive(Debug)]
pub struct ServerOnly<A>(pub A);

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

impl<A> ServerOnly<A> {
    #[inline]
    fn server(&self) -> bool {
        match CHOICE.load(Ordering::Relaxed) {
            SERVER => true,
            SYSTEM => false,
            _ => decide(),
        }
    }
}

/// Two threads deciding at once (impossible before `main`, harmless after) compute the same
/// answer from the same command line.
#[cold]
fn decide() -> bool {
    let server = match read_cmdline(&mut [0u8; 4096]) {
        Some((args, complete)) => wants_server(args, complete),
        // No /proc (a sandbox's helper before its mounts): the C library's allocator.
        None => false,
    };
    CHOICE.store(if server { SERVER } else { SYSTEM }, Ordering::Relaxed);
    server
}

/// The NUL-separated arguments of this process, and whether they all fit in `buf`.
fn read_cmdline(buf: &mut [u8]) -> Option<(&[u8], bool)> {
    // SAFETY: a constant NUL-terminated path; the descriptor is ours and closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: reading into the unfilled rest of `buf`, within its bounds.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: closing the descriptor opened above, used by nobody else.
    unsafe { libc::close(fd) };
    Some((&buf[..len], len < buf.len()))
}

/// Whether the command line (`argv[0]\0argv[1]\0...`) is the server's: `serve` among the
/// arguments (global options may come before it), or the zygote's `__zygote`. A command line
/// too long for the buffer without either in its head keeps the server's allocator, as the
/// binary had before: slower at worst, never wrong.
fn wants_server(cmdline: &[u8], complete: bool) -> bool {
    let mut args = cmdline.split(|b| *b == 0).skip(1);
    let found = args.any(|a| a == b"serve" || a == crate::zygote::ZYGOTE_ARG.as_bytes());
    found || !complete
}

// SAFETY: every method forwards to one allocator, the same for the process's whole life
// (`CHOICE` is set before the first block is handed out and never changes), so each block is
// resized and freed by the allocator that made it, with the caller's layout.
unsafe impl<A: GlobalAlloc> GlobalAlloc for ServerOnly<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        unsafe {
            if self.server() {
                self.0.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        unsafe {
            if self.server() {
                self.0.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the same allocator (see above).
        unsafe {
            if self.server() {
                self.0.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from the same allocator (see above).
        unsafe {
            if self.server() {
                self.0.realloc(ptr, layout, new_size)
            } else {
                System.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_server_and_its_zygote_get_the_servers_allocator() {
        let yes: &[&[u8]] = &[
            b"runcell\0serve\0--listen\0[::1]:0\0",
            b"/x/runcell\0--data-dir\0/d\0serve\0",
            b"runcell\0__zygote\0",
        ];
        for c in yes {
            assert!(wants_server(c, true), "{}", String::from_utf8_lossy(c));
        }
        let no: &[&[u8]] = &[
            b"runcell\0run\0serve.py\0",
            b"runcell\0run\0-\0",
            b"runcell\0__sandbox-init\0spec\0",
            b"runcell\0--version\0",
            // argv[0] itself does not count.
            b"serve\0keys\0list\0",
            b"runcell\0",
        ];
        for c in no {
            assert!(!wants_server(c, true), "{}", String::from_utf8_lossy(c));
        }
        // Cut off before the command: as before this module, the server's allocator.
        assert!(wants_server(b"runcell\0--data-dir\0/very/long", false));
    }

    /// The arguments read are this process's own, whole.
    #[test]
    fn the_command_line_read_is_this_processes() {
        let mut buf = [0u8; 4096];
        let (args, complete) = read_cmdline(&mut buf).expect("/proc/self/cmdline");
        assert!(complete);
        let first = args.split(|b| *b == 0).next().unwrap_or_default();
        let exe = std::env::args_os().next().expect("argv[0]");
        assert_eq!(first, exe.as_encoded_bytes());
    }
}
