//! Prefill's rows x positions panels of the K-quants (issue 49), AVX-512 VNNI: eight weight
//! rows against sixteen positions a microkernel call, each output the row dot's bits.
//!
//! The orientation is the transpose of a tile's: a 512-bit vector holds sixteen *positions*,
//! not rows. Each call rearranges its positions' activations once (four inputs of each of
//! sixteen positions in one vector, every 4-input step, by 8 x 8 transposes of 32-bit words),
//! and each weight row is only unpacked to one byte a quant in input order, so a quad of a
//! row's weights is a broadcast operand of `vpdpbusd`: one activation load a step serves
//! eight rows, and no weight transposition is needed. A last group of at most eight positions
//! takes the same steps on 256-bit vectors. Where the CPU has AMX, K-quant products of more
//! than sixteen positions take `kpanel_amx.rs`'s tile products instead (its rows past the last
//! whole sixteen come back here).
//!
//! `vpdpbusd` multiplies unsigned by signed bytes. Q4_K/Q5_K's quants are unsigned, so they
//! are the unsigned operand and the activations the signed one, as quantized. Q6_K's are the
//! reference's signed ones (6 bits less 32), so the roles flip: the activations go in as
//! `x + 128` (unsigned), and the `128 x sum(scale x quant)` this adds, a per-row constant of
//! the block, comes off the block's integer sum. Either way that sum is exact, as the
//! reference's (`dot.rs`).
//!
//! Per scaled group of a block (Q4_K/Q5_K: 32 elements, Q6_K: 16), its steps of `vpdpbusd`
//! into fresh sums, then one `vpmulld` by the group's scale into the block's sum; per block
//! Q4_K/Q5_K's min term (each 32 activations' sum, from the Q8_K bsums, times the group's min)
//! by four `vpdpwssd`, then the reference's float steps (`dot::K4Sums`, `dot::q6_k`) for the
//! sixteen positions in one vector.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::rows::NextRows;
use super::x86::{f16_one, f16_pair, k4_scales_mins, load32, load32_i8, q6_k_half};
use super::{PanelFn, Q8Row};
use crate::gguf::GgmlType;

/// The panel of `ty`, where there is one and this CPU has AVX-512 F/BW/VL/VNNI and F16C:
/// Q4_K/Q5_K/Q6_K's on AMX where the CPU and the OS give it (`kpanel_amx.rs`), else this file's.
pub(super) fn panel(ty: GgmlType) -> Option<PanelFn> {
    super::kpanel_amx::panel(ty).or_else(|| vnni_panel(ty))
}

