//! The executor's size and count caps.

/// Size and count caps. Every one bounds either the executor's memory or a response's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The most content bytes one `read_file` response carries.
    pub max_read_bytes: usize,
    /// Lines `read_file` returns when the request gives no `limit`.
    pub read_lines: u64,
    /// The largest file `write_file` writes and `edit_file` reads or writes.
    pub max_file_bytes: u64,
    /// Entries `list_dir` returns at most.
    pub max_list_entries: usize,
    /// Matching lines `grep` returns at most.
    pub max_grep_matches: usize,
    /// Files larger than this are skipped by `grep`.
    pub max_grep_file_bytes: u64,
    /// Files `grep` opens at most per request.
    pub max_grep_files: u64,
    /// Bytes of one matching line that `grep` shows.
    pub max_grep_line_bytes: usize,
    /// Upper bound on `exec`'s `max_output_bytes`, whatever the request says.
    pub max_output_bytes: u64,
    /// The longest request line accepted (`write_file` content is inside it, JSON-escaped).
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_read_bytes: 256 * 1024,
            read_lines: 2000,
            max_file_bytes: 16 * 1024 * 1024,
            max_list_entries: 1000,
            max_grep_matches: 500,
            max_grep_file_bytes: 4 * 1024 * 1024,
            max_grep_files: 50_000,
            max_grep_line_bytes: 400,
            max_output_bytes: 16 * 1024 * 1024,
            max_request_bytes: 128 * 1024 * 1024,
        }
    }
}
