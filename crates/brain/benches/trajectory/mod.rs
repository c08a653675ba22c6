//! Seeded agent trajectories with planted facts, for the compaction benchmarks.
//!
//! A trajectory is what a coding agent's run looks like from the engine: a task, then turns
//! of assistant text with one tool call each, and the tool outputs those calls produce
//! (build and test logs, searches, source files, configuration, docs, patches). Facts of
//! five kinds are planted in it — file paths, error messages, numbers, decisions and
//! constraints — and a later turn's text refers to each one without repeating it ("the fix
//! needs the error from schema_guard.rs"), so the fact is needed then. Some facts are
//! restated by the assistant right after it sees them, as models often do; most live only in
//! a tool output. Everything comes from one seed: a seed gives the same trajectory on every
//! machine.

#![allow(dead_code, unreachable_pub)] // Each benchmark uses part of this module.

use std::collections::HashMap;
use std::fmt::Write as _;

use fastrand::Rng;
use nerve_core::{Message, MessagePart, MessageRole, ToolCall, ToolCallId, ToolResult};

pub mod second;

/// The kinds of planted facts: the first generator's five, then the second's ten
/// ([`second::KINDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Path,
    Error,
    Number,
    Decision,
    Constraint,
    Identifier,
    StackLocation,
    TableCell,
    Version,
    Port,
    TodoOwner,
    EnvVar,
    Commit,
    JavaCause,
    JsonField,
}

impl Kind {
    pub const ALL: [Self; 5] = [
        Self::Path,
        Self::Error,
        Self::Number,
        Self::Decision,
        Self::Constraint,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Path => "path",
            Self::Error => "error",
            Self::Number => "number",
            Self::Decision => "decision",
            Self::Constraint => "constraint",
            Self::Identifier => "request id",
            Self::StackLocation => "traceback location",
            Self::TableCell => "table cell",
            Self::Version => "version",
            Self::Port => "port",
            Self::TodoOwner => "TODO owner",
            Self::EnvVar => "env variable",
            Self::Commit => "commit",
            Self::JavaCause => "Java frame and cause",
            Self::JsonField => "JSON field",
        }
    }
}

/// One planted fact.
#[derive(Debug, Clone)]
pub struct Fact {
    pub kind: Kind,
    /// Exact strings that must all be present for the fact to count as present.
    pub needles: Vec<String>,
    /// The fact in one sentence, as a careful summary states it (it holds every needle).
    pub statement: String,
    /// What the agent knows when it needs the fact: the words of its `recall` query.
    pub query: String,
    /// The turn (1-based) whose tool output or text carries the fact.
    pub planted: usize,
    /// The later turn whose text refers to it.
    pub needed: usize,
    /// Whether the assistant restates it in the turn after it appears.
    pub restated: bool,
}

impl Fact {
    /// Whether `haystack` holds every needle.
    pub fn is_in(&self, haystack: &str) -> bool {
        self.needles
            .iter()
            .all(|needle| haystack.contains(needle.as_str()))
    }
}

/// One turn: the assistant's text and tool call, and what the tool answers.
#[derive(Debug, Clone)]
pub struct Turn {
    pub text: String,
    pub call_id: String,
    pub tool: &'static str,
    pub arguments: serde_json::Value,
    pub output: String,
    pub is_error: bool,
}

/// A generated run.
#[derive(Debug, Clone)]
pub struct Trajectory {
    pub seed: u64,
    pub task: String,
    pub turns: Vec<Turn>,
    pub final_answer: String,
    pub facts: Vec<Fact>,
}

/// What the tool outputs around the planted facts look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noise {
    /// The generator's original noise, behind the main retention table: build and test logs
    /// whose only errors and failures are planted ones, configuration files drawing from 14
    /// keys, doc rules that never name a path or a `code` span. A digest that keeps errors,
    /// named rules and one line per key has an easy time with it.
    Synthetic,
    /// Noise shaped like real tool output, to see how far the synthetic figures carry over:
    /// half of the builds and test runs fail with several unrelated errors or failing tests,
    /// each with its location (a planted one comes with 1 to 5 others); configuration files
    /// hold 40 to 80 distinct keys; half of the doc lines are rules naming a path or a
    /// `code` span; source and search results include error handling, panics and comments
    /// with "must" or "never", and searches list files under `tests/` and `benches/` too.
    /// Planted facts are the same as with [`Noise::Synthetic`].
    Realistic,
}

/// Size of a trajectory.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub turns: usize,
    pub facts_per_kind: usize,
    /// Multiplies every tool output's size.
    pub output_scale: f64,
    /// Share of facts the assistant restates in its next message.
    pub restate_share: f64,
    pub noise: Noise,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            turns: 120,
            facts_per_kind: 5,
            output_scale: 1.0,
            restate_share: 0.3,
            noise: Noise::Synthetic,
        }
    }
}

impl Trajectory {
    /// The cassette of the agent's answers: one line per turn, then the final answer.
    /// Usage is given so that the scripted provider does not estimate every request.
    pub fn cassette(&self) -> String {
        let mut lines: Vec<String> = self
            .turns
            .iter()
            .map(|turn| {
                serde_json::json!({
                    "text": turn.text,
                    "tool_calls": [{"id": turn.call_id, "name": turn.tool, "arguments": turn.arguments}],
                    "usage": {"input_tokens": 1000, "output_tokens": 100},
                })
                .to_string()
            })
            .collect();
        lines.push(
            serde_json::json!({"text": self.final_answer, "usage": {"input_tokens": 1000, "output_tokens": 50}})
                .to_string(),
        );
        lines.join("\n")
    }

    /// Call id → (output, is_error), for the fake tool executor.
    pub fn outputs(&self) -> HashMap<String, (String, bool)> {
        self.turns
            .iter()
            .map(|turn| (turn.call_id.clone(), (turn.output.clone(), turn.is_error)))
            .collect()
    }

