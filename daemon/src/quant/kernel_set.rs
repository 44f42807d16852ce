//! The table of inner kernels and which one runs.  Every product goes through a [`KernelSet`]
//! of function pointers, chosen once at run time, so the matmul code above it is written once
//! and the portable set stays the reference each SIMD set is tested against.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
use super::aarch64;
use super::scalar;
#[cfg(target_arch = "x86_64")]
use super::x86;

/// One set of inner kernels.  Integer kernels return exact i32 sums; the
/// grouped-row kernels return the row sum before the activation scale in
/// the shared float order (see `scalar.rs`).  Activation slices are int8 in
/// `[-127, 127]`, zero padded to whole 128-element blocks, in the format's
/// `act::Layout`.
#[derive(Clone, Copy)]
pub struct KernelSet {
    pub(super) name: &'static str,
    /// f32 dot over `min(a.len(), b.len())` elements.
    pub(super) dot_f32: fn(&[f32], &[f32]) -> f32,
    /// `acc[i] += c * x[i]` over `min(acc.len(), x.len())` elements (fused
    /// where the CPU has FMA).
    pub(super) axpy_f32: fn(&mut [f32], f32, &[f32]),
    /// As `axpy_f32` with int8 `x` (widened exactly to f32 first).
    pub(super) axpy_i8: fn(&mut [f32], f32, &[i8]),
    /// int8 x int8 over `w.len()` elements (natural layout).
    pub(super) dot_i8: fn(&[i8], &[i8]) -> i32,
    /// `sum u x`: packed int4 bytes (`u` the stored nibble) x split layout.
    pub(super) dot_u4: fn(&[u8], &[i8]) -> i32,
    /// `sum u x`: packed int2 row (`u` the stored field) x split2 layout.
    pub(super) dot_i2: fn(&[u8], &[i8]) -> i32,
    /// int4-g64 row (split-layout x).
    pub(super) row_i4g64: GroupedRowFn,
    /// int3-g64 row (int3-layout x).
    pub(super) row_i3g64: GroupedRowFn,
    /// Largest `|v|` (NaN skipped): `scalar::amax`, any order.
    pub(super) amax: fn(&[f32]) -> f32,
    /// f32 -> int8 in natural order, exactly as `scalar::quant_i8`.
    pub(super) quant_i8: fn(&[f32], f32, &mut [i8]),
    /// Wrapping sum of the buffer as little-endian u64 lanes (any order):
    /// the memory-read probe, with the widest loads the kernels use.
    pub(super) read_sum: fn(&[u8]) -> u64,
    /// Tiles of several rows or positions per call (`None`: the single
    /// kernels above, one call per output).  Each output of a tile equals
    /// the single kernel's result bit for bit.
    pub(super) dot_i8_tile: Option<IntTileFn>,
    /// As `dot_i8_tile` for `dot_u4` (int4 per row).
    pub(super) dot_u4_tile: Option<IntTileFn>,
    /// As `dot_i8_tile` for `dot_i2` (int2 per row).
    pub(super) dot_i2_tile: Option<IntTileFn>,
    /// As `dot_i8_tile` for `row_i4g64`.
    pub(super) row_i4g64_tile: Option<GroupedTileFn>,
    /// As `dot_i8_tile` for `row_i3g64`.
    pub(super) row_i3g64_tile: Option<GroupedTileFn>,
    /// `out[i] = dot_f32(q, row(keys[i]))`, rows `stride` apart in `base`, several keys per
    /// pass over `q` (`None`: one `dot_f32` a key).  Bit-identical to `dot_f32` per key.
    pub(super) dot_f32_gather: Option<DotGatherFn>,
    /// Four queries against the same gathered rows (four attention heads scoring the same
    /// cached latents): `outs[h][i] = dot_f32(qs[h], row(keys[i]))`, a tile of four queries by
    /// four rows per pass so each loaded vector serves four products (`None`: four
    /// `dot_f32_gather`s).  Bit-identical to `dot_f32` per query and key.
    pub(super) dot_f32_gather4: Option<DotGather4Fn>,
    /// `out[t] = dot_f32(q, key t)` for `t < out.len()`, the keys stored by column (element
    /// `e` of key `t` at `kt[e * ld + t]`), sixteen keys per vector with no horizontal sums
    /// (`None`: callers keep the keys by row and use `dot_f32_gather`).  Bit-identical to
    /// `dot_f32` per key.
    pub(super) dot_f32_cols: Option<DotColsFn>,
    /// Four `dot_f32_cols` of queries of one length against the same keys, each column of
    /// keys loaded once for the four (a prefill's heads scoring a chunk's keys; `None`: four
    /// `dot_f32_cols`).  Bit-identical to `dot_f32` per query and key.
    pub(super) dot_f32_cols4: Option<DotCols4Fn>,
    /// `axpy_f32(acc, coefs[i], row(keys[i]))` for every `i` in order, the accumulator held in
    /// registers across keys (`None`: one `axpy_f32` a key).  Bit-identical to that loop.
    pub(super) axpy_f32_gather: Option<AxpyGatherFn>,
    /// Four `axpy_f32_gather`s over the same rows, each accumulator (at most 64 elements, all
    /// the same length) with its own coefficients, every row loaded once for the four
    /// (`None`: four calls).  Bit-identical to the four calls.
    pub(super) axpy_f32_gather4: Option<AxpyGather4Fn>,
    /// `axpy_i8(acc, coefs[j], rows[j * stride..][..acc.len()])` for `j` in order over
    /// `coefs.len()` int8 rows, the accumulator held in registers across rows (`None`: one
    /// `axpy_i8` a row).  Bit-identical to that loop.
    pub(super) axpy_i8_rows: Option<AxpyRowsI8Fn>,
    /// Register-blocked multi-position tile of int8-per-row weights (`None`: the tiles above
    /// and the single kernels): finished outputs, bit-identical to the single kernel and
    /// `QMatrix::finish_i8`.
    pub(super) gemm_i8: Option<GemmFn>,
    /// As `gemm_i8` for int4 per row.
    pub(super) gemm_u4: Option<GemmFn>,
    /// int4-g64 rows at several positions, the activations in the transposed order of
    /// [`ActBuf::xt`](super::act::ActBuf::xt): `out[r * np + p]` is `row_i4g64` of row `r`
    /// and position `p` bit for bit (`None`: the tiles and single kernels).
    pub(super) gemm_i4g64: Option<G64GemmFn>,
    /// As `gemm_i4g64` for int3-g64 (`row_i3g64`).
    pub(super) gemm_i3g64: Option<G64GemmFn>,
}

