//! The rows x positions panel of GGUF's 32-element types for prefill (AVX-512 VNNI): many
//! positions against the same weight rows, so the weights are decoded once into an int8
//! panel and every instruction works on sixteen rows at once.
//!
//! * Unpack: sixteen rows' blocks decoded (the dot kernels' decoders) and biased by +128 to
//!   unsigned bytes, laid out per block as eight 64-byte groups, group `k` holding each row's
//!   four weights `4k .. 4k + 4`; per block the sixteen rows' scales (and Q4_1/Q5_1's
//!   minimums) as one 16-float vector.
//! * Microkernel: for up to eight positions, per block, eight `vpdpbusd` of a group against
//!   the position's four activation bytes broadcast leave each row's `sum (w + 128) * x` in
//!   its lane; the sum starts at `-128 * sum x` (the bias's correction, made once per
//!   position and block), so it ends as the block's exact `isum`, the reference's.
//! * Float step: the reference's, sixteen rows at once: `d = dw * da` (one product), then
//!   `d * isum` added into set `ib % 8`. The sets are walked one at a time (blocks `s, s + 8,
//!   ...` for set `s`), so each position needs one float register, not eight; each set still
//!   sums its blocks in ascending order, so every output is the dot's bits.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::dot::f16_at;
use super::dot_q0::{e8m0_half, SETS};
use super::x86_q0::{wq_iq4_nl, wq_mxfp4, wq_q4_0, wq_q4_1, wq_q5_0, wq_q5_1, wq_q8_0};
use super::{PanelFn, Q8Row};
use crate::gguf::GgmlType;

/// Weight rows a panel holds: one 512-bit register of i32 sums, a row a lane.
const ROWS: usize = 16;

/// Positions one microkernel call computes: a register of integer sums and one of float
/// sums each, 16 of the 32 registers.
const POS: usize = 8;

/// Bytes of one block of the unpacked panel: 32 weights of 16 rows.
const PANEL_BLOCK: usize = 32 * ROWS;

/// The AVX-512 VNNI panel of `ty` among the 32-element types, where this CPU has the
/// features the panels are compiled for.
pub(super) fn panel(ty: GgmlType) -> Option<PanelFn> {
    if !super::x86::has_panel_features() {
        return None;
    }
    use GgmlType::*;
    Some(match ty {
        Q8_0 => q8_0,
        Q4_0 => q4_0,
        Q4_1 => q4_1,
        Q5_0 => q5_0,
        Q5_1 => q5_1,
        MXFP4 => mxfp4,
        IQ4_NL => iq4_nl,
        _ => return None,
    })
}

