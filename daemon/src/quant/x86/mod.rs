//! x86-64 SIMD kernels, selected at run time.
//!
//! The functions here (and the float ones in `float_wrappers`) are safe
//! wrappers around `#[target_feature]` kernels.
//! They are private and only reachable through the [`KernelSet`]s returned
//! by [`avx2_kernels`] and [`avx512_kernels`], which are `Some` only when
//! every feature the set's kernels enable was detected on the running CPU;
//! that is the invariant every `unsafe` call below relies on ("features
//! detected").  The wrappers assert the slice lengths each kernel reads.

mod avx2;
mod avx2_attn;
mod avx512;
mod avx512_attn;
pub(super) mod expf;
mod float_wrappers;
mod gemm_g64;
mod gemm_vnni;

use float_wrappers::*;
use gemm_g64::{bw_gemm_i3g64, bw_gemm_i4g64, vnni_gemm_i3g64, vnni_gemm_i4g64};
use gemm_vnni::{avx2_gemm, bw_gemm_i8, bw_gemm_u4, vnni_gemm_i8, vnni_gemm_u4};

use super::act::ACT_BLOCK;
use super::pack::{GROUP, I3_GROUP_BYTES};
use super::KernelSet;

/// The transpose of eight vectors of eight 32-bit words: word `p` of vector `k` of the
/// result is word `k` of `r[p]`. Moves bits only, so it serves f32 as well (by the casts).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn transpose8x8_epi32(
    r: [std::arch::x86_64::__m256i; 8],
) -> [std::arch::x86_64::__m256i; 8] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved by words, then by pairs of words: each 128-bit lane then
    // holds one word index of four rows, which the last step joins across the lanes.
    let t: [__m256i; 8] = std::array::from_fn(|k| {
        let (a, b) = (r[2 * (k / 2)], r[2 * (k / 2) + 1]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // u[4 q + j]: rows 4q..4q+4, words j (low lane) and j + 4 (high lane).
    let u: [__m256i; 8] = std::array::from_fn(|k| {
        let (q, j) = (k / 4, k % 4);
        let (a, b) = (t[4 * q + j / 2], t[4 * q + 2 + j / 2]);
        if j % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|k| {
        if k < 4 {
            _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[k - 4], u[k])
        }
    })
}

/// Ask for the cache line `pf` bytes past `p` to come into L2 (nothing when
/// `pf` is 0).  Decode tiles call it once per line they consume, with `pf` a
/// whole number of tiles: every line of the weight stream is then requested
/// once, the same time ahead of its use, spread between the loads.  (Asking
/// for a whole tile at a time between kernel calls stalled the core: int4
/// decode read 0.6-0.75 of the plain probe that way, 0.85-1.0 this way.)  L2
/// rather than L1 because an L1 request holds one of the core's few fill
/// buffers for the whole trip to memory: at GLM shapes L2 read 5-15% faster.
#[inline(always)]
fn prefetch_ahead(p: *const u8, pf: usize) {
    if pf != 0 {
        // SAFETY: a prefetch never faults and changes no program state;
        // `wrapping_add` forms the address without claiming it is in bounds
        // (past the last tile it points beyond the weights).
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(
                p.wrapping_add(pf) as *const i8,
            )
        }
    }
}

/// How far ahead the bandwidth probe (`read_sum`) asks for lines.  A plain
/// summing loop leaves it to the hardware prefetcher and reads 10-15% less
/// than the decode tiles manage with their own prefetch; the probe is the
/// limit they are measured against, so it streams as well as they do (4 KiB
/// to 16 KiB ahead all read the same here).
const PROBE_AHEAD: usize = 4096;

/// 64-byte aligned table for the int3 high-plane expansion.
#[repr(align(64))]
pub(crate) struct Table64(pub [u8; 64]);

/// Per 128-bit lane, position j takes high-plane byte j / 2.
pub(crate) static T3_HI_IDX: Table64 = Table64({
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = ((i % 16) / 2) as u8;
        i += 1;
    }
    t
});

/// Lane f, position j: the bit of element 4j + f in its byte, 4(j%2) + f.
pub(crate) static T3_HI_BITS: Table64 = Table64({
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let (f, j) = (i / 16, i % 16);
        t[i] = 1 << (4 * (j % 2) + f);
        i += 1;
    }
    t
});

