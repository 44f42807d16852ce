//! Prefill's panels of the lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS),
//! Q2_K and IQ1_S/IQ1_M on AMX (issue 49): sixteen weight rows against sixteen positions a
//! tile product (`tdpbssd`), each output the row dot's bits.
//!
//! IQ2_XXS and IQ2_S are written straight into the two planes below (`planes.rs`, one
//! table permute a plane per 64 weights); the other lattice types' unpacking is the VNNI
//! panel's (`iqpanel.rs`): a block to 256 signed weights in input order and its groups'
//! integer scales. AMX-INT8 multiplies signed by signed, so the int8
//! activations go in as quantized, with no offset to take off. A tile product sums 64
//! inputs a lane across group boundaries, so each group's scale is folded into its weights:
//! `v = weight x scale` is at most 4064 in magnitude (IQ4_XS: table 127 x scale 32; the
//! grids: 62 x 31), and writing it as `64 hi + lo` with `hi = v >> 6` (arithmetic, -64..63)
//! and `lo = v & 63` (0..63) gives two signed-byte weight planes whose tile products make
//! the block's integer `64 (hi . x) + (lo . x)`: the reference's `sum over groups of scale x
//! (group . x)`, exact (each product at most 256 x 64 x 128 in magnitude). The float steps
//! after it are the VNNI panel's (`sum += (d x d_x) x isum` a block, the type's factor at
//! the end), so every output is the dot's bits.
//!
//! The other types use the same two tile products for their second integer term: Q2_K's
//! first plane is its quants times their group's scale (at most 3 x 15), its second each
//! element's group min (so `plane . x` is the reference's `sum of min x bsum`); IQ1_S's and
//! IQ1_M's first plane is the grid value (-1, 0, 1) times its group's scale (at most 15),
//! the second that scale times the group's (or eighth's) delta sign, whose product with the
//! activations is the reference's `sum of scale x delta x bsum`. Their float steps are the
//! reference's own (`Combine`). IQ1_S/IQ1_M have no VNNI panel, so every shape of theirs is
//! run on the tiles (a last partial sixteen repeats its last row).
//!
//! The tile plumbing (CPUID, the OS's grant, the configuration, the tile product) is `amx.rs`'s; the
//! activations are `kpanel::Acts` unflipped (B's layout: four inputs of sixteen positions a
//! 64-byte row). Rows past the last whole sixteen go to the VNNI panel, as the K-quants' AMX
//! panel does, and so do calls of at most sixteen positions, except IQ2_XXS's and IQ2_S's
//! from four (`Kind::amx_from`): with their cheap planes one partly empty tile group beat it.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::amx::{amx_ready, tile_one_with, tile_pair_with, Sums, TileConfig, P, R, ROW, STEPS};
use super::dot::{f16_at, u16_at};
use super::dot_iq::IQ1S;
use super::iqpanel::{self, UnpackFn};
use super::kpanel::Acts;
use super::rows::NextRows;
use super::{PanelFn, Q8Row};
use crate::gguf::GgmlType;
use crate::quant::transpose_avx512::transpose16;

mod planes;

/// The AMX panel of `ty` (the lattice types, Q2_K, IQ1_S, IQ1_M) where the CPU has AMX-INT8
/// and the VNNI panel's features, and the OS lets this process use the tiles (`COLI_AMX=0`
/// turns it off, as for the K-quants).
pub(super) fn panel(ty: GgmlType) -> Option<PanelFn> {
    if !amx_ready() {
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
        IQ1_S => iq1_s,
        IQ1_M => iq1_m,
        _ => return None,
    })
}

macro_rules! amx_entry {
    ($name:ident, $ty:ident) => {
        fn $name(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
            amx_then_vnni(GgmlType::$ty, w, cols, x, out, rs, ps)
        }
    };
}

amx_entry!(iq2_xxs, IQ2_XXS);
amx_entry!(iq2_xs, IQ2_XS);
amx_entry!(iq2_s, IQ2_S);
amx_entry!(iq3_xxs, IQ3_XXS);
amx_entry!(iq3_s, IQ3_S);
amx_entry!(iq4_xs, IQ4_XS);
amx_entry!(q2_k, Q2_K);
amx_entry!(iq1_s, IQ1_S);
amx_entry!(iq1_m, IQ1_M);

