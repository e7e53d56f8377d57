//! Recent request figures per slot, for `ttctl top` and status: tokens and
//! requests served, prompt tokens and how many of them the engine's prefix
//! cache supplied, requests routed to their affinity replica or not, and
//! median time to first token and inter-token latency over a window of
//! recent samples. (Prometheus gets full histograms from
//! [`crate::metrics`]; this is the small live picture for a terminal.)

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

/// Samples kept per figure.
const WINDOW: usize = 512;

#[derive(Debug, Default)]
struct Inner {
    first_token_ms: VecDeque<f64>,
    inter_token_ms: VecDeque<f64>,
    generated_tokens: u64,
    requests: u64,
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
    affine: u64,
    fallback: u64,
}

/// One slot's recent figures.
#[derive(Default)]
pub struct SlotStats {
    inner: Mutex<Inner>,
}

/// What status shows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StatsView {
    /// Tokens generated since the slot started.
    pub generated_tokens: u64,
    /// Requests finished since the slot started.
    pub requests: u64,
    /// Median time to first token over recent requests, ms (0: none yet).
    pub ttft_p50_ms: f64,
    /// Median inter-token latency over recent tokens, ms (0: none yet).
    pub itl_p50_ms: f64,
    /// Prompt tokens of the requests finished since the slot started.
    pub prompt_tokens: u64,
    /// Of those, the ones the engine's prefix cache supplied.
    pub cached_prompt_tokens: u64,
    /// Requests with a choice of replicas sent here as their affinity
    /// replica.
    pub affine: u64,
    /// Requests with a choice of replicas sent here because their own was
    /// over the load bound or full.
    pub fallback: u64,
}

fn push(window: &mut VecDeque<f64>, value: f64) {
    if window.len() == WINDOW {
        window.pop_front();
    }
    window.push_back(value);
}

fn median(window: &VecDeque<f64>) -> f64 {
    if window.is_empty() {
        return 0.0;
    }
    let mut sorted: Vec<f64> = window.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

impl std::fmt::Debug for SlotStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SlotStats").field(&self.view()).finish()
    }
}

impl SlotStats {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first token of a request arrived this long after the request.
    pub fn first_token(&self, after: Duration) {
        push(&mut self.inner().first_token_ms, after.as_secs_f64() * 1e3);
    }

    /// `tokens` tokens arrived `gap` after the previous ones.
    pub fn tokens(&self, gap: Option<Duration>, tokens: usize) {
        let mut inner = self.inner();
        inner.generated_tokens += tokens as u64;
        if let Some(gap) = gap {
            let per_token = gap.as_secs_f64() * 1e3 / tokens.max(1) as f64;
            for _ in 0..tokens.max(1) {
                push(&mut inner.inter_token_ms, per_token);
            }
        }
    }

    /// A request finished.
    pub fn finished(&self) {
        self.inner().requests += 1;
    }

    /// A finished request's prompt had `prompt` tokens, `cached` of them
    /// from the engine's prefix cache (the final chunk's usage and timings).
    pub fn prompt(&self, prompt: u32, cached: u32) {
        let mut inner = self.inner();
        inner.prompt_tokens += u64::from(prompt);
        inner.cached_prompt_tokens += u64::from(cached);
    }

    /// A request with a choice of replicas was routed here, to its affinity
    /// replica (`affine`) or not.
    pub fn affinity(&self, affine: bool) {
        let mut inner = self.inner();
        if affine {
            inner.affine += 1;
        } else {
            inner.fallback += 1;
        }
    }

    /// The figures now.
    pub fn view(&self) -> StatsView {
        let inner = self.inner();
        StatsView {
            generated_tokens: inner.generated_tokens,
            requests: inner.requests,
            ttft_p50_ms: median(&inner.first_token_ms),
            itl_p50_ms: median(&inner.inter_token_ms),
            prompt_tokens: inner.prompt_tokens,
            cached_prompt_tokens: inner.cached_prompt_tokens,
            affine: inner.affine,
            fallback: inner.fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_counts_follow_the_samples() {
        let s = SlotStats::default();
        assert_eq!(s.view(), StatsView::default());
        for ms in [30, 10, 20] {
            s.first_token(Duration::from_millis(ms));
        }
        s.tokens(None, 1);
        s.tokens(Some(Duration::from_millis(8)), 2);
        s.tokens(Some(Duration::from_millis(6)), 1);
        s.finished();
        let v = s.view();
        assert_eq!(v.generated_tokens, 4);
        assert_eq!(v.requests, 1);
        assert_eq!(v.ttft_p50_ms, 20.0);
        assert_eq!(v.itl_p50_ms, 4.0);
    }

    #[test]
    fn prompt_tokens_from_the_prefix_cache_and_affinity_are_counted() {
        let s = SlotStats::default();
        s.prompt(600, 0);
        s.prompt(640, 592);
        s.prompt(8, 8);
        s.affinity(true);
        s.affinity(true);
        s.affinity(false);
        let v = s.view();
        assert_eq!((v.prompt_tokens, v.cached_prompt_tokens), (1248, 600));
        assert_eq!((v.affine, v.fallback), (2, 1));
    }

    #[test]
    fn the_window_keeps_only_recent_samples() {
        let s = SlotStats::default();
        for _ in 0..WINDOW {
            s.first_token(Duration::from_millis(100));
        }
        for _ in 0..WINDOW {
            s.first_token(Duration::from_millis(1));
        }
        assert_eq!(s.view().ttft_p50_ms, 1.0);
    }
}
