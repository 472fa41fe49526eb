//! Bounded capture of a stream: the first and last bytes are kept, the middle is counted and
//! dropped, so the supervisor's memory stays flat however much a program prints.

use std::collections::VecDeque;

/// Keeps at most `cap` bytes: the first half as they come, the last half in a ring.
#[derive(Debug, Clone)]
pub struct CappedOutput {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl CappedOutput {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Appends `data` and returns the prefix of it that landed in the head, i.e. what may be
    /// streamed live; once the head is full nothing more is streamed until the end.
    pub fn push<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        self.total += data.len() as u64;
        let head_cap = self.cap - self.cap / 2;
        let room = head_cap.saturating_sub(self.head.len());
        let (to_head, rest) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(to_head);
        let tail_cap = self.cap / 2;
        if tail_cap > 0 && !rest.is_empty() {
            let rest = &rest[rest.len().saturating_sub(tail_cap)..];
            let overflow = (self.tail.len() + rest.len()).saturating_sub(tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(rest);
        }
        to_head
    }

    /// Bytes received in total.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether anything was dropped.
    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// Bytes dropped from the middle.
    pub fn dropped(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    /// The part after the head that is kept (what a live stream still has to show at the end).
    pub fn tail(&self) -> Vec<u8> {
        self.tail.iter().copied().collect()
    }

    /// The marker line placed where bytes were dropped.
    pub fn marker(&self) -> String {
        format!("\n[… {} bytes truncated …]\n", self.dropped())
    }

    /// Head, an explicit marker if anything was dropped, then the tail. Invalid UTF-8 (including
    /// a character cut at a boundary) is replaced, never an error.
    pub fn render(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.truncated() {
            out.push_str(&self.marker());
        }
        out.push_str(&String::from_utf8_lossy(&self.tail()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut c = CappedOutput::new(10);
        assert_eq!(c.push(b"abc"), b"abc");
        assert!(!c.truncated());
        assert_eq!(c.render(), "abc");
    }

    #[test]
    fn keeps_head_and_tail_with_a_marker() {
        let mut c = CappedOutput::new(10);
        let mut streamed = Vec::new();
        for chunk in [&b"0123"[..], b"456789", b"abcdefghij", b"XYZ"] {
            streamed.extend_from_slice(c.push(chunk));
        }
        assert_eq!(streamed, b"01234");
        assert_eq!(c.total(), 23);
        assert!(c.truncated());
        assert_eq!(c.dropped(), 13);
        assert_eq!(c.render(), "01234\n[… 13 bytes truncated …]\nijXYZ");
    }

    #[test]
    fn memory_stays_bounded_under_a_flood() {
        let mut c = CappedOutput::new(1 << 10);
        let chunk = vec![b'x'; 1 << 16];
        for _ in 0..1000 {
            c.push(&chunk);
        }
        assert_eq!(c.total(), 1000 << 16);
        assert!(c.head.capacity() < 4 << 10 && c.tail.capacity() < 4 << 10);
        assert_eq!(c.render().len(), (1 << 10) + c.marker().len());
    }
}
