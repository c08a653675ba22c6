//! Digests and previews: the notable lines of a tool output that stay in context when the
//! output leaves it (a masked placeholder's digest, an offloaded output's preview).

use std::collections::HashSet;

use nerve_core::BlockId;
use nerve_core::text::clip;

use super::{ARCHIVED, notable_lines};

/// Ends the placeholder's line when a digest follows it.
pub(super) const DIGEST_HEADER: &str = "; its notable lines:";

// What a digest keeps first (lower first), in the order of the output within a rank: error
// lines with their location and values, and the exit status of a failed command; rules that
// name something (a path, a `code` span); then what the output found: a `key = value`
// setting or a path at the start of a line (a search hit, a listing), each key or path
// once, and rules in general words.
const DIGEST_ERROR: u8 = 0;
const DIGEST_RULE: u8 = 1;
const DIGEST_RARE: u8 = 2;
const DIGEST_FOUND: u8 = 3;
/// Characters of one digest line at most.
const DIGEST_LINE_CHARS: usize = 160;

/// The facts of a tool output that later turns are likely to need, in at most `max_chars`
/// characters, one per line, in the order of the output: error lines with their location
/// and values (the lines after `error[E0308]: …`, `thread … panicked at …`), the exit
/// status of a failed command, rules (`never`, `must`, …), `key = value` settings and the
/// paths found. Deterministic, and empty when nothing is notable or `max_chars` is 0. The
/// masked placeholder carries it, so that what an output established stays in context
/// after the output leaves (the reference design's "tool pair summaries"); `recall` returns
/// the rest. Errors and rules come from the pattern the extractive summary runs once over
/// each output; settings and paths are looked for only while room is left.
pub fn digest(content: &str, max_chars: usize) -> String {
    if max_chars == 0 || content.is_empty() {
        return String::new();
    }
    // (rank, order within the rank, position, line).
    let mut candidates: Vec<(u8, u32, usize, &str)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut cost = 0;
    for (start, (rank, line)) in notable_lines(content, DIGEST_ERROR, DIGEST_RULE) {
        if line.is_empty() || line.starts_with(ARCHIVED) || !seen.insert(line) {
            continue;
        }
        let rank = if rank == DIGEST_RULE && !names_something(line) {
            DIGEST_FOUND
        } else {
            rank
        };
        cost += digest_cost(line);
        candidates.push((rank, 0, start, line));
    }
    if let Some(status) = failed_status(content)
        && seen.insert(status)
    {
        cost += digest_cost(status);
        candidates.push((DIGEST_ERROR, 0, content.len(), status));
    }
    if cost < max_chars {
        for (start, line, score) in odd_lines(content) {
            if seen.insert(line) {
                cost += digest_cost(line);
                candidates.push((DIGEST_RARE, u32::MAX - score, start, line));
            }
        }
    }
    if cost < max_chars {
        let mut keys: HashSet<&str> = HashSet::new();
        let mut start = 0;
        while start < content.len() && cost < max_chars + DIGEST_LINE_CHARS {
            let end = memchr::memchr(b'\n', &content.as_bytes()[start..])
                .map_or(content.len(), |i| start + i);
            if let Some((key, text)) = found(&content[start..end])
                && keys.insert(key)
                && seen.insert(text)
            {
                cost += digest_cost(text);
                candidates.push((DIGEST_FOUND, 0, start, text));
            }
            start = end + 1;
        }
    }
    candidates.sort_by_key(|&(rank, order, start, _)| (rank, order, start));
    let mut used = 0;
    let mut chosen: Vec<(usize, &str)> = Vec::new();
    for (_, _, start, line) in candidates {
        let line = clip(line, DIGEST_LINE_CHARS);
        if used + line.len() <= max_chars {
            used += line.len() + 1;
            chosen.push((start, line));
        }
    }
    chosen.sort_by_key(|&(start, _)| start);
    chosen
        .into_iter()
        .map(|(_, line)| line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines of an output looked at for their shape, at most (the first ones): enough for a
/// listing or a log page, and a bound on the cost over a 1M-token conversation.
pub(super) const SHAPE_LINES: usize = 400;
/// Rare lines kept at most, so that a listing whose every line is odd does not fill a
/// digest with noise.
pub(super) const RARE_LINES: usize = 6;

/// The first lines of an output (at most [`SHAPE_LINES`], trimmed, not empty) with their
/// start and shape, and how many lines have each shape: `None` unless one shape makes up
/// at least half of at least eight lines (a log, a listing, a table, `pip freeze`, `env`).
/// Source code and prose have no dominant shape, and the scan stops as soon as none can
/// dominate any more.
pub(super) struct Template<'a> {
    lines: Vec<(usize, &'a str, u64)>,
    counts: std::collections::HashMap<u64, u32, ShapeHasher>,
}

pub(super) fn template(content: &str) -> Option<Template<'_>> {
    let bytes = content.as_bytes();
    // Lines the scan may still see, at most: the exit below is exact because each line
    // left can add at most one to a shape's count.
    let raw_lines = memchr::memchr_iter(b'\n', bytes).count() + 1;
    let mut raw_seen = 0;
    // Sized once: growing the table and the list line by line was a third of this scan.
    let capacity = raw_lines.min(SHAPE_LINES);
    let mut lines: Vec<(usize, &str, u64)> = Vec::with_capacity(capacity);
    let mut counts: std::collections::HashMap<u64, u32, ShapeHasher> =
        std::collections::HashMap::with_capacity_and_hasher(capacity, ShapeHasher);
    let mut dominant = 0_usize;
    let mut start = 0;
    while start < content.len() && lines.len() < SHAPE_LINES {
        let end = memchr::memchr(b'\n', &bytes[start..]).map_or(content.len(), |i| start + i);
        raw_seen += 1;
        let line = content[start..end].trim();
        if !line.is_empty() {
            let shape = line_shape(line);
            let count = counts.entry(shape).or_default();
            *count += 1;
            dominant = dominant.max(*count as usize);
            lines.push((start, line, shape));
            let left = (SHAPE_LINES - lines.len()).min(raw_lines - raw_seen);
            // No shape can make up half of the lines any more.
            if 2 * dominant + left < lines.len() {
                return None;
            }
        }
        start = end + 1;
    }
    (lines.len() >= 8 && dominant * 2 >= lines.len()).then_some(Template { lines, counts })
}

/// The first criterion of [`odd_lines`] alone: in an output made of one repeated template
/// (see [`template`]), the lines whose shape occurs once, at most [`RARE_LINES`] of them, in
/// the output's order. A line's shape is its sequence of word runs and punctuation,
/// whatever the words and numbers: `{"level":"info",…,"ms":12}` lines share one, the `warn`
/// line with other keys does not. The tests check [`template`]'s early exit with it.
#[cfg(test)]
pub(super) fn rare_lines(content: &str) -> Vec<(usize, &str)> {
    let Some(Template { lines, counts }) = template(content) else {
        return Vec::new();
    };
    let rare: Vec<(usize, &str)> = lines
        .into_iter()
        .filter(|(_, _, shape)| counts.get(shape) == Some(&1))
        .map(|(start, line, _)| (start, line))
        .collect();
    if rare.len() > RARE_LINES {
        Vec::new()
    } else {
        rare
    }
}

/// Odd lines kept at most.
pub(super) const ODD_LINES: usize = 6;

/// The lines that stand out of an output made of one repeated template (see [`template`]),
/// with how much each stands out, most first (then in the output's order), at most
/// [`ODD_LINES`]. A line scores for each way it differs from its neighbours, none of which
/// names a format:
///
/// - its shape occurs once ([`rare_lines`]; 2 points);
/// - among the lines of its shape (at least three), a word in a column that holds few
///   values (at most a quarter as many as lines, or two) occurs in no other line there:
///   the `127.0.0.1` among `0.0.0.0`, the backlog `511` among `128`, a replica count of 73
///   in a column of 1 to 8, the `com.acme` frame among `org.springframework` ones (a point
///   per column);
/// - it holds words (runs of three letters or more, `ledger_budget_ms` being three) found
///   in no other line, where at most one line in eight does: an odd key among keys drawn
///   from a small vocabulary (a point per word).
pub(super) fn odd_lines(content: &str) -> Vec<(usize, &str, u32)> {
    let Some(Template { lines, counts }) = template(content) else {
        return Vec::new();
    };
    let mut scores = vec![0_u32; lines.len()];
    let rare = lines
        .iter()
        .filter(|(_, _, shape)| counts.get(shape) == Some(&1))
        .count();
    if rare <= RARE_LINES {
        for (score, (_, _, shape)) in scores.iter_mut().zip(&lines) {
            if counts.get(shape) == Some(&1) {
                *score += 2;
            }
        }
    }
    odd_columns(&lines, &counts, &mut scores);
    odd_words(&lines, &mut scores);
    let mut odd: Vec<(usize, &str, u32)> = lines
        .iter()
        .zip(&scores)
        .filter(|(_, score)| **score > 0)
        .map(|(&(start, line, _), &score)| (start, line, score))
        .collect();
    odd.sort_by_key(|&(start, _, score)| (std::cmp::Reverse(score), start));
    odd.truncate(ODD_LINES);
    odd
}

/// The word runs of `line`, as [`line_shape`] sees them.
fn words(line: &str) -> impl Iterator<Item = &[u8]> {
    line.as_bytes()
        .split(|b| !IS_WORD[usize::from(*b)])
        .filter(|word| !word.is_empty())
}

/// A point per column in which a line's word is the odd one out among the lines of its
/// shape (see [`odd_lines`]).
fn odd_columns(
    lines: &[(usize, &str, u64)],
    counts: &std::collections::HashMap<u64, u32, ShapeHasher>,
    scores: &mut [u32],
) {
    // The lines of each shape that has at least three, in one pass.
    let mut groups: std::collections::HashMap<u64, Vec<usize>, ShapeHasher> =
        std::collections::HashMap::with_hasher(ShapeHasher);
    for (i, (_, _, shape)) in lines.iter().enumerate() {
        if counts.get(shape).is_some_and(|&n| n >= 3) {
            groups.entry(*shape).or_default().push(i);
        }
    }
    // Value → lines holding it in the column at hand; reused from column to column.
    let mut values: std::collections::HashMap<u64, u32, ShapeHasher> =
        std::collections::HashMap::with_hasher(ShapeHasher);
    // The words of a group's lines (as hashes), one flat list (a list per line was most of
    // the cost): line `r`'s words start at `starts[r]`.
    let mut flat: Vec<u64> = Vec::new();
    let mut starts: Vec<usize> = Vec::new();
    for members in groups.values() {
        flat.clear();
        starts.clear();
        for &i in members {
            starts.push(flat.len());
            flat.extend(words(lines[i].1).map(word_hash));
        }
        starts.push(flat.len());
        let columns = starts.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(0);
        let few = (members.len() / 4).max(2);
        for column in 0..columns {
            let cell = |r: usize| flat[starts[r] + column];
            values.clear();
            for r in 0..members.len() {
                *values.entry(cell(r)).or_default() += 1;
                if values.len() > few {
                    break;
                }
            }
            if values.len() > few || values.len() < 2 {
                continue;
            }
            for (r, &i) in members.iter().enumerate() {
                if values.get(&cell(r)) == Some(&1) {
                    scores[i] += 1;
                }
            }
        }
    }
}

/// FNV-1a of a word, for the tables of [`odd_columns`].
fn word_hash(word: &[u8]) -> u64 {
    word.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A point per word a line holds that no other line does, where at most one line in
/// eight holds such a word (see [`odd_lines`]). Words here are runs of letters split at
/// digits, `_` and a lower-to-upper case change, compared without case.
fn odd_words(lines: &[(usize, &str, u64)], scores: &mut [u32]) {
    // Word hash → (lines holding it, the last line that did); and each line's words, once.
    let mut seen: std::collections::HashMap<u64, (u32, usize), ShapeHasher> =
        std::collections::HashMap::with_capacity_and_hasher(lines.len() * 2, ShapeHasher);
    let mut each: Vec<(usize, u64)> = Vec::with_capacity(lines.len() * 4);
    for (i, (_, line, _)) in lines.iter().enumerate() {
        letter_words(line, |hash| {
            let entry = seen.entry(hash).or_insert((0, usize::MAX));
            if entry.1 != i {
                entry.0 += 1;
                entry.1 = i;
                each.push((i, hash));
            }
        });
    }
    let mut unique = vec![0_u32; lines.len()];
    for (i, hash) in each {
        if seen.get(&hash).is_some_and(|e| e.0 == 1) {
            unique[i] += 1;
        }
    }
    let odd = unique.iter().filter(|&&n| n > 0).count();
    if odd * 8 > lines.len() {
        return;
    }
    for (score, n) in scores.iter_mut().zip(unique) {
        *score += n;
    }
}

/// Calls `each` with the FNV hash (lowercase) of every run of at least three ASCII letters
/// in `line`, split at anything else and where a lowercase letter meets an uppercase one.
fn letter_words(line: &str, mut each: impl FnMut(u64)) {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let start = i;
        let mut hash = 0xcbf2_9ce4_8422_2325_u64;
        while i < bytes.len()
            && bytes[i].is_ascii_alphabetic()
            && !(i > start && bytes[i].is_ascii_uppercase() && bytes[i - 1].is_ascii_lowercase())
        {
            hash = (hash ^ u64::from(bytes[i].to_ascii_lowercase()))
                .wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        if i - start >= 3 {
            each(hash);
        }
    }
}

/// Shapes are FNV hashes already: the table uses them as they are.
#[derive(Clone, Copy, Default)]
struct ShapeHasher;

impl std::hash::BuildHasher for ShapeHasher {
    type Hasher = ShapeHash;

    fn build_hasher(&self) -> ShapeHash {
        ShapeHash(0)
    }
}

struct ShapeHash(u64);

impl std::hash::Hasher for ShapeHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The shape of a line: each run of letters, digits and `_` is one word, whatever it
/// holds; punctuation and spacing runs stay as they are (a run of spaces counts once).
pub(super) fn line_shape(line: &str) -> u64 {
    // FNV-1a over the classes: a few instructions a byte, where a 1M-token conversation
    // holds 3.7 MB of tool output. A word run is skipped in a tight loop, one table look-up
    // a byte: words are most of an output's bytes.
    const WORD: u8 = b'w';
    let step = |hash: u64, class: u8| (hash ^ u64::from(class)).wrapping_mul(0x0000_0100_0000_01b3);
    let bytes = line.as_bytes();
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut last = 0_u8;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        i += 1;
        if IS_WORD[usize::from(byte)] {
            if last != WORD {
                hash = step(hash, WORD);
                last = WORD;
            }
            while i < bytes.len() && IS_WORD[usize::from(bytes[i])] {
                i += 1;
            }
        } else if !(byte == b' ' && last == b' ') {
            hash = step(hash, byte);
            last = byte;
        }
    }
    hash
}

/// The bytes that belong to a word for [`line_shape`]: ASCII letters and digits, `_`, and
/// every byte of a non-ASCII character.
static IS_WORD: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_alphanumeric() || byte == b'_' || byte >= 0x80;
        b += 1;
    }
    table
};