/// `(w, rb, nr, xt, xts, np, xg, xgs, s, spr, out)`: `nr` rows of `rb` bytes at `w` (scales
/// `spr` a row at `s`) x `np` positions (transposed activations `xts` apart at `xt`, group
/// sums `xgs` apart at `xg`); see [`KernelSet::gemm_i4g64`].
#[allow(clippy::type_complexity)]
pub(super) type G64GemmFn = fn(
    w: &[u8],
    rb: usize,
    nr: usize,
    xt: &[i8],
    xts: usize,
    np: usize,
    xg: &[i32],
    xgs: usize,
    s: &[f32],
    spr: usize,
    out: &mut [f32],
);

/// A GEMM tile of a per-row format: `out[p * nr + r] = (i as f32) * (sx[p] * ws[r])` where
/// `i` is the exact integer dot of weight row `r` (`nr` rows of `rb` bytes back to back in
/// `w`) and position `p` (`np` activation rows `xs` apart in `x`), less the format's offset
/// times `xsum[p]` (the position's activation sum); `nr`, `np` in `1..=4`.  `pf`: weight bytes
/// to prefetch ahead of each line read (0: none).
#[allow(clippy::type_complexity)]
pub(super) type GemmFn = fn(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xsum: &[i32],
    sx: &[f32],
    ws: &[f32],
    pf: usize,
    out: &mut [f32],
);

/// `(acc, coefs, rows, stride)`: see [`KernelSet::axpy_i8_rows`].
type AxpyRowsI8Fn = fn(&mut [f32], &[f32], &[i8], usize);

