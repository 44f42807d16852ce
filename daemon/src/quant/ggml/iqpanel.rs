//! Prefill's rows x positions panels of the lattice ("importance") types, IQ4_XS and Q2_K
//! (issue 49; Q2_K is the 2-bit "UD" quants' other expert type), AVX-512 VNNI: every type is unpacked to signed int8 weights once per call, then one
//! int8 x int8 microkernel, shared by all of them, runs eight rows against sixteen positions.
//!
//! * Unpack: a type's whole contribution is its unpacker, which turns one 256-block into
//!   256 signed bytes in input order (grid row x sign bits, or IQ4_XS's 16-value table), the
//!   block's per-group integer scales (eight groups of 32 or sixteen of 16, as the dot scales
//!   them) and its f16 scale. The grid lookups are one 8-byte (or two 4-byte) load per 8
//!   weights, the signs one masked byte subtraction per 32.
//! * Microkernel: as the K-quant panels' (`kpanel.rs`), a 512-bit vector holds sixteen
//!   positions and a weight quad is the broadcast operand of `vpdpbusd`. The weights are
//!   signed, so the activations go in as `x + 128` (unsigned) and each row's block constant
//!   `128 x sum(scale x quant)` comes off the block's integer sum, which is then exactly the
//!   reference's (`dot_iq.rs`: a block's sum of grid value x sign x activation, each group's
//!   sum times its scale; any order of exact integer adds gives the same i32).
//! * Float step: the reference's, per block `sum += (d x a.d) x isum` (a product, a product,
//!   a sum) into one running sum a position, then the type's constant factor (IQ2: 1/8,
//!   IQ3_XXS: 1/4) once at the end, as the dot applies it. Q2_K (`MINS`) also has a min
//!   term, each 16 activations' sum (the Q8_K bsums, as i16 pairs) times its group's min by
//!   `vpdpwssd`, and its reference's step `sum += (d x a.d) x isum - (dmin x a.d) x msum`.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::dot::{u16_at, u32_at};
use super::dot_iq::{IQ2S, IQ2XS, IQ2XXS, IQ3S, IQ3XXS};
use super::rows::NextRows;
use super::x86::{f16_one, load32, load32_i8};
use super::{PanelFn, Q8Row};
use crate::gguf::grids::{IQ4NL_KVALUES, KSIGNS};
use crate::gguf::GgmlType;

/// The panel of `ty`, where there is one and this CPU has AVX-512 F/BW/VL/VNNI and F16C:
/// the lattice types' on AMX where the CPU and the OS give it (`iqpanel_amx.rs`), else
/// this file's.
pub(super) fn panel(ty: GgmlType) -> Option<PanelFn> {
    super::iqpanel_amx::panel(ty).or_else(|| vnni_panel(ty))
}

/// This file's VNNI panel of `ty`, where there is one and this CPU has the features.
pub(super) fn vnni_panel(ty: GgmlType) -> Option<PanelFn> {
    if !super::x86::has_panel_features() {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        IQ2_XXS => iq2_xxs,
        IQ2_XS => iq2_xs,
        IQ2_S => iq2_s,
        IQ3_XXS => iq3_xxs,
        IQ3_S => iq3_s,
        IQ4_XS => iq4_xs,
        Q2_K => q2_k,
        _ => return None,
    })
}

/// Weight rows a microkernel call.
const R: usize = 8;
/// Positions a group: one 512-bit vector of i32.
const P: usize = 16;
/// 4-input steps a 256-block.
const STEPS: usize = 64;

