//! A tool call written as text whose JSON is broken the way small models break it,
//! repaired before it is given up as unreadable (docs/providers.md, "Tools as text"). Seen
//! with Qwen2.5-Coder-1.5B: a file's text put into a JSON string as it is, a Python
//! docstring's `"""` unescaped and sometimes its line breaks raw; and calls missing their
//! last brace.
//!
//! The repairs, made in one pass over the text of one object:
//! - a control character inside a string (a raw line break, a tab) is escaped;
//! - a backslash inside a string that starts no valid escape (`\d` in a regex) is escaped;
//! - a `"` inside a string ends it only where that makes structural sense: after a key, a
//!   `:` follows; after a value, the closing brackets the open containers expect and then
//!   the end of the call, or a `,` and the next member (in an object a key and a `:`, in an
//!   array a value). Any other `"` is escaped;
//! - at most [`MAX_ADDED`] closing braces or brackets missing at the end are added, and
//!   only when the text ends right after a closing one (a call cut off inside a string or
//!   after a bare value is not guessed at).
//!
//! A `"` that does end a string may look like one that does not (Python's `{"a": "x", "b":
//! 1}` inside a file's text): the first pass takes any key as the next member; when its
//! result does not parse, a second pass takes only the keys the caller names (the tools'
//! argument names). The caller uses a repair only when it parses and is shaped as a call
//! (`text_tools`); anything else stays unreadable.
//!
//! Bounded: each pass reads each byte once, and a quote inside a string looks ahead at
//! most [`LOOKAHEAD`] bytes; so the work is linear in the text's length.

use serde_json::Value;

/// The most bytes after a quote inside a string that are read to decide whether it ends
/// the string: whitespace, closing brackets and the next key.
const LOOKAHEAD: usize = 512;
/// The deepest nesting a repaired call may have.
const MAX_DEPTH: usize = 64;
/// The most closing brackets added at the end: `}` or `}}`, the arguments' and the call's.
const MAX_ADDED: usize = 2;

/// A call's text, repaired.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Repaired {
    /// The object the repaired text holds.
    pub(crate) value: Value,
    /// What was changed, in a line (`escaped 6 double quotes inside strings`).
    pub(crate) what: String,
    /// The bytes of the input the object took (before trailing text, when allowed).
    pub(crate) end: usize,
}

/// `text` (which starts with `{`) repaired into a JSON object, when the repairs above make
/// one of it. `whole`: the object must take all of `text` but trailing whitespace; else it
/// may be followed by anything (a bare call followed by prose). `keys`: the member names
/// the second pass takes. `None` when the text cannot be repaired, or needed no repair.
pub(crate) fn repair(text: &str, keys: &[&str], whole: bool) -> Option<Repaired> {
    // Ends: two passes.
    for known in [None, Some(keys)] {
        let Some(scan) = scan(text.as_bytes(), known, whole) else {
            continue;
        };
        if scan.counts.total() == 0 {
            // Nothing changed: the text is as broken as it was.
            return None;
        }
        let Ok(repaired) = String::from_utf8(scan.out) else {
            continue;
        };
        if let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(&repaired) {
            return Some(Repaired {
                value,
                what: scan.counts.describe(),
                end: scan.end,
            });
        }
    }
    None
}

/// What one pass made of a text.
#[derive(Debug)]
struct Scan {
    out: Vec<u8>,
    end: usize,
    counts: Counts,
}

/// The repairs made, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    quotes: usize,
    controls: usize,
    backslashes: usize,
    closers: usize,
}

impl Counts {
    fn total(self) -> usize {
        self.quotes + self.controls + self.backslashes + self.closers
    }