/// This file's VNNI panel of `ty`, where there is one and this CPU has the features.
pub(super) fn vnni_panel(ty: GgmlType) -> Option<PanelFn> {
    if !super::x86::has_panel_features() {
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
/// Positions a group: one 512-bit vector of i32.
const P: usize = 16;
/// Positions a half group: one 256-bit vector, the microkernel of a last group of at most 8.
const H: usize = 8;
/// 4-input steps a 256-block.
const STEPS: usize = 64;

/// A call's activations, rearranged for the microkernel; positions past the last are zero.
#[derive(Default)]
pub(super) struct Acts {
    /// `[group][step][position]`: inputs `4 step .. 4 step + 4` of position `16 group + p`,
    /// each byte XOR `flip` (`0x80` a byte: `x + 128`, the unsigned operand; 0: as quantized).
    pub(super) xs: Vec<u32>,
    /// `[group][block][position]`: the Q8_K block scales.
    pub(super) d: Vec<f32>,
    /// `[group][block][pair][position]`: the sums of 32-element groups `2 pair` (low i16)
    /// and `2 pair + 1` (high i16), each two bsums (at most 32 x 128, exact in i16).
    pub(super) pairs: Vec<u32>,
}

impl Acts {
    #[target_feature(enable = "avx2")]
    pub(super) fn fill(&mut self, x: &[Q8Row], cols: usize, flip: u32) {
        let (nb, steps) = (cols / 256, cols / 4);
        let groups = x.len().div_ceil(P);
        self.xs.clear();
        self.xs.resize(groups * steps * P, flip);
        self.d.clear();
        self.d.resize(groups * nb * P, 0.0);
        self.pairs.clear();
        self.pairs.resize(groups * nb * 4 * P, 0);
        // Eight positions' rows at a time, eight steps (32 bytes) of each by an 8 x 8
        // transpose of 32-bit words: step `8 c + k` of the eight is word `k` of the chunk.
        for (h, eight) in x.chunks(H).enumerate() {
            let (g, p0) = (h / 2, (h % 2) * H);
            let xs = &mut self.xs[g * steps * P..(g + 1) * steps * P];
            for c in 0..steps / 8 {
                let rows: [__m256i; H] = std::array::from_fn(|p| match eight.get(p) {
                    Some(a) => load32_i8(a.qs, 32 * c),
                    None => _mm256_setzero_si256(),
                });
                let f = _mm256_set1_epi32(flip as i32);
                for (k, v) in crate::quant::x86::transpose8x8_epi32(rows)
                    .into_iter()
                    .enumerate()
                {
                    let dst = &mut xs[(8 * c + k) * P + p0..][..H];
                    let v = _mm256_xor_si256(v, f);
                    // SAFETY: `dst` is 8 writable u32 (32 bytes); the store is unaligned.
                    unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, v) };
                }
            }
        }
        for (s, a) in x.iter().enumerate() {
            let (g, p) = (s / P, s % P);
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
    /// Per row the 256 quants, one byte each in input order, four to a word.
    q: [[u32; STEPS]; R],
    /// Per row the groups' scales (eight groups of 32, or Q6_K's sixteen of 16).
    sc: [[i32; 16]; R],
    /// Per row the eight groups' mins as i16 pairs (groups `2 pair`, `2 pair + 1`).
    mins: [[u32; 4]; R],
    /// Per row `128 x sum(scale x quant)`, what the activations' offset adds (Q6_K).
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
    /// `[group]`: per row of the current eight the running sums and mins of sixteen positions.
    sums: Vec<[[f32; P]; R]>,
    mins: Vec<[[f32; P]; R]>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn q4_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
    // SAFETY: `panel` hands this function out only after detecting every feature the
    // kernels are compiled for; their loads go through bounds-checked slices.
    unsafe { k_panel::<8, true, false>(w, cols, x, out, [rs, ps], 144, unpack_q4_k) }
}

fn q5_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
    // SAFETY: as `q4_k`.
    unsafe { k_panel::<8, true, false>(w, cols, x, out, [rs, ps], 176, unpack_q5_k) }
}

fn q6_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
    // SAFETY: as `q4_k`.
    unsafe { k_panel::<16, false, true>(w, cols, x, out, [rs, ps], 210, unpack_q6_k) }
}

/// Unpacks one Q4_K/Q5_K block's quants (`lo_hi(j)`: groups `2j` and `2j + 1` as 32 bytes
/// each, unsigned) and its scales and mins into row `r` of `u`. The quants are the unsigned
/// operand as they are, so there is no offset to take off.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn unpack_k4(b: &[u8], u: &mut Unpacked, r: usize, lo_hi: impl Fn(usize) -> [__m256i; 2]) {
    let (d, dmin) = f16_pair(b, 0);
    let sm = k4_scales_mins(&b[4..16]);
    // SAFETY: `u.sc[r]` is 16 writable i32 and the store writes the first 8 (32 bytes);
    // `u.mins[r]` is 4 writable u32 (16 bytes), the eight mins as i16 in order. Both
    // stores are unaligned.
    unsafe {
        let sc = _mm256_cvtepu8_epi32(sm);
        _mm256_storeu_si256(u.sc[r].as_mut_ptr() as *mut __m256i, sc);
        let mins = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
        _mm_storeu_si128(u.mins[r].as_mut_ptr() as *mut __m128i, mins);
    }
    for j in 0..4 {
        for (h, q) in lo_hi(j).into_iter().enumerate() {
            let g = 2 * j + h;
            let dst = &mut u.q[r][g * 8..g * 8 + 8];
            // SAFETY: `dst` is 8 writable u32 (32 bytes); the store is unaligned.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, q) };
        }
    }
    u.offset[r] = 0;
    u.d[r] = d;
    u.dmin[r] = dmin;
}

#[target_feature(enable = "avx2,f16c")]
fn unpack_q4_k(b: &[u8], u: &mut Unpacked, r: usize) {
    unpack_k4(b, u, r, |j| q4_k_runs(b, j));
}

#[target_feature(enable = "avx2,f16c")]
fn unpack_q5_k(b: &[u8], u: &mut Unpacked, r: usize) {
    unpack_k4(b, u, r, |j| q5_k_runs(b, j));
}

/// Groups `2j` and `2j + 1` of a Q4_K block `b`, 32 quants (0..=15) each, one a byte.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q4_k_runs(b: &[u8], j: usize) -> [__m256i; 2] {
    let m4 = _mm256_set1_epi8(0x0F);
    let q4 = load32(b, 16 + 32 * j);
    [
        _mm256_and_si256(q4, m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4),
    ]
}

