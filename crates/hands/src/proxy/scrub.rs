//! Scrubbing the proxy's secrets out of responses: header values, and bodies as they stream.
//!
//! A body arrives in chunks, and a secret may straddle two of them. [`StreamScrubber`] keeps
//! back the last `longest pattern - 1` bytes of what it has seen: a match that starts
//! earlier fits entirely in what is already there, so the leftmost-longest choice there is
//! final, and whatever starts later waits for the next chunk. Patterns are the forms of
//! [`nerve_core::redact::encoded_forms`], the list the log's redactor uses too: the raw
//! value, JSON-escaped once and twice in every encoder's flavour, and percent-encoded.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use bytes::{Bytes, BytesMut};
use nerve_core::redact::encoded_forms;
use secrecy::ExposeSecret;

use crate::proxy::rules::Credential;

/// The secrets of every rule, compiled once per proxy.
#[derive(Clone)]
pub(crate) struct Scrubber {
    automaton: Option<AhoCorasick>,
    replacements: Vec<Vec<u8>>,
    /// Bytes of the longest pattern.
    longest: usize,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the patterns: they are the secrets.
        f.debug_struct("Scrubber")
            .field("patterns", &self.replacements.len())
            .finish()
    }
}

impl Scrubber {
    pub(crate) fn new<'a>(credentials: impl IntoIterator<Item = &'a Credential>) -> Self {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut replacements = Vec::new();
        for credential in credentials {
            for form in encoded_forms(credential.secret.expose_secret()) {
                let form = form.into_bytes();
                if !form.is_empty() && !patterns.contains(&form) {
                    patterns.push(form);
                    replacements.push(format!("[REDACTED:{}]", credential.name).into_bytes());
                }
            }
        }
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        let automaton = if patterns.is_empty() {
            None
        } else {
            AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&patterns)
                .ok()
        };
        Self {
            automaton,
            replacements,
            longest,
        }
    }

    /// Whether there is anything to scrub at all.
    pub(crate) fn is_active(&self) -> bool {
        self.automaton.is_some()
    }

    /// `data` with every secret replaced; `None` when it held none.
    pub(crate) fn scrub(&self, data: &[u8]) -> Option<Vec<u8>> {
        let automaton = self.automaton.as_ref()?;
        if !automaton.is_match(data) {
            return None;
        }
        let mut out = Vec::with_capacity(data.len());
        automaton.replace_all_with_bytes(data, &mut out, |found, _, out| {
            out.extend_from_slice(&self.replacements[found.pattern().as_usize()]);
            true
        });
        Some(out)
    }

    /// `text` with every secret replaced (a text of the proxy's own that may quote
    /// something an upstream said).
    pub(crate) fn scrub_text(&self, text: &str) -> String {
        match self.scrub(text.as_bytes()) {
            Some(scrubbed) => String::from_utf8_lossy(&scrubbed).into_owned(),
            None => text.to_owned(),
        }
    }

    /// A scrubber for one body.
    pub(crate) fn stream(&self) -> StreamScrubber {
        StreamScrubber {
            scrubber: self.clone(),
            held: BytesMut::new(),
        }
    }
}

/// Scrubs one body, chunk by chunk.
#[derive(Debug)]
pub(crate) struct StreamScrubber {
    scrubber: Scrubber,
    /// Seen but not yet passed on: the tail a secret could still start in.
    held: BytesMut,
}

impl StreamScrubber {
    /// Takes the next chunk and returns what can safely be passed on (possibly empty).
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Bytes {
        let Some(automaton) = self.scrubber.automaton.as_ref() else {
            return Bytes::copy_from_slice(chunk);
        };
        self.held.extend_from_slice(chunk);
        let keep = self.scrubber.longest.saturating_sub(1);
        // Matches starting before `cut` are final; the rest waits.
        let cut = self.held.len().saturating_sub(keep);
        // The common case, no secret starting before the cut: pass the bytes on as they are.
        if automaton
            .find(&self.held[..])
            .is_none_or(|found| found.start() >= cut)
        {
            return self.held.split_to(cut).freeze();
        }
        let mut out = Vec::with_capacity(self.held.len());
        let mut copied = 0;
        for found in automaton.find_iter(&self.held[..]) {
            if found.start() >= cut {
                break;
            }
            out.extend_from_slice(&self.held[copied..found.start()]);
            out.extend_from_slice(&self.scrubber.replacements[found.pattern().as_usize()]);
            copied = found.end();
        }
        let emit_to = cut.max(copied);
        out.extend_from_slice(&self.held[copied..emit_to]);
        let _ = self.held.split_to(emit_to);
        Bytes::from(out)
    }