/// The AVX2+FMA kernel set, if this CPU supports it.
pub(crate) fn avx2_kernels() -> Option<KernelSet> {
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Some(KernelSet {
            name: "avx2",
            dot_f32,
            axpy_f32: avx2_axpy_f32,
            axpy_i8: avx2_axpy_i8,
            dot_i8: avx2_dot_i8,
            dot_u4: avx2_dot_u4,
            dot_i2: avx2_dot_i2,
            row_i4g64: avx2_row_i4g64,
            row_i3g64: avx2_row_i3g64,
            amax: avx2_amax,
            quant_i8: avx2_quant_i8,
            read_sum: avx2_read_sum,
            dot_i8_tile: Some(avx2_dot_i8_tile),
            dot_u4_tile: Some(avx2_dot_u4_tile),
            dot_i2_tile: None,
            row_i4g64_tile: None,
            row_i3g64_tile: None,
            dot_f32_gather: None,
            dot_f32_gather4: Some(avx2_dot_f32_gather4),
            dot_f32_cols: None,
            dot_f32_cols4: None,
            axpy_f32_gather: None,
            axpy_f32_gather4: Some(avx2_axpy_f32_gather4),
            axpy_i8_rows: None,
            gemm_i8: Some(avx2_gemm::<false>),
            gemm_u4: Some(avx2_gemm::<true>),
            gemm_i4g64: None,
            gemm_i3g64: None,
        })
    } else {
        None
    }
}

/// The AVX-512 kernel set: `vnni` (F, BW, VL, VNNI) or `bw` (F, BW, VL);
/// both also need AVX2+FMA.
/// A VNNI CPU with GFNI and AVX-512 VBMI (Ice Lake and later) gets the int3-g64 decode rows
/// of `avx512/int3_vbmi.rs`.
pub(crate) fn avx512_kernels(vnni: bool) -> Option<KernelSet> {
    let with_vbmi = is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("gfni");
    avx512_sets(vnni).map(|k| {
        if vnni && with_vbmi {
            with_int3_vbmi(k)
        } else {
            k
        }
    })
}

/// The VNNI set with `avx512/int3_vbmi.rs`'s int3-g64 decode rows in place of `int3.rs`'s
/// (the same bits, fewer instructions a group). Only for a CPU that has GFNI and VBMI.
fn with_int3_vbmi(k: KernelSet) -> KernelSet {
    KernelSet {
        row_i3g64: vbmi_row_i3g64,
        row_i3g64_tile: Some(vbmi_row_i3g64_tile),
        ..k
    }
}

/// The VNNI set without the GFNI/VBMI int3 rows, where this CPU would get them: the tests
/// compare `int3.rs`'s VNNI kernels to the portable ones too.
#[cfg(test)]
pub(crate) fn avx512vnni_without_vbmi() -> Option<KernelSet> {
    let with_vbmi = is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("gfni");
    avx512_sets(true).filter(|_| with_vbmi).map(|k| KernelSet {
        name: "avx512vnni-without-vbmi",
        ..k
    })
}

