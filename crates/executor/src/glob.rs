//! File-name globs for `grep`: `*`, `?`, `[a-z]`, `[!x]`, `{a,b}` and `**/`.
//!
//! Written by hand because the few rules the model uses (`*.rs`, `*.{ts,tsx}`, `src/**/*.py`)
//! fit in a page, where a glob crate would pull its own regex stack into the static binary.
//! A glob without `/` is matched against the file name, one with `/` against the
//! workspace-relative path, where `*` and `?` do not cross `/` and `**/` spans directories.

/// The most alternatives `{...}` may expand to, so that `{a,b}{c,d}...` cannot explode.
const MAX_ALTERNATIVES: usize = 64;

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

/// Expands the first top-level `{a,b}` and recurses, so nested and repeated braces work.
fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut depth = 0;
    let mut open = None;
    let mut commas = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '{' => {
                if depth == 0 {
                    open = Some(i);
                }
                depth += 1;
            }
            ',' if depth == 1 => commas.push(i),
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    let Some(start) = open else { break };
                    let prefix: String = chars[..start].iter().collect();
                    let suffix: String = chars[i + 1..].iter().collect();
                    let mut bounds = vec![start];
                    bounds.extend(&commas);
                    bounds.push(i);
                    let mut out = Vec::new();
                    for pair in bounds.windows(2) {
                        let middle: String = chars[pair[0] + 1..pair[1]].iter().collect();
                        out.extend(expand_braces(&format!("{prefix}{middle}{suffix}"))?);
                        if out.len() > MAX_ALTERNATIVES {
                            return Err(format!(
                                "{pattern} expands to more than {MAX_ALTERNATIVES} alternatives"
                            ));
                        }
                    }
                    return Ok(out);
                }
            }
            _ => {}
        }
        i += 1;
    }
    if depth > 0 {
        return Err(format!("unclosed '{{' in {pattern}"));
    }
    Ok(vec![pattern.to_owned()])
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
                        .ok_or_else(|| format!("trailing '\\' in {pattern}"))?,
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
                    class(&chars, i).ok_or_else(|| format!("unclosed '[' in {pattern}"))?;
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
/// from the current one on match `text[j..]`. Linear in the text per token, no backtracking.
fn matches(tokens: &[Token], text: &[char]) -> bool {
    let n = text.len();
    let mut next = vec![false; n + 1];
    next[n] = true;
    for token in tokens.iter().rev() {
        let mut current = vec![false; n + 1];
        for j in (0..=n).rev() {
            let here = text.get(j).copied();
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
                Token::Dirs => next[j] || (j..n).any(|k| text[k] == '/' && next[k + 1]),
            };
        }
        next = current;
    }
    next[0]
}

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
        for (pattern, message) in [
            ("*.{rs", "unclosed '{' in *.{rs"),
            ("[ab", "unclosed '[' in [ab"),
            ("a\\", "trailing '\\' in a\\"),
            (
                "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}",
                "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b} expands to more than 64 alternatives",
            ),
        ] {
            assert_eq!(Glob::new(pattern).unwrap_err(), message, "{pattern}");
        }
    }
}