/// A thread's unpacked panel and position data, kept between calls (prefill calls a panel
/// per expert and chunk; its buffers reach their size once).
#[derive(Default)]
struct Scratch {
    /// Per block, per group `k` of four inputs, the rows' four weights `+ 128` (`PANEL_BLOCK`
    /// bytes a block).
    wq: Vec<u8>,
    /// Per block the rows' weight scales.
    dw: Vec<f32>,
    /// Q4_1/Q5_1: per block the rows' minimums.
    mins: Vec<f32>,
    /// Per position, per block: `-128 *` the block's activation quant sum.
    corr: Vec<i32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Unpacks rows `rows` (whole rows of `nb` blocks, at most `ROWS` of them) into the scratch's
/// panel, rows past the last as zero weights of scale zero.
type UnpackFn = unsafe fn(rows: &[u8], nb: usize, s: &mut Scratch);

/// Defines type `$name`'s unpacker `$unpack` (blocks of `$bytes`, quants from `$wq`, weight
/// scale from `$dw`, minimum from `$min`) and its panel entry (`$has_min`: Q4_1/Q5_1).
macro_rules! panel_type {
    ($name:ident, $unpack:ident, $bytes:expr, $wq:ident, $dw:expr, $min:expr, $has_min:expr) => {
        #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
        fn $unpack(rows: &[u8], nb: usize, s: &mut Scratch) {
            let rb = nb * $bytes;
            let n = rows.len() / rb;
            let bias = _mm256_set1_epi8(-128);
            for ib in 0..nb {
                // Rows past the matrix: weight 0 (128 biased), scale 0; their outputs are
                // dropped.
                let mut q = [bias; ROWS];
                let (dw, mins) = (&mut s.dw[ib * ROWS..], &mut s.mins[ib * ROWS..]);
                dw[..ROWS].fill(0.0);
                for r in 0..n {
                    let b = &rows[r * rb + ib * $bytes..r * rb + (ib + 1) * $bytes];
                    q[r] = _mm256_xor_si256($wq(b), bias);
                    dw[r] = $dw(b);
                    if $has_min {
                        mins[r] = $min(b);
                    }
                }
                let blk = &mut s.wq[ib * PANEL_BLOCK..(ib + 1) * PANEL_BLOCK];
                transpose16x8(&q, blk.try_into().expect("a panel block"));
            }
        }

        pub(super) fn $name(
            w: &[u8],
            cols: usize,
            x: &[Q8Row],
            out: &mut [f32],
            row_stride: usize,
            pos_stride: usize,
        ) {
            // SAFETY: `panel` hands this function out only after detecting every feature in
            // AVX2, F16C, AVX-512F/BW/VL/VNNI, which `run` and `$unpack` are compiled for.
            unsafe {
                run(
                    w,
                    cols,
                    x,
                    out,
                    [row_stride, pos_stride],
                    $bytes,
                    $unpack,
                    $has_min,
                )
            }
        }
    };
}

panel_type!(
    q8_0,
    unpack_q8_0,
    34,
    wq_q8_0,
    |b| f16_at(b, 0),
    |_| 0.0,
    false
);
panel_type!(
    q4_0,
    unpack_q4_0,
    18,
    wq_q4_0,
    |b| f16_at(b, 0),
    |_| 0.0,
    false
);
panel_type!(
    q4_1,
    unpack_q4_1,
    20,
    wq_q4_1,
    |b| f16_at(b, 0),
    |b| f16_at(b, 2),
    true
);
panel_type!(
    q5_0,
    unpack_q5_0,
    22,
    wq_q5_0,
    |b| f16_at(b, 0),
    |_| 0.0,
    false
);
panel_type!(
    q5_1,
    unpack_q5_1,
    24,
    wq_q5_1,
    |b| f16_at(b, 0),
    |b| f16_at(b, 2),
    true
);
panel_type!(
    iq4_nl,
    unpack_iq4_nl,
    18,
    wq_iq4_nl,
    |b| f16_at(b, 0),
    |_| 0.0,
    false
);
panel_type!(
    mxfp4,
    unpack_mxfp4,
    17,
    wq_mxfp4,
    |b: &[u8]| e8m0_half(b[0]),
    |_| 0.0,
    false
);

/// One block of sixteen rows' 32 biased weights (`q[r]`, eight dwords of four weights) laid
/// out as the panel's eight 64-byte groups: group `k` is every row's dword `k`, row by row.
/// An 8 x 8 dword transpose on both halves of 512-bit registers holding rows `r` and `r + 8`.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
fn transpose16x8(q: &[__m256i; ROWS], out: &mut [u8; PANEL_BLOCK]) {
    let mut a = [_mm512_setzero_si512(); 8];
    for r in 0..8 {
        a[r] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q[r]), q[r + 8]);
    }
    // Per 128-bit lane: t[2i] = rows 2i, 2i + 1 interleaved (dwords 0, 1), t[2i + 1] (2, 3).
    let mut t = [_mm512_setzero_si512(); 8];
    for i in 0..4 {
        t[2 * i] = _mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
    }
    // u[c] (c < 4): dword c of each 128-bit lane for rows 0..4; u[c + 4] for rows 4..8.
    let mut u = [_mm512_setzero_si512(); 8];
    for h in 0..2 {
        let (x, y) = (t[4 * h], t[4 * h + 2]);
        let (z, w) = (t[4 * h + 1], t[4 * h + 3]);
        u[4 * h] = _mm512_unpacklo_epi64(x, y);
        u[4 * h + 1] = _mm512_unpackhi_epi64(x, y);
        u[4 * h + 2] = _mm512_unpacklo_epi64(z, w);
        u[4 * h + 3] = _mm512_unpackhi_epi64(z, w);
    }
    // Lanes 0 and 2 (dwords 0..4 of rows r and r + 8) give groups 0..4, lanes 1 and 3 give
    // groups 4..8; each group takes rows 0..4 from u[c] and 4..8 from u[c + 4].
    let lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    let hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for c in 0..4 {
        let g0 = _mm512_permutex2var_epi64(u[c], lo, u[c + 4]);
        let g1 = _mm512_permutex2var_epi64(u[c], hi, u[c + 4]);
        // SAFETY: groups `c` and `c + 4` are bytes `64c ..` and `64(c + 4) ..` of the
        // 512-byte `out`; the stores are unaligned.
        unsafe {
            _mm512_storeu_si512(out.as_mut_ptr().add(64 * c) as *mut _, g0);
            _mm512_storeu_si512(out.as_mut_ptr().add(64 * (c + 4)) as *mut _, g1);
        }
    }
}

