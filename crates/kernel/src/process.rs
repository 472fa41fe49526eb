//! One kernel process in its sandbox: start it, run cells on it one at a time, interrupt it at
//! the deadline, kill it when it will not stop, and say how it ended.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runcell_protocol::{
    DoneStatus, Frame, FrameDecoder, HostMessage, KernelMessage, MimeBundle, ProtocolError,
    ToolFailureKind,
};
use runcell_sandbox::{
    CappedOutput, ExitStatus, KillReason, Launch, Running, RunningHandle, Sandbox, SandboxError,
};
use rustix::event::{PollFd, PollFlags, Timespec};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::tools::{CellTools, KernelToolCall, Link};

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("cannot start the kernel")]
    Start(#[source] SandboxError),
    #[error("the kernel did not become ready: {0}")]
    NotReady(String),
    #[error("the kernel has exited")]
    Gone,
    #[error("kernel protocol error")]
    Protocol(#[from] runcell_protocol::ProtocolError),
    #[error("kernel i/o failed")]
    Io(#[from] io::Error),
}

/// How to run one cell.
#[derive(Debug, Clone, Copy)]
pub struct CellOptions {
    /// At this point the kernel is interrupted (SIGINT: KeyboardInterrupt in Python).
    pub timeout: Duration,
    /// After the interrupt, how long the cell has to give up before the kernel is killed.
    pub grace: Duration,
    /// Bytes kept per stream (head and tail).
    pub output_cap: usize,
    /// Past this much output in total the kernel is killed.
    pub output_kill_bytes: u64,
    /// What the cell's displays and results may take.
    pub results: ResultLimits,
    /// Hold the output streamed from the pipes until the kernel says the cell has begun
    /// (`Started`): what comes before is not this cell's (see [`Kernel::settle`]). For
    /// callers that stream: a reply is corrected afterwards anyway, at no cost per cell.
    pub ack: bool,
}

/// Displays and main results one execution keeps at most (docs/api.md "Limits"; over them,
/// DESIGN.md §11's `truncated.results`): enough for a notebook's worth of figures and tables.
pub const MAX_RESULTS: usize = 64;
/// Bytes one result may take, as its frame from the kernel (the MIME bundle's JSON): a big
/// figure's PNG (base64, typically 20-500 KiB, a few MiB at 300 dpi) fits many times over.
/// It is also the largest frame the host buffers; a longer one is read past unbuffered.
pub const MAX_RESULT_BYTES: usize = 8 << 20;
/// Bytes all of one execution's results may take together: it bounds the reply, the audit
/// record and the server memory one running cell can hold, whatever the cell sends.
pub const MAX_RESULTS_BYTES: usize = 16 << 20;

/// The bounds on one cell's results; what goes over them is dropped and counted, and a note
/// (see [`DroppedResults::note`]) takes their place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultLimits {
    pub max_count: usize,
    pub max_bytes_each: usize,
    pub max_bytes_total: usize,
}

impl Default for ResultLimits {
    fn default() -> Self {
        Self {
            max_count: MAX_RESULTS,
            max_bytes_each: MAX_RESULT_BYTES,
            max_bytes_total: MAX_RESULTS_BYTES,
        }
    }
}

/// Results a cell produced that were not kept (by the kernel itself or by the host).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DroppedResults {
    pub count: u64,
    /// Their size as frames.
    pub bytes: u64,
}

impl DroppedResults {
    /// The marker shown in their place, in the style of the output streams'
    /// `[… N bytes truncated …]` line.
    pub fn note(&self, limits: &ResultLimits) -> String {
        format!(
            "[… {} result{} / {} bytes dropped …]\nAn execution keeps at most {} results of up to {} MiB each, {} MiB in all.",
            self.count,
            if self.count == 1 { "" } else { "s" },
            self.bytes,
            limits.max_count,
            limits.max_bytes_each >> 20,
            limits.max_bytes_total >> 20,
        )
    }
}

impl Default for CellOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            grace: Duration::from_secs(2),
            output_cap: 1 << 20,
            output_kill_bytes: 2 << 30,
            results: ResultLimits::default(),
            ack: false,
        }
    }
}

