//! Token usage, money in integer micro-dollars, and the record of one turn.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

use crate::message::ToolCall;

/// Tokens spent by one or more model calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's prompt cache (a subset of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Input tokens written to the provider's prompt cache (a subset of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TokenUsage {
    pub const fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
        }
    }

    pub const fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

impl Add for TokenUsage {
    type Output = Self;

    fn add(self, rhs: Self) -> Self {
        Self {
            input_tokens: self.input_tokens.saturating_add(rhs.input_tokens),
            output_tokens: self.output_tokens.saturating_add(rhs.output_tokens),
            cache_read_tokens: self.cache_read_tokens.saturating_add(rhs.cache_read_tokens),
            cache_write_tokens: self
                .cache_write_tokens
                .saturating_add(rhs.cache_write_tokens),
        }
    }
}

impl AddAssign for TokenUsage {
    fn add_assign(&mut self, rhs: Self) {
        *self = *self + rhs;
    }
}

impl Sum for TokenUsage {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), Add::add)
    }
}

/// Money in millionths of a US dollar. Integer so that sums never drift.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MicroUsd(pub u64);

impl MicroUsd {
    pub const ZERO: Self = Self(0);

    /// The cost of `tokens` at `usd_per_million` dollars per million tokens, rounded up
    /// to the next micro-dollar so a budget is never under-charged.
    pub fn for_tokens(tokens: u64, micro_usd_per_million: u64) -> Self {
        let product = u128::from(tokens) * u128::from(micro_usd_per_million);
        let micros = product.div_ceil(1_000_000);
        Self(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// Whole dollars as a float, for display and JSON output only.
    pub fn as_usd(self) -> f64 {
        // Precision loss above 2^53 micro-dollars (9 billion dollars) is acceptable for display.
        #[allow(clippy::cast_precision_loss)]
        let micros = self.0 as f64;
        micros / 1_000_000.0
    }

    /// Parse a dollar amount such as `0.25` given by a user. Rejects negatives and NaN.
    pub fn from_usd(usd: f64) -> Option<Self> {
        if !(0.0..=1e12).contains(&usd) {
            return None;
        }
        // Range checked above, so the cast cannot truncate meaningfully.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let micros = (usd * 1_000_000.0).round() as u64;
        Some(Self(micros))
    }
}

impl Add for MicroUsd {
    type Output = Self;

    fn add(self, rhs: Self) -> Self {
        Self(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for MicroUsd {
    fn add_assign(&mut self, rhs: Self) {
        *self = *self + rhs;
    }
}

impl Sum for MicroUsd {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::ZERO, Add::add)
    }
}

impl fmt::Display for MicroUsd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// What one turn (one model call and the tool calls it asked for) did and cost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// 1-based and contiguous within an execution.
    pub turn: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub tool_calls: Vec<ToolCall>,
    /// Why the turn's model call stopped.
    pub finish: FinishReason,
    pub duration_ms: u64,
}

/// Why the model stopped producing output. On the wire: `stop`, `tool_calls`, `max_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A final answer (also: a stop sequence, or an unknown reason a server sent).
    Stop,
    /// The model asked for tool calls.
    ToolCalls,
    /// The output hit the token limit; the loop asks the model to continue.
    MaxTokens,
}

impl FinishReason {
    /// The wire spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool_calls",
            Self::MaxTokens => "max_tokens",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_are_snake_case_on_the_wire_and_in_text() {
        for (reason, wire) in [
            (FinishReason::Stop, "stop"),
            (FinishReason::ToolCalls, "tool_calls"),
            (FinishReason::MaxTokens, "max_tokens"),
        ] {
            assert_eq!(serde_json::to_value(reason).unwrap(), wire);
            assert_eq!(reason.to_string(), wire);
            assert_eq!(
                serde_json::from_value::<FinishReason>(wire.into()).unwrap(),
                reason
            );
        }
        assert!(serde_json::from_value::<FinishReason>("length".into()).is_err());
    }

    #[test]
    fn cost_rounds_up_to_the_next_micro_dollar() {
        // 1 token at $3 per million = 3 micro-dollars exactly.
        assert_eq!(MicroUsd::for_tokens(1, 3_000_000), MicroUsd(3));
        // 1 token at $0.15 per million = 0.15 micro-dollars, charged as 1.
        assert_eq!(MicroUsd::for_tokens(1, 150_000), MicroUsd(1));
        assert_eq!(MicroUsd::for_tokens(0, 150_000), MicroUsd(0));
        assert_eq!(MicroUsd(1_250_000).to_string(), "$1.250000");
    }

    #[test]
    fn dollar_amounts_parse_and_reject_nonsense() {
        assert_eq!(MicroUsd::from_usd(0.25), Some(MicroUsd(250_000)));
        assert_eq!(MicroUsd::from_usd(-1.0), None);
        assert_eq!(MicroUsd::from_usd(f64::NAN), None);
    }
}
