//! runcell-protocol: the messages between the host and an in-sandbox kernel, and their framing.
//!
//! The kernel talks over a private Unix stream socket at its fd 3; stdout and stderr stay raw
//! pipes, so output from subprocesses and C code is captured exactly like Python's own. A frame
//! is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (one object).
//! `crates/kernel/python/runcell_kernel.py` is the other implementation of this file.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Largest frame either side accepts: a few PNGs of a big figure fit; a runaway does not.
pub const MAX_FRAME: usize = 64 << 20;

/// A Jupyter MIME bundle: MIME type -> text (base64 for binary types).
pub type MimeBundle = BTreeMap<String, String>;

/// Host -> kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    /// Run one cell. The host sends the next only after `Done`.
    Execute { id: String, code: String },
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
    /// The cell is finished; everything it printed is already in the stdout/stderr pipes.
    Done {
        id: String,
        status: DoneStatus,
        execution_count: u64,
    },
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

/// Incremental decoder for a non-blocking reader: feed bytes as they arrive, take whole
/// messages out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete message, if one has arrived.
    pub fn next_message<T: for<'de> Deserialize<'de>>(
        &mut self,
    ) -> Result<Option<T>, ProtocolError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::TooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let msg = serde_json::from_slice(&self.buf[4..4 + len]);
        self.buf.drain(..4 + len);
        Ok(Some(msg?))
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
        let exec = serde_json::to_string(&HostMessage::Execute {
            id: "ex_2".into(),
            code: "1+1".into(),
        })
        .expect("json");
        assert_eq!(exec, r#"{"type":"execute","id":"ex_2","code":"1+1"}"#);
    }

    #[test]
    fn decoder_handles_partial_frames_and_rejects_huge_ones() {
        let frame = encode(&HostMessage::Execute {
            id: "a".into(),
            code: "b".into(),
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
}
