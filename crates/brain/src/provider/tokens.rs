//! Token counting behind one trait: the real tokenizer (tiktoken's `o200k_base` or
//! `cl100k_base`, bundled with `tiktoken-rs`, no download) for OpenAI-family models, and a
//! calibrated estimate for every other model. A per-message cache makes counting a growing
//! conversation cost one tokenization per new message instead of one per message per turn.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nerve_core::{Message, MessagePart, TokenUsage, ToolDefinition};
use tiktoken_rs::CoreBPE;

use crate::provider::stream::arguments_text;

/// Tokens every message costs for its role and framing in chat formats.
const MESSAGE_OVERHEAD: u64 = 4;
/// Tokens a tool call or tool result costs beyond its text (ids, names, delimiters).
const PART_OVERHEAD: u64 = 3;
/// Tokens a tool definition costs beyond its name, description and schema.
const TOOL_OVERHEAD: u64 = 8;

/// Counts tokens the way one model family does.
pub trait TokenCounter: Send + Sync + fmt::Debug {
    /// `o200k_base`, `cl100k_base` or `estimate`.
    fn name(&self) -> &'static str;

    /// Tokens in `text` alone.
    fn count_text(&self, text: &str) -> u64;

    /// Tokens `message` costs in a prompt, framing included.
    fn count_message(&self, message: &Message) -> u64 {
        message_tokens(message, |text| self.count_text(text))
    }

    fn count_messages(&self, messages: &[Message]) -> u64 {
        messages
            .iter()
            .map(|message| self.count_message(message))
            .sum()
    }

    /// Tokens the tool definitions add to every request.
    fn count_tools(&self, tools: &[ToolDefinition]) -> u64 {
        tools
            .iter()
            .map(|tool| {
                self.count_text(&tool.name)
                    + self.count_text(&tool.description)
                    + self.count_text(&tool.parameters.to_string())
                    + TOOL_OVERHEAD
            })
            .sum()
    }
}

fn message_tokens(message: &Message, count: impl Fn(&str) -> u64) -> u64 {
    let parts: u64 = message
        .parts
        .iter()
        .map(|part| match part {
            MessagePart::Text { text }
            | MessagePart::CompactionSummary { text, .. }
            | MessagePart::Thinking { text, .. } => count(text),
            MessagePart::ToolCall(call) => {
                count(&call.name) + count(&arguments_text(&call.arguments)) + PART_OVERHEAD
            }
            MessagePart::ToolResult(result) => count(&result.content) + PART_OVERHEAD,
        })
        .sum();
    parts + MESSAGE_OVERHEAD
}

/// The tiktoken encodings Nerve knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5, the o-series, gpt-oss.
    O200kBase,
    /// GPT-4, GPT-3.5, the `text-embedding-3` models.
    Cl100kBase,
}

impl Encoding {
    /// The encoding of an OpenAI-family model, by name; `None` for other families.
    /// Provider prefixes (`openai/gpt-4o`) and dated snapshots are accepted.
    pub fn for_model(model: &str) -> Option<Self> {
        let name = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        let name = name.as_str();
        let o200k = [
            "gpt-4o",
            "chatgpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "gpt-oss",
            "o1",
            "o3",
            "o4",
        ];
        let cl100k = [
            "gpt-4",
            "gpt-3.5",
            "gpt-35",
            "text-embedding-3",
            "text-embedding-ada",
        ];
        let family = |prefixes: &[&str]| {
            prefixes.iter().any(|prefix| {
                name.strip_prefix(prefix)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ':', '.', '_']))
            })
        };
        if family(&o200k) {
            Some(Self::O200kBase)
        } else if family(&cl100k) {
            Some(Self::Cl100kBase)
        } else {
            None
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
        }
    }

    /// The tokenizer, built from `tiktoken-rs`'s bundled ranks on first use.
    pub fn bpe(self) -> &'static CoreBPE {
        match self {
            Self::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Self::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }
}