    /// The conversation as the engine builds it without compaction: `system`, the pinned
    /// task, then an assistant message and a tool result per turn.
    pub fn messages(&self, system: &str) -> Vec<Message> {
        let mut messages = vec![Message::system(system), Message::user(&self.task).pinned()];
        for turn in &self.turns {
            let id = ToolCallId(turn.call_id.clone());
            messages.push(Message {
                role: MessageRole::Assistant,
                parts: vec![
                    MessagePart::Text {
                        text: turn.text.clone(),
                    },
                    MessagePart::ToolCall(ToolCall {
                        id: id.clone(),
                        name: turn.tool.into(),
                        arguments: turn.arguments.clone(),
                    }),
                ],
                pinned: false,
            });
            messages.push(Message::tool_result(ToolResult {
                call_id: id,
                name: turn.tool.into(),
                content: turn.output.clone(),
                is_error: turn.is_error,
            }));
        }
        messages
    }

    /// Facts whose reference is in turn `turn`.
    pub fn needed_at(&self, turn: usize) -> impl Iterator<Item = (usize, &Fact)> {
        self.facts
            .iter()
            .enumerate()
            .filter(move |(_, f)| f.needed == turn)
    }
}

/// Everything of a message that reaches the model, as one string: texts, tool calls with
/// their arguments, tool results, summaries.
pub fn haystack(messages: &[Message]) -> String {
    let mut out = String::new();
    for message in messages {
        for part in &message.parts {
            match part {
                MessagePart::Text { text }
                | MessagePart::Thinking { text, .. }
                | MessagePart::CompactionSummary { text, .. } => out.push_str(text),
                MessagePart::ToolCall(call) => {
                    out.push_str(&call.name);
                    out.push(' ');
                    out.push_str(&call.arguments.to_string());
                }
                MessagePart::ToolResult(result) => out.push_str(&result.content),
            }
            out.push('\n');
        }
    }
    out
}

// Vocabulary. Noise draws from these pools; facts draw from the `FACT_*` pools, which no
// noise uses, so a needle is found only where it was planted.
const CRATES: [&str; 10] = [
    "billing",
    "ledger",
    "api",
    "db",
    "auth",
    "export",
    "scheduler",
    "notify",
    "search",
    "storage",
];
const MODULES: [&str; 25] = [
    "invoice", "schema", "pool", "session", "token", "cursor", "queue", "retry", "rate", "csv",
    "report", "tax", "user", "audit", "cache", "config", "worker", "handler", "router", "metrics",
    "client", "server", "codec", "error", "model",
];
const IDENTS: [&str; 24] = [
    "row",
    "limit",
    "offset",
    "account_id",
    "amount",
    "currency",
    "total",
    "batch",
    "entry",
    "conn",
    "tx",
    "buf",
    "req",
    "resp",
    "ctx",
    "state",
    "cfg",
    "id",
    "key",
    "value",
    "items",
    "count",
    "deadline",
    "attempt",
];
const TYPES: [&str; 19] = [
    "Invoice",
    "LedgerEntry",
    "Account",
    "Session",
    "Pool",
    "Row",
    "Request",
    "Response",
    "Config",
    "Error",
    "Report",
    "Batch",
    "Cursor",
    "Money",
    "Currency",
    "Token",
    "Claims",
    "Job",
    "Queue",
];
const VERBS: [&str; 12] = [
    "load", "store", "parse", "render", "apply", "build", "fetch", "flush", "check", "merge",
    "split", "encode",
];
const DEPS: [&str; 30] = [
    "serde",
    "serde_json",
    "tokio",
    "hyper",
    "rustls",
    "ring",
    "regex",
    "memchr",
    "bytes",
    "tracing",
    "thiserror",
    "uuid",
    "chrono",
    "sqlx",
    "axum",
    "tower",
    "futures",
    "itoa",
    "ryu",
    "libc",
    "once_cell",
    "smallvec",
    "parking_lot",
    "mio",
    "socket2",
    "http",
    "h2",
    "base64",
    "rand",
    "getrandom",
];
const CONFIG_KEYS: [&str; 14] = [
    "enabled",
    "port",
    "host",
    "workers",
    "log_level",
    "timeout_s",
    "retries",
    "path",
    "region",
    "max_body_kb",
    "tls",
    "queue_depth",
    "sample_rate",
    "backlog",
];
const PROSE: [&str; 24] = [
    "Every public function has a doc comment that says what it is for.",
    "Errors are returned, never printed; the binary decides how to show them.",
    "Keep modules small and give each one a single job.",
    "Tests live next to the code they test, in a tests module at the end of the file.",
    "Run the formatter and the linter before you push; CI rejects warnings.",
    "Prefer owned types at API boundaries and borrow inside a module.",
    "Log with tracing at the debug level for details and info for milestones.",
    "A pull request changes one thing and says why in its description.",
    "Benchmarks are not tests: never assert on timing in a test.",
    "Configuration is read once at start and validated before anything runs.",
    "Database access goes through the repository types, not raw queries in handlers.",
    "Background jobs are idempotent: a retried job must not charge twice.",
    "Money is formatted only at the edges, for display, in the user's locale.",
    "Feature flags are removed within two releases of being turned on everywhere.",
    "The API returns problem details for every error, with a stable type URI.",
    "Time is always UTC inside the services; convert at the edges.",
    "New endpoints need an entry in the changelog and the OpenAPI document.",
    "Secrets come from the environment and are never written to logs.",
    "Each service owns its tables; other services use its API.",
    "Long-running requests report progress through the job status endpoint.",
    "Retries use exponential backoff with jitter and a ceiling.",
    "Metrics names are snake case and carry the service name as a prefix.",
    "A migration that locks a large table needs a plan reviewed by the on-call team.",
    "Code review looks at behaviour first, style last.",
];
const FACT_NAMES: [&str; 32] = [
    "schema_guard",
    "ledger_sync",
    "invoice_rounding",
    "tax_brackets",
    "currency_fmt",
    "batch_cursor",
    "retry_window",
    "token_bucket",
    "audit_trail",
    "export_manifest",
    "row_decoder",
    "fx_rates",
    "dunning",
    "proration",
    "refund_flow",
    "webhook_sign",
    "idempotency",
    "pagination",
    "tenant_scope",
    "quota_meter",
    "statement_pdf",
    "ledger_close",
    "vat_rules",
    "payout_batch",
    "charge_retry",
    "card_vault",
    "usage_rollup",
    "plan_migrate",
    "credit_notes",
    "revenue_split",
    "settlement",
    "chargeback",
];
const FACT_KEYS: [&str; 16] = [
    "export_batch_rows",
    "ledger_flush_ms",
    "max_open_cursors",
    "webhook_timeout_ms",
    "retry_ceiling_ms",
    "invoice_page_size",
    "fx_cache_ttl_s",
    "payout_window_h",
    "dunning_max_attempts",
    "quota_burst",
    "pool_idle_timeout_ms",
    "statement_chunk_kb",
    "refund_grace_days",
    "audit_retention_days",
    "vault_rotation_h",
    "rollup_interval_s",
];
/// (subject, chosen identifier, the rejected alternative, the reason).
const FACT_DECISIONS: [(&str, &str, &str, &str); 12] = [
    (
        "export batching",
        "RowStreamer",
        "buffering the whole export in a Vec",
        "exports reach several gigabytes",
    ),
    (
        "ledger locking",
        "AdvisoryLockGuard",
        "a table lock",
        "the nightly close must not block writes",
    ),
    (
        "currency conversion",
        "FxSnapshot",
        "live rates per row",
        "a statement must use one rate throughout",
    ),
    (
        "retry scheduling",
        "JitteredBackoff",
        "a fixed delay",
        "fixed delays made the workers retry in lockstep",
    ),
    (
        "invoice numbering",
        "GaplessSequence",
        "database serials",
        "auditors require gapless numbers",
    ),
    (
        "webhook signing",
        "HmacSha256Signer",
        "per-tenant RSA keys",
        "partners only support shared secrets",
    ),
    (
        "tenant isolation",
        "TenantScopedPool",
        "a tenant_id filter in every query",
        "a missed filter leaks data",
    ),
    (
        "refund accounting",
        "ReversalEntry",
        "deleting the original entry",
        "the ledger is append-only",
    ),
    (
        "rate limiting",
        "SlidingWindowCounter",
        "a token bucket per request",
        "bursts at the minute boundary passed the limit",
    ),
    (
        "statement rendering",
        "TemplatePipeline",
        "string concatenation",
        "translations need placeholders",
    ),
    (
        "usage aggregation",
        "HourlyRollup",
        "summing raw events on read",
        "reads took seconds for large tenants",
    ),
    (
        "payout batching",
        "CutoffScheduler",
        "paying out per transaction",
        "bank fees are per batch",
    ),
];
const ERRORS: [(&str, &str); 6] = [
    ("E0308", "mismatched types"),
    ("E0382", "borrow of moved value"),
    ("E0599", "no method named `apply` found for struct"),
    ("E0425", "cannot find value in this scope"),
    ("E0277", "the trait bound is not satisfied"),
    (
        "E0061",
        "this function takes 3 arguments but 2 arguments were supplied",
    ),
];