    /// `escaped 6 double quotes and 2 line breaks or tabs inside strings; added 1 closing
    /// bracket`.
    fn describe(self) -> String {
        let count = |n: usize, one: &str, many: &str| match n {
            0 => None,
            1 => Some(format!("1 {one}")),
            _ => Some(format!("{n} {many}")),
        };
        let escaped: Vec<String> = [
            count(self.quotes, "double quote", "double quotes"),
            count(
                self.controls,
                "control character (a line break or tab)",
                "control characters (line breaks or tabs)",
            ),
            count(self.backslashes, "backslash", "backslashes"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut parts = Vec::new();
        if !escaped.is_empty() {
            parts.push(format!("escaped {} inside strings", and_list(&escaped)));
        }
        if let Some(added) = count(self.closers, "closing bracket", "closing brackets") {
            parts.push(format!("added {added} at the end"));
        }
        parts.join("; ")
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// An open container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Object,
    Array,
}

impl Open {
    fn closer(self) -> u8 {
        match self {
            Self::Object => b'}',
            Self::Array => b']',
        }
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The first position at or after `from` in `bytes` that is not whitespace (or the end).
fn skip_space(bytes: &[u8], from: usize) -> usize {
    from + bytes
        .get(from..)
        .map_or(0, |rest| rest.iter().take_while(|&&b| is_space(b)).count())
}

/// One pass over `text`: the object it starts with, repaired. `keys`: the member names a
/// `,` may be followed by (`None`: any).
fn scan(text: &[u8], keys: Option<&[&str]>, whole: bool) -> Option<Scan> {
    if text.first() != Some(&b'{') {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() + text.len() / 16 + 8);
    let mut counts = Counts::default();
    let mut stack: Vec<Open> = Vec::new();
    let mut expect_key = false;
    // The last byte outside strings that is not whitespace (a string's end counts as `"`).
    let mut last = 0_u8;
    let mut i = 0;
    let context = Context { text, keys, whole };
    // Ends: every pass moves `i` forward (a string moves it past its end), up to the
    // text's length.
    while let Some(&b) = text.get(i) {
        match b {
            b'{' | b'[' => {
                if stack.len() >= MAX_DEPTH {
                    return None;
                }
                stack.push(if b == b'{' { Open::Object } else { Open::Array });
                expect_key = b == b'{';
            }
            b'}' | b']' => {
                if stack.pop().map(Open::closer) != Some(b) {
                    return None;
                }
                expect_key = false;
                if stack.is_empty() {
                    out.push(b);
                    let end = i + 1;
                    if whole && !text[end..].iter().all(|&b| is_space(b)) {
                        return None;
                    }
                    return Some(Scan { out, end, counts });
                }
            }
            b':' => expect_key = false,
            b',' => expect_key = stack.last() == Some(&Open::Object),
            b'"' => {
                let key = expect_key && stack.last() == Some(&Open::Object);
                i = context.string(i, key, &stack, &mut out, &mut counts)?;
                last = b'"';
                continue;
            }
            b' ' | b'\n' | b'\r' | b'\t' => {
                out.push(b);
                i += 1;
                continue;
            }
            // Numbers and literals: the parser judges them.
            b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' => {}
            _ => return None,
        }
        out.push(b);
        last = b;
        i += 1;
    }
    // The text ended before the outermost object closed: closers are added only right
    // after a closer, and only a few.
    if !matches!(last, b'}' | b']') || stack.len() > MAX_ADDED {
        return None;
    }
    // Ends: the stack shrinks by one each pass.
    while let Some(open) = stack.pop() {
        out.push(open.closer());
        counts.closers += 1;
    }
    Some(Scan {
        out,
        end: text.len(),
        counts,
    })
}

/// What a pass reads strings against.
struct Context<'a> {
    text: &'a [u8],
    keys: Option<&'a [&'a str]>,
    whole: bool,
}

impl Context<'_> {
    /// Copies the string that opens at `start` into `out`, repaired; where it ends.
    /// `None` when the text ends inside it.
    fn string(
        &self,
        start: usize,
        key: bool,
        stack: &[Open],
        out: &mut Vec<u8>,
        counts: &mut Counts,
    ) -> Option<usize> {
        let text = self.text;
        out.push(b'"');
        let mut j = start + 1;
        // Ends: every pass moves `j` forward; the text's end returns.
        loop {
            let &b = text.get(j)?;
            match b {
                b'\\' => match text.get(j + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                        out.extend_from_slice(&text[j..j + 2]);
                        j += 2;
                    }
                    Some(b'u')
                        if text
                            .get(j + 2..j + 6)
                            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) =>
                    {
                        out.extend_from_slice(&text[j..j + 6]);
                        j += 6;
                    }
                    Some(_) | None => {
                        out.extend_from_slice(b"\\\\");
                        counts.backslashes += 1;
                        j += 1;
                    }
                },
                b'"' => {
                    j += 1;
                    if self.ends_string(j, key, stack) {
                        out.push(b'"');
                        return Some(j);
                    }
                    out.extend_from_slice(b"\\\"");
                    counts.quotes += 1;
                }
                0x00..=0x1f => {
                    match b {
                        b'\n' => out.extend_from_slice(b"\\n"),
                        b'\r' => out.extend_from_slice(b"\\r"),
                        b'\t' => out.extend_from_slice(b"\\t"),
                        _ => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
                    }
                    counts.controls += 1;
                    j += 1;
                }
                _ => {
                    out.push(b);
                    j += 1;
                }
            }
        }
    }

