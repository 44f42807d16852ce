//! Token choice: greedy, or temperature + nucleus sampling with a seedable RNG, with optional
//! top-k, min-p filters and repetition, frequency and presence penalties (off by default, and
//! then bit-identical to the plain path), and the stop strings that end an answer at chosen
//! text.

use crate::model::ops::argmax;
pub use crate::rng::Rng;

/// The optional filters of a sampler. The default is neutral: nothing filtered, nothing
/// penalised, and the sampler takes exactly the path it takes without them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Keep only the k most likely tokens (0: off).
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` times the most likely one's (0: off).
    pub min_p: f32,
    /// Divide a positive logit (multiply a negative one) of every token among the last
    /// [`REPEAT_WINDOW`] this sampler produced by this (1: off).
    pub repeat_penalty: f32,
    /// OpenAI's penalties over the whole answer so far: a token's logit is lowered by
    /// `frequency_penalty` times its count plus `presence_penalty` once it occurred (0: off).
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            top_k: 0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
        }
    }
}

impl SamplingParams {
    /// Whether the frequency or presence penalty is on (the answer's counts are kept).
    fn counting(&self) -> bool {
        self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }
}

/// Tokens the repetition penalty looks back on (llama.cpp's default `repeat_last_n`).
pub const REPEAT_WINDOW: usize = 64;

#[derive(Clone, Debug)]
pub struct Sampler {
    pub temperature: f32,
    pub top_p: f32,
    pub rng: Rng,
    pub params: SamplingParams,
    /// Report each chosen token's logprob and this many most likely alternatives
    /// ([`logprob_of`]); `None`: nothing is computed.
    pub logprobs: Option<usize>,
    probs: Vec<(f32, u32)>,
    /// The tokens this sampler returned last (the repetition penalty's window).
    recent: std::collections::VecDeque<u32>,
    /// Penalised logits (kept so a step does not allocate).
    scratch: Vec<f32>,
    /// The window's distinct ids, sorted (kept so a step does not allocate).
    window: Vec<u32>,
    /// How often each token id occurred in the answer (frequency and presence penalties;
    /// grown to the vocabulary once), and the ids with a count, in order of first use.
    counts: Vec<u32>,
    seen: Vec<u32>,
}

impl Sampler {
    pub fn new(temperature: f32, top_p: f32, rng: Rng) -> Sampler {
        Sampler {
            temperature,
            top_p,
            rng,
            params: SamplingParams::default(),
            logprobs: None,
            probs: Vec::new(),
            recent: std::collections::VecDeque::new(),
            scratch: Vec::new(),
            window: Vec::new(),
            counts: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// The same sampler with these filters.
    pub fn with_params(self, params: SamplingParams) -> Sampler {
        Sampler { params, ..self }
    }

    /// The same sampler reporting logprobs with `top` alternatives (`None`: none).
    pub fn with_logprobs(self, top: Option<usize>) -> Sampler {
        Sampler {
            logprobs: top,
            ..self
        }
    }

    fn penalising(&self) -> bool {
        (self.params.repeat_penalty != 1.0 && !self.recent.is_empty())
            || (self.params.counting() && !self.seen.is_empty())
    }

    /// `logits` with the penalties applied, into `self.scratch` (only called when
    /// [`Sampler::penalising`]). The buffers are the sampler's own, so past the first steps
    /// this allocates nothing.
    fn penalise(&mut self, logits: &[f32]) -> Vec<f32> {
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        out.extend_from_slice(logits);
        let r = self.params.repeat_penalty;
        if r != 1.0 {
            self.window.clear();
            self.window.extend(self.recent.iter().copied());
            self.window.sort_unstable();
            self.window.dedup();
            for &id in &self.window {
                if let Some(l) = out.get_mut(id as usize) {
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
        let (f, p) = (self.params.frequency_penalty, self.params.presence_penalty);
        for &id in &self.seen {
            let n = self.counts[id as usize];
            if let Some(l) = out.get_mut(id as usize) {
                *l -= f * n as f32 + p;
            }
        }
        out
    }

    /// Takes the penalties' buffers whole at the first step (the vocabulary's counts, room
    /// for every id in `seen`, the window), so later steps never grow them.
    fn prepare(&mut self, vocab: usize) {
        if self.params.counting() && self.counts.len() < vocab {
            self.counts.resize(vocab, 0);
            self.seen.reserve(vocab);
        }
        if self.params.repeat_penalty != 1.0 && self.window.capacity() < REPEAT_WINDOW {
            self.window.reserve(REPEAT_WINDOW);
            self.recent.reserve(REPEAT_WINDOW);
        }
    }

    /// Remembers a returned token for the penalties.
    fn produced(&mut self, id: u32) -> u32 {
        if self.params.repeat_penalty != 1.0 {
            if self.recent.len() == REPEAT_WINDOW {
                self.recent.pop_front();
            }
            self.recent.push_back(id);
        }
        if self.params.counting() {
            let i = id as usize;
            if i >= self.counts.len() {
                self.counts.resize(i + 1, 0);
            }
            if self.counts[i] == 0 {
                self.seen.push(id);
            }
            self.counts[i] += 1;
        }
        id
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
        // top-k and min-p shorten the candidates first; when neither does, the mass is the
        // sum above, so the neutral path is bit-identical to the one without them.
        let mut limit = self.probs.len();
        if self.params.top_k > 0 {
            limit = limit.min(self.params.top_k);
        }
        if self.params.min_p > 0.0 {
            let floor = self.params.min_p * self.probs[0].0;
            limit = self.probs[..limit]
                .iter()
                .take_while(|(p, _)| *p >= floor)
                .count()
                .max(1);
        }
        if limit < self.probs.len() {
            self.probs.truncate(limit);
            sum = self.probs.iter().map(|(p, _)| p).sum();
        }
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
        self.prepare(logits.len());
        if self.penalising() {
            let penalised = self.penalise(logits);
            let id = self.pick(&penalised);
            self.scratch = penalised;
            return self.produced(id);
        }
        let id = self.pick(logits);
        self.produced(id)
    }

    fn pick(&mut self, logits: &[f32]) -> u32 {
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
        self.prepare(logits.len());
        let (id, took) = if self.penalising() {
            let penalised = self.penalise(logits);
            let r = self.check(&penalised, draft);
            self.scratch = penalised;
            r
        } else {
            self.check(logits, draft)
        };
        (self.produced(id), took)
    }

    fn check(&mut self, logits: &[f32], draft: u32) -> (u32, bool) {
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

/// A chosen token's log-probability under the model's distribution (the log-softmax of the
/// raw logits: before temperature, filters, penalties or a grammar's mask, as OpenAI reports
/// them), and the `top` most likely tokens with theirs, most likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// [`TokenLogprob`] of `id` in `logits`. Two passes over the vocabulary (the log-sum-exp in
/// f64, and the top `top` by insertion into a short sorted list); only requests that ask
/// for logprobs pay for it.
pub fn logprob_of(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| ((v - max) as f64).exp())
        .sum();
    let lse = max as f64 + sum.ln();
    let lp = |v: f32| (v as f64 - lse) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &v) in logits.iter().enumerate() {
            if v.is_nan() || (best.len() == top && v <= best[top - 1].1) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= v);
            best.insert(at, (i as u32, v));
            best.truncate(top);
        }
    }
    TokenLogprob {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&v| lp(v)),
        top: best.into_iter().map(|(i, v)| (i, lp(v))).collect(),
    }
}

/// Stop strings (`--stop`): the answer ends right before the first occurrence of any of
/// them, which is not printed. Bytes that could still turn out to start a stop string are
/// held back until the next token says otherwise.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<Vec<u8>>,
    held: Vec<u8>,
    /// The stop string that ended the answer.
    hit: Option<usize>,
}

impl StopStrings {
    /// Empty strings are ignored (they would end every answer before its first byte).
    pub fn new(stops: &[String]) -> StopStrings {
        StopStrings {
            stops: stops
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec())
                .collect(),
            held: Vec::new(),
            hit: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Whether a stop string was seen (nothing more is released after it).
    pub fn hit(&self) -> bool {
        self.hit.is_some()
    }

    /// The stop string that ended the answer (the first in the list among those that begin
    /// at the same earliest byte).
    pub fn matched(&self) -> Option<&[u8]> {
        self.hit.map(|i| self.stops[i].as_slice())
    }

    /// Takes a token's bytes; returns those that can be printed now.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.hit.is_some() {
            return Vec::new();
        }
        if self.stops.is_empty() {
            return bytes.to_vec();
        }
        self.held.extend_from_slice(bytes);
        // The earliest occurrence of any stop string ends the answer there.
        let first = (self.stops.iter().enumerate())
            .filter_map(|(i, s)| find(&self.held, s).map(|at| (at, i)))
            .min();
        if let Some((at, i)) = first {
            self.hit = Some(i);
            let out = self.held[..at].to_vec();
            self.held.clear();
            return out;
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let keep = (1..=self.held.len().min(self.longest() - 1))
            .rev()
            .find(|&n| {
                let tail = &self.held[self.held.len() - n..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_vec();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// At the end of the answer: what was held back (no stop string came).
    pub fn flush(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    fn longest(&self) -> usize {
        self.stops.iter().map(Vec::len).max().unwrap_or(0)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_exactly_across_tokens() {
        let mut s = StopStrings::new(&["END".into(), "\n\n".into()]);
        let mut out = Vec::new();
        for t in [&b"abc E"[..], b"N", b"D tail"] {
            out.extend(s.push(t));
        }
        assert_eq!(out, b"abc ");
        assert!(s.hit());
        // A false start is released once it cannot be a stop string any more.
        let mut s = StopStrings::new(&["END".into()]);
        assert_eq!(s.push(b"xEN"), b"x");
        assert_eq!(s.push(b"O"), b"ENO");
        assert_eq!(s.push(b"E"), b"");
        assert_eq!(s.flush(), b"E");
        assert!(!s.hit());
    }

    #[test]
    fn neutral_params_are_bit_identical() {
        let logits: Vec<f32> = (0..300).map(|i| ((i * 7919) % 101) as f32 * 0.05).collect();
        let mut a = Sampler::new(0.9, 0.95, Rng::new(9));
        let mut b = Sampler::new(0.9, 0.95, Rng::new(9)).with_params(SamplingParams::default());
        for _ in 0..500 {
            assert_eq!(a.sample(&logits), b.sample(&logits));
            assert_eq!(a.verify(&logits, 3), b.verify(&logits, 3));
        }
    }

    #[test]
    fn top_k_min_p_and_the_repeat_penalty_filter() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let mut k1 = Sampler::new(2.0, 1.0, Rng::new(5)).with_params(SamplingParams {
            top_k: 1,
            ..Default::default()
        });
        assert!((0..200).all(|_| k1.sample(&logits) == 3));
        // min-p 0.5 at temperature 1: exp(-1) = 0.37 of the top is below the floor.
        let mut mp = Sampler::new(1.0, 1.0, Rng::new(5)).with_params(SamplingParams {
            min_p: 0.5,
            ..Default::default()
        });
        assert!((0..200).all(|_| mp.sample(&logits) == 3));
        // Greedy with a penalty: the repeated best falls below the runner-up.
        let mut rp = Sampler::greedy().with_params(SamplingParams {
            repeat_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(rp.sample(&logits), 3);
        assert_eq!(rp.sample(&logits), 2);
    }

    #[test]
    fn frequency_and_presence_penalties_count_the_answer() {
        // Greedy: 3 leads 2 by 1.0. A frequency penalty of 0.6 takes 0.6 a use: 3 wins at
        // 3.0 and 2.4, loses to 2 at 1.8, then wins again over 2 at 1.4.
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let mut f = Sampler::greedy().with_params(SamplingParams {
            frequency_penalty: 0.6,
            ..Default::default()
        });
        let got: Vec<u32> = (0..4).map(|_| f.sample(&logits)).collect();
        assert_eq!(got, [3, 3, 2, 3]);
        // Presence: once is enough, and it does not grow with the count.
        let mut p = Sampler::greedy().with_params(SamplingParams {
            presence_penalty: 2.5,
            ..Default::default()
        });
        // 3, then 2 (3 at 0.5), then 1 (2 at -0.5), then 3 again: still 0.5, used once or twice.
        let got: Vec<u32> = (0..4).map(|_| p.sample(&logits)).collect();
        assert_eq!(got, [3, 2, 1, 3]);
        // A negative penalty favours what was said.
        let mut n = Sampler::greedy().with_params(SamplingParams {
            presence_penalty: -2.0,
            ..Default::default()
        });
        assert_eq!(n.sample(&[0.0, 3.0, 2.5]), 1);
        assert_eq!(n.verify(&[0.0, 3.0, 4.5], 1), (1, true));
    }

    #[test]
    fn logprobs_are_the_log_softmax_and_its_top() {
        let logits = [1.0f32, 3.0, 2.0, f32::NEG_INFINITY, 0.5];
        let z: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        let r = logprob_of(&logits, 2, 3);
        assert!((r.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6, "{r:?}");
        let ids: Vec<u32> = r.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 0]);
        assert!((r.top[0].1 as f64 - (3.0 - z.ln())).abs() < 1e-6);
        // Probabilities of all tokens sum to 1.
        let all = logprob_of(&logits, 0, 5);
        let total: f64 = all.top.iter().map(|t| (t.1 as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(logprob_of(&logits, 3, 0).logprob, f32::NEG_INFINITY);
        assert!(logprob_of(&logits, 3, 0).top.is_empty());
    }

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
