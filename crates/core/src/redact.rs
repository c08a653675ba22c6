//! Secret redaction: replaces registered secret values and well-known token formats with
//! `[REDACTED:<kind>]` in any text. Runs on every event payload and tool output, so it is
//! one pass of an Aho-Corasick automaton and one pass of a single combined regex.

use std::borrow::Cow;
use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex::Regex;
use secrecy::{ExposeSecret, SecretString};

/// Registered secrets shorter than this are refused: redacting them would shred ordinary text.
pub const MIN_SECRET_LEN: usize = 6;

/// Well-known token formats, in priority order (an Anthropic key also looks like an OpenAI
/// key, so it comes first). Group names are the `<kind>` in `[REDACTED:<kind>]`.
const FORMATS: &[(&str, &str)] = &[
    (
        "private_key",
        r"-----BEGIN[A-Z ]{0,24}PRIVATE KEY-----(?s:.*?-----END[A-Z ]{0,24}PRIVATE KEY-----|.*)",
    ),
    ("anthropic_key", r"(?-u:\b)sk-ant-[A-Za-z0-9_\-]{20,}"),
    (
        "openai_key",
        r"(?-u:\b)sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
    ),
    (
        "github_token",
        r"(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
    ),
    (
        "aws_access_key_id",
        r"(?-u:\b)(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?-u:\b)",
    ),
    (
        "slack_token",
        r"(?-u:\b)(?:xox[abposr]|xapp)-[A-Za-z0-9\-]{10,}",
    ),
    (
        "jwt",
        r"(?-u:\b)eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
    ),
];

/// The literal every format starts with. Candidates are found with one Aho-Corasick pass
/// (memchr-class speed on clean text); only at a candidate does a format's regex run,
/// anchored there, so the cost is linear in the text plus the length of the matches.
/// (A single combined regex was measured at ~375 MB/s on text with a token every 14 KB:
/// its engine scanned backwards from each inner literal.)
const PREFIXES: &[(&str, &[usize])] = &[
    ("-----BEGIN", &[0]),
    ("sk-", &[1, 2]),
    ("ghp_", &[3]),
    ("gho_", &[3]),
    ("ghu_", &[3]),
    ("ghs_", &[3]),
    ("ghr_", &[3]),
    ("github_pat_", &[3]),
    ("AKIA", &[4]),
    ("ASIA", &[4]),
    ("ABIA", &[4]),
    ("ACCA", &[4]),
    ("xox", &[5]),
    ("xapp-", &[5]),
    ("eyJ", &[6]),
];

static CANDIDATES: LazyLock<AhoCorasick> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant literals; every redactor test builds them.
    AhoCorasickBuilder::new()
        .match_kind(MatchKind::LeftmostFirst)
        .build(PREFIXES.iter().map(|(prefix, _)| prefix))
        .expect("valid prefixes")
});

/// Each format anchored at the start of the slice it is run on. Formats but `private_key`
/// begin at a word boundary, which is checked on the byte before the candidate.
static ANCHORED: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
    FORMATS
        .iter()
        .map(|(kind, pattern)| {
            let pattern = pattern.trim_start_matches("(?-u:\\b)");
            #[allow(clippy::expect_used)] // Constant patterns; every redactor test compiles them.
            let regex = Regex::new(&format!("^(?:{pattern})")).expect("valid token-format pattern");
            (*kind, regex)
        })
        .collect()
});

/// A registered secret was too short to redact safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "secret `{label}` is shorter than {MIN_SECRET_LEN} characters and cannot be redacted safely"
)]
pub struct SecretTooShort {
    pub label: String,
}

/// Replaces secrets in text. Cheap to clone behind an `Arc`; immutable once built.
#[derive(Clone)]
pub struct Redactor {
    secrets: Option<AhoCorasick>,
    /// `labels[i]` is the replacement for pattern `i` of `secrets`.
    replacements: Vec<String>,
    /// The length in bytes of the longest pattern of `secrets`.
    longest: usize,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the patterns: they are the secrets.
        f.debug_struct("Redactor")
            .field("registered", &self.replacements.len())
            .finish()
    }
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new()
    }
}

