//! Prefill's K-quant panels on AMX (issue 49): sixteen weight rows against sixteen
//! positions a tile product (`tdpbusd`), each output the row dot's bits.
//!
//! A tile product sums 64 byte products a lane with no sub-block boundary, but a K-quant
//! scales each 32-element group by its own 6-bit scale, and the reference's integer is
//! `sum over groups of scale x (that group's quants . activations)`. Writing each scale as
//! `8 hi + lo` (3 bits each) folds it into the weights: `hi x q` and `lo x q` are at most
//! 7 x 31 = 217, unsigned bytes, so that integer is `8 (hi-weights . x) + (lo-weights . x)`:
//! two tile products over the whole block, no step per group. Both are exact i32 (at most
//! 256 x 217 x 128), so the block's integer is the reference's and the float steps after it,
//! the VNNI panel's (`kpanel.rs`), give the dot's bits.
//!
//! The weights are the unsigned operand A (`[row][64 inputs]` a tile, as unpacked), the
//! activations the signed operand B, which wants four inputs of each of sixteen positions a
//! 64-byte tile row: exactly `kpanel::Acts`'s layout, so B is loaded from it as it is. Each
//! call configures the tiles once and releases them at its end; where the CPU lacks AMX-INT8,
//! or the kernel does not grant this process the tile data state, there is no panel here and
//! `kpanel.rs`'s VNNI one is used. The tile plumbing (that check, the configuration, the
//! two-group tile product) is `amx.rs`'s, shared with the lattice types' panel.
//!
//! Q6_K's quants are signed (6 bits less 32) and its sixteen group scales signed bytes, so
//! there the weight operand is `v = (q - 32) x scale` itself, split as `64 hi + lo` (`hi =
//! v >> 6` in -64..=64, `lo = v & 63`), both signed bytes, and the products signed by signed
//! (`tdpbssd`) with the activations as quantized: the block's integer is
//! `64 (hi-weights . x) + (lo-weights . x)`, exact (at most 256 x 64 x 128 x 64 < 2^31), and
//! there is no min term.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::amx::{amx_ready, tile_one_with, tile_pair_with, Sums, TileConfig, P, R, ROW, STEPS};
use super::kpanel::{self, q4_k_runs, q5_k_runs, Acts};
use super::rows::NextRows;
use super::x86::{f16_one, f16_pair, k4_scales_mins, q6_k_half};
use super::{PanelFn, Q8Row};
use crate::gguf::GgmlType;
use crate::quant::transpose_avx512::transpose16;

/// The AMX panel of `ty` (Q4_K, Q5_K, Q6_K), where the CPU has AMX-INT8 and the AVX-512 features
/// of the VNNI panel, and the OS lets this process use the tiles.
pub(super) fn panel(ty: GgmlType) -> Option<PanelFn> {
    if !amx_ready() {
        return None;
    }
    match ty {
        GgmlType::Q4_K => Some(q4_k),
        GgmlType::Q5_K => Some(q5_k),
        GgmlType::Q6_K => Some(q6_k),
        _ => None,
    }
}

/// The block formats of the panel here (`amx_panel`'s const parameter).
const Q4: u8 = 0;
const Q5: u8 = 1;
const Q6: u8 = 2;

/// Sixteens of rows a pass over the activations: each group's block of activations (4 KiB)
/// serves this many tile products while in L1 (one pass a sixteen streamed all of a block's
/// activations, 128 KiB at 512 positions, from L2 for every sixteen rows).
const SETS: usize = 2;
/// One block of sixteen weight rows, unpacked for the tiles.
#[repr(C, align(64))]
struct Unpacked {
    /// `[64-input chunk][row][input]`: each quant times its group's scale's high 3 bits
    /// (Q6_K: the high signed byte of `(q - 32) x scale`).
    hi: [[[u8; ROW]; R]; 4],
    /// The same times the scale's low 3 bits (Q6_K: the low six bits of the product).
    lo: [[[u8; ROW]; R]; 4],
    /// Per row the eight groups' mins as i16 pairs (groups `2 pair`, `2 pair + 1`).
    mins: [[u32; 4]; R],
    d: [f32; R],
    dmin: [f32; R],
}

/// A call's scratch, kept by each thread so a prefill allocates only when a shape grows.
#[derive(Default)]
struct Scratch {
    acts: Acts,
    /// `[set][group]`: per row of the current sixteens the running sums and mins of the
    /// positions.
    sums: Vec<[[f32; P]; R]>,
    mins: Vec<[[f32; P]; R]>,
    /// The unpacked block of each current sixteen rows and the tile sums, made once a thread.
    tiles: Option<Box<([Unpacked; SETS], Sums)>>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn q4_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
    amx_then_vnni::<Q4>(w, cols, x, out, rs, ps)
}