/// One 256-block into `q` (256 signed quants, four to a word, in input order) and `sc` (the
/// groups' integer scales, `GROUPS` of them); returns the block's f16 scale.
pub(super) type UnpackFn = unsafe fn(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32;

/// A type with a min term (Q2_K): one block's sixteen mins as eight i16 pairs (groups `2m`,
/// `2m + 1`) and its f16 min scale.
type MinsFn = fn(b: &[u8]) -> ([u32; 8], f32);

/// A call's activations, rearranged for the microkernel; positions past the last are zero.
#[derive(Default)]
struct Acts {
    /// `[group][step][position]`: inputs `4 step .. 4 step + 4` of position `16 group + p`,
    /// each byte `x + 128` (the unsigned operand).
    xs: Vec<u32>,
    /// `[group][block][position]`: the Q8_K block scales.
    d: Vec<f32>,
    /// With a min term only, `[group][block][pair][position]`: bsums `2 pair` (low i16) and
    /// `2 pair + 1` (high i16).
    pairs: Vec<u32>,
}

impl Acts {
    #[target_feature(enable = "avx2")]
    fn fill(&mut self, x: &[Q8Row], cols: usize, mins: bool) {
        let (nb, steps) = (cols / 256, cols / 4);
        let groups = x.len().div_ceil(P);
        self.xs.clear();
        self.xs.resize(groups * steps * P, 0x8080_8080);
        self.d.clear();
        self.d.resize(groups * nb * P, 0.0);
        let flip = _mm256_set1_epi8(-128);
        // Eight positions at a time, eight steps (32 bytes) of each by an 8 x 8 transpose
        // of 32-bit words: step `8 c + k` of the eight is word `k` of the chunk.
        for (h, eight) in x.chunks(8).enumerate() {
            let (g, p0) = (h / 2, (h % 2) * 8);
            let xs = &mut self.xs[g * steps * P..(g + 1) * steps * P];
            for c in 0..steps / 8 {
                let rows: [__m256i; 8] = std::array::from_fn(|p| match eight.get(p) {
                    Some(a) => load32_i8(a.qs, 32 * c),
                    None => _mm256_setzero_si256(),
                });
                for (k, v) in crate::quant::x86::transpose8x8_epi32(rows)
                    .into_iter()
                    .enumerate()
                {
                    let dst = &mut xs[(8 * c + k) * P + p0..][..8];
                    // SAFETY: `dst` is 8 writable u32 (32 bytes); the store is unaligned.
                    unsafe {
                        _mm256_storeu_si256(
                            dst.as_mut_ptr() as *mut __m256i,
                            _mm256_xor_si256(v, flip),
                        )
                    };
                }
            }
        }
        self.pairs.clear();
        if mins {
            self.pairs.resize(groups * nb * 8 * P, 0);
        }
        for (s, a) in x.iter().enumerate() {
            let (g, p) = (s / P, s % P);
            for i in 0..nb {
                self.d[(g * nb + i) * P + p] = a.d[i];
                if mins {
                    let bs = &a.bsums[i * 16..(i + 1) * 16];
                    for m in 0..8 {
                        let pair =
                            (bs[2 * m] as u16 as u32) | ((bs[2 * m + 1] as u16 as u32) << 16);
                        self.pairs[((g * nb + i) * 8 + m) * P + p] = pair;
                    }
                }
            }
        }
    }
}

/// One block of `R` weight rows, unpacked.
struct Unpacked {
    q: [[u32; STEPS]; R],
    sc: [[i32; 16]; R],
    /// Per row `128 x sum(scale x quant)`, what the activations' offset adds.
    offset: [i32; R],
    d: [f32; R],
    /// With a min term: per row the mins as i16 pairs, and the min scale.
    mins: [[u32; 8]; R],
    dmin: [f32; R],
}

/// A thread's scratch, kept between calls so a prefill allocates only when a shape grows.
#[derive(Default)]
struct Scratch {
    acts: Acts,
    /// `[group]`: per row of the current eight the running sums of sixteen positions.
    sums: Vec<[[f32; P]; R]>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Defines the panel entry `$name` of a type of `$bytes` a block, `$groups` scaled groups,
/// unpacker `$unpack` and final factor `$post` (and, for a type with a min term, `$mins`).
macro_rules! iq_entry {
    ($name:ident, $bytes:expr, $groups:expr, $unpack:ident, $post:expr) => {
        iq_entry!($name, $bytes, $groups, $unpack, $post, false, no_mins);
    };
    ($name:ident, $bytes:expr, $groups:expr, $unpack:ident, $post:expr, $has_mins:expr, $mins:ident) => {
        fn $name(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
            let ty = TypeOf {
                bb: $bytes,
                unpack: $unpack,
                mins: $mins,
                post: $post,
            };
            // SAFETY: `panel` hands this function out only after detecting every feature the
            // kernels are compiled for; their loads go through bounds-checked slices.
            unsafe { iq_panel::<$groups, $has_mins>(w, cols, x, out, [rs, ps], ty) }
        }
    };
}

/// What the shared panel needs of a type.
struct TypeOf {
    /// Bytes a block.
    bb: usize,
    unpack: UnpackFn,
    /// The min term's unpacker (called only for a type with one).
    mins: MinsFn,
    /// The final factor the dot applies to its sum.
    post: f32,
}

/// What the AMX panel (`iqpanel_amx.rs`) needs of a type without a min term: bytes a block,
/// scaled groups a block (8 or 16), the unpacker (which needs AVX2, AVX-512 BW/VL and F16C)
/// and the dot's final factor; `None` for a type this file has no unpacker of, or one with
/// a min term (Q2_K).
pub(super) fn lattice_type(ty: GgmlType) -> Option<(usize, usize, UnpackFn, f32)> {
    use GgmlType::*;
    Some(match ty {
        IQ2_XXS => (66, 8, unpack_iq2_xxs as UnpackFn, 0.125),
        IQ2_XS => (74, 16, unpack_iq2_xs, 0.125),
        IQ2_S => (82, 16, unpack_iq2_s, 0.125),
        IQ3_XXS => (98, 8, unpack_iq3_xxs, 0.25),
        IQ3_S => (110, 8, unpack_iq3_s, 1.0),
        IQ4_XS => (136, 8, unpack_iq4_xs, 1.0),
        _ => return None,
    })
}

/// The types without a min term have none.
fn no_mins(_: &[u8]) -> ([u32; 8], f32) {
    ([0; 8], 0.0)
}

iq_entry!(iq2_xxs, 66, 8, unpack_iq2_xxs, 0.125);
iq_entry!(iq2_xs, 74, 16, unpack_iq2_xs, 0.125);
iq_entry!(iq2_s, 82, 16, unpack_iq2_s, 0.125);
iq_entry!(iq3_xxs, 98, 8, unpack_iq3_xxs, 0.25);
iq_entry!(iq3_s, 110, 8, unpack_iq3_s, 1.0);
iq_entry!(iq4_xs, 136, 8, unpack_iq4_xs, 1.0);
iq_entry!(q2_k, 84, 16, unpack_q2_k, 1.0, true, q2_k_mins);

/// An 8-wide grid row as one little-endian word.
#[inline]
fn grid8(row: &[i8; 8]) -> i64 {
    i64::from_le_bytes(row.map(|v| v as u8))
}

/// Two 4-wide grid rows as one word, `lo` first.
#[inline]
fn grid4x2(lo: &[i8; 4], hi: &[i8; 4]) -> i64 {
    let w = |r: &[i8; 4]| u32::from_le_bytes(r.map(|v| v as u8)) as u64;
    (w(lo) | (w(hi) << 32)) as i64
}

/// Weights `32 run .. 32 run + 32` into `q`: four 8-byte grid words, each byte negated where
/// its bit of `signs` is set (bit `8 l + j`: byte `j` of word `l`).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn store_signed(q: &mut [u32; STEPS], run: usize, grid: [i64; 4], signs: u32) {
    let v = _mm256_set_epi64x(grid[3], grid[2], grid[1], grid[0]);
    let v = _mm256_mask_sub_epi8(v, signs, _mm256_setzero_si256(), v);
    let dst = &mut q[run * 8..run * 8 + 8];
    // SAFETY: `dst` is 8 writable u32 (32 bytes); the store is unaligned.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, v) };
}

/// Four KSIGNS sign bytes of 7-bit indices `aux >> 7 l` as one 32-bit mask.
#[inline]
fn ksigns4(aux: u32) -> u32 {
    u32::from_le_bytes(std::array::from_fn(|l| {
        KSIGNS[((aux >> (7 * l)) & 127) as usize]
    }))
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,f16c")]
fn unpack_iq2_xxs(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32 {
    for g in 0..8 {
        let off = 2 + 8 * g;
        let aux = u32_at(b, off + 4);
        sc[g] = 2 * (aux >> 28) as i32 + 1;
        let grid = std::array::from_fn(|l| grid8(&IQ2XXS[b[off + l] as usize]));
        store_signed(q, g, grid, ksigns4(aux));
    }
    f16_one(b, 0)
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,f16c")]
fn unpack_iq2_xs(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32 {
    let s = &b[66..74];
    for g in 0..8 {
        sc[2 * g] = 2 * (s[g] & 0x0F) as i32 + 1;
        sc[2 * g + 1] = 2 * (s[g] >> 4) as i32 + 1;
        let idx: [u16; 4] = std::array::from_fn(|l| u16_at(b, 2 + 2 * (4 * g + l)));
        let grid = std::array::from_fn(|l| grid8(&IQ2XS[(idx[l] & 511) as usize]));
        let signs = u32::from_le_bytes(idx.map(|v| KSIGNS[(v >> 9) as usize]));
        store_signed(q, g, grid, signs);
    }
    f16_one(b, 0)
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,f16c")]
fn unpack_iq2_s(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32 {
    let (qs, qh, s) = (&b[2..34], &b[66..74], &b[74..82]);
    for g in 0..8 {
        sc[2 * g] = 2 * (s[g] & 0x0F) as i32 + 1;
        sc[2 * g + 1] = 2 * (s[g] >> 4) as i32 + 1;
        let grid = std::array::from_fn(|l| {
            let idx = qs[4 * g + l] as usize | (((qh[g] as usize) << (8 - 2 * l)) & 0x300);
            grid8(&IQ2S[idx])
        });
        store_signed(q, g, grid, u32_at(b, 34 + 4 * g));
    }
    f16_one(b, 0)
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,f16c")]
fn unpack_iq3_xxs(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32 {
    let q3 = &b[2..66];
    for g in 0..8 {
        let aux = u32_at(b, 66 + 4 * g);
        sc[g] = 2 * (aux >> 28) as i32 + 1;
        let grid = std::array::from_fn(|l| {
            let (i1, i2) = (q3[8 * g + 2 * l] as usize, q3[8 * g + 2 * l + 1] as usize);
            grid4x2(&IQ3XXS[i1], &IQ3XXS[i2])
        });
        store_signed(q, g, grid, ksigns4(aux));
    }
    f16_one(b, 0)
}

#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,f16c")]
fn unpack_iq3_s(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32 {
    let (qs, qh, s) = (&b[2..66], &b[66..74], &b[106..110]);
    for g in 0..8 {
        sc[g] = 2 * ((s[g / 2] >> (4 * (g % 2))) & 0x0F) as i32 + 1;
        let h = qh[g] as usize;
        let grid = std::array::from_fn(|l| {
            let i1 = qs[8 * g + 2 * l] as usize | ((h << (8 - 2 * l)) & 256);
            let i2 = qs[8 * g + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256);
            grid4x2(&IQ3S[i1], &IQ3S[i2])
        });
        store_signed(q, g, grid, u32_at(b, 74 + 4 * g));
    }
    f16_one(b, 0)
}

/// IQ4_XS: each group's 16 nibble bytes (low nibbles elements 0..16, high 16..32) through
/// the 16-value table by a byte shuffle; 6-bit scales less 32.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,f16c")]
fn unpack_iq4_xs(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32 {
    let h = u16_at(b, 2);
    let sl = &b[4..8];
    // SAFETY: the table is 16 readable bytes; the load is unaligned.
    let table = unsafe { _mm_loadu_si128(IQ4NL_KVALUES.as_ptr() as *const __m128i) };
    let m4 = _mm_set1_epi8(0x0F);
    for g in 0..8 {
        let lo = (sl[g / 2] >> (4 * (g % 2))) & 0x0F;
        let hi = ((h >> (2 * g)) & 3) as u8;
        sc[g] = (lo | (hi << 4)) as i32 - 32;
        let nib = &b[8 + 16 * g..8 + 16 * g + 16];
        // SAFETY: `nib` is 16 readable bytes; the load is unaligned.
        let v = unsafe { _mm_loadu_si128(nib.as_ptr() as *const __m128i) };
        let low = _mm_shuffle_epi8(table, _mm_and_si128(v, m4));
        let high = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(v), m4));
        let dst = &mut q[8 * g..8 * g + 8];
        // SAFETY: `dst` is 8 writable u32 (32 bytes); the stores are unaligned.
        unsafe {
            _mm_storeu_si128(dst.as_mut_ptr() as *mut __m128i, low);
            _mm_storeu_si128(dst.as_mut_ptr().add(4) as *mut __m128i, high);
        }
    }
    f16_one(b, 0)
}

/// Q2_K: quant `n = 128 h + 32 p + t` is bits `2p` of byte `32 h + t` (unsigned, 0..3),
/// its 16-element group's scale the low nibble of the group's byte, f16 scale at 80.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,f16c")]
pub(super) fn unpack_q2_k(b: &[u8], q: &mut [u32; STEPS], sc: &mut [i32; 16]) -> f32 {
    for (k, s) in sc.iter_mut().enumerate() {
        *s = (b[k] & 0x0F) as i32;
    }
    let m3 = _mm256_set1_epi8(3);
    for h in 0..2 {
        let q2 = load32(b, 16 + 32 * h);
        for p in 0..4 {
            let v = _mm256_and_si256(_mm256_srl_epi16(q2, _mm_cvtsi32_si128(2 * p as i32)), m3);
            let dst = &mut q[8 * (4 * h + p)..8 * (4 * h + p) + 8];
            // SAFETY: `dst` is 8 writable u32 (32 bytes); the store is unaligned.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, v) };
        }
    }
    f16_one(b, 80)
}

/// Q2_K's mins (the high nibbles of the sixteen scale bytes) and min scale (f16 at 82).
fn q2_k_mins(b: &[u8]) -> ([u32; 8], f32) {
    let pairs =
        std::array::from_fn(|m| (b[2 * m] >> 4) as u32 | (((b[2 * m + 1] >> 4) as u32) << 16));
    (pairs, super::dot::f16_at(b, 82))
}

/// Block `b` of row `r` into `u`: the type's unpacker, then the row's offset constant
/// `128 x sum(scale x quant)`: each quad's sum by `vpdpbusd` against ones, times its group's
/// scale (`vpermd` of the scales: quad `j` is in group `j x GROUPS / 64`), all added.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn unpack_row<const GROUPS: usize, const MINS: bool>(
    b: &[u8],
    u: &mut Unpacked,
    r: usize,
    ty: &TypeOf,
) {
    // SAFETY: the unpackers need AVX2, AVX-512 BW/VL and F16C, which this function has.
    u.d[r] = unsafe { (ty.unpack)(b, &mut u.q[r], &mut u.sc[r]) };
    if MINS {
        (u.mins[r], u.dmin[r]) = (ty.mins)(b);
    }
    // SAFETY: `u.sc[r]` is 16 readable i32; the load is unaligned.
    let sc = unsafe { _mm512_loadu_si512(u.sc[r].as_ptr() as *const _) };
    let quads_a_group = _mm_cvtsi32_si128((STEPS / GROUPS).trailing_zeros() as i32);
    let ones = _mm512_set1_epi8(1);
    let mut acc = _mm512_setzero_si512();
    for c in 0..STEPS / 16 {
        let src = &u.q[r][16 * c..16 * c + 16];
        // SAFETY: `src` is 16 readable u32 (64 bytes); the load is unaligned.
        let q = unsafe { _mm512_loadu_si512(src.as_ptr() as *const _) };
        let quad = _mm512_add_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(16 * c as i32),
        );
        let group = _mm512_srl_epi32(quad, quads_a_group);
        let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q);
        let scaled = _mm512_mullo_epi32(sums, _mm512_permutexvar_epi32(group, sc));
        acc = _mm512_add_epi32(acc, scaled);
    }
    u.offset[r] = 128i32.wrapping_mul(_mm512_reduce_add_epi32(acc));
}

/// The panel of a type of `GROUPS` scaled groups a block, `bb` bytes a block, `unpack` its
/// block unpacker, `post` its final factor: rows eight at a time (a last partial eight
/// repeats its last row and drops those outputs), each block unpacked once and run against
/// every group of sixteen positions (a last group of at most eight by [`block8`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn iq_panel<const GROUPS: usize, const MINS: bool>(
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    [row_stride, pos_stride]: [usize; 2],
    ty: TypeOf,
) {
    let (bb, post) = (ty.bb, ty.post);
    let nb = cols / 256;
    let rb = nb * bb;
    let n = x.len();
    if rb == 0 || n == 0 {
        return;
    }
    let rows = w.len() / rb;
    let groups = n.div_ceil(P);
    // A last group of at most eight positions takes the 256-bit microkernel (half the work).
    let half_last = n - (groups - 1) * P <= P / 2;
    let mut s = SCRATCH.with(|c| c.take());
    s.acts.fill(x, cols, MINS);
    s.sums.resize(groups, [[0.0; P]; R]);
    let mut u = Unpacked {
        q: [[0; STEPS]; R],
        sc: [[0; 16]; R],
        offset: [0; R],
        d: [0.0; R],
        mins: [[0; 8]; R],
        dmin: [0.0; R],
    };
    for r0 in (0..rows).step_by(R) {
        let nr = R.min(rows - r0);
        s.sums[..groups].fill([[0.0; P]; R]);
        let next = NextRows::new(w, rb, r0, R, nb);
        for i in 0..nb {
            next.block(i);
            for r in 0..R {
                let row = r0 + r.min(nr - 1);
                let b = &w[row * rb + i * bb..row * rb + (i + 1) * bb];
                unpack_row::<GROUPS, MINS>(b, &mut u, r, &ty);
            }
            for (g, sums) in s.sums[..groups].iter_mut().enumerate() {
                let xs = &s.acts.xs[(g * cols / 4 + i * STEPS) * P..][..STEPS * P];
                let xs = xs.try_into().expect("a block's steps");
                let d = &s.acts.d[(g * nb + i) * P..][..P];
                let d = d.try_into().expect("sixteen scales");
                let pairs: &[u32] = if MINS {
                    &s.acts.pairs[(g * nb + i) * 8 * P..][..8 * P]
                } else {
                    &[]
                };
                if half_last && g + 1 == groups {
                    block8::<GROUPS, MINS>(&u, xs, d, pairs, sums);
                } else {
                    block16::<GROUPS, MINS>(&u, xs, d, pairs, sums);
                }
            }
        }
        for p in 0..n {
            let (g, l) = (p / P, p % P);
            for r in 0..nr {
                out[(r0 + r) * row_stride + p * pos_stride] = post * s.sums[g][r][l];
            }
        }
    }
    SCRATCH.with(|c| c.replace(s));
}

/// One block of eight rows against sixteen positions: per scaled group its `vpdpbusd`
/// steps into fresh sums, one `vpmulld` by the group's scale into the block's sum; the
/// rows' offsets off; then the reference's float steps into `sums` (`[row][position]`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn block16<const GROUPS: usize, const MINS: bool>(
    u: &Unpacked,
    xs: &[u32; STEPS * P],
    d: &[f32; P],
    pairs: &[u32],
    sums: &mut [[f32; P]; R],
) {
    let mut isum = [_mm512_setzero_si512(); R];
    let steps = STEPS / GROUPS;
    for g in 0..GROUPS {
        let mut s = [_mm512_setzero_si512(); R];
        for k in g * steps..(g + 1) * steps {
            let xk = &xs[k * P..k * P + P];
            // SAFETY: `xk` is 16 readable u32; the load is unaligned.
            let x = unsafe { _mm512_loadu_si512(xk.as_ptr() as *const _) };
            for r in 0..R {
                let wq = _mm512_set1_epi32(u.q[r][k] as i32);
                s[r] = _mm512_dpbusd_epi32(s[r], x, wq);
            }
        }
        for r in 0..R {
            let sc = _mm512_set1_epi32(u.sc[r][g]);
            isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s[r], sc));
        }
    }
    // SAFETY: `d` is 16 readable f32; the load is unaligned.
    let ad = unsafe { _mm512_loadu_ps(d.as_ptr()) };
    for r in 0..R {
        let i = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(u.offset[r]));
        let dd = _mm512_mul_ps(_mm512_set1_ps(u.d[r]), ad);
        let mut v = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(i));
        if MINS {
            // The min term: `sum += (d x a.d) x isum - (dmin x a.d) x msum`, the reference's.
            let mut m = _mm512_setzero_si512();
            for k in 0..8 {
                let pk = &pairs[k * P..k * P + P];
                // SAFETY: `pk` is 16 readable u32; the load is unaligned.
                let pv = unsafe { _mm512_loadu_si512(pk.as_ptr() as *const _) };
                m = _mm512_dpwssd_epi32(m, pv, _mm512_set1_epi32(u.mins[r][k] as i32));
            }
            let dm = _mm512_mul_ps(_mm512_set1_ps(u.dmin[r]), ad);
            v = _mm512_sub_ps(v, _mm512_mul_ps(dm, _mm512_cvtepi32_ps(m)));
        }
        let sp = sums[r].as_mut_ptr();
        // SAFETY: `sums[r]` is 16 readable and writable f32; the accesses are unaligned.
        unsafe { _mm512_storeu_ps(sp, _mm512_add_ps(_mm512_loadu_ps(sp), v)) };
    }
}