/// The real tokenizer of an OpenAI-family model.
#[derive(Clone, Copy)]
pub struct Tiktoken {
    encoding: Encoding,
    bpe: &'static CoreBPE,
}

impl Tiktoken {
    pub fn new(encoding: Encoding) -> Self {
        Self {
            encoding,
            bpe: encoding.bpe(),
        }
    }
}

impl fmt::Debug for Tiktoken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tiktoken").field(&self.encoding).finish()
    }
}

impl TokenCounter for Tiktoken {
    fn name(&self) -> &'static str {
        self.encoding.name()
    }

    fn count_text(&self, text: &str) -> u64 {
        // Special-token text (`<|endoftext|>`) in a prompt is ordinary text to the API.
        self.bpe.encode_ordinary(text).len() as u64
    }
}

/// The estimate's inputs, counted in one pass over the bytes. Byte-pair tokenizers split
/// text into words, numbers, punctuation and whitespace before merging, so these counts
/// predict the token count far better than the length alone does.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Features {
    /// Runs of ASCII letters.
    pub words: u32,
    /// Letters beyond the sixth in each run: long words and identifiers split.
    pub long_letters: u32,
    /// Lower-to-upper case changes inside a run (`camelCase` humps).
    pub humps: u32,
    /// Groups of up to three digits (the tokenizers split numbers so).
    pub digit_groups: u32,
    /// ASCII punctuation and symbols.
    pub punctuation: u32,
    /// Whitespace runs that hold a line break.
    pub line_breaks: u32,
    /// Runs of two or more spaces or tabs (indentation, alignment).
    pub space_runs: u32,
    /// Characters outside ASCII, by their UTF-8 length (2, 3 and 4 bytes).
    pub wide2: u32,
    pub wide3: u32,
    pub wide4: u32,
}

impl Features {
    pub fn of(text: &str) -> Self {
        #[derive(Clone, Copy, PartialEq)]
        enum Run {
            None,
            Letters { length: u32, lower: bool },
            Digits(u32),
            Space { length: u32, line: bool },
        }
        let mut f = Self::default();
        let mut run = Run::None;
        let close = |f: &mut Self, run: Run| match run {
            Run::None => {}
            Run::Letters { length, .. } => {
                f.words += 1;
                f.long_letters += length.saturating_sub(6);
            }
            Run::Digits(length) => f.digit_groups += length.div_ceil(3),
            Run::Space { length, line } => {
                if line {
                    f.line_breaks += 1;
                } else if length >= 2 {
                    f.space_runs += 1;
                }
            }
        };
        for &byte in text.as_bytes() {
            run = match (byte, run) {
                (b'a'..=b'z', Run::Letters { length, .. }) => Run::Letters {
                    length: length + 1,
                    lower: true,
                },
                (b'A'..=b'Z', Run::Letters { length, lower }) => {
                    if lower {
                        f.humps += 1;
                    }
                    Run::Letters {
                        length: length + 1,
                        lower: false,
                    }
                }
                (b'a'..=b'z' | b'A'..=b'Z', other) => {
                    close(&mut f, other);
                    Run::Letters {
                        length: 1,
                        lower: byte.is_ascii_lowercase(),
                    }
                }
                (b'0'..=b'9', Run::Digits(length)) => Run::Digits(length + 1),
                (b'0'..=b'9', other) => {
                    close(&mut f, other);
                    Run::Digits(1)
                }
                (b' ' | b'\t' | b'\n' | b'\r', Run::Space { length, line }) => Run::Space {
                    length: length + 1,
                    line: line || byte == b'\n',
                },
                (b' ' | b'\t' | b'\n' | b'\r', other) => {
                    close(&mut f, other);
                    Run::Space {
                        length: 1,
                        line: byte == b'\n',
                    }
                }
                (_, other) => {
                    close(&mut f, other);
                    match byte {
                        0x00..=0x7f => f.punctuation += 1,
                        0xc0..=0xdf => f.wide2 += 1,
                        0xe0..=0xef => f.wide3 += 1,
                        0xf0..=0xff => f.wide4 += 1,
                        // UTF-8 continuation bytes: counted with their lead byte.
                        0x80..=0xbf => {}
                    }
                    Run::None
                }
            };
        }
        close(&mut f, run);
        f
    }