    /// Whether a quote inside a string, followed by the text from `from` on, ends it.
    fn ends_string(&self, from: usize, key: bool, stack: &[Open]) -> bool {
        let text = self.text;
        let end = text.len().min(from + LOOKAHEAD);
        let ahead = &text[from..end];
        let mut p = skip_space(ahead, 0);
        if key {
            return ahead.get(p) == Some(&b':');
        }
        let mut depth = stack.len();
        let mut closed = 0;
        // Ends: every pass moves `p` forward within `ahead`, or returns.
        loop {
            let Some(&c) = ahead.get(p) else {
                // The text's end after a closer: closers left out at the end.
                return closed > 0 && end == text.len();
            };
            match c {
                b'}' | b']' => {
                    if depth == 0 || stack[depth - 1].closer() != c {
                        return false;
                    }
                    depth -= 1;
                    closed += 1;
                    if depth == 0 {
                        // The outermost object closes: the call ends here.
                        return !self.whole
                            || (end == text.len() && ahead[p + 1..].iter().all(|&b| is_space(b)));
                    }
                    p = skip_space(ahead, p + 1);
                }
                b',' if depth > 0 => {
                    let next = &ahead[skip_space(ahead, p + 1)..];
                    return match stack[depth - 1] {
                        Open::Object => self.member_key(next),
                        Open::Array => value_starts(next),
                    };
                }
                _ => return false,
            }
        }
    }

    /// Whether `ahead` starts with an object member's key (a complete string, one of the
    /// known keys when there are such) and its `:`.
    fn member_key(&self, ahead: &[u8]) -> bool {
        if ahead.first() != Some(&b'"') {
            return false;
        }
        let mut k = 1;
        // Ends: every pass moves `k` forward within `ahead`, or returns.
        let close = loop {
            match ahead.get(k) {
                None => return false,
                Some(b'"') => break k,
                Some(b'\\') => k += 2,
                Some(&b) if b < 0x20 => return false,
                Some(_) => k += 1,
            }
        };
        if let Some(keys) = self.keys {
            let name = &ahead[1..close];
            if !keys.iter().any(|key| key.as_bytes() == name) {
                return false;
            }
        }
        ahead.get(skip_space(ahead, close + 1)) == Some(&b':')
    }
}

