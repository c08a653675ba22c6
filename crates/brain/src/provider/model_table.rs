//! The model table: each model's context window, output limit and prices, built in for
//! common OpenAI and Anthropic models and extendable from the configuration file. Prices
//! are integer micro-dollars per million tokens, so costs add up without drift.

use nerve_core::{MicroUsd, TokenUsage};

/// Prices in micro-dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pricing {
    pub input_per_million: u64,
    pub output_per_million: u64,
    /// Input tokens read from the prompt cache; `None`: the input price.
    pub cache_read_per_million: Option<u64>,
    /// Input tokens written to the prompt cache; `None`: the input price.
    pub cache_write_per_million: Option<u64>,
}

impl Pricing {
    /// The cost of `usage`, cache reads and writes at their own prices. Rounded up per
    /// class, so a budget is never under-charged.
    pub fn cost(&self, usage: TokenUsage) -> MicroUsd {
        let read = usage.cache_read_tokens.min(usage.input_tokens);
        let write = usage.cache_write_tokens.min(usage.input_tokens - read);
        let plain = usage.input_tokens - read - write;
        let price = |p: Option<u64>| p.unwrap_or(self.input_per_million);
        MicroUsd::for_tokens(plain, self.input_per_million)
            + MicroUsd::for_tokens(read, price(self.cache_read_per_million))
            + MicroUsd::for_tokens(write, price(self.cache_write_per_million))
            + MicroUsd::for_tokens(usage.output_tokens, self.output_per_million)
    }
}

/// What Nerve knows about one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// The model name; it also covers dated snapshots and aliases that extend it after a
    /// `-`, `:` or `@` (`gpt-4o` covers `gpt-4o-2024-08-06`), unless a longer name matches.
    pub name: String,
    /// Prompt and answer together, in tokens.
    pub context_window: u64,
    /// The most the model writes in one answer.
    pub max_output_tokens: u64,
    /// Micro-dollars per million input tokens (`2_500_000` is $2.50).
    pub input_per_million: u64,
    /// Micro-dollars per million output tokens, reasoning included.
    pub output_per_million: u64,
    /// Per million input tokens served from the prompt cache; `None`: the input price.
    pub cache_read_per_million: Option<u64>,
    /// Per million input tokens written to the prompt cache; `None`: the input price.
    pub cache_write_per_million: Option<u64>,
}

impl ModelInfo {
    /// The cost of `usage`, cache reads and writes at their own prices (see
    /// [`Pricing::cost`]).
    pub fn cost(&self, usage: TokenUsage) -> MicroUsd {
        self.pricing().cost(usage)
    }

    /// The model's prices as the engine's `Pricing`, cache prices included.
    pub fn pricing(&self) -> Pricing {
        Pricing {
            input_per_million: self.input_per_million,
            output_per_million: self.output_per_million,
            cache_read_per_million: self.cache_read_per_million,
            cache_write_per_million: self.cache_write_per_million,
        }
    }
}

/// A configured change to the table: fields left `None` keep the built-in value. A name the
/// table does not know adds a model, and then needs at least `context_window`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelOverride {
    pub name: String,
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub input_per_million: Option<u64>,
    pub output_per_million: Option<u64>,
    pub cache_read_per_million: Option<u64>,
    pub cache_write_per_million: Option<u64>,
}

/// An override that cannot be applied. Not retryable: fix the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelTableError {
    /// A model the table does not know was configured without its context window.
    #[error("model `{0}` is not built in: configure at least its context_window")]
    UnknownWithoutWindow(String),
    /// An override with an empty name.
    #[error("a model override has an empty name")]
    EmptyName,
}

/// Models by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTable {
    models: Vec<ModelInfo>,
}