    fn as_array(&self) -> [f64; 10] {
        [
            self.words,
            self.long_letters,
            self.humps,
            self.digit_groups,
            self.punctuation,
            self.line_breaks,
            self.space_runs,
            self.wide2,
            self.wide3,
            self.wide4,
        ]
        .map(f64::from)
    }
}

/// Tokens per feature, fitted by least squares against `cl100k_base` on code, JSON, logs
/// and prose (`cargo run -p nerve-brain --release --example token_estimate` refits and
/// prints the error table recorded in `docs/benchmarks.md`).
const WEIGHTS: [f64; 10] = [
    0.891, 0.172, 0.113, 1.498, 0.403, 2.248, 0.239, 0.7, 1.5, 2.0,
];

/// The calibrated estimate, for models whose tokenizer Nerve does not ship.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimate;

impl Estimate {
    /// The estimate for given features (exposed for calibration).
    pub fn from_features(features: &Features) -> u64 {
        let tokens: f64 = features
            .as_array()
            .iter()
            .zip(WEIGHTS)
            .map(|(f, w)| f * w)
            .sum();
        // Finite and non-negative by construction (non-negative counts and weights).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rounded = tokens.ceil() as u64;
        rounded
    }
}

impl TokenCounter for Estimate {
    fn name(&self) -> &'static str {
        "estimate"
    }

    fn count_text(&self, text: &str) -> u64 {
        Self::from_features(&Features::of(text))
    }
}

/// Remembers each message's count, keyed by a hash of its content. Two generations of at
/// most `capacity` entries each: when the newer one fills, the older is dropped, so the
/// messages of the live conversation stay while evicted ones age out.
pub struct CachedCounter<C> {
    inner: C,
    capacity: usize,
    cache: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    current: HashMap<u64, u64>,
    previous: HashMap<u64, u64>,
}

impl<C: TokenCounter> CachedCounter<C> {
    /// Holds up to 2 × 8192 message counts.
    pub fn new(inner: C) -> Self {
        Self::with_capacity(inner, 8192)
    }

    pub fn with_capacity(inner: C, capacity: usize) -> Self {
        Self {
            inner,
            capacity: capacity.max(1),
            cache: Mutex::new(Generations::default()),
        }
    }

    pub fn inner(&self) -> &C {
        &self.inner
    }

    fn lookup(&self, key: u64) -> Option<u64> {
        let mut cache = self.cache.lock().ok()?;
        if let Some(count) = cache.current.get(&key) {
            return Some(*count);
        }
        let count = cache.previous.remove(&key)?;
        self.store(&mut cache, key, count);
        Some(count)
    }

    fn store(&self, cache: &mut Generations, key: u64, count: u64) {
        if cache.current.len() >= self.capacity {
            cache.previous = std::mem::take(&mut cache.current);
        }
        cache.current.insert(key, count);
    }
}

impl<C: TokenCounter> fmt::Debug for CachedCounter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedCounter")
            .field("inner", &self.inner)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl<C: TokenCounter> TokenCounter for CachedCounter<C> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn count_text(&self, text: &str) -> u64 {
        self.inner.count_text(text)
    }

    fn count_message(&self, message: &Message) -> u64 {
        let key = message_key(message);
        if let Some(count) = self.lookup(key) {
            return count;
        }
        // Counted outside the lock: concurrent callers may both count a new message once.
        let count = self.inner.count_message(message);
        if let Ok(mut cache) = self.cache.lock() {
            self.store(&mut cache, key, count);
        }
        count
    }
}

