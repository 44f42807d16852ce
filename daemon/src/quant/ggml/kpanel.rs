//! Prefill's rows x positions panels of the K-quants (issue 49), AVX-512 VNNI: eight weight
//! rows against eight positions a microkernel call, each output the row dot's bits.
//!
//! The orientation is the transpose of a tile's: a 256-bit vector holds eight *positions*,
//! not rows. Each call rearranges its positions' activations once (four inputs of each of
//! eight positions in one vector, every 4-input step), and each weight row is only unpacked
//! to one byte a quant in input order, so a quad of a row's weights is a broadcast operand of
//! `vpdpbusd`: one activation load a step serves eight rows, and no weight transposition is
//! needed. `vpdpbusd` multiplies unsigned by signed bytes, so the roles flip: the weights
//! (signed quants) are the signed operand and the activations go in as `x + 128` (unsigned);
//! the `128 x sum(scale x quant)` this adds is a per-row constant of the block, taken off the
//! block's integer sum, which is then exact, as the reference's (`dot.rs`).
//!
//! Per scaled group of a block (Q4_K/Q5_K: 32 elements, Q6_K: 16), its steps of `vpdpbusd`
//! into fresh sums, then one `vpmulld` by the group's scale into the block's sum; per block
//! Q4_K/Q5_K's min term (each 32 activations' sum, from the Q8_K bsums, times the group's min)
//! by four `vpdpwssd`, then the reference's float steps (`dot::K4Sums`, `dot::q6_k`) for the
//! eight positions in one vector. Q6_K's quants go in as the reference's signed ones (6 bits
//! less 32), which the signed operand takes as they are.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::x86::{f16_one, f16_pair, k4_scales_mins, load32, q6_k_half};
use super::{PanelFn, Q8Row};
use crate::gguf::GgmlType;

/// The panel of `ty`, where there is one and this CPU has AVX-512 F/BW/VL/VNNI and F16C.
pub(super) fn panel(ty: GgmlType) -> Option<PanelFn> {
    let ok = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if !ok {
        return None;
    }
    match ty {
        GgmlType::Q4_K => Some(q4_k),
        GgmlType::Q5_K => Some(q5_k),
        GgmlType::Q6_K => Some(q6_k),
        _ => None,
    }
}

/// Weight rows a microkernel call.
const R: usize = 8;
/// Positions a microkernel call: one 256-bit vector of i32.
const P: usize = 8;
/// 4-input steps a 256-block.
const STEPS: usize = 64;

/// A call's activations, rearranged for the microkernel; positions past the last are zero.
#[derive(Default)]
struct Acts {
    /// `[group][step][position]`: inputs `4 step .. 4 step + 4` of position `8 group + p`,
    /// each byte `x + 128` (its top bit flipped).
    xs: Vec<u32>,
    /// `[group][block][position]`: the Q8_K block scales.
    d: Vec<f32>,
    /// `[group][block][pair][position]`: the sums of 32-element groups `2 pair` (low i16)
    /// and `2 pair + 1` (high i16), each two bsums (at most 32 x 127, exact in i16).
    pairs: Vec<u32>,
}

impl Acts {
    fn fill(&mut self, x: &[Q8Row], cols: usize) {
        let (nb, steps) = (cols / 256, cols / 4);
        let groups = x.len().div_ceil(P);
        self.xs.clear();
        self.xs.resize(groups * steps * P, 0x8080_8080);
        self.d.clear();
        self.d.resize(groups * nb * P, 0.0);
        self.pairs.clear();
        self.pairs.resize(groups * nb * 4 * P, 0);
        for (s, a) in x.iter().enumerate() {
            let (g, p) = (s / P, s % P);
            let xs = &mut self.xs[g * steps * P..(g + 1) * steps * P];
            for (k, q) in a.qs[..cols].chunks_exact(4).enumerate() {
                let v = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
                xs[k * P + p] = v ^ 0x8080_8080;
            }
            for i in 0..nb {
                self.d[(g * nb + i) * P + p] = a.d[i];
                let bs = &a.bsums[i * 16..(i + 1) * 16];
                for pair in 0..4 {
                    let lo = bs[4 * pair] + bs[4 * pair + 1];
                    let hi = bs[4 * pair + 2] + bs[4 * pair + 3];
                    self.pairs[((g * nb + i) * 4 + pair) * P + p] =
                        (lo as u16 as u32) | ((hi as u16 as u32) << 16);
                }
            }
        }
    }
}