/// The panel product: rows of `w` (blocks of `bytes`, `cols` inputs) against the positions
/// `x`, sixteen rows a panel, eight positions a microkernel call.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn run(
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    [row_stride, pos_stride]: [usize; 2],
    bytes: usize,
    unpack: UnpackFn,
    has_min: bool,
) {
    let nb = cols / 32;
    let rb = nb * bytes;
    if rb == 0 || x.is_empty() {
        return;
    }
    let nrows = w.len() / rb;
    let npos = x.len();
    let mut s = SCRATCH.with(|c| c.take());
    s.wq.resize(nb * PANEL_BLOCK, 0);
    s.dw.resize(nb * ROWS, 0.0);
    s.mins.resize(nb * ROWS, 0.0);
    s.corr.resize(npos * nb, 0);
    for (p, xr) in x.iter().enumerate() {
        for (ib, c) in s.corr[p * nb..(p + 1) * nb].iter_mut().enumerate() {
            let sum: i32 = xr.qs[ib * 32..ib * 32 + 32].iter().map(|&v| v as i32).sum();
            *c = -128 * sum;
        }
    }
    for r0 in (0..nrows).step_by(ROWS) {
        let n = ROWS.min(nrows - r0);
        // SAFETY: `unpack` is compiled for features `run`'s caller detected.
        unsafe { unpack(&w[r0 * rb..(r0 + n) * rb], nb, &mut s) };
        for p0 in (0..npos).step_by(POS) {
            let np = POS.min(npos - p0);
            let xs = &x[p0..p0 + np];
            let corr = &s.corr[p0 * nb..(p0 + np) * nb];
            let mut res = [[0f32; ROWS]; POS];
            match np {
                1 => micro::<1>(&s, nb, xs, corr, has_min, &mut res),
                2 => micro::<2>(&s, nb, xs, corr, has_min, &mut res),
                3 => micro::<3>(&s, nb, xs, corr, has_min, &mut res),
                4 => micro::<4>(&s, nb, xs, corr, has_min, &mut res),
                5 => micro::<5>(&s, nb, xs, corr, has_min, &mut res),
                6 => micro::<6>(&s, nb, xs, corr, has_min, &mut res),
                7 => micro::<7>(&s, nb, xs, corr, has_min, &mut res),
                _ => micro::<8>(&s, nb, xs, corr, has_min, &mut res),
            }
            for (p, r) in res[..np].iter().enumerate() {
                for (j, &v) in r[..n].iter().enumerate() {
                    out[(r0 + j) * row_stride + (p0 + p) * pos_stride] = v;
                }
            }
        }
    }
    SCRATCH.with(|c| c.replace(s));
}

/// The reference's `tree8` over eight 16-row vectors of sets, lane by lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn tree8_rows(t: &[__m512; SETS]) -> __m512 {
    let u: [__m512; 4] = [
        _mm512_add_ps(t[0], t[4]),
        _mm512_add_ps(t[1], t[5]),
        _mm512_add_ps(t[2], t[6]),
        _mm512_add_ps(t[3], t[7]),
    ];
    _mm512_add_ps(_mm512_add_ps(u[0], u[2]), _mm512_add_ps(u[1], u[3]))
}

