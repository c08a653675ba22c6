//! File-name globs for `grep`: `*`, `?`, `[a-z]`, `[!x]`, `{a,b}` and `**/`.
//!
//! Written by hand because the few rules the model uses (`*.rs`, `*.{ts,tsx}`, `src/**/*.py`)
//! fit in a page, where a glob crate would pull its own regex stack into the static binary.
//! A glob without `/` is matched against the file name, one with `/` against the
//! workspace-relative path, where `*` and `?` do not cross `/` and `**/` spans directories.

/// The most alternatives `{...}` may expand to, so that `{a,b}{c,d}...` cannot explode.
const MAX_ALTERNATIVES: usize = 64;
/// How deep braces may nest.
const MAX_DEPTH: usize = 8;
/// The longest glob, in characters. Real globs are tens of characters; this bounds the work
/// of matching every file against one (alternatives times tokens times the path's length).
const MAX_CHARS: usize = 4096;
/// Patterns longer than this are not quoted back in errors.
const QUOTED_CHARS: usize = 80;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`: any one character but `/`.
    One,
    /// `*`: any run of characters without `/`.
    Star,
    /// `**/`: nothing, or any run of characters ending in `/`.
    Dirs,
    /// `**` elsewhere: any run of characters.
    Anything,
    /// `[...]`: one character in (or, negated, not in) the ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// A compiled glob.
#[derive(Debug, Clone)]
pub(crate) struct Glob {
    alternatives: Vec<Vec<Token>>,
    match_path: bool,
}

impl Glob {
    pub(crate) fn new(pattern: &str) -> Result<Self, String> {
        let length = pattern.chars().count();
        if length > MAX_CHARS {
            return Err(format!(
                "the glob is {length} characters long; the limit is {MAX_CHARS}"
            ));
        }
        let alternatives = expand_braces(pattern)?
            .iter()
            .map(|alternative| tokenize(alternative))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            alternatives,
            match_path: pattern.contains('/'),
        })
    }

    /// Whether the file at `path` (workspace-relative) with the last component `name` matches.
    pub(crate) fn matches(&self, path: &str, name: &str) -> bool {
        let text: Vec<char> = if self.match_path { path } else { name }.chars().collect();
        self.alternatives
            .iter()
            .any(|tokens| matches(tokens, &text))
    }
}

/// `in <pattern>` for an error about a short pattern, `in the glob` for a long one.
fn quoted(pattern: &str) -> String {
    if pattern.chars().count() <= QUOTED_CHARS {
        format!("in {pattern}")
    } else {
        "in the glob".to_owned()
    }
}

/// A parsed pattern: text, and brace groups whose alternatives are sequences again.
#[derive(Debug)]
enum Node {
    Text(String),
    Braces(Vec<Vec<Node>>),
}

/// A brace group being parsed: the alternatives so far, the one being read, and how many
/// expansions each of them has.
struct Group {
    alternatives: Vec<Vec<Node>>,
    /// Expansions of the finished alternatives, summed.
    count: usize,
    current: Vec<Node>,
    /// Expansions of `current`: the product of its groups'.
    current_count: usize,
}

impl Group {
    fn new() -> Self {
        Self {
            alternatives: Vec::new(),
            count: 0,
            current: Vec::new(),
            current_count: 1,
        }
    }

    fn push_char(&mut self, c: char) {
        match self.current.last_mut() {
            Some(Node::Text(text)) => text.push(c),
            Some(Node::Braces(_)) | None => self.current.push(Node::Text(c.to_string())),
        }
    }

    fn end_alternative(&mut self) {
        self.alternatives.push(std::mem::take(&mut self.current));
        self.count = self.count.saturating_add(self.current_count);
        self.current_count = 1;
    }
}

/// Expands `{a,b}` groups, nested and repeated, into at most [`MAX_ALTERNATIVES`] patterns.
/// One pass over the pattern with an explicit stack (no recursion on its length): every
/// group's expansion count is known when it closes, so an over-limit pattern is refused
/// before anything is expanded, and expanding the rest costs at most the limit times the
/// pattern's length.
fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
    let too_many = || {
        format!(
            "the glob expands to more than {MAX_ALTERNATIVES} alternatives ({})",
            quoted(pattern)
        )
    };
    let mut stack = vec![Group::new()];
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        let depth = stack.len() - 1;
        let group = stack.last_mut().ok_or_else(too_many)?;
        match c {
            // An escaped character stays escaped for the tokenizer.
            '\\' => {
                group.push_char('\\');
                if let Some(next) = chars.next() {
                    group.push_char(next);
                }
            }
            '{' => {
                if depth >= MAX_DEPTH {
                    return Err(format!(
                        "the glob nests braces more than {MAX_DEPTH} deep ({})",
                        quoted(pattern)
                    ));
                }
                stack.push(Group::new());
            }
            ',' if depth > 0 => {
                group.end_alternative();
                if group.count > MAX_ALTERNATIVES {
                    return Err(too_many());
                }
            }
            '}' if depth > 0 => {
                group.end_alternative();
                let Some(closed) = stack.pop() else {
                    return Err(too_many());
                };
                let parent = stack.last_mut().ok_or_else(too_many)?;
                // Every count is at least 1, so a part over the limit puts the whole over it.
                parent.current_count = parent.current_count.saturating_mul(closed.count);
                if closed.count > MAX_ALTERNATIVES || parent.current_count > MAX_ALTERNATIVES {
                    return Err(too_many());
                }
                parent.current.push(Node::Braces(closed.alternatives));
            }
            c => group.push_char(c),
        }
    }
    if stack.len() > 1 {
        return Err(format!("unclosed '{{' {}", quoted(pattern)));
    }
    let top = stack.pop().map(|group| group.current).unwrap_or_default();
    Ok(expand(&top))
}

/// Every string `sequence` stands for. Recursion follows the nesting, at most
/// [`MAX_DEPTH`] deep; the counts were checked while parsing.
fn expand(sequence: &[Node]) -> Vec<String> {
    let mut out = vec![String::new()];
    for node in sequence {
        match node {
            Node::Text(text) => {
                for prefix in &mut out {
                    prefix.push_str(text);
                }
            }
            Node::Braces(alternatives) => {
                let suffixes: Vec<String> = alternatives.iter().flat_map(|a| expand(a)).collect();
                // A group of one (`{a}`) is appended in place: copying the prefixes for it
                // would make `{a}{a}...` quadratic. Groups of two or more multiply the count,
                // so at most log2(MAX_ALTERNATIVES) of them copy anything.
                if let [suffix] = suffixes.as_slice() {
                    for prefix in &mut out {
                        prefix.push_str(suffix);
                    }
                    continue;
                }
                out = out
                    .iter()
                    .flat_map(|prefix| {
                        suffixes
                            .iter()
                            .map(move |suffix| format!("{prefix}{suffix}"))
                    })
                    .collect();
            }
        }
    }
    out
}

fn tokenize(pattern: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let token = match chars[i] {
            '\\' => {
                i += 1;
                Token::Literal(
                    *chars
                        .get(i)
                        .ok_or_else(|| format!("trailing '\\' {}", quoted(pattern)))?,
                )
            }
            '?' => Token::One,
            '*' if chars.get(i + 1) == Some(&'*') => {
                i += 1;
                if chars.get(i + 1) == Some(&'/') {
                    i += 1;
                    Token::Dirs
                } else {
                    Token::Anything
                }
            }
            '*' => Token::Star,
            '[' => {
                let (token, end) =
                    class(&chars, i).ok_or_else(|| format!("unclosed '[' {}", quoted(pattern)))?;
                i = end;
                token
            }
            c => Token::Literal(c),
        };
        tokens.push(token);
        i += 1;
    }
    Ok(tokens)
}

/// Parses the class starting at `chars[start] == '['`; returns it and the index of its `]`.
fn class(chars: &[char], start: usize) -> Option<(Token, usize)> {
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let c = *chars.get(i)?;
        if c == ']' && !first {
            return Some((Token::Class { negated, ranges }, i));
        }
        first = false;
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&end| end != ']') {
            ranges.push((c, chars[i + 2]));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
}

/// Dynamic programming over (token, character) positions: `rest[j]` says whether the tokens
/// from the current one on match `text[j..]`. Linear in the text per token (`**/` included),
/// no backtracking.
fn matches(tokens: &[Token], text: &[char]) -> bool {
    let n = text.len();
    let mut next = vec![false; n + 1];
    next[n] = true;
    for token in tokens.iter().rev() {
        let mut current = vec![false; n + 1];
        // For `**/`: whether some `/` at or after `j` is followed by a match of the rest.
        let mut after_slash = false;
        for j in (0..=n).rev() {
            let here = text.get(j).copied();
            if here == Some('/') && next[j + 1] {
                after_slash = true;
            }
            current[j] = match token {
                Token::Literal(c) => here == Some(*c) && next[j + 1],
                Token::One => here.is_some_and(|c| c != '/') && next[j + 1],
                Token::Class { negated, ranges } => {
                    here.is_some_and(|c| {
                        c != '/' && ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
                    }) && next[j + 1]
                }
                Token::Star => next[j] || (here.is_some_and(|c| c != '/') && current[j + 1]),
                Token::Anything => next[j] || (here.is_some() && current[j + 1]),
                Token::Dirs => next[j] || after_slash,
            };
        }
        // Nothing of the text matches the rest: nor can anything with more in front.
        if !current.contains(&true) {
            return false;
        }
        next = current;
    }
    next[0]
}

#[cfg(test)]
#[path = "glob_fuzz.rs"]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pattern: &str, path: &str, expected: bool) {
        let glob = Glob::new(pattern).unwrap();
        let name = path.rsplit('/').next().unwrap();
        assert_eq!(glob.matches(path, name), expected, "{pattern} on {path}");
    }

    #[test]
    fn names() {
        check("*.rs", "src/main.rs", true);
        check("*.rs", "main.rs", true);
        check("*.rs", "main.rsx", false);
        check("*.rs", ".rs", true);
        check("main.*", "main.rs", true);
        check("?.txt", "a.txt", true);
        check("?.txt", "ab.txt", false);
        check("*.{rs,toml}", "Cargo.toml", true);
        check("*.{rs,toml}", "Cargo.lock", false);
        check("{a,b{c,d}}.txt", "bd.txt", true);
        check("{a,b{c,d}}.txt", "b.txt", false);
        check("[abc]*", "banana", true);
        check("[!abc]*", "banana", false);
        check("[a-c]x", "bx", true);
        check("[a-c]x", "dx", false);
        check("[]]", "]", true);
        check("[a-]", "-", true);
        check("\\*", "*", true);
        check("\\*", "a", false);
        check("Makefile", "sub/Makefile", true);
        check("*", "anything", true);
        check("", "x", false);
    }

    #[test]
    fn paths() {
        check("src/*.rs", "src/main.rs", true);
        check("src/*.rs", "src/a/main.rs", false);
        check("src/**/*.rs", "src/main.rs", true);
        check("src/**/*.rs", "src/a/b/main.rs", true);
        check("src/**/*.rs", "tests/main.rs", false);
        check("**/*.rs", "main.rs", true);
        check("**/*.rs", "a/b/main.rs", true);
        check("src/**", "src/a/b", true);
        check("src/?/x", "src///x", false);
    }

    #[test]
    fn bad_globs() {
        let long = format!("{}x", "a".repeat(QUOTED_CHARS));
        for (pattern, message) in [
            ("*.{rs", "unclosed '{' in *.{rs"),
            ("[ab", "unclosed '[' in [ab"),
            ("a\\", "trailing '\\' in a\\"),
            (
                "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}",
                "the glob expands to more than 64 alternatives (in {a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b})",
            ),
            (
                "{{{{{{{{{a}}}}}}}}}",
                "the glob nests braces more than 8 deep (in {{{{{{{{{a}}}}}}}}})",
            ),
            (&format!("{long}{{"), "unclosed '{' in the glob"),
        ] {
            assert_eq!(Glob::new(pattern).unwrap_err(), message, "{pattern}");
        }
    }

    #[test]
    fn braces_expand_within_the_caps() {
        let expanded = |pattern: &str| expand_braces(pattern).unwrap();
        assert_eq!(expanded("{a}{b}"), ["ab"]);
        assert_eq!(expanded("x{}y"), ["xy"]);
        assert_eq!(expanded("{,a}"), ["", "a"]);
        assert_eq!(
            expanded("a}b,c"),
            ["a}b,c"],
            "stray '}}' and ',' are literal"
        );
        assert_eq!(
            expanded("\\{a,b}"),
            ["\\{a,b}"],
            "an escaped brace opens nothing"
        );
        assert_eq!(
            expanded("{a,b{c,d{e,f}}}.x"),
            ["a.x", "bc.x", "bde.x", "bdf.x"]
        );
        assert_eq!(expanded("{{{{{{{{a}}}}}}}}"), ["a"], "8 deep is allowed");
        assert_eq!(expanded(&"{a,b}".repeat(6)).len(), 64);
        // The limit applies to the whole, however the groups are arranged.
        assert!(expand_braces("{a,b}{{a,b}{a,b}{a,b}{a,b}{a,b}{a,b},c}").is_err());
        assert!(expand_braces(&format!("{{{}}}", vec!["a"; 65].join(","))).is_err());
        let long = "{a}".repeat(1_300);
        assert_eq!(
            Glob::new(&long).unwrap().alternatives,
            [vec![Token::Literal('a'); 1_300]]
        );
    }

    /// Brace expansion is one pass over the pattern: a megabyte of `{a}` (which the old
    /// recursive expansion turned into a stack overflow) or of unclosed `{` is dealt with at
    /// once. A liveness bound, not a timing assertion.
    #[test]
    fn huge_patterns_are_expanded_or_refused_in_one_pass() {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let repeated = expand_braces(&"{a}".repeat(350_000)).map(|out| out[0].len());
            let nested = expand_braces(&"{".repeat(1_000_000)).unwrap_err();
            let wide = expand_braces(&format!("{{{}}}", "a,".repeat(500_000))).unwrap_err();
            let _ = sender.send((repeated, nested, wide));
        });
        let (repeated, nested, wide) = receiver
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("brace expansion hung");
        assert_eq!(repeated, Ok(350_000));
        assert_eq!(
            nested,
            "the glob nests braces more than 8 deep (in the glob)"
        );
        assert_eq!(
            wide,
            "the glob expands to more than 64 alternatives (in the glob)"
        );
    }

    proptest::proptest! {
        /// Any pattern compiles or is refused, never panics, and never yields more than the
        /// cap of alternatives.
        #[test]
        fn any_pattern_compiles_within_the_caps(pattern in "[{},ab*?\\[\\]/\\\\!-]{0,200}") {
            if let Ok(glob) = Glob::new(&pattern) {
                proptest::prop_assert!(glob.alternatives.len() <= MAX_ALTERNATIVES);
                let _ = glob.matches("a/b/ab", "ab");
            }
        }
    }
}
