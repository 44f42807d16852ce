//! The 16 x 16 transpose of f32 lanes that both AMX panels use to turn a group's sixteen
//! rows of outputs into its positions' sixteen rows each (`ggml::kpanel_amx`,
//! `ggml::iqpanel_amx`). The int3-g64 GEMM keeps its own unpack-and-shuffle transpose of
//! dwords (`x86/gemm_g64.rs`): through this one it measured slower.
//!
//! It is written with plain index loops and taken by `&mut` so that it is inlined and the
//! array stays in registers: the panels' by-value version called across modules was not
//! inlined, and each call copied the array twice. Its only feature is AVX-512F, a subset of
//! every caller's list, which lets LLVM inline it into each of them.

use std::arch::x86_64::*;

/// `v` transposed in place: element `c` of row `r` becomes element `r` of row `c`. Four
/// stages, each exchanging one bit of the row and column numbers by two-source permutes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose16(v: &mut [__m512; 16]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every lane lands where a transpose puts it, its bits untouched: the 256 lanes are
    /// distinct bit patterns, NaN payloads and negative denormals among them, so a lane moved
    /// to a wrong place or a float operation on the way (quieting a NaN, flushing a
    /// denormal) shows.
    #[test]
    fn transpose16_moves_every_lane_and_keeps_its_bits() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let bits = |r: usize, c: usize| 0x7F80_0001u32 + (r * 16 + c) as u32 * 0x1_0001;
        let m: [[u32; 16]; 16] = std::array::from_fn(|r| std::array::from_fn(|c| bits(r, c)));
        let mut want = [[0u32; 16]; 16];
        for (r, row) in m.iter().enumerate() {
            for (c, &x) in row.iter().enumerate() {
                want[c][r] = x;
            }
        }
        let store = |v: &[__m512; 16]| -> [[u32; 16]; 16] {
            let mut out = [[0u32; 16]; 16];
            for (o, x) in out.iter_mut().zip(v) {
                // SAFETY: `o` is 16 writable u32; avx512f was detected above; unaligned store.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr() as *mut f32, *x) };
            }
            out
        };
        // SAFETY: avx512f was detected above; each row of `m` is 16 readable u32 (f32 bits).
        let mut v: [__m512; 16] =
            std::array::from_fn(|r| unsafe { _mm512_loadu_ps(m[r].as_ptr() as *const f32) });
        // SAFETY: avx512f was detected above.
        unsafe { transpose16(&mut v) };
        assert_eq!(store(&v), want);
        // Twice is the identity.
        // SAFETY: avx512f was detected above.
        unsafe { transpose16(&mut v) };
        assert_eq!(store(&v), m);
    }
}
