//! The engine end to end in-process: the loops, compaction, the prompt prefix, and the
//! agent as a whole under random runs (a fuzz target).

mod compaction_tests;
mod engine_fuzz;
mod loop_tests;
mod prefix_tests;

/// `PROPTEST_CASES` when set (the fuzz passes set it), else `default`: for properties whose
/// cases are whole runs, too slow for proptest's 256 in an ordinary `cargo test`.
pub(crate) fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}
