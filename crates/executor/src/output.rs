//! Bounded capture of a command's output: the first half and the last half of the budget.
//!
//! Output is streamed in, so a command printing gigabytes costs the executor no more memory than
//! the budget: the head fills once, then the tail is a ring that keeps the newest bytes.

use std::collections::VecDeque;

/// Keeps at most `cap` bytes of a stream: `cap / 2` from the start, the rest from the end.
#[derive(Debug)]
pub(crate) struct HeadTail {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    total: u64,
}

impl HeadTail {
    pub(crate) fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Self {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap: cap - head_cap,
            total: 0,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.total = self.total.saturating_add(data.len() as u64);
        let take = data.len().min(self.head_cap - self.head.len());
        self.head.extend_from_slice(&data[..take]);
        let rest = &data[take..];
        if rest.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.tail_cap..]);
        } else {
            let excess = (self.tail.len() + rest.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..excess);
            self.tail.extend(rest);
        }
    }

    /// The kept text (lossily decoded) and how many bytes were dropped from the middle.
    ///
    /// When bytes were dropped, the head and tail are cut back to whole UTF-8 characters (the
    /// cut-off fragments count as omitted) and joined by a marker line.
    pub(crate) fn finish(self) -> (String, u64) {
        let mut tail = Vec::from(self.tail);
        let kept = (self.head.len() + tail.len()) as u64;
        if self.total == kept {
            let mut all = self.head;
            all.append(&mut tail);
            return (String::from_utf8_lossy(&all).into_owned(), 0);
        }
        let head_end = char_boundary_before_end(&self.head);
        let tail_start = char_boundary_after_start(&tail);
        let omitted = self.total - kept + (self.head.len() - head_end + tail_start) as u64;
        let mut text = String::from_utf8_lossy(&self.head[..head_end]).into_owned();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[... {omitted} bytes omitted ...]\n"));
        text.push_str(&String::from_utf8_lossy(&tail[tail_start..]));
        (text, omitted)
    }
}

/// The length of `bytes` without a trailing incomplete UTF-8 sequence.
pub(crate) fn char_boundary_before_end(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let b = bytes[len - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for its lead
        }
        let needed = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needed > back { len - back } else { len };
    }
    len
}

/// The offset of the first byte of `bytes` that is not a stray UTF-8 continuation byte.
fn char_boundary_after_start(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take(3)
        .take_while(|&&b| b & 0xC0 == 0x80)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cap: usize, chunks: &[&[u8]], expected_text: &str, expected_omitted: u64) {
        let mut capture = HeadTail::new(cap);
        for chunk in chunks {
            capture.push(chunk);
        }
        assert_eq!(
            capture.finish(),
            (expected_text.to_owned(), expected_omitted),
            "cap {cap} {chunks:?}"
        );
    }

    #[test]
    fn keeps_head_and_tail() {
        check(10, &[b"hello"], "hello", 0);
        check(10, &[b"0123456789"], "0123456789", 0);
        check(
            10,
            &[b"0123456789a"],
            "01234\n[... 1 bytes omitted ...]\n6789a",
            1,
        );
        check(
            4,
            &[b"ab", b"cd", b"ef", b"gh"],
            "ab\n[... 4 bytes omitted ...]\ngh",
            4,
        );
        check(
            4,
            &[b"a", b"b", b"c", b"d", b"e", b"f"],
            "ab\n[... 2 bytes omitted ...]\nef",
            2,
        );
        check(
            6,
            &[b"line1\n", b"xxxxxxxxxx", b"end\n"],
            "lin\n[... 14 bytes omitted ...]\nnd\n",
            14,
        );
        check(0, &[b"abc"], "[... 3 bytes omitted ...]\n", 3);
        check(0, &[], "", 0);
        check(5, &[b"ab", b"", b"c"], "abc", 0);
    }

    #[test]
    fn cuts_at_character_boundaries() {
        // "é" is two bytes: the head would end inside it and the tail start inside it.
        check(
            4,
            &["aéé".as_bytes(), b"xx", "éb".as_bytes()],
            "a\n[... 8 bytes omitted ...]\nb",
            8,
        );
        check(
            6,
            &["€€€".as_bytes(), b"-", "€€€".as_bytes()],
            "€\n[... 13 bytes omitted ...]\n€",
            13,
        );
        // Invalid bytes are decoded lossily, never dropped.
        check(10, &[b"\xff\xfeok"], "\u{fffd}\u{fffd}ok", 0);
    }

    #[test]
    fn char_boundaries() {
        for (bytes, expected) in [
            (&b""[..], 0),
            (b"abc", 3),
            ("é".as_bytes(), 2),
            (&"é".as_bytes()[..1], 0),
            (&"€".as_bytes()[..2], 0),
            (&"😀".as_bytes()[..3], 0),
            ("a😀".as_bytes(), 5),
            (b"a\x80", 2),
        ] {
            assert_eq!(char_boundary_before_end(bytes), expected, "{bytes:?}");
        }
    }

    #[test]
    fn fifty_megabytes_in_small_chunks_stay_bounded() {
        let mut capture = HeadTail::new(1000);
        let chunk = [b'x'; 65536];
        for _ in 0..800 {
            capture.push(&chunk);
        }
        assert!(capture.head.len() + capture.tail.len() <= 1000);
        let (text, omitted) = capture.finish();
        assert_eq!(omitted, 800 * 65536 - 1000);
        assert!(text.len() < 1100);
    }
}
