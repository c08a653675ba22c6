//! The context window and what keeps a request inside it: the window (the conversation and
//! its token counts), the compaction plan and its digests, the compactor that carries a
//! plan out (archive, mask, summarise, recall), relevance-driven recall, epistemic markers,
//! and the in-memory archive.

pub mod compaction_plan;
pub(crate) mod compactor;
pub mod epistemic;
pub mod memory_archive;
pub(crate) mod relevance;
pub(crate) mod window;