/// What a line found, as (key, text): a path at its start, with the line number when one
/// follows (`rg -n`, `find`, `ls`), or a `key = value` setting. Only the line's first word is
/// looked at, so that the bulk of an output costs little more than finding its line breaks.
pub(super) fn found(line: &str) -> Option<(&str, &str)> {
    let line = line.trim();
    let bytes = line.as_bytes();
    let first = *bytes.first()?;
    if !(first.is_ascii_alphanumeric() || matches!(first, b'_' | b'.')) {
        return None;
    }
    let word_end = bytes
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/')))
        .unwrap_or(bytes.len());
    let word = &line[..word_end];
    if word.contains('/') {
        let name = word.rsplit('/').next().unwrap_or_default();
        let is_file = name.rsplit_once('.').is_some_and(|(stem, extension)| {
            let extension = extension.as_bytes();
            !stem.is_empty()
                && (1..=6).contains(&extension.len())
                && extension[0].is_ascii_alphabetic()
                && extension.iter().all(u8::is_ascii_alphanumeric)
        });
        if !is_file {
            return None;
        }
        // With the line number: `src/x.rs:41`.
        let digits = bytes[word_end..].strip_prefix(b":").map_or(0, |rest| {
            rest.iter().take_while(|b| b.is_ascii_digit()).count()
        });
        let end = if digits > 0 {
            word_end + 1 + digits
        } else {
            word_end
        };
        return Some((word, &line[..end]));
    }
    // A setting: `key = value`, not `a == b`.
    let value = line[word_end..]
        .trim_start_matches([' ', '\t'])
        .strip_prefix('=')?;
    let is_key = first.is_ascii_alphabetic() || first == b'_';
    (is_key && !value.starts_with('=') && !value.trim().is_empty()).then_some((word, line))
}