// Vocabulary of realistic noise (`Noise::Realistic`), also kept apart from the `FACT_*`
// pools.
const NOISE_ERRORS: [(&str, &str, &str); 10] = [
    ("E0308", "mismatched types", "expected `u32`, found `i64`"),
    (
        "E0382",
        "borrow of moved value",
        "value borrowed here after move",
    ),
    (
        "E0599",
        "no method named `get_mut` found for reference",
        "method not found",
    ),
    (
        "E0425",
        "cannot find value `conn` in this scope",
        "not found in this scope",
    ),
    (
        "E0277",
        "the `?` operator can only be used in a function that returns `Result`",
        "cannot use the `?` operator",
    ),
    (
        "E0061",
        "this method takes 2 arguments but 1 argument was supplied",
        "an argument is missing",
    ),
    (
        "E0433",
        "failed to resolve: use of undeclared type `Utc`",
        "use of undeclared type",
    ),
    (
        "E0502",
        "cannot borrow `self.items` as mutable because it is also borrowed as immutable",
        "mutable borrow occurs here",
    ),
    (
        "E0106",
        "missing lifetime specifier",
        "expected named lifetime parameter",
    ),
    (
        "E0560",
        "struct `Config` has no field named `timeout`",
        "unknown field",
    ),
];
const CONFIG_PREFIXES: [&str; 18] = [
    "http",
    "grpc",
    "db",
    "cache",
    "queue",
    "worker",
    "auth",
    "export",
    "metrics",
    "log",
    "tls",
    "smtp",
    "s3",
    "redis",
    "search",
    "scheduler",
    "session",
    "upload",
];
const CONFIG_SUFFIXES: [&str; 18] = [
    "enabled",
    "port",
    "host",
    "timeout_ms",
    "max_connections",
    "retries",
    "backoff_ms",
    "batch_size",
    "buffer_kb",
    "interval_s",
    "path",
    "level",
    "ttl_s",
    "region",
    "endpoint",
    "pool_size",
    "queue_depth",
    "sample_rate",
];
const TEST_SUFFIXES: [&str; 5] = [
    "works",
    "rejects_empty",
    "round_trips",
    "is_stable",
    "handles_errors",
];

/// What a turn does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Build,
    Test,
    Read,
    Grep,
    Config,
    Docs,
    Patch,
}

struct Gen {
    rng: Rng,
    names: Vec<&'static str>,
    keys: Vec<&'static str>,
    decisions: Vec<(&'static str, &'static str, &'static str, &'static str)>,
    used_numbers: Vec<u32>,
    scale: f64,
    noise: Noise,
}

