//! An incremental Server-Sent Events parser (the WHATWG `text/event-stream` rules): bytes go
//! in as the network delivers them, split anywhere (inside a line, a `\r\n` pair or a UTF-8
//! character), and complete events come out.
//!
//! Lines are decoded only once they are whole, so a character split across two reads is
//! never mangled; invalid UTF-8 becomes U+FFFD instead of an error, because one bad byte
//! from a server should not cost the whole answer.

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty when the server named none (the spec's `message`).
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// An event (or a single line) grew past [`SseParser::MAX_EVENT_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server-sent event larger than {limit} bytes")]
pub struct SseTooLarge {
    pub limit: usize,
}

/// Parser state carried from one read to the next.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// The event being read: its `event:` field, and its data lines so far, each followed
    /// by `\n` (the spec's data buffer). Both keep their capacity from one event to the
    /// next: a stream of many small events allocates nothing per event.
    current: SseEvent,
    /// The previous read ended with `\r`: a `\n` at the start of the next one ends nothing.
    skip_lf: bool,
    /// The first line has been seen (a byte-order mark is stripped only from it).
    started: bool,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    /// A bound on memory per event, against a server that never ends a line.
    pub const MAX_EVENT_BYTES: usize = 64 << 20;

    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes; complete events are appended to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseTooLarge> {
        self.feed_each(bytes, |event| out.push(std::mem::take(event)))
    }

    /// Feeds the next bytes; each complete event is lent to `on_event`, in order, and its
    /// buffers are reused for the next one (the streaming path: no allocation per event).
    /// Whatever `on_event` leaves in the event is cleared before the next one.
    pub fn feed_each(
        &mut self,
        mut bytes: &[u8],
        mut on_event: impl FnMut(&mut SseEvent),
    ) -> Result<(), SseTooLarge> {
        if bytes.is_empty() {
            // An empty read (a body can deliver one) must not end a `\r` wait: the `\n`
            // of the pair may come next (found by tests/fuzz.rs).
            return Ok(());
        }
        if self.skip_lf {
            self.skip_lf = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', bytes) {
            let line = &bytes[..end];
            if self.partial.is_empty() {
                self.line(line, &mut on_event);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.line(&whole, &mut on_event);
                whole.clear();
                self.partial = whole;
            }
            let terminator = bytes[end];
            bytes = &bytes[end + 1..];
            if terminator == b'\r' {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
        }
        self.partial.extend_from_slice(bytes);
        if self.partial.len() + self.current.data.len() > Self::MAX_EVENT_BYTES {
            return Err(SseTooLarge {
                limit: Self::MAX_EVENT_BYTES,
            });
        }
        Ok(())
    }

    /// The stream ended. The spec discards an event without its closing blank line; we
    /// dispatch it when all its lines are complete, because some servers end the body right
    /// after the last `data:` line. A line cut off mid-way is dropped: it is a fragment.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        self.finish_each(|event| out.push(std::mem::take(event)));
    }

    /// [`SseParser::finish`], lending the last event (if any) to `on_event`.
    pub fn finish_each(&mut self, mut on_event: impl FnMut(&mut SseEvent)) {
        self.partial.clear();
        self.dispatch(&mut on_event);
    }

    fn line(&mut self, mut line: &[u8], on_event: &mut impl FnMut(&mut SseEvent)) {
        if !self.started {
            self.started = true;
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if line[0] == b':' {
            return; // A comment: keep-alives such as `: OPENROUTER PROCESSING`.
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                push_lossy(&mut self.current.data, value);
                self.current.data.push('\n');
            }
            b"event" => {
                self.current.event.clear();
                push_lossy(&mut self.current.event, value);
            }
            // `id` and `retry` only matter for reconnecting, which a model call never does.
            _ => {}
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&mut SseEvent)) {
        if !self.current.data.is_empty() {
            self.current.data.pop();
            on_event(&mut self.current);
        }
        self.current.event.clear();
        self.current.data.clear();
    }
}

/// Appends `bytes` as text, invalid UTF-8 as U+FFFD. Valid text (nearly always) takes the
/// validator's fast path; `String::from_utf8_lossy` walks it in chunks even then.
fn push_lossy(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => out.push_str(text),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_whole(input: &[u8]) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        parser.feed(input, &mut out).unwrap();
        parser.finish(&mut out);
        out
    }

    /// Every way of cutting `input` in two, and byte by byte, gives the same events.
    fn check(input: &str, expected: &[(&str, &str)]) {
        let expected: Vec<SseEvent> = expected
            .iter()
            .map(|(e, d)| SseEvent {
                event: (*e).into(),
                data: (*d).into(),
            })
            .collect();
        let bytes = input.as_bytes();
        assert_eq!(parse_whole(bytes), expected, "whole input");
        for cut in 0..=bytes.len() {
            let mut parser = SseParser::new();
            let mut out = Vec::new();
            parser.feed(&bytes[..cut], &mut out).unwrap();
            parser.feed(&bytes[cut..], &mut out).unwrap();
            parser.finish(&mut out);
            assert_eq!(out, expected, "cut at byte {cut}");
        }
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for byte in bytes {
            parser.feed(std::slice::from_ref(byte), &mut out).unwrap();
        }
        parser.finish(&mut out);
        assert_eq!(out, expected, "byte by byte");
    }

    #[test]
    fn events_survive_any_split() {
        check(
            "data: {\"a\":1}\n\ndata: [DONE]\n\n",
            &[("", "{\"a\":1}"), ("", "[DONE]")],
        );
        check(
            "event: message_start\r\ndata: {\"t\":\"héllo ✓\"}\r\n\r\nevent: ping\rdata: x\r\r",
            &[("message_start", "{\"t\":\"héllo ✓\"}"), ("ping", "x")],
        );
        check("data: a\ndata: b\ndata\n\n", &[("", "a\nb\n")]);
        check(
            ": keep-alive\n\nevent: only-a-name\n\ndata:no-space\n\n",
            &[("", "no-space")],
        );
        check(
            "\u{feff}data: bom\n\nid: 7\nretry: 10\nfoo: bar\ndata: x\n\n",
            &[("", "bom"), ("", "x")],
        );
    }

    #[test]
    fn the_end_of_the_body_flushes_complete_lines_and_drops_fragments() {
        assert_eq!(
            parse_whole(b"data: whole\n"),
            vec![SseEvent {
                event: String::new(),
                data: "whole".into()
            }]
        );
        assert_eq!(
            parse_whole(b"data: whole\n\ndata: {\"cut"),
            vec![SseEvent {
                event: String::new(),
                data: "whole".into()
            }]
        );
        assert!(parse_whole(b"event: x\n").is_empty());
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        assert_eq!(parse_whole(b"data: a\xffb\n\n")[0].data, "a\u{fffd}b");
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        let chunk = vec![b'a'; 1 << 20];
        let mut result = Ok(());
        for _ in 0..=64 {
            result = parser.feed(&chunk, &mut out);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(
            result,
            Err(SseTooLarge {
                limit: SseParser::MAX_EVENT_BYTES
            })
        );
    }
}