/// One block of sixteen weight rows, unpacked for the tiles.
#[repr(C, align(64))]
struct Unpacked {
    /// `[64-input chunk][row][input]`: the first weight plane (the lattice types: each
    /// weight times its group's scale, shifted right 6).
    hi: [[[i8; ROW]; R]; 4],
    /// The second plane (the lattice types: the same product's low 6 bits).
    lo: [[[i8; ROW]; R]; 4],
    d: [f32; R],
    /// Q2_K's min scale a row.
    dmin: [f32; R],
    /// One row's unpacking as the VNNI panel's unpacker writes it.
    q: [u32; STEPS],
    sc: [i32; 16],
}

impl Unpacked {
    fn zeroed() -> Unpacked {
        Unpacked {
            hi: [[[0; ROW]; R]; 4],
            lo: [[[0; ROW]; R]; 4],
            d: [0.0; R],
            dmin: [0.0; R],
            q: [0; STEPS],
            sc: [0; 16],
        }
    }
}

/// A thread's scratch, kept between calls so a prefill allocates only when a shape grows.
#[derive(Default)]
struct Scratch {
    acts: Acts,
    /// `[group]`: per row of the current sixteen the running sums of the positions.
    sums: Vec<[[f32; P]; R]>,
    tiles: Option<Box<(Unpacked, Sums)>>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// How a block's two tile products `C0`, `C1` become the reference's float step.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Combine {
    /// The lattice types: the integer `64 C0 + C1`, `sum += (d x d_x) x isum`.
    Split,
    /// Q2_K: `sum += (d x d_x) x C0 - (dmin x d_x) x C1`.
    Mins,
    /// IQ1_S/IQ1_M: `sum += (d x d_x) x (C0 + 1/8 C1)`.
    Delta,
}

/// A type's own plane writer: block `b` into row `r` of `u`'s planes; returns the block's
/// scale and min scale.
type PlanesFn = unsafe fn(b: &[u8], u: &mut Unpacked, r: usize) -> (f32, f32);

/// Where a row's two planes come from.
#[derive(Clone, Copy)]
enum Source {
    /// The VNNI panel's unpacker of a type of `groups` scaled groups, folded and split.
    Lattice {
        unpack: UnpackFn,
        groups: usize,
    },
    Own(PlanesFn),
}

/// What the panel needs of a type.
struct Kind {
    /// Bytes a block.
    bb: usize,
    /// The dot's final factor.
    post: f32,
    source: Source,
    /// Whether the VNNI panel has the type (for row tails and calls of few positions).
    vnni: bool,
    /// The fewest positions a call has on the tiles where the VNNI panel has the type:
    /// below it the unpack of sixteen rows a block for few products costs more than the
    /// VNNI panel's (measured, `bench_iq2_planes`).
    amx_from: usize,
}

fn kind(ty: GgmlType) -> Option<Kind> {
    if let Some(k) = direct_kind(ty) {
        return Some(k);
    }
    lattice_kind(ty)
}

/// The fewest positions the direct planes' types take the tiles at: from 4 positions (the
/// fewest measured) IQ2_XXS and IQ2_S were 1.3-2x the VNNI panel on the tiles, one group
/// of sixteen for 4 to 16 positions (`bench_iq2_planes`, one thread under load).
const DIRECT_AMX_FROM: usize = 4;

/// IQ2_XXS and IQ2_S written straight into the planes (`planes.rs`), where the CPU
/// has AVX-512 VBMI's byte permutes (every AMX CPU so far does).
fn direct_kind(ty: GgmlType) -> Option<Kind> {
    let own: PlanesFn = match ty {
        GgmlType::IQ2_XXS => planes::iq2_xxs,
        GgmlType::IQ2_S => planes::iq2_s,
        _ => return None,
    };
    if !is_x86_feature_detected!("avx512vbmi") {
        return None;
    }
    let (bb, _, _, post) = iqpanel::lattice_type(ty)?;
    Some(Kind {
        bb,
        post,
        source: Source::Own(own),
        vnni: true,
        amx_from: DIRECT_AMX_FROM,
    })
}

/// A type through the VNNI panel's unpacker, folded and split, or its own plane writer.
fn lattice_kind(ty: GgmlType) -> Option<Kind> {
    use GgmlType::*;
    if let Some((bb, groups, unpack, post)) = iqpanel::lattice_type(ty) {
        let source = Source::Lattice { unpack, groups };
        return Some(Kind {
            bb,
            post,
            source,
            vnni: true,
            amx_from: P + 1,
        });
    }
    let (bb, own, vnni): (usize, PlanesFn, bool) = match ty {
        Q2_K => (84, planes_q2_k as PlanesFn, true),
        IQ1_S => (50, planes_iq1_s as PlanesFn, false),
        IQ1_M => (56, planes_iq1_m as PlanesFn, false),
        _ => return None,
    };
    Some(Kind {
        bb,
        post: 1.0,
        source: Source::Own(own),
        vnni,
        amx_from: P + 1,
    })
}