fn q5_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
    amx_then_vnni::<Q5>(w, cols, x, out, rs, ps)
}

fn q6_k(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
    amx_then_vnni::<Q6>(w, cols, x, out, rs, ps)
}

/// The rows in whole sixteens on the tiles, a last partial sixteen by the VNNI panel, whose
/// eight-row microkernel wastes less on it than a tile product of repeated rows; at most
/// sixteen positions all by the VNNI panel (one group: the tiles' unpacking is not repaid,
/// `bench_amx_k_panels` 0.99-1.11x at 16). Each output is the dot's bits either way.
fn amx_then_vnni<const KIND: u8>(
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    rs: usize,
    ps: usize,
) {
    let (ty, bb) = match KIND {
        Q4 => (GgmlType::Q4_K, 144),
        Q5 => (GgmlType::Q5_K, 176),
        _ => (GgmlType::Q6_K, 210),
    };
    let rb = cols / 256 * bb;
    let rows = if rb == 0 { 0 } else { w.len() / rb };
    let whole = if x.len() > P { rows / R * R } else { 0 };
    if whole > 0 {
        // SAFETY: `panel` hands this function out only after `amx_ready` (which includes the
        // VNNI panel's AVX-512 features and the OS's grant of the tile state); loads and
        // stores of vectors go through bounds-checked slices, tile ones through `Unpacked`,
        // `Acts` and `Sums` as `tile_pair` states.
        unsafe { amx_panel::<KIND>(&w[..whole * rb], cols, x, out, [rs, ps], bb) }
    }
    if whole < rows {
        let tail = kpanel::vnni_panel(ty).expect("`amx_ready` includes the VNNI panel's features");
        tail(&w[whole * rb..], cols, x, &mut out[whole * rs..], rs, ps);
    }
}

/// Unpacks row `r`'s Q4_K or (`Q5`) Q5_K block `b` into `u`: the quants (at most 31) times
/// their group's scale's high and low 3 bits, the mins, and the block's scales. A 64-input
/// chunk (groups `2j`, `2j + 1`) is one 512-bit vector, each half multiplied by its group's
/// factors.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn unpack<const Q5: bool>(b: &[u8], u: &mut Unpacked, r: usize) {
    let (d, dmin) = f16_pair(b, 0);
    let sm = k4_scales_mins(&b[4..16]);
    // The eight scales as i16 in every 128-bit lane, split into their high and low 3 bits.
    let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
    let (sc_hi, sc_lo) = (
        _mm512_srli_epi16::<3>(sc),
        _mm512_and_si512(sc, _mm512_set1_epi16(7)),
    );
    // SAFETY: `u.mins[r]` is 16 writable bytes (the eight mins as i16 in order); the store
    // is unaligned.
    unsafe {
        let mins = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
        _mm_storeu_si128(u.mins[r].as_mut_ptr() as *mut __m128i, mins);
    }
    for j in 0..4 {
        let [q0, q1] = if Q5 { q5_k_runs(b, j) } else { q4_k_runs(b, j) };
        let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1);
        // Every i16 of the low half picks scale `2j` (bytes 4j, 4j + 1 of its lane), of the
        // high half scale `2j + 1`.
        let pick = |g: i32| _mm256_set1_epi16((((2 * g + 1) << 8) | 2 * g) as i16);
        let idx = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(pick(2 * j as i32)),
            pick(2 * j as i32 + 1),
        );
        // A 16-bit product of two quants by a 3-bit factor: each byte's product is at most
        // 217, so none carries into its neighbour, and the bytes are the products.
        let hi = _mm512_mullo_epi16(q, _mm512_shuffle_epi8(sc_hi, idx));
        let lo = _mm512_mullo_epi16(q, _mm512_shuffle_epi8(sc_lo, idx));
        // SAFETY: `u.hi[j][r]` and `u.lo[j][r]` are 64 writable bytes each; the stores are
        // unaligned.
        unsafe {
            _mm512_storeu_si512(u.hi[j][r].as_mut_ptr() as *mut _, hi);
            _mm512_storeu_si512(u.lo[j][r].as_mut_ptr() as *mut _, lo);
        }
    }
    u.d[r] = d;
    u.dmin[r] = dmin;
}