/// `(q, base, stride, keys, out)`: see [`KernelSet::dot_f32_gather`]; a row is
/// `base[key * stride..][..q.len()]`.
type DotGatherFn = fn(&[f32], &[f32], usize, &[usize], &mut [f32]);

/// `(q, kt, ld, out)`: see [`KernelSet::dot_f32_cols`].
type DotColsFn = fn(&[f32], &[f32], usize, &mut [f32]);

/// `(qs, kt, ld, outs)`: see [`KernelSet::dot_f32_cols4`].
type DotCols4Fn = fn([&[f32]; 4], &[f32], usize, [&mut [f32]; 4]);

/// `(qs, base, stride, keys, outs)`: see [`KernelSet::dot_f32_gather4`].
type DotGather4Fn = fn([&[f32]; 4], &[f32], usize, &[usize], [&mut [f32]; 4]);

/// `(acc, coefs, base, stride, keys)`: see [`KernelSet::axpy_f32_gather`]; a row is
/// `base[key * stride..][..acc.len()]`.
type AxpyGatherFn = fn(&mut [f32], &[f32], &[f32], usize, &[usize]);

/// `(accs, coefs, base, stride, keys)`: see [`KernelSet::axpy_f32_gather4`].
type AxpyGather4Fn = fn([&mut [f32]; 4], [&[f32]; 4], &[f32], usize, &[usize]);

/// An integer tile: `out[r * np + p]` = the single kernel of weight row `r`
/// (`nr` rows of `rb` bytes, back to back in `w`) and position `p` (`np`
/// activation rows `xs` apart in `x`).  Shapes `(4, 1)` and `(1, 4)` are
/// the fast ones; any other falls back to one output at a time.  `xsum[p]`
/// is the exact sum of position `p`'s activations (the int8 kernels may
/// use it to multiply offset weights `w + 128`).  `pf`: how far ahead of
/// each weight line to prefetch, a whole number of tiles (`nr * rb`) or 0;
/// only the `(4, 1)` decode tile, which streams its rows from memory, takes
/// it (a hint: it moves time, never results).
type IntTileFn = fn(
    w: &[u8],
    rb: usize,
    nr: usize,
    x: &[i8],
    xs: usize,
    np: usize,
    xsum: &[i32],
    pf: usize,
    out: &mut [i32],
);

/// A grouped-format tile, as [`IntTileFn`]: position `p`'s group sums at
/// `xg[p * xgs..]`, row `r`'s scales at `s[r * spr..]` (`spr` groups).
#[allow(clippy::type_complexity)]
type GroupedTileFn = fn(
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
);

/// A grouped-format row kernel: (packed row, activations in the format's
/// layout, per-group activation sums, group scales) -> the row's sum before
/// the activation scale, in the shared float order.
type GroupedRowFn = fn(&[u8], &[i8], &[i32], &[f32]) -> f32;

static PORTABLE: KernelSet = KernelSet {
    name: "portable",
    dot_f32: scalar::dot_f32,
    axpy_f32: scalar::axpy_f32,
    axpy_i8: scalar::axpy_i8,
    dot_i8: scalar::dot_i8,
    dot_u4: scalar::dot_u4,
    dot_i2: scalar::dot_i2,
    row_i4g64: scalar::row_i4g64,
    row_i3g64: scalar::row_i3g64,
    amax: scalar::amax,
    quant_i8: scalar::quant_i8,
    read_sum: scalar::read_sum,
    dot_i8_tile: None,
    dot_u4_tile: None,
    dot_i2_tile: None,
    row_i4g64_tile: None,
    row_i3g64_tile: None,
    dot_f32_gather: None,
    dot_f32_gather4: None,
    dot_f32_cols: None,
    dot_f32_cols4: None,
    axpy_f32_gather: None,
    axpy_f32_gather4: None,
    axpy_i8_rows: None,
    gemm_i8: None,
    gemm_u4: None,
    gemm_i4g64: None,
    gemm_i3g64: None,
};

static DETECTED: OnceLock<KernelSet> = OnceLock::new();
static FORCE_PORTABLE: AtomicBool = AtomicBool::new(false);

