//! The restart policy of a slot (`models.<name>.restart`): failed starts
//! are counted within a window; below `max_attempts` the next start waits
//! an exponentially growing backoff, at `max_attempts` the slot gives up
//! until an operator restarts it.

use crate::config::RestartConfig;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Failed starts within the window, and the policy that judges them.
pub struct Backoff {
    failures: VecDeque<Instant>,
    window: Duration,
    max_attempts: u32,
    first: Duration,
    longest: Duration,
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Wait `delay`, then make attempt `attempt` of `max_attempts`.
    Retry {
        /// The backoff before the next start.
        delay: Duration,
        /// The number of the next attempt.
        attempt: u32,
        /// `restart.max_attempts`.
        max_attempts: u32,
    },
    /// Stop trying: `failures` starts failed within the window.
    GiveUp {
        /// Failed starts within the window.
        failures: u32,
        /// `restart.window_secs`.
        window_secs: u64,
    },
}

impl Backoff {
    /// A policy with no failures yet.
    pub fn new(r: &RestartConfig) -> Backoff {
        Backoff {
            failures: VecDeque::new(),
            window: Duration::from_secs(r.window_secs),
            max_attempts: r.max_attempts,
            first: Duration::from_millis(r.backoff_ms),
            longest: Duration::from_millis(r.backoff_max_ms),
        }
    }

    /// Forget past failures (a start that served, an operator's restart).
    pub fn clear(&mut self) {
        self.failures.clear();
    }

    /// The number of the next start attempt.
    pub fn attempt(&self) -> u32 {
        self.failures.len() as u32 + 1
    }

    /// Count a failure at `now` and judge it.
    pub fn fail(&mut self, now: Instant) -> Verdict {
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            self.failures.pop_front();
        }
        let failures = self.failures.len() as u32;
        if failures >= self.max_attempts {
            return Verdict::GiveUp {
                failures,
                window_secs: self.window.as_secs(),
            };
        }
        // 1x, 2x, 4x ... the first backoff, capped.
        let exponent = failures.saturating_sub(1).min(20);
        let delay = self
            .first
            .saturating_mul(1u32 << exponent)
            .min(self.longest);
        Verdict::Retry {
            delay,
            attempt: failures + 1,
            max_attempts: self.max_attempts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_attempts: u32) -> RestartConfig {
        RestartConfig {
            max_attempts,
            window_secs: 60,
            backoff_ms: 100,
            backoff_max_ms: 350,
            ..RestartConfig::default()
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_longest_then_gives_up() {
        let mut b = Backoff::new(&policy(5));
        let now = Instant::now();
        let delays: Vec<Verdict> = (0..5).map(|_| b.fail(now)).collect();
        let ms = |v: &Verdict| match v {
            Verdict::Retry { delay, .. } => delay.as_millis(),
            Verdict::GiveUp { .. } => 0,
        };
        assert_eq!(
            delays.iter().take(4).map(ms).collect::<Vec<_>>(),
            [100, 200, 350, 350]
        );
        assert_eq!(
            delays[4],
            Verdict::GiveUp {
                failures: 5,
                window_secs: 60
            }
        );
        b.clear();
        assert_eq!(b.attempt(), 1);
    }

    #[test]
    fn failures_outside_the_window_are_forgotten() {
        let mut b = Backoff::new(&policy(2));
        let start = Instant::now();
        assert!(matches!(b.fail(start), Verdict::Retry { attempt: 2, .. }));
        let later = start + Duration::from_secs(61);
        assert!(matches!(b.fail(later), Verdict::Retry { attempt: 2, .. }));
        assert!(matches!(b.fail(later), Verdict::GiveUp { failures: 2, .. }));
    }
}
