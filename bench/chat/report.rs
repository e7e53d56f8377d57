//! From the rounds an arm ran to the figures the table and the JSON line
//! carry: time to first token of the first turn and of the later turns
//! (where a prefix cache can help), aggregate tok/s per round, and the
//! share of prompt tokens the engine took from its cache.

use crate::workload::RoundSample;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A daemon's counters for one model, from its metrics: totals when
/// scraped, differences over a round in a [`Round`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// `tt_serving_prefix_cache_hits_total`: prompt tokens the engines'
    /// prefix caches supplied.
    pub hits: u64,
    /// `tt_serving_prefix_cache_queries_total`: all prompt tokens, by slot.
    pub queries: BTreeMap<String, u64>,
    /// `tt_serving_affinity_routed_total{outcome="affine"}`.
    pub affine: u64,
    /// `tt_serving_affinity_routed_total{outcome="fallback"}`.
    pub fallback: u64,
}

impl Counters {
    /// What happened between `self` (before) and `after`.
    pub fn delta(&self, after: &Counters) -> Counters {
        Counters {
            hits: after.hits - self.hits,
            queries: after
                .queries
                .iter()
                .map(|(slot, n)| (slot.clone(), n - self.queries.get(slot).unwrap_or(&0)))
                .collect(),
            affine: after.affine - self.affine,
            fallback: after.fallback - self.fallback,
        }
    }

    fn json(&self) -> Value {
        json!({
            "prefix_cache_hits": self.hits, "prefix_cache_queries_by_slot": self.queries,
            "affinity_affine": self.affine, "affinity_fallback": self.fallback,
        })
    }

    fn queries_total(&self) -> u64 {
        self.queries.values().sum()
    }
}

/// One counted round of one arm.
#[derive(Debug, Clone)]
pub struct Round {
    /// The round's number (it names its system prompt).
    pub id: usize,
    /// Its place in the run's order, 0 first (warm-ups included).
    pub position: usize,
    /// What the client saw.
    pub sample: RoundSample,
    /// The daemon's counters over the round, when it has them.
    pub metrics: Option<Counters>,
}

/// Where a cached-token share came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedSource {
    /// `usage.prompt_tokens_details.cached_tokens` of every answer.
    Usage,
    /// llama-server's `timings.cache_n`.
    Timings,
    /// The daemon's Prometheus counters, before and after each round.
    Metrics,
}

impl CachedSource {
    fn name(self) -> &'static str {
        match self {
            CachedSource::Usage => "usage.prompt_tokens_details.cached_tokens",
            CachedSource::Timings => "timings.cache_n",
            CachedSource::Metrics => "daemon metrics (prefix_cache_hits / prefix_cache_queries)",
        }
    }
}

/// One arm's figures.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The arm's key in the record.
    pub key: String,
    /// The arm's name in the table.
    pub name: String,
    /// Time to first token of every first turn, ms.
    pub ttft_first: Vec<f64>,
    /// Time to first token of every later turn, ms.
    pub ttft_later: Vec<f64>,
    /// All completion tokens of a round over its wall time, per round.
    pub tok_s: Vec<f64>,
    /// Cached / all prompt tokens, all turns and later turns only, and
    /// where the counts came from.
    pub cached: Option<(f64, Option<f64>, CachedSource)>,
    /// Per-round JSON (the record keeps every round).
    pub rounds: Vec<Value>,
    /// `usage.prompt_tokens` of the first turns (median) and the largest of
    /// any turn.
    pub prompt_tokens: (u32, u32),
    /// Completion tokens per turn, smallest and largest (fixed by
    /// `ignore_eos` unless an engine ignores it).
    pub completion_tokens: (u32, u32),
    /// The daemon's counters over all counted rounds, when it has them.
    pub metrics: Option<Counters>,
    /// Later turns that found their own conversation's previous turn in
    /// the cache, and all later turns (when the answers say what was
    /// cached).
    pub history_reuse: Option<(usize, usize)>,
}