impl KernelSet {
    /// The multi-position GEMM of a grouped format (`gemm_i4g64`, `gemm_i3g64`), if this set
    /// has one; `None` for every other format.
    pub(super) fn grouped_gemm(&self, fmt: super::QFormat) -> Option<G64GemmFn> {
        match fmt {
            super::QFormat::I4G64 => self.gemm_i4g64,
            super::QFormat::I3G64 => self.gemm_i3g64,
            _ => None,
        }
    }

    /// The portable scalar kernels (always available; the reference).
    pub fn portable() -> &'static KernelSet {
        &PORTABLE
    }

    /// The AVX2+FMA kernels, if this CPU supports them.
    pub fn avx2() -> Option<&'static KernelSet> {
        x86_set(X86Set::Avx2)
    }

    /// The AVX-512BW kernels (no VNNI), if this CPU supports them.
    pub fn avx512bw() -> Option<&'static KernelSet> {
        x86_set(X86Set::Avx512Bw)
    }

    /// The AVX-512 VNNI kernels, if this CPU supports them.
    pub fn avx512vnni() -> Option<&'static KernelSet> {
        x86_set(X86Set::Avx512Vnni)
    }

    /// The NEON kernels (every aarch64 CPU has NEON).
    pub fn neon() -> Option<&'static KernelSet> {
        #[cfg(target_arch = "aarch64")]
        {
            Some(&aarch64::NEON)
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            None
        }
    }

    /// Every kernel set this CPU can run, best first (the portable one last).
    pub fn available() -> Vec<&'static KernelSet> {
        [
            KernelSet::avx512vnni(),
            KernelSet::avx512bw(),
            KernelSet::avx2(),
            KernelSet::neon(),
            Some(KernelSet::portable()),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// The best kernels for this CPU (detected once): the first of
    /// [`KernelSet::available`].
    pub fn detected() -> &'static KernelSet {
        DETECTED.get_or_init(|| *KernelSet::available()[0])
    }

    /// The kernels [`QMatrix::matmul`](super::QMatrix::matmul) uses now: [`KernelSet::detected`]
    /// unless [`set_force_portable`] is on.
    pub fn active() -> &'static KernelSet {
        if FORCE_PORTABLE.load(Ordering::Relaxed) {
            &PORTABLE
        } else {
            KernelSet::detected()
        }
    }

    /// "avx512vnni", "avx512bw", "avx2", "neon" or "portable".
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Wrapping sum of `buf` read as u64 lanes, with this set's widest
    /// loads (the memory-read bandwidth probe).
    pub fn read_sum(&self, buf: &[u8]) -> u64 {
        (self.read_sum)(buf)
    }
}

/// The x86-64 kernel sets, each detected once.
#[derive(Clone, Copy)]
enum X86Set {
    Avx2,
    Avx512Bw,
    Avx512Vnni,
}

#[cfg(target_arch = "x86_64")]
fn x86_set(which: X86Set) -> Option<&'static KernelSet> {
    static SETS: [OnceLock<Option<KernelSet>>; 3] = [const { OnceLock::new() }; 3];
    SETS[which as usize]
        .get_or_init(|| match which {
            X86Set::Avx2 => x86::avx2_kernels(),
            X86Set::Avx512Bw => x86::avx512_kernels(false),
            X86Set::Avx512Vnni => x86::avx512_kernels(true),
        })
        .as_ref()
}

#[cfg(not(target_arch = "x86_64"))]
fn x86_set(_: X86Set) -> Option<&'static KernelSet> {
    None
}

impl fmt::Debug for KernelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelSet({})", self.name)
    }
}

/// `sum a[i] * b[i]` over the shorter length, with the active kernels' f32 dot.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    (KernelSet::active().dot_f32)(a, b)
}

/// `acc[i] += c * x[i]` over the shorter length, with the active kernels.
pub fn axpy_f32(acc: &mut [f32], c: f32, x: &[f32]) {
    (KernelSet::active().axpy_f32)(acc, c, x)
}