/// One block of `R` weight rows, unpacked.
struct Unpacked {
    /// Per row the 256 quants, one signed byte each in input order, four to a word.
    q: [[u32; STEPS]; R],
    /// Per row the groups' scales (eight groups of 32, or Q6_K's sixteen of 16).
    sc: [[i32; 16]; R],
    /// Per row the eight groups' mins as i16 pairs (groups `2 pair`, `2 pair + 1`).
    mins: [[u32; 4]; R],
    /// Per row `128 x sum(scale x quant)`, what the activations' offset adds.
    offset: [i32; R],
    d: [f32; R],
    dmin: [f32; R],
}

impl Unpacked {
    fn new() -> Unpacked {
        Unpacked {
            q: [[0; STEPS]; R],
            sc: [[0; 16]; R],
            mins: [[0; 4]; R],
            offset: [0; R],
            d: [0.0; R],
            dmin: [0.0; R],
        }
    }
}

/// A call's scratch, kept by each thread so a prefill allocates only when a shape grows.
#[derive(Default)]
struct Scratch {
    acts: Acts,
    /// `[group]`: per row of the current eight the running sums and mins of eight positions.
    sums: Vec<[[f32; P]; R]>,
    mins: Vec<[[f32; P]; R]>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn q4_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], out_stride: usize) {
    // SAFETY: `panel` hands this function out only after detecting every feature the
    // kernels are compiled for; their loads go through bounds-checked slices.
    unsafe { k_panel::<8, true>(w, cols, x, out, out_stride, 144, unpack_q4_k) }
}

fn q5_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], out_stride: usize) {
    // SAFETY: as `q4_k`.
    unsafe { k_panel::<8, true>(w, cols, x, out, out_stride, 176, unpack_q5_k) }
}

fn q6_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], out_stride: usize) {
    // SAFETY: as `q4_k`.
    unsafe { k_panel::<16, false>(w, cols, x, out, out_stride, 210, unpack_q6_k) }
}

/// Unpacks one block's quants (`lo_hi(j)`: groups `2j` and `2j + 1` as 32 bytes each) and
/// its scales and mins into row `r` of `u`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn unpack_k4(b: &[u8], u: &mut Unpacked, r: usize, lo_hi: impl Fn(usize) -> [__m256i; 2]) {
    let (d, dmin) = f16_pair(b, 0);
    let mut sm = [0u8; 16];
    // SAFETY: `sm` is 16 writable bytes; the store is unaligned.
    unsafe { _mm_storeu_si128(sm.as_mut_ptr() as *mut __m128i, k4_scales_mins(&b[4..16])) };
    let mut offset = 0i32;
    for j in 0..4 {
        for (h, q) in lo_hi(j).into_iter().enumerate() {
            let g = 2 * j + h;
            let dst = &mut u.q[r][g * 8..g * 8 + 8];
            // SAFETY: `dst` is 8 writable u32 (32 bytes); the store is unaligned.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, q) };
            let s = _mm256_sad_epu8(q, _mm256_setzero_si256());
            let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let qsum = _mm_cvtsi128_si32(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s)));
            offset += sm[g] as i32 * qsum;
        }
    }
    for g in 0..8 {
        u.sc[r][g] = sm[g] as i32;
    }
    for pair in 0..4 {
        u.mins[r][pair] = sm[8 + 2 * pair] as u32 | ((sm[8 + 2 * pair + 1] as u32) << 16);
    }
    u.offset[r] = 128 * offset;
    u.d[r] = d;
    u.dmin[r] = dmin;
}