impl Summary {
    /// Sums up `rounds` of the arm `key`, shown as `name`.
    pub fn of(key: &str, name: &str, rounds: &[Round]) -> Summary {
        let replies = || rounds.iter().flat_map(|r| r.sample.turns.iter());
        let ms = |later: bool| -> Vec<f64> {
            replies()
                .filter(|t| (t.turn > 0) == later)
                .map(|t| t.reply.ttft.as_secs_f64() * 1e3)
                .collect()
        };
        let tok_s: Vec<f64> = rounds.iter().map(|r| round_tok_s(&r.sample)).collect();
        let mut first_prompts: Vec<f64> = replies()
            .filter(|t| t.turn == 0)
            .map(|t| f64::from(t.reply.prompt_tokens))
            .collect();
        let completions = replies().map(|t| t.reply.completion_tokens);
        Summary {
            key: key.to_string(),
            name: name.to_string(),
            ttft_first: ms(false),
            ttft_later: ms(true),
            tok_s,
            cached: cached_share(rounds),
            rounds: rounds.iter().map(round_json).collect(),
            prompt_tokens: (
                percentile(&mut first_prompts, 50.0) as u32,
                replies().map(|t| t.reply.prompt_tokens).max().unwrap_or(0),
            ),
            completion_tokens: (
                completions.clone().min().unwrap_or(0),
                completions.max().unwrap_or(0),
            ),
            history_reuse: history_reuse(rounds),
            metrics: rounds.iter().try_fold(Counters::default(), |mut sum, r| {
                let m = r.metrics.as_ref()?;
                sum.hits += m.hits;
                for (slot, n) in &m.queries {
                    *sum.queries.entry(slot.clone()).or_default() += n;
                }
                sum.affine += m.affine;
                sum.fallback += m.fallback;
                Some(sum)
            }),
        }
    }

    /// TTFT p50 of the later turns, ms.
    pub fn later_p50(&self) -> f64 {
        percentile(&mut self.ttft_later.clone(), 50.0)
    }

    /// Median over rounds of the aggregate tok/s.
    pub fn tok_s_median(&self) -> f64 {
        percentile(&mut self.tok_s.clone(), 50.0)
    }

    /// The arm's part of the JSON line.
    pub fn json(&self) -> Value {
        let p = |v: &[f64], q: f64| percentile(&mut v.to_vec(), q);
        json!({
            "ttft_turn1_p50_ms": p(&self.ttft_first, 50.0),
            "ttft_turn1_p90_ms": p(&self.ttft_first, 90.0),
            "ttft_later_p50_ms": p(&self.ttft_later, 50.0),
            "ttft_later_p90_ms": p(&self.ttft_later, 90.0),
            "tok_s_median": self.tok_s_median(),
            "tok_s_rounds": self.tok_s,
            "cached_share_pct": self.cached.map(|c| c.0 * 100.0),
            "cached_share_later_turns_pct": self.cached.and_then(|c| c.1).map(|l| l * 100.0),
            "cached_share_source": self.cached.map(|c| c.2.name()),
            "prompt_tokens_turn1_median": self.prompt_tokens.0,
            "prompt_tokens_max": self.prompt_tokens.1,
            "completion_tokens_per_turn": [self.completion_tokens.0, self.completion_tokens.1],
            "metrics": self.metrics.as_ref().map(Counters::json),
            "history_reuse_pct": self.history_reuse.map(|(hit, all)| hit as f64 * 100.0 / all as f64),
            "history_reuse_turns": self.history_reuse.map(|(hit, all)| [hit, all]),
            "rounds": self.rounds,
        })
    }

    /// One row of the printed table.
    pub fn row(&self) -> String {
        let p = |v: &[f64], q: f64| percentile(&mut v.to_vec(), q);
        let cached = match self.cached {
            Some((all, later, _)) => format!(
                "{:.1}% ({} later turns)",
                all * 100.0,
                later.map_or("-".into(), |l| format!("{:.1}%", l * 100.0))
            ),
            None => "-".into(),
        };
        let history = match self.history_reuse {
            Some((hit, all)) => format!("; own history reused {hit}/{all}"),
            None => String::new(),
        };
        format!(
            "{:<22} {:>8.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1}  {cached}{history}",
            self.name,
            p(&self.ttft_first, 50.0),
            p(&self.ttft_first, 90.0),
            p(&self.ttft_later, 50.0),
            p(&self.ttft_later, 90.0),
            self.tok_s_median(),
        )
    }
}

/// The table's header, matching [`Summary::row`].
pub fn header() -> String {
    format!(
        "{:<22} {:>8} {:>8} {:>9} {:>9} {:>9}  {}\n{:<22} {:>17} {:>19} {:>9}",
        "arm",
        "t1 p50",
        "t1 p90",
        "t2-4 p50",
        "t2-4 p90",
        "tok/s",
        "cached share of prompt tokens",
        "",
        "(TTFT ms, turn 1)",
        "(TTFT ms, turns 2-4)",
        "(median)"
    )
}

fn round_tok_s(sample: &RoundSample) -> f64 {
    let tokens: u32 = sample.turns.iter().map(|t| t.reply.completion_tokens).sum();
    f64::from(tokens) / sample.wall.as_secs_f64()
}

