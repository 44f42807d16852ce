//! The multi-position (prefill) products of the grouped formats (int4-g64, int3-g64) without a
//! horizontal sum per group, in two builds from one source like `avx512.rs`: `vnni`
//! (`vpdpbusd`) and `bw` (`vpmaddubsw` + `vpmaddwd`).
//!
//! A 64-byte block of packed int4 holds two 64-groups, so its `vpdpbusd` leaves each group's
//! sum spread over 8 lanes, and the single-row kernels spend as many instructions folding
//! those lanes together (`reduce16`) as on the products themselves, for every row and
//! position.  Here a chunk of 8 blocks (16 groups) of a row is transposed once, by dwords,
//! so that vector `k` holds the `k`-th dword of every group: lane `L` is group `L`'s.  The
//! activations come in the same transposed order ([`act::ActBuf::xt`], built once per call),
//! so sixteen `vpdpbusd` (eight dwords, two nibble planes) leave group `L`'s exact sum whole
//! in lane `L`, with no folding.  Tiles of up to 4 rows x 4 positions keep their 16 sums in
//! registers, so each weight vector is loaded once for 4 positions and each activation
//! vector once for 4 rows; the transpose and unpack (56 instructions a row and chunk) are paid
//! once and shared by all the positions of the call.  int3-g64 takes the same tiles: its 16
//! groups of a chunk are unpacked (`u3_group`: 16 dwords each, in the int3 activation order)
//! and transposed 16 x 16, and its activations are transposed to match.
//!
//! The float end is `avx512.rs`'s own `accumulate16` and `reduce_f32` on the same exact group
//! sums, so every output is the single kernel's (`row_i4g64`, `row_i3g64`), bit for bit.
//!
//! # Safety (all functions)
//! Callers must have verified at run time that the CPU supports every feature in the build's
//! `target_feature` list (see `x86/mod.rs`) and that the pointers are valid for the counts
//! stated on [`Operands`].  Weight tails are masked loads; activations are read in
//! whole chunks of the zero padded transposed buffer.
//!
//! [`act::ActBuf::xt`]: super::super::act::ActBuf::xt

/// `vpermt2d` indices of the transpose's three stages (see `transpose8`), by the output they
/// make.
const STAGE1: [[i32; 16]; 2] = [join(4, 0), join(4, 1)];
const STAGE2: [[i32; 16]; 2] = [join(8, 0), join(8, 1)];
const STAGE3: [[i32; 16]; 2] = [join(16, 0), join(16, 1)];

/// One stage of the chunk's `[group][dword]` transpose: two inputs of `m / 2` rows each (the
/// first input the upper rows) into output `out` of `m` rows, stored by column (lane `m c +
/// r`), its columns `out * 16 / m ..` of the inputs'.  Stage 1 (`m = 4`) reads the loaded
/// blocks, stored by row (2 rows of 8 dwords); the later stages read earlier outputs.
const fn join(m: usize, out: usize) -> [i32; 16] {
    let half = m / 2;
    let mut t = [0; 16];
    let mut l = 0;
    while l < 16 {
        let (col, row) = (out * (16 / m) + l / m, l % m);
        let (src, r) = if row < half {
            (0, row)
        } else {
            (16, row - half)
        };
        let lane = if m == 4 { 8 * r + col } else { half * col + r };
        t[l] = (src + lane) as i32;
        l += 1;
    }
    t
}

/// What a call reads: rows of `nb` packed bytes, `rb` apart at `w`, their scales `spr` a row
/// at `s` (`groups` of them used); each position's transposed activations (`xts` bytes
/// apart at `xt`, `1024 * ceil(groups / 16)` each, zero padded) and group sums (`xgs` apart
/// at `xg`).
#[derive(Clone, Copy)]
pub(super) struct Operands {
    w: *const u8,
    rb: usize,
    nb: usize,
    xt: *const i8,
    xts: usize,
    xg: *const i32,
    xgs: usize,
    s: *const f32,
    spr: usize,
    groups: usize,
}

/// Positions a row's accumulators are kept for at once (on the stack, 64 bytes each).
const POS_BLOCK: usize = 16;

