//! RoPE. Interleaved (GPT-J / DeepSeek style) for MLA and the DSA indexer; rotate-half
//! (GPT-NeoX / Llama / Qwen style) for grouped-query attention.
//!
//! transformers rotates the pair `(x[2i], x[2i+1])` by `pos * inv_freq[i]` and writes the result
//! de-interleaved; q and k get the same permutation, so rotating in place gives the same dot
//! products (reference §3, "RoPE").

pub struct Rope {
    /// `inv_freq[i] = 1 / theta^(2i/r)`, computed in f32 as transformers does (YaRN: blended).
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention factor); exactly 1 otherwise, which leaves
    /// every rotated value's bits as they were.
    attention_factor: f32,
}

impl Rope {
    pub fn new(rope_dim: usize, theta: f64) -> Rope {
        let base = theta as f32;
        let inv_freq = (0..rope_dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / rope_dim as f32))
            .collect();
        Rope {
            inv_freq,
            attention_factor: 1.0,
        }
    }

    /// YaRN's frequencies as transformers computes them (`_compute_yarn_parameters`): the
    /// correction range in f64 from the rotations `beta_fast` and `beta_slow` make over the
    /// original context, the ramp and the blend in f32.
    pub fn yarn(rope_dim: usize, theta: f64, y: &crate::config::Yarn) -> Rope {
        let dim = rope_dim as f64;
        let correction_dim = |rotations: f64| {
            dim * (y.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI))
                .ln()
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction_dim(y.beta_fast), correction_dim(y.beta_slow));
        if y.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
        if low == high {
            high += 0.001; // transformers' guard against a zero-width ramp
        }
        let (low, high) = (low as f32, high as f32);
        let base = theta as f32;
        let factor = y.factor as f32;
        let inv_freq = (0..rope_dim / 2)
            .map(|i| {
                let pos_freq = base.powf((2 * i) as f32 / rope_dim as f32);
                let extrapolation = 1.0 / pos_freq;
                let interpolation = 1.0 / (factor * pos_freq);
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                interpolation * (1.0 - keep) + extrapolation * keep
            })
            .collect();
        Rope {
            inv_freq,
            attention_factor: y.attention_factor as f32,
        }
    }

    pub fn dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// The `(cos, sin)` of each pair at `pos`, attention factor applied, appended to `out` as
    /// the rotations here compute them: the table the GPU's rotary kernel reads.
    pub fn cos_sin(&self, pos: usize, out: &mut Vec<f32>) {
        let p = pos as f32;
        for &f in &self.inv_freq {
            let (sin, cos) = (p * f).sin_cos();
            out.extend([cos * self.attention_factor, sin * self.attention_factor]);
        }
    }

    /// The rotation at `pos`, its cos and sin computed once for every head rotated there
    /// (a decode step rotates each query head, each key head and each index head by the same
    /// angles).
    pub fn at(&self, pos: usize) -> Rotation<'_> {
        let mut cs = [[0f32; 2]; TABLE_PAIRS];
        let tabled = self.inv_freq.len() <= TABLE_PAIRS;
        if tabled {
            let p = pos as f32;
            for (t, &f) in cs.iter_mut().zip(&self.inv_freq) {
                let (sin, cos) = (p * f).sin_cos();
                *t = [cos * self.attention_factor, sin * self.attention_factor];
            }
        }
        Rotation {
            rope: self,
            pos,
            cs,
            tabled,
        }
    }

    /// Rotates `x` (exactly `dim()` values) in place for position `pos`, pairing `x[i]` with
    /// `x[i + dim / 2]`: transformers' `x * cos + rotate_half(x) * sin`, where `cos` and
    /// `sin` repeat each frequency in both halves.
    pub fn rotate_half(&self, x: &mut [f32], pos: usize) {
        debug_assert_eq!(x.len(), self.dim());
        let p = pos as f32;
        let (lo, hi) = x.split_at_mut(self.inv_freq.len());
        for ((a, b), &f) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.inv_freq) {
            let (sin, cos) = (p * f).sin_cos();
            let (sin, cos) = (sin * self.attention_factor, cos * self.attention_factor);
            let (x0, x1) = (*a, *b);
            *a = x0 * cos - x1 * sin;
            *b = x1 * cos + x0 * sin;
        }
    }

    /// Rotates `x` (exactly `dim()` values) in place for position `pos`.
    pub fn rotate(&self, x: &mut [f32], pos: usize) {
        debug_assert_eq!(x.len(), self.dim());
        let p = pos as f32;
        for (pair, &f) in x.chunks_exact_mut(2).zip(&self.inv_freq) {
            let angle = p * f;
            let (sin, cos) = angle.sin_cos();
            let (sin, cos) = (sin * self.attention_factor, cos * self.attention_factor);
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos - x1 * sin;
            pair[1] = x1 * cos + x0 * sin;
        }
    }
}