impl Redactor {
    /// A redactor for the well-known token formats only.
    pub fn new() -> Self {
        Self {
            secrets: None,
            replacements: Vec::new(),
            longest: 0,
        }
    }

    /// A redactor that also replaces each registered secret value, labelled with its name,
    /// in its raw form and in the forms it takes inside JSON strings.
    pub fn with_secrets<'a, I>(secrets: I) -> Result<Self, SecretTooShort>
    where
        I: IntoIterator<Item = (&'a str, &'a SecretString)>,
    {
        let mut patterns: Vec<String> = Vec::new();
        let mut replacements = Vec::new();
        for (label, secret) in secrets {
            let value = secret.expose_secret();
            if value.chars().count() < MIN_SECRET_LEN {
                return Err(SecretTooShort {
                    label: label.to_owned(),
                });
            }
            for form in encoded_forms(value) {
                if !patterns.contains(&form) {
                    patterns.push(form);
                    replacements.push(format!("[REDACTED:{label}]"));
                }
            }
        }
        if patterns.is_empty() {
            return Ok(Self::new());
        }
        let automaton = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .map_err(|_| SecretTooShort {
                label: "<automaton>".to_owned(),
            })?;
        let longest = patterns.iter().map(String::len).max().unwrap_or(0);
        Ok(Self {
            secrets: Some(automaton),
            replacements,
            longest,
        })
    }

    /// `text` with every secret replaced; borrowed when there was nothing to replace.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let registered: Cow<'a, str> = match &self.secrets {
            Some(automaton) if automaton.is_match(text) => {
                Cow::Owned(automaton.replace_all(text, &self.replacements))
            }
            Some(_) | None => Cow::Borrowed(text),
        };
        match registered {
            Cow::Borrowed(text) => replace_formats(text),
            Cow::Owned(text) => match replace_formats(&text) {
                Cow::Borrowed(_) => Cow::Owned(text),
                Cow::Owned(redacted) => Cow::Owned(redacted),
            },
        }
    }

    /// Whether `text` holds anything this redactor would replace.
    pub fn contains_secret(&self, text: &str) -> bool {
        self.secrets.as_ref().is_some_and(|a| a.is_match(text)) || next_format(text, 0).is_some()
    }
}

/// How much of a streamed text's tail may be held back because it could be the start of a
/// well-known token that the next piece completes (tokens are one run of non-space bytes).
const STREAM_TOKEN_HOLD: usize = 4096;

/// Text that arrives in pieces (an answer as the model streams it), redacted so that a
/// secret split across pieces is still replaced whole: [`StreamRedaction::push`] returns
/// what is safe to show now and holds back the tail that could be the start of a secret,
/// until the next piece or [`StreamRedaction::finish`].
#[derive(Debug, Default, Clone)]
pub struct StreamRedaction {
    pending: String,
}

impl StreamRedaction {
    /// Adds `piece`; returns the redacted text that no later piece can change.
    pub fn push(&mut self, redactor: &Redactor, piece: &str) -> String {
        self.pending.push_str(piece);
        let cut = redactor.safe_prefix(&self.pending);
        let rest = self.pending.split_off(cut);
        let ready = std::mem::replace(&mut self.pending, rest);
        redactor.redact(&ready).into_owned()
    }

    /// The redacted rest: the text has ended.
    pub fn finish(&mut self, redactor: &Redactor) -> String {
        let rest = std::mem::take(&mut self.pending);
        redactor.redact(&rest).into_owned()
    }

