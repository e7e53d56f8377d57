//! What a round of streams measured, reduced to the figures `ttctl bench`
//! reports. Pure functions over timestamps, so the window and percentile
//! rules are tested without a daemon.

use serde::Serialize;

/// One request as the client saw it; times in seconds from the round's
/// start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamSample {
    /// When the request was sent.
    pub sent: f64,
    /// Arrival time of each generated token (a chunk of several tokens
    /// counts each at the chunk's time).
    pub tokens: Vec<f64>,
    /// When the final chunk came.
    pub done: f64,
    /// Prompt tokens the server reported.
    pub prompt_tokens: u32,
    /// Prompt tokens its prefix cache supplied.
    pub cached_prompt_tokens: u32,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// Median and tail of a set of values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// 50th percentile.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// The `q` quantile (0..=1) by nearest rank; NaN for no values.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// p50 and p99 of `values`.
pub fn percentiles(values: &[f64]) -> Percentiles {
    Percentiles {
        p50: quantile(values, 0.5),
        p99: quantile(values, 0.99),
    }
}

/// One counted round.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RoundFigures {
    /// Time to first token of each successful stream, ms.
    pub ttft_ms: Vec<f64>,
    /// Gaps between consecutive tokens of each stream, ms.
    pub itl_ms: Vec<f64>,
    /// Mean over streams of tokens per second inside the steady window;
    /// None when there is no window (a stream finished before every
    /// stream had its first `skip` tokens: raise --output-tokens).
    pub decode_tok_s_per_user: Option<f64>,
    /// The steady window, seconds from the round's start.
    pub steady_window_s: Option<(f64, f64)>,
    /// Generated tokens over the makespan.
    pub aggregate_tok_s: f64,
    /// First send to last final chunk, s.
    pub makespan_s: f64,
    /// Generated tokens.
    pub tokens: usize,
    /// Failed streams.
    pub errors: usize,
}

/// Reduces a round. The steady-state window starts when the last stream
/// has received its first `skip` tokens (every stream is decoding, no
/// prefill of another is in the way) and ends when the first stream
/// receives its last token (after that the batch drains).
pub fn round(streams: &[StreamSample], skip: usize) -> RoundFigures {
    let ok: Vec<&StreamSample> = streams.iter().filter(|s| s.error.is_none()).collect();
    let mut f = RoundFigures {
        errors: streams.len() - ok.len(),
        ..Default::default()
    };
    for s in &ok {
        if let Some(first) = s.tokens.first() {
            f.ttft_ms.push((first - s.sent) * 1e3);
        }
        f.itl_ms
            .extend(s.tokens.windows(2).map(|w| (w[1] - w[0]) * 1e3));
        f.tokens += s.tokens.len();
    }
    let start = streams.iter().map(|s| s.sent).fold(f64::INFINITY, f64::min);
    let end = streams.iter().map(|s| s.done).fold(0.0, f64::max);
    f.makespan_s = (end - start).max(0.0);
    if f.makespan_s > 0.0 {
        f.aggregate_tok_s = f.tokens as f64 / f.makespan_s;
    }
    let from = ok
        .iter()
        .map(|s| s.tokens.get(skip.max(1) - 1).copied())
        .try_fold(f64::NEG_INFINITY, |acc, t| t.map(|t| acc.max(t)));
    let to = ok
        .iter()
        .map(|s| s.tokens.last().copied())
        .try_fold(f64::INFINITY, |acc, t| t.map(|t| acc.min(t)));
    if let (Some(from), Some(to)) = (from, to) {
        if to > from && !ok.is_empty() {
            let per_user: f64 = ok
                .iter()
                .map(|s| s.tokens.iter().filter(|&&t| t > from && t <= to).count() as f64)
                .sum::<f64>()
                / ok.len() as f64
                / (to - from);
            f.decode_tok_s_per_user = Some(per_user);
            f.steady_window_s = Some((from, to));
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(sent: f64, first: f64, gap: f64, n: usize) -> StreamSample {
        let tokens: Vec<f64> = (0..n).map(|i| first + gap * i as f64).collect();
        StreamSample {
            sent,
            done: tokens.last().copied().unwrap_or(first) + 0.001,
            tokens,
            prompt_tokens: 100,
            ..Default::default()
        }
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn the_window_excludes_the_ramp_and_the_drain() {
        // Two users at 10 tok/s; the second starts 0.5 s late, so the
        // first's early tokens and the second's late ones fall outside.
        let a = stream(0.0, 0.1, 0.1, 20); // tokens 0.1 ..= 2.0
        let b = stream(0.0, 0.6, 0.1, 20); // tokens 0.6 ..= 2.5
        let f = round(&[a, b], 2);
        let (from, to) = f.steady_window_s.unwrap();
        assert!((from - 0.7).abs() < 1e-9, "{from}");
        assert!((to - 2.0).abs() < 1e-9, "{to}");
        let per_user = f.decode_tok_s_per_user.unwrap();
        assert!((per_user - 10.0).abs() < 0.5, "{per_user}");
        assert_eq!(f.tokens, 40);
        assert!((f.aggregate_tok_s - 40.0 / 2.501).abs() < 1e-6);
        assert_eq!(f.ttft_ms.len(), 2);
        assert!((f.ttft_ms[1] - 600.0).abs() < 1e-6);
        assert!(f.itl_ms.iter().all(|g| (g - 100.0).abs() < 1e-6));
    }

    #[test]
    fn no_window_when_a_stream_ends_before_the_others_start() {
        let a = stream(0.0, 0.1, 0.1, 3); // done by 0.3
        let b = stream(0.0, 1.0, 0.1, 3);
        assert_eq!(round(&[a, b], 2).decode_tok_s_per_user, None);
    }

    #[test]
    fn failed_streams_are_counted_not_measured() {
        let mut bad = stream(0.0, 0.1, 0.1, 0);
        bad.error = Some("queue full".into());
        let f = round(&[stream(0.0, 0.1, 0.1, 10), bad], 1);
        assert_eq!(f.errors, 1);
        assert_eq!(f.ttft_ms.len(), 1);
        assert!(f.decode_tok_s_per_user.is_some());
    }
}
