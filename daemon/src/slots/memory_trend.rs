//! A serving worker's memory over time. The field saw an engine's host
//! memory grow 10 GB over six days until the kernel's OOM killer ended it
//! and its cards wedged; `restart.rss_limit_mib` restarts such a worker in
//! time, but nobody hears of the leak before. This watches the slot's
//! memory and reports a steady growth (a log line, the slot's status, a
//! gauge) as soon as one window of samples shows it, long before a limit
//! or the kernel acts.
//!
//! "Steady" is judged on a window of samples cut in four quarters by time:
//! each quarter's mean above the one before, and the last above the first
//! by at least the report size. A start's one-off growth (KV buffers,
//! warm-up) levels off, so its later quarters stop rising; a leak does not.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Samples kept per window: enough for four quarters to average out
/// noise, few enough to cost nothing over days.
const SAMPLES_PER_WINDOW: u32 = 48;

/// A steady growth, as reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Growth {
    /// Last quarter's mean less the first's, in bytes.
    pub grew_bytes: u64,
    /// The time the samples span.
    pub over: Duration,
    /// The least-squares slope over the window, bytes per hour.
    pub bytes_per_hour: f64,
    /// The latest sample, bytes.
    pub now_bytes: u64,
}

impl Growth {
    /// `grew 1.2 GiB in 24h 0m (51.2 MiB/h)`; `until` adds when the
    /// growth reaches a named limit at this rate.
    pub fn describe(&self, limit: Option<(&str, u64)>) -> String {
        let mut text = format!(
            "grew {} steadily in {} ({} per hour), now {}",
            bytes(self.grew_bytes),
            duration(self.over),
            bytes(self.bytes_per_hour.max(0.0) as u64),
            bytes(self.now_bytes),
        );
        if let Some((name, limit)) = limit {
            if self.bytes_per_hour > 0.0 && limit > self.now_bytes {
                let hours = (limit - self.now_bytes) as f64 / self.bytes_per_hour;
                text.push_str(&format!(
                    "; at this rate it reaches {name} ({}) in about {}",
                    bytes(limit),
                    duration(Duration::from_secs_f64((hours * 3600.0).min(1e9)))
                ));
            }
        }
        text
    }
}

/// The samples of one worker's life.
#[derive(Debug)]
pub struct MemoryTrend {
    window: Duration,
    report_bytes: u64,
    spacing: Duration,
    samples: VecDeque<(Instant, u64)>,
    reported: bool,
}

impl MemoryTrend {
    /// A trend judged over `window`, reported from `report_bytes` of
    /// growth; a zero window judges nothing.
    pub fn new(window: Duration, report_bytes: u64) -> MemoryTrend {
        MemoryTrend {
            window,
            report_bytes,
            spacing: window / SAMPLES_PER_WINDOW,
            samples: VecDeque::new(),
            reported: false,
        }
    }

    /// Take a sample (kept only every window/48) and judge. The first time
    /// a steady growth is seen, `Reported::New`; while it lasts,
    /// `Reported::Still` with fresh figures; a growth that stopped clears
    /// the report.
    pub fn sample(&mut self, at: Instant, bytes: u64) -> Reported {
        if self.window.is_zero() {
            return Reported::None;
        }
        let due = self
            .samples
            .back()
            .is_none_or(|(last, _)| at.saturating_duration_since(*last) >= self.spacing);
        if !due {
            return Reported::Unchanged;
        }
        self.samples.push_back((at, bytes));
        // Keep one sample at or beyond the window's start.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| at.saturating_duration_since(*t) >= self.window)
        {
            self.samples.pop_front();
        }
        match (self.growth(), self.reported) {
            (Some(g), false) => {
                self.reported = true;
                Reported::New(g)
            }
            (Some(g), true) => Reported::Still(g),
            (None, true) => {
                self.reported = false;
                Reported::Stopped
            }
            (None, false) => Reported::None,
        }
    }