/// Unpacks row `r`'s Q6_K block `b` into `u`: each quant less 32 times its group's signed
/// scale, `v`, as its high (`v >> 6`) and low (`v & 63`) signed bytes, and the block's scale
/// (no mins). A 32-quant run (groups `2k`, `2k + 1`) is one 512-bit vector of i16, each half
/// multiplied by its group's scale, then narrowed to half a 64-input chunk.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn unpack_q6(b: &[u8], u: &mut Unpacked, r: usize) {
    let sc: &[u8; 16] = b[192..208].try_into().expect("sixteen scales");
    // SAFETY: `sc` is 16 readable bytes; the load is unaligned.
    let sc = unsafe { _mm_loadu_si128(sc.as_ptr() as *const __m128i) };
    let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc));
    let off = _mm512_set1_epi16(32);
    let low6 = _mm512_set1_epi16(63);
    for half in 0..2 {
        for (c, run) in q6_k_half(b, half).into_iter().enumerate() {
            let n = 128 * half + 32 * c;
            let g = (n / 16) as i16;
            let idx = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi16(g)),
                _mm256_set1_epi16(g + 1),
            );
            // At most 32 x 128 in magnitude: exact in i16.
            let v = _mm512_mullo_epi16(
                _mm512_sub_epi16(_mm512_cvtepu8_epi16(run), off),
                _mm512_permutexvar_epi16(idx, sc),
            );
            let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<6>(v));
            let lo = _mm512_cvtepi16_epi8(_mm512_and_si512(v, low6));
            let (j, at) = (n / 64, n % 64);
            // SAFETY: `u.hi[j][r][at..]` and `u.lo[j][r][at..]` are at least 32 writable
            // bytes each (`at` is 0 or 32 of 64); the stores are unaligned.
            unsafe {
                _mm256_storeu_si256(u.hi[j][r][at..].as_mut_ptr() as *mut __m256i, hi);
                _mm256_storeu_si256(u.lo[j][r][at..].as_mut_ptr() as *mut __m256i, lo);
            }
        }
    }
    u.d[r] = f16_one(b, 208);
}

/// The tile products of one block of sixteen rows (`u`) against two groups of sixteen
/// positions (`b0`, `b1`: each the block's 64 steps of 64 bytes), into `c`: per group
/// `hi . x` and `lo . x` over the block's 256 inputs, four 64-input chunks, unsigned weights
/// by signed activations (`tdpbusd`, Q4_K/Q5_K).
///
/// # Safety
/// The tiles must be configured (`ldtilecfg` of [`TileConfig::all_16x64`]) on this thread.
#[inline]
unsafe fn tile_pair(u: &Unpacked, b0: &[u32; STEPS * P], b1: &[u32; STEPS * P], c: &mut Sums) {
    // SAFETY: as this function's (`tile_pair_with`'s bounds hold for any `Unpacked`, block
    // steps and `Sums`).
    unsafe { tile_pair_with!("tdpbusd", u, b0, b1, c) }
}

/// [`tile_pair`] with signed weights (`tdpbssd`, Q6_K).
///
/// # Safety
/// As [`tile_pair`].
#[inline]
unsafe fn tile_pair_signed(
    u: &Unpacked,
    b0: &[u32; STEPS * P],
    b1: &[u32; STEPS * P],
    c: &mut Sums,
) {
    // SAFETY: as `tile_pair`.
    unsafe { tile_pair_with!("tdpbssd", u, b0, b1, c) }
}

/// [`tile_pair`] for one group of sixteen positions (`b0`, a last single group), into
/// `c.0[0]`: half the products (a duplicate group cost a quarter of the tile work of 33 to
/// 48 positions, a pp64 expert's usual share).
///
/// # Safety
/// As [`tile_pair`].
#[inline]
unsafe fn tile_one(u: &Unpacked, b0: &[u32; STEPS * P], c: &mut Sums) {
    // SAFETY: as this function's (`tile_one_with`'s bounds hold for any `Unpacked`, block
    // steps and `Sums`).
    unsafe { tile_one_with!("tdpbusd", u, b0, c) }
}

/// [`tile_one`] with signed weights (`tdpbssd`, Q6_K).
///
/// # Safety
/// As [`tile_pair`].
#[inline]
unsafe fn tile_one_signed(u: &Unpacked, b0: &[u32; STEPS * P], c: &mut Sums) {
    // SAFETY: as `tile_one`.
    unsafe { tile_one_with!("tdpbssd", u, b0, c) }
}