macro_rules! g64_kernels {
    ($features:literal, $dp:path, $acc16:path, $reduce:path, $u3:path, $load:path) => {
        use core::arch::x86_64::*;

        use super::super::prefetch_ahead;
        use super::{Operands, POS_BLOCK, STAGE1, STAGE2, STAGE3};

        /// The `[group][dword]` matrix of a chunk (block `b` holds groups `2b`, `2b+1`, one
        /// per 256-bit half) transposed: output `k`, lane `L` = dword `k` of group `L`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn transpose8(v: &[__m512i; 8]) -> [__m512i; 8] {
            let idx = |t: &[i32; 16]| _mm512_loadu_si512(t.as_ptr() as *const _);
            let (s1, s2, s3) = (
                [idx(&STAGE1[0]), idx(&STAGE1[1])],
                [idx(&STAGE2[0]), idx(&STAGE2[1])],
                [idx(&STAGE3[0]), idx(&STAGE3[1])],
            );
            let zero = _mm512_setzero_si512();
            // a[2i + h]: rows 4i..4i+4, dwords 4h..4h+4.
            let mut a = [zero; 8];
            for i in 0..4 {
                for h in 0..2 {
                    a[2 * i + h] = _mm512_permutex2var_epi32(v[2 * i], s1[h], v[2 * i + 1]);
                }
            }
            // b[4j + 2h + c]: rows 8j..8j+8, dwords 4h+2c, 4h+2c+1.
            let mut b = [zero; 8];
            for j in 0..2 {
                for h in 0..2 {
                    for c in 0..2 {
                        b[4 * j + 2 * h + c] =
                            _mm512_permutex2var_epi32(a[4 * j + h], s2[c], a[4 * j + 2 + h]);
                    }
                }
            }
            let mut t = [zero; 8];
            for h in 0..2 {
                for c in 0..2 {
                    for cc in 0..2 {
                        t[4 * h + 2 * c + cc] =
                            _mm512_permutex2var_epi32(b[2 * h + c], s3[cc], b[4 + 2 * h + c]);
                    }
                }
            }
            t
        }

        /// A chunk (8 blocks, 16 groups) of `R` rows, transposed and unpacked into `ws`:
        /// `ws[r][2 k + h]` is nibble plane `h` of dword `k` of every group of row `r`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn prepare<const R: usize>(
            w: *const u8,
            rb: usize,
            nb: usize,
            b: usize,
            ws: &mut [[__m512i; 16]; 4],
        ) {
            let nblocks = nb.div_ceil(64);
            let mask = _mm512_set1_epi8(0x0F);
            let zero = _mm512_setzero_si512();
            for (r, wr) in ws.iter_mut().enumerate().take(R) {
                let mut v = [zero; 8];
                for (k, vk) in v.iter_mut().enumerate().take(nblocks - b) {
                    let o = 64 * (b + k);
                    let at = w.add(r * rb + o);
                    // The same line of the next `R` rows: they come next, and from memory
                    // (a prefill meets each expert's weights once), so they are asked for
                    // one row block ahead, as the decode tiles ask for theirs.
                    prefetch_ahead(at, R * rb);
                    *vk = $load(at as *const i8, nb - o);
                }
                let t = transpose8(&v);
                for k in 0..8 {
                    wr[2 * k] = _mm512_and_si512(t[k], mask);
                    wr[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(t[k]), mask);
                }
            }
        }

        /// Sixteen vectors of 16 dwords transposed: output `m`, lane `L` = input `L`, lane
        /// `m` (dwords within 128-bit lanes, then 64-bit pairs, then the 128-bit lanes).
        /// Not the AMX panels' two-source permute transpose (`quant/transpose_avx512.rs`):
        /// through it, cast to f32 lanes and back, the int3 GEMM measured 5-16% slower at 16
        /// positions (`bench_prefill_matmul`, both builds, three alternated pairs).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn transpose16(v: &[__m512i; 16]) -> [__m512i; 16] {
            let zero = _mm512_setzero_si512();
            let mut t = [zero; 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
            }
            // u[4i + c], 128-bit lane q: dword 4q + c of inputs 4i..4i+4.
            let mut u = [zero; 16];
            for i in 0..4 {
                let (a, b) = (4 * i, 4 * i + 2);
                u[4 * i] = _mm512_unpacklo_epi64(t[a], t[b]);
                u[4 * i + 1] = _mm512_unpackhi_epi64(t[a], t[b]);
                u[4 * i + 2] = _mm512_unpacklo_epi64(t[a + 1], t[b + 1]);
                u[4 * i + 3] = _mm512_unpackhi_epi64(t[a + 1], t[b + 1]);
            }
            let mut o = [zero; 16];
            for c in 0..4 {
                let a0 = _mm512_shuffle_i32x4::<0x44>(u[c], u[4 + c]);
                let a1 = _mm512_shuffle_i32x4::<0xEE>(u[c], u[4 + c]);
                let b0 = _mm512_shuffle_i32x4::<0x44>(u[8 + c], u[12 + c]);
                let b1 = _mm512_shuffle_i32x4::<0xEE>(u[8 + c], u[12 + c]);
                o[c] = _mm512_shuffle_i32x4::<0x88>(a0, b0);
                o[4 + c] = _mm512_shuffle_i32x4::<0xDD>(a0, b0);
                o[8 + c] = _mm512_shuffle_i32x4::<0x88>(a1, b1);
                o[12 + c] = _mm512_shuffle_i32x4::<0xDD>(a1, b1);
            }
            o
        }

        /// Groups `g0..g0 + 16` of `R` int3 rows unpacked (`u3_group`: 64 fields in the
        /// int3 activation layout, 16 dwords a group) and transposed into `ws`: `ws[r][m]`
        /// is dword `m` of every group of row `r`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn prepare3<const R: usize>(
            w: *const u8,
            rb: usize,
            groups: usize,
            g0: usize,
            ws: &mut [[__m512i; 16]; 4],
        ) {
            let zero = _mm512_setzero_si512();
            for (r, wr) in ws.iter_mut().enumerate().take(R) {
                let mut d = [zero; 16];
                for (i, di) in d.iter_mut().enumerate().take(groups - g0) {
                    let at = w.add(r * rb + 24 * (g0 + i));
                    // As in `prepare`: the next row block's bytes, one line a line.
                    if i % 8 == 0 {
                        prefetch_ahead(at, R * rb);
                    }
                    *di = $u3(at);
                }
                *wr = transpose16(&d);
            }
        }

        /// `R` prepared rows x `P` positions (transposed activations of this chunk `xts`
        /// apart at `xc`): the 16 exact group sums of each, every weight vector loaded once
        /// for the `P` positions and every activation vector once for the `R` rows, all
        /// `R * P` sums in registers.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn group_sums<const R: usize, const P: usize>(
            ws: &[[__m512i; 16]; 4],
            xc: *const i8,
            xts: usize,
        ) -> [[__m512i; P]; R] {
            let mut g = [[_mm512_setzero_si512(); P]; R];
            for j in 0..16 {
                // Vector j: dword j / 2, nibble plane j % 2 (see `prepare`).
                let mut xv = [_mm512_setzero_si512(); P];
                for (p, xp) in xv.iter_mut().enumerate() {
                    *xp = _mm512_loadu_si512(xc.add(p * xts + 64 * j) as *const _);
                }
                for (gr, wr) in g.iter_mut().zip(ws) {
                    for (gp, &xp) in gr.iter_mut().zip(&xv) {
                        *gp = $dp(*gp, wr[j], xp);
                    }
                }
            }
            g
        }

        /// Positions `p..p + P` of chunk `g0` (its transposed activations at `xc`) into the
        /// rows' float accumulators.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn tile<const R: usize, const P: usize, const I3: bool>(
            ws: &[[__m512i; 16]; 4],
            o: &Operands,
            (xc, g0): (*const i8, usize),
            acc: &mut [[__m512; POS_BLOCK]; 4],
            p: usize,
        ) {
            let gi = group_sums::<R, P>(ws, xc.add(p * o.xts), o.xts);
            // The stored fields are offset by 8 (int4) or 4 (int3).
            let shift = if I3 { 2 } else { 3 };
            for (r, (gr, ar)) in gi.iter().zip(acc.iter_mut()).enumerate() {
                for (q, &gq) in gr.iter().enumerate() {
                    let a = &mut ar[p + q];
                    let xg = o.xg.add((p + q) * o.xgs + g0);
                    *a = $acc16(*a, gq, shift, xg, o.s.add(r * o.spr + g0), o.groups - g0);
                }
            }
        }

        /// `R` rows of `o` at its first `np` positions into `out` (`out_stride` apart a row):
        /// each chunk is prepared once and meets every position, `P` at a time; each output
        /// keeps its own float accumulator in the shared order.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn rows_block<const R: usize, const I3: bool>(
            o: &Operands,
            np: usize,
            (out, out_stride): (*mut f32, usize),
            (ws, acc): (&mut [[__m512i; 16]; 4], &mut [[__m512; POS_BLOCK]; 4]),
        ) {
            // The caller's scratch, zeroed here only where used: a fresh array a call cost
            // a memset of 8 KB for every 4 rows.
            for ar in acc.iter_mut().take(R) {
                ar[..np].fill(_mm512_setzero_ps());
            }
            // Chunks of 16 groups: 8 int4 blocks, or 16 int3 groups.
            let mut g0 = 0;
            while g0 < o.groups {
                if I3 {
                    prepare3::<R>(o.w, o.rb, o.groups, g0, ws);
                } else {
                    prepare::<R>(o.w, o.rb, o.nb, g0 / 2, ws);
                }
                // The chunk's transposed activations: 1024 bytes a position.
                let c = (o.xt.add(64 * g0), g0);
                let mut p = 0;
                while p + 4 <= np {
                    tile::<R, 4, I3>(ws, o, c, acc, p);
                    p += 4;
                }
                match np - p {
                    3 => tile::<R, 3, I3>(ws, o, c, acc, p),
                    2 => tile::<R, 2, I3>(ws, o, c, acc, p),
                    1 => tile::<R, 1, I3>(ws, o, c, acc, p),
                    _ => {}
                }
                g0 += 16;
            }
            for (r, ar) in acc.iter().enumerate().take(R) {
                for (p, &ap) in ar.iter().enumerate().take(np) {
                    *out.add(r * out_stride + p) = $reduce(ap);
                }
            }
        }

        /// `nr` rows of `o` (int4-g64, or int3-g64 with `I3`) x `np` positions: `out[r * np +
        /// p]` is `row_i4g64` (`row_i3g64`) of row `r` and position `p`, bit for bit.
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn g64_rows<const I3: bool>(
            o: Operands,
            nr: usize,
            np: usize,
            out: *mut f32,
        ) {
            let mut ws = [[_mm512_setzero_si512(); 16]; 4];
            let mut acc = [[_mm512_setzero_ps(); POS_BLOCK]; 4];
            let mut p0 = 0;
            while p0 < np {
                let pn = (np - p0).min(POS_BLOCK);
                let mut r = 0;
                while r < nr {
                    // Rows r.. at positions p0..
                    let block = Operands {
                        w: o.w.add(r * o.rb),
                        s: o.s.add(r * o.spr),
                        xt: o.xt.add(p0 * o.xts),
                        xg: o.xg.add(p0 * o.xgs),
                        ..o
                    };
                    let dst = (out.add(r * np + p0), np);
                    let sc = (&mut ws, &mut acc);
                    let done = (nr - r).min(4);
                    match done {
                        1 => rows_block::<1, I3>(&block, pn, dst, sc),
                        2 => rows_block::<2, I3>(&block, pn, dst, sc),
                        3 => rows_block::<3, I3>(&block, pn, dst, sc),
                        _ => rows_block::<4, I3>(&block, pn, dst, sc),
                    }
                    r += done;
                }
                p0 += pn;
            }
        }
    };
}