    /// The steady growth the window shows, if it shows one.
    pub fn growth(&self) -> Option<Growth> {
        let (first, _) = *self.samples.front()?;
        let (last, now_bytes) = *self.samples.back()?;
        let over = last.saturating_duration_since(first);
        if over < self.window || self.samples.len() < 8 {
            return None;
        }
        let quarter = |q: u32| -> Option<f64> {
            let from = first + over * q / 4;
            let to = first + over * (q + 1) / 4;
            let values: Vec<f64> = self
                .samples
                .iter()
                .filter(|(t, _)| *t >= from && (*t < to || (q == 3 && *t <= to)))
                .map(|(_, b)| *b as f64)
                .collect();
            (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
        };
        let means = [quarter(0)?, quarter(1)?, quarter(2)?, quarter(3)?];
        if !means.windows(2).all(|w| w[1] > w[0]) {
            return None;
        }
        let grew = means[3] - means[0];
        if grew < self.report_bytes as f64 {
            return None;
        }
        Some(Growth {
            grew_bytes: grew as u64,
            over,
            bytes_per_hour: self.slope_per_second() * 3600.0,
            now_bytes,
        })
    }

    /// Least-squares slope of bytes over seconds.
    fn slope_per_second(&self) -> f64 {
        let Some((t0, _)) = self.samples.front() else {
            return 0.0;
        };
        let points: Vec<(f64, f64)> = self
            .samples
            .iter()
            .map(|(t, b)| (t.saturating_duration_since(*t0).as_secs_f64(), *b as f64))
            .collect();
        let n = points.len() as f64;
        let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
        if sxx == 0.0 {
            0.0
        } else {
            sxy / sxx
        }
    }
}

/// What a sample changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reported {
    /// Not a sample (too soon after the last one).
    Unchanged,
    /// No steady growth.
    None,
    /// A steady growth seen for the first time.
    New(Growth),
    /// A growth reported before goes on.
    Still(Growth),
    /// A growth reported before has stopped.
    Stopped,
}

fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mib = n as f64 / MIB;
    if mib >= 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.0} MiB")
    }
}

fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{}s", s.max(1)),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    /// Feed `f(second)` once a second for `secs`.
    fn feed(
        trend: &mut MemoryTrend,
        start: Instant,
        secs: u64,
        f: impl Fn(u64) -> u64,
    ) -> Vec<Reported> {
        (0..=secs)
            .map(|s| trend.sample(start + Duration::from_secs(s), f(s)))
            .collect()
    }

    #[test]
    fn a_leak_is_reported_once_a_window_shows_it() {
        // The field's leak, a day compressed: 10 GB over six days is about
        // 70 MiB an hour; here a window of 480 s at the same shape.
        let mut trend = MemoryTrend::new(Duration::from_secs(480), 64 * MIB);
        let start = Instant::now();
        let seen = feed(&mut trend, start, 1000, |s| 2048 * MIB + s * MIB / 4);
        let first = seen
            .iter()
            .position(|r| matches!(r, Reported::New(_)))
            .expect("reported");
        // Not before one whole window of samples.
        assert!(first >= 48, "{first}");
        assert_eq!(
            seen.iter()
                .filter(|r| matches!(r, Reported::New(_)))
                .count(),
            1,
            "reported once"
        );
        let g = trend.growth().expect("still growing");
        // A quarter MiB a second is 900 MiB an hour.
        assert!((g.bytes_per_hour / MIB as f64 - 900.0).abs() < 5.0, "{g:?}");
        let text = g.describe(Some(("restart.rss_limit_mib", 4096 * MIB)));
        assert!(
            text.contains("per hour")
                && text.contains("reaches restart.rss_limit_mib (4.0 GiB) in about"),
            "{text}"
        );
    }

    #[test]
    fn a_start_that_levels_off_or_noise_is_not_a_leak() {
        let start = Instant::now();
        // 1 GiB in the first minute (KV buffers, warm-up), then flat.
        let mut trend = MemoryTrend::new(Duration::from_secs(480), 64 * MIB);
        let seen = feed(&mut trend, start, 2000, |s| {
            1024 * MIB + s.min(60) * 17 * MIB
        });
        assert!(
            seen.iter()
                .skip(700)
                .all(|r| !matches!(r, Reported::New(_) | Reported::Still(_))),
            "{:?}",
            trend.growth()
        );
        // Saw-tooth noise around a level.
        let mut trend = MemoryTrend::new(Duration::from_secs(480), 64 * MIB);
        let seen = feed(&mut trend, start, 2000, |s| 1024 * MIB + (s % 37) * 8 * MIB);
        assert!(seen.iter().all(|r| !matches!(r, Reported::New(_))));
        // Growing, but less than the report size over the window.
        let mut trend = MemoryTrend::new(Duration::from_secs(480), 64 * MIB);
        let seen = feed(&mut trend, start, 2000, |s| 1024 * MIB + s * 1024);
        assert!(seen.iter().all(|r| !matches!(r, Reported::New(_))));
    }

    #[test]
    fn a_growth_that_stops_clears_the_report_and_off_is_off() {
        let start = Instant::now();
        let mut trend = MemoryTrend::new(Duration::from_secs(100), 8 * MIB);
        let seen = feed(&mut trend, start, 600, |s| 100 * MIB + s.min(300) * MIB);
        assert!(seen.iter().any(|r| matches!(r, Reported::New(_))));
        assert!(seen.iter().any(|r| matches!(r, Reported::Stopped)));
        assert_eq!(trend.growth(), None);
        let mut off = MemoryTrend::new(Duration::ZERO, 8 * MIB);
        let seen = feed(&mut off, start, 600, |s| s * MIB);
        assert!(seen.iter().all(|r| *r == Reported::None));
    }
}