    /// Whether text is held back.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

impl Redactor {
    /// The length of the longest prefix of `text` that can be redacted on its own: no
    /// secret or token in it can be extended or completed by text that follows.
    fn safe_prefix(&self, text: &str) -> usize {
        // A registered secret that is not complete yet starts within its length minus one
        // of the end.
        let mut cut = text.len().saturating_sub(self.longest.saturating_sub(1));
        loop {
            let before = cut;
            // A well-known token grows while non-space bytes follow, and a token is only
            // recognised at the start of a word: cut between words (up to a bound, past
            // which a run of non-space bytes is redacted as it stands).
            let word = text.as_bytes()[..cut]
                .iter()
                .rev()
                .take(STREAM_TOKEN_HOLD)
                .take_while(|b| !b.is_ascii_whitespace())
                .count();
            cut -= word;
            // A match that reaches the cut is held back whole.
            if let Some(automaton) = &self.secrets
                && let Some(found) = automaton
                    .find_iter(text)
                    .find(|found| found.start() < cut && found.end() > cut)
            {
                cut = found.start();
            }
            let mut from = 0;
            while let Some((start, end, _)) = next_format(text, from) {
                if start >= cut {
                    break;
                }
                if end >= cut {
                    cut = start;
                    break;
                }
                from = end;
            }
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            if cut == before {
                return cut;
            }
        }
    }
}

/// Finds the next well-known token at or after `from`: its span and kind.
fn next_format(text: &str, mut from: usize) -> Option<(usize, usize, &'static str)> {
    while from < text.len() {
        let candidate = CANDIDATES.find(&text[from..])?;
        let start = from + candidate.start();
        let (_, formats) = PREFIXES[candidate.pattern().as_usize()];
        let previous = start.checked_sub(1).map(|i| text.as_bytes()[i]);
        let at_boundary = previous.is_none_or(|b| !b.is_ascii_alphanumeric() && b != b'_');
        for &format in formats {
            let (kind, regex) = &ANCHORED[format];
            // Every format but the PEM block starts at a word boundary.
            if (format == 0 || at_boundary)
                && let Some(found) = regex.find(&text[start..])
            {
                return Some((start, start + found.end(), kind));
            }
        }
        from = start + 1;
    }
    None
}

fn replace_formats(text: &str) -> Cow<'_, str> {
    let mut out: Option<String> = None;
    let mut copied = 0;
    while let Some((start, end, kind)) = next_format(text, copied) {
        let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
        out.push_str(&text[copied..start]);
        out.push_str("[REDACTED:");
        out.push_str(kind);
        out.push(']');
        copied = end;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
    }
}

/// How many times a secret may have been JSON-escaped and still be recognised: once for a
/// value in a JSON document, twice for JSON carried inside a JSON string (a tool result in
/// an event payload, PHP's `json_encode(json_encode(x))`).
pub const JSON_LEVELS: usize = 2;

/// The one list of forms a secret is recognised in, shared by the log's [`Redactor`] and the
/// proxy's response scrubber: every string here is replaced wherever it appears.
///
/// - The raw value.
/// - JSON-escaped once and twice ([`JSON_LEVELS`]). Each level escapes `"`, `\` and control
///   characters (`\n`-style where JSON has a short escape, `\u00xx` otherwise), and may
///   independently also escape `/` as `\/` (PHP), non-ASCII characters as `\uxxxx` (PHP,
///   Python's default) and `<`, `>`, `&` as `\u003c`-style (Go): every combination at every
///   level, so a value escaped by one encoder and then by another is still found.
/// - Percent-encoded, with upper- and lower-case hex digits (RFC 3986 calls them
///   equivalent, and encoders differ), in the flavours encoders actually produce:
///   every byte but ASCII letters and digits encoded; RFC 3986 unreserved characters
///   (`-._~`) kept (Python's `quote`, PHP's `rawurlencode`); JavaScript's
///   `encodeURIComponent` (also keeps `!*'()`); and form encoding, where a space is `+`
///   (keeping `-._~` as Go and Python do, `-._*` as browsers and Java do, or `-._` as PHP's
///   `urlencode` does).
///
/// Not recognised: a secret split by anything (line folding, a `\u` escape of an ASCII
/// letter), encodings other than these (base64, HTML entities), or percent-encoding mixed
/// with literal characters in ways no listed encoder produces.
pub fn encoded_forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_owned()];
    let mut level = vec![value.to_owned()];
    for _ in 0..JSON_LEVELS {
        let mut next = Vec::new();
        for text in &level {
            for flags in 0..8u8 {
                let escaped = json_escape(text, JsonFlavour::from_bits(flags));
                if !next.contains(&escaped) {
                    next.push(escaped);
                }
            }
        }
        forms.extend(next.iter().cloned());
        level = next;
    }
    for flavour in &PERCENT_FLAVOURS {
        for upper in [true, false] {
            forms.push(percent_encode(value, flavour, upper));
        }
    }
    forms.sort();
    forms.dedup();
    forms
}

