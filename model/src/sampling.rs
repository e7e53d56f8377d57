//! Picking the next token from logits: greedy, temperature, top-k, top-p,
//! with a seeded generator so the same seed reproduces the same output;
//! before that, the penalties on what a sequence already holds
//! ([`History`]), and the log-probabilities a request may ask for
//! ([`Logprobs`]).

use std::collections::{HashMap, HashSet};

/// How to pick tokens. All zero means greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set reaching this probability mass; 0 or 1 disables.
    pub top_p: f32,
    /// Seed of the generator; `None` draws one.
    pub seed: Option<u64>,
}

impl SamplingConfig {
    /// Greedy decoding.
    pub const GREEDY: SamplingConfig = SamplingConfig {
        temperature: 0.0,
        top_k: 0,
        top_p: 0.0,
        seed: None,
    };

    fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// SplitMix64: tiny, fast and fully determined by its seed, which is all a
/// reproducible sampler needs (it is not for cryptography).
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A sampler for one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplingConfig,
    rng: SplitMix64,
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS; mixing in the time keeps two
    // samplers made in the same instant apart.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

impl Sampler {
    /// A sampler following `cfg`.
    pub fn new(cfg: SamplingConfig) -> Self {
        let seed = cfg.seed.unwrap_or_else(random_seed);
        Self {
            cfg,
            rng: SplitMix64(seed),
        }
    }

    /// The next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.is_greedy() {
            return argmax(logits);
        }
        let t = self.cfg.temperature;
        // Candidates as (id, logit), most likely first.
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l / t))
            .collect();
        if cand.is_empty() {
            return argmax(logits);
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.cfg.top_k > 0 && self.cfg.top_k < cand.len() {
            cand.select_nth_unstable_by(self.cfg.top_k - 1, by_logit);
            cand.truncate(self.cfg.top_k);
        }
        cand.sort_unstable_by(by_logit);
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        if self.cfg.top_p > 0.0 && self.cfg.top_p < 1.0 {
            let mut mass = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                mass += p;
                if mass >= self.cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            let sum: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= sum);
        }
        let mut r = self.rng.next_f64();
        for (i, p) in probs.iter().enumerate() {
            if r < *p {
                return cand[i].0;
            }
            r -= p;
        }
        cand[probs.len() - 1].0
    }
}

/// The penalties on tokens a sequence already holds, applied to the logits
/// before sampling (greedy too), in vLLM's order: repetition, then
/// frequency and presence.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Penalties {
    /// Subtracted once from the logit of each token in the output.
    pub presence: f32,
    /// Subtracted from the logit of each token once per occurrence in the
    /// output.
    pub frequency: f32,
    /// Divides positive and multiplies negative logits of each token in the
    /// prompt or the output; 0 and 1 are off.
    pub repetition: f32,
}

impl Penalties {
    fn repetition_on(&self) -> bool {
        self.repetition != 0.0 && self.repetition != 1.0
    }

    /// Whether any penalty is on.
    pub fn any(&self) -> bool {
        self.presence != 0.0 || self.frequency != 0.0 || self.repetition_on()
    }
}

/// What one sequence holds, for its [`Penalties`]: the count of each
/// output token, and the prompt's tokens when the repetition penalty needs
/// them.
#[derive(Debug, Clone, Default)]
pub struct History {
    penalties: Penalties,
    output: HashMap<u32, u32>,
    prompt: HashSet<u32>,
}

impl History {
    /// The history of a sequence starting from `prompt`.
    pub fn new(penalties: Penalties, prompt: &[u32]) -> Self {
        Self {
            penalties,
            output: HashMap::new(),
            prompt: if penalties.repetition_on() {
                prompt.iter().copied().collect()
            } else {
                HashSet::new()
            },
        }
    }

    /// Records a generated token.
    pub fn push(&mut self, token: u32) {
        if self.penalties.any() {
            *self.output.entry(token).or_insert(0) += 1;
        }
    }

    /// Applies the penalties to `logits` (ids outside it are skipped).
    pub fn apply(&self, logits: &mut [f32]) {
        let p = self.penalties;
        if p.repetition_on() {
            let seen = self
                .prompt
                .iter()
                .chain(self.output.keys().filter(|t| !self.prompt.contains(t)));
            for &t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition
                    } else {
                        *l * p.repetition
                    };
                }
            }
        }
        if p.presence != 0.0 || p.frequency != 0.0 {
            for (&t, &count) in &self.output {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.frequency * count as f32 + p.presence;
                }
            }
        }
    }
}

