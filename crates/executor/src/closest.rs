//! Where an `edit_file` whose `old_text` does not occur was most likely aimed: the run of
//! the file's lines most like `old_text`'s, shown in the error so that the model can copy
//! the real text instead of guessing again (a small model otherwise repeats the same
//! failing edit until the stagnation guard ends the run).
//!
//! Lines are compared with whitespace trimmed, by the Sørensen–Dice coefficient of their
//! character bigrams (`strsim`), which costs time linear in the lines' lengths; a window's
//! score is the mean over its lines. Bounded: files over [`MAX_FILE_BYTES`] or an
//! `old_text` over [`MAX_OLD_LINES`] lines get no hint, so a failed edit stays cheap.

/// Larger files get no hint.
const MAX_FILE_BYTES: usize = 256 * 1024;
/// An `old_text` of more lines gets no hint.
const MAX_OLD_LINES: usize = 40;
/// A window must be at least this alike (0 to 1) to be shown: a hint that names unrelated
/// lines would mislead.
const MIN_SCORE: f64 = 0.5;
/// The hint shows at most this many characters of the file.
const MAX_SHOWN_CHARS: usize = 1_500;

/// A run of the file's lines like `old_text`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Closest {
    /// The first line, counted from 1.
    pub(crate) first: usize,
    /// The last line, counted from 1.
    pub(crate) last: usize,
    /// The lines as the file has them, joined by `\n`.
    pub(crate) text: String,
    /// The mean similarity of its lines to `old_text`'s, 0 to 1.
    pub(crate) score: f64,
}

/// The run of `text`'s lines most like `old_text`'s, if one is alike enough and the sizes
/// are within the bounds. The earliest wins a tie.
pub(crate) fn closest(text: &str, old_text: &str) -> Option<Closest> {
    if text.len() > MAX_FILE_BYTES {
        return None;
    }
    let wanted: Vec<&str> = old_text.lines().map(str::trim).collect();
    let lines: Vec<&str> = text.lines().collect();
    if wanted.is_empty() || wanted.len() > MAX_OLD_LINES || lines.is_empty() {
        return None;
    }
    let width = wanted.len().min(lines.len());
    let mut best: Option<(usize, f64)> = None;
    // Bounded: one pass over the window starts, each comparing `width` line pairs.
    for start in 0..=lines.len() - width {
        let sum: f64 = (0..width)
            .map(|j| alike(lines[start + j].trim(), wanted[j]))
            .sum();
        let score = sum / wanted.len() as f64;
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((start, score));
        }
    }
    let (start, score) = best?;
    if score < MIN_SCORE {
        return None;
    }
    Some(Closest {
        first: start + 1,
        last: start + width,
        text: lines[start..start + width].join("\n"),
        score,
    })
}

/// How alike two trimmed lines are, 0 to 1: equal lines (blank ones too) are 1.
fn alike(a: &str, b: &str) -> f64 {
    if a == b {
        1.0
    } else {
        strsim::sorensen_dice(a, b)
    }
}

/// The hint appended to the not-found error, on one line: the lines and their text as a
/// JSON string, ready to be copied into `old_text`; empty when there is none.
pub(crate) fn hint(text: &str, old_text: &str) -> String {
    let Some(found) = closest(text, old_text) else {
        return String::new();
    };
    let lines = if found.first == found.last {
        format!("line {}", found.first)
    } else {
        format!("lines {}-{}", found.first, found.last)
    };
    if found.text.chars().count() > MAX_SHOWN_CHARS {
        return format!("; the most similar text is at {lines}: read it with read_file");
    }
    let quoted = serde_json::Value::String(found.text).to_string();
    format!("; the most similar text is {lines}, as a JSON string: {quoted}")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SLUG: &str = "import re\n\n\ndef slugify(title):\n    words = title.split(' ')\n    return '_'.join(w.lower() for w in words)\n";

    #[test]
    fn a_near_miss_names_the_lines_it_meant() {
        // Indentation and a changed name: the window of the two lines it meant.
        let found = closest(
            SLUG,
            "words = title.split(\" \")\nreturn '_'.join(w.lower() for w in word)",
        )
        .unwrap();
        assert_eq!((found.first, found.last), (5, 6));
        assert_eq!(
            found.text,
            "    words = title.split(' ')\n    return '_'.join(w.lower() for w in words)"
        );
        assert!(found.score > 0.8 && found.score < 1.0, "{}", found.score);
        assert_eq!(
            hint(SLUG, "return '-'.join(w.lower() for w in words)"),
            "; the most similar text is line 6, as a JSON string: \"    return '_'.join(w.lower() for w in words)\""
        );
    }

    #[test]
    fn unrelated_text_gets_no_hint() {
        assert_eq!(
            hint(SLUG, "assert slugify('Hello World') == 'hello-world'"),
            ""
        );
        assert_eq!(hint(SLUG, "zzz"), "");
        assert_eq!(hint("", "def slugify(title):"), "");
    }

    #[test]
    fn an_old_text_longer_than_the_file_is_compared_with_all_of_it() {
        let found = closest("a = 1\nb = 2", "a = 1\nb = 2\nc = 4").unwrap();
        assert_eq!((found.first, found.last), (1, 2));
        // Two of three lines, the third missing: a mean of two thirds.
        assert!((found.score - 2.0 / 3.0).abs() < 1e-9, "{}", found.score);
    }

    #[test]
    fn the_bounds_give_no_hint() {
        let big = "x = 1\n".repeat(MAX_FILE_BYTES / 6 + 1);
        assert_eq!(hint(&big, "x = 2"), "");
        let long = "x = 1\n".repeat(MAX_OLD_LINES + 1);
        assert_eq!(hint("x = 1\n", &long), "");
        let wide = format!("{}\n", "y".repeat(MAX_SHOWN_CHARS + 10));
        assert_eq!(
            hint(&wide, &"y".repeat(MAX_SHOWN_CHARS)),
            "; the most similar text is at line 1: read it with read_file"
        );
    }

    proptest! {
        /// The hint's lines are the file's, in range, and its text is theirs; the hint is one line.
        #[test]
        fn the_hint_is_the_files_own_lines(
            text in "([a-c =_()'\t]{0,12}\n){0,30}[a-c =]{0,8}",
            old in "([a-c =_()']{0,12}\n){0,4}[a-c =]{1,8}",
        ) {
            if let Some(found) = closest(&text, &old) {
                let lines: Vec<&str> = text.lines().collect();
                prop_assert!(1 <= found.first && found.first <= found.last);
                prop_assert!(found.last <= lines.len());
                prop_assert_eq!(found.text, lines[found.first - 1..found.last].join("\n"));
                prop_assert!((MIN_SCORE..=1.0).contains(&found.score));
            }
            prop_assert!(!hint(&text, &old).contains('\n'));
        }
    }
}