/// [`block16`] for the first eight positions of a group only (a last group of at most
/// eight): the same steps on 256-bit vectors.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn block8<const GROUPS: usize, const MINS: bool>(
    u: &Unpacked,
    xs: &[u32; STEPS * P],
    d: &[f32; P],
    pairs: &[u32],
    sums: &mut [[f32; P]; R],
) {
    let mut isum = [_mm256_setzero_si256(); R];
    let steps = STEPS / GROUPS;
    for g in 0..GROUPS {
        let mut s = [_mm256_setzero_si256(); R];
        for k in g * steps..(g + 1) * steps {
            let xk = &xs[k * P..k * P + P / 2];
            // SAFETY: `xk` is 8 readable u32; the load is unaligned.
            let x = unsafe { _mm256_loadu_si256(xk.as_ptr() as *const __m256i) };
            for r in 0..R {
                let wq = _mm256_set1_epi32(u.q[r][k] as i32);
                s[r] = _mm256_dpbusd_epi32(s[r], x, wq);
            }
        }
        for r in 0..R {
            let sc = _mm256_set1_epi32(u.sc[r][g]);
            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s[r], sc));
        }
    }
    // SAFETY: `d` has at least 8 readable f32; the load is unaligned.
    let ad = unsafe { _mm256_loadu_ps(d.as_ptr()) };
    for r in 0..R {
        let i = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(u.offset[r]));
        let dd = _mm256_mul_ps(_mm256_set1_ps(u.d[r]), ad);
        let mut v = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(i));
        if MINS {
            let mut m = _mm256_setzero_si256();
            for k in 0..8 {
                let pk = &pairs[k * P..k * P + P / 2];
                // SAFETY: `pk` is 8 readable u32; the load is unaligned.
                let pv = unsafe { _mm256_loadu_si256(pk.as_ptr() as *const __m256i) };
                m = _mm256_dpwssd_epi32(m, pv, _mm256_set1_epi32(u.mins[r][k] as i32));
            }
            let dm = _mm256_mul_ps(_mm256_set1_ps(u.dmin[r]), ad);
            v = _mm256_sub_ps(v, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(m)));
        }
        let sp = sums[r].as_mut_ptr();
        // SAFETY: `sums[r]` has at least 8 readable and writable f32; the accesses are
        // unaligned.
        unsafe { _mm256_storeu_ps(sp, _mm256_add_ps(_mm256_loadu_ps(sp), v)) };
    }
}