fn round_json(round: &Round) -> Value {
    let turns = &round.sample.turns;
    let ms = |later: bool| -> f64 {
        let mut v: Vec<f64> = turns
            .iter()
            .filter(|t| (t.turn > 0) == later)
            .map(|t| t.reply.ttft.as_secs_f64() * 1e3)
            .collect();
        percentile(&mut v, 50.0)
    };
    let sum = |f: &dyn Fn(&crate::client::Reply) -> Option<u32>| -> Option<u32> {
        turns.iter().map(|t| f(&t.reply)).sum()
    };
    json!({
        "round": round.id,
        "position": round.position,
        "wall_s": round.sample.wall.as_secs_f64(),
        "completion_tokens": sum(&|r| Some(r.completion_tokens)),
        "tok_s": round_tok_s(&round.sample),
        "ttft_turn1_p50_ms": ms(false),
        "ttft_later_p50_ms": ms(true),
        "prompt_tokens": sum(&|r| Some(r.prompt_tokens)),
        "usage_cached_tokens": sum(&|r| r.cached_tokens),
        "timings_cache_n": sum(&|r| r.timings_cache_n),
        "metrics": round.metrics.as_ref().map(Counters::json),
    })
}

/// The share of prompt tokens served from the cache, from the best source
/// every round has: the answers' usage, llama-server's timings, or the
/// daemon's metrics (which cannot split by turn).
fn cached_share(rounds: &[Round]) -> Option<(f64, Option<f64>, CachedSource)> {
    let turns = || rounds.iter().flat_map(|r| r.sample.turns.iter());
    let from_replies = |f: fn(&crate::client::Reply) -> Option<u32>, source| {
        let share = |later_only: bool| -> Option<f64> {
            let (mut cached, mut all) = (0u64, 0u64);
            for t in turns().filter(|t| !later_only || t.turn > 0) {
                cached += u64::from(f(&t.reply)?);
                all += u64::from(t.reply.prompt_tokens);
            }
            (all > 0).then(|| cached as f64 / all as f64)
        };
        Some((share(false)?, share(true), source))
    };
    from_replies(|r| r.cached_tokens, CachedSource::Usage)
        .or_else(|| from_replies(|r| r.timings_cache_n, CachedSource::Timings))
        .or_else(|| {
            let (mut cached, mut all) = (0u64, 0u64);
            for r in rounds {
                let m = r.metrics.as_ref()?;
                cached += m.hits;
                all += m.queries_total();
            }
            (all > 0).then(|| (cached as f64 / all as f64, None, CachedSource::Metrics))
        })
}

/// Positions per KV block of tt-worker's prefix cache: it reuses whole
/// blocks only, so a reused history may stop up to a block short.
const BLOCK_TOKENS: u32 = 16;

/// How many later turns reused their conversation's own previous turn:
/// the prompt then starts with the previous turn's whole prompt (followed
/// by its answer), so a replica that served that turn finds at least its
/// prompt cached, less a partial block; one that did not finds only the
/// shared system prompt and the chat template's start, which ends well
/// before the previous prompt did (a first user message is ~30 tokens).
fn history_reuse(rounds: &[Round]) -> Option<(usize, usize)> {
    let (mut hits, mut all) = (0, 0);
    for round in rounds {
        for t in round.sample.turns.iter().filter(|t| t.turn > 0) {
            let previous = round
                .sample
                .turns
                .iter()
                .find(|p| p.conversation == t.conversation && p.turn + 1 == t.turn)?;
            let cached = t.reply.cached_tokens.or(t.reply.timings_cache_n)?;
            all += 1;
            if cached + BLOCK_TOKENS > previous.reply.prompt_tokens {
                hits += 1;
            }
        }
    }
    (all > 0).then_some((hits, all))
}

/// The `q`th percentile by nearest rank (NaN when empty), ttctl's
/// definition.
pub fn percentile(values: &mut [f64], q: f64) -> f64 {
    ttctl::stats::quantile(values, q / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Reply;
    use crate::workload::TurnSample;
    use std::time::Duration;

    fn turn(conversation: usize, turn: usize, prompt: u32, cached: u32) -> TurnSample {
        TurnSample {
            conversation,
            turn,
            reply: Reply {
                prompt_tokens: prompt,
                cached_tokens: Some(cached),
                completion_tokens: 32,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_later_turn_reuses_its_history_when_its_previous_prompt_was_cached() {
        let round = Round {
            id: 1,
            position: 0,
            metrics: None,
            sample: RoundSample {
                wall: Duration::from_secs(1),
                turns: vec![
                    turn(0, 0, 533, 0),
                    // Its own 533-token prompt, to the last whole block.
                    turn(0, 1, 598, 528),
                    // Only the shared system prompt: another replica.
                    turn(0, 2, 660, 512),
                    turn(1, 0, 533, 512),
                    turn(1, 1, 598, 592),
                ],
            },
        };
        assert_eq!(history_reuse(&[round]), Some((2, 3)));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&mut v, 50.0), 3.0);
        assert_eq!(percentile(&mut v, 90.0), 5.0);
        assert!(percentile(&mut [], 50.0).is_nan());
    }
}