impl Gen {
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.rng.usize(..items.len())]
    }

    fn noise_path(&mut self) -> String {
        let krate = self.pick(&CRATES);
        let module = self.pick(&MODULES);
        if self.rng.bool() {
            format!("crates/{krate}/src/{module}.rs")
        } else {
            let sub = self.pick(&MODULES);
            format!("crates/{krate}/src/{module}/{sub}.rs")
        }
    }

    /// A path as real searches list them: sources, but also tests and benchmarks.
    fn realistic_path(&mut self) -> String {
        let krate = self.pick(&CRATES);
        let module = self.pick(&MODULES);
        match self.rng.u32(..6) {
            0 => format!("crates/{krate}/tests/{module}.rs"),
            1 => format!("crates/{krate}/benches/{module}.rs"),
            2 | 3 => format!("crates/{krate}/src/{module}.rs"),
            _ => {
                let sub = self.pick(&MODULES);
                format!("crates/{krate}/src/{module}/{sub}.rs")
            }
        }
    }

    /// A number of noise errors or failing tests in a log: with realistic noise, half of
    /// the logs without a planted failure fail with 2 to 6, and a planted one comes with 1 to
    /// 5 others. None with synthetic noise.
    fn noise_failures(&mut self, planted: bool) -> usize {
        match self.noise {
            Noise::Synthetic => 0,
            Noise::Realistic if planted => self.rng.usize(1..=5),
            Noise::Realistic if self.rng.bool() => self.rng.usize(2..=6),
            Noise::Realistic => 0,
        }
    }

    fn fact_name(&mut self) -> &'static str {
        self.names.pop().unwrap_or("settlement")
    }

    /// A number of 4 or 5 digits, never used before in this trajectory; noise numbers stay
    /// below 1,000, so it is found only where it was planted.
    fn fact_number(&mut self) -> u32 {
        loop {
            let n = self.rng.u32(1_200..98_000);
            if !self.used_numbers.contains(&n) {
                self.used_numbers.push(n);
                return n;
            }
        }
    }

    /// A size in characters for `action`'s output (about 3.3 characters per token).
    fn size(&mut self, action: Action) -> usize {
        let (low, high) = match action {
            Action::Build => (200, 2_400),
            Action::Test => (150, 2_000),
            Action::Read => (300, 3_000),
            Action::Grep => (80, 900),
            Action::Config => (150, 500),
            Action::Docs => (300, 1_500),
            Action::Patch => (10, 30),
        };
        // Now and then a huge log: the engine offloads those at once.
        let tokens = if matches!(action, Action::Build | Action::Test) && self.rng.u32(..100) < 4 {
            self.rng.usize(4_500..7_000)
        } else {
            // Skewed towards the small end, as real outputs are.
            let u = self.rng.f64();
            low + ((high - low) as f64 * u * u) as usize
        };
        (tokens as f64 * 3.3 * self.scale) as usize
    }

    fn code_line(&mut self) -> String {
        // Real code handles failures, and says what must hold: a fifth of the lines.
        if self.noise == Noise::Realistic && self.rng.u32(..5) == 0 {
            return self.failure_code_line();
        }
        let ident = self.pick(&IDENTS);
        let ty = self.pick(&TYPES);
        let verb = self.pick(&VERBS);
        match self.rng.u32(..8) {
            0 => format!(
                "    pub fn {verb}_{ident}(&self, {ident}: &{ty}) -> Result<{ty}, Error> {{"
            ),
            1 => {
                format!("        let {ident} = self.{ident}.get(&{ident}).ok_or(Error::Missing)?;")
            }
            2 => format!("        Ok({ty}::from({ident}))"),
            3 => "    }".to_owned(),
            4 => format!("use crate::{}::{ty};", self.pick(&MODULES)),
            5 => format!("    /// {}", self.pick(&PROSE)),
            6 => format!("        if {ident}.is_empty() {{ return Err(Error::Empty); }}"),
            _ => format!(
                "        self.{verb}_{ident}({ident}, {})?;",
                self.rng.u32(..100)
            ),
        }
    }

    /// A line of source code with words a digest looks for: a failure, a panic, a rule.
    fn failure_code_line(&mut self) -> String {
        let ident = self.pick(&IDENTS);
        let verb = self.pick(&VERBS);
        let module = self.pick(&MODULES);
        match self.rng.u32(..7) {
            0 => format!(
                "        .map_err(|e| Error::Io(format!(\"failed to {verb} {ident}: {{e}}\")))?;"
            ),
            1 => format!("        tracing::warn!(%{ident}, \"cannot {verb} {ident}, retrying\");"),
            2 => {
                format!("    // `{ident}` must never be negative here: `{verb}_{ident}` checks it.")
            }
            3 => format!("        None => panic!(\"{ident} not found in {module}\"),"),
            4 => format!("        assert!({ident} < limit, \"{ident} must be below the limit\");"),
            5 => format!("    /// Returns an error if the {ident} cannot be read."),
            _ => format!("        .expect(\"{ident} is always set by {verb}_{ident}\")"),
        }
    }

    /// An unrelated compiler error with its location, as rustc prints it.
    fn noise_error(&mut self) -> String {
        let (code, message, label) = self.pick(&NOISE_ERRORS);
        let path = self.realistic_path();
        let line = self.rng.u32(1..999);
        let col = self.rng.u32(1..80);
        let code_line = self.code_line();
        format!(
            "error[{code}]: {message}\n  --> {path}:{line}:{col}\n   |\n{line} | {}\n   |     ^^^^ {label}",
            code_line.trim_start()
        )
    }

    /// An unrelated failing test: its `FAILED` line and its output, with the location.
    fn noise_test_failure(&mut self) -> String {
        let module = self.pick(&MODULES);
        let test = format!(
            "{module}::tests::{}_{}_{}",
            self.pick(&VERBS),
            self.pick(&IDENTS),
            self.pick(&TEST_SUFFIXES)
        );
        let path = self.realistic_path();
        let line = self.rng.u32(1..999);
        let col = self.rng.u32(1..80);
        let detail = if self.rng.bool() {
            let left = self.rng.u32(..999);
            format!(
                "assertion `left == right` failed\n  left: {left}\n right: {}",
                self.rng.u32(..999)
            )
        } else {
            format!(
                "called `Result::unwrap()` on an `Err` value: {}(\"{}\")",
                self.pick(&["NotFound", "Timeout", "Invalid", "Conflict"]),
                self.pick(&IDENTS)
            )
        };
        format!(
            "test {test} ... FAILED\n\nfailures:\n\n---- {test} stdout ----\nthread '{test}' panicked at {path}:{line}:{col}:\n{detail}"
        )
    }

    fn warning(&mut self) -> String {
        let ident = self.pick(&IDENTS);
        let path = self.noise_path();
        let line = self.rng.u32(1..999);
        let col = self.rng.u32(1..80);
        format!(
            "warning: unused variable: `{ident}`\n  --> {path}:{line}:{col}\n   |\n{line} |     let {ident} = {};\n   |         ^^^ help: if this is intentional, prefix it with an underscore: `_{ident}`\n   |\n   = note: `#[warn(unused_variables)]` on by default",
            self.code_expr()
        )
    }

    fn code_expr(&mut self) -> String {
        format!(
            "{}.{}_{}()",
            self.pick(&IDENTS),
            self.pick(&VERBS),
            self.pick(&IDENTS)
        )
    }

    /// Fills lines up to `chars`, with `planted` at a random place among them.
    fn fill(
        &mut self,
        chars: usize,
        planted: Option<String>,
        line: impl FnMut(&mut Self) -> String,
    ) -> String {
        self.fill_among(chars, Vec::new(), planted, line)
    }

    /// Fills lines up to `chars`, then puts each of `extra` and then `planted` at a random
    /// place among them.
    fn fill_among(
        &mut self,
        chars: usize,
        extra: Vec<String>,
        planted: Option<String>,
        mut line: impl FnMut(&mut Self) -> String,
    ) -> String {
        let mut lines = Vec::new();
        let mut len = 0;
        while len < chars {
            let next = line(self);
            len += next.len() + 1;
            lines.push(next);
        }
        for extra in extra {
            let at = self.rng.usize(..=lines.len());
            lines.insert(at, extra);
        }
        if let Some(planted) = planted {
            let at = self.rng.usize(..=lines.len());
            lines.insert(at, planted);
        }
        lines.join("\n")
    }

    /// A build log, and whether the build failed.
    fn build_log(&mut self, krate: &str, chars: usize, error: Option<String>) -> (String, bool) {
        let others = self.noise_failures(error.is_some());
        let errors: Vec<String> = (0..others).map(|_| self.noise_error()).collect();
        let count = errors.len() + usize::from(error.is_some());
        let failed = count > 0;
        let mut out = self.fill_among(chars, errors, error, |g| {
            if g.rng.u32(..4) == 0 {
                g.warning()
            } else {
                format!(
                    "   Compiling {} v{}.{}.{}",
                    g.pick(&DEPS),
                    g.rng.u32(..3),
                    g.rng.u32(..40),
                    g.rng.u32(..30)
                )
            }
        });
        if count > 1 {
            let _ = write!(
                out,
                "\nerror: could not compile `{krate}` (lib) due to {count} previous errors; {} warnings emitted",
                self.rng.u32(1..20)
            );
        } else if failed {
            let _ = write!(
                out,
                "\nerror: could not compile `{krate}` (lib) due to 1 previous error; {} warnings emitted",
                self.rng.u32(1..20)
            );
        } else {
            let _ = write!(
                out,
                "\n    Finished `dev` profile [unoptimized + debuginfo] target(s) in {}.{:02}s",
                self.rng.u32(1..90),
                self.rng.u32(..100)
            );
        }
        (out, failed)
    }

    /// A test run's log, and whether it failed.
    fn test_log(&mut self, krate: &str, chars: usize, failure: Option<String>) -> (String, bool) {
        let others = self.noise_failures(failure.is_some());
        let failures: Vec<String> = (0..others).map(|_| self.noise_test_failure()).collect();
        let count = failures.len() + usize::from(failure.is_some());
        let failed = count > 0;
        let mut passed = 0;
        let body = self.fill_among(chars, failures, failure, |g| {
            passed += 1;
            format!(
                "test {}::tests::{}_{}_{} ... ok",
                g.pick(&MODULES),
                g.pick(&VERBS),
                g.pick(&IDENTS),
                g.pick(&TEST_SUFFIXES)
            )
        });
        let total = passed + count;
        let result = if failed {
            format!("test result: FAILED. {passed} passed; {count} failed; 0 ignored; 0 measured")
        } else {
            format!("test result: ok. {passed} passed; 0 failed; 0 ignored; 0 measured")
        };
        let log = format!(
            "     Running unittests src/lib.rs (target/debug/deps/{krate}-{:x})\n\nrunning {total} tests\n{body}\n\n{result}; finished in {}.{:02}s",
            self.rng.u32(..0xffff),
            self.rng.u32(..30),
            self.rng.u32(..100)
        );
        (log, failed)
    }

    fn grep_output(&mut self, chars: usize, planted: Option<String>) -> String {
        self.fill(chars, planted, |g| {
            let path = match g.noise {
                Noise::Synthetic => g.noise_path(),
                Noise::Realistic => g.realistic_path(),
            };
            let line = g.rng.u32(1..999);
            let code = g.code_line();
            format!("{path}:{line}:{}", code.trim_start())
        })
    }

    fn source(&mut self, chars: usize) -> String {
        self.fill(chars, None, Self::code_line)
    }

    fn config(&mut self, chars: usize, planted: Option<String>) -> String {
        if self.noise == Noise::Realistic {
            return self.realistic_config(planted);
        }
        let mut section = 0;
        self.fill(chars, planted, |g| {
            section += 1;
            if section % 6 == 1 {
                format!("\n[{}]", g.pick(&MODULES))
            } else {
                let key = g.pick(&CONFIG_KEYS);
                match g.rng.u32(..3) {
                    0 => format!("{key} = {}", g.rng.u32(..999)),
                    1 => format!("{key} = \"{}\"", g.pick(&IDENTS)),
                    _ => format!("{key} = {}", g.rng.bool()),
                }
            }
        })
    }

    /// A configuration file of 40 to 80 distinct keys in sections of 4 to 10, whatever the
    /// output size drawn: real configuration files are long lists of distinct settings.
    fn realistic_config(&mut self, planted: Option<String>) -> String {
        let mut keys: Vec<String> = CONFIG_PREFIXES
            .iter()
            .flat_map(|prefix| {
                CONFIG_SUFFIXES
                    .iter()
                    .map(move |suffix| format!("{prefix}_{suffix}"))
            })
            .chain(CONFIG_KEYS.iter().map(|key| (*key).to_owned()))
            .filter(|key| !FACT_KEYS.iter().any(|fact| key.contains(fact)))
            .collect();
        self.rng.shuffle(&mut keys);
        keys.truncate(self.rng.usize(40..=80));
        let mut lines = Vec::new();
        let mut until_section = 0;
        for key in keys {
            if until_section == 0 {
                lines.push(format!("\n[{}]", self.pick(&MODULES)));
                until_section = self.rng.usize(4..=10);
            }
            until_section -= 1;
            lines.push(match self.rng.u32(..4) {
                0 => format!("{key} = {}", self.rng.u32(..999)),
                1 => format!("{key} = \"{}\"", self.pick(&IDENTS)),
                2 => format!("{key} = \"/var/lib/{}\"", self.pick(&CRATES)),
                _ => format!("{key} = {}", self.rng.bool()),
            });
        }
        if let Some(planted) = planted {
            // After the first section header, as a setting.
            let at = self.rng.usize(1..=lines.len());
            lines.insert(at, planted);
        }
        lines.join("\n")
    }

    /// A rule as project docs state them, naming a path or a `code` span.
    fn named_rule(&mut self) -> String {
        let krate = self.pick(&CRATES);
        let module = self.pick(&MODULES);
        let ident = self.pick(&IDENTS);
        let ty = self.pick(&TYPES);
        let verb = self.pick(&VERBS);
        match self.rng.u32(..8) {
            0 => format!(
                "Do not edit `crates/{krate}/src/{module}.rs` by hand: it is generated by `cargo xtask codegen`."
            ),
            1 => format!(
                "Handlers must return `Result<{ty}, ApiError>`; never call `unwrap()` in crates/{krate}/src/{module}.rs."
            ),
            2 => format!(
                "Always go through `{ty}Repository` in crates/{krate}/src/repo.rs, never raw SQL."
            ),
            3 => format!("`{verb}_{ident}` must be idempotent: the scheduler may call it twice."),
            4 => format!(
                "Never log `{ident}` values; use the redaction helper in crates/{krate}/src/{module}.rs."
            ),
            5 => format!(
                "New settings in config/{krate}.toml require a default and a line in docs/config.md."
            ),
            6 => format!(
                "Tests that touch `{ty}` must use the fixtures in crates/{krate}/tests/fixtures/."
            ),
            _ => format!(
                "The `{module}` module of `{krate}` must not depend on `{}`: keep it behind a trait.",
                self.pick(&CRATES)
            ),
        }
    }

    fn docs(&mut self, chars: usize, planted: Option<String>) -> String {
        self.fill(chars, planted, |g| {
            if g.noise == Noise::Realistic && g.rng.bool() {
                return g.named_rule();
            }
            if g.rng.u32(..6) == 0 {
                format!(
                    "\n## {}",
                    g.pick(&[
                        "Conventions",
                        "Errors",
                        "Storage",
                        "Testing",
                        "Releases",
                        "Security"
                    ])
                )
            } else {
                g.pick(&PROSE).to_owned()
            }
        })
    }

    fn patch(&mut self, path: &str) -> String {
        let mut patch = format!(
            "--- a/{path}\n+++ b/{path}\n@@ -{0},7 +{0},8 @@\n",
            self.rng.u32(1..400)
        );
        for _ in 0..self.rng.usize(3..12) {
            let sign = self.pick(&[" ", " ", "-", "+"]);
            let _ = writeln!(patch, "{sign}{}", self.code_line());
        }
        patch
    }
}