/// Something a running cell produced, as it happens.
#[derive(Debug)]
pub enum CellEvent<'a> {
    Stdout(&'a [u8]),
    Stderr(&'a [u8]),
    /// A display (`is_main_result` false) or the main result (true).
    Result {
        is_main_result: bool,
        data: &'a MimeBundle,
    },
    Error(&'a CellError),
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellStatus {
    Ok,
    Error,
    /// Interrupted on request; the kernel and its state live on.
    Interrupted,
    /// Interrupted at the deadline; the kernel and its state live on.
    TimedOut,
    /// The kernel is gone: killed at the end of the grace period (`Timeout`), out of memory,
    /// over the pids or output bound, or crashed (`Signal`, or `None` if it exited by itself).
    KernelDied {
        killed_by: Option<KillReason>,
        exit: ExitStatus,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// Everything one cell produced.
#[derive(Debug)]
pub struct CellOutcome {
    pub status: CellStatus,
    pub execution_count: u64,
    pub stdout: CappedOutput,
    pub stderr: CappedOutput,
    /// (is_main_result, bundle), in order, within [`CellOptions::results`]; when some were
    /// dropped, the last one is the note saying so.
    pub results: Vec<(bool, MimeBundle)>,
    /// Bytes of the kept results, as frames.
    pub results_bytes: u64,
    /// What went over [`CellOptions::results`].
    pub dropped: DroppedResults,
    /// The kernel broke the channel protocol (a frame over the size limit, a malformed one)
    /// and was killed for it: what it did.
    pub protocol_error: Option<String>,
    pub error: Option<CellError>,
    pub wall: Duration,
    pub cpu: Duration,
    pub peak_memory_bytes: u64,
}

/// A started kernel.
#[derive(Debug)]
pub struct Kernel {
    running: Option<Running>,
    handle: RunningHandle,
    channel: UnixStream,
    stdout: Option<File>,
    stderr: Option<File>,
    decoder: FrameDecoder,
    /// Cells started on this kernel, counted here: the `execution_count` a kernel reports is
    /// as forgeable as the rest of its channel (the cell's code can write to it).
    execution_count: u64,
    /// The id of the running cell, or of the last one between cells: every frame names
    /// its cell, and frames of any other are not the running cell's.
    cell_id: String,
    /// The cell before it.
    last_id: String,
    /// Between cells, the real end of a cell whose `done` was forged came (see `settle`).
    late_done: bool,
    /// The running cell's output is not only its own (see `take_messages`).
    discard_output: bool,
    /// With [`CellOptions::ack`], the streamed output (stderr?, bytes) held until `Started`.
    held: Option<Vec<(bool, Vec<u8>)>>,
    version: String,
    /// Read buffer for the cell's output and messages, kept between cells.
    buf: Vec<u8>,
    /// The descriptors registered with the tokio reactor, once a cell ran asynchronously.
    async_io: Option<AsyncIo>,
    /// The report of the running snapshot or restore request (see [`Kernel::request`]).
    reply: Option<KernelMessage>,
    /// What lives exactly as long as this kernel's sandbox (see [`Kernel::keep_alongside`]).
    companions: Vec<Companion>,
    /// The next cell's tools (see [`Kernel::set_tools`]), then the running cell's.
    tools: Option<CellTools>,
    /// The running cell's way back for tool answers, made at its first call (tools.rs).
    link: Option<Arc<Link>>,
}

/// Something dropped with the kernel: the engine's egress proxy serving this sandbox.
struct Companion(#[allow(dead_code, reason = "held for its Drop")] Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for Companion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Companion")
    }
}

/// Size of [`Kernel`]'s read buffer.
const READ_BUF: usize = 64 << 10;

/// Reads of the channel in one go at most (2 MiB), so a flood of frames cannot keep the
/// caller from its deadline checks.
const CHANNEL_READS: usize = 32;

/// How long the output of a dying kernel is still collected.
const DRAIN_AFTER_DEATH: Duration = Duration::from_secs(2);

impl Kernel {
    /// Starts the program of `launch` (which must ask for a channel) and waits for its `ready`.
    pub fn start(
        sandbox: &Sandbox,
        launch: &Launch<'_>,
        ready_timeout: Duration,
    ) -> Result<Kernel, KernelError> {
        let running = sandbox.spawn(launch).map_err(KernelError::Start)?;
        Self::attach(running, ready_timeout)
    }

    /// Like [`Kernel::start`], from a fork of a preloaded zygote (Python only): the kernel
    /// module is already imported there and `launch.argv` is not executed.
    pub fn start_in(
        sandbox: &Sandbox,
        zygote: &runcell_sandbox::Zygote,
        launch: &Launch<'_>,
        ready_timeout: Duration,
    ) -> Result<Kernel, KernelError> {
        let running = sandbox
            .spawn_in(zygote, launch)
            .map_err(KernelError::Start)?;
        Self::attach(running, ready_timeout)
    }

    /// Waits for the kernel's Ready message on a started sandbox.
    fn attach(mut running: Running, ready_timeout: Duration) -> Result<Kernel, KernelError> {
        // Cells come over the channel; the kernel's stdin is at end-of-file from the start.
        running.stdin = None;
        let mut channel = running
            .channel
            .take()
            .ok_or_else(|| KernelError::NotReady("the launch has no channel".into()))?;
        channel.set_read_timeout(Some(ready_timeout))?;
        let version = match runcell_protocol::read_message::<KernelMessage>(&mut channel) {
            Ok(KernelMessage::Ready { version, .. }) => version,
            other => {
                // Say why: a setup error, or the kernel's own stderr (an import error, a crash).
                running.kill(KillReason::Signal);
                let mut err = String::new();
                if let Some(mut s) = running.stderr.take() {
                    let _ = s.read_to_string(&mut err);
                }
                let why = match (running.finish(), other) {
                    (Err(SandboxError::Setup(msg)), _) => msg,
                    (_, Ok(msg)) => format!("unexpected first message {msg:?}"),
                    (_, Err(e)) => format!("{e}: {}", err.trim()),
                };
                return Err(KernelError::NotReady(why));
            }
        };
        channel.set_read_timeout(None)?;
        channel.set_nonblocking(true)?;
        let handle = running.handle()?;
        let stdout = running.stdout.take();
        let stderr = running.stderr.take();
        for f in [&stdout, &stderr].into_iter().flatten() {
            rustix::io::ioctl_fionbio(f, true).map_err(io::Error::from)?;
        }
        Ok(Kernel {
            running: Some(running),
            handle,
            channel,
            stdout,
            stderr,
            decoder: FrameDecoder::with_keep_limit(MAX_RESULT_BYTES),
            execution_count: 0,
            cell_id: String::new(),
            last_id: String::new(),
            late_done: false,
            discard_output: false,
            held: None,
            version,
            buf: Vec::new(),
            async_io: None,
            reply: None,
            companions: Vec::new(),
            tools: None,
            link: None,
        })
    }

    /// The sandbox's egress socket (see `runcell_sandbox::Running::egress_listener`).
    pub fn egress_listener(&self, timeout: Duration) -> Result<std::net::TcpListener, KernelError> {
        let running = self.running.as_ref().ok_or(KernelError::Gone)?;
        Ok(running.egress_listener(timeout)?)
    }

    /// Keeps `companion` until this kernel is dropped (it ends with its sandbox).
    pub fn keep_alongside(&mut self, companion: Box<dyn std::any::Any + Send>) {
        self.companions.push(Companion(companion));
    }

    /// The interpreter's version, as the kernel reported it.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// A handle to interrupt the running cell (or kill the kernel) from another thread.
    pub fn handle(&self) -> RunningHandle {
        self.handle.clone()
    }

    /// Whether the kernel is still alive (false after a cell reported `KernelDied`).
    pub fn is_alive(&self) -> bool {
        self.running.is_some()
    }

    /// Whether a kernel that has been waiting for its first cell can still take one: alive,
    /// and silent on its channel (an idle kernel sends nothing; a dead one's channel has hung
    /// up). [`Kernel::is_alive`] only learns of a death when a cell runs into it.
    pub fn is_idle(&self) -> bool {
        if self.running.is_none() {
            return false;
        }
        let mut fds = [PollFd::new(&self.channel, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
    }

    /// The tools the next cell (and only it) may call, and where its calls go. Without, a
    /// cell's calls are refused at once.
    pub fn set_tools(&mut self, tools: Option<CellTools>) {
        self.tools = tools;
    }

    /// Cells run so far.
    pub fn execution_count(&self) -> u64 {
        self.execution_count
    }

    /// Runs one cell. After a `KernelDied` outcome the kernel is finished and must be replaced.
    pub fn execute(
        &mut self,
        id: &str,
        code: &str,
        opts: &CellOptions,
        on_event: &mut dyn FnMut(CellEvent<'_>),
    ) -> Result<CellOutcome, KernelError> {
        let (started, cpu0, frame) = self.begin(id, code, opts)?;
        let mut out = self.new_outcome(opts);
        // Reused across cells: zeroing 64 KiB per cell showed in profiles.
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(READ_BUF, 0);
        let result = match self.settle(&mut out, opts, &mut buf) {
            Ok(Some(ended)) => self
                .end_cell(ended, None, cpu0, &mut out, &mut buf, on_event)
                .map(|()| note_dropped(&mut out, opts, on_event)),
            Ok(None) => match self.send(&frame) {
                Ok(()) => self.run(&mut out, opts, started, cpu0, &mut buf, on_event),
                Err(KernelError::Gone) => {
                    self.end_cell(Ended::Died, None, cpu0, &mut out, &mut buf, on_event)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        self.buf = buf;
        result?;
        out.wall = started.elapsed();
        Ok(out)
    }

    /// Sends `msg` (a snapshot or restore, answered like a cell but outside the execution
    /// count) and runs it as [`Kernel::execute`] runs a cell: deadline, interrupt, kill, output
    /// drained from the pipes. Returns how it ended and the kernel's report, if one came.
    pub(crate) fn request(
        &mut self,
        id: &str,
        msg: &HostMessage,
        opts: &CellOptions,
    ) -> Result<(CellOutcome, Option<KernelMessage>), KernelError> {
        let (started, cpu0, frame) = self.begin_message(id, msg, opts)?;
        let mut out = self.new_outcome(opts);
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(READ_BUF, 0);
        let on_event = &mut |_: CellEvent<'_>| {};
        let result = match self.settle(&mut out, opts, &mut buf) {
            Ok(Some(ended)) => self.end_cell(ended, None, cpu0, &mut out, &mut buf, on_event),
            Ok(None) => match self.send(&frame) {
                Ok(()) => self.run(&mut out, opts, started, cpu0, &mut buf, on_event),
                Err(KernelError::Gone) => {
                    self.end_cell(Ended::Died, None, cpu0, &mut out, &mut buf, on_event)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        self.buf = buf;
        result?;
        out.wall = started.elapsed();
        Ok((out, self.reply.take()))
    }

    /// [`Kernel::execute`] for async callers, without events: waits for the kernel on the
    /// tokio reactor instead of blocking a thread in `poll`, so an HTTP task can run a cell
    /// itself, with no thread in between. Must run inside a tokio runtime. The rare slow paths
    /// (a kernel being killed or dying, whose sandbox is waited for) block; on a
    /// multi-threaded runtime they run in `block_in_place`.
    pub async fn execute_async(
        &mut self,
        id: &str,
        code: &str,
        opts: &CellOptions,
    ) -> Result<CellOutcome, KernelError> {
        let (started, cpu0, frame) = self.begin(id, code, opts)?;
        // Registered once per kernel; taken out for the cell so its readiness guards can live
        // alongside `&mut self`.
        let io = match self.async_io.take() {
            Some(io) => io,
            None => AsyncIo::new(&self.channel, &self.stdout, &self.stderr)?,
        };
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(READ_BUF, 0);
        let mut out = self.new_outcome(opts);
        let on_event = &mut |_: CellEvent<'_>| {};
        let result = match self.settle(&mut out, opts, &mut buf) {
            // Waiting for a dying sandbox blocks.
            Ok(Some(ended)) => blocking(|| {
                self.end_cell(ended, None, cpu0, &mut out, &mut buf, on_event)
                    .map(|()| note_dropped(&mut out, opts, on_event))
            }),
            Ok(None) => match self.send_async(&frame).await {
                Ok(()) => {
                    self.run_async(&io, &mut out, opts, started, cpu0, &mut buf)
                        .await
                }
                Err(KernelError::Gone) => blocking(|| {
                    self.end_cell(Ended::Died, None, cpu0, &mut out, &mut buf, on_event)
                }),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        self.buf = buf;
        if self.running.is_some() {
            self.async_io = Some(io);
        }
        result?;
        out.wall = started.elapsed();
        Ok(out)
    }

    /// A cell's start: a new peak-memory window, the CPU counter, and the frame to send.
    fn begin(
        &mut self,
        id: &str,
        code: &str,
        opts: &CellOptions,
    ) -> Result<(Instant, Duration, Vec<u8>), KernelError> {
        let msg = HostMessage::Execute {
            id: id.to_owned(),
            code: code.to_owned(),
            ack: opts.ack,
            tools: self
                .tools
                .as_ref()
                .map(|t| t.specs.clone())
                .unwrap_or_default(),
        };
        self.execution_count += 1;
        self.begin_message(id, &msg, opts)
    }

    /// [`Kernel::begin`] for any message answered like a cell (frames with its id, `done`).
    fn begin_message(
        &mut self,
        id: &str,
        msg: &HostMessage,
        opts: &CellOptions,
    ) -> Result<(Instant, Duration, Vec<u8>), KernelError> {
        let started = Instant::now();
        // No frame longer than a result may be is ever buffered (errors are bounded too).
        self.decoder.set_keep_limit(opts.results.max_bytes_each);
        let cpu0 = {
            let running = self.running.as_ref().ok_or(KernelError::Gone)?;
            running.reset_peak();
            running.cpu_now()
        };
        let frame = runcell_protocol::encode(msg)?;
        self.held = opts.ack.then(Vec::new);
        self.reply = None;
        self.last_id = std::mem::replace(&mut self.cell_id, id.to_owned());
        Ok((started, cpu0, frame))
    }

    fn new_outcome(&self, opts: &CellOptions) -> CellOutcome {
        CellOutcome {
            status: CellStatus::Ok,
            execution_count: self.execution_count,
            stdout: CappedOutput::new(opts.output_cap),
            stderr: CappedOutput::new(opts.output_cap),
            results: Vec::new(),
            results_bytes: 0,
            dropped: DroppedResults::default(),
            protocol_error: None,
            error: None,
            wall: Duration::ZERO,
            cpu: Duration::ZERO,
            peak_memory_bytes: 0,
        }
    }

    /// The body of [`Kernel::execute`] once the cell is sent.
    fn run(
        &mut self,
        out: &mut CellOutcome,
        opts: &CellOptions,
        started: Instant,
        cpu0: Duration,
        buf: &mut [u8],
        on_event: &mut dyn FnMut(CellEvent<'_>),
    ) -> Result<(), KernelError> {
        let mut clock = CellClock::new(started, opts);
        let ended = loop {
            let wake = match self.check(&mut clock, out, opts)? {
                Ok(wake) => wake,
                Err(ended) => break ended,
            };
            let [out_ready, err_ready, chan_ready] =
                self.poll(wake.saturating_duration_since(Instant::now()))?;
            self.pump_ready([out_ready, err_ready], out, buf, on_event)?;
            if chan_ready {
                if let (Some(ended), _) = self.take_channel(out, opts, buf, on_event)? {
                    break ended;
                }
            }
        };
        self.end_cell(ended, clock.interrupted_at, cpu0, out, buf, on_event)?;
        note_dropped(out, opts, on_event);
        Ok(())
    }

    /// The body of [`Kernel::execute_async`] once the cell is sent.
    async fn run_async(
        &mut self,
        io: &AsyncIo,
        out: &mut CellOutcome,
        opts: &CellOptions,
        started: Instant,
        cpu0: Duration,
        buf: &mut [u8],
    ) -> Result<(), KernelError> {
        let on_event = &mut |_: CellEvent<'_>| {};
        let mut clock = CellClock::new(started, opts);
        let ended = loop {
            let wake = match self.check(&mut clock, out, opts)? {
                Ok(wake) => wake,
                Err(ended) => break ended,
            };
            let timer = tokio::time::sleep_until(wake.into());
            // A pipe at end-of-file stays readable: wait on it only while it is open.
            let (out_open, err_open) = (self.stdout.is_some(), self.stderr.is_some());
            // The channel first: a cell's output is in its pipes before its `done` is on the
            // channel, and what is left in them is read after `done` below, as in `run`.
            tokio::select! {
                biased;
                guard = io.channel.readable() => {
                    let mut guard = guard?;
                    let (ended, drained) = self.take_channel(out, opts, buf, on_event)?;
                    // Drained: the last read was a short one (all there was) or end-of-file.
                    // Otherwise the bound on reads stopped it, and there is more at once.
                    if drained {
                        guard.clear_ready();
                    }
                    if let Some(ended) = ended {
                        break ended;
                    }
                }
                guard = readable(io.stdout.as_ref().filter(|_| out_open)) => {
                    let mut guard = guard?;
                    if pump(&mut self.stdout, &mut out.stdout, buf, &mut |d| on_event(CellEvent::Stdout(d)))? {
                        guard.clear_ready();
                    }
                }
                guard = readable(io.stderr.as_ref().filter(|_| err_open)) => {
                    let mut guard = guard?;
                    if pump(&mut self.stderr, &mut out.stderr, buf, &mut |d| on_event(CellEvent::Stderr(d)))? {
                        guard.clear_ready();
                    }
                }
                () = timer => {}
            }
        };
        if matches!(ended, Ended::Done(_)) {
            self.end_cell(ended, clock.interrupted_at, cpu0, out, buf, on_event)?;
        } else {
            // Waiting for a dying sandbox blocks.
            blocking(|| self.end_cell(ended, clock.interrupted_at, cpu0, out, buf, on_event))?;
        }
        note_dropped(out, opts, on_event);
        Ok(())
    }

    /// The checks made before every wait: the deadline (interrupt), the grace after it (kill),
    /// the pids and output bounds. `Ok(when to wake up at the latest)` or `Err(how it ends)`.
    fn check(
        &self,
        clock: &mut CellClock,
        out: &CellOutcome,
        opts: &CellOptions,
    ) -> Result<Result<Instant, Ended>, KernelError> {
        let now = Instant::now();
        // Time spent waiting for tool answers does not count (tools.rs).
        let credit = self.link.as_ref().map_or(Duration::ZERO, |l| l.waited());
        let deadline = clock.deadline + credit;
        let mut soon = Duration::from_millis(100);
        if let Some(link) = &self.link {
            if link.has_backlog() {
                link.flush()?;
                soon = Duration::from_millis(5);
            }
        }
        if clock.interrupted_at.is_none() && now >= deadline {
            // The deadline: KeyboardInterrupt inside the cell, state kept.
            self.handle.interrupt();
            clock.interrupted_at = Some(now);
        }
        if clock.interrupted_at.is_some_and(|t| now >= t + opts.grace) {
            return Ok(Err(Ended::Kill(KillReason::Timeout)));
        }
        let running = self.running.as_ref().ok_or(KernelError::Gone)?;
        if running.pids_limit_hit() {
            return Ok(Err(Ended::Kill(KillReason::Pids)));
        }
        if out.stdout.total() + out.stderr.total() > opts.output_kill_bytes {
            return Ok(Err(Ended::Kill(KillReason::Output)));
        }
        Ok(Ok(clock
            .interrupted_at
            .map_or(deadline, |t| t + opts.grace)
            .min(now + soon)))
    }

    /// Reads the channel and applies its messages, a read at a time (so at most one frame
    /// being received is ever buffered): `Some` once the cell is done, the kernel hung up or
    /// broke the protocol; and whether the channel was read dry (false when the bound on
    /// reads stopped it, and more can be read at once).
    fn take_channel(
        &mut self,
        out: &mut CellOutcome,
        opts: &CellOptions,
        buf: &mut [u8],
        on_event: &mut dyn FnMut(CellEvent<'_>),
    ) -> Result<(Option<Ended>, bool), KernelError> {
        for _ in 0..CHANNEL_READS {
            let read = self.read_channel(buf)?;
            if let Some(ended) = self.take_messages(out, opts, false, on_event)? {
                return Ok((Some(ended), true));
            }
            match read {
                ChannelRead::Closed => return Ok((Some(Ended::Died), true)),
                ChannelRead::Drained => return Ok((None, true)),
                ChannelRead::More => {}
            }
        }
        Ok((None, false))
    }

    /// Finishes a cell that ended as `ended`: the rest of its output and its usage, or the
    /// kernel's burial.
    fn end_cell(
        &mut self,
        ended: Ended,
        interrupted_at: Option<Instant>,
        cpu0: Duration,
        out: &mut CellOutcome,
        buf: &mut [u8],
        on_event: &mut dyn FnMut(CellEvent<'_>),
    ) -> Result<(), KernelError> {
        self.tools = None;
        let mut ended = ended;
        if let Some(link) = self.link.take() {
            if let Err(e) = link.close() {
                if matches!(ended, Ended::Done(_)) {
                    out.protocol_error = Some(format!(
                        "the kernel did not take the rest of a tool answer at the end of the cell ({e})"
                    ));
                    ended = Ended::Kill(KillReason::Signal);
                }
            }
        }
        match ended {
            Ended::Done(status) => {
                // Everything the cell printed before `done` is already in the pipes. One
                // poll says which have any: most cells leave both empty, and reading each
                // to EAGAIN would be two system calls for nothing.
                let [o, e, _] = self.poll(Duration::ZERO)?;
                self.pump_ready([o, e], out, buf, on_event)?;
                out.status = match status {
                    DoneStatus::Ok => CellStatus::Ok,
                    DoneStatus::Error => CellStatus::Error,
                    DoneStatus::Interrupted if interrupted_at.is_some() => CellStatus::TimedOut,
                    DoneStatus::Interrupted => CellStatus::Interrupted,
                };
                let running = self.running.as_ref().ok_or(KernelError::Gone)?;
                let (cpu, peak) = running.usage_now();
                out.cpu = cpu.saturating_sub(cpu0);
                out.peak_memory_bytes = peak;
            }
            Ended::Kill(reason) => self.bury(Some(reason), cpu0, out, buf, on_event)?,
            Ended::Died => self.bury(None, cpu0, out, buf, on_event)?,
        }
        if std::mem::take(&mut self.discard_output) {
            self.held = None;
            out.stdout = CappedOutput::new(0);
            out.stderr = CappedOutput::new(0);
            out.results.clear();
            out.results_bytes = 0;
            out.dropped = DroppedResults::default();
            out.error = None;
        }
        // A kernel that ended before its `Started`: what it printed is still this cell's.
        self.release_held(on_event);
        Ok(())
    }

    /// Reads the output pipes that `ready` ([stdout, stderr]) says have data into the cell's
    /// capped outputs, streaming their live part.
    fn pump_ready(
        &mut self,
        [stdout, stderr]: [bool; 2],
        out: &mut CellOutcome,
        buf: &mut [u8],
        on_event: &mut dyn FnMut(CellEvent<'_>),
    ) -> io::Result<()> {
        let held = &mut self.held;
        if stdout {
            pump(
                &mut self.stdout,
                &mut out.stdout,
                buf,
                &mut |d| match held {
                    Some(h) => h.push((false, d.to_vec())),
                    None => on_event(CellEvent::Stdout(d)),
                },
            )?;
        }
        if stderr {
            pump(
                &mut self.stderr,
                &mut out.stderr,
                buf,
                &mut |d| match held {
                    Some(h) => h.push((true, d.to_vec())),
                    None => on_event(CellEvent::Stderr(d)),
                },
            )?;
        }
        Ok(())
    }

    /// Streams the output held until `Started` (see [`CellOptions::ack`]).
    fn release_held(&mut self, on_event: &mut dyn FnMut(CellEvent<'_>)) {
        for (stderr, d) in self.held.take().unwrap_or_default() {
            on_event(match stderr {
                false => CellEvent::Stdout(&d),
                true => CellEvent::Stderr(&d),
            });
        }
    }

    /// Ends a dying kernel: kill (with `reason`) or wait for its end, collect the rest of its
    /// output and how it ended.
    fn bury(
        &mut self,
        reason: Option<KillReason>,
        cpu0: Duration,
        out: &mut CellOutcome,
        buf: &mut [u8],
        on_event: &mut dyn FnMut(CellEvent<'_>),
    ) -> Result<(), KernelError> {
        let mut running = self.running.take().ok_or(KernelError::Gone)?;
        if let Some(r) = reason {
            running.kill(r);
        }
        let (cpu, peak) = running.usage_now();
        let until = Instant::now() + DRAIN_AFTER_DEATH;
        while (self.stdout.is_some() || self.stderr.is_some()) && Instant::now() < until {
            let [o, e, _] = self.poll(Duration::from_millis(50))?;
            self.pump_ready([o, e], out, buf, on_event)?;
        }
        if Instant::now() >= until {
            // Something still holds the pipes; the sandbox goes now.
            running.kill(KillReason::Signal);
        }
        self.stdout = None;
        self.stderr = None;
        let finished = running
            .finish()
            .map_err(|e| KernelError::NotReady(e.to_string()))?;
        out.status = CellStatus::KernelDied {
            killed_by: reason.or(finished.killed_by),
            exit: finished.exit,
        };
        out.cpu = cpu.saturating_sub(cpu0);
        out.peak_memory_bytes = peak.max(finished.usage.peak_memory_bytes);
        Ok(())
    }

    /// Kills the kernel and waits for the sandbox to be gone.
    pub fn shutdown(mut self) {
        if let Some(mut r) = self.running.take() {
            r.kill(KillReason::Signal);
            let _ = r.finish();
        }
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), KernelError> {
        let mut data = frame;
        while !data.is_empty() {
            match self.channel.write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut fds = [PollFd::new(&self.channel, PollFlags::OUT)];
                    rustix::event::poll(&mut fds, None).map_err(io::Error::from)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(KernelError::Gone),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// [`Kernel::send`] waiting on the reactor when the channel is full (a big cell).
    async fn send_async(&mut self, frame: &[u8]) -> Result<(), KernelError> {
        let mut data = frame;
        let mut writable = None;
        while !data.is_empty() {
            match self.channel.write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let fd = match &mut writable {
                        Some(fd) => fd,
                        None => {
                            writable.insert(register(self.channel.as_fd(), Interest::WRITABLE)?)
                        }
                    };
                    fd.writable().await?.clear_ready();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(KernelError::Gone),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// One read of the channel into the decoder.
    fn read_channel(&mut self, buf: &mut [u8]) -> Result<ChannelRead, KernelError> {
        loop {
            match self.channel.read(buf) {
                Ok(0) => return Ok(ChannelRead::Closed),
                Ok(n) => {
                    self.decoder.push(&buf[..n]);
                    // A short read took all there was: the next read would only say EAGAIN,
                    // and the caller polls again anyway.
                    return Ok(if n < buf.len() {
                        ChannelRead::Drained
                    } else {
                        ChannelRead::More
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ChannelRead::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Ok(ChannelRead::Closed)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Keeps a result of `len` bytes if it fits in what is left of the cell's limits;
    /// counts it as dropped otherwise.
    fn admit_result(out: &mut CellOutcome, limits: &ResultLimits, len: usize) -> bool {
        let fits = out.results.len() < limits.max_count
            && len <= limits.max_bytes_each
            && out.results_bytes + len as u64 <= limits.max_bytes_total as u64;
        if fits {
            out.results_bytes += len as u64;
        } else {
            out.dropped.count += 1;
            out.dropped.bytes += len as u64;
        }
        fits
    }

    /// Applies every complete message; `Some` once `done` arrives, or when the kernel broke
    /// the protocol (it is to be killed: the channel can no longer be trusted).
    ///
    /// The cell's own code can write to the channel, so every frame is checked against the
    /// running cell's id: displays, results and errors of another are dropped, and a `done`
    /// of another breaks the protocol (a kernel ends each cell once, after its output).
    /// `between`: no cell has been sent yet (see [`Kernel::settle`]).
    fn take_messages(
        &mut self,
        out: &mut CellOutcome,
        opts: &CellOptions,
        between: bool,
        on_event: &mut dyn FnMut(CellEvent<'_>),
    ) -> Result<Option<Ended>, KernelError> {
        loop {
            let (msg, len) = match self.decoder.next_frame::<KernelMessage>() {
                Ok(None) => return Ok(None),
                Ok(Some(Frame::Message { msg, len })) => (msg, len),
                // Over the per-result limit, read past unbuffered: whatever it was, it is
                // not kept (a kernel's own messages never come this large; see the kernels).
                Ok(Some(Frame::Skipped { .. })) if between => continue,
                Ok(Some(Frame::Skipped { len })) => {
                    Self::admit_result(out, &opts.results, len);
                    continue;
                }
                Err(e) => {
                    let reason = match e {
                        ProtocolError::TooLarge(_) => KillReason::Output,
                        _ => KillReason::Signal,
                    };
                    out.protocol_error = Some(error_chain(&e));
                    return Ok(Some(Ended::Kill(reason)));
                }
            };
            let ours = match &msg {
                KernelMessage::Display { id, .. }
                | KernelMessage::Result { id, .. }
                | KernelMessage::Done { id, .. } => !between && *id == self.cell_id,
                // An error about the protocol itself names no cell.
                KernelMessage::Error { id, .. } => {
                    !between && id.as_ref().is_none_or(|id| *id == self.cell_id)
                }
                KernelMessage::Started { id }
                | KernelMessage::ToolCall { id, .. }
                | KernelMessage::Snapshotted { id, .. }
                | KernelMessage::Restored { id, .. }
                | KernelMessage::SnapshotRefused { id, .. } => !between && *id == self.cell_id,
                KernelMessage::Ready { .. } => false,
            };
            match msg {
                KernelMessage::Done { id, .. } if !ours => {
                    if between && id == self.last_id {
                        // The real end of the last cell, whose `done` its code forged: what
                        // it printed until now is in the pipes, and is no cell's.
                        self.late_done = true;
                        continue;
                    }
                    let what = if id == self.last_id {
                        // Its code went on after its forged `done`, into this cell's time.
                        self.discard_output = true;
                        format!(
                            "execution {id} ended while {} ran: {id} forged its end on the kernel's channel and went on running, so the output here could not be told from its own and was discarded",
                            self.cell_id
                        )
                    } else {
                        format!("an end of execution {id:?} arrived, which is not the one running")
                    };
                    out.protocol_error = Some(what);
                    return Ok(Some(Ended::Kill(KillReason::Signal)));
                }
                // Another cell's, or no cell's: not this one's output.
                _ if !ours => {}
                // What the pipes held until now is this cell's: had the real end of a cell
                // whose `done` was forged come first, this cell would have ended, discarding.
                KernelMessage::Started { .. } => self.release_held(on_event),
                KernelMessage::Display { data, .. } | KernelMessage::Result { data, .. }
                    if !Self::admit_result(out, &opts.results, len) =>
                {
                    drop(data);
                }
                KernelMessage::Display { data, .. } => {
                    on_event(CellEvent::Result {
                        is_main_result: false,
                        data: &data,
                    });
                    out.results.push((false, data));
                }
                KernelMessage::Result { data, .. } => {
                    on_event(CellEvent::Result {
                        is_main_result: true,
                        data: &data,
                    });
                    out.results.push((true, data));
                }
                // A kernel reports one error per cell; more can only be forged, and each
                // would be streamed: they are dropped and counted like results over the limits.
                KernelMessage::Error { .. } if out.error.is_some() => {
                    out.dropped.count += 1;
                    out.dropped.bytes += len as u64;
                }
                KernelMessage::Error {
                    name,
                    value,
                    traceback,
                    ..
                } => {
                    let e = CellError {
                        name,
                        value,
                        traceback,
                    };
                    on_event(CellEvent::Error(&e));
                    out.error = Some(e);
                }
                // The count is the host's (`begin`): the kernel's is ignored.
                KernelMessage::Done {
                    status,
                    dropped_results,
                    dropped_bytes,
                    ..
                } => {
                    out.dropped.count = out.dropped.count.saturating_add(dropped_results);
                    out.dropped.bytes = out.dropped.bytes.saturating_add(dropped_bytes);
                    return Ok(Some(Ended::Done(status)));
                }
                KernelMessage::Ready { .. } => {}
                KernelMessage::ToolCall {
                    call, name, input, ..
                } => self.tool_call(call, name, input, len)?,
                // One report per request; more can only be forged (and a cell's are nobody's:
                // `begin_message` clears it), dropped and counted like extra errors.
                KernelMessage::Snapshotted { .. }
                | KernelMessage::Restored { .. }
                | KernelMessage::SnapshotRefused { .. }
                    if self.reply.is_some() =>
                {
                    out.dropped.count += 1;
                    out.dropped.bytes += len as u64;
                }
                report @ (KernelMessage::Snapshotted { .. }
                | KernelMessage::Restored { .. }
                | KernelMessage::SnapshotRefused { .. }) => self.reply = Some(report),
            }
        }
    }

    /// Hands a call of the running cell to its tools' sink, or refuses it.
    fn tool_call(
        &mut self,
        call: u64,
        name: String,
        input: serde_json::Value,
        frame_bytes: usize,
    ) -> Result<(), KernelError> {
        let link = match &self.link {
            Some(l) => l.clone(),
            None => self.link.insert(Link::new(&self.channel)?).clone(),
        };
        let Some(tools) = &self.tools else {
            link.refuse(
                call,
                ToolFailureKind::Refused,
                format!("no tools were declared for this execution: {name:?} cannot be called"),
            );
            return Ok(());
        };
        match link.open_call(call) {
            Some(answer) => tools.sink.call(
                KernelToolCall {
                    name,
                    input,
                    frame_bytes,
                },
                answer,
            ),
            None => link.refuse(
                call,
                ToolFailureKind::Refused,
                format!("call number {call} is already waiting for its answer"),
            ),
        }
        Ok(())
    }

    /// Before a cell is sent: an idle kernel is silent, so whatever waits on its channel
    /// came from the last cell's code after that cell ended. Its frames are no cell's and
    /// are dropped; when among them is the real end of a cell whose `done` was forged, what
    /// that cell printed since is in the pipes and is dropped too, so none of it reaches
    /// this cell. `Some` when the kernel must go before this cell is sent (it broke the
    /// protocol, or is gone). One `poll` when there is nothing, as for every honest cell.
    fn settle(
        &mut self,
        out: &mut CellOutcome,
        opts: &CellOptions,
        buf: &mut [u8],
    ) -> Result<Option<Ended>, KernelError> {
        let on_event = &mut |_: CellEvent<'_>| {};
        self.late_done = false;
        self.discard_output = false;
        // What came in one read with the last cell's `done` waits in the decoder.
        let mut ended = self.take_messages(out, opts, true, on_event)?;
        for _ in 0..CHANNEL_READS {
            if ended.is_some() {
                break;
            }
            let mut fds = [PollFd::new(&self.channel, PollFlags::IN)];
            let zero = Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            match rustix::event::poll(&mut fds, Some(&zero)) {
                Ok(0) => break,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io::Error::from(e).into()),
            }
            let read = self.read_channel(buf)?;
            if let Some(e) = self.take_messages(out, opts, true, on_event)? {
                ended = Some(e);
                break;
            }
            if let ChannelRead::Closed = read {
                ended = Some(Ended::Died);
                break;
            }
        }
        if self.late_done || ended.is_some() {
            self.late_done = false;
            for stream in [&mut self.stdout, &mut self.stderr] {
                let mut sink = CappedOutput::new(0);
                // Bounded: a background process that floods its output does not hold the
                // cell; what it writes from here on is the next cell's.
                for _ in 0..CHANNEL_READS {
                    if pump(stream, &mut sink, buf, &mut |_| {})? {
                        break;
                    }
                }
            }
        }
        if let Some(Ended::Kill(_)) = ended {
            if let Some(what) = &mut out.protocol_error {
                *what = format!(
                    "{what}, after the last execution ended and before this one was sent; this one was not run"
                );
            }
        }
        Ok(ended)
    }

    /// Waits up to `timeout` for stdout, stderr or the channel to be readable (or closed).
    fn poll(&self, timeout: Duration) -> io::Result<[bool; 3]> {
        let flags = PollFlags::IN;
        let mut fds = Vec::with_capacity(3);
        let mut which = Vec::with_capacity(3);
        if let Some(f) = &self.stdout {
            fds.push(PollFd::from_borrowed_fd(f.as_fd(), flags));
            which.push(0);
        }
        if let Some(f) = &self.stderr {
            fds.push(PollFd::from_borrowed_fd(f.as_fd(), flags));
            which.push(1);
        }
        fds.push(PollFd::from_borrowed_fd(self.channel.as_fd(), flags));
        which.push(2);
        let timeout = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok([false; 3]),
            Err(e) => return Err(e.into()),
        }
        let mut ready = [false; 3];
        for (fd, i) in fds.iter().zip(which) {
            ready[i] = !fd.revents().is_empty();
        }
        Ok(ready)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.take() {
            r.kill(KillReason::Signal);
            let _ = r.finish();
        }
    }
}

enum Ended {
    Done(DoneStatus),
    Kill(KillReason),
    Died,
}

/// What one read of the channel found.
enum ChannelRead {
    /// All there was (a short read, or nothing).
    Drained,
    /// A full buffer: there may be more at once.
    More,
    Closed,
}

/// Puts the note about dropped results last among the results, and streams it.
fn note_dropped(
    out: &mut CellOutcome,
    opts: &CellOptions,
    on_event: &mut dyn FnMut(CellEvent<'_>),
) {
    if out.dropped.count == 0 {
        return;
    }
    let note = MimeBundle::from([("text/plain".to_owned(), out.dropped.note(&opts.results))]);
    on_event(CellEvent::Result {
        is_main_result: false,
        data: &note,
    });
    out.results.push((false, note));
}

/// An error and its causes, `a: b`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Reads what a non-blocking pipe has now into `sink`, streaming the live part. Bounded, so a
/// program that floods its output cannot keep the caller from checking its deadlines.
///
/// Returns whether the pipe was left empty (or closed); false when the bound stopped it.
fn pump(
    stream: &mut Option<File>,
    sink: &mut CappedOutput,
    buf: &mut [u8],
    emit: &mut dyn FnMut(&[u8]),
) -> io::Result<bool> {
    let Some(f) = stream else { return Ok(true) };
    for _ in 0..32 {
        match f.read(buf) {
            Ok(0) => {
                *stream = None;
                return Ok(true);
            }
            Ok(n) => {
                let live = sink.push(&buf[..n]);
                if !live.is_empty() {
                    emit(live);
                }
                if n < buf.len() {
                    return Ok(true); // drained for now (a short read), no EAGAIN round
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Where a cell is in its time: the deadline, and when it was interrupted at it.
struct CellClock {
    deadline: Instant,
    interrupted_at: Option<Instant>,
}

impl CellClock {
    fn new(started: Instant, opts: &CellOptions) -> Self {
        CellClock {
            deadline: started + opts.timeout,
            interrupted_at: None,
        }
    }
}

/// A kernel's channel and output pipes registered with the tokio reactor, for
/// [`Kernel::execute_async`]. Each holds a duplicate of the kernel's descriptor, so closing the
/// kernel's own (a pipe at end-of-file) never leaves a registration on a number that another
/// file may get next; the registrations go when this is dropped.
#[derive(Debug)]
struct AsyncIo {
    channel: AsyncFd<OwnedFd>,
    stdout: Option<AsyncFd<OwnedFd>>,
    stderr: Option<AsyncFd<OwnedFd>>,
}

impl AsyncIo {
    fn new(
        channel: &UnixStream,
        stdout: &Option<File>,
        stderr: &Option<File>,
    ) -> io::Result<AsyncIo> {
        let pipe = |f: &Option<File>| -> io::Result<Option<AsyncFd<OwnedFd>>> {
            f.as_ref()
                .map(|f| register(f.as_fd(), Interest::READABLE))
                .transpose()
        };
        // Readable only: with writable interest too, every cell's frame taken off the socket
        // by the kernel would be an event for the reactor (a wake-up of an idle runtime
        // thread, for nothing). A full socket is rare; `send_async` registers for it then.
        Ok(AsyncIo {
            channel: register(channel.as_fd(), Interest::READABLE)?,
            stdout: pipe(stdout)?,
            stderr: pipe(stderr)?,
        })
    }
}

/// Registers a duplicate of `fd` with the tokio reactor.
///
/// `AsyncFd::with_interest` is deprecated because a descriptor closed by someone else while
/// registered would leave a stale registration; the duplicate here is owned by the `AsyncFd`
/// alone and closed only after it is deregistered (its drop). `register_with_interest`, the
/// replacement, is `unsafe` for the same reason, which this crate forbids.
#[allow(deprecated)]
fn register(fd: BorrowedFd<'_>, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::with_interest(fd.try_clone_to_owned()?, interest)
}

/// Readiness of an output pipe, or never once it is closed.
async fn readable(
    fd: Option<&AsyncFd<OwnedFd>>,
) -> io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// Runs blocking work from async code: in `block_in_place` on a multi-threaded runtime (the
/// other tasks of this thread move elsewhere meanwhile), inline otherwise.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
