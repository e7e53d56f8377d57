//! The retry hint an UNAVAILABLE answer carries: when trying again is
//! expected to find a Ready slot, or that it will not until an operator
//! acts. The router computes it from the slots' recovery (see
//! [`crate::slots::recovery`]); each front door renders it its own way:
//! gRPC as the `grpc-retry-pushback-ms` metadata (gRFC A6, honoured by gRPC
//! clients with a retry policy), HTTP as `Retry-After`.

use crate::slots::Availability;
use std::time::Duration;

/// When to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryHint {
    /// A slot is expected Ready after this long.
    After(Duration),
    /// No slot is Ready or on its way back (quarantined, stopped, given up):
    /// retrying will not help until an operator or a reload acts.
    NotUntilFixed,
}

impl RetryHint {
    /// The shortest hint: a slot is Ready or about to be, but clients that
    /// retry at once, all together, only meet each other.
    pub const MIN: Duration = Duration::from_millis(100);
    /// The longest: estimates beyond it come from long starts (a cold
    /// build) and are the least sure, so clients look again after this.
    pub const MAX: Duration = Duration::from_secs(30);
    /// When a recovering slot has no past start to estimate from.
    pub const UNKNOWN: Duration = Duration::from_secs(1);

    /// The hint for a model in this state; None when nothing honest can be
    /// said (a slot draining or stopped may be restarting, or going away
    /// for good), so a client keeps to its own backoff.
    pub fn for_availability(availability: Availability) -> Option<RetryHint> {
        Some(match availability {
            Availability::Ready => RetryHint::After(Self::MIN),
            Availability::Recovering { eta } => {
                RetryHint::After(eta.unwrap_or(Self::UNKNOWN).clamp(Self::MIN, Self::MAX))
            }
            Availability::Retrying { retry_in } => {
                RetryHint::After(retry_in.clamp(Self::MIN, Self::MAX))
            }
            Availability::Stopped => return None,
            Availability::Down => RetryHint::NotUntilFixed,
        })
    }

    /// The value of gRPC's `grpc-retry-pushback-ms`: milliseconds, or -1,
    /// which tells a gRPC client not to retry the call (gRFC A6).
    pub fn grpc_pushback_ms(&self) -> String {
        match self {
            RetryHint::After(d) => d.as_millis().to_string(),
            RetryHint::NotUntilFixed => "-1".into(),
        }
    }

    /// HTTP's `Retry-After` in whole seconds, rounded up; None when
    /// retrying will not help (no header).
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            RetryHint::After(d) => Some(d.as_millis().div_ceil(1000).max(1) as u64),
            RetryHint::NotUntilFixed => None,
        }
    }

    /// The hint in words, for the end of an error message.
    pub fn describe(&self) -> String {
        match self {
            RetryHint::After(d) => format!("retry in about {:.1} s", d.as_secs_f64()),
            RetryHint::NotUntilFixed => {
                "no slot is on its way back, so retrying will not help until an operator acts"
                    .into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_are_bounded() {
        let hint = |a| RetryHint::for_availability(a);
        let eta = |eta| hint(Availability::Recovering { eta });
        let soon = RetryHint::After(Duration::from_millis(2345));
        assert_eq!(eta(Some(Duration::from_millis(2345))), Some(soon));
        assert_eq!(soon.grpc_pushback_ms(), "2345");
        assert_eq!(soon.retry_after_secs(), Some(3));
        assert_eq!(soon.describe(), "retry in about 2.3 s");

        let after = |d| Some(RetryHint::After(d));
        assert_eq!(eta(Some(Duration::ZERO)), after(RetryHint::MIN));
        assert_eq!(eta(Some(Duration::from_secs(600))), after(RetryHint::MAX));
        assert_eq!(eta(None), after(RetryHint::UNKNOWN));
        assert_eq!(hint(Availability::Ready), after(RetryHint::MIN));
        assert_eq!(RetryHint::After(RetryHint::MIN).retry_after_secs(), Some(1));

        let down = RetryHint::NotUntilFixed;
        assert_eq!(hint(Availability::Down), Some(down));
        assert_eq!(down.grpc_pushback_ms(), "-1");
        assert_eq!(down.retry_after_secs(), None);

        // A start that never succeeded retries by itself: its backoff.
        assert_eq!(
            hint(Availability::Retrying {
                retry_in: Duration::from_secs(4)
            }),
            after(Duration::from_secs(4))
        );

        // Draining or stopped: no estimate.
        assert_eq!(hint(Availability::Stopped), None);
    }
}