/// What one JSON encoder escapes beyond what JSON requires.
#[derive(Debug, Clone, Copy)]
struct JsonFlavour {
    slash: bool,
    non_ascii: bool,
    html: bool,
}

impl JsonFlavour {
    fn from_bits(bits: u8) -> Self {
        Self {
            slash: bits & 1 != 0,
            non_ascii: bits & 2 != 0,
            html: bits & 4 != 0,
        }
    }
}

/// `text` as it appears between the quotes of a JSON string written by that encoder.
fn json_escape(text: &str, flavour: JsonFlavour) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    let mut units = [0u16; 2];
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '/' if flavour.slash => out.push_str("\\/"),
            '<' | '>' | '&' if flavour.html => push_unit_escape(&mut out, c as u16),
            c if c < ' ' => push_unit_escape(&mut out, c as u16),
            c if !c.is_ascii() && flavour.non_ascii => {
                for unit in c.encode_utf16(&mut units) {
                    push_unit_escape(&mut out, *unit);
                }
            }
            c => out.push(c),
        }
    }
    out
}

fn push_unit_escape(out: &mut String, unit: u16) {
    out.push_str(&format!("\\u{unit:04x}"));
}

/// A percent-encoder: the bytes besides ASCII letters and digits it leaves alone, and
/// whether it writes a space as `+`.
struct PercentFlavour {
    kept: &'static [u8],
    plus_for_space: bool,
}

const PERCENT_FLAVOURS: [PercentFlavour; 6] = [
    PercentFlavour {
        kept: b"",
        plus_for_space: false,
    },
    PercentFlavour {
        kept: b"-._~",
        plus_for_space: false,
    },
    PercentFlavour {
        kept: b"-._~!*'()",
        plus_for_space: false,
    },
    PercentFlavour {
        kept: b"-._~",
        plus_for_space: true,
    },
    PercentFlavour {
        kept: b"-._*",
        plus_for_space: true,
    },
    PercentFlavour {
        kept: b"-._",
        plus_for_space: true,
    },
];