/// The Q4_K, Q5_K or Q6_K panel (`KIND`, `bb` bytes a block): rows sixteen at a
/// time (a last partial sixteen repeats its last row and drops those outputs), each block
/// unpacked once and run against every pair of position groups (a last single group alone,
/// [`tile_one`]; positions past the last are zero activations whose outputs are not
/// written).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn amx_panel<const KIND: u8>(
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    [row_stride, pos_stride]: [usize; 2],
    bb: usize,
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
        s.acts.fill(x, cols, 0);
        s.sums.resize(SETS * groups, [[0.0; P]; R]);
        s.mins.resize(SETS * groups, [[0.0; P]; R]);
        let (us, c) = &mut **s.tiles.get_or_insert_with(|| {
            let u = || Unpacked {
                hi: [[[0; ROW]; R]; 4],
                lo: [[[0; ROW]; R]; 4],
                mins: [[0; 4]; R],
                d: [0.0; R],
                dmin: [0.0; R],
            };
            Box::new(([u(), u()], Sums([[[[0; P]; R]; 2]; 2])))
        });
        let cfg = TileConfig::all_16x64();
        // SAFETY: the CPU has AMX and the OS granted the tile state (`panel`); the operand
        // is a 64-byte palette-1 configuration (16 x 64-byte tiles, valid for palette 1).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, preserves_flags)) };
        for r0 in (0..rows).step_by(SETS * R) {
            let sets = (rows - r0).div_ceil(R).min(SETS);
            s.sums[..sets * groups].fill([[0.0; P]; R]);
            s.mins[..sets * groups].fill([[0.0; P]; R]);
            let next = NextRows::new(w, rb, r0, SETS * R, nb);
            for i in 0..nb {
                next.block(i);
                for (set, u) in us.iter_mut().enumerate().take(sets) {
                    let (r0, nr) = (r0 + set * R, R.min(rows - r0 - set * R));
                    for r in 0..R {
                        let row = r0 + r.min(nr - 1);
                        let b = &w[row * rb + i * bb..][..bb];
                        match KIND {
                            Q4 => unpack::<false>(b, u, r),
                            Q5 => unpack::<true>(b, u, r),
                            _ => unpack_q6(b, u, r),
                        }
                    }
                }
                let steps = |g: usize| -> &[u32; STEPS * P] {
                    let xs = &s.acts.xs[(g * cols / 4 + i * STEPS) * P..][..STEPS * P];
                    xs.try_into().expect("a block's steps")
                };
                for g0 in (0..groups).step_by(2) {
                    let g1 = (g0 + 1).min(groups - 1);
                    for (set, u) in us.iter().enumerate().take(sets) {
                        // SAFETY: the tiles were configured above on this thread.
                        unsafe {
                            match (KIND == Q6, g1 == g0) {
                                (true, true) => tile_one_signed(u, steps(g0), c),
                                (true, false) => tile_pair_signed(u, steps(g0), steps(g1), c),
                                (false, true) => tile_one(u, steps(g0), c),
                                (false, false) => tile_pair(u, steps(g0), steps(g1), c),
                            }
                        };
                        for (k, g) in [g0, g1].into_iter().enumerate() {
                            if k == 1 && g1 == g0 {
                                break;
                            }
                            let d = &s.acts.d[(g * nb + i) * P..][..P];
                            let pairs = &s.acts.pairs[(g * nb + i) * 4 * P..][..4 * P];
                            let at = set * groups + g;
                            let (sums, mins) = (&mut s.sums[at], &mut s.mins[at]);
                            block_end::<KIND>(u, &c.0[k], d, pairs, sums, mins);
                        }
                    }
                }
            }
            for set in 0..sets {
                let (r0, nr) = (r0 + set * R, R.min(rows - r0 - set * R));
                let at = set * groups..(set + 1) * groups;
                let (sums, mins) = (&s.sums[at.clone()], &s.mins[at]);
                write_out(
                    sums,
                    mins,
                    &mut out[r0 * row_stride..],
                    nr,
                    n,
                    [row_stride, pos_stride],
                );
            }
        }
        // SAFETY: releases the tile state this function configured; no tile is used after.
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    });
}

