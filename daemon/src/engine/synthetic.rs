//! A session filled with synthetic history, for measuring what a long context costs without
//! prefilling it (32k positions of GLM-5-sized attention would take this machine an hour).
//! Attention's work per decode step depends on how many keys the cache holds, never on their
//! values, so random keys of the right scale time exactly like real ones.

use super::Engine;
use crate::error::EngineError;
use crate::sampling::Rng;

impl Engine {
    /// Forgets `slot`'s conversation and fills its cache with `n` positions of random keys
    /// (each value uniform in [-1, 1): the scale of normalised latents and keys) and random
    /// tokens. Nothing is saved. For benchmarks only: what the model answers after it is noise.
    pub fn fill_synthetic(&mut self, slot: usize, n: usize, seed: u64) -> Result<(), EngineError> {
        if n > self.ctx {
            return Err(EngineError::Usage(format!(
                "a synthetic context of {n} positions does not fit the context of {}",
                self.ctx
            )));
        }
        let vocab = self.model.cfg.vocab_size.max(1) as u64;
        self.reset(slot);
        let s = &mut self.sessions[slot];
        let kv = &mut s.kv;
        kv.reserve(n);
        let mut rng = Rng::new(seed);
        let per_layer = kv.kv_lora + kv.rope_dim;
        let index = (0..kv.layers.len()).filter(|&l| kv.has_index(l)).count() * kv.index_dim;
        let mut body = vec![0u8; (per_layer * kv.layers.len() + index) * 4];
        for _ in 0..n {
            for v in body.chunks_exact_mut(4) {
                let x = (rng.next_f64() * 2.0 - 1.0) as f32;
                v.copy_from_slice(&x.to_le_bytes());
            }
            let token = (rng.next_u64() % vocab) as u32;
            kv.push_record(token, &body);
        }
        Ok(())
    }
}