fn percent_encode(value: &str, flavour: &PercentFlavour, upper: bool) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || flavour.kept.contains(&byte) {
            out.push(char::from(byte));
        } else if byte == b' ' && flavour.plus_for_space {
            out.push('+');
        } else if upper {
            out.push_str(&format!("%{byte:02X}"));
        } else {
            out.push_str(&format!("%{byte:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(redactor: &Redactor, pieces: &[&str]) -> String {
        let mut stream = StreamRedaction::default();
        let mut out: String = pieces.iter().map(|p| stream.push(redactor, p)).collect();
        out.push_str(&stream.finish(redactor));
        out
    }

    #[test]
    fn a_secret_split_across_streamed_pieces_is_redacted_whole() {
        let secret = SecretString::from("hunter2-hunter2-and-more".to_owned());
        let redactor = Redactor::with_secrets([("API_KEY", &secret)]).unwrap();
        let text = "the key is hunter2-hunter2-and-more, and a token sk-abcdefghijklmnopqrstuvwxyz012345 too";
        let whole = redactor.redact(text).into_owned();
        for first in 0..=text.len() {
            for second in first..=text.len() {
                let pieces = [&text[..first], &text[first..second], &text[second..]];
                let out = streamed(&redactor, &pieces);
                assert_eq!(out, whole, "cut at {first} and {second}");
            }
        }
    }

    #[test]
    fn streamed_text_without_secrets_is_shown_as_it_comes() {
        // Only the word being written is held back.
        let redactor = Redactor::new();
        let mut stream = StreamRedaction::default();
        assert_eq!(
            stream.push(&redactor, "Hello there, this is"),
            "Hello there, this "
        );
        assert_eq!(stream.push(&redactor, " an answer"), "is an ");
        assert_eq!(stream.finish(&redactor), "answer");
        assert!(stream.is_empty());
        // With registered secrets, at most the longest form of one (and the word it ends
        // in) is held back.
        let secret = SecretString::from("hunter2-hunter2".to_owned());
        let redactor = Redactor::with_secrets([("API_KEY", &secret)]).unwrap();
        let text = "a long answer ".repeat(20);
        let shown = stream.push(&redactor, &text);
        assert!(
            shown.len() + redactor.longest + "answer ".len() >= text.len(),
            "{shown:?}"
        );
        assert_eq!(shown + &stream.finish(&redactor), text);
    }

    proptest::proptest! {
        #[test]
        fn streamed_redaction_equals_whole_redaction(
            text in r"[a-z sk\-0-9é]{0,80}",
            at in proptest::collection::vec(0usize..100, 0..6),
        ) {
            let secret = SecretString::from("sk-secret-é9".to_owned());
            let redactor = Redactor::with_secrets([("K", &secret)]).unwrap();
            let text = format!("{text} sk-secret-é9 {text}");
            let mut cuts: Vec<usize> = at.into_iter().map(|i| i % (text.len() + 1)).filter(|&i| text.is_char_boundary(i)).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for cut in cuts {
                pieces.push(&text[from..cut]);
                from = cut;
            }
            pieces.push(&text[from..]);
            proptest::prop_assert_eq!(streamed(&redactor, &pieces), redactor.redact(&text).into_owned());
        }
    }

    fn check(input: &str, expected: &str) {
        assert_eq!(Redactor::new().redact(input), expected, "input: {input}");
    }

    #[test]
    fn well_known_formats() {
        check(
            "key sk-abcdefghijklmnopqrstuvwxyz012345 end",
            "key [REDACTED:openai_key] end",
        );
        check(
            "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx_yz-0123",
            "[REDACTED:openai_key]",
        );
        check(
            "x=sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz",
            "x=[REDACTED:anthropic_key]",
        );
        check(
            "token ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789 ok",
            "token [REDACTED:github_token] ok",
        );
        check(
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF",
            "[REDACTED:github_token]",
        );
        check(
            "aws AKIAIOSFODNN7EXAMPLE.",
            "aws [REDACTED:aws_access_key_id].",
        );
        check("xoxb-123456789012-abcdefghijkl", "[REDACTED:slack_token]");
        check(
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "Authorization: Bearer [REDACTED:jwt]",
        );
        check(
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----\nrest",
            "[REDACTED:private_key]\nrest",
        );
        check(
            r#"{"pem":"-----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY-----"}"#,
            r#"{"pem":"[REDACTED:private_key]"}"#,
        );
        // A truncated key is redacted to the end rather than leaked.
        check(
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNz",
            "[REDACTED:private_key]",
        );
    }

    #[test]
    fn ordinary_text_is_untouched_and_borrowed() {
        for text in [
            "risk-assessment-framework-document-v2",
            "task-sk-like but short sk-abc",
            "AKIA lowercase akiaiosfodnn7example",
            "eyJ alone",
            "",
        ] {
            assert!(
                matches!(Redactor::new().redact(text), Cow::Borrowed(_)),
                "{text}"
            );
        }
    }

    #[test]
    fn registered_secrets_in_plain_and_json_escaped_text() {
        let secret = SecretString::from("p@ss\"w/rd\\42");
        let redactor = Redactor::with_secrets([("db", &secret)]).unwrap();
        assert_eq!(redactor.redact("pw=p@ss\"w/rd\\42;"), "pw=[REDACTED:db];");
        let json = serde_json::json!({"out": "p@ss\"w/rd\\42"}).to_string();
        assert_eq!(redactor.redact(&json), r#"{"out":"[REDACTED:db]"}"#);
        let twice = serde_json::json!({"payload": json}).to_string();
        assert_eq!(
            redactor.redact(&twice),
            r#"{"payload":"{\"out\":\"[REDACTED:db]\"}"}"#
        );
        assert!(redactor.contains_secret("xx p@ss\"w/rd\\42"));
        assert!(!redactor.contains_secret("nothing here"));
    }

    #[test]
    fn php_double_json_encoding_and_percent_forms_are_caught() {
        // PHP's json_encode escapes `/` at both levels; Python's quote writes upper-case hex,
        // some encoders lower-case, form encoding a `+` for a space.
        let secret = SecretString::from("p@ss\"w/rd 42");
        let redactor = Redactor::with_secrets([("db", &secret)]).unwrap();
        for form in [
            r#"p@ss\"w\/rd 42"#,
            r#"p@ss\\\"w\\\/rd 42"#,
            r#"p@ss\\\"w\/rd 42"#,
            "p%40ss%22w%2Frd%2042",
            "p%40ss%22w%2frd%2042",
            "p%40ss%22w%2Frd+42",
            "p%40ss%22w%2frd+42",
        ] {
            assert_eq!(
                redactor.redact(&format!("<{form}>")),
                "<[REDACTED:db]>",
                "{form}"
            );
        }
        let unicode = SecretString::from("s\u{e9}cr\u{1F600}t</x>");
        let redactor = Redactor::with_secrets([("u", &unicode)]).unwrap();
        for form in [
            r"s\u00e9cr\ud83d\ude00t</x>",
            r"s\u00e9cr\ud83d\ude00t<\/x>",
            r"s\\u00e9cr\\ud83d\\ude00t\\u003c\\/x\\u003e",
            r"s\u00e9cr\ud83d\ude00t\u003c/x\u003e",
        ] {
            assert_eq!(redactor.redact(form), "[REDACTED:u]", "{form}");
        }
    }

    #[test]
    fn the_forms_of_a_plain_token_are_few() {
        // Letters, digits and `-_.` survive every encoder listed: one form, and one more
        // only where an encoder escapes the punctuation.
        assert_eq!(encoded_forms("abcDEF123456"), ["abcDEF123456"]);
        assert_eq!(
            encoded_forms("ab-cd_ef"),
            ["ab%2Dcd%5Fef", "ab%2dcd%5fef", "ab-cd_ef"]
        );
    }

    #[test]
    fn short_secrets_are_refused_and_debug_hides_values() {
        let short = SecretString::from("abc");
        let err = Redactor::with_secrets([("pin", &short)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "secret `pin` is shorter than 6 characters and cannot be redacted safely"
        );
        let secret = SecretString::from("canary-0123456789");
        let redactor = Redactor::with_secrets([("gh", &secret)]).unwrap();
        assert!(!format!("{redactor:?}").contains("canary"));
    }

    proptest::proptest! {
        /// A token planted anywhere in arbitrary text is always replaced with its kind,
        /// and the text around it survives.
        #[test]
        fn planted_tokens_never_survive(
            before in "[ -~\n]{0,200}",
            after in "[ -~\n]{0,200}",
            which in 0usize..6,
        ) {
            let (token, kind) = [
                ("sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz", "anthropic_key"),
                ("sk-proj-AbCdEfGhIjKlMnOpQrStUvWx_yz-0123", "openai_key"),
                ("ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "github_token"),
                ("AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
                ("xoxb-123456789012-abcdefghijkl", "slack_token"),
                ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "jwt"),
            ][which];
            let text = format!("{before} {token} {after}");
            let redacted = Redactor::new().redact(&text).into_owned();
            proptest::prop_assert!(!redacted.contains(token), "{redacted}");
            let marker = format!("[REDACTED:{kind}]");
            proptest::prop_assert!(redacted.contains(&marker), "{redacted}");
        }
    }
}