/// A hash of everything in a message that reaches the prompt. foldhash (fixed seed) rather
/// than SipHash: keys are not attacker-chosen in a way that matters (a collision costs an
/// inexact count), and a long conversation is rehashed at every turn.
pub(crate) fn message_key(message: &Message) -> u64 {
    let mut hasher = foldhash::quality::FixedState::with_seed(0x006e_6572_7665).build_hasher();
    message.role.hash(&mut hasher);
    for part in &message.parts {
        match part {
            MessagePart::Text { text } => {
                0_u8.hash(&mut hasher);
                text.hash(&mut hasher);
            }
            MessagePart::ToolCall(call) => {
                1_u8.hash(&mut hasher);
                call.id.0.hash(&mut hasher);
                call.name.hash(&mut hasher);
                hash_json(&call.arguments, &mut hasher);
            }
            MessagePart::ToolResult(result) => {
                2_u8.hash(&mut hasher);
                result.call_id.0.hash(&mut hasher);
                result.name.hash(&mut hasher);
                result.content.hash(&mut hasher);
                result.is_error.hash(&mut hasher);
            }
            MessagePart::Thinking { text, signature } => {
                3_u8.hash(&mut hasher);
                text.hash(&mut hasher);
                signature.hash(&mut hasher);
            }
            MessagePart::CompactionSummary { text, .. } => {
                4_u8.hash(&mut hasher);
                text.hash(&mut hasher);
            }
        }
    }
    hasher.finish()
}

fn hash_json(value: &serde_json::Value, hasher: &mut impl Hasher) {
    match value {
        serde_json::Value::Null => 0_u8.hash(hasher),
        serde_json::Value::Bool(b) => (1_u8, *b).hash(hasher),
        serde_json::Value::Number(n) => {
            2_u8.hash(hasher);
            n.to_string().hash(hasher);
        }
        serde_json::Value::String(s) => {
            3_u8.hash(hasher);
            s.hash(hasher);
        }
        serde_json::Value::Array(items) => {
            (4_u8, items.len()).hash(hasher);
            for item in items {
                hash_json(item, hasher);
            }
        }
        serde_json::Value::Object(map) => {
            (5_u8, map.len()).hash(hasher);
            for (key, item) in map {
                key.hash(hasher);
                hash_json(item, hasher);
            }
        }
    }
}

/// What is needed to estimate usage the server did not report.
#[derive(Debug, Clone)]
pub struct UsageEstimate {
    /// The prompt's tokens, counted before sending.
    pub input: u64,
    pub counter: Arc<dyn TokenCounter>,
    /// What the endpoint's server reported about earlier prompts: it scales
    /// [`UsageEstimate::prompt`], and this prompt's report updates it.
    pub calibration: Option<Arc<Calibration>>,
}

/// How much more the server counted than the estimate, for the last prompt it reported
/// on: a model whose tokenizer splits text finer than the estimate assumes (SmolLM2's
/// 49k-token vocabulary: about a fifth more tokens than estimated) would otherwise be asked
/// for more output than its window leaves, and refuse. Never below 1 (an estimate above
/// the server's count only costs a little output room), at most 4.
#[derive(Debug, Default)]
pub struct Calibration {
    /// The last ratio in thousandths; 0 before any report.
    permille: AtomicU64,
}

impl Calibration {
    /// Prompts shorter than this say little about the ratio (the chat template's own
    /// tokens dominate them).
    const MIN_PROMPT: u64 = 100;

    /// The server counted `reported` tokens for a prompt estimated at `estimated`.
    pub fn observe(&self, estimated: u64, reported: u64) {
        if estimated < Self::MIN_PROMPT || reported == 0 {
            return;
        }
        let permille = (u128::from(reported) * 1000 / u128::from(estimated)).clamp(1000, 4000);
        self.permille.store(permille as u64, Ordering::Relaxed);
    }

    /// `estimated` as the server would count it, going by its last report.
    pub fn scale(&self, estimated: u64) -> u64 {
        (u128::from(estimated) * u128::from(self.permille()) / 1000).min(u128::from(u64::MAX))
            as u64
    }