/// The VNNI build.
pub(super) mod vnni {
    g64_kernels!(
        "avx512f,avx512bw,avx512vl,avx512vnni",
        super::super::gemm_vnni::dp_vnni,
        super::super::avx512::vnni::accumulate16,
        super::super::avx512::vnni::reduce_f32,
        super::super::avx512::vnni::u3_group,
        super::super::avx512::vnni::load64
    );
}

/// The AVX-512BW build.
pub(super) mod bw {
    g64_kernels!(
        "avx512f,avx512bw,avx512vl",
        super::super::gemm_vnni::dp_bw,
        super::super::avx512::bw::accumulate16,
        super::super::avx512::bw::reduce_f32,
        super::super::avx512::bw::u3_group,
        super::super::avx512::bw::load64
    );
}

macro_rules! g64_wrapper {
    ($name:ident, $m:path, $i3:literal) => {
        /// See [`KernelSet::gemm_i4g64`](super::super::KernelSet) (`gemm_i3g64`): bounds
        /// checked, then the kernel of this build.
        #[allow(clippy::too_many_arguments)]
        pub(super) fn $name(
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
        ) {
            if nr == 0 || np == 0 {
                return;
            }
            let groups = if $i3 {
                assert_eq!(rb % 24, 0, "int3 rows are whole 24-byte groups");
                rb / 24
            } else {
                rb.div_ceil(32)
            };
            let chunk = 1024 * groups.div_ceil(16);
            assert!(w.len() >= nr * rb, "weights too short");
            assert!(np == 1 || xts >= chunk, "transposed activations overlap");
            assert!(
                xt.len() >= (np - 1) * xts + chunk,
                "transposed activations too short"
            );
            assert_eq!(groups, spr, "one scale per group");
            assert!(np == 1 || xgs >= spr, "group sums overlap");
            assert!(xg.len() >= (np - 1) * xgs + spr, "group sums too short");
            assert!(s.len() >= nr * spr, "scales too short");
            assert!(out.len() >= nr * np, "output too short");
            use $m as k;
            // SAFETY: this function is only reachable through a kernel set built after its
            // features were detected (`avx512_kernels`); every pointer covers the counts
            // `g64_rows` reads (asserted above).
            unsafe {
                let o = Operands {
                    w: w.as_ptr(),
                    rb,
                    nb: rb,
                    xt: xt.as_ptr(),
                    xts,
                    xg: xg.as_ptr(),
                    xgs,
                    s: s.as_ptr(),
                    spr,
                    groups,
                };
                k::g64_rows::<$i3>(o, nr, np, out.as_mut_ptr())
            }
        }
    };
}

g64_wrapper!(vnni_gemm_i4g64, vnni, false);
g64_wrapper!(bw_gemm_i4g64, bw, false);
g64_wrapper!(vnni_gemm_i3g64, vnni, true);
g64_wrapper!(bw_gemm_i3g64, bw, true);
