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
//! `kpanel.rs`'s VNNI one is used.
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
use std::sync::OnceLock;

use super::kpanel::{self, q4_k_runs, q5_k_runs, Acts};
use super::rows::NextRows;
use super::x86::{f16_one, f16_pair, k4_scales_mins, q6_k_half};
use super::{PanelFn, Q8Row};
use crate::gguf::GgmlType;

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

/// Whether the tiles can be used: not turned off (`COLI_AMX=0`: the VNNI panel, the same
/// bits), CPUID's AMX-TILE and AMX-INT8, the OS's XSAVE support of the tile state (XCR0 bits
/// 17 and 18), and Linux's grant of it to this process (asked once; without it the first tile
/// instruction faults).
pub(super) fn amx_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        if std::env::var("COLI_AMX").is_ok_and(|v| v.trim() == "0") {
            return false;
        }
        if !super::x86::has_panel_features() || !is_x86_feature_detected!("xsave") {
            return false;
        }
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx & (1 << 24) != 0, leaf7.edx & (1 << 25) != 0);
        if !tile || !int8 {
            return false;
        }
        // SAFETY: XSAVE is present (checked), so `xgetbv` with ECX = 0 is defined.
        let xcr0 = unsafe { _xgetbv(0) };
        if xcr0 & (3 << 17) != 3 << 17 {
            return false;
        }
        request_tile_state()
    })
}

/// Linux's `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: 0 where granted.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the system call only changes which XSAVE state this process may use; it reads
    // and writes no memory of ours, and clobbers only rax (its result), rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// Weight rows a tile product (A's and C's rows).
const R: usize = 16;
/// Positions a group: C's columns, B's sixteen 4-byte words a row.
const P: usize = 16;
/// Sixteens of rows a pass over the activations: each group's block of activations (4 KiB)
/// serves this many tile products while in L1 (one pass a sixteen streamed all of a block's
/// activations, 128 KiB at 512 positions, from L2 for every sixteen rows).
const SETS: usize = 2;
/// 4-input steps a 256-block.
const STEPS: usize = 64;
/// Bytes a tile row, and the stride of every tile load and store here.
const ROW: usize = 64;

/// `ldtilecfg`'s 64-byte operand (palette 1): every tile used here is 16 rows of 64 bytes.
#[repr(C, align(64))]
pub(super) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    reserved_end: [u8; 16],
}

impl TileConfig {
    pub(super) fn all_16x64() -> TileConfig {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
            reserved_end: [0; 16],
        };
        for t in 0..8 {
            c.colsb[t] = ROW as u16;
            c.rows[t] = 16;
        }
        c
    }
}

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

/// Two groups' tile sums, as stored: `[group][hi, lo][row][position]`.
#[repr(C, align(64))]
struct Sums([[[[i32; P]; R]; 2]; 2]);

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