    /// The last ratio in thousandths: 1000 before any report, never less.
    pub fn permille(&self) -> u64 {
        self.permille.load(Ordering::Relaxed).max(1000)
    }
}

impl UsageEstimate {
    /// Counts the prompt of `request` with `counter`, before it is sent.
    pub fn for_request(
        counter: &Arc<dyn TokenCounter>,
        request: &crate::provider::model_call::ModelRequest<'_>,
    ) -> Self {
        Self {
            input: counter.count_messages(request.messages) + counter.count_tools(request.tools),
            counter: Arc::clone(counter),
            calibration: None,
        }
    }

    /// With `calibration`, the endpoint's.
    pub fn calibrated(mut self, calibration: &Arc<Calibration>) -> Self {
        self.calibration = Some(Arc::clone(calibration));
        self
    }

    /// The prompt's tokens as the server is expected to count them: the estimate, scaled
    /// by the calibration when there is one.
    pub fn prompt(&self) -> u64 {
        self.calibration
            .as_ref()
            .map_or(self.input, |c| c.scale(self.input))
    }

    /// Reported usage when there is some (servers that report zeros report nothing). A
    /// reported prompt count updates the calibration.
    pub fn resolve(&self, reported: Option<TokenUsage>, message: &Message) -> TokenUsage {
        match reported {
            Some(usage) if usage.input_tokens > 0 || usage.output_tokens > 0 => {
                if let Some(calibration) = &self.calibration {
                    calibration.observe(self.input, usage.input_tokens);
                }
                usage
            }
            Some(_) | None => {
                tracing::debug!("the server reported no usage; estimating it");
                TokenUsage::new(self.input, self.counter.count_message(message))
            }
        }
    }
}

/// The counter for `model`: tiktoken for OpenAI-family names, the estimate otherwise; both
/// behind the per-message cache.
pub fn counter_for_model(model: &str) -> Arc<dyn TokenCounter> {
    match Encoding::for_model(model) {
        Some(encoding) => Arc::new(CachedCounter::new(Tiktoken::new(encoding))),
        None => Arc::new(CachedCounter::new(Estimate)),
    }
}

/// The estimate of `text`, uncached (see [`Estimate`]).
pub fn estimate_text(text: &str) -> u64 {
    Estimate.count_text(text)
}

/// The estimate of one message, framing included.
pub fn estimate_message(message: &Message) -> u64 {
    Estimate.count_message(message)
}