/// The rows in whole sixteens on the tiles, a last partial sixteen (and every call of
/// fewer than the type's `amx_from` positions) by the VNNI panel where the type has one.
/// Each output is the dot's bits either way.
fn amx_then_vnni(
    ty: GgmlType,
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    rs: usize,
    ps: usize,
) {
    let k = kind(ty).expect("`panel` hands out only types `kind` has");
    split_rows(ty, &k, w, cols, x, out, [rs, ps]);
}

/// [`amx_then_vnni`] with the type's `k`.
fn split_rows(
    ty: GgmlType,
    k: &Kind,
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    [rs, ps]: [usize; 2],
) {
    let rb = cols / 256 * k.bb;
    let rows = if rb == 0 { 0 } else { w.len() / rb };
    let whole = match k.vnni {
        false => rows,
        true if x.len() >= k.amx_from => rows / R * R,
        true => 0,
    };
    if whole > 0 {
        type Run = unsafe fn(&[u8], usize, &[Q8Row], &mut [f32], [usize; 2], &Kind);
        let run: Run = match ty {
            GgmlType::Q2_K => amx_panel::<{ Combine::Mins as u8 }>,
            GgmlType::IQ1_S | GgmlType::IQ1_M => amx_panel::<{ Combine::Delta as u8 }>,
            _ => amx_panel::<{ Combine::Split as u8 }>,
        };
        // SAFETY: `panel` hands this function out only after `amx_ready` (which includes the
        // VNNI panel's AVX-512 features and the OS's grant of the tile state); vector loads
        // and stores go through bounds-checked slices, tile ones through `Unpacked`, `Acts`
        // and `Sums` as `tile_pair` states.
        unsafe { run(&w[..whole * rb], cols, x, out, [rs, ps], k) }
    }
    if whole < rows {
        let tail = iqpanel::vnni_panel(ty).expect("`amx_ready` includes the VNNI panel's features");
        tail(&w[whole * rb..], cols, x, &mut out[whole * rs..], rs, ps);
    }
}

/// Block `b` of row `r` into `u`: a lattice type's unpacker, folded and split
/// ([`fold_split`]), or the type's own plane writer.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn unpack_row(b: &[u8], u: &mut Unpacked, r: usize, k: &Kind) {
    match k.source {
        Source::Lattice { unpack, groups } => {
            // SAFETY: the unpackers need AVX2, AVX-512 BW/VL and F16C, which this function
            // has.
            u.d[r] = unsafe { unpack(b, &mut u.q, &mut u.sc) };
            fold_split(u, r, groups, true);
        }
        Source::Own(own) => {
            // SAFETY: the plane writers need the features this function has.
            (u.d[r], u.dmin[r]) = unsafe { own(b, u, r) };
        }
    }
}

/// Row `r`'s unpacked weights (`u.q`) times their group's scale (`u.sc`, `groups` a block)
/// as i16, 32 inputs (a group of 32, or two of 16) a vector; `split`: written as `hi = v >>
/// 6` (arithmetic) and `lo = v & 63` (each |v| at most 4064), else as bytes into `hi` (each
/// at most 127 in magnitude).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn fold_split(u: &mut Unpacked, r: usize, groups: usize, split: bool) {
    let low6 = _mm512_set1_epi16(63);
    for run in 0..8 {
        let src = &u.q[8 * run..8 * run + 8];
        // SAFETY: `src` is 8 readable u32 (32 bytes); the load is unaligned.
        let q = unsafe { _mm256_loadu_si256(src.as_ptr() as *const __m256i) };
        let scale = if groups == 8 {
            _mm512_set1_epi16(u.sc[run] as i16)
        } else {
            let (a, b) = (u.sc[2 * run] as i16, u.sc[2 * run + 1] as i16);
            _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b))
        };
        let v = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(q), scale);
        if split {
            let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<6>(v));
            store_run(&mut u.hi, r, run, hi);
            store_run(
                &mut u.lo,
                r,
                run,
                _mm512_cvtepi16_epi8(_mm512_and_si512(v, low6)),
            );
        } else {
            store_run(&mut u.hi, r, run, _mm512_cvtepi16_epi8(v));
        }
    }
}

