//! runcell-protocol: the messages between the host and an in-sandbox kernel, and their framing.
//!
//! The kernel talks over a private Unix stream socket at its fd 3; stdout and stderr stay raw
//! pipes, so output from subprocesses and C code is captured exactly like Python's own. A frame
//! is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (one object).
//! The kernels' side of the framing: `crates/kernel/python/runcell_wire.py`, shared by the
//! Python and bash kernels, and the JavaScript kernel's own copy in
//! `crates/kernel/javascript/runcell_js_kernel.js`.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

mod snapshot;

pub use snapshot::{IncompatibleField, SkippedName, SnapshotRefusal, MAX_REPORT_NAMES};

/// Largest frame either side accepts: a few PNGs of a big figure fit; a runaway does not.
/// A longer length prefix is a protocol error before anything is read. The host keeps less
/// (a [`FrameDecoder`] with a keep limit, a result's limit in runcell-kernel) and reads past
/// the frames between the two.
pub const MAX_FRAME: usize = 64 << 20;

/// A Jupyter MIME bundle: MIME type -> text (base64 for binary types).
pub type MimeBundle = BTreeMap<String, String>;

/// Host -> kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    /// Run one cell. The host sends the next only after `Done`. With `ack`, the kernel sends
    /// `Started` first, when the cell begins (after the end of any cell before it).
    Execute {
        id: String,
        code: String,
        #[serde(default, skip_serializing_if = "is_false")]
        ack: bool,
        /// The client tools the cell may call (`runcell_tools`), each `{name, description,
        /// input_schema}` as the execute request declared it: the kernel makes them callable
        /// and checks arguments against the schema before a call leaves the sandbox.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tools: Vec<serde_json::Value>,
    },
    /// The answer to the running cell's `ToolCall` number `call`: its `output` (any JSON
    /// value) or an `error`. Sent only while that cell runs; a kernel drops one for a call it
    /// no longer waits for.
    ToolResult {
        call: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<serde_json::Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ToolFailure>,
    },
    /// Write the session's language state (variables, functions, ...) to `path`, a file
    /// inside the sandbox. Answered like a cell, outside the execution count: `Snapshotted`
    /// or an `Error`, then `Done`.
    Snapshot { id: String, path: String },
    /// Read a snapshot at `path` back into the session: `Restored` or `SnapshotRefused` (or
    /// an `Error`), then `Done`.
    Restore { id: String, path: String },
}

/// Why a tool call failed, as the kernel raises it: `kind` picks the exception class
/// (`runcell_tools.ToolError` and its subclasses), `message` is its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFailure {
    pub kind: ToolFailureKind,
    pub message: String,
}

/// The kinds of [`ToolFailure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFailureKind {
    /// The tool ran and failed (the client's or the MCP server's error).
    Error,
    /// No answer came within the call's time limit.
    Timeout,
    /// runcell refused the call: an undeclared tool, over the rate or pending-call bounds.
    Refused,
    /// The arguments or the result were over the size bound.
    TooLarge,
    /// The execution ended (or was interrupted) before the answer came.
    Cancelled,
}

/// How a cell ended, as the kernel saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoneStatus {
    Ok,
    Error,
    Interrupted,
}

