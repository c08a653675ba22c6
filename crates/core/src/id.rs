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
    fn a_bad_id_names_what_was_expected() {
        let err = "nope".parse::<ExecutionId>().unwrap_err().to_string();
        assert!(err.contains("`nope` is not a valid execution id"), "{err}");
    }
}