/// [`avx512_kernels`] before the GFNI/VBMI choice.
fn avx512_sets(vnni: bool) -> Option<KernelSet> {
    let base = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    if !base {
        return None;
    }
    if vnni {
        is_x86_feature_detected!("avx512vnni").then_some(KernelSet {
            name: "avx512vnni",
            dot_f32: avx512_dot_f32,
            axpy_f32: avx512_axpy_f32,
            axpy_i8: avx512_axpy_i8,
            dot_i8: vnni_dot_i8,
            dot_u4: vnni_dot_u4,
            dot_i2: vnni_dot_i2,
            row_i4g64: vnni_row_i4g64,
            row_i3g64: vnni_row_i3g64,
            amax: avx512_amax,
            quant_i8: avx512_quant_i8,
            read_sum: avx512_read_sum,
            dot_i8_tile: Some(vnni_dot_i8_tile),
            dot_u4_tile: Some(vnni_dot_u4_tile),
            dot_i2_tile: Some(vnni_dot_i2_tile),
            row_i4g64_tile: Some(vnni_row_i4g64_tile),
            row_i3g64_tile: Some(vnni_row_i3g64_tile),
            dot_f32_gather: Some(avx512_dot_f32_gather),
            dot_f32_gather4: Some(avx512_dot_f32_gather4),
            dot_f32_cols: Some(avx512_dot_f32_cols),
            dot_f32_cols4: Some(avx512_dot_f32_cols4),
            axpy_f32_gather: Some(avx512_axpy_f32_gather),
            axpy_f32_gather4: Some(avx512_axpy_f32_gather4),
            axpy_i8_rows: Some(avx512_axpy_i8_rows),
            gemm_i8: Some(vnni_gemm_i8),
            gemm_u4: Some(vnni_gemm_u4),
            gemm_i4g64: Some(vnni_gemm_i4g64),
            gemm_i3g64: Some(vnni_gemm_i3g64),
        })
    } else {
        Some(KernelSet {
            name: "avx512bw",
            dot_f32: avx512_dot_f32,
            axpy_f32: avx512_axpy_f32,
            axpy_i8: avx512_axpy_i8,
            dot_i8: bw_dot_i8,
            dot_u4: bw_dot_u4,
            dot_i2: bw_dot_i2,
            row_i4g64: bw_row_i4g64,
            row_i3g64: bw_row_i3g64,
            amax: avx512_amax,
            quant_i8: avx512_quant_i8,
            read_sum: avx512_read_sum,
            dot_i8_tile: Some(bw_dot_i8_tile),
            dot_u4_tile: Some(bw_dot_u4_tile),
            dot_i2_tile: Some(bw_dot_i2_tile),
            row_i4g64_tile: Some(bw_row_i4g64_tile),
            row_i3g64_tile: Some(bw_row_i3g64_tile),
            dot_f32_gather: Some(avx512_dot_f32_gather),
            dot_f32_gather4: Some(avx512_dot_f32_gather4),
            dot_f32_cols: Some(avx512_dot_f32_cols),
            dot_f32_cols4: Some(avx512_dot_f32_cols4),
            axpy_f32_gather: Some(avx512_axpy_f32_gather),
            axpy_f32_gather4: Some(avx512_axpy_f32_gather4),
            axpy_i8_rows: Some(avx512_axpy_i8_rows),
            gemm_i8: Some(bw_gemm_i8),
            gemm_u4: Some(bw_gemm_u4),
            gemm_i4g64: Some(bw_gemm_i4g64),
            gemm_i3g64: Some(bw_gemm_i3g64),
        })
    }
}

/// Length checks of a tile: `nr` rows of `rb` bytes, `np` positions `xs`
/// apart each needing `need` elements, `nr * np` outputs.
fn check_tile(w: usize, rb: usize, nr: usize, x: usize, xs: usize, np: usize, need: usize) {
    assert!(nr > 0 && np > 0 && w >= nr * rb, "tile weights too short");
    assert!(np == 1 || xs >= need, "tile positions overlap");
    assert!(x >= (np - 1) * xs + need, "tile activations too short");
}

/// Length checks shared by the grouped kernels: `x` padded to whole
/// activation blocks, one sum and one scale per group.
fn check_grouped(x: &[i8], xg: &[i32], s: &[f32], elems: usize) {
    let groups = s.len();
    assert!(xg.len() >= groups, "group sums shorter than scales");
    assert!(x.len() >= elems.div_ceil(ACT_BLOCK) * ACT_BLOCK);
}

