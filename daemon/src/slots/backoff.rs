//! The restart policy of a slot (`models.<name>.restart`): failed starts
//! are counted within a window and in a row without serving; below
//! `max_attempts` the next start waits a backoff that grows with the
//! attempts and with what the failed start cost, at `max_attempts` the slot
//! gives up until an operator restarts it. A failure identical to the one
//! before (same cause, same reason but for numbers) gives up after
//! `max_identical` in a row, whatever the time between: at a 27B model's
//! scale a start fails deterministically after a 25-minute load, and
//! retrying it resets the cards and reloads for ever.

use crate::config::RestartConfig;
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// The longest backoff a start's cost can add.
const COST_BACKOFF_CAP: Duration = Duration::from_secs(3600);

/// Failed starts, and the policy that judges them.
pub struct Backoff {
    failures: VecDeque<Instant>,
    window: Duration,
    max_attempts: u32,
    max_identical: u32,
    first: Duration,
    longest: Duration,
    /// Failed starts in a row that never served.
    unserved: u32,
    /// The last failure's fingerprint and how many in a row had it.
    last: Option<(Fingerprint, u32)>,
}

/// One failed start, as the policy judges it.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The cause, the reason and the lines that say what went wrong, with
    /// their numbers taken out ([`Fingerprint`]).
    pub fingerprint: &'a Fingerprint,
    /// How long the attempt ran before it failed.
    pub took: Duration,
    /// Whether it reached Ready (a worker that served, then died).
    pub served: bool,
}

/// What to do after a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Stop trying, and why, in words (which limit, with its numbers).
    GiveUp(String),
}

/// A failure's fingerprint: the cause and the reason, and the set of the
/// attempt's output lines that say what went wrong, each with every word
/// that holds a digit as `#` (pids, ports, durations, addresses and
/// temporary names differ between two runs of the same failure). Progress
/// lines do not count, nor the order of the telling ones: which lines come
/// last, and whether a stderr line passes a stdout one, is timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    head: String,
    telling: BTreeSet<String>,
}

/// Words that mark an output line as saying what went wrong.
const WRONG: &[&str] = &[
    "error",
    "Error",
    "ERROR",
    "exception",
    "Exception",
    "Traceback",
    "panicked",
    "fatal",
    "FATAL",
    "TT_THROW",
    "failed",
    "abort",
    "tt-worker",
];

impl Fingerprint {
    /// From the failure's cause label, its reason, and the attempt's own
    /// output lines (the worker's, read since the attempt began); with no
    /// output, the lines its reason quotes (`last output: a | b | c`).
    pub fn of(cause: &str, reason: &str, output: &[String]) -> Fingerprint {
        let (head, tail) = reason.split_once("last output: ").unwrap_or((reason, ""));
        let mut text = String::with_capacity(cause.len() + head.len() + 1);
        text.push_str(cause);
        text.push(':');
        normalize(head, &mut text);
        let quoted: Vec<&str> = tail.split(" | ").collect();
        let lines: Vec<&str> = if output.is_empty() {
            quoted
        } else {
            output.iter().map(String::as_str).collect()
        };
        let telling = lines
            .into_iter()
            .filter(|line| WRONG.iter().any(|w| line.contains(w)))
            .map(|line| {
                let mut n = String::new();
                normalize(line, &mut n);
                n
            })
            .collect();
        Fingerprint {
            head: text,
            telling,
        }
    }

    /// Whether two failures are the same one: the same cause and reason,
    /// and one's telling lines all among the other's (a consequence line
    /// that one run printed before its exit and the other did not, such
    /// as an adapter noticing its engine is gone, does not make them two).
    pub fn same_failure(&self, other: &Fingerprint) -> bool {
        self.head == other.head
            && (self.telling.is_subset(&other.telling) || other.telling.is_subset(&self.telling))
    }
}

/// [`Fingerprint::of`] a reason alone.
#[cfg(test)]
pub fn fingerprint(cause: &str, reason: &str) -> Fingerprint {
    Fingerprint::of(cause, reason, &[])
}

/// `text` onto `out` with every word that holds a digit as `#`.
fn normalize(text: &str, out: &mut String) {
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.chars().any(|c| c.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, out);
            out.push(c);
        }
    }
    flush(&mut word, out);
}

