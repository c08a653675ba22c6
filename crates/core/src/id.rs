//! Identifiers: UUID v7 newtypes, so ids sort by creation time and cannot be mixed up.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Returned when a string is not a valid id.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{input}` is not a valid {what} (expected a UUID such as 0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f)"
)]
pub struct ParseIdError {
    what: &'static str,
    input: String,
}

macro_rules! uuid_id {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub const fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            pub const fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s.trim())
                    .map(Self)
                    .map_err(|_| ParseIdError { what: $what, input: s.to_owned() })
            }
        }
    };
}

uuid_id!(
    /// One run of one agent on one task; the key of the event log.
    ExecutionId,
    "execution id"
);
uuid_id!(
    /// A unit of work handed to an agent.
    TaskId,
    "task id"
);
uuid_id!(
    /// A block of archived context the agent can `recall`.
    BlockId,
    "block id"
);

impl BlockId {
    /// `n` fresh ids in time order, for the blocks of one compaction: one clock read and
    /// one draw of the shared v7 context instead of one each (a draw costs about a
    /// microsecond, with a `getrandom` call; a compaction of a long conversation archives
    /// thousands of blocks). All share the first id's timestamp and v7 counter; their last
    /// 32 bits, the random tail below the counter, are drawn anew for each (seeded by the
    /// first id's tail) and made to increase, so that every id of the batch sorts after the
    /// ids made before it and before the ids made after it, like `n` calls of
    /// [`BlockId::new`], and the tails vary from id to id as theirs do (an id is part of
    /// the placeholder text whose tokens are counted).
    pub fn batch(n: usize) -> Vec<Self> {
        if n == 0 {
            return Vec::new();
        }
        let first = Uuid::now_v7().as_u128();
        let tail = u128::from(u32::MAX);
        let count = u64::try_from(n).unwrap_or(u64::MAX).min(1 << 32);
        // Tails drawn below 2^32 - n and sorted; adding each one's rank makes them strictly
        // increasing and still below 2^32, so they never carry into the counter (a batch of
        // more than 2^32 ids would, and is not a compaction).
        let span = (1_u64 << 32) - count + 1;
        let mut state = u64::try_from(first & u128::from(u64::MAX)).unwrap_or(0);
        let mut tails: Vec<u64> = (0..n).map(|_| splitmix64(&mut state) % span).collect();
        tails.sort_unstable();
        tails
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let t = u128::from(t) + rank as u128;
                Self(Uuid::from_u128((first & !tail) | (t & tail)))
            })
            .collect()
    }
}

/// SplitMix64: a fast, well-mixed sequence from any seed (not for secrets).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The id of one tool call. Providers choose these (`call_abc123`, `toolu_...`), so it is
/// an opaque string, not a UUID.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Debug)]
#[serde(transparent)]
pub struct ToolCallId(pub String);

impl fmt::Display for ToolCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ToolCallId {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sort_by_creation() {
        let a = ExecutionId::new();
        let b = ExecutionId::new();
        assert!(a < b, "v7 ids must sort by creation time");
        let parsed: ExecutionId = a.to_string().parse().unwrap();
        assert_eq!(parsed, a);
    }

    #[test]
    fn a_batch_of_block_ids_is_unique_and_in_time_order_with_single_ids() {
        for n in [0, 1, 2, 3_000] {
            let before = BlockId::new();
            let batch = BlockId::batch(n);
            let after = BlockId::new();
            assert_eq!(batch.len(), n);
            let mut all = vec![before];
            all.extend(&batch);
            all.push(after);
            assert!(all.windows(2).all(|w| w[0] < w[1]), "n = {n}: {all:?}");
            for id in &batch {
                assert_eq!(id.as_uuid().get_version_num(), 7, "{id}");
                assert_eq!(id.as_uuid().get_variant(), uuid::Variant::RFC4122, "{id}");
            }
        }
        // Two batches in a row do not overlap.
        let (a, b) = (BlockId::batch(100), BlockId::batch(100));
        assert!(a.last() < b.first());
        // The tails differ from id to id, not only by one.
        let tails: std::collections::HashSet<u32> = a
            .windows(2)
            .map(|w| (w[1].as_uuid().as_u128() - w[0].as_uuid().as_u128()) as u32)
            .collect();
        assert!(tails.len() > 10, "{tails:?}");
    }

    #[test]
    fn a_bad_id_names_what_was_expected() {
        let err = "nope".parse::<ExecutionId>().unwrap_err().to_string();
        assert!(err.contains("`nope` is not a valid execution id"), "{err}");
    }
}
