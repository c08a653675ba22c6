//! The engine end to end in-process: the loops, compaction, the prompt prefix, and the
//! agent as a whole under random runs (a fuzz target).

mod compaction_tests;
mod engine_fuzz;
mod loop_tests;
mod prefix_tests;