/// Sixteen rows' outputs, `sum - min`, of `n` positions (`sums`, `mins`: `[group][row]
/// [position]`) into `out` (from the first row's first output): its first `nr` rows.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn write_out(
    sums: &[[[f32; P]; R]],
    mins: &[[[f32; P]; R]],
    out: &mut [f32],
    nr: usize,
    n: usize,
    [row_stride, pos_stride]: [usize; 2],
) {
    let groups = n.div_ceil(P);
    if pos_stride == 1 {
        // A row's positions are contiguous: sixteen a (masked) store.
        for r in 0..nr {
            let o = &mut out[r * row_stride..][..n];
            for (g, o) in o.chunks_mut(P).enumerate() {
                let keep = if o.len() == P {
                    !0
                } else {
                    (1u16 << o.len()) - 1
                };
                // SAFETY: `sums[g][r]` and `mins[g][r]` are 16 readable f32; the masked store
                // writes the first `o.len()` f32 of `o` only. All unaligned.
                unsafe {
                    let y = _mm512_sub_ps(
                        _mm512_loadu_ps(sums[g][r].as_ptr()),
                        _mm512_loadu_ps(mins[g][r].as_ptr()),
                    );
                    _mm512_mask_storeu_ps(o.as_mut_ptr(), keep, y);
                }
            }
        }
    } else if row_stride == 1 {
        // A position's rows are contiguous (`[positions][rows]`): a group's sixteen rows of
        // `sum - min` turned in registers into its positions' sixteen rows each, one masked
        // store a position (two gathers a position took about four times the cycles).
        let keep = if nr == R { !0 } else { (1u16 << nr) - 1 };
        for g in 0..groups {
            let (sums, mins) = (&sums[g], &mins[g]);
            // SAFETY: each row of `sums` and `mins` is 16 readable f32; the loads are
            // unaligned.
            let mut y: [__m512; R] = std::array::from_fn(|r| unsafe {
                _mm512_sub_ps(
                    _mm512_loadu_ps(sums[r].as_ptr()),
                    _mm512_loadu_ps(mins[r].as_ptr()),
                )
            });
            transpose16(&mut y);
            for (l, y) in y.iter().enumerate().take(n - g * P) {
                let o = &mut out[(g * P + l) * pos_stride..][..nr];
                // SAFETY: the masked store writes the first `nr` f32 of `o` only; it is
                // unaligned.
                unsafe { _mm512_mask_storeu_ps(o.as_mut_ptr(), keep, *y) };
            }
        }
    } else {
        for p in 0..n {
            let (g, l) = (p / P, p % P);
            for r in 0..nr {
                out[r * row_stride + p * pos_stride] = sums[g][r][l] - mins[g][r][l];
            }
        }
    }
}

/// One block's float steps for sixteen rows and one group: the exact integer `8 hi + lo`
/// (Q6_K: `64 hi + lo`) a row, then `sum += (d x d_x) x isum`, and, but for Q6_K, the min
/// term as the VNNI panel's (four `vpdpwssd` of the bsum pairs by the mins,
/// `mins += (dmin x d_x) x msum`; Q6_K's `mins` stay zero, so its outputs `sum - 0.0` are
/// the sums' bits).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn block_end<const KIND: u8>(
    u: &Unpacked,
    c: &[[[i32; P]; R]; 2],
    d: &[f32],
    pairs: &[u32],
    sums: &mut [[f32; P]; R],
    mins: &mut [[f32; P]; R],
) {
    let ld = |v: &[u32]| {
        let v = &v[..P];
        // SAFETY: `v` is 16 readable u32; the load is unaligned.
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) }
    };
    let ldi = |v: &[i32; P]| {
        // SAFETY: `v` is 16 readable i32; the load is unaligned.
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) }
    };
    let d = &d[..P];
    // SAFETY: `d` is 16 readable f32; the load is unaligned.
    let ad = unsafe { _mm512_loadu_ps(d.as_ptr()) };
    let pv: [__m512i; 4] = std::array::from_fn(|k| ld(&pairs[k * P..]));
    for r in 0..R {
        let hi = ldi(&c[0][r]);
        let hi = if KIND == Q6 {
            _mm512_slli_epi32::<6>(hi)
        } else {
            _mm512_slli_epi32::<3>(hi)
        };
        let i = _mm512_add_epi32(hi, ldi(&c[1][r]));
        let dd = _mm512_mul_ps(_mm512_set1_ps(u.d[r]), ad);
        // SAFETY: each row of `sums` and `mins` is 16 readable and writable f32; the loads
        // and stores are unaligned.
        unsafe {
            let sp = sums[r].as_mut_ptr();
            let si = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(i));
            _mm512_storeu_ps(sp, _mm512_add_ps(_mm512_loadu_ps(sp), si));
        }
        if KIND == Q6 {
            continue;
        }
        let mut m = _mm512_setzero_si512();
        for (k, &v) in pv.iter().enumerate() {
            m = _mm512_dpwssd_epi32(m, v, _mm512_set1_epi32(u.mins[r][k] as i32));
        }
        let dm = _mm512_mul_ps(_mm512_set1_ps(u.dmin[r]), ad);
        // SAFETY: as the sums' above.
        unsafe {
            let mp = mins[r].as_mut_ptr();
            let mi = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(m));
            _mm512_storeu_ps(mp, _mm512_add_ps(_mm512_loadu_ps(mp), mi));
        }
    }
}

#[cfg(test)]
mod tests;
