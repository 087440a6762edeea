//! What a background process wrote to one stream, kept within bounds: its first `head_cap`
//! bytes forever (a client that attaches late reads the start) plus a sliding window of the
//! most recent `tail_cap` bytes (live readers keep up); `total` counts every byte written.

use std::collections::VecDeque;

/// The sliding tail window of every stream, in bytes.
pub const TAIL: usize = 1 << 20;

/// One read's answer: `data` starts at stream offset `offset`; `truncated` when that is past
/// the offset asked for (the bytes in between were dropped).
#[derive(Debug, PartialEq)]
pub struct Slice {
    pub data: Vec<u8>,
    pub offset: u64,
    pub truncated: bool,
}

pub struct Stream {
    head: Vec<u8>,
    head_cap: usize,
    /// Bytes past the head, the most recent `tail_cap` of them, ending at `total`.
    tail: VecDeque<u8>,
    tail_cap: usize,
    total: u64,
}

impl Stream {
    pub fn new(head_cap: usize, tail_cap: usize) -> Self {
        Stream { head: Vec::new(), head_cap, tail: VecDeque::new(), tail_cap, total: 0 }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let take = self.head_cap.saturating_sub(self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..take]);
        let rest = &data[take..];
        if rest.is_empty() {
            return;
        }
        if rest.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.tail_cap..]);
            return;
        }
        let over = (self.tail.len() + rest.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..over);
        self.tail.extend(rest);
    }

    /// Gives back spare capacity (once the stream has ended: 64 ended processes are kept).
    pub fn compact(&mut self) {
        self.head.shrink_to_fit();
        self.tail.shrink_to_fit();
    }

    /// The first offset the tail still holds (== total when it is empty).
    fn tail_start(&self) -> u64 {
        self.total - self.tail.len() as u64
    }

    /// Up to `max` bytes from `offset` on: from the first kept byte at or after it. An offset
    /// past the end reads nothing at the end.
    pub fn read(&self, offset: u64, max: usize) -> Slice {
        let h = self.head.len() as u64;
        let ts = self.tail_start();
        let start = if offset >= self.total {
            self.total
        } else if offset < h || offset >= ts {
            offset
        } else {
            ts
        };
        let end = self.total.min(start.saturating_add(max as u64));
        let mut data = Vec::with_capacity((end - start) as usize);
        let mut pos = start;
        if pos < h {
            let upto = h.min(end);
            data.extend_from_slice(&self.head[pos as usize..upto as usize]);
            pos = upto;
        }
        // Past the head, the tail continues it only where nothing between was dropped.
        if pos < end && pos >= ts {
            let (a, b) = ((pos - ts) as usize, (end - ts) as usize);
            let (s1, s2) = self.tail.as_slices();
            if a < s1.len() {
                data.extend_from_slice(&s1[a..b.min(s1.len())]);
            }
            if b > s1.len() {
                data.extend_from_slice(&s2[a.saturating_sub(s1.len())..b - s1.len()]);
            }
        }
        Slice { data, offset: start, truncated: start > offset.min(self.total) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(from: u64, n: usize) -> Vec<u8> {
        (from..from + n as u64).map(|i| (i % 251) as u8).collect()
    }

    fn filled(head: usize, tail: usize, total: usize, chunk: usize) -> Stream {
        let mut s = Stream::new(head, tail);
        let mut off = 0;
        while off < total {
            let n = chunk.min(total - off);
            s.push(&bytes(off as u64, n));
            off += n;
        }
        s
    }

    #[test]
    fn everything_kept_under_the_caps() {
        let s = filled(10, 10, 15, 4);
        assert_eq!(s.total(), 15);
        assert_eq!(s.read(0, 100), Slice { data: bytes(0, 15), offset: 0, truncated: false });
        assert_eq!(s.read(12, 100), Slice { data: bytes(12, 3), offset: 12, truncated: false });
        assert_eq!(s.read(3, 4).data, bytes(3, 4));
    }

    #[test]
    fn the_middle_is_dropped_and_reads_say_so() {
        for chunk in [1, 3, 7, 100] {
            let s = filled(10, 8, 50, chunk);
            assert_eq!(s.total(), 50);
            // The head reads up to its end, then the gap.
            assert_eq!(s.read(0, 100), Slice { data: bytes(0, 10), offset: 0, truncated: false });
            assert_eq!(s.read(10, 100), Slice { data: bytes(42, 8), offset: 42, truncated: true });
            assert_eq!(s.read(25, 3), Slice { data: bytes(42, 3), offset: 42, truncated: true });
            assert_eq!(s.read(45, 100), Slice { data: bytes(45, 5), offset: 45, truncated: false });
        }
    }

    #[test]
    fn reads_at_or_past_the_end_are_empty() {
        let s = filled(4, 4, 20, 5);
        assert_eq!(s.read(20, 10), Slice { data: vec![], offset: 20, truncated: false });
        assert_eq!(s.read(99, 10), Slice { data: vec![], offset: 20, truncated: false });
    }

    #[test]
    fn a_zero_head_keeps_only_the_tail() {
        let s = filled(0, 5, 12, 12);
        assert_eq!(s.read(0, 100), Slice { data: bytes(7, 5), offset: 7, truncated: true });
    }

    #[test]
    fn tail_wraps_inside_its_ring() {
        let mut s = Stream::new(2, 6);
        for i in 0..40u64 {
            s.push(&bytes(i * 3, 3));
            let from = s.total().saturating_sub(6);
            let got = s.read(from, 6);
            assert_eq!(got.data, bytes(from, (s.total() - from) as usize), "after {} pushes", i);
        }
        assert_eq!(s.read(2, 3), Slice { data: bytes(114, 3), offset: 114, truncated: true });
    }

    #[test]
    fn default_caps_keep_head_and_tail_of_a_big_stream() {
        let mut s = Stream::new(1 << 20, TAIL);
        let block = vec![7u8; 64 << 10];
        for _ in 0..64 {
            s.push(&block); // 4 MiB
        }
        assert_eq!(s.total(), 4 << 20);
        assert_eq!(s.read(0, 2 << 20).data.len(), 1 << 20);
        let r = s.read(1 << 20, 4 << 20);
        assert_eq!((r.offset, r.truncated, r.data.len()), (3 << 20, true, 1 << 20));
    }
}