#[target_feature(enable = "avx2,f16c")]
fn unpack_q4_k(b: &[u8], u: &mut Unpacked, r: usize) {
    let m4 = _mm256_set1_epi8(0x0F);
    unpack_k4(b, u, r, |j| {
        let q4 = load32(b, 16 + 32 * j);
        [
            _mm256_and_si256(q4, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4),
        ]
    });
}

#[target_feature(enable = "avx2,f16c")]
fn unpack_q5_k(b: &[u8], u: &mut Unpacked, r: usize) {
    let m4 = _mm256_set1_epi8(0x0F);
    let b4 = _mm256_set1_epi8(0x10);
    let qh = load32(b, 16);
    unpack_k4(b, u, r, |j| {
        let q4 = load32(b, 48 + 32 * j);
        // Bit g of each qh byte is bit 4 of group g's quant.
        let high = |g: i32| {
            let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(g));
            _mm256_and_si256(_mm256_slli_epi16::<4>(v), b4)
        };
        [
            _mm256_or_si256(_mm256_and_si256(q4, m4), high(2 * j as i32)),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4),
                high(2 * j as i32 + 1),
            ),
        ]
    });
}

/// Q6_K's block into row `r` of `u`: quants `n = 128 half + 32 c + t`, the low (`c < 2`)
/// or high nibble of `ql[64 half + 32 (c % 2) + t]` under bits `2c` of `qh[32 half + t]`, less
/// 32 (signed bytes, as the reference); sixteen signed group scales.
#[target_feature(enable = "avx2,f16c")]
fn unpack_q6_k(b: &[u8], u: &mut Unpacked, r: usize) {
    let sc: [i32; 16] = std::array::from_fn(|k| b[192 + k] as i8 as i32);
    let mut offset = 0i32;
    for half in 0..2 {
        let runs = q6_k_half(b, half);
        for (c, &unsigned) in runs.iter().enumerate() {
            let n = half * 128 + c * 32;
            let q = _mm256_sub_epi8(unsigned, _mm256_set1_epi8(32));
            let dst = &mut u.q[r][n / 4..n / 4 + 8];
            // SAFETY: `dst` is 8 writable u32 (32 bytes); the store is unaligned.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, q) };
            // The unsigned quants' sums of the run's two 16-element groups, less 32 each.
            let s = _mm256_sad_epu8(unsigned, _mm256_setzero_si256());
            let mut w = [0i64; 4];
            // SAFETY: `w` is 32 writable bytes; the store is unaligned.
            unsafe { _mm256_storeu_si256(w.as_mut_ptr() as *mut __m256i, s) };
            let k = n / 16;
            offset += sc[k] * ((w[0] + w[1]) as i32 - 32 * 16);
            offset += sc[k + 1] * ((w[2] + w[3]) as i32 - 32 * 16);
        }
    }
    u.sc[r] = sc;
    u.offset[r] = 128 * offset;
    u.d[r] = f16_one(b, 208);
    u.dmin[r] = 0.0;
}

