//! Fuzz target for globs on their own (`cargo xtask fuzz glob`): any pattern compiles or is
//! refused with an error, never panics; brace expansion agrees with a naive recursive
//! expansion wherever the caps let a pattern through; and the linear-time matcher agrees
//! with a backtracking matcher written from the definitions, on paths with `/`, dots and
//! characters outside ASCII. Patterns come from the glob's own alphabet (so that they are
//! mostly valid and deeply nested), from any Unicode text, and near the length cap.

// A fuzz target's failure is a panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;

use super::{Glob, MAX_ALTERNATIVES, MAX_CHARS, MAX_DEPTH, Token, expand_braces, tokenize};

/// Why the naive expansion stopped.
#[derive(Debug, PartialEq, Eq)]
enum Naive {
    Unclosed,
    /// More than the cap of alternatives somewhere: every count is at least 1, so the
    /// whole is over the cap too.
    TooMany,
}

/// Every string `pattern` stands for, by recursive descent: the definition the one-pass
/// expansion implements.
fn naive_expand(pattern: &str) -> Result<Vec<String>, Naive> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut at = 0;
    let out = sequence(&chars, &mut at, 0)?;
    // At depth 0 nothing stops a sequence before the end.
    assert_eq!(at, chars.len());
    Ok(out)
}

/// How deep the pattern's unescaped braces nest.
fn depth(pattern: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            '}' if depth > 0 => depth -= 1,
            _ => {}
        }
    }
    deepest
}

/// A sequence up to a `,` or `}` that closes a group (left unread), or the end.
fn sequence(chars: &[char], at: &mut usize, depth: usize) -> Result<Vec<String>, Naive> {
    let mut out = vec![String::new()];
    while let Some(&c) = chars.get(*at) {
        match c {
            '\\' => {
                let escaped: String = chars[*at..chars.len().min(*at + 2)].iter().collect();
                for prefix in &mut out {
                    prefix.push_str(&escaped);
                }
                *at += escaped.chars().count();
            }
            '{' => {
                *at += 1;
                let mut alternatives = Vec::new();
                loop {
                    alternatives.extend(sequence(chars, at, depth + 1)?);
                    match chars.get(*at) {
                        Some(',') => *at += 1,
                        Some('}') => {
                            *at += 1;
                            break;
                        }
                        _ => return Err(Naive::Unclosed),
                    }
                    if alternatives.len() > MAX_ALTERNATIVES {
                        return Err(Naive::TooMany);
                    }
                }
                out = out
                    .iter()
                    .flat_map(|p| alternatives.iter().map(move |s| format!("{p}{s}")))
                    .collect();
                if out.len() > MAX_ALTERNATIVES {
                    return Err(Naive::TooMany);
                }
            }
            ',' | '}' if depth > 0 => return Ok(out),
            c => {
                for prefix in &mut out {
                    prefix.push(c);
                }
                *at += 1;
            }
        }
    }
    // The end inside a group: unclosed.
    if depth == 0 {
        Ok(out)
    } else {
        Err(Naive::Unclosed)
    }
}

/// Whether `tokens` match all of `text`, by backtracking: exponential, but it is the
/// definition of each token, on inputs small enough.
fn naive_matches(tokens: &[Token], text: &[char]) -> bool {
    let Some((token, rest)) = tokens.split_first() else {
        return text.is_empty();
    };
    let first = text.first().copied();
    match token {
        Token::Literal(c) => first == Some(*c) && naive_matches(rest, &text[1..]),
        Token::One => first.is_some_and(|c| c != '/') && naive_matches(rest, &text[1..]),
        Token::Class { negated, ranges } => {
            first.is_some_and(|c| {
                c != '/' && ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }) && naive_matches(rest, &text[1..])
        }
        Token::Star => {
            let run = text.iter().take_while(|&&c| c != '/').count();
            (0..=run).any(|i| naive_matches(rest, &text[i..]))
        }
        Token::Anything => (0..=text.len()).any(|i| naive_matches(rest, &text[i..])),
        Token::Dirs => {
            naive_matches(rest, text)
                || (0..text.len()).any(|i| text[i] == '/' && naive_matches(rest, &text[i + 1..]))
        }
    }
}