/// The most rotary pairs a [`Rotation`] keeps in its table (head dims up to 256); a wider
/// rotary part, which no published config has, computes its angles per call as before.
const TABLE_PAIRS: usize = 128;

/// [`Rope`] at one position: the cos and sin of each pair, computed once, with the same
/// operations as [`Rope::rotate`] and [`Rope::rotate_half`], so every rotated bit is theirs.
pub struct Rotation<'a> {
    rope: &'a Rope,
    pos: usize,
    cs: [[f32; 2]; TABLE_PAIRS],
    tabled: bool,
}

impl Rotation<'_> {
    /// [`Rope::rotate`] (the pairs `(x[2i], x[2i+1])`) at this position.
    pub fn interleaved(&self, x: &mut [f32]) {
        if !self.tabled {
            return self.rope.rotate(x, self.pos);
        }
        debug_assert_eq!(x.len(), self.rope.dim());
        for (pair, &[cos, sin]) in x.chunks_exact_mut(2).zip(&self.cs) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * cos - x1 * sin;
            pair[1] = x1 * cos + x0 * sin;
        }
    }

    /// [`Rope::rotate_half`] (the pairs `(x[i], x[i + dim / 2])`) at this position.
    pub fn half(&self, x: &mut [f32]) {
        if !self.tabled {
            return self.rope.rotate_half(x, self.pos);
        }
        debug_assert_eq!(x.len(), self.rope.dim());
        let (lo, hi) = x.split_at_mut(self.rope.inv_freq.len());
        for ((a, b), &[cos, sin]) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.cs) {
            let (x0, x1) = (*a, *b);
            *a = x0 * cos - x1 * sin;
            *b = x1 * cos + x0 * sin;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_relative_angle() {
        let rope = Rope::new(8, 10000.0);
        let q0: Vec<f32> = (0..8).map(|i| (i as f32 * 0.37).sin()).collect();
        let k0: Vec<f32> = (0..8).map(|i| (i as f32 * 0.91).cos()).collect();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let at = |p_q: usize, p_k: usize| {
            let (mut q, mut k) = (q0.clone(), k0.clone());
            rope.rotate(&mut q, p_q);
            rope.rotate(&mut k, p_k);
            dot(&q, &k)
        };
        // Scores depend only on the distance between positions.
        assert!((at(5, 2) - at(13, 10)).abs() < 1e-4);
        let mut q = q0.clone();
        rope.rotate(&mut q, 7);
        assert!((dot(&q, &q) - dot(&q0, &q0)).abs() < 1e-5);
    }

    /// A rotation's table gives the bits of the per-call rotations, plain and YaRN-scaled,
    /// at every width up to the table's and past it (the per-call fallback).
    #[test]
    fn the_table_rotates_bit_for_bit_as_each_call() {
        let yarn = crate::config::Yarn {
            factor: 40.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.3,
            mscale_all_dim: 1.0,
            truncate: true,
        };
        for dim in [2, 8, 64, 128, 256, 512] {
            for rope in [Rope::new(dim, 10000.0), Rope::yarn(dim, 1e6, &yarn)] {
                let x0: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
                for pos in [0, 1, 7, 4095, 131071] {
                    let at = rope.at(pos);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let (mut a, mut b) = (x0.clone(), x0.clone());
                    rope.rotate(&mut a, pos);
                    at.interleaved(&mut b);
                    assert_eq!(bits(&a), bits(&b), "interleaved, dim {dim} pos {pos}");
                    let (mut a, mut b) = (x0.clone(), x0.clone());
                    rope.rotate_half(&mut a, pos);
                    at.half(&mut b);
                    assert_eq!(bits(&a), bits(&b), "half, dim {dim} pos {pos}");
                }
            }
        }
    }
}