fn digest_cost(line: &str) -> usize {
    line.len().min(DIGEST_LINE_CHARS) + 1
}

/// Whether a rule names what it is about: a path or a `code` span, rather than general
/// words such as a doc comment's "errors are never printed".
fn names_something(line: &str) -> bool {
    line.contains('`') || line.contains('/')
}

/// The status line of a command that failed (`[exit code: 2]`, `[killed by signal 9]`),
/// as the sandbox's shell tool ends its output.
fn failed_status(content: &str) -> Option<&str> {
    let last = content.trim_end().rsplit('\n').next()?.trim();
    let failed = last
        .strip_prefix("[exit code: ")
        .is_some_and(|rest| rest != "0]")
        || last.starts_with("[killed by signal ")
        || last == "[exit status unknown]";
    failed.then_some(last)
}

/// The preview left in the conversation for an offloaded tool output: its head and tail
/// and, within `digest_chars`, the [`digest`] of the middle left out, where a long log
/// tends to hold its first error.
pub fn preview(content: &str, chars: usize, block: BlockId, digest_chars: usize) -> String {
    let total = content.chars().count();
    let at = |n: usize| {
        content
            .char_indices()
            .nth(n)
            .map_or(content.len(), |(i, _)| i)
    };
    let head_chars = (chars * 2 / 3).min(total);
    let head_end = at(head_chars);
    let tail_start = at(total.saturating_sub(chars / 3).max(head_chars));
    let (head, middle, tail) = (
        &content[..head_end],
        &content[head_end..tail_start],
        &content[tail_start..],
    );
    // The middle's whole lines: a line cut by the head or the tail shows there, and as a
    // fragment it would stand out of the rest for nothing.
    let whole = middle.find('\n').map_or("", |first| {
        let rest = &middle[first + 1..];
        rest.rfind('\n').map_or("", |last| &rest[..last])
    });
    let kept = digest(whole, digest_chars);
    let gap = if kept.is_empty() {
        "[...]".to_owned()
    } else {
        format!("[... notable lines of the part left out:]\n{kept}\n[...]")
    };
    format!(
        "{ARCHIVED}{total} characters, archived as block {block}; call recall with this block_id for all of it]\n{head}\n{gap}\n{tail}"
    )
}