/// Groups `2j` and `2j + 1` of a Q5_K block `b`, 32 quants (0..=31) each, one a byte.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q5_k_runs(b: &[u8], j: usize) -> [__m256i; 2] {
    let m4 = _mm256_set1_epi8(0x0F);
    let b4 = _mm256_set1_epi8(0x10);
    let qh = load32(b, 16);
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
}

/// Q6_K's block into row `r` of `u`: quants `n = 128 half + 32 c + t`, the low (`c < 2`)
/// or high nibble of `ql[64 half + 32 (c % 2) + t]` under bits `2c` of `qh[32 half + t]`, less
/// 32 (signed bytes, as the reference, so the activations are the unsigned operand, offset by
/// 128); sixteen signed group scales.
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
/// (`MINS`), signed quants (`SIGNED`: the activations then go in offset by 128 and each
/// row's `offset` comes off its block sums) or unsigned, `bb` bytes a block, `unpack` its
/// block unpacker: rows eight at a time (a last partial eight repeats its last row and drops
/// those outputs), each block unpacked once and run against every group of sixteen positions
/// (a last group of at most eight by the 256-bit microkernel). Without a min term the
/// outputs are `sum - 0.0`, the sum's bits.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k_panel<const GROUPS: usize, const MINS: bool, const SIGNED: bool>(
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    [row_stride, pos_stride]: [usize; 2],
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
    // The last group's positions: at most eight take the 256-bit microkernel.
    let half_last = n - (groups - 1) * P <= H;
    SCRATCH.with_borrow_mut(|s| {
        s.acts.fill(x, cols, if SIGNED { 0x8080_8080 } else { 0 });
        s.sums.resize(groups, [[0.0; P]; R]);
        s.mins.resize(groups, [[0.0; P]; R]);
        let mut u = Unpacked::new();
        for r0 in (0..rows).step_by(R) {
            let nr = R.min(rows - r0);
            s.sums[..groups].fill([[0.0; P]; R]);
            s.mins[..groups].fill([[0.0; P]; R]);
            let next = NextRows::new(w, rb, r0, R, nb);
            for i in 0..nb {
                next.block(i);
                for r in 0..R {
                    let row = r0 + r.min(nr - 1);
                    // SAFETY: the unpackers need AVX2 and F16C, which this function has.
                    unsafe { unpack(&w[row * rb + i * bb..row * rb + (i + 1) * bb], &mut u, r) };
                }
                for g in 0..groups {
                    let xs = &s.acts.xs[(g * cols / 4 + i * STEPS) * P..][..STEPS * P];
                    let d = &s.acts.d[(g * nb + i) * P..][..P];
                    let pairs = &s.acts.pairs[(g * nb + i) * 4 * P..][..4 * P];
                    let block = Block {
                        xs: xs.try_into().expect("a block's steps"),
                        d: d.try_into().expect("sixteen scales"),
                        pairs: pairs.try_into().expect("four pairs"),
                    };
                    let (sums, mins) = (&mut s.sums[g], &mut s.mins[g]);
                    if half_last && g + 1 == groups {
                        k_block8::<GROUPS, MINS, SIGNED>(&u, &block, sums, mins);
                    } else {
                        k_block16::<GROUPS, MINS, SIGNED>(&u, &block, sums, mins);
                    }
                }
            }
            for p in 0..n {
                let (g, l) = (p / P, p % P);
                for r in 0..nr {
                    let y = s.sums[g][r][l] - s.mins[g][r][l];
                    out[(r0 + r) * row_stride + p * pos_stride] = y;
                }
            }
        }
    });
}

/// One block's activations of a group of sixteen positions (see [`Acts`]).
struct Block<'a> {
    xs: &'a [u32; STEPS * P],
    d: &'a [f32; P],
    pairs: &'a [u32; 4 * P],
}

