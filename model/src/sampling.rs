//! Picking the next token from logits: greedy, temperature, top-k, top-p,
//! with a seeded generator so the same seed reproduces the same output.

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

    /// The next token. `logits` may be modified.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
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
    fn greedy_picks_the_first_maximum() {
        let mut s = Sampler::new(SamplingConfig::GREEDY);
        assert_eq!(s.sample(&mut [0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(cfg(1.0, 0, 0.0, seed));
            (0..64)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_never_leaves_the_k_best() {
        let logits: Vec<f32> = (0..100).map(|i| i as f32 / 10.0).collect();
        let mut s = Sampler::new(cfg(5.0, 3, 0.0, 1));
        for _ in 0..500 {
            let t = s.sample(&mut logits.clone());
            assert!(t >= 97, "{t}");
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Token 0 holds ~88% of the mass, so top_p = 0.5 leaves only it.
        let logits = vec![4.0, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(cfg(1.0, 0, 0.5, 3));
        for _ in 0..200 {
            assert_eq!(s.sample(&mut logits.clone()), 0);
        }
        // With no nucleus cut, the others do appear.
        let mut s = Sampler::new(cfg(1.0, 0, 0.0, 3));
        let seen: std::collections::HashSet<u32> =
            (0..500).map(|_| s.sample(&mut logits.clone())).collect();
        assert!(seen.len() >= 3, "{seen:?}");
    }
}