impl Backoff {
    /// A policy with no failures yet.
    pub fn new(r: &RestartConfig) -> Backoff {
        Backoff {
            failures: VecDeque::new(),
            window: Duration::from_secs(r.window_secs),
            max_attempts: r.max_attempts,
            max_identical: r.max_identical,
            first: Duration::from_millis(r.backoff_ms),
            longest: Duration::from_millis(r.backoff_max_ms),
            unserved: 0,
            last: None,
        }
    }

    /// Forget past failures (a start that served, an operator's restart).
    pub fn clear(&mut self) {
        self.failures.clear();
        self.unserved = 0;
        self.last = None;
    }

    /// The number of the next start attempt.
    pub fn attempt(&self) -> u32 {
        (self.failures.len() as u32).max(self.unserved) + 1
    }

    /// Count a failure at `now` and judge it.
    pub fn fail(&mut self, now: Instant, failure: Failure<'_>) -> Verdict {
        self.failures.push_back(now);
        while self
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            self.failures.pop_front();
        }
        // A start that served began a new run of failures.
        if failure.served {
            self.unserved = 0;
            self.last = None;
        } else {
            self.unserved += 1;
            let same = match &self.last {
                Some((fp, n)) if fp.same_failure(failure.fingerprint) => n + 1,
                _ => 1,
            };
            self.last = Some((failure.fingerprint.clone(), same));
            if self.max_identical > 0 && same >= self.max_identical {
                return Verdict::GiveUp(format!(
                    "the same failure {same} times in a row (restart.max_identical = {}), the last after {:.0}s",
                    self.max_identical,
                    failure.took.as_secs_f64()
                ));
            }
        }
        let in_window = self.failures.len() as u32;
        if in_window >= self.max_attempts {
            return Verdict::GiveUp(format!(
                "{in_window} failed start(s) within {}s (restart.max_attempts)",
                self.window.as_secs()
            ));
        }
        if self.unserved >= self.max_attempts {
            return Verdict::GiveUp(format!(
                "{} failed start(s) in a row without serving (restart.max_attempts)",
                self.unserved
            ));
        }
        let failures = in_window.max(self.unserved);
        // 1x, 2x, 4x ... the first backoff, capped; plus a tenth of what
        // the failed start cost (a start that loaded for 25 minutes waits
        // 2.5 more before the next), so retries of costly starts stay rare.
        let exponent = failures.saturating_sub(1).min(20);
        let delay = self
            .first
            .saturating_mul(1u32 << exponent)
            .min(self.longest)
            + (failure.took / 10).min(COST_BACKOFF_CAP);
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
            max_identical: 0,
            window_secs: 60,
            backoff_ms: 100,
            backoff_max_ms: 350,
            ..RestartConfig::default()
        }
    }

    /// A quick failure that never served, with its own fingerprint.
    fn quick(fp: &Fingerprint) -> Failure<'_> {
        Failure {
            fingerprint: fp,
            took: Duration::ZERO,
            served: false,
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_longest_then_gives_up() {
        let mut b = Backoff::new(&policy(5));
        let now = Instant::now();
        let verdicts: Vec<Verdict> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|fp| b.fail(now, quick(&fingerprint("exit_code", fp))))
            .collect();
        let ms = |v: &Verdict| match v {
            Verdict::Retry { delay, .. } => delay.as_millis(),
            Verdict::GiveUp(_) => 0,
        };
        assert_eq!(
            verdicts.iter().take(4).map(ms).collect::<Vec<_>>(),
            [100, 200, 350, 350]
        );
        assert!(
            matches!(&verdicts[4], Verdict::GiveUp(why) if why.contains("5 failed start(s) within 60s")),
            "{:?}",
            verdicts[4]
        );
        b.clear();
        assert_eq!(b.attempt(), 1);
    }

    #[test]
    fn failures_outside_the_window_still_count_in_a_row_without_serving() {
        let mut b = Backoff::new(&policy(2));
        let start = Instant::now();
        assert!(matches!(
            b.fail(start, quick(&fingerprint("exit_code", "a"))),
            Verdict::Retry { attempt: 2, .. }
        ));
        // 25 minutes later: alone in the window, but the second in a row.
        let later = start + Duration::from_secs(1500);
        assert!(
            matches!(b.fail(later, quick(&fingerprint("exit_code", "b"))), Verdict::GiveUp(why) if why.contains("2 failed start(s) in a row without serving")),
        );
        // A start that served breaks the run.
        let mut b = Backoff::new(&policy(2));
        b.fail(start, quick(&fingerprint("exit_code", "a")));
        let a = fingerprint("exit_code", "a");
        let served = Failure {
            served: true,
            ..quick(&a)
        };
        assert!(matches!(b.fail(later, served), Verdict::Retry { .. }));
    }

    #[test]
    fn the_same_failure_twice_gives_up_whatever_the_time_between_and_another_is_retried() {
        let r = RestartConfig {
            max_identical: 2,
            ..policy(5)
        };
        let start = Instant::now();
        let load = Duration::from_secs(25 * 60);
        let same = fingerprint(
            "start_failed",
            "NameError after loading 64 layers (pid 4121, at 0x7ffd3c2a, tmp.Ab3x)",
        );
        let again = fingerprint(
            "start_failed",
            "NameError after loading 64 layers (pid 9313, at 0x7ffe91b0, tmp.Q9zz)",
        );
        assert_eq!(same, again, "numbers aside");
        // The last output's progress lines are timing, its errors are not.
        let tail = |lines: &str| {
            fingerprint(
                "exit_code",
                &format!("worker exited with status 1; last output: {lines}"),
            )
        };
        assert_eq!(
            tail("INFO loading layer 3/64 | NameError: name 'x' is not defined"),
            tail("INFO Model loading took 1.2 s | INFO warming up | NameError: name 'x' is not defined"),
        );
        assert_ne!(
            tail("NameError: name 'x' is not defined"),
            tail("RuntimeError: shape mismatch"),
        );
        // From the attempt's own output: order is timing, and a line one
        // run printed and the other did not (an adapter noticing its
        // engine is gone) does not make them two failures; another error
        // does.
        let out = |lines: &[&str]| {
            let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            Fingerprint::of("exit_code", "worker exited with status 1", &lines)
        };
        let first = out(&[
            "INFO loading",
            "RuntimeError: The size of tensor a (5120) must match",
            "ERROR Failed core proc(s): {}",
        ]);
        let swapped = out(&[
            "ERROR Failed core proc(s): {}",
            "RuntimeError: The size of tensor a (5120) must match",
            "INFO done",
        ]);
        let more = out(&[
            "RuntimeError: The size of tensor a (5120) must match",
            "tt-worker-openai: vLLM's engine core is gone",
            "ERROR Failed core proc(s): {}",
        ]);
        let other = out(&[
            "NameError: name 'rope_setup' is not defined",
            "ERROR Failed core proc(s): {}",
        ]);
        assert!(
            first.same_failure(&swapped) && first.same_failure(&more) && more.same_failure(&first)
        );
        assert!(!first.same_failure(&other) && !other.same_failure(&more));
        let failure = |fp| Failure {
            fingerprint: fp,
            took: load,
            served: false,
        };
        let mut b = Backoff::new(&r);
        match b.fail(start, failure(&same)) {
            // The backoff grows with the start's cost: a tenth of 25 min.
            Verdict::Retry { delay, .. } => {
                assert_eq!(delay, Duration::from_millis(100) + load / 10)
            }
            v => panic!("{v:?}"),
        }
        let v = b.fail(start + 2 * load, failure(&again));
        assert!(
            matches!(&v, Verdict::GiveUp(why) if why.contains("the same failure 2 times in a row (restart.max_identical = 2), the last after 1500s")),
            "{v:?}"
        );

        let mut b = Backoff::new(&r);
        b.fail(start, failure(&same));
        let other = fingerprint("exit_code", "shape mismatch in layer 3");
        assert!(matches!(
            b.fail(start + 2 * load, failure(&other)),
            Verdict::Retry { attempt: 3, .. }
        ));
        // max_identical = 0: no such limit.
        let mut b = Backoff::new(&policy(5));
        b.fail(start, failure(&same));
        assert!(matches!(
            b.fail(start, failure(&same)),
            Verdict::Retry { .. }
        ));
    }
}