/// Stamp out the safe wrappers of one kernel module.
macro_rules! wrappers {
    ($m:path, $dot_i8:ident, $dot_u4:ident, $dot_i2:ident, $row_i4g64:ident, $row_i3g64:ident) => {
        fn $dot_i2(w: &[u8], x: &[i8]) -> i32 {
            assert!(x.len() >= w.len().div_ceil(64) * 2 * ACT_BLOCK);
            use $m as k;
            // SAFETY: features detected; `x` holds the whole split2-layout
            // blocks the `w.len()` bytes meet (asserted).
            unsafe { k::dot_i2(w.as_ptr(), x.as_ptr(), w.len()) }
        }

        fn $dot_i8(w: &[i8], x: &[i8]) -> i32 {
            assert!(x.len() >= w.len());
            use $m as k;
            // SAFETY: features detected; `x` holds `w.len()` (asserted).
            unsafe { k::dot_i8(w.as_ptr(), x.as_ptr(), w.len()) }
        }

        fn $dot_u4(w: &[u8], x: &[i8]) -> i32 {
            assert!(x.len() >= w.len().div_ceil(64) * ACT_BLOCK);
            use $m as k;
            // SAFETY: features detected; `x` holds the whole split-layout
            // blocks the `w.len()` bytes meet (asserted).
            unsafe { k::dot_u4(w.as_ptr(), x.as_ptr(), w.len()) }
        }

        fn $row_i4g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
            assert_eq!(w.len().div_ceil(GROUP / 2), s.len());
            check_grouped(x, xg, s, 2 * w.len());
            use $m as k;
            // SAFETY: features detected; `w` is a whole row of `s.len()`
            // groups, `x` covers its blocks, `xg` and `s` one per group.
            unsafe {
                k::row_i4g64(
                    w.as_ptr(),
                    w.len(),
                    x.as_ptr(),
                    xg.as_ptr(),
                    s.as_ptr(),
                    s.len(),
                )
            }
        }

        fn $row_i3g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
            assert!(w.len() >= s.len() * I3_GROUP_BYTES);
            check_grouped(x, xg, s, s.len() * GROUP);
            use $m as k;
            // SAFETY: features detected; `w` holds `s.len()` 24-byte groups,
            // `x` 64 per group, `xg` and `s` one per group (asserted).
            unsafe { k::row_i3g64(w.as_ptr(), x.as_ptr(), xg.as_ptr(), s.as_ptr(), s.len()) }
        }
    };
}

wrappers!(
    avx2,
    avx2_dot_i8,
    avx2_dot_u4,
    avx2_dot_i2,
    avx2_row_i4g64,
    avx2_row_i3g64
);
wrappers!(
    avx512::vnni,
    vnni_dot_i8,
    vnni_dot_u4,
    vnni_dot_i2,
    vnni_row_i4g64,
    vnni_row_i3g64
);
wrappers!(
    avx512::bw,
    bw_dot_i8,
    bw_dot_u4,
    bw_dot_i2,
    bw_row_i4g64,
    bw_row_i3g64
);

/// AVX2 int8 tiles: `(4, 1)` and `(1, 4)` kernels (16 ymm registers: no
/// `4 x 4`), `(nr, 4)` as `nr` `(1, 4)` tiles, others one output at a time.
#[allow(clippy::too_many_arguments)]
fn avx2_dot_i8_tile(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xsum: &[i32],
    pf: usize,
    out: &mut [i32],
) {
    check_tile(w.len(), rb, nr, x.len(), xs, np, rb);
    assert!(out.len() >= nr * np && xsum.len() >= np);
    let (w, x, o) = (w.as_ptr() as *const i8, x.as_ptr(), out.as_mut_ptr());
    // SAFETY: features detected (avx2); `w` holds `nr` rows of `rb`, `x`
    // `np` positions of `rb` elements `xs` apart, `out` `nr * np`
    // (asserted); every call stays within them.
    unsafe {
        match (nr, np) {
            (4, 1) => avx2::dot_i8_tile::<4, 1>(w, rb, x, xs, rb, pf, o),
            (_, 4) => {
                for r in 0..nr {
                    avx2::dot_i8_tile::<1, 4>(w.add(r * rb), rb, x, xs, rb, 0, o.add(4 * r));
                }
            }
            _ => {
                for r in 0..nr {
                    for p in 0..np {
                        let (wr, xp) = (w.add(r * rb), x.add(p * xs));
                        avx2::dot_i8_tile::<1, 1>(wr, rb, xp, xs, rb, 0, o.add(r * np + p));
                    }
                }
            }
        }
    }
}