/// Name, context window, max output, then micro-dollars per million: input, output, cache
/// read, cache write (0 = not priced separately). List prices as published in 2025.
#[rustfmt::skip]
const BUILTIN: &[(&str, u64, u64, u64, u64, u64, u64)] = &[
    // OpenAI: cached input is a subset of prompt tokens; no separate write price.
    ("gpt-5",             400_000,   128_000,  1_250_000, 10_000_000,   125_000,          0),
    ("gpt-5-mini",        400_000,   128_000,    250_000,  2_000_000,    25_000,          0),
    ("gpt-5-nano",        400_000,   128_000,     50_000,    400_000,     5_000,          0),
    ("gpt-4.1",         1_047_576,    32_768,  2_000_000,  8_000_000,   500_000,          0),
    ("gpt-4.1-mini",    1_047_576,    32_768,    400_000,  1_600_000,   100_000,          0),
    ("gpt-4.1-nano",    1_047_576,    32_768,    100_000,    400_000,    25_000,          0),
    ("gpt-4o",            128_000,    16_384,  2_500_000, 10_000_000, 1_250_000,          0),
    ("gpt-4o-mini",       128_000,    16_384,    150_000,    600_000,    75_000,          0),
    ("o1",                200_000,   100_000, 15_000_000, 60_000_000, 7_500_000,          0),
    ("o3",                200_000,   100_000,  2_000_000,  8_000_000,   500_000,          0),
    ("o3-mini",           200_000,   100_000,  1_100_000,  4_400_000,   550_000,          0),
    ("o4-mini",           200_000,   100_000,  1_100_000,  4_400_000,   275_000,          0),
    ("gpt-4-turbo",       128_000,     4_096, 10_000_000, 30_000_000,         0,          0),
    ("gpt-4",               8_192,     8_192, 30_000_000, 60_000_000,         0,          0),
    ("gpt-3.5-turbo",      16_385,     4_096,    500_000,  1_500_000,         0,          0),
    // Anthropic: cache reads at 0.1x, five-minute cache writes at 1.25x the input price.
    ("claude-opus-4-5",   200_000,    64_000,  5_000_000, 25_000_000,   500_000,  6_250_000),
    ("claude-opus-4-1",   200_000,    32_000, 15_000_000, 75_000_000, 1_500_000, 18_750_000),
    ("claude-opus-4",     200_000,    32_000, 15_000_000, 75_000_000, 1_500_000, 18_750_000),
    ("claude-sonnet-4-5", 200_000,    64_000,  3_000_000, 15_000_000,   300_000,  3_750_000),
    ("claude-sonnet-4",   200_000,    64_000,  3_000_000, 15_000_000,   300_000,  3_750_000),
    ("claude-haiku-4-5",  200_000,    64_000,  1_000_000,  5_000_000,   100_000,  1_250_000),
    ("claude-3-7-sonnet", 200_000,    64_000,  3_000_000, 15_000_000,   300_000,  3_750_000),
    ("claude-3-5-sonnet", 200_000,     8_192,  3_000_000, 15_000_000,   300_000,  3_750_000),
    ("claude-3-5-haiku",  200_000,     8_192,    800_000,  4_000_000,    80_000,  1_000_000),
    ("claude-3-opus",     200_000,     4_096, 15_000_000, 75_000_000, 1_500_000, 18_750_000),
    ("claude-3-haiku",    200_000,     4_096,    250_000,  1_250_000,    30_000,    300_000),
];

impl Default for ModelTable {
    fn default() -> Self {
        Self::builtin()
    }
}

impl ModelTable {
    /// The built-in models.
    pub fn builtin() -> Self {
        let price = |p: u64| (p > 0).then_some(p);
        let models = BUILTIN
            .iter()
            .map(
                |&(name, context_window, max_output_tokens, input, output, read, write)| {
                    ModelInfo {
                        name: name.to_owned(),
                        context_window,
                        max_output_tokens,
                        input_per_million: input,
                        output_per_million: output,
                        cache_read_per_million: price(read),
                        cache_write_per_million: price(write),
                    }
                },
            )
            .collect();
        Self { models }
    }

    /// A table with no models (everything comes from overrides).
    pub fn empty() -> Self {
        Self { models: Vec::new() }
    }

    /// Applies configured overrides in order. Overriding a snapshot name the table only
    /// covers by prefix (`gpt-4o-2024-05-13`) adds that name, starting from the covering
    /// entry's values.
    pub fn with_overrides(
        mut self,
        overrides: impl IntoIterator<Item = ModelOverride>,
    ) -> Result<Self, ModelTableError> {
        for change in overrides {
            let name = change.name.trim();
            if name.is_empty() {
                return Err(ModelTableError::EmptyName);
            }
            let index = match self.models.iter().position(|m| m.name == name) {
                Some(index) => index,
                None => {
                    let base = match (self.get(name), change.context_window) {
                        (Some(covering), _) => ModelInfo {
                            name: name.to_owned(),
                            ..covering.clone()
                        },
                        (None, Some(context_window)) => ModelInfo {
                            name: name.to_owned(),
                            context_window,
                            max_output_tokens: context_window.min(8_192),
                            input_per_million: 0,
                            output_per_million: 0,
                            cache_read_per_million: None,
                            cache_write_per_million: None,
                        },
                        (None, None) => {
                            return Err(ModelTableError::UnknownWithoutWindow(name.to_owned()));
                        }
                    };
                    self.models.push(base);
                    self.models.len() - 1
                }
            };
            let entry = &mut self.models[index];
            entry.context_window = change.context_window.unwrap_or(entry.context_window);
            entry.max_output_tokens = change.max_output_tokens.unwrap_or(entry.max_output_tokens);
            entry.input_per_million = change.input_per_million.unwrap_or(entry.input_per_million);
            entry.output_per_million = change
                .output_per_million
                .unwrap_or(entry.output_per_million);
            entry.cache_read_per_million = change
                .cache_read_per_million
                .or(entry.cache_read_per_million);
            entry.cache_write_per_million = change
                .cache_write_per_million
                .or(entry.cache_write_per_million);
        }
        Ok(self)
    }