/// One block of eight rows against sixteen positions: the exact integer sums (`GROUPS`
/// groups of `64 / GROUPS` steps, each scaled), then the reference's float steps into `sums`
/// and, with `MINS`, `mins` (`[row][position]`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k_block16<const GROUPS: usize, const MINS: bool, const SIGNED: bool>(
    u: &Unpacked,
    b: &Block,
    sums: &mut [[f32; P]; R],
    mins: &mut [[f32; P]; R],
) {
    let ld = |v: &[u32]| {
        let v = &v[..P];
        // SAFETY: `v` is 16 readable u32; the load is unaligned.
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) }
    };
    let mut isum = [_mm512_setzero_si512(); R];
    let steps = STEPS / GROUPS;
    for g in 0..GROUPS {
        let mut s = [_mm512_setzero_si512(); R];
        for k in g * steps..(g + 1) * steps {
            let x = ld(&b.xs[k * P..]);
            for r in 0..R {
                let w = _mm512_set1_epi32(u.q[r][k] as i32);
                s[r] = if SIGNED {
                    _mm512_dpbusd_epi32(s[r], x, w)
                } else {
                    _mm512_dpbusd_epi32(s[r], w, x)
                };
            }
        }
        for r in 0..R {
            let sc = _mm512_set1_epi32(u.sc[r][g]);
            isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s[r], sc));
        }
    }
    // SAFETY: `b.d` is 16 readable f32; the load is unaligned.
    let ad = unsafe { _mm512_loadu_ps(b.d.as_ptr()) };
    let pv: [__m512i; 4] = std::array::from_fn(|k| ld(&b.pairs[k * P..]));
    for r in 0..R {
        let i = if SIGNED {
            _mm512_sub_epi32(isum[r], _mm512_set1_epi32(u.offset[r]))
        } else {
            isum[r]
        };
        let dd = _mm512_mul_ps(_mm512_set1_ps(u.d[r]), ad);
        // SAFETY: each row of `sums` and `mins` is 16 readable and writable f32; the loads
        // and stores are unaligned.
        unsafe {
            let sp = sums[r].as_mut_ptr();
            let si = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(i));
            _mm512_storeu_ps(sp, _mm512_add_ps(_mm512_loadu_ps(sp), si));
            if MINS {
                let mp = mins[r].as_mut_ptr();
                let mut m = _mm512_setzero_si512();
                for (k, &v) in pv.iter().enumerate() {
                    m = _mm512_dpwssd_epi32(m, v, _mm512_set1_epi32(u.mins[r][k] as i32));
                }
                let dm = _mm512_mul_ps(_mm512_set1_ps(u.dmin[r]), ad);
                let mi = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(m));
                _mm512_storeu_ps(mp, _mm512_add_ps(_mm512_loadu_ps(mp), mi));
            }
        }
    }
}

/// [`k_block16`] for the first eight positions of a group only (a last group of at most
/// eight): the same steps on 256-bit vectors.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn k_block8<const GROUPS: usize, const MINS: bool, const SIGNED: bool>(
    u: &Unpacked,
    b: &Block,
    sums: &mut [[f32; P]; R],
    mins: &mut [[f32; P]; R],
) {
    let ld = |v: &[u32]| {
        let v = &v[..H];
        // SAFETY: `v` is 8 readable u32; the load is unaligned.
        unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) }
    };
    let mut isum = [_mm256_setzero_si256(); R];
    let steps = STEPS / GROUPS;
    for g in 0..GROUPS {
        let mut s = [_mm256_setzero_si256(); R];
        for k in g * steps..(g + 1) * steps {
            let x = ld(&b.xs[k * P..]);
            for r in 0..R {
                let w = _mm256_set1_epi32(u.q[r][k] as i32);
                s[r] = if SIGNED {
                    _mm256_dpbusd_epi32(s[r], x, w)
                } else {
                    _mm256_dpbusd_epi32(s[r], w, x)
                };
            }
        }
        for r in 0..R {
            let sc = _mm256_set1_epi32(u.sc[r][g]);
            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], sc));
        }
    }
    // SAFETY: `b.d` has at least 8 readable f32; the load is unaligned.
    let ad = unsafe { _mm256_loadu_ps(b.d.as_ptr()) };
    let pv: [__m256i; 4] = std::array::from_fn(|k| ld(&b.pairs[k * P..]));
    for r in 0..R {
        let i = if SIGNED {
            _mm256_sub_epi32(isum[r], _mm256_set1_epi32(u.offset[r]))
        } else {
            isum[r]
        };
        let dd = _mm256_mul_ps(_mm256_set1_ps(u.d[r]), ad);
        // SAFETY: each row of `sums` and `mins` has at least 8 readable and writable f32;
        // the loads and stores are unaligned.
        unsafe {
            let sp = sums[r].as_mut_ptr();
            let si = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(i));
            _mm256_storeu_ps(sp, _mm256_add_ps(_mm256_loadu_ps(sp), si));
            if MINS {
                let mp = mins[r].as_mut_ptr();
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
