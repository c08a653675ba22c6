//! Retry policy for transient provider failures: exponential backoff with full jitter,
//! `Retry-After` honoured, bounded in attempts and in total time.

use std::time::Duration;

/// How hard to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Sleep no more than this in total across the retries of one call.
    pub max_total_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(30),
            max_total_delay: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1-based): uniformly random in
    /// `[0, min(max_delay, base * 2^(attempt-1))]`, but never shorter than `retry_after`.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exponent = attempt.saturating_sub(1).min(20);
        let ceiling = self
            .base_delay
            .saturating_mul(1 << exponent)
            .min(self.max_delay);
        let ceiling_ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        let jittered = Duration::from_millis(fastrand::u64(0..=ceiling_ms));
        retry_after.map_or(jittered, |after| jittered.max(after.min(self.max_delay)))
    }
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
}