/// `out[i] = dot_f32(q, base[keys[i] * stride..][..q.len()])` with the active kernels: the
/// attention scores of one query against many cached keys. Panics if a row runs past `base`
/// or `out` is shorter than `keys`.
pub fn dot_f32_gather(q: &[f32], base: &[f32], stride: usize, keys: &[usize], out: &mut [f32]) {
    let k = KernelSet::active();
    assert!(
        out.len() >= keys.len(),
        "dot_f32_gather: out shorter than keys"
    );
    match k.dot_f32_gather {
        Some(f) => f(q, base, stride, keys, out),
        None => {
            for (o, &t) in out.iter_mut().zip(keys) {
                *o = (k.dot_f32)(q, &base[t * stride..][..q.len()]);
            }
        }
    }
}

/// Whether the active kernels score keys stored by column ([`dot_f32_cols`]) natively; where
/// not, attention keeps its keys by row and scores them with [`dot_f32_gather`].
pub fn has_dot_f32_cols() -> bool {
    KernelSet::active().dot_f32_cols.is_some()
}

/// Whether the active kernels score four queries against keys stored by column
/// ([`dot_f32_cols4`]) natively.
pub fn has_dot_f32_cols4() -> bool {
    KernelSet::active().dot_f32_cols4.is_some()
}

/// `out[t] = dot_f32(q, key t)` for `t < out.len()`, with key `t`'s element `e` at
/// `kt[e * ld + t]` (keys stored by column), with the active kernels: the same bits as one
/// `dot_f32` a key.  Panics if `kt` is too short for `q.len()` rows of `ld` or `out` is wider
/// than `ld`.
pub fn dot_f32_cols(q: &[f32], kt: &[f32], ld: usize, out: &mut [f32]) {
    let k = KernelSet::active();
    check_cols(q.len(), kt.len(), ld, out.len());
    match k.dot_f32_cols {
        Some(f) => f(q, kt, ld, out),
        None => super::act::with_row_scratch(q.len(), |col| {
            for (t, o) in out.iter_mut().enumerate() {
                for (e, c) in col.iter_mut().enumerate() {
                    *c = kt[e * ld + t];
                }
                *o = (k.dot_f32)(q, col);
            }
        }),
    }
}

/// Four [`dot_f32_cols`] of queries of one length against the same keys, `outs` all of one
/// length (the keys), with the active kernels: the same bits as the four calls.  Panics as
/// those would, or if the queries' or the outputs' lengths differ.
pub fn dot_f32_cols4(qs: [&[f32]; 4], kt: &[f32], ld: usize, outs: [&mut [f32]; 4]) {
    let k = KernelSet::active();
    let (n, m) = (qs[0].len(), outs[0].len());
    assert!(
        qs.iter().all(|q| q.len() == n) && outs.iter().all(|o| o.len() == m),
        "dot_f32_cols4: queries or outputs of different lengths"
    );
    check_cols(n, kt.len(), ld, m);
    match k.dot_f32_cols4 {
        Some(f) => f(qs, kt, ld, outs),
        None => {
            for (q, out) in qs.into_iter().zip(outs) {
                dot_f32_cols(q, kt, ld, out);
            }
        }
    }
}

/// Panics unless `n` rows of `ld` floats hold `m` columns inside `kt_len` elements.
pub(super) fn check_cols(n: usize, kt_len: usize, ld: usize, m: usize) {
    assert!(m <= ld, "dot_f32_cols: {m} keys wider than the stride {ld}");
    let end = n.checked_sub(1).map_or(Some(0), |r| {
        r.checked_mul(ld).and_then(|o| o.checked_add(m))
    });
    assert!(
        m == 0 || end.is_some_and(|e| e <= kt_len),
        "dot_f32_cols: {n} rows of {ld} past the end of {kt_len}"
    );
}