/// Stores 32 bytes as inputs `32 run .. 32 run + 32` of row `r` of a plane.
#[inline]
#[target_feature(enable = "avx2")]
fn store_run(plane: &mut [[[i8; ROW]; R]; 4], r: usize, run: usize, v: __m256i) {
    let at = 32 * (run % 2);
    let dst = &mut plane[run / 2][r][at..at + 32];
    // SAFETY: `dst` is 32 writable bytes; the store is unaligned.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, v) };
}

/// Eight copies of the low byte of `v` as one word.
#[inline]
fn bytes8(v: i32) -> i64 {
    (v as u8 as u64 * 0x0101_0101_0101_0101) as i64
}

/// An 8-wide IQ1 grid row (values -1, 0, 1) as one word.
#[inline]
fn iq1_grid(idx: usize) -> i64 {
    i64::from_le_bytes(IQ1S[idx].map(|v| v as u8))
}

/// Q2_K: plane 0 the quants (0..3) times their 16-element group's scale (0..15), plane 1
/// each element's group min (0..15); the scale and min scale.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn planes_q2_k(b: &[u8], u: &mut Unpacked, r: usize) -> (f32, f32) {
    iqpanel::unpack_q2_k(b, &mut u.q, &mut u.sc);
    fold_split(u, r, 16, false);
    for run in 0..8 {
        let (m0, m1) = ((b[2 * run] >> 4) as i32, (b[2 * run + 1] >> 4) as i32);
        let v = _mm256_set_epi64x(bytes8(m1), bytes8(m1), bytes8(m0), bytes8(m0));
        store_run(&mut u.lo, r, run, v);
    }
    (f16_at(b, 80), f16_at(b, 82))
}

/// IQ1_S: per 32-element group a 3-bit scale `ls = 2 s + 1` and a delta sign; plane 0 the
/// grid values times `ls`, plane 1 `ls` times the sign (the same for the whole group).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn planes_iq1_s(b: &[u8], u: &mut Unpacked, r: usize) -> (f32, f32) {
    let qs = &b[2..34];
    for g in 0..8 {
        let qh = u16_at(b, 34 + 2 * g) as usize;
        let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
        let delta = if qh & 0x8000 != 0 { -ls } else { ls };
        let grid: [i64; 4] = std::array::from_fn(|l| {
            iq1_grid(qs[4 * g + l] as usize | (((qh >> (3 * l)) & 7) << 8))
        });
        let v = _mm256_set_epi64x(grid[3], grid[2], grid[1], grid[0]);
        store_run(
            &mut u.hi,
            r,
            g,
            _mm256_sign_epi8(_mm256_set1_epi8(ls as i8), v),
        );
        store_run(&mut u.lo, r, g, _mm256_set1_epi8(delta as i8));
    }
    (f16_at(b, 0), 0.0)
}

/// IQ1_M: per 16 elements a 3-bit scale `ls = 2 s + 1`, per 8 a delta sign; plane 0 the
/// grid values times their `ls`, plane 1 their `ls` times their sign. The f16 scale is
/// spread over the top nibbles of the four scale words.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn planes_iq1_m(b: &[u8], u: &mut Unpacked, r: usize) -> (f32, f32) {
    let (qs, qh) = (&b[0..32], &b[32..48]);
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let d_bits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    for g in 0..8 {
        let s = sc[g / 2] >> (6 * (g % 2));
        let ls = [2 * (s & 7) as i32 + 1, 2 * ((s >> 3) & 7) as i32 + 1];
        let mut grid = [0i64; 4];
        let mut delta = [0i64; 4];
        for l in 0..4 {
            let hb = (qh[2 * g + l / 2] >> (4 * (l % 2))) as usize;
            grid[l] = iq1_grid(qs[4 * g + l] as usize | ((hb & 7) << 8));
            let sign = if hb & 0x08 != 0 { -1 } else { 1 };
            delta[l] = bytes8(sign * ls[l / 2]);
        }
        let v = _mm256_set_epi64x(grid[3], grid[2], grid[1], grid[0]);
        let lsv = _mm256_set_epi64x(bytes8(ls[1]), bytes8(ls[1]), bytes8(ls[0]), bytes8(ls[0]));
        store_run(&mut u.hi, r, g, _mm256_sign_epi8(lsv, v));
        let dv = _mm256_set_epi64x(delta[3], delta[2], delta[1], delta[0]);
        store_run(&mut u.lo, r, g, dv);
    }
    (half::f16::from_bits(d_bits).to_f32(), 0.0)
}