/// AVX2 int4 tiles, shapes as [`avx2_dot_i8_tile`].
#[allow(clippy::too_many_arguments)]
fn avx2_dot_u4_tile(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    _xsum: &[i32],
    pf: usize,
    out: &mut [i32],
) {
    let need = rb.div_ceil(64) * ACT_BLOCK;
    check_tile(w.len(), rb, nr, x.len(), xs, np, need);
    assert!(out.len() >= nr * np);
    let (w, x, o) = (w.as_ptr(), x.as_ptr(), out.as_mut_ptr());
    // SAFETY: features detected (avx2); `w` holds `nr` rows of `rb`, `x`
    // `np` positions of the split-layout blocks of `rb` bytes, `xs` apart,
    // `out` `nr * np` (asserted).
    unsafe {
        match (nr, np) {
            (4, 1) => avx2::dot_u4_tile::<4, 1>(w, rb, rb, x, xs, pf, o),
            (_, 4) => {
                for r in 0..nr {
                    avx2::dot_u4_tile::<1, 4>(w.add(r * rb), rb, rb, x, xs, 0, o.add(4 * r));
                }
            }
            _ => {
                for r in 0..nr {
                    for p in 0..np {
                        let (wr, xp) = (w.add(r * rb), x.add(p * xs));
                        avx2::dot_u4_tile::<1, 1>(wr, rb, rb, xp, xs, 0, o.add(r * np + p));
                    }
                }
            }
        }
    }
}

/// A safe tile wrapper over a packed-weight integer tile kernel (`dot_u4_tile`: one 32-byte
/// activation block per 64 weights, split layout; `dot_i2_tile`: two, split2 layout) of one
/// AVX-512 build; shapes as [`tile_wrappers`]'s.
macro_rules! packed_tile_wrapper {
    ($name:ident, $m:path, $kernel:ident, $blocks:expr) => {
        #[allow(clippy::too_many_arguments)]
        fn $name(
            w: &[u8],
            rb: usize,
            nr: usize,
            x: &[i8],
            xs: usize,
            np: usize,
            _xsum: &[i32],
            pf: usize,
            out: &mut [i32],
        ) {
            let need = rb.div_ceil(64) * $blocks * ACT_BLOCK;
            check_tile(w.len(), rb, nr, x.len(), xs, np, need);
            assert!(out.len() >= nr * np);
            use $m as k;
            let (w, x, o) = (w.as_ptr(), x.as_ptr(), out.as_mut_ptr());
            // SAFETY: features detected; `w` holds `nr` rows of `rb`, `x`
            // `np` positions of the layout's blocks of `rb` bytes, `xs`
            // apart, `out` `nr * np` (asserted).
            unsafe {
                match (nr, np) {
                    (4, 1) => k::$kernel::<4, 1>(w, rb, rb, x, xs, pf, o),
                    (1, 4) => k::$kernel::<1, 4>(w, rb, rb, x, xs, 0, o),
                    (4, 4) => k::$kernel::<4, 4>(w, rb, rb, x, xs, 0, o),
                    _ => {
                        for r in 0..nr {
                            for p in 0..np {
                                let (wr, xp) = (w.add(r * rb), x.add(p * xs));
                                k::$kernel::<1, 1>(wr, rb, rb, xp, xs, 0, o.add(r * np + p));
                            }
                        }
                    }
                }
            }
        }
    };
}