/// [`tile_pair`]'s body with the tile product instruction `$op`.
macro_rules! tile_pair_with {
    ($op:literal, $u:expr, $b0:expr, $b1:expr, $c:expr) => {
        // tmm0..3: C of (group 0, hi), (0, lo), (1, hi), (1, lo); tmm4/5: A hi/lo; tmm6/7: B
        // of groups 0/1. Chunk k of `hi`/`lo` is at 1024 k bytes, of a group's steps also at
        // 1024 k. Every tile load reads 16 rows of 64 bytes at a 64-byte stride from the
        // start of `u.hi[k]`, `u.lo[k]` or 16 steps of `b0`/`b1` (4 KiB each, 1 KiB a chunk),
        // and every store writes 16 rows of 64 bytes into `c` (4 KiB, 1 KiB a tile): all in
        // bounds.
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tileloadd tmm4, [{ah} + {s}]",
            "tileloadd tmm5, [{al} + {s}]",
            "tileloadd tmm6, [{b0} + {s}]",
            "tileloadd tmm7, [{b1} + {s}]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tileloadd tmm4, [{ah} + {s} + 1024]",
            "tileloadd tmm5, [{al} + {s} + 1024]",
            "tileloadd tmm6, [{b0} + {s} + 1024]",
            "tileloadd tmm7, [{b1} + {s} + 1024]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tileloadd tmm4, [{ah} + {s} + 2048]",
            "tileloadd tmm5, [{al} + {s} + 2048]",
            "tileloadd tmm6, [{b0} + {s} + 2048]",
            "tileloadd tmm7, [{b1} + {s} + 2048]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tileloadd tmm4, [{ah} + {s} + 3072]",
            "tileloadd tmm5, [{al} + {s} + 3072]",
            "tileloadd tmm6, [{b0} + {s} + 3072]",
            "tileloadd tmm7, [{b1} + {s} + 3072]",
            concat!($op, " tmm0, tmm4, tmm6"),
            concat!($op, " tmm1, tmm5, tmm6"),
            concat!($op, " tmm2, tmm4, tmm7"),
            concat!($op, " tmm3, tmm5, tmm7"),
            "tilestored [{c} + {s}], tmm0",
            "tilestored [{c} + {s} + 1024], tmm1",
            "tilestored [{c} + {s} + 2048], tmm2",
            "tilestored [{c} + {s} + 3072], tmm3",
            ah = in(reg) $u.hi.as_ptr(),
            al = in(reg) $u.lo.as_ptr(),
            b0 = in(reg) $b0.as_ptr(),
            b1 = in(reg) $b1.as_ptr(),
            c = in(reg) $c.0.as_mut_ptr(),
            s = in(reg) ROW,
            options(nostack, preserves_flags),
        )
    };
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

/// The Q4_K, Q5_K or Q6_K panel (`KIND`, `bb` bytes a block): rows sixteen at a
/// time (a last partial sixteen repeats its last row and drops those outputs), each block
/// unpacked once and run against every pair of position groups (a last single group is
/// paired with itself and its copy dropped; positions past the last are zero activations
/// whose outputs are not written).
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
                            if KIND == Q6 {
                                tile_pair_signed(u, steps(g0), steps(g1), c)
                            } else {
                                tile_pair(u, steps(g0), steps(g1), c)
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

/// `v` transposed in place: element `c` of row `r` becomes element `r` of row `c` (four
/// stages, each exchanging one bit of the row and column numbers by two-source permutes);
/// `iqpanel_amx`'s `write_out` shares it. Plain index loops with constant bounds, taken by
/// reference, so that it is inlined into its caller and unrolled there with `v` in registers.
/// As an iterator over the pairs of a by-value array it was not: stages 2 to 4 ran as loops
/// over the array on the stack, each permute waiting on the store of the stage before
/// (`write_out` was about a third of the time of the tile products it writes out).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn transpose16(v: &mut [__m512; 16]) {
    for s in 0..4 {
        let b = 1 << s;
        let mut lo = [0i32; 16];
        let mut hi = [0i32; 16];
        for c in 0..16 {
            // Element `c` of the low row of a pair: its own where bit `s` of `c` is clear,
            // else the high row's `c - b`; of the high row: the low row's `c + b`, or its own.
            (lo[c], hi[c]) = if c & b == 0 {
                (c as i32, (c + b) as i32)
            } else {
                ((16 + c - b) as i32, (16 + c) as i32)
            };
        }
        // SAFETY: `lo` and `hi` are 16 readable i32 each; the loads are unaligned.
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_si512(lo.as_ptr() as *const _),
                _mm512_loadu_si512(hi.as_ptr() as *const _),
            )
        };
        for i in 0..16 {
            if i & b == 0 {
                let (x, y) = (v[i], v[i + b]);
                v[i] = _mm512_permutex2var_ps(x, lo, y);
                v[i + b] = _mm512_permutex2var_ps(x, hi, y);
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
