//! How far a slot is from Ready, for the router: whether a model without a
//! Ready slot is worth waiting for, and the retry hint its refusals carry.
//!
//! Each slot keeps the phases of its start in progress (the states since it
//! last failed or left Ready, with when each was entered) and the phases of
//! its last start that reached Ready, with how long each took. A slot on
//! its way back in phase P, entered `e` ago, is expected Ready in
//! `max(0, last(P) - e)` plus the sum of the last start's phases that come
//! after P (Locking, Resetting, Probing, Starting, Loading, Verifying, in
//! that order). A slot Failed with a retry scheduled waits until its
//! `retry_at` first, then takes every phase after Failed. So the estimate
//! follows the path the last start took: a recovery after a kill (reset,
//! warm start) predicts the next one; the first recovery goes by the
//! initial start, which may have been cold (longer) or clean (no reset,
//! shorter). A slot that was never Ready has no estimate.

use super::SlotState;
use std::time::{Duration, Instant, SystemTime};

/// Where a state lies on the way to Ready; None for states that are not on
/// it (Ready itself, Draining, Stopped, Quarantined).
fn order(state: SlotState) -> Option<u8> {
    Some(match state {
        SlotState::Pending | SlotState::Failed => 0,
        SlotState::Locking => 1,
        SlotState::Resetting => 2,
        SlotState::Probing => 3,
        SlotState::Starting => 4,
        SlotState::Loading => 5,
        SlotState::Verifying => 6,
        SlotState::Ready | SlotState::Draining | SlotState::Stopped | SlotState::Quarantined => {
            return None
        }
    })
}

/// Whether a slot in this state comes back to Ready by itself: a state on
/// the way to Ready, or Failed with a retry scheduled (the router waits for
/// the latter only once the slot has served: [`Timeline::has_served`]).
/// Quarantined, Stopped,
/// Draining (which ends in Stopped unless a restart follows) and Failed
/// without a retry (given up) need an operator or a reload.
pub fn is_recovering(state: SlotState, retry_at: Option<SystemTime>) -> bool {
    match state {
        SlotState::Failed => retry_at.is_some(),
        s => order(s).is_some(),
    }
}

/// The most phases kept for the start in progress (a normal start has
/// fewer than ten).
const MAX_PHASES: usize = 64;

/// One slot's phases: the start in progress and the last one that reached
/// Ready.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// States of the start in progress, each with when it was entered.
    current: Vec<(SlotState, Instant)>,
    /// States of the last start that reached Ready, each with how long the
    /// slot spent in it.
    last: Vec<(SlotState, Duration)>,
}

impl Timeline {
    /// A slot just configured (Pending).
    pub fn new(now: Instant) -> Timeline {
        Timeline {
            current: vec![(SlotState::Pending, now)],
            last: Vec::new(),
        }
    }

    /// Record a change of state (`from` != `to`).
    pub fn enter(&mut self, from: SlotState, to: SlotState, now: Instant) {
        if to == SlotState::Ready {
            if !self.current.is_empty() {
                let ends = self.current.iter().skip(1).map(|(_, t)| *t);
                self.last = self
                    .current
                    .iter()
                    .zip(ends.chain(std::iter::once(now)))
                    .map(|((state, entered), left)| {
                        (*state, left.saturating_duration_since(*entered))
                    })
                    .collect();
            }
            self.current.clear();
        } else if to == SlotState::Failed || from == SlotState::Ready {
            // A failure begins a new attempt: the phases of the failed one
            // are not the way to Ready.
            self.current = vec![(to, now)];
        } else {
            // A start that never ends (a card flapping between held and
            // quarantined for days) must not grow without bound; its oldest
            // phases are the least useful to an estimate.
            if self.current.len() >= MAX_PHASES {
                self.current.remove(0);
            }
            self.current.push((to, now));
        }
    }

    /// The expected time until Ready of a slot in `state` (None when the
    /// slot was never Ready, so there is nothing to go by). `retry_at` is
    /// the slot's scheduled retry (Failed only).
    pub fn eta(
        &self,
        state: SlotState,
        retry_at: Option<SystemTime>,
        now: Instant,
    ) -> Option<Duration> {
        if self.last.is_empty() {
            return None;
        }
        let here_order = order(state)?;
        let later: Duration = self
            .last
            .iter()
            .filter(|(s, _)| order(*s).is_some_and(|o| o > here_order))
            .map(|(_, d)| *d)
            .sum();
        let here = if state == SlotState::Failed {
            retry_at?
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        } else {
            let took: Duration = self
                .last
                .iter()
                .filter(|(s, _)| *s == state)
                .map(|(_, d)| *d)
                .sum();
            let entered = self
                .current
                .last()
                .filter(|(s, _)| *s == state)
                .map_or(now, |(_, t)| *t);
            took.saturating_sub(now.saturating_duration_since(entered))
        };
        Some(here + later)
    }

    /// Whether the slot has ever reached Ready (then its failures are
    /// recoveries, worth waiting for; before, a failing start may be a
    /// broken config that no retry fixes).
    pub fn has_served(&self) -> bool {
        !self.last.is_empty()
    }

    /// The expected time until Ready of a slot whose worker has just been
    /// lost while it still shows Ready: every phase of its last start.
    pub fn eta_after_loss(&self) -> Option<Duration> {
        if self.last.is_empty() {
            return None;
        }
        Some(
            self.last
                .iter()
                .filter(|(s, _)| order(*s).is_some_and(|o| o > 0))
                .map(|(_, d)| *d)
                .sum(),
        )
    }
}