    /// The end of the body: whatever was held, scrubbed.
    pub(crate) fn finish(&mut self) -> Bytes {
        let held = self.held.split();
        match self.scrubber.scrub(&held) {
            Some(scrubbed) => Bytes::from(scrubbed),
            None => held.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use secrecy::SecretString;

    use super::*;

    fn scrubber(secrets: &[(&str, &str)]) -> Scrubber {
        let credentials: Vec<Credential> = secrets
            .iter()
            .map(|(name, secret)| Credential {
                name: (*name).to_owned(),
                header: "Authorization".to_owned(),
                template: "Bearer {secret}".to_owned(),
                secret: SecretString::from(*secret),
            })
            .collect();
        Scrubber::new(&credentials)
    }

    fn streamed(scrubber: &Scrubber, chunks: &[&[u8]]) -> Vec<u8> {
        let mut stream = scrubber.stream();
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&stream.push(chunk));
        }
        out.extend_from_slice(&stream.finish());
        out
    }

    #[test]
    fn secrets_are_replaced_in_every_form() {
        let s = scrubber(&[("gh", "tok/en\"42")]);
        let check = |input: &str, expected: &str| {
            let got = s
                .scrub(input.as_bytes())
                .unwrap_or_else(|| input.as_bytes().to_vec());
            assert_eq!(String::from_utf8(got).unwrap(), expected, "{input}");
        };
        check("a tok/en\"42 b", "a [REDACTED:gh] b");
        check(r#"{"h":"tok/en\"42"}"#, r#"{"h":"[REDACTED:gh]"}"#);
        check(r#"{"h":"tok\/en\"42"}"#, r#"{"h":"[REDACTED:gh]"}"#);
        check(
            r#""{\"h\":\"tok/en\\\"42\"}""#,
            r#""{\"h\":\"[REDACTED:gh]\"}""#,
        );
        check("?q=tok%2Fen%2242", "?q=[REDACTED:gh]");
        check("nothing", "nothing");
    }

    #[test]
    fn a_secret_split_across_chunks_is_caught() {
        let s = scrubber(&[("a", "abcdefgh"), ("b", "xyz123456")]);
        assert_eq!(
            streamed(&s, &[b"..abc", b"def", b"gh..xy", b"z1", b"23456", b"!"]),
            b"..[REDACTED:a]..[REDACTED:b]!"
        );
        assert_eq!(streamed(&s, &[b"abcdefg"]), b"abcdefg");
        assert_eq!(streamed(&s, &[]), b"");
        let none = scrubber(&[]);
        assert!(!none.is_active());
        assert_eq!(streamed(&none, &[b"abc", b"def"]), b"abcdef");
    }

    /// `text` with every non-ASCII character as `\uxxxx` (PHP, Python's `ensure_ascii`),
    /// applied to what serde_json wrote.
    fn ascii_only(json: &str) -> String {
        let mut out = String::new();
        for c in json.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        out
    }

    /// What one real encoder makes of `secret`, written independently of
    /// `encoded_forms`: serde_json for JSON (with PHP's, Python's and Go's additions made
    /// by hand on its output), the `percent-encoding` and `form_urlencoded` crates for URLs.
    fn encode(secret: &str, encoder: usize) -> String {
        use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
        const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'.')
            .remove(b'_')
            .remove(b'~');
        const COMPONENT: &AsciiSet = &UNRESERVED
            .remove(b'!')
            .remove(b'*')
            .remove(b'\'')
            .remove(b'(')
            .remove(b')');
        let json = |text: &str| {
            let quoted = serde_json::Value::String(text.to_owned()).to_string();
            quoted[1..quoted.len() - 1].to_owned()
        };
        let php = |text: &str| ascii_only(&json(text).replace('/', "\\/"));
        let go = |text: &str| {
            json(text)
                .replace('<', "\\u003c")
                .replace('>', "\\u003e")
                .replace('&', "\\u0026")
        };
        let lower_hex = |text: String| {
            let mut out = String::new();
            let mut hex_left = 0;
            for c in text.chars() {
                if c == '%' {
                    hex_left = 2;
                    out.push(c);
                } else if hex_left > 0 {
                    hex_left -= 1;
                    out.push(c.to_ascii_lowercase());
                } else {
                    out.push(c);
                }
            }
            out
        };
        let form = || form_urlencoded::byte_serialize(secret.as_bytes()).collect::<String>();
        match encoder {
            0 => secret.to_owned(),
            1 => json(secret),
            2 => json(&json(secret)),
            3 => php(secret),
            4 => php(&php(secret)),
            5 => ascii_only(&json(secret)),
            6 => go(secret),
            7 => json(&php(secret)),
            8 => php(&go(secret)),
            9 => utf8_percent_encode(secret, NON_ALPHANUMERIC).to_string(),
            10 => lower_hex(utf8_percent_encode(secret, NON_ALPHANUMERIC).to_string()),
            11 => utf8_percent_encode(secret, UNRESERVED).to_string(),
            12 => lower_hex(utf8_percent_encode(secret, COMPONENT).to_string()),
            13 => form(),
            _ => lower_hex(form()),
        }
    }

    proptest! {
        /// A secret in any form an encoder listed in `encoded_forms` produces is caught by
        /// both the proxy's scrubber and the log's redactor, which share that list.
        #[test]
        fn any_encoded_secret_is_caught_by_the_scrubber_and_the_redactor(
            secret in "[A-Za-z0-9 /\"\\\\<>&~!*'()+%._\u{e9}\u{20ac}\u{1F600}\t\n-]{6,20}",
            before in "[a-z ]{0,16}",
            after in "[a-z ]{0,16}",
            encoder in 0usize..15,
        ) {
            let encoded = encode(&secret, encoder);
            let text = format!("{before}{encoded}{after}");
            let s = scrubber(&[("key", &secret)]);
            let scrubbed = s.scrub(text.as_bytes()).unwrap_or_else(|| text.as_bytes().to_vec());
            let scrubbed = String::from_utf8(scrubbed).unwrap();
            prop_assert!(!scrubbed.contains(&encoded), "{} -> {}", text, scrubbed);
            prop_assert!(scrubbed.contains("[REDACTED:key]"), "{}", scrubbed);
            let value = SecretString::from(secret.clone());
            let redactor = nerve_core::Redactor::with_secrets([("key", &value)]).unwrap();
            let redacted = redactor.redact(&text);
            prop_assert!(!redacted.contains(&encoded), "{} -> {}", text, redacted);
            prop_assert!(redacted.contains("[REDACTED:key]"), "{}", redacted);
        }

        /// However the body is cut into chunks, streaming gives exactly what scrubbing the
        /// whole body at once gives, and no secret survives.
        #[test]
        fn streaming_equals_scrubbing_at_once(
            before in "[a-z\"/\\\\ ]{0,40}",
            after in "[a-z\"/\\\\ ]{0,40}",
            cuts in proptest::collection::vec(0usize..120, 0..8),
            which in 0usize..3,
        ) {
            let secrets = [("one", "s3cr/et\"val"), ("two", "aaaaaaab"), ("three", "ab\\cdefg")];
            let s = scrubber(&secrets);
            let secret = secrets[which].1;
            let escaped = serde_json::Value::String(secret.to_owned()).to_string();
            let body = format!("{before}{secret}{after}{escaped}{before}");
            let whole = s.scrub(body.as_bytes()).unwrap();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut start = 0;
            for cut in cuts {
                chunks.push(&body.as_bytes()[start..cut]);
                start = cut;
            }
            chunks.push(&body.as_bytes()[start..]);
            let out = streamed(&s, &chunks);
            prop_assert_eq!(&out, &whole);
            let text = String::from_utf8(out).unwrap();
            prop_assert!(!text.contains(secret), "{}", text);
        }
    }
}
