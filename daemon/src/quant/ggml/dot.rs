//! The portable reference dot products of the K-quants and IQ4_XS (the 32-element types are
//! in `dot_q0.rs`), as llama.cpp's generic CPU code computes them: an exact i32 sum per block
//! (or sub-block), then the block's float scale products in llama.cpp's order.
//!
//! Q4_K, Q5_K and Q6_K take one exact i32 per block for the quants (`isum`: every quant times its
//! activation times its group's scale) and Q4_K/Q5_K one for the min term (`msum`), then per
//! block one float product of the two scales, one by the integer, one sum, into one running
//! sum each ([`K4Sums`], [`q6_k`]): no lanes, so any kernel shape (a row dot, a tile, a rows x positions panel)
//! can give these bits, whatever order it adds a block's integers in.
//! Q3_K keeps eight float lanes as llama.cpp's generic code does, but with the lane
//! assignment SIMD computes without shuffling: element `n` of a 256-block goes to integer lane
//! `(n % 32) / 4` (four neighbours a lane, what `maddubs` + `madd` give over 32 bytes, what
//! `dpbusd` gives over 64 bytes once its upper eight lanes are added to its lower eight, and
//! what NEON's `vdotq` gives over two 16-byte registers). The integer lanes are exact, so only
//! this assignment and the float steps after it fix the result's bits.

use super::dot_q0::nibbles32;
use super::Q8Row;
use crate::gguf::grids::IQ4NL_KVALUES;

#[inline]
pub(super) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

#[inline]
pub(super) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub(super) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The sum of eight lanes in order, as llama.cpp folds its `sums[8]` into the result.
#[inline]
fn fold8(sumf: f32, lanes: &[f32; 8]) -> f32 {
    lanes.iter().fold(sumf, |s, &l| s + l)
}

/// `lanes[l] += d * acc[l]` for a K-quant block's eight integer lanes.
#[inline]
fn add_lanes(lanes: &mut [f32; 8], d: f32, acc: &[i32; 8]) {
    for (l, &v) in lanes.iter_mut().zip(acc) {
        *l += d * v as f32;
    }
}

/// The integer lane of element `n` of a 256-block: four neighbours a lane, eight lanes a
/// 32-element run.
#[inline]
pub(super) fn lane_of(n: usize) -> usize {
    (n % 32) / 4
}

/// Adds `scale * q[i] * a[i]` into lane [`lane_of`]`(start + i)` for one run of quants that
/// begins at element `start` of its block.
#[inline]
fn lanes_mac(acc: &mut [i32; 8], start: usize, scale: i32, q: &[i8], a: &[i8]) {
    for (i, (&w, &x)) in q.iter().zip(a).enumerate() {
        acc[lane_of(start + i)] += scale * (w as i32 * x as i32);
    }
}