pub fn estimate_messages(messages: &[Message]) -> u64 {
    Estimate.count_messages(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nerve_core::{MessageRole, ToolCall, ToolCallId, ToolResult};

    #[test]
    fn model_names_pick_their_encoding() {
        let check = |model: &str, expected: Option<Encoding>| {
            assert_eq!(Encoding::for_model(model), expected, "{model}")
        };
        check("gpt-4o", Some(Encoding::O200kBase));
        check("gpt-4o-mini-2024-07-18", Some(Encoding::O200kBase));
        check("openai/gpt-4.1-nano", Some(Encoding::O200kBase));
        check("gpt-5", Some(Encoding::O200kBase));
        check("o3-mini", Some(Encoding::O200kBase));
        check("o1", Some(Encoding::O200kBase));
        check("gpt-oss:20b", Some(Encoding::O200kBase));
        check("gpt-4", Some(Encoding::Cl100kBase));
        check("gpt-4-turbo", Some(Encoding::Cl100kBase));
        check("gpt-3.5-turbo-0125", Some(Encoding::Cl100kBase));
        check("claude-sonnet-4-5", None);
        check("llama3.1:8b", None);
        check("o3x", None);
        check("gpt-4oo", None);
    }

    #[test]
    fn tiktoken_works_offline_from_bundled_ranks() {
        assert_eq!(
            Tiktoken::new(Encoding::O200kBase).count_text("hello world"),
            2
        );
        assert_eq!(
            Tiktoken::new(Encoding::Cl100kBase).count_text("hello world"),
            2
        );
        // Special tokens in user text are plain text, never a control token.
        assert!(Tiktoken::new(Encoding::Cl100kBase).count_text("<|endoftext|>") > 1);
    }

    #[test]
    fn features_split_like_a_tokenizer() {
        let f = Features::of("fn parseHTTPHeader(x: u32) {\n    let n = 12345;\n}  é✓😀");
        assert_eq!(f.words, 6);
        assert_eq!(f.humps, 1);
        assert_eq!(f.digit_groups, 1 + 2);
        assert_eq!(f.line_breaks, 2);
        assert_eq!(f.space_runs, 1);
        assert_eq!((f.wide2, f.wide3, f.wide4), (1, 1, 1));
        assert_eq!(Features::of(""), Features::default());
        assert_eq!(Estimate.count_text(""), 0);
    }

    #[test]
    fn the_estimate_is_close_on_ordinary_text() {
        let real = Tiktoken::new(Encoding::Cl100kBase);
        for text in [
            "The quick brown fox jumps over the lazy dog, then runs back home to sleep.",
            "fn main() {\n    let values: Vec<u64> = (0..10).map(|x| x * 2).collect();\n    println!(\"{values:?}\");\n}\n",
            r#"{"id": 1234, "name": "nerve", "tags": ["agent", "runtime"], "active": true}"#,
            "2025-01-02T03:04:05Z INFO nerve::engine: turn 3 finished in 1532ms tokens=4521",
        ] {
            let (estimate, truth) = (Estimate.count_text(text), real.count_text(text));
            let error = estimate.abs_diff(truth) as f64 / truth as f64;
            assert!(error < 0.3, "estimate {estimate} vs {truth} for {text:?}");
        }
    }

    fn conversation() -> Vec<Message> {
        vec![
            Message::system("You are Nerve."),
            Message::user("list the files").pinned(),
            Message {
                role: MessageRole::Assistant,
                parts: vec![
                    MessagePart::Thinking {
                        text: "use ls".into(),
                        signature: Some("sig".into()),
                    },
                    MessagePart::ToolCall(ToolCall {
                        id: ToolCallId("c1".into()),
                        name: "shell".into(),
                        arguments: serde_json::json!({"command": "ls -la", "timeout_secs": 5}),
                    }),
                ],
                pinned: false,
            },
            Message::tool_result(ToolResult {
                call_id: ToolCallId("c1".into()),
                name: "shell".into(),
                content: "Cargo.toml\nsrc\n".into(),
                is_error: false,
            }),
        ]
    }

    #[test]
    fn the_cache_returns_what_the_counter_counts() {
        let messages = conversation();
        let plain = Tiktoken::new(Encoding::O200kBase);
        let cached = CachedCounter::with_capacity(plain, 2);
        let expected = plain.count_messages(&messages);
        for _ in 0..3 {
            assert_eq!(cached.count_messages(&messages), expected);
        }
        // A changed message is a different key.
        let mut changed = messages.clone();
        changed[3] = Message::user("something else entirely");
        assert_eq!(
            cached.count_messages(&changed),
            plain.count_messages(&changed)
        );
        assert_eq!(cached.name(), "o200k_base");
    }

    #[test]
    fn keys_see_every_part() {
        let messages = conversation();
        let mut keys: Vec<u64> = messages.iter().map(message_key).collect();
        let mut other = messages[2].clone();
        if let MessagePart::ToolCall(call) = &mut other.parts[1] {
            call.arguments = serde_json::json!({"command": "ls -la", "timeout_secs": 6});
        }
        keys.push(message_key(&other));
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 5);
    }

    #[test]
    fn tools_cost_tokens() {
        let tools = vec![ToolDefinition {
            name: "shell".into(),
            description: "Run a command".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }];
        assert!(counter_for_model("gpt-4o").count_tools(&tools) > TOOL_OVERHEAD);
        assert!(counter_for_model("llama3").count_tools(&tools) > TOOL_OVERHEAD);
    }
}
