//! Token choice: greedy, or temperature + nucleus sampling with a seedable RNG.

use crate::model::ops::argmax;

/// xorshift64*: small, fast, and reproducible from a seed across platforms.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // A zero state would stay zero forever.
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Seed from the clock and the pid, for runs without `--seed`.
    pub fn from_entropy() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(t ^ (std::process::id() as u64).rotate_left(32))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Debug)]
pub struct Sampler {
    pub temperature: f32,
    pub top_p: f32,
    pub rng: Rng,
    probs: Vec<(f32, u32)>,
}

impl Sampler {
    pub fn new(temperature: f32, top_p: f32, rng: Rng) -> Sampler {
        Sampler {
            temperature,
            top_p,
            rng,
            probs: Vec::new(),
        }
    }

    pub fn greedy() -> Sampler {
        Sampler::new(0.0, 1.0, Rng::new(1))
    }

    /// Greedy when the temperature is 0 or a logit is NaN or +inf (or none is finite); a
    /// -inf logit (a token a grammar forbids) just has probability 0.
    fn is_greedy(&self, logits: &[f32]) -> bool {
        self.temperature <= 0.0
            || logits.iter().any(|v| v.is_nan() || *v == f32::INFINITY)
            || !logits.iter().any(|v| v.is_finite())
    }

    /// The nucleus of the sampling distribution into `self.probs` (descending, unnormalised):
    /// its length and mass.
    fn nucleus(&mut self, logits: &[f32]) -> (usize, f32) {
        let inv_t = 1.0 / self.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.probs.clear();
        let mut sum = 0.0f32;
        for (i, &l) in logits.iter().enumerate() {
            let p = ((l - max) * inv_t).exp();
            sum += p;
            self.probs.push((p, i as u32));
        }
        self.probs
            .sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        // Smallest prefix whose mass reaches top_p.
        let target = self.top_p.clamp(0.0, 1.0) * sum;
        let mut kept = 0.0f32;
        let mut cut = self.probs.len();
        for (i, (p, _)) in self.probs.iter().enumerate() {
            kept += p;
            if kept >= target {
                cut = i + 1;
                break;
            }
        }
        (cut, kept)
    }

    /// Picks the next token (greedy as `is_greedy` says).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy(logits) {
            return argmax(logits) as u32;
        }
        let (cut, kept) = self.nucleus(logits);
        let r = self.rng.next_f64() as f32 * kept;
        let mut acc = 0.0f32;
        for &(p, id) in &self.probs[..cut] {
            acc += p;
            if r < acc {
                return id;
            }
        }
        self.probs[cut - 1].1
    }

    /// Speculative check of a proposed token `draft` (a point-mass proposal): keeps it with
    /// probability p(draft) under this sampler's distribution, else draws from that
    /// distribution with `draft` removed. Either way the token returned is distributed exactly
    /// as [`Sampler::sample`]'s (Leviathan et al. 2023, Chen et al. 2023, with q = δ(draft)).
    /// Greedy: the argmax, taken iff it is the draft. Returns (token, draft taken).
    pub fn verify(&mut self, logits: &[f32], draft: u32) -> (u32, bool) {
        if self.is_greedy(logits) {
            let best = argmax(logits) as u32;
            return (best, best == draft);
        }
        let (cut, kept) = self.nucleus(logits);
        let p_draft = self.probs[..cut]
            .iter()
            .find(|&&(_, id)| id == draft)
            .map_or(0.0, |&(p, _)| p);
        if p_draft > 0.0 && (self.rng.next_f64() as f32) * kept < p_draft {
            return (draft, true);
        }
        // The residual max(p - q, 0) normalised: p without the draft.
        let rest = kept - p_draft;
        if rest <= 0.0 {
            return (draft, true);
        }
        let r = self.rng.next_f64() as f32 * rest;
        let mut acc = 0.0f32;
        let mut last = draft;
        for &(p, id) in &self.probs[..cut] {
            if id == draft {
                continue;
            }
            acc += p;
            last = id;
            if r < acc {
                return (id, false);
            }
        }
        (last, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax() {
        assert_eq!(Sampler::greedy().sample(&[0.1, 3.0, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7919) % 13) as f32 * 0.3).collect();
        let mut a = Sampler::new(0.8, 0.9, Rng::new(42));
        let mut b = Sampler::new(0.8, 0.9, Rng::new(42));
        let xa: Vec<u32> = (0..100).map(|_| a.sample(&logits)).collect();
        let xb: Vec<u32> = (0..100).map(|_| b.sample(&logits)).collect();
        assert_eq!(xa, xb);
    }

    #[test]
    fn tiny_nucleus_is_greedy() {
        let mut s = Sampler::new(1.0, 1e-6, Rng::new(3));
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 5.0, 4.9, 1.0]), 1);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // Two tokens with probabilities 0.75 / 0.25 at temperature 1.
        let logits = [0.0f32, (1.0f32 / 3.0).ln()];
        let mut s = Sampler::new(1.0, 1.0, Rng::new(7));
        let n = 20000;
        let zeros = (0..n).filter(|_| s.sample(&logits) == 0).count() as f64 / n as f64;
        assert!((zeros - 0.75).abs() < 0.02, "{zeros}");
    }
}