/// Sets the logits of `tokens` to minus infinity, so they are never picked
/// (ids outside `logits` are skipped).
pub fn suppress(logits: &mut [f32], tokens: impl IntoIterator<Item = u32>) {
    for t in tokens {
        if let Some(l) = logits.get_mut(t as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// The log-softmax of one row of logits, for the log-probabilities a
/// request asks for: the chosen token's and the `n` most likely.
#[derive(Debug, Clone)]
pub struct Logprobs {
    /// log of the sum of exp over the finite logits.
    log_sum_exp: f64,
    /// The `n` most likely (id, logprob), most likely first, ties by id.
    top: Vec<(u32, f32)>,
}

impl Logprobs {
    /// The distribution of `logits` (at temperature 1) and its `n` most
    /// likely tokens. Tokens at minus infinity (suppressed) are never among
    /// them.
    pub fn new(logits: &[f32], n: usize) -> Self {
        let max = logits
            .iter()
            .copied()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| ((l - max) as f64).exp())
            .sum();
        let log_sum_exp = max as f64 + sum.ln();
        // The n best by (logit descending, id ascending), kept sorted; a
        // token enters only when it beats the current last.
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        if n > 0 {
            for (i, &l) in logits.iter().enumerate() {
                if !l.is_finite() || (top.len() == n && l <= top[n - 1].1) {
                    continue;
                }
                let at = top.partition_point(|&(_, t)| t >= l);
                top.insert(at, (i as u32, l));
                top.truncate(n);
            }
        }
        let top = top
            .into_iter()
            .map(|(i, l)| (i, (l as f64 - log_sum_exp) as f32))
            .collect();
        Self { log_sum_exp, top }
    }

    /// The logprob of `token` (minus infinity when suppressed; never above
    /// 0, since the log-sum-exp is at least the largest logit).
    pub fn of(&self, logits: &[f32], token: u32) -> f32 {
        match logits.get(token as usize) {
            Some(&l) if l.is_finite() => (l as f64 - self.log_sum_exp) as f32,
            _ => f32::NEG_INFINITY,
        }
    }

    /// The most likely tokens with their logprobs, most likely first.
    pub fn top(&self) -> &[(u32, f32)] {
        &self.top
    }
}

/// Index of the largest logit (the first one on ties, like llama.cpp).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingConfig {
        SamplingConfig {
            temperature,
            top_k,
            top_p,
            seed: Some(seed),
        }
    }

    #[test]
    fn penalties_follow_the_openai_and_hf_rules() {
        let prompt = [0u32];
        let mut h = History::new(
            Penalties {
                presence: 0.5,
                frequency: 0.25,
                repetition: 2.0,
            },
            &prompt,
        );
        h.push(1);
        h.push(1);
        h.push(2);
        let mut logits = vec![4.0, 4.0, -1.0, 3.0];
        h.apply(&mut logits);
        // 0: prompt only, divided. 1: output twice, divided then 0.5 +
        // 2 * 0.25. 2: negative, multiplied then 0.5 + 0.25. 3: untouched.
        assert_eq!(logits, vec![2.0, 1.0, -2.75, 3.0]);
        // Off: nothing is kept or changed.
        let mut off = History::new(Penalties::default(), &prompt);
        off.push(1);
        let mut logits = vec![4.0, 4.0];
        off.apply(&mut logits);
        assert_eq!(logits, vec![4.0, 4.0]);
        let one = Penalties {
            repetition: 1.0,
            ..Default::default()
        };
        assert!(!one.any());
    }

    #[test]
    fn logprobs_are_a_log_softmax_with_the_best_first() {
        let mut logits = vec![1.0, 3.0, 2.0, 3.0, 0.0];
        suppress(&mut logits, [4, 99]);
        let lp = Logprobs::new(&logits, 3);
        let top = lp.top();
        assert_eq!(
            top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 3, 2],
            "ties by id"
        );
        let total: f64 = [0u32, 1, 2, 3]
            .iter()
            .map(|&t| (lp.of(&logits, t) as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(lp.of(&logits, 1), top[0].1);
        assert!(top.iter().all(|t| t.1 <= 0.0));
        assert_eq!(lp.of(&logits, 4), f32::NEG_INFINITY);
        // The greedy choice is the first of the top.
        let mut s = Sampler::new(SamplingConfig::GREEDY);
        assert_eq!(s.sample(&logits), top[0].0);
        // More asked than there are finite tokens: only those.
        assert_eq!(Logprobs::new(&logits, 20).top().len(), 4);
        assert!(Logprobs::new(&logits, 0).top().is_empty());
    }

    #[test]
    fn greedy_picks_the_first_maximum() {
        let mut s = Sampler::new(SamplingConfig::GREEDY);
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(cfg(1.0, 0, 0.0, seed));
            (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_never_leaves_the_k_best() {
        let logits: Vec<f32> = (0..100).map(|i| i as f32 / 10.0).collect();
        let mut s = Sampler::new(cfg(5.0, 3, 0.0, 1));
        for _ in 0..500 {
            let t = s.sample(&logits);
            assert!(t >= 97, "{t}");
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Token 0 holds ~88% of the mass, so top_p = 0.5 leaves only it.
        let logits = vec![4.0, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(cfg(1.0, 0, 0.5, 3));
        for _ in 0..200 {
            assert_eq!(s.sample(&logits), 0);
        }
        // With no nucleus cut, the others do appear.
        let mut s = Sampler::new(cfg(1.0, 0, 0.0, 3));
        let seen: std::collections::HashSet<u32> = (0..500).map(|_| s.sample(&logits)).collect();
        assert!(seen.len() >= 3, "{seen:?}");
    }
}