/// A fact being planted: its needles and statement, the line for the tool output (none for
/// decisions, which live in the assistant's text), and how a later turn refers to it.
struct Planting {
    fact: Fact,
    output_line: Option<String>,
    action: Action,
    krate: &'static str,
    reference: String,
    restatement: String,
}

fn plant(g: &mut Gen, kind: Kind, planted: usize, needed: usize, restated: bool) -> Planting {
    let krate = g.pick(&CRATES);
    let fact = |needles: Vec<String>, statement: String, query: String| Fact {
        kind,
        needles,
        statement,
        query,
        planted,
        needed,
        restated,
    };
    match kind {
        Kind::Path => {
            let name = g.fact_name();
            let function = format!("apply_{name}");
            let path = format!("crates/{krate}/src/{}/{name}.rs", g.pick(&MODULES));
            let line = g.rng.u32(10..900);
            Planting {
                output_line: Some(format!(
                    "{path}:{line}:pub fn {function}(ctx: &Context, batch: &Batch) -> Result<Summary, Error> {{"
                )),
                reference: format!(
                    "Now I need to change `{function}`, in the file the search found."
                ),
                restatement: format!("Found it: `{function}` is defined in {path}."),
                fact: fact(
                    vec![path.clone()],
                    format!("`{function}` is defined in {path} (line {line})."),
                    function.clone(),
                ),
                action: Action::Grep,
                krate,
            }
        }
        Kind::Error => {
            let name = g.fact_name();
            let path = format!("crates/{krate}/src/{name}.rs");
            let line = g.rng.u32(10..900);
            let col = g.rng.u32(5..60);
            let location = format!("{path}:{line}");
            if g.rng.bool() {
                let (code, message) = g.pick(&ERRORS);
                let ident = g.pick(&IDENTS);
                Planting {
                    output_line: Some(format!(
                        "error[{code}]: {message}\n  --> {location}:{col}\n   |\n{line} |         let {ident}: u32 = row.get(\"{ident}\")?;\n   |                    ---   ^^^^^^^^^^^^^^^^ expected `u32`, found `i64`\n   |\n   = help: consider converting with `try_into()`"
                    )),
                    reference: format!("The fix needs the exact compiler error from {name}.rs."),
                    restatement: format!(
                        "The build fails with error[{code}] ({message}) at {location}."
                    ),
                    fact: fact(
                        vec![location.clone(), format!("error[{code}]")],
                        format!(
                            "`cargo build -p {krate}` fails: error[{code}] ({message}) at {location}."
                        ),
                        format!("{name}.rs error"),
                    ),
                    action: Action::Build,
                    krate,
                }
            } else {
                let test = format!("{name}::tests::{}_is_exact", g.pick(&IDENTS));
                let left = g.fact_number();
                let right = left + 1;
                Planting {
                    output_line: Some(format!(
                        "test {test} ... FAILED\n\nfailures:\n\n---- {test} stdout ----\nthread '{test}' panicked at {location}:{col}:\nassertion `left == right` failed\n  left: {left}\n right: {right}\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"
                    )),
                    reference: format!("The fix needs the failing assertion in the {name} tests."),
                    restatement: format!(
                        "`{test}` fails at {location}: left {left}, right {right}."
                    ),
                    fact: fact(
                        vec![test.clone(), location.clone(), left.to_string()],
                        format!(
                            "Test `{test}` panics at {location}: assertion left == right failed (left {left}, right {right})."
                        ),
                        format!("{name} panicked"),
                    ),
                    action: Action::Test,
                    krate,
                }
            }
        }
        Kind::Number => {
            let key = g.keys.pop().unwrap_or("quota_burst");
            let value = g.fact_number();
            Planting {
                output_line: Some(format!("{key} = {value}")),
                reference: format!("The client must use the `{key}` setting from the config."),
                restatement: format!("Noted: `{key}` is {value}."),
                fact: fact(
                    vec![key.to_owned(), value.to_string()],
                    format!("`{key}` = {value} in config/{krate}.toml."),
                    key.to_owned(),
                ),
                action: Action::Config,
                krate,
            }
        }
        Kind::Decision => {
            let (subject, choice, alternative, reason) =
                g.decisions.pop().unwrap_or(FACT_DECISIONS[0]);
            let statement = format!(
                "Decision: for {subject}, use `{choice}` instead of {alternative}, because {reason}."
            );
            Planting {
                output_line: None,
                reference: format!("Implementing the {subject} the way we decided."),
                restatement: String::new(),
                fact: fact(vec![choice.to_owned()], statement, subject.to_owned()),
                action: Action::Read,
                krate,
            }
        }
        Kind::Constraint => {
            let name = g.fact_name();
            let (sentence, needles, query, reference) = match g.rng.u32(..3) {
                0 => {
                    let migration = format!("migrations/{:04}_{name}.sql", g.rng.u32(1..60));
                    (
                        format!(
                            "Applied migrations are append-only: never edit {migration}; add a new migration instead."
                        ),
                        vec![migration, "append-only".to_owned()],
                        format!("{name} migration"),
                        format!("Careful with the {name} migration: the docs had a rule about it."),
                    )
                }
                1 => {
                    let function = format!("{name}_total");
                    (
                        format!(
                            "The signature of `{function}` is public API and must not change without a major release."
                        ),
                        vec![function.clone(), "must not change".to_owned()],
                        function.clone(),
                        format!("Before touching `{function}`, remember the docs' rule about it."),
                    )
                }
                _ => {
                    let krate_name = format!("{name}-core");
                    (
                        format!(
                            "Never add dependencies to `{krate_name}`: it must build offline for the air-gapped installer."
                        ),
                        vec![krate_name.clone(), "must build offline".to_owned()],
                        krate_name.clone(),
                        format!(
                            "Adding the parser to `{krate_name}`? The docs said something about that crate."
                        ),
                    )
                }
            };
            Planting {
                output_line: Some(sentence.clone()),
                restatement: format!("Rule from the docs: {sentence}"),
                reference,
                fact: fact(needles, sentence, query),
                action: Action::Docs,
                krate,
            }
        }
        Kind::Identifier
        | Kind::StackLocation
        | Kind::TableCell
        | Kind::Version
        | Kind::Port
        | Kind::TodoOwner
        | Kind::EnvVar
        | Kind::Commit
        | Kind::JavaCause
        | Kind::JsonField => unreachable!("the second generator's kinds (second.rs)"),
    }
}

