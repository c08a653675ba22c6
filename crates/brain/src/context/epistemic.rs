//! Epistemic markers: the words with which a model hedges, reconsiders, doubts, verifies and
//! corrects itself. Messages rich in them carry reasoning that later turns depend on, so
//! compaction keeps them verbatim (from the seeds: five groups; a message counts the groups
//! it matches).

use std::sync::LazyLock;

use nerve_core::Complexity;
use regex::Regex;

/// The five groups, in order: hedging, reconsideration, uncertainty, verification, correction.
static GROUPS: LazyLock<[Regex; 5]> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant patterns, compiled by every test of this module.
    let compile = |pattern: &str| Regex::new(pattern).expect("valid epistemic pattern");
    [
        compile(r"(?i)\b(wait|hmm|actually|hm|ah)\b"),
        compile(r"(?i)\b(let me reconsider|on second thought|i was wrong)\b"),
        compile(r"(?i)(\b(perhaps|alternatively|uncertain)\b|\bi'm not sure\b|\bi am not sure\b)"),
        compile(r"(?i)\b(check|verify|double-check|let me verify)\b"),
        compile(r"(?i)\b(but wait|actually no|hold on)\b"),
    ]
});

/// How many of the five groups `text` matches (0..=5).
pub fn marker_groups(text: &str) -> usize {
    GROUPS.iter().filter(|group| group.is_match(text)).count()
}

/// Whether `text` matches at least `threshold` of the five groups, as
/// `marker_groups(text) >= threshold`, but stopping as soon as the answer is known: a plan
/// asks this of every message of a long conversation, and most match none.
pub fn matches_groups(text: &str, threshold: usize) -> bool {
    let mut found = 0;
    for (checked, group) in GROUPS.iter().enumerate() {
        if found >= threshold {
            return true;
        }
        if found + (GROUPS.len() - checked) < threshold {
            return false;
        }
        found += usize::from(group.is_match(text));
    }
    found >= threshold
}

/// The groups a message must match to be kept verbatim: complex work depends on its
/// reasoning more, so one group suffices there.
pub fn keep_threshold(complexity: Option<Complexity>) -> usize {
    match complexity {
        Some(Complexity::Complex | Complexity::Epic) => 1,
        Some(Complexity::Simple | Complexity::Medium) | None => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, groups: usize) {
        assert_eq!(marker_groups(text), groups, "{text}");
        for threshold in 0..=GROUPS.len() + 1 {
            assert_eq!(
                matches_groups(text, threshold),
                groups >= threshold,
                "{text}, threshold {threshold}"
            );
        }
    }

    #[test]
    fn group_counting() {
        check("The build passed.", 0);
        check("Hmm, the build passed.", 1);
        check("Wait, let me reconsider: perhaps the cache is stale.", 3);
        check(
            "Hmm. On second thought I'm not sure; let me verify. But wait, hold on.",
            5,
        );
        check("checking", 0);
        check("Let me check the logs", 1);
        check("HMM", 1);
    }

    #[test]
    fn thresholds_by_complexity() {
        assert_eq!(keep_threshold(Some(Complexity::Simple)), 3);
        assert_eq!(keep_threshold(Some(Complexity::Medium)), 3);
        assert_eq!(keep_threshold(Some(Complexity::Complex)), 1);
        assert_eq!(keep_threshold(Some(Complexity::Epic)), 1);
        assert_eq!(keep_threshold(None), 3);
    }
}