/// Kernel -> host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KernelMessage {
    /// Sent once when the kernel can take work.
    Ready {
        language: String,
        version: String,
        pid: u32,
    },
    /// The cell begins (only for an `Execute` with `ack`): what the kernel writes to its
    /// stdout and stderr from here on is this cell's.
    Started { id: String },
    /// A `display()` call or a figure, in order with the cell's execution.
    Display { id: String, data: MimeBundle },
    /// The value of the cell's last expression.
    Result { id: String, data: MimeBundle },
    /// The cell's exception (or a protocol problem, with `id: null`).
    Error {
        id: Option<String>,
        name: String,
        value: String,
        traceback: String,
    },
    /// The running cell calls a tool (`runcell_tools`): `call` is the kernel's own number for
    /// it, unique among the cell's calls waiting for an answer; the host answers each with one
    /// `ToolResult` of the same number, while the cell runs. The host never trusts it beyond
    /// that: the name is checked against what the execution may call, the input bounded.
    ToolCall {
        id: String,
        call: u64,
        name: String,
        input: serde_json::Value,
    },
    /// The cell is finished; everything it printed is already in the stdout/stderr pipes.
    Done {
        id: String,
        status: DoneStatus,
        execution_count: u64,
        /// Displays and results the kernel did not send because they were over the
        /// per-execution limits, and their size as frames (the host adds its own drops).
        #[serde(default, skip_serializing_if = "is_zero")]
        dropped_results: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        dropped_bytes: u64,
    },
    /// A `Snapshot` was written: `bytes` long, holding `names`; `skipped` could not be saved.
    /// Lists stop at [`MAX_REPORT_NAMES`]; `omitted` counts the names left out of them.
    Snapshotted {
        id: String,
        bytes: u64,
        names: Vec<String>,
        skipped: Vec<SkippedName>,
        #[serde(default, skip_serializing_if = "is_zero")]
        omitted: u64,
        /// The kernel's time for it, in microseconds.
        duration_us: u64,
    },
    /// A `Restore` brought `names` back; `skipped` were in the snapshot but could not be.
    Restored {
        id: String,
        names: Vec<String>,
        skipped: Vec<SkippedName>,
        #[serde(default, skip_serializing_if = "is_zero")]
        omitted: u64,
        duration_us: u64,
    },
    /// A `Restore` whose file was refused before anything in it was unpickled.
    SnapshotRefused {
        id: String,
        refusal: SnapshotRefusal,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("the peer closed the channel")]
    Closed,
    #[error("frame of {0} bytes exceeds the {MAX_FRAME} byte limit")]
    TooLarge(usize),
    #[error("malformed frame")]
    Json(#[from] serde_json::Error),
    #[error("channel i/o failed")]
    Io(#[from] io::Error),
}

/// Encodes one message as a frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_FRAME {
        return Err(ProtocolError::TooLarge(body.len()));
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Writes one message.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), ProtocolError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

/// Reads one message (blocking).
pub fn read_message<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, ProtocolError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ProtocolError::Closed),
        other => other?,
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(serde_json::from_slice(&body)?)
}

/// One frame taken off a [`FrameDecoder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<T> {
    /// A whole frame, decoded; `len` is its body's length on the wire.
    Message { msg: T, len: usize },
    /// A frame longer than the decoder keeps: its bytes were discarded as they arrived,
    /// never buffered, and its content is unknown.
    Skipped { len: usize },
}

/// Incremental decoder for a non-blocking reader: feed bytes as they arrive, take whole
/// frames out.
///
/// Memory stays bounded whatever the peer sends: a frame whose length prefix is over
/// [`MAX_FRAME`] is an error before any of it is stored, and one over the decoder's keep
/// limit is read past (its bytes dropped as they come) and reported as [`Frame::Skipped`].
/// So the buffer holds at most one kept frame plus what one `push` brings, provided the
/// caller takes the frames out after each `push`.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Longest frame body decoded; longer ones are skipped.
    keep: usize,
    /// The frame being skipped: its length and the bytes of it still to come.
    skipping: Option<(usize, usize)>,
    /// A skipped frame whose last byte has arrived, not yet reported.
    skipped: Option<usize>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

/// A buffer this large is given back once empty: one big frame must not pin its memory for
/// the rest of the peer's life.
const SHRINK_ABOVE: usize = 1 << 20;

impl FrameDecoder {
    /// A decoder that keeps every frame up to [`MAX_FRAME`].
    pub fn new() -> Self {
        Self::with_keep_limit(MAX_FRAME)
    }

    /// A decoder that skips, unbuffered, every frame whose body is longer than `keep` bytes
    /// (at most [`MAX_FRAME`]; longer ones are still errors).
    pub fn with_keep_limit(keep: usize) -> Self {
        Self {
            buf: Vec::new(),
            keep: keep.min(MAX_FRAME),
            skipping: None,
            skipped: None,
        }
    }

    /// Changes the keep limit for the frames from here on.
    pub fn set_keep_limit(&mut self, keep: usize) {
        self.keep = keep.min(MAX_FRAME);
    }