/// `NP` positions `x` against the scratch's panel: `res[p][j]`, row `j`'s output for
/// position `p`. `corr` holds the positions' corrections, `nb` a position.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn micro<const NP: usize>(
    s: &Scratch,
    nb: usize,
    x: &[Q8Row],
    corr: &[i32],
    has_min: bool,
    res: &mut [[f32; ROWS]; POS],
) {
    let x: &[Q8Row; NP] = x.try_into().expect("NP positions");
    let mut sets = [[_mm512_setzero_ps(); SETS]; NP];
    for set in 0..SETS {
        let mut acc = [_mm512_setzero_ps(); NP];
        let mut ib = set;
        while ib < nb {
            let wb: &[u8; PANEL_BLOCK] = s.wq[ib * PANEL_BLOCK..(ib + 1) * PANEL_BLOCK]
                .try_into()
                .expect("a panel block");
            // Few positions leave the `vpdpbusd` chain's latency bare: there the odd groups
            // go into a second chain, added at the end (integers: the same sums).
            let chains = if NP <= 4 { 2 } else { 1 };
            let mut isum = [[_mm512_setzero_si512(); NP]; 2];
            let mut xb: [&[i8; 32]; NP] = [&[0; 32]; NP];
            for p in 0..NP {
                isum[0][p] = _mm512_set1_epi32(corr[p * nb + ib]);
                xb[p] = x[p].qs[ib * 32..ib * 32 + 32].try_into().expect("a block");
            }
            for k in 0..8 {
                // SAFETY: bytes `64k .. 64k + 64` of the 512-byte `wb`; the load is unaligned.
                let wv = unsafe { _mm512_loadu_si512(wb.as_ptr().add(64 * k) as *const _) };
                let c = k % chains;
                for p in 0..NP {
                    // SAFETY: bytes `4k .. 4k + 4` of the 32-byte `xb[p]`; unaligned read.
                    let x4 = unsafe { (xb[p].as_ptr().add(4 * k) as *const i32).read_unaligned() };
                    isum[c][p] = _mm512_dpbusd_epi32(isum[c][p], wv, _mm512_set1_epi32(x4));
                }
            }
            if chains == 2 {
                for p in 0..NP {
                    isum[0][p] = _mm512_add_epi32(isum[0][p], isum[1][p]);
                }
            }
            let isum = &isum[0];
            let dw = load16(&s.dw, ib * ROWS);
            for p in 0..NP {
                let d = _mm512_mul_ps(dw, _mm512_set1_ps(x[p].d[ib]));
                let v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[p]));
                acc[p] = _mm512_add_ps(acc[p], v);
            }
            ib += SETS;
        }
        for p in 0..NP {
            sets[p][set] = acc[p];
        }
    }
    let mut mins = [[_mm512_setzero_ps(); SETS]; NP];
    if has_min {
        for (ib, m) in s.mins[..nb * ROWS].chunks_exact(ROWS).enumerate() {
            let m = load16(m, 0);
            for p in 0..NP {
                let v = _mm512_mul_ps(m, _mm512_set1_ps(x[p].s[ib]));
                mins[p][ib % SETS] = _mm512_add_ps(mins[p][ib % SETS], v);
            }
        }
    }
    for p in 0..NP {
        let mut t = tree8_rows(&sets[p]);
        if has_min {
            t = _mm512_add_ps(t, tree8_rows(&mins[p]));
        }
        // SAFETY: `res[p]` is 16 writable f32; the store is unaligned.
        unsafe { _mm512_storeu_ps(res[p].as_mut_ptr(), t) };
    }
}

/// Sixteen f32 at `p[off..off + 16]` (bounds checked).
#[inline]
#[target_feature(enable = "avx512f")]
fn load16(p: &[f32], off: usize) -> __m512 {
    let s = &p[off..off + 16];
    // SAFETY: `s` is 16 readable f32; the load is unaligned.
    unsafe { _mm512_loadu_ps(s.as_ptr()) }
}