/// Whether a model can serve now, soon, or not without help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// A slot is Ready (it may be busy).
    Ready,
    /// No slot is Ready, but at least one is on its way back. `eta`: the
    /// soonest any of them is expected Ready, None when none of them has a
    /// past start to go by.
    Recovering {
        /// The expected time until the first slot is Ready.
        eta: Option<Duration>,
    },
    /// No slot is Ready or on its way back, but one that has never been
    /// Ready is backing off after a failed start: it retries by itself in
    /// `retry_in`, but nothing shows that the cause is passing (a missing
    /// checkpoint fails every attempt), so requests do not wait for it.
    Retrying {
        /// Until the soonest next attempt.
        retry_in: Duration,
    },
    /// No slot is Ready or on its way back, but one is draining or stopped:
    /// a restart, a reload or a card loan may bring it back, or not, and
    /// when is not known.
    Stopped,
    /// Every slot is quarantined or has given up: an operator or a reload
    /// has to act.
    Down,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A timeline that went through `phases` (state, duration) to Ready,
    /// and the instant it reached Ready.
    fn through(start: Instant, phases: &[(SlotState, u64)]) -> (Timeline, Instant) {
        let mut t = Timeline::new(start);
        let mut now = start;
        let mut from = SlotState::Pending;
        for (state, took) in phases {
            if *state != from {
                t.enter(from, *state, now);
                from = *state;
            }
            now += ms(*took);
        }
        t.enter(from, SlotState::Ready, now);
        (t, now)
    }

    #[test]
    fn a_slot_never_ready_has_no_estimate() {
        let now = Instant::now();
        let t = Timeline::new(now);
        assert_eq!(t.eta(SlotState::Loading, None, now), None);
        assert_eq!(t.eta_after_loss(), None);
    }

    #[test]
    fn the_estimate_is_what_is_left_of_the_last_starts_phases() {
        let start = Instant::now();
        let (mut t, ready) = through(
            start,
            &[
                (SlotState::Pending, 10),
                (SlotState::Locking, 20),
                (SlotState::Resetting, 1000),
                (SlotState::Probing, 2000),
                (SlotState::Starting, 100),
                (SlotState::Loading, 300),
                (SlotState::Verifying, 50),
            ],
        );
        // Lost while Ready: every phase after Pending/Failed.
        assert_eq!(t.eta_after_loss(), Some(ms(3470)));
        // A kill: Failed, then into Resetting 400 ms ago.
        let failed = ready + Duration::from_secs(60);
        t.enter(SlotState::Ready, SlotState::Failed, failed);
        t.enter(SlotState::Failed, SlotState::Resetting, failed + ms(50));
        let now = failed + ms(450);
        assert_eq!(
            t.eta(SlotState::Resetting, None, now),
            Some(ms(600 + 2000 + 100 + 300 + 50))
        );
        // A phase running longer than last time counts as about to end.
        assert_eq!(
            t.eta(SlotState::Resetting, None, failed + ms(5000)),
            Some(ms(2450))
        );
        // The state ordering skips phases the last start did not have.
        t.enter(SlotState::Resetting, SlotState::Verifying, now);
        assert_eq!(
            t.eta(SlotState::Verifying, None, now + ms(20)),
            Some(ms(30))
        );
    }

    #[test]
    fn a_failed_slot_waits_for_its_retry_first() {
        let start = Instant::now();
        let (t, _) = through(
            start,
            &[(SlotState::Starting, 100), (SlotState::Loading, 200)],
        );
        let retry_at = SystemTime::now() + Duration::from_secs(10);
        let eta = t
            .eta(SlotState::Failed, Some(retry_at), Instant::now())
            .expect("an estimate");
        assert!(eta > Duration::from_secs(9) && eta <= ms(10_300), "{eta:?}");
        // Failed without a retry is not on its way back.
        assert_eq!(t.eta(SlotState::Failed, None, Instant::now()), None);
        assert!(!is_recovering(SlotState::Failed, None));
        assert!(is_recovering(SlotState::Failed, Some(retry_at)));
        assert!(!is_recovering(SlotState::Quarantined, None));
        assert!(is_recovering(SlotState::Probing, None));
    }

    #[test]
    fn a_start_that_never_ends_keeps_a_bounded_record() {
        let start = Instant::now();
        let mut t = Timeline::new(start);
        let mut from = SlotState::Pending;
        for i in 0..10_000u64 {
            let to = if i % 2 == 0 {
                SlotState::Quarantined
            } else {
                SlotState::Locking
            };
            t.enter(from, to, start + ms(i));
            from = to;
        }
        assert!(t.current.len() <= MAX_PHASES);
    }

    #[test]
    fn a_failed_attempt_does_not_count_toward_the_next_estimate() {
        let start = Instant::now();
        let mut t = Timeline::new(start);
        t.enter(SlotState::Pending, SlotState::Loading, start);
        // This attempt fails after 5 s of loading...
        t.enter(SlotState::Loading, SlotState::Failed, start + ms(5000));
        t.enter(SlotState::Failed, SlotState::Loading, start + ms(5100));
        // ...the next one loads in 200 ms and verifies in 10.
        t.enter(SlotState::Loading, SlotState::Verifying, start + ms(5300));
        t.enter(SlotState::Verifying, SlotState::Ready, start + ms(5310));
        assert_eq!(t.eta_after_loss(), Some(ms(210)));
    }
}