/// The panel of a K-quant matrix of `GROUPS` scaled groups a block, with a min term or not
/// (`MINS`), `bb` bytes a block, `unpack` its block unpacker: rows eight at a time (a last
/// partial eight repeats its last row and drops those outputs), each block unpacked once and
/// run against every group of eight positions. Without a min term the outputs are
/// `sum - 0.0`, the sum's bits.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k_panel<const GROUPS: usize, const MINS: bool>(
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    out_stride: usize,
    bb: usize,
    unpack: unsafe fn(&[u8], &mut Unpacked, usize),
) {
    let nb = cols / 256;
    let rb = nb * bb;
    let rows = w.len() / rb;
    let n = x.len();
    if rows == 0 || n == 0 {
        return;
    }
    let groups = n.div_ceil(P);
    SCRATCH.with_borrow_mut(|s| {
        s.acts.fill(x, cols);
        s.sums.resize(groups, [[0.0; P]; R]);
        s.mins.resize(groups, [[0.0; P]; R]);
        let mut u = Unpacked::new();
        for r0 in (0..rows).step_by(R) {
            let nr = R.min(rows - r0);
            s.sums[..groups].fill([[0.0; P]; R]);
            s.mins[..groups].fill([[0.0; P]; R]);
            for i in 0..nb {
                for r in 0..R {
                    let row = r0 + r.min(nr - 1);
                    // SAFETY: the unpackers need AVX2 and F16C, which this function has.
                    unsafe { unpack(&w[row * rb + i * bb..row * rb + (i + 1) * bb], &mut u, r) };
                }
                for g in 0..groups {
                    let xs = &s.acts.xs[(g * cols / 4 + i * STEPS) * P..][..STEPS * P];
                    let d = &s.acts.d[(g * nb + i) * P..][..P];
                    let pairs = &s.acts.pairs[(g * nb + i) * 4 * P..][..4 * P];
                    k_block::<GROUPS, MINS>(
                        &u,
                        xs.try_into().expect("a block's steps"),
                        d.try_into().expect("eight scales"),
                        pairs.try_into().expect("four pairs"),
                        &mut s.sums[g],
                        &mut s.mins[g],
                    );
                }
            }
            for r in 0..nr {
                let o = &mut out[(r0 + r) * out_stride..(r0 + r) * out_stride + n];
                for (p, y) in o.iter_mut().enumerate() {
                    let (g, l) = (p / P, p % P);
                    *y = s.sums[g][r][l] - s.mins[g][r][l];
                }
            }
        }
    });
}

/// One block of eight rows against eight positions: the exact integer sums (`GROUPS` groups
/// of `64 / GROUPS` steps, each scaled), then the reference's float steps into `sums` and,
/// with `MINS`, `mins` (`[row][position]`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k_block<const GROUPS: usize, const MINS: bool>(
    u: &Unpacked,
    xs: &[u32; STEPS * P],
    d: &[f32; P],
    pairs: &[u32; 4 * P],
    sums: &mut [[f32; P]; R],
    mins: &mut [[f32; P]; R],
) {
    let ld = |v: &[u32]| {
        // SAFETY: `v` has at least 8 readable u32; the load is unaligned.
        unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) }
    };
    let mut isum = [_mm256_setzero_si256(); R];
    let steps = STEPS / GROUPS;
    for g in 0..GROUPS {
        let mut s = [_mm256_setzero_si256(); R];
        for k in 0..steps {
            let x = ld(&xs[(g * steps + k) * P..]);
            for r in 0..R {
                let w = _mm256_set1_epi32(u.q[r][g * steps + k] as i32);
                s[r] = _mm256_dpbusd_epi32(s[r], x, w);
            }
        }
        for r in 0..R {
            let sc = _mm256_set1_epi32(u.sc[r][g]);
            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], sc));
        }
    }
    let ad = {
        // SAFETY: `d` is 8 readable f32; the load is unaligned.
        unsafe { _mm256_loadu_ps(d.as_ptr()) }
    };
    let pv: [__m256i; 4] = std::array::from_fn(|k| ld(&pairs[k * P..]));
    for r in 0..R {
        let i = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(u.offset[r]));
        let dd = _mm256_mul_ps(_mm256_set1_ps(u.d[r]), ad);
        // SAFETY: each row of `sums` and `mins` is 8 readable and writable f32; the loads
        // and stores are unaligned.
        unsafe {
            let sp = sums[r].as_mut_ptr();
            let mp = mins[r].as_mut_ptr();
            let si = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(i));
            _mm256_storeu_ps(sp, _mm256_add_ps(_mm256_loadu_ps(sp), si));
            if MINS {
                let mut m = _mm256_setzero_si256();
                for (k, &v) in pv.iter().enumerate() {
                    m = _mm256_dpwssd_epi32(m, v, _mm256_set1_epi32(u.mins[r][k] as i32));
                }
                let dm = _mm256_mul_ps(_mm256_set1_ps(u.dmin[r]), ad);
                let mi = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(m));
                _mm256_storeu_ps(mp, _mm256_add_ps(_mm256_loadu_ps(mp), mi));
            }
        }
    }
}