/// Stamp out the safe tile wrappers of one AVX-512 build: `(4, 1)`,
/// `(1, 4)` and `(4, 4)` tiles go to the multi-output
/// kernels, other shapes to `(1, 1)` tiles one output at a time.
macro_rules! tile_wrappers {
    (
        $m:path,
        $i8_tile:ident,
        $u4_tile:ident,
        $i2_tile:ident,
        $g64_tile:ident,
        $i3_tile:ident
    ) => {
        packed_tile_wrapper!($i2_tile, $m, dot_i2_tile, 2);

        #[allow(clippy::too_many_arguments)]
        fn $i3_tile(
            w: &[u8],
            rb: usize,
            nr: usize,
            x: &[i8],
            xs: usize,
            np: usize,
            xg: &[i32],
            xgs: usize,
            s: &[f32],
            spr: usize,
            pf: usize,
            out: &mut [f32],
        ) {
            assert_eq!(rb, spr * I3_GROUP_BYTES, "one scale per 24-byte group");
            check_tile(w.len(), rb, nr, x.len(), xs, np, spr * GROUP);
            assert!(np == 1 || xgs >= spr);
            assert!(xg.len() >= (np - 1) * xgs + spr, "group sums too short");
            assert!(s.len() >= nr * spr, "scales too short");
            assert!(out.len() >= nr * np);
            use $m as k;
            let (w, x, o) = (w.as_ptr(), x.as_ptr(), out.as_mut_ptr());
            let (xg, s) = (xg.as_ptr(), s.as_ptr());
            // SAFETY: features detected; `w` holds `nr` rows of `spr`
            // groups, `x` `np` positions of `64 * spr` elements `xs` apart,
            // `xg` `np` runs of `spr` sums `xgs` apart, `s` `nr` runs of
            // `spr`, `out` `nr * np` (asserted).
            unsafe {
                match (nr, np) {
                    (4, 1) => k::row_i3g64_tile::<4, 1>(w, rb, x, xs, xg, xgs, s, spr, spr, pf, o),
                    (1, 4) => k::row_i3g64_tile::<1, 4>(w, rb, x, xs, xg, xgs, s, spr, spr, 0, o),
                    (4, 4) => k::row_i3g64_tile::<4, 4>(w, rb, x, xs, xg, xgs, s, spr, spr, 0, o),
                    _ => {
                        for r in 0..nr {
                            for p in 0..np {
                                k::row_i3g64_tile::<1, 1>(
                                    w.add(r * rb),
                                    rb,
                                    x.add(p * xs),
                                    xs,
                                    xg.add(p * xgs),
                                    xgs,
                                    s.add(r * spr),
                                    spr,
                                    spr,
                                    0,
                                    o.add(r * np + p),
                                );
                            }
                        }
                    }
                }
            }
        }

        #[allow(clippy::too_many_arguments)]
        fn $i8_tile(
            w: &[u8],
            rb: usize,
            nr: usize,
            x: &[i8],
            xs: usize,
            np: usize,
            xsum: &[i32],
            pf: usize,
            out: &mut [i32],
        ) {
            check_tile(w.len(), rb, nr, x.len(), xs, np, rb);
            assert!(out.len() >= nr * np && xsum.len() >= np);
            use $m as k;
            let (w, x, o) = (w.as_ptr() as *const i8, x.as_ptr(), out.as_mut_ptr());
            let xsum = xsum.as_ptr();
            // SAFETY: features detected; `w` holds `nr` rows of `rb`, `x`
            // `np` positions of `rb` elements `xs` apart, `xsum` `np` and
            // `out` `nr * np` (asserted); every call stays within them.
            unsafe {
                match (nr, np) {
                    (4, 1) => k::dot_i8_tile::<4, 1>(w, rb, x, xs, xsum, rb, pf, o),
                    (1, 4) => k::dot_i8_tile::<1, 4>(w, rb, x, xs, xsum, rb, 0, o),
                    (4, 4) => k::dot_i8_tile::<4, 4>(w, rb, x, xs, xsum, rb, 0, o),
                    _ => {
                        for r in 0..nr {
                            for p in 0..np {
                                let (wr, xp) = (w.add(r * rb), x.add(p * xs));
                                let o = o.add(r * np + p);
                                k::dot_i8_tile::<1, 1>(wr, rb, xp, xs, xsum.add(p), rb, 0, o);
                            }
                        }
                    }
                }
            }
        }

        packed_tile_wrapper!($u4_tile, $m, dot_u4_tile, 1);

        #[allow(clippy::too_many_arguments)]
        fn $g64_tile(
            w: &[u8],
            rb: usize,
            nr: usize,
            x: &[i8],
            xs: usize,
            np: usize,
            xg: &[i32],
            xgs: usize,
            s: &[f32],
            spr: usize,
            pf: usize,
            out: &mut [f32],
        ) {
            let need = rb.div_ceil(64) * ACT_BLOCK;
            check_tile(w.len(), rb, nr, x.len(), xs, np, need);
            assert_eq!(rb.div_ceil(GROUP / 2), spr, "one scale per group");
            assert!(np == 1 || xgs >= spr);
            assert!(xg.len() >= (np - 1) * xgs + spr, "group sums too short");
            assert!(s.len() >= nr * spr, "scales too short");
            assert!(out.len() >= nr * np);
            use $m as k;
            let (w, x, o) = (w.as_ptr(), x.as_ptr(), out.as_mut_ptr());
            let (xg, s) = (xg.as_ptr(), s.as_ptr());
            // SAFETY: features detected; `w` holds `nr` rows of `rb`, `x`
            // `np` positions covering their blocks `xs` apart, `xg` `np`
            // runs of `spr` sums `xgs` apart, `s` `nr` runs of `spr`, `out`
            // `nr * np` (asserted).
            unsafe {
                match (nr, np) {
                    (4, 1) => {
                        k::row_i4g64_tile::<4, 1>(w, rb, rb, x, xs, xg, xgs, s, spr, spr, pf, o)
                    }
                    (1, 4) => {
                        k::row_i4g64_tile::<1, 4>(w, rb, rb, x, xs, xg, xgs, s, spr, spr, 0, o)
                    }
                    (4, 4) => k::row_i4g64_big::<4, 4>(w, rb, rb, x, xs, xg, xgs, s, spr, spr, o),
                    _ => {
                        for r in 0..nr {
                            for p in 0..np {
                                k::row_i4g64_tile::<1, 1>(
                                    w.add(r * rb),
                                    rb,
                                    rb,
                                    x.add(p * xs),
                                    xs,
                                    xg.add(p * xgs),
                                    xgs,
                                    s.add(r * spr),
                                    spr,
                                    spr,
                                    0,
                                    o.add(r * np + p),
                                );
                            }
                        }
                    }
                }
            }
        }
    };
}

