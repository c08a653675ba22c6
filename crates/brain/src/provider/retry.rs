//! Retry policy for transient provider failures: exponential backoff with jitter,
//! `Retry-After` honoured, bounded in attempts and in total time, and shaped by what went
//! wrong. A refused or reset connection waits long enough to outlast a server restart; a
//! 5xx that blames the request is retried once; everything else follows the general
//! schedule.

use nerve_core::event::ModelErrorKind;
use std::time::Duration;

/// How hard to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included, for errors other than connection failures.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Sleep no more than this in total across the retries of one call.
    pub max_total_delay: Duration,
    /// Attempts in all for a refused or reset connection ([`ModelErrorKind::Connection`]): a server
    /// restarting (LiteLLM takes 7 to 20 s) refuses connections until it listens again.
    pub connection_attempts: u32,
    /// The first wait after a connection failure; each later one doubles, up to
    /// `max_delay`. Half of each wait is fixed, so the waits add up to at least half the
    /// schedule however the jitter falls.
    pub connection_base_delay: Duration,
}

impl Default for RetryPolicy {
    /// Connection failures: 8 attempts, waits of 0.5–1, 1–2, 2–4, 4–8, 8–16, 15–30 and
    /// 15–30 s (45 s at least, 91 s at most). Others: 5 attempts, waits up to 0.25, 0.5, 1
    /// and 2 s. Never more than 120 s of waiting for one call.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(30),
            max_total_delay: Duration::from_secs(120),
            connection_attempts: 8,
            connection_base_delay: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1-based): uniformly random in
    /// `[0, min(max_delay, base * 2^(attempt-1))]`, but never shorter than `retry_after`.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self.ceiling(self.base_delay, attempt);
        let jittered = random_up_to(ceiling);
        retry_after.map_or(jittered, |after| jittered.max(after.min(self.max_delay)))
    }

    /// Whether to retry after attempt number `attempt` (1-based) failed with a transient
    /// error of `kind`, having slept `slept` so far for this call; `Some(wait)` to retry
    /// after `wait`, `None` to give up.
    pub fn next_delay(
        &self,
        attempt: u32,
        slept: Duration,
        kind: ModelErrorKind,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        let (limit, delay) = if kind == ModelErrorKind::Connection {
            let ceiling = self.ceiling(self.connection_base_delay, attempt);
            let half = ceiling / 2;
            (
                self.connection_attempts,
                half + random_up_to(ceiling - half),
            )
        } else if kind == ModelErrorKind::ServerRejected {
            (self.max_attempts.min(2), self.delay(attempt, retry_after))
        } else {
            (self.max_attempts, self.delay(attempt, retry_after))
        };
        (attempt < limit && slept + delay <= self.max_total_delay).then_some(delay)
    }

    fn ceiling(&self, base: Duration, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        base.saturating_mul(1 << exponent).min(self.max_delay)
    }
}

fn random_up_to(ceiling: Duration) -> Duration {
    let ceiling_ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(fastrand::u64(0..=ceiling_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_within_the_jitter_window_and_honour_retry_after() {
        let policy = RetryPolicy::default();
        for attempt in 1..=10 {
            for _ in 0..50 {
                let ceiling = policy
                    .base_delay
                    .saturating_mul(1 << (attempt - 1))
                    .min(policy.max_delay);
                assert!(policy.delay(attempt, None) <= ceiling);
                assert!(
                    policy.delay(attempt, Some(Duration::from_millis(400)))
                        >= Duration::from_millis(400)
                );
            }
        }
        // A provider asking for an hour gets at most the policy's ceiling.
        assert!(policy.delay(1, Some(Duration::from_secs(3600))) <= policy.max_delay);
    }

    /// Every wait of one call until the policy gives up.
    fn schedule(policy: &RetryPolicy, kind: ModelErrorKind) -> Vec<Duration> {
        let mut waits = Vec::new();
        let mut slept = Duration::ZERO;
        let mut attempt = 1;
        while let Some(wait) = policy.next_delay(attempt, slept, kind, None) {
            waits.push(wait);
            slept += wait;
            attempt += 1;
        }
        waits
    }

    #[test]
    fn connection_failures_wait_out_a_restart() {
        let policy = RetryPolicy::default();
        for _ in 0..200 {
            let waits = schedule(&policy, ModelErrorKind::Connection);
            let total: Duration = waits.iter().sum();
            assert_eq!(waits.len(), 7, "{waits:?}");
            assert!(total >= Duration::from_secs(45), "{total:?}");
            assert!(total <= policy.max_total_delay, "{total:?}");
        }
    }

    #[test]
    fn each_kind_gets_its_number_of_attempts() {
        let policy = RetryPolicy::default();
        for _ in 0..50 {
            assert_eq!(schedule(&policy, ModelErrorKind::ServerRejected).len(), 1);
            assert_eq!(schedule(&policy, ModelErrorKind::ServerError).len(), 4);
            assert_eq!(schedule(&policy, ModelErrorKind::RateLimited).len(), 4);
        }
        // The total bound holds whatever the kind.
        let tight = RetryPolicy {
            max_total_delay: Duration::from_secs(2),
            ..policy
        };
        assert!(
            schedule(&tight, ModelErrorKind::Connection)
                .iter()
                .sum::<Duration>()
                <= Duration::from_secs(2)
        );
        let wait = policy.next_delay(
            1,
            Duration::ZERO,
            ModelErrorKind::RateLimited,
            Some(Duration::from_secs(9)),
        );
        assert!(
            wait.is_some_and(|wait| wait >= Duration::from_secs(9)),
            "{wait:?}"
        );
    }
}