/// Whether `ahead` starts with a JSON value.
fn value_starts(ahead: &[u8]) -> bool {
    match ahead.first() {
        Some(b'"' | b'{' | b'[' | b'-' | b'0'..=b'9') => true,
        Some(_) => ["true", "false", "null"].iter().any(|literal| {
            ahead.starts_with(literal.as_bytes())
                && !ahead
                    .get(literal.len())
                    .is_some_and(|b| b.is_ascii_alphanumeric())
        }),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &[&str] = &["name", "arguments", "path", "old_text", "new_text"];

    /// The repaired value of `text` as compact JSON, and what was done.
    fn fixed(text: &str) -> Option<(String, String)> {
        repair(text, KEYS, true).map(|r| (r.value.to_string(), r.what))
    }

    #[test]
    fn docstring_quotes_and_raw_line_breaks_are_escaped() {
        // As Qwen2.5-Coder-1.5B wrote it (recorded): the line breaks escaped, the
        // docstring's quotes not.
        let text = "{\n  \"name\": \"write_file\",\n  \"arguments\": {\n    \"content\": \"def f():\\n    \"\"\"Doc.\"\"\"\\n    return 1\",\n    \"path\": \"a.py\"\n  }\n}";
        let (value, what) = fixed(text).unwrap();
        assert_eq!(
            value,
            r#"{"name":"write_file","arguments":{"content":"def f():\n    \"\"\"Doc.\"\"\"\n    return 1","path":"a.py"}}"#
        );
        assert_eq!(what, "escaped 6 double quotes inside strings");
        // The same with raw line breaks and a tab.
        let raw = "{\"name\": \"edit_file\", \"arguments\": {\"path\": \"a.py\", \"old_text\": \"x\", \"new_text\": \"def f():\n\t\"\"\"Doc.\"\"\"\n\treturn \"s\"\n\"}}";
        let (value, what) = fixed(raw).unwrap();
        assert_eq!(
            value,
            r#"{"name":"edit_file","arguments":{"path":"a.py","old_text":"x","new_text":"def f():\n\t\"\"\"Doc.\"\"\"\n\treturn \"s\"\n"}}"#
        );
        assert_eq!(
            what,
            "escaped 8 double quotes and 5 control characters (line breaks or tabs) inside strings"
        );
    }

    #[test]
    fn missing_closers_and_bad_escapes() {
        let (value, what) = fixed(r#"{"name": "shell", "arguments": {"command": "ls"}"#).unwrap();
        assert_eq!(value, r#"{"name":"shell","arguments":{"command":"ls"}}"#);
        assert_eq!(what, "added 1 closing bracket at the end");
        let (value, what) = fixed(r#"{"name": "x", "arguments": {"a": [1, {}]"#).unwrap();
        assert_eq!(value, r#"{"name":"x","arguments":{"a":[1,{}]}}"#);
        assert_eq!(what, "added 2 closing brackets at the end");
        let (value, what) =
            fixed(r#"{"name": "grep", "arguments": {"pattern": "\d+\s"}}"#).unwrap();
        assert_eq!(
            value,
            r#"{"name":"grep","arguments":{"pattern":"\\d+\\s"}}"#
        );
        assert_eq!(what, "escaped 2 backslashes inside strings");
        // Cut off inside a string, after a bare value, or too many closers missing.
        assert_eq!(
            fixed(r#"{"name": "shell", "arguments": {"command": "ls"#),
            None
        );
        assert_eq!(fixed(r#"{"name": "shell", "arguments": {"n": 1"#), None);
        assert_eq!(fixed(r#"{"a": {"b": {"c": {}"#), None);
    }

    #[test]
    fn what_cannot_be_repaired_stays_broken() {
        // Doubled braces, a trailing comma, text after the object, not an object: no.
        for text in [
            "{{\"name\": \"shell\", \"arguments\": {}}}",
            "{\"name\": \"shell\", \"arguments\": {},}",
            "{\"name\": \"shell\", \"arguments\": {\"a\": \"b\"\n}} and more",
            "[\"shell\"]",
            "{\"name\": shell}",
            "",
        ] {
            assert_eq!(fixed(text), None, "{text}");
        }
        // Valid JSON needs no repair.
        assert_eq!(fixed(r#"{"name": "shell", "arguments": {}}"#), None);
    }

    #[test]
    fn a_dict_in_a_file_needs_the_known_keys() {
        // `"x", "b":` looks like the end of `new_text` and a member `b`; only `b` is not
        // an argument.
        let text = "{\"name\": \"edit_file\", \"arguments\": {\"path\": \"a.py\", \"old_text\": \"d = 1\", \"new_text\": \"d = {\"a\": \"x\", \"b\": 2}\nprint(d)\"}}";
        let (value, _) = fixed(text).unwrap();
        let value: Value = serde_json::from_str(&value).unwrap();
        assert_eq!(
            value["arguments"]["new_text"],
            "d = {\"a\": \"x\", \"b\": 2}\nprint(d)"
        );
    }

    #[test]
    fn a_bare_call_followed_by_prose_ends_where_it_closes() {
        let text =
            "{\"name\": \"shell\", \"arguments\": {\"command\": \"echo \"hi\"\"}}\nThat prints hi.";
        assert_eq!(repair(text, KEYS, true), None);
        let repaired = repair(text, KEYS, false).unwrap();
        assert_eq!(repaired.value["arguments"]["command"], "echo \"hi\"");
        assert_eq!(&text[repaired.end..], "\nThat prints hi.");
    }

    /// A JSON value for a call's arguments: strings of any characters (quotes, line
    /// breaks, backslashes, braces), numbers, literals, nested arrays and objects.
    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            any::<String>().prop_map(Value::from),
            "[\"{}\\[\\],: \\n\\\\a-z]{0,30}".prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            Just(Value::Null),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("\\PC{0,12}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Valid JSON of a call passes through a pass unchanged, compact or pretty.
        #[test]
        fn valid_json_is_left_as_it_is(
            name in "\\PC{0,20}",
            arguments in proptest::collection::btree_map("\\PC{0,12}", value(), 0..5),
            pretty in proptest::prelude::any::<bool>(),
        ) {
            let call = serde_json::json!({"name": name, "arguments": arguments});
            let text = if pretty {
                serde_json::to_string_pretty(&call).unwrap()
            } else {
                call.to_string()
            };
            for whole in [true, false] {
                let scan = scan(text.as_bytes(), None, whole).unwrap();
                proptest::prop_assert_eq!(scan.counts, Counts::default());
                proptest::prop_assert_eq!(scan.end, text.len());
                proptest::prop_assert_eq!(String::from_utf8(scan.out).unwrap(), text.clone());
            }
            proptest::prop_assert_eq!(repair(&text, KEYS, true), None);
        }

        /// Any text: the repair ends, never panics, and what it returns is an object.
        #[test]
        fn any_text_is_repaired_or_not_without_a_panic(
            text in "\\{[\"{}\\[\\],: \\n\\t\\\\a-z0-9]{0,200}",
            other in proptest::prelude::any::<String>(),
        ) {
            for text in [text.as_str(), other.as_str()] {
                for whole in [true, false] {
                    if let Some(repaired) = repair(text, KEYS, whole) {
                        proptest::prop_assert!(repaired.value.is_object());
                        proptest::prop_assert!(repaired.end <= text.len());
                    }
                }
            }
        }
    }
}