/// int3-g64 row with GFNI and VBMI (see `avx512/int3_vbmi.rs`), as `vnni_row_i3g64`.
fn vbmi_row_i3g64(w: &[u8], x: &[i8], xg: &[i32], s: &[f32]) -> f32 {
    assert!(w.len() >= s.len() * I3_GROUP_BYTES);
    check_grouped(x, xg, s, s.len() * GROUP);
    let mut out = 0f32;
    let groups = s.len();
    // SAFETY: features detected (the set takes this kernel only with GFNI and VBMI); `w`
    // holds `groups` 24-byte groups, `x` 64 per group, `xg` and `s` one per group
    // (asserted); one row, no prefetch, so the row stride is never used.
    unsafe {
        avx512::int3_vbmi::row_i3g64_rows::<1>(
            w.as_ptr(),
            groups * I3_GROUP_BYTES,
            x.as_ptr(),
            xg.as_ptr(),
            s.as_ptr(),
            groups,
            groups,
            0,
            &mut out,
        )
    };
    out
}

/// int3-g64 tiles with GFNI and VBMI: decode's `(4, 1)` with `avx512/int3_vbmi.rs`, every
/// other shape (prefill's, which the GEMM takes before the tiles) with the VNNI tiles.
#[allow(clippy::too_many_arguments)]
fn vbmi_row_i3g64_tile(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xg: &[i32],
    xgs: usize,
    s: &[f32],
    spr: usize,
    pf: usize,
    out: &mut [f32],
) {
    if (nr, np) != (4, 1) {
        return vnni_row_i3g64_tile(w, rb, nr, x, xs, np, xg, xgs, s, spr, pf, out);
    }
    assert_eq!(rb, spr * I3_GROUP_BYTES, "one scale per 24-byte group");
    check_tile(w.len(), rb, nr, x.len(), xs, np, spr * GROUP);
    assert!(xg.len() >= spr, "group sums too short");
    assert!(s.len() >= nr * spr, "scales too short");
    assert!(out.len() >= nr);
    // SAFETY: features detected (as above); `w` holds 4 rows of `spr` groups, `x` the
    // position's `64 * spr` elements, `xg` its `spr` sums, `s` 4 runs of `spr`, `out` 4
    // (asserted).
    unsafe {
        avx512::int3_vbmi::row_i3g64_rows::<4>(
            w.as_ptr(),
            rb,
            x.as_ptr(),
            xg.as_ptr(),
            s.as_ptr(),
            spr,
            spr,
            pf,
            out.as_mut_ptr(),
        )
    }
}

tile_wrappers!(
    avx512::vnni,
    vnni_dot_i8_tile,
    vnni_dot_u4_tile,
    vnni_dot_i2_tile,
    vnni_row_i4g64_tile,
    vnni_row_i3g64_tile
);
tile_wrappers!(
    avx512::bw,
    bw_dot_i8_tile,
    bw_dot_u4_tile,
    bw_dot_i2_tile,
    bw_row_i4g64_tile,
    bw_row_i3g64_tile
);