/// Patterns of the glob's alphabet, nested and repeated.
fn pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        "[{},ab*?\\[\\]/\\\\!^.-]{0,40}",
        prop::collection::vec(
            prop_oneof![
                Just("{".to_owned()),
                Just("}".to_owned()),
                Just(",".to_owned()),
                Just("**/".to_owned()),
                Just("*".to_owned()),
                Just("?".to_owned()),
                Just("[a-c]".to_owned()),
                Just("[!b]".to_owned()),
                Just("\\".to_owned()),
                Just("é".to_owned()),
                "[ab./]{1,3}",
            ],
            0..24
        )
        .prop_map(|parts| parts.concat()),
        any::<String>(),
    ]
}

/// Paths the matcher is run on: the pattern's letters, `/` and a character beyond ASCII.
fn path() -> impl Strategy<Value = String> {
    "[ab./é]{0,12}"
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn expansion_agrees_with_the_definition(pattern in pattern()) {
        match expand_braces(&pattern) {
            Ok(expanded) => {
                prop_assert!(expanded.len() <= MAX_ALTERNATIVES);
                prop_assert!(depth(&pattern) <= MAX_DEPTH);
                prop_assert_eq!(Ok(expanded), naive_expand(&pattern));
            }
            // Refused for a reason the definition gives (the one-pass expansion may meet
            // one problem before another: a pattern too wide may also be unclosed).
            Err(error) => {
                prop_assert!(!error.contains('\n'), "{}", error);
                let naive = naive_expand(&pattern);
                let deep = depth(&pattern) > MAX_DEPTH;
                if error.starts_with("unclosed") {
                    prop_assert_eq!(naive, Err(Naive::Unclosed), "{}", error);
                } else if error.contains("nests braces") {
                    prop_assert!(deep, "{}", error);
                } else if error.contains("alternatives") {
                    prop_assert!(naive.is_err() || deep, "{}", error);
                } else {
                    prop_assert!(false, "unexpected refusal: {}", error);
                }
            }
        }
    }

    #[test]
    fn matching_agrees_with_backtracking(pattern in pattern(), paths in prop::collection::vec(path(), 1..6)) {
        let Ok(glob) = Glob::new(&pattern) else {
            return Ok(());
        };
        for path in &paths {
            let name = path.rsplit('/').next().unwrap_or_default();
            let text: Vec<char> = if glob.match_path { path.as_str() } else { name }.chars().collect();
            let expected = glob.alternatives.iter().any(|tokens| naive_matches(tokens, &text));
            prop_assert_eq!(glob.matches(path, name), expected, "{} on {}", pattern, path);
        }
    }

    #[test]
    fn a_pattern_without_special_characters_matches_only_itself(name in "[a-z0-9._-]{1,16}", other in "[a-z0-9._-]{1,16}") {
        let glob = Glob::new(&name).unwrap();
        prop_assert!(glob.matches(&name, &name));
        prop_assert_eq!(glob.matches(&other, &other), other == name);
    }

    #[test]
    fn patterns_near_the_length_cap_are_compiled_or_refused(unit in "[{}a,*]{1,4}", extra in 0usize..8) {
        let repeats = MAX_CHARS / unit.chars().count() + extra - 4;
        let pattern = unit.repeat(repeats);
        match Glob::new(&pattern) {
            Ok(glob) => {
                prop_assert!(pattern.chars().count() <= MAX_CHARS);
                let _ = glob.matches("a/b", "b");
            }
            Err(error) => prop_assert!(!error.contains('\n'), "{}", error),
        }
        prop_assert!(tokenize(&pattern).is_ok() || pattern.contains('\\') || pattern.contains('['));
    }
}