/// The tile products of one block of sixteen rows (`u`) against two groups of sixteen
/// positions (`b0`, `b1`: each the block's 64 steps of 64 bytes), into `c`: per group
/// `hi . x` and `lo . x` over the block's 256 inputs, four 64-input chunks.
///
/// # Safety
/// The tiles must be configured (`ldtilecfg` of [`TileConfig::all_16x64`]) on this thread.
#[inline]
unsafe fn tile_pair(u: &Unpacked, b0: &[u32; STEPS * P], b1: &[u32; STEPS * P], c: &mut Sums) {
    // SAFETY: as this function's (`tile_pair_with`'s bounds hold for `Unpacked`'s 4 KiB
    // planes, any block steps and `Sums`).
    unsafe { tile_pair_with!("tdpbssd", u, b0, b1, c) }
}

/// [`tile_pair`] for one group of sixteen positions (`b0`, a last single group), into
/// `c.0[0]`: half the products.
///
/// # Safety
/// The tiles must be configured (`ldtilecfg` of [`TileConfig::all_16x64`]) on this thread.
#[inline]
unsafe fn tile_one(u: &Unpacked, b0: &[u32; STEPS * P], c: &mut Sums) {
    // SAFETY: as this function's (`tile_one_with`'s bounds hold for `Unpacked`'s 4 KiB
    // planes, any block steps and `Sums`).
    unsafe { tile_one_with!("tdpbssd", u, b0, c) }
}

/// The panel of a type: rows sixteen at a time (whole sixteens only: the caller
/// hands the rest to the VNNI panel), each block unpacked once and run against every pair
/// of position groups (a last single group alone, [`tile_one`]; positions past the last
/// are zero activations whose outputs are not written).
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn amx_panel<const COMBINE: u8>(
    w: &[u8],
    cols: usize,
    x: &[Q8Row],
    out: &mut [f32],
    [row_stride, pos_stride]: [usize; 2],
    ty: &Kind,
) {
    let (bb, post) = (ty.bb, ty.post);
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
        s.sums.resize(groups, [[0.0; P]; R]);
        let (u, c) = &mut **s
            .tiles
            .get_or_insert_with(|| Box::new((Unpacked::zeroed(), Sums([[[[0; P]; R]; 2]; 2]))));
        let cfg = TileConfig::all_16x64();
        // SAFETY: the CPU has AMX and the OS granted the tile state (`panel`); the operand
        // is a 64-byte palette-1 configuration (16 x 64-byte tiles, valid for palette 1).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, preserves_flags)) };
        for r0 in (0..rows).step_by(R) {
            let nr = R.min(rows - r0);
            s.sums[..groups].fill([[0.0; P]; R]);
            let next = NextRows::new(w, rb, r0, R, nb);
            for i in 0..nb {
                next.block(i);
                for r in 0..R {
                    let row = r0 + r.min(nr - 1);
                    unpack_row(&w[row * rb + i * bb..][..bb], u, r, ty);
                }
                let steps = |g: usize| -> &[u32; STEPS * P] {
                    let xs = &s.acts.xs[(g * cols / 4 + i * STEPS) * P..][..STEPS * P];
                    xs.try_into().expect("a block's steps")
                };
                for g0 in (0..groups).step_by(2) {
                    let g1 = (g0 + 1).min(groups - 1);
                    // SAFETY: the tiles were configured above on this thread.
                    unsafe {
                        match g1 == g0 {
                            true => tile_one(u, steps(g0), c),
                            false => tile_pair(u, steps(g0), steps(g1), c),
                        }
                    };
                    for (k, g) in [g0, g1].into_iter().enumerate() {
                        if k == 1 && g1 == g0 {
                            break;
                        }
                        let d = &s.acts.d[(g * nb + i) * P..][..P];
                        block_end::<COMBINE>(u, &c.0[k], d, &mut s.sums[g]);
                    }
                }
            }
            write_out(&s.sums, post, out, r0, nr, n, [row_stride, pos_stride]);
        }
        // SAFETY: releases the tile state this function configured; no tile is used after.
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    });
}