/// Four [`dot_f32_gather`]s of queries of one length against the same `keys` (four attention
/// heads scoring the same cached rows), with the active kernels: the same bits as the four
/// calls. Panics as those would, or if the queries' lengths differ.
pub fn dot_f32_gather4(
    qs: [&[f32]; 4],
    base: &[f32],
    stride: usize,
    keys: &[usize],
    outs: [&mut [f32]; 4],
) {
    let k = KernelSet::active();
    let n = qs[0].len();
    assert!(
        qs.iter().all(|q| q.len() == n),
        "dot_f32_gather4: queries of different lengths"
    );
    assert!(
        outs.iter().all(|o| o.len() >= keys.len()),
        "dot_f32_gather4: an output shorter than keys"
    );
    match k.dot_f32_gather4 {
        Some(f) => f(qs, base, stride, keys, outs),
        None => {
            for (q, out) in qs.into_iter().zip(outs) {
                dot_f32_gather(q, base, stride, keys, out);
            }
        }
    }
}

/// `axpy_f32(acc, coefs[i], base[keys[i] * stride..][..acc.len()])` for each key in order,
/// with the active kernels (the same bits as that loop): attention's probability-weighted sum
/// of cached values. Panics if a row runs past `base` or `coefs` is shorter than `keys`.
pub fn axpy_f32_gather(
    acc: &mut [f32],
    coefs: &[f32],
    base: &[f32],
    stride: usize,
    keys: &[usize],
) {
    let k = KernelSet::active();
    assert!(
        coefs.len() >= keys.len(),
        "axpy_f32_gather: coefs shorter than keys"
    );
    match k.axpy_f32_gather {
        Some(f) => f(acc, coefs, base, stride, keys),
        None => {
            for (&c, &t) in coefs.iter().zip(keys) {
                (k.axpy_f32)(acc, c, &base[t * stride..][..acc.len()]);
            }
        }
    }
}

/// Four [`axpy_f32_gather`]s over the same `keys`, one per accumulator with its own
/// coefficients (four attention heads summing a stripe of the same cached rows), with the
/// active kernels: the same bits as the four calls. Panics as those would, or if the
/// accumulators' lengths differ.
pub fn axpy_f32_gather4(
    accs: [&mut [f32]; 4],
    coefs: [&[f32]; 4],
    base: &[f32],
    stride: usize,
    keys: &[usize],
) {
    let k = KernelSet::active();
    let n = accs[0].len();
    assert!(
        accs.iter().all(|a| a.len() == n),
        "axpy_f32_gather4: accumulators of different lengths"
    );
    assert!(
        coefs.iter().all(|c| c.len() >= keys.len()),
        "axpy_f32_gather4: coefs shorter than keys"
    );
    match k.axpy_f32_gather4 {
        // The kernel keeps four accumulators of up to 64 elements in registers: longer ones
        // go through it a stripe at a time (each element's sums are its own, in key order).
        Some(f) if !keys.is_empty() => {
            let mut accs = accs;
            for s0 in (0..n).step_by(64) {
                let e = (s0 + 64).min(n);
                let stripe = accs.each_mut().map(|a| &mut a[s0..e]);
                f(stripe, coefs, base.get(s0..).unwrap_or(&[]), stride, keys);
            }
        }
        _ => {
            for (acc, c) in accs.into_iter().zip(coefs) {
                axpy_f32_gather(acc, c, base, stride, keys);
            }
        }
    }
}

/// Every gathered row `base[key * stride..][..n]` lies inside `base` (the invariant the SIMD
/// gather kernels read under).
pub(super) fn check_gather(n: usize, base_len: usize, stride: usize, keys: &[usize]) {
    // Rows start further on as keys grow: the largest key's row ends last. (One pass for the
    // maximum, not a checked product per key: attention calls this for every chunk of keys.)
    let Some(t) = keys.iter().copied().max() else {
        return;
    };
    let end = t.checked_mul(stride).and_then(|o| o.checked_add(n));
    assert!(
        end.is_some_and(|e| e <= base_len),
        "gather: row {t} (stride {stride}, {n} wide) past the end of {base_len}"
    );
}

/// Name of the kernels in use (see [`KernelSet::name`]).
pub fn kernel_name() -> &'static str {
    KernelSet::active().name
}

/// Force the portable kernels for all later matmuls (e.g. a CLI switch or
/// a debugging aid).  Tests should prefer the `*_with` methods.
pub fn set_force_portable(on: bool) {
    FORCE_PORTABLE.store(on, Ordering::Relaxed);
}