pub(super) fn q2_k(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(84).enumerate() {
        let sc = &b[0..16];
        let qs = &b[16..80];
        let q8 = &a.qs[i * 256..(i + 1) * 256];
        let bs = &a.bsums[i * 16..(i + 1) * 16];
        let summs: i32 = bs
            .iter()
            .zip(sc)
            .map(|(&s, &c)| s as i32 * (c >> 4) as i32)
            .sum();
        let dall = a.d[i] * f16_at(b, 80);
        let dmin = a.d[i] * f16_at(b, 82);
        let mut isum = 0i32;
        // 16 sub-blocks of 16: sub-block k reads plane (k / 2) % 4 of half k / 8.
        for k in 0..16 {
            let (half, plane, part) = (k / 8, (k / 2) % 4, k % 2);
            let q2 = &qs[half * 32 + part * 16..half * 32 + part * 16 + 16];
            let x = &q8[k * 16..k * 16 + 16];
            let s: i32 = q2
                .iter()
                .zip(x)
                .map(|(&q, &v)| v as i32 * ((q >> (2 * plane)) & 3) as i32)
                .sum();
            isum += (sc[k] & 0x0F) as i32 * s;
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

pub(super) fn q3_k(w: &[u8], a: &Q8Row) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut q = [0i8; 256];
    for (i, b) in w.chunks_exact(110).enumerate() {
        let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
        // Quant n: plane (n % 128) / 32 of half n / 128, less 4 where its high bit is clear.
        for (n, v) in q.iter_mut().enumerate() {
            let (half, r) = (n / 128, n % 128);
            let lo = (qs[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
            let h = (hmask[n % 32] >> (n / 32)) & 1;
            *v = lo as i8 - if h == 0 { 4 } else { 0 };
        }
        let q8 = &a.qs[i * 256..(i + 1) * 256];
        let mut acc = [0i32; 8];
        for k in 0..16 {
            let lo = (sc[k % 8] >> (4 * (k / 8))) & 0x0F;
            let hi = (sc[8 + k % 4] >> (2 * (k / 4))) & 0x03;
            let scale = (lo | (hi << 4)) as i32 - 32;
            lanes_mac(
                &mut acc,
                k * 16,
                scale,
                &q[k * 16..k * 16 + 16],
                &q8[k * 16..k * 16 + 16],
            );
        }
        add_lanes(&mut lanes, f16_at(b, 108) * a.d[i], &acc);
    }
    fold8(0.0, &lanes)
}

/// Q4_K/Q5_K's eight 6-bit (scale, min) pairs packed in 12 bytes.
#[inline]
pub(super) fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3F, s[4 + j] & 0x3F)
    } else {
        let sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
        let m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
        (sc, m)
    }
}

/// The exact integer sums of a Q4_K/Q5_K block: `isum`, every quant of `q` (256, unsigned)
/// times its activation times its 32-element group's 6-bit scale, and `msum`, every 16
/// activations' sum times its group's 6-bit min (at most 256 x 31 x 127 x 63 and 256 x 127 x
/// 63 in magnitude: exact in i32 in any order).
#[inline]
fn k4_block_sums(b: &[u8], q: &[i8; 256], a: &Q8Row, i: usize) -> (i32, i32) {
    let scales = &b[4..16];
    let q8 = &a.qs[i * 256..(i + 1) * 256];
    let bs = &a.bsums[i * 16..(i + 1) * 16];
    let mut msum = 0i32;
    for (j, &s) in bs.iter().enumerate() {
        msum += s as i32 * scale_min_k4(scales, j / 2).1 as i32;
    }
    let mut isum = 0i32;
    for g in 0..8 {
        let scale = scale_min_k4(scales, g).0 as i32;
        let s: i32 = q[g * 32..g * 32 + 32]
            .iter()
            .zip(&q8[g * 32..g * 32 + 32])
            .map(|(&w, &x)| w as i32 * x as i32)
            .sum();
        isum += scale * s;
    }
    (isum, msum)
}

/// The float steps of Q4_K and Q5_K (every kernel's, the panels' included): per block `i`,
/// `sum += (d * a.d[i]) * isum` and `mins += (dmin * a.d[i]) * msum` (a product, a product,
/// a sum; no fused multiply-add), and the result `sum - mins`. One running sum each: the
/// integer work of a 256-block hides the latency of one float sum.
#[derive(Clone, Copy, Default)]
pub(super) struct K4Sums {
    pub sum: f32,
    pub mins: f32,
}

impl K4Sums {
    #[inline]
    pub fn add(&mut self, d: f32, dmin: f32, ad: f32, isum: i32, msum: i32) {
        self.sum += (d * ad) * isum as f32;
        self.mins += (dmin * ad) * msum as f32;
    }

    #[inline]
    pub fn result(self) -> f32 {
        self.sum - self.mins
    }
}

pub(super) fn q4_k(w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = K4Sums::default();
    let mut q = [0i8; 256];
    for (i, b) in w.chunks_exact(144).enumerate() {
        let qs = &b[16..144];
        for (n, v) in q.iter_mut().enumerate() {
            let g = n / 32;
            *v = ((qs[(g / 2) * 32 + n % 32] >> (4 * (g % 2))) & 0x0F) as i8;
        }
        let (isum, msum) = k4_block_sums(b, &q, a, i);
        acc.add(f16_at(b, 0), f16_at(b, 2), a.d[i], isum, msum);
    }
    acc.result()
}

pub(super) fn q5_k(w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = K4Sums::default();
    let mut q = [0i8; 256];
    for (i, b) in w.chunks_exact(176).enumerate() {
        let (qh, qs) = (&b[16..48], &b[48..176]);
        for (n, v) in q.iter_mut().enumerate() {
            let g = n / 32;
            let lo = (qs[(g / 2) * 32 + n % 32] >> (4 * (g % 2))) & 0x0F;
            let h = (qh[n % 32] >> g) & 1;
            *v = (lo | (h << 4)) as i8;
        }
        let (isum, msum) = k4_block_sums(b, &q, a, i);
        acc.add(f16_at(b, 0), f16_at(b, 2), a.d[i], isum, msum);
    }
    acc.result()
}

/// Q6_K: per block the exact `isum` (every quant, less 32, times its activation times its
/// 16-element group's signed scale: at most 256 x 32 x 127 x 128, exact in i32), then
/// `sum += (d * a.d[i]) * isum` (a product, a product, a sum), one running sum as Q4_K's.
pub(super) fn q6_k(w: &[u8], a: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    let mut q = [0i8; 256];
    for (i, b) in w.chunks_exact(210).enumerate() {
        let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
        for (n, v) in q.iter_mut().enumerate() {
            let (half, r) = (n / 128, n % 128);
            let lo = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
            let hi = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
            *v = (lo | (hi << 4)) as i8 - 32;
        }
        let q8 = &a.qs[i * 256..(i + 1) * 256];
        let mut isum = 0i32;
        for k in 0..16 {
            let s: i32 = q[k * 16..k * 16 + 16]
                .iter()
                .zip(&q8[k * 16..k * 16 + 16])
                .map(|(&w, &x)| w as i32 * x as i32)
                .sum();
            isum += sc[k] as i8 as i32 * s;
        }
        sum += (f16_at(b, 208) * a.d[i]) * isum as f32;
    }
    sum
}

/// IQ4_XS: each 32-element group's exact sum times its 6-bit scale (less 32), added over the
/// block in i32 (at most 256 x 127 x 127 x 32, well inside it), then one float product a block.
/// llama.cpp's generic code takes a float per group instead; one integer sum lets the SIMD
/// kernels scale the groups in their integer lanes.
pub(super) fn iq4_xs(w: &[u8], a: &Q8Row) -> f32 {
    let mut sumf = 0.0f32;
    for (i, b) in w.chunks_exact(136).enumerate() {
        let h = u16_at(b, 2);
        let (sl, qs) = (&b[4..8], &b[8..136]);
        let mut sumi = 0i32;
        for g in 0..8 {
            let lo = (sl[g / 2] >> (4 * (g % 2))) & 0x0F;
            let hi = ((h >> (2 * g)) & 3) as u8;
            let x = &a.qs[i * 256 + g * 32..i * 256 + g * 32 + 32];
            let si = nibbles32(&qs[g * 16..g * 16 + 16], x, |q| {
                IQ4NL_KVALUES[q as usize] as i32
            });
            sumi += ((lo | (hi << 4)) as i32 - 32) * si;
        }
        sumf += f16_at(b, 0) * a.d[i] * sumi as f32;
    }
    sumf
}