/// One block's float steps for sixteen rows and one group, the reference's ([`Combine`]).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn block_end<const COMBINE: u8>(
    u: &Unpacked,
    c: &[[[i32; P]; R]; 2],
    d: &[f32],
    sums: &mut [[f32; P]; R],
) {
    let ldi = |v: &[i32; P]| {
        // SAFETY: `v` is 16 readable i32; the load is unaligned.
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) }
    };
    let d = &d[..P];
    // SAFETY: `d` is 16 readable f32; the load is unaligned.
    let ad = unsafe { _mm512_loadu_ps(d.as_ptr()) };
    for r in 0..R {
        let dd = _mm512_mul_ps(_mm512_set1_ps(u.d[r]), ad);
        let (c0, c1) = (ldi(&c[0][r]), ldi(&c[1][r]));
        let v = if COMBINE == Combine::Split as u8 {
            let i = _mm512_add_epi32(_mm512_slli_epi32::<6>(c0), c1);
            _mm512_mul_ps(dd, _mm512_cvtepi32_ps(i))
        } else if COMBINE == Combine::Mins as u8 {
            let dm = _mm512_mul_ps(_mm512_set1_ps(u.dmin[r]), ad);
            _mm512_sub_ps(
                _mm512_mul_ps(dd, _mm512_cvtepi32_ps(c0)),
                _mm512_mul_ps(dm, _mm512_cvtepi32_ps(c1)),
            )
        } else {
            let eighth = _mm512_mul_ps(_mm512_set1_ps(0.125), _mm512_cvtepi32_ps(c1));
            _mm512_mul_ps(dd, _mm512_add_ps(_mm512_cvtepi32_ps(c0), eighth))
        };
        let sp = sums[r].as_mut_ptr();
        // SAFETY: `sums[r]` is 16 readable and writable f32; the accesses are unaligned.
        unsafe { _mm512_storeu_ps(sp, _mm512_add_ps(_mm512_loadu_ps(sp), v)) };
    }
}

/// Rows `r0 .. r0 + nr`'s outputs, `post x sum` each (the dot's last step): a row's
/// positions sixteen a masked store where they are contiguous, else one by one.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn write_out(
    sums: &[[[f32; P]; R]],
    post: f32,
    out: &mut [f32],
    r0: usize,
    nr: usize,
    n: usize,
    [row_stride, pos_stride]: [usize; 2],
) {
    if pos_stride == 1 {
        let pv = _mm512_set1_ps(post);
        for r in 0..nr {
            let o = &mut out[(r0 + r) * row_stride..][..n];
            for (g, o) in o.chunks_mut(P).enumerate() {
                let keep = if o.len() == P {
                    !0
                } else {
                    (1u16 << o.len()) - 1
                };
                // SAFETY: `sums[g][r]` is 16 readable f32; the masked store writes the first
                // `o.len()` f32 of `o` only. Both unaligned.
                unsafe {
                    let y = _mm512_mul_ps(pv, _mm512_loadu_ps(sums[g][r].as_ptr()));
                    _mm512_mask_storeu_ps(o.as_mut_ptr(), keep, y);
                }
            }
        }
    } else if row_stride == 1 {
        // A position's rows are contiguous (`[positions][rows]`, the products' own layout): a
        // group's sixteen rows turned in registers into its positions' sixteen rows each, one
        // masked store a position (element by element, with an index and a bounds check
        // each, this was a sixth of an IQ2_XXS prefill's experts).
        let pv = _mm512_set1_ps(post);
        let keep = if nr == R { !0 } else { (1u16 << nr) - 1 };
        for (g, sums) in sums.iter().enumerate().take(n.div_ceil(P)) {
            // SAFETY: each row of `sums` is 16 readable f32; the loads are unaligned.
            let mut y: [__m512; R] =
                std::array::from_fn(|r| unsafe { _mm512_loadu_ps(sums[r].as_ptr()) });
            transpose16(&mut y);
            for (l, y) in y.iter().enumerate().take(n - g * P) {
                let o = &mut out[r0 + (g * P + l) * pos_stride..][..nr];
                // SAFETY: the masked store writes the first `nr` f32 of `o` only; it is
                // unaligned.
                unsafe { _mm512_mask_storeu_ps(o.as_mut_ptr(), keep, _mm512_mul_ps(pv, *y)) };
            }
        }
    } else {
        for p in 0..n {
            let (g, l) = (p / P, p % P);
            for r in 0..nr {
                out[(r0 + r) * row_stride + p * pos_stride] = post * sums[g][r][l];
            }
        }
    }
}

#[cfg(test)]
mod tests;