const TASKS: [&str; 4] = [
    "Fix the failing invoice export in the billing service: `cargo test --workspace` must pass and exported totals must match the ledger.",
    "The nightly ledger close crashes on large tenants. Find the cause, fix it, and add a regression test.",
    "Add partial refunds to the payments API, with ledger entries and webhooks, and keep every existing test green.",
    "Make statement generation three times faster without changing its output; measure before and after.",
];

/// Generates the trajectory of `seed`.
pub fn generate(seed: u64, shape: Shape) -> Trajectory {
    let mut rng = Rng::with_seed(seed);
    let mut names = FACT_NAMES.to_vec();
    rng.shuffle(&mut names);
    let mut keys = FACT_KEYS.to_vec();
    rng.shuffle(&mut keys);
    let mut decisions = FACT_DECISIONS.to_vec();
    rng.shuffle(&mut decisions);
    let task = TASKS[rng.usize(..TASKS.len())].to_owned();
    let mut g = Gen {
        rng,
        names,
        keys,
        decisions,
        used_numbers: Vec::new(),
        scale: shape.output_scale,
        noise: shape.noise,
    };
    let n = shape.turns;
    // Plant turns: distinct, leaving room for the reference after them.
    let mut free: Vec<usize> = (2..n.saturating_sub(6)).collect();
    g.rng.shuffle(&mut free);
    let mut schedule: Vec<(usize, Kind, usize, bool)> = Vec::new();
    for kind in Kind::ALL {
        for _ in 0..shape.facts_per_kind {
            let Some(planted) = free.pop() else { break };
            let gap = g.rng.usize(4..=(n - planted).clamp(4, 60));
            let restated = kind != Kind::Decision && g.rng.f64() < shape.restate_share;
            schedule.push((planted, kind, (planted + gap).min(n), restated));
        }
    }
    let mut facts: Vec<Fact> = Vec::new();
    let mut references: HashMap<usize, Vec<String>> = HashMap::new();
    let mut restatements: HashMap<usize, Vec<String>> = HashMap::new();
    let mut turns = Vec::with_capacity(n);
    for t in 1..=n {
        let planting =
            schedule
                .iter()
                .find(|(at, ..)| *at == t)
                .map(|&(planted, kind, needed, restated)| {
                    plant(&mut g, kind, planted, needed, restated)
                });
        let mut text = Vec::new();
        text.extend(restatements.remove(&t).unwrap_or_default());
        text.extend(references.remove(&t).unwrap_or_default());
        let action = planting.as_ref().map_or_else(
            || {
                let roll = g.rng.u32(..100);
                match roll {
                    0..18 => Action::Build,
                    18..34 => Action::Test,
                    34..58 => Action::Read,
                    58..72 => Action::Grep,
                    72..78 => Action::Config,
                    78..84 => Action::Docs,
                    _ => Action::Patch,
                }
            },
            |p| p.action,
        );
        let krate = planting
            .as_ref()
            .map_or_else(|| g.pick(&CRATES), |p| p.krate);
        let chars = g.size(action);
        let line = planting.as_ref().and_then(|p| p.output_line.clone());
        let call_id = format!("t{t}");
        let (tool, arguments, output, is_error, intro) = match action {
            Action::Build => {
                let (output, failed) = g.build_log(krate, chars, line);
                (
                    "shell",
                    serde_json::json!({"command": format!("cargo build -p {krate}")}),
                    output,
                    failed,
                    format!("Building {krate} to see where it stands."),
                )
            }
            Action::Test => {
                let module = g.pick(&MODULES);
                let (output, failed) = g.test_log(krate, chars, line);
                (
                    "shell",
                    serde_json::json!({"command": format!("cargo test -p {krate} {module}")}),
                    output,
                    failed,
                    format!("Running the {module} tests of {krate}."),
                )
            }
            Action::Read => {
                let path = g.noise_path();
                let output = g.source(chars);
                let intro = format!("Reading {path} to see how it handles {}.", g.pick(&IDENTS));
                (
                    "read_file",
                    serde_json::json!({"path": path}),
                    output,
                    false,
                    intro,
                )
            }
            Action::Grep => {
                let pattern = match &planting {
                    Some(p) if p.fact.kind == Kind::Path => "fn apply_".to_owned(),
                    Some(_) | None => format!("{}_{}", g.pick(&VERBS), g.pick(&IDENTS)),
                };
                let output = g.grep_output(chars, line);
                (
                    "shell",
                    serde_json::json!({"command": format!("rg -n '{pattern}' crates")}),
                    output,
                    false,
                    format!("Searching the crates for `{pattern}`."),
                )
            }
            Action::Config => {
                let output = g.config(chars, line);
                (
                    "shell",
                    serde_json::json!({"command": format!("cat config/{krate}.toml")}),
                    output,
                    false,
                    format!("Checking the {krate} configuration."),
                )
            }
            Action::Docs => {
                let doc = g.pick(&[
                    "CONTRIBUTING",
                    "ARCHITECTURE",
                    "docs/storage",
                    "docs/api",
                    "docs/operations",
                ]);
                let output = g.docs(chars, line);
                (
                    "shell",
                    serde_json::json!({"command": format!("cat {doc}.md")}),
                    output,
                    false,
                    format!("Reading {doc}.md for the project's rules."),
                )
            }
            Action::Patch => {
                let path = g.noise_path();
                let patch = g.patch(&path);
                (
                    "apply_patch",
                    serde_json::json!({"path": path, "patch": patch}),
                    format!("Applied 1 hunk to {path}."),
                    false,
                    format!("Applying the change to {path}."),
                )
            }
        };
        text.push(intro);
        if g.rng.u32(..10) == 0 {
            text.push(
                g.pick(&[
                    "Hmm, wait: perhaps the caller is the problem, not this module. Let me verify that first.",
                    "Actually, I'm not sure the cache is involved; let me check the logs again.",
                    "On second thought, let me reconsider: the retry may hide the real failure. I'll double-check.",
                ])
                .to_owned(),
            );
        }
        if let Some(planting) = planting {
            if planting.fact.kind == Kind::Decision {
                text.insert(0, planting.fact.statement.clone());
            }
            if planting.fact.restated {
                restatements
                    .entry(t + 1)
                    .or_default()
                    .push(planting.restatement.clone());
            }
            references
                .entry(planting.fact.needed)
                .or_default()
                .push(planting.reference.clone());
            facts.push(planting.fact);
        }
        turns.push(Turn {
            text: text.join(" "),
            call_id,
            tool,
            arguments,
            output,
            is_error,
        });
    }
    let trajectory = Trajectory {
        seed,
        task,
        turns,
        final_answer: "Done. The change is in place and `cargo test --workspace` passes."
            .to_owned(),
        facts,
    };
    check(&trajectory);
    trajectory
}

/// The generator's own invariants: every needle is absent before its fact is planted and
/// present in the planting turn, and a reference never repeats its fact.
fn check(trajectory: &Trajectory) {
    let mut seen = trajectory.task.clone();
    for (i, turn) in trajectory.turns.iter().enumerate() {
        let t = i + 1;
        let turn_text = format!("{}\n{}\n{}", turn.text, turn.arguments, turn.output);
        for fact in trajectory.facts.iter().filter(|f| f.planted == t) {
            // The first needle is the distinctive one; the others may be common words.
            assert!(
                !seen.contains(fact.needles[0].as_str()),
                "seed {}: `{}` appears before turn {t}",
                trajectory.seed,
                fact.needles[0]
            );
            assert!(
                fact.is_in(&turn_text),
                "seed {}: fact not planted at turn {t}: {fact:?}",
                trajectory.seed
            );
        }
        for fact in trajectory.facts.iter().filter(|f| f.needed == t) {
            assert!(
                !fact.needles.iter().all(|n| turn.text.contains(n.as_str())),
                "seed {}: the reference repeats the fact: {}",
                trajectory.seed,
                turn.text
            );
        }
        seen.push_str(&turn_text);
    }
}
