//! A cell's tool calls, on the host side of the channel (issue 22, docs/tools.md).
//!
//! Code in the sandbox calls a tool through `runcell_tools` (python/runcell_tools.py, and the
//! JavaScript kernel's `tools`): the kernel sends a `tool_call` frame with its own number for
//! the call, and waits, in that one thread or task, for the `tool_result` frame of the same
//! number; the rest of the cell goes on. Here the run loop of a cell hands each call to the
//! cell's [`ToolSink`] with a [`ToolAnswer`], and the answer is written to the kernel from
//! whatever thread has it, at once: the loop does not have to wake up for it.
//!
//! What keeps the channel sound with a second writer:
//! - every write takes the link's lock and writes whole frames in order; the socket is
//!   non-blocking, so what does not fit waits in the link's backlog, which the cell's run loop
//!   flushes (it wakes every few milliseconds while there is one);
//! - the link closes when the cell ends, before the next `execute` can be written: answers
//!   that come later are dropped, a frame written in part is finished first (a kernel that
//!   will not take it within [`CLOSE_FLUSH`] is killed: its channel would be out of step);
//! - a call that is never answered (a [`ToolAnswer`] dropped) is answered `cancelled`, so no
//!   code in the sandbox waits for an answer that cannot come.
//!
//! While a call waits, the cell's own deadline stands still (Anthropic's container waits for
//! the client too): the wait is credited to the cell's time, at most [`MAX_WAIT_CREDIT`] in
//! all per cell; each call has its own time limit, the caller's (see the engine's
//! `bridge.rs`).

use std::collections::{HashSet, VecDeque};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runcell_protocol::{HostMessage, ToolFailure, ToolFailureKind};
use rustix::event::{PollFd, PollFlags, Timespec};
use serde_json::Value;

/// The most a cell's deadline is pushed back by time spent waiting for tool answers.
pub const MAX_WAIT_CREDIT: Duration = Duration::from_secs(3600);

/// How long a kernel has, at the end of a cell, to take the rest of a half-written answer.
const CLOSE_FLUSH: Duration = Duration::from_secs(5);

/// What a cell's tool calls go to, for one cell.
pub trait ToolSink: Send + Sync {
    /// A call the running cell made. Answer it once, through `answer`, now or later and from
    /// any thread; dropping `answer` unanswered answers `cancelled`.
    fn call(&self, call: KernelToolCall, answer: ToolAnswer);
}

/// One call as the kernel made it: nothing in it is checked yet but its framing.
#[derive(Debug, Clone)]
pub struct KernelToolCall {
    pub name: String,
    pub input: Value,
    /// The size of the call's frame on the channel (an upper bound of the input's JSON).
    pub frame_bytes: usize,
}

/// The tools of one cell: what the kernel is told it may call, and where the calls go.
#[derive(Clone)]
pub struct CellTools {
    /// `{name, description, input_schema}` of each declared client tool, sent with the cell.
    pub specs: Vec<Value>,
    pub sink: Arc<dyn ToolSink>,
}

impl std::fmt::Debug for CellTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellTools")
            .field("specs", &self.specs.len())
            .finish_non_exhaustive()
    }
}

/// The way back to the kernel for one call.
#[derive(Debug)]
pub struct ToolAnswer {
    link: Arc<Link>,
    call: u64,
    sent: bool,
}

impl ToolAnswer {
    /// Answers the call: the code goes on with `output`, or raises `error`. Dropped quietly
    /// once the cell has ended.
    pub fn send(mut self, result: Result<Value, ToolFailure>) {
        self.sent = true;
        self.link.answer(self.call, result);
    }
}

impl Drop for ToolAnswer {
    fn drop(&mut self) {
        if !self.sent {
            self.link.answer(
                self.call,
                Err(ToolFailure {
                    kind: ToolFailureKind::Cancelled,
                    message: "the tool call was abandoned without an answer".into(),
                }),
            );
        }
    }
}

/// One cell's side of the channel for tool answers.
#[derive(Debug)]
pub(crate) struct Link {
    state: Mutex<LinkState>,
}