    pub fn push(&mut self, mut data: &[u8]) {
        if let Some((len, remaining)) = self.skipping {
            let n = remaining.min(data.len());
            data = &data[n..];
            if n == remaining {
                self.skipping = None;
                self.skipped = Some(len);
            } else {
                self.skipping = Some((len, remaining - n));
            }
        }
        if self.buf.is_empty() && self.buf.capacity() > SHRINK_ABOVE {
            self.buf = Vec::new();
        }
        self.buf.extend_from_slice(data);
    }

    /// The next frame, if one has arrived whole (or, for a skipped one, has gone by).
    pub fn next_frame<T: for<'de> Deserialize<'de>>(
        &mut self,
    ) -> Result<Option<Frame<T>>, ProtocolError> {
        if let Some(len) = self.skipped.take() {
            return Ok(Some(Frame::Skipped { len }));
        }
        if self.skipping.is_some() || self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::TooLarge(len));
        }
        if len > self.keep {
            // What of it is here already goes now; the rest is dropped by `push`.
            let here = (self.buf.len() - 4).min(len);
            self.buf.drain(..4 + here);
            if here == len {
                return Ok(Some(Frame::Skipped { len }));
            }
            self.skipping = Some((len, len - here));
            return Ok(None);
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let msg = serde_json::from_slice(&self.buf[4..4 + len]);
        self.buf.drain(..4 + len);
        Ok(Some(Frame::Message { msg: msg?, len }))
    }

    /// The next complete message, if one has arrived (skipped frames are passed over).
    pub fn next_message<T: for<'de> Deserialize<'de>>(
        &mut self,
    ) -> Result<Option<T>, ProtocolError> {
        loop {
            match self.next_frame()? {
                Some(Frame::Message { msg, .. }) => return Ok(Some(msg)),
                Some(Frame::Skipped { .. }) => {}
                None => return Ok(None),
            }
        }
    }

    /// Bytes held for a frame still arriving (kept frames only).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_match_the_python_side() {
        let msgs = vec![
            KernelMessage::Ready {
                language: "python".into(),
                version: "3.11.2".into(),
                pid: 2,
            },
            KernelMessage::Result {
                id: "ex_1".into(),
                data: BTreeMap::from([("text/plain".into(), "42".into())]),
            },
            KernelMessage::Error {
                id: None,
                name: "ProtocolError".into(),
                value: "x".into(),
                traceback: String::new(),
            },
            KernelMessage::Done {
                id: "ex_1".into(),
                status: DoneStatus::Interrupted,
                execution_count: 3,
                dropped_results: 0,
                dropped_bytes: 0,
            },
            KernelMessage::Done {
                id: "ex_2".into(),
                status: DoneStatus::Ok,
                execution_count: 4,
                dropped_results: 236,
                dropped_bytes: 236 << 20,
            },
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            write_message(&mut wire, m).expect("write");
        }
        let mut r = &wire[..];
        for m in &msgs {
            assert_eq!(&read_message::<KernelMessage>(&mut r).expect("read"), m);
        }
        assert!(matches!(
            read_message::<KernelMessage>(&mut r),
            Err(ProtocolError::Closed)
        ));
        // The exact JSON the Python kernel produces and expects.
        let done: KernelMessage = serde_json::from_str(
            r#"{"type":"done","id":"ex_1","status":"ok","execution_count":1}"#,
        )
        .expect("done");
        assert!(matches!(
            done,
            KernelMessage::Done {
                status: DoneStatus::Ok,
                ..
            }
        ));
        // With results the kernel dropped over the limits (only then are the fields sent).
        let done: KernelMessage = serde_json::from_str(
            r#"{"type": "done", "id": "ex_1", "status": "ok", "execution_count": 2, "dropped_results": 284, "dropped_bytes": 284038908}"#,
        )
        .expect("done with drops");
        assert!(matches!(
            done,
            KernelMessage::Done {
                dropped_results: 284,
                dropped_bytes: 284038908,
                ..
            }
        ));
        let exec = serde_json::to_string(&HostMessage::Execute {
            id: "ex_2".into(),
            code: "1+1".into(),
            ack: false,
            tools: Vec::new(),
        })
        .expect("json");
        assert_eq!(exec, r#"{"type":"execute","id":"ex_2","code":"1+1"}"#);
        let exec = serde_json::to_string(&HostMessage::Execute {
            id: "ex_3".into(),
            code: "1".into(),
            ack: true,
            tools: Vec::new(),
        })
        .expect("json");
        assert_eq!(
            exec,
            r#"{"type":"execute","id":"ex_3","code":"1","ack":true}"#
        );
        let started: KernelMessage =
            serde_json::from_str(r#"{"type": "started", "id": "ex_3"}"#).expect("started");
        assert_eq!(started, KernelMessage::Started { id: "ex_3".into() });
    }

    #[test]
    fn tool_messages_match_the_kernels() {
        // As runcell_tools.py writes a call.
        let call: KernelMessage = serde_json::from_str(
            r#"{"type": "tool_call", "id": "ex_1", "call": 3, "name": "lookup", "input": {"id": 3}}"#,
        )
        .expect("tool_call");
        assert_eq!(
            call,
            KernelMessage::ToolCall {
                id: "ex_1".into(),
                call: 3,
                name: "lookup".into(),
                input: serde_json::json!({"id": 3}),
            }
        );
        let ok = serde_json::to_string(&HostMessage::ToolResult {
            call: 3,
            output: Some(serde_json::json!([1, "a"])),
            error: None,
        })
        .expect("json");
        assert_eq!(ok, r#"{"type":"tool_result","call":3,"output":[1,"a"]}"#);
        let failed = serde_json::to_string(&HostMessage::ToolResult {
            call: 4,
            output: None,
            error: Some(ToolFailure {
                kind: ToolFailureKind::TooLarge,
                message: "m".into(),
            }),
        })
        .expect("json");
        assert_eq!(
            failed,
            r#"{"type":"tool_result","call":4,"error":{"kind":"too_large","message":"m"}}"#
        );
        let exec = serde_json::to_string(&HostMessage::Execute {
            id: "ex_2".into(),
            code: "f()".into(),
            ack: false,
            tools: vec![serde_json::json!({"name": "f"})],
        })
        .expect("json");
        assert_eq!(
            exec,
            r#"{"type":"execute","id":"ex_2","code":"f()","tools":[{"name":"f"}]}"#
        );
    }

    #[test]
    fn snapshot_messages_match_the_kernels() {
        let snap = serde_json::to_string(&HostMessage::Snapshot {
            id: "snapshot-1".into(),
            path: "/workspace/s".into(),
        })
        .expect("json");
        assert_eq!(
            snap,
            r#"{"type":"snapshot","id":"snapshot-1","path":"/workspace/s"}"#
        );
        let restore = serde_json::to_string(&HostMessage::Restore {
            id: "restore-2".into(),
            path: "/tmp/s".into(),
        })
        .expect("json");
        assert_eq!(
            restore,
            r#"{"type":"restore","id":"restore-2","path":"/tmp/s"}"#
        );
        // As the Python kernel sends them (json.dumps of dict(report, type=..., id=...)).
        let saved: KernelMessage = serde_json::from_str(
            r#"{"bytes": 1234, "names": ["df", "np"], "skipped": [{"name": "f", "reason": "open file 'x.txt'"}], "omitted": 0, "duration_us": 5120, "type": "snapshotted", "id": "snapshot-1"}"#,
        )
        .expect("snapshotted");
        assert_eq!(
            saved,
            KernelMessage::Snapshotted {
                id: "snapshot-1".into(),
                bytes: 1234,
                names: vec!["df".into(), "np".into()],
                skipped: vec![SkippedName {
                    name: "f".into(),
                    reason: "open file 'x.txt'".into()
                }],
                omitted: 0,
                duration_us: 5120,
            }
        );
        let restored: KernelMessage = serde_json::from_str(
            r#"{"names": [], "skipped": [], "omitted": 3, "duration_us": 1, "type": "restored", "id": "restore-2"}"#,
        )
        .expect("restored");
        assert!(matches!(
            restored,
            KernelMessage::Restored { omitted: 3, .. }
        ));
        let refused: KernelMessage = serde_json::from_str(
            r#"{"type": "snapshot_refused", "id": "restore-2", "refusal": {"reason": "incompatible", "field": "serializer_version", "found": "3.0.0", "expected": "3.1.3"}}"#,
        )
        .expect("refused");
        let KernelMessage::SnapshotRefused { refusal, .. } = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(
            refusal.to_string(),
            r#"the snapshot is incompatible: its serializer version is "3.0.0", this kernel needs "3.1.3""#
        );
        for (reason, expected) in [
            ("missing", "no snapshot at the path: m"),
            ("truncated", "the snapshot is truncated: m"),
            ("corrupt", "the snapshot is corrupt: m"),
        ] {
            let r: SnapshotRefusal =
                serde_json::from_str(&format!(r#"{{"reason": "{reason}", "message": "m"}}"#))
                    .expect("refusal");
            assert_eq!(r.to_string(), expected);
        }
        // A reason this host does not know is a malformed message, not a guess.
        assert!(serde_json::from_str::<SnapshotRefusal>(r#"{"reason": "odd"}"#).is_err());
    }

    #[test]
    fn decoder_handles_partial_frames_and_rejects_huge_ones() {
        let frame = encode(&HostMessage::Execute {
            id: "a".into(),
            code: "b".into(),
            ack: false,
            tools: Vec::new(),
        })
        .expect("encode");
        let mut d = FrameDecoder::new();
        for byte in &frame[..frame.len() - 1] {
            d.push(std::slice::from_ref(byte));
            assert!(d.next_message::<HostMessage>().expect("partial").is_none());
        }
        d.push(&frame[frame.len() - 1..]);
        assert!(d.next_message::<HostMessage>().expect("whole").is_some());
        let mut d = FrameDecoder::new();
        d.push(&u32::MAX.to_be_bytes());
        assert!(matches!(
            d.next_message::<HostMessage>(),
            Err(ProtocolError::TooLarge(_))
        ));
        let mut d = FrameDecoder::new();
        d.push(&[0, 0, 0, 2, b'{', b'x']);
        assert!(matches!(
            d.next_message::<HostMessage>(),
            Err(ProtocolError::Json(_))
        ));
    }

    #[test]
    fn decoder_skips_frames_over_its_keep_limit_without_buffering_them() {
        let small = encode(&HostMessage::Execute {
            id: "a".into(),
            code: "b".into(),
            ack: false,
            tools: Vec::new(),
        })
        .expect("encode");
        let big = 10usize << 20;
        let mut d = FrameDecoder::with_keep_limit(1 << 10);
        let mut head = (big as u32).to_be_bytes().to_vec();
        head.extend_from_slice(&[b'x'; 100]);
        d.push(&head);
        assert!(d.next_frame::<HostMessage>().expect("head").is_none());
        let chunk = vec![b'x'; 64 << 10];
        let mut sent = 100;
        while sent + chunk.len() < big {
            d.push(&chunk);
            sent += chunk.len();
            assert!(d.next_frame::<HostMessage>().expect("body").is_none());
            assert_eq!(d.buffered(), 0, "a skipped frame is never buffered");
        }
        // Its last bytes and the next frame in one read.
        let mut tail = vec![b'x'; big - sent];
        tail.extend_from_slice(&small);
        d.push(&tail);
        assert_eq!(
            d.next_frame::<HostMessage>().expect("skipped"),
            Some(Frame::Skipped { len: big })
        );
        assert!(matches!(
            d.next_frame::<HostMessage>().expect("next"),
            Some(Frame::Message { len, .. }) if len == small.len() - 4
        ));
        assert!(d.next_frame::<HostMessage>().expect("empty").is_none());
        // A frame over the keep limit that is already whole in the buffer.
        let mut d = FrameDecoder::with_keep_limit(2);
        d.push(&small);
        assert!(matches!(
            d.next_frame::<HostMessage>(),
            Ok(Some(Frame::Skipped { .. }))
        ));
        // Over MAX_FRAME is an error from the length prefix alone.
        let mut d = FrameDecoder::with_keep_limit(1 << 10);
        d.push(&((MAX_FRAME + 1) as u32).to_be_bytes());
        assert!(matches!(
            d.next_frame::<HostMessage>(),
            Err(ProtocolError::TooLarge(n)) if n == MAX_FRAME + 1
        ));
    }
}