    /// The entry for `model`: an exact name, else the longest name that `model` extends
    /// after `-`, `:` or `@`. A provider prefix (`openai/`, `anthropic/`) is ignored.
    pub fn get(&self, model: &str) -> Option<&ModelInfo> {
        let model = model.rsplit('/').next().unwrap_or(model);
        if let Some(exact) = self
            .models
            .iter()
            .find(|m| m.name.eq_ignore_ascii_case(model))
        {
            return Some(exact);
        }
        let lower = model.to_ascii_lowercase();
        self.models
            .iter()
            .filter(|m| {
                lower
                    .strip_prefix(&m.name.to_ascii_lowercase())
                    .is_some_and(|rest| rest.starts_with(['-', ':', '@']))
            })
            .max_by_key(|m| m.name.len())
    }

    pub fn iter(&self) -> impl Iterator<Item = &ModelInfo> {
        self.models.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(table: &ModelTable, model: &str, expected: Option<&str>) {
        assert_eq!(
            table.get(model).map(|m| m.name.as_str()),
            expected,
            "{model}"
        );
    }

    #[test]
    fn snapshots_and_aliases_find_their_model() {
        let table = ModelTable::builtin();
        check(&table, "gpt-4o", Some("gpt-4o"));
        check(&table, "gpt-4o-2024-08-06", Some("gpt-4o"));
        check(&table, "gpt-4o-mini-2024-07-18", Some("gpt-4o-mini"));
        check(&table, "openai/gpt-4.1-nano", Some("gpt-4.1-nano"));
        check(&table, "gpt-4-0613", Some("gpt-4"));
        check(&table, "gpt-4.5-preview", None);
        check(&table, "o3-2025-04-16", Some("o3"));
        check(
            &table,
            "claude-sonnet-4-5-20250929",
            Some("claude-sonnet-4-5"),
        );
        check(&table, "claude-sonnet-4-20250514", Some("claude-sonnet-4"));
        check(
            &table,
            "claude-3-5-sonnet-latest",
            Some("claude-3-5-sonnet"),
        );
        check(&table, "claude-opus-4-1@20250805", Some("claude-opus-4-1"));
        check(&table, "llama3.1:8b", None);
    }

    #[test]
    fn costs_are_integer_micro_dollars_with_cache_prices() {
        let table = ModelTable::builtin();
        let sonnet = table.get("claude-sonnet-4-5").unwrap();
        // 1M plain input at $3 + 1M output at $15.
        assert_eq!(
            sonnet.cost(TokenUsage::new(1_000_000, 1_000_000)),
            MicroUsd(18_000_000)
        );
        // 1,000 input of which 800 read from cache and 100 written: 100×3 + 800×0.3 + 100×3.75.
        let usage = TokenUsage {
            input_tokens: 1_000,
            output_tokens: 0,
            cache_read_tokens: 800,
            cache_write_tokens: 100,
        };
        assert_eq!(sonnet.cost(usage), MicroUsd(300 + 240 + 375));
        // Inconsistent usage (cache counts above the input) never underflows.
        let odd = TokenUsage {
            input_tokens: 10,
            output_tokens: 0,
            cache_read_tokens: 50,
            cache_write_tokens: 50,
        };
        assert_eq!(sonnet.cost(odd), MicroUsd(3));
        assert_eq!(
            sonnet.pricing(),
            Pricing {
                input_per_million: 3_000_000,
                output_per_million: 15_000_000,
                cache_read_per_million: Some(300_000),
                cache_write_per_million: Some(3_750_000),
            }
        );
        // The engine charges with the same prices: a cached turn costs what the table says.
        let cached = TokenUsage {
            input_tokens: 1_000_000,
            output_tokens: 0,
            cache_read_tokens: 1_000_000,
            cache_write_tokens: 0,
        };
        assert_eq!(sonnet.pricing().cost(cached), MicroUsd(300_000));
    }

    #[test]
    fn overrides_change_add_and_refuse() {
        let table = ModelTable::builtin()
            .with_overrides([
                ModelOverride {
                    name: "gpt-4o".into(),
                    input_per_million: Some(1),
                    ..ModelOverride::default()
                },
                ModelOverride {
                    name: "gpt-4o-2024-05-13".into(),
                    input_per_million: Some(5_000_000),
                    ..ModelOverride::default()
                },
                ModelOverride {
                    name: "qwen2.5-coder:32b".into(),
                    context_window: Some(32_768),
                    ..ModelOverride::default()
                },
            ])
            .unwrap();
        assert_eq!(table.get("gpt-4o").unwrap().input_per_million, 1);
        let snapshot = table.get("gpt-4o-2024-05-13").unwrap();
        assert_eq!(
            (
                snapshot.input_per_million,
                snapshot.output_per_million,
                snapshot.context_window
            ),
            (5_000_000, 10_000_000, 128_000)
        );
        let local = table.get("qwen2.5-coder:32b").unwrap();
        assert_eq!(
            (
                local.context_window,
                local.max_output_tokens,
                local.input_per_million
            ),
            (32_768, 8_192, 0)
        );
        assert_eq!(
            ModelTable::builtin().with_overrides([ModelOverride {
                name: "mystery".into(),
                ..ModelOverride::default()
            }]),
            Err(ModelTableError::UnknownWithoutWindow("mystery".into()))
        );
        assert_eq!(
            ModelTable::empty().with_overrides([ModelOverride::default()]),
            Err(ModelTableError::EmptyName)
        );
    }
}