#[derive(Debug)]
struct LinkState {
    /// A duplicate of the kernel's channel (same open file: non-blocking), None once closed.
    channel: Option<UnixStream>,
    /// Encoded frames not yet written, in order; the first may be written in part.
    backlog: VecDeque<Vec<u8>>,
    /// Bytes of the first backlog frame already written.
    head_written: usize,
    /// Calls waiting for an answer, by the kernel's number.
    pending: HashSet<u64>,
    waiting_since: Option<Instant>,
    waited: Duration,
}

impl Link {
    pub(crate) fn new(channel: &UnixStream) -> io::Result<Arc<Link>> {
        Ok(Arc::new(Link {
            state: Mutex::new(LinkState {
                channel: Some(channel.try_clone()?),
                backlog: VecDeque::new(),
                head_written: 0,
                pending: HashSet::new(),
                waiting_since: None,
                waited: Duration::ZERO,
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers call `call`; None (and the call is to be refused) if that number waits already.
    pub(crate) fn open_call(self: &Arc<Self>, call: u64) -> Option<ToolAnswer> {
        let mut s = self.lock();
        s.channel.as_ref()?;
        if !s.pending.insert(call) {
            return None;
        }
        if s.waiting_since.is_none() {
            s.waiting_since = Some(Instant::now());
        }
        Some(ToolAnswer {
            link: self.clone(),
            call,
            sent: false,
        })
    }

    /// Answers a call that was never registered (refused before it reached a sink).
    pub(crate) fn refuse(&self, call: u64, kind: ToolFailureKind, message: String) {
        let mut s = self.lock();
        s.queue(call, Err(ToolFailure { kind, message }));
    }

    fn answer(&self, call: u64, result: Result<Value, ToolFailure>) {
        let mut s = self.lock();
        if !s.pending.remove(&call) {
            return; // the cell ended, or the number was answered already
        }
        if s.pending.is_empty() {
            if let Some(since) = s.waiting_since.take() {
                s.waited += since.elapsed();
            }
        }
        s.queue(call, result);
    }

    /// Time the cell has waited for answers so far (within [`MAX_WAIT_CREDIT`]).
    pub(crate) fn waited(&self) -> Duration {
        let s = self.lock();
        let now = s.waiting_since.map_or(Duration::ZERO, |t| t.elapsed());
        (s.waited + now).min(MAX_WAIT_CREDIT)
    }

    /// Whether frames wait to be written.
    pub(crate) fn has_backlog(&self) -> bool {
        !self.lock().backlog.is_empty()
    }

    /// Writes what the socket takes now.
    pub(crate) fn flush(&self) -> io::Result<()> {
        self.lock().flush()
    }

    /// Ends the link with its cell: later answers are dropped; a frame written in part is
    /// finished (Err if the kernel would not take it: its channel is out of step).
    pub(crate) fn close(&self) -> io::Result<()> {
        let mut s = self.lock();
        s.pending.clear();
        s.waiting_since = None;
        let result = if s.head_written > 0 {
            let rest = s.backlog.pop_front().unwrap_or_default();
            let written = s.head_written;
            s.backlog.clear();
            match s.channel.as_mut() {
                Some(ch) => write_within(ch, &rest[written..], CLOSE_FLUSH),
                None => Ok(()),
            }
        } else {
            Ok(())
        };
        s.backlog.clear();
        s.head_written = 0;
        s.channel = None;
        result
    }
}

impl LinkState {
    fn queue(&mut self, call: u64, result: Result<Value, ToolFailure>) {
        if self.channel.is_none() {
            return;
        }
        let (output, error) = match result {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e)),
        };
        let msg = HostMessage::ToolResult {
            call,
            output,
            error,
        };
        let frame = match runcell_protocol::encode(&msg) {
            Ok(f) => f,
            // Bounded before it gets here (the engine's 1 MiB); said as an error if not.
            Err(e) => match runcell_protocol::encode(&HostMessage::ToolResult {
                call,
                output: None,
                error: Some(ToolFailure {
                    kind: ToolFailureKind::TooLarge,
                    message: format!("the tool's answer could not be sent: {e}"),
                }),
            }) {
                Ok(f) => f,
                Err(_) => return,
            },
        };
        self.backlog.push_back(frame);
        // A write error (the kernel is gone) is the run loop's to find.
        let _ = self.flush();
    }

    fn flush(&mut self) -> io::Result<()> {
        let Some(ch) = self.channel.as_mut() else {
            return Ok(());
        };
        while let Some(head) = self.backlog.front() {
            match ch.write(&head[self.head_written..]) {
                Ok(n) => {
                    self.head_written += n;
                    if self.head_written == head.len() {
                        self.backlog.pop_front();
                        self.head_written = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.backlog.clear();
                    self.head_written = 0;
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// Writes all of `data` to a non-blocking socket within `limit`.
fn write_within(ch: &mut UnixStream, mut data: &[u8], limit: Duration) -> io::Result<()> {
    let end = Instant::now() + limit;
    while !data.is_empty() {
        match ch.write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the kernel did not read a tool answer",
                    ));
                }
                let mut fds = [PollFd::new(&*ch, PollFlags::OUT)];
                let t = Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: i64::from(left.subsec_nanos()),
                };
                match rustix::event::poll(&mut fds, Some(&t)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().expect("pair");
        a.set_nonblocking(true).expect("nonblocking");
        (a, b)
    }

    #[test]
    fn answers_reach_the_kernel_once_and_not_after_close() {
        let (host, mut kernel) = pair();
        let link = Link::new(&host).expect("link");
        let answer = link.open_call(7).expect("open");
        assert!(
            link.open_call(7).is_none(),
            "a number waiting already is refused"
        );
        answer.send(Ok(serde_json::json!({"v": 1})));
        let msg: HostMessage = runcell_protocol::read_message(&mut kernel).expect("read");
        assert_eq!(
            msg,
            HostMessage::ToolResult {
                call: 7,
                output: Some(serde_json::json!({"v": 1})),
                error: None
            }
        );
        // Dropped unanswered: the code hears `cancelled`.
        drop(link.open_call(8).expect("open"));
        let msg: HostMessage = runcell_protocol::read_message(&mut kernel).expect("read");
        assert!(matches!(
            msg,
            HostMessage::ToolResult {
                call: 8,
                error: Some(ToolFailure {
                    kind: ToolFailureKind::Cancelled,
                    ..
                }),
                ..
            }
        ));
        let late = link.open_call(9).expect("open");
        link.close().expect("close");
        late.send(Ok(Value::Null));
        kernel.set_nonblocking(true).expect("nb");
        let mut rest = [0u8; 16];
        assert_eq!(
            kernel.read(&mut rest).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock),
            "nothing is written after the cell ended"
        );
    }

    #[test]
    fn a_full_socket_keeps_the_backlog_and_close_finishes_the_frame_begun() {
        let (host, mut kernel) = pair();
        let link = Link::new(&host).expect("link");
        // Far more than a socket buffer holds.
        let big = Value::String("x".repeat(4 << 20));
        link.open_call(1).expect("open").send(Ok(big.clone()));
        assert!(link.has_backlog());
        let reader = std::thread::spawn(move || {
            let msg: HostMessage = runcell_protocol::read_message(&mut kernel).expect("read");
            msg
        });
        link.close()
            .expect("the kernel reads, so the frame is finished");
        let msg = reader.join().expect("reader");
        assert_eq!(
            msg,
            HostMessage::ToolResult {
                call: 1,
                output: Some(big),
                error: None
            }
        );
    }

    #[test]
    fn waiting_time_is_counted_while_a_call_waits() {
        let (host, _kernel) = pair();
        let link = Link::new(&host).expect("link");
        assert_eq!(link.waited(), Duration::ZERO);
        let a = link.open_call(1).expect("open");
        std::thread::sleep(Duration::from_millis(20));
        assert!(link.waited() >= Duration::from_millis(20));
        a.send(Ok(Value::Null));
        let after = link.waited();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            link.waited(),
            after,
            "no call waits: the credit stands still"
        );
    }
}
