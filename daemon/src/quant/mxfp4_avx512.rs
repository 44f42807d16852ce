//! The MXFP4 dot with AVX-512 (F, with VL's 256-bit forms), four rows at a time: sixteen
//! values a vector, their codes shifted out of eight bytes and looked up, sign included, in
//! the sixteen-entry e2m1 table by one permute. Each row keeps [`super::mxfp4::dot_row`]'s
//! order exactly (eight lanes, a product then a sum, the group's values 0..8 then 8..16 and
//! so on), so every output is the reference's bit for bit; the four rows' chains of sums run
//! side by side, which is what hides the adds' latency (one row alone is bound by it: its
//! sums are one chain).

use std::arch::x86_64::*;

use super::mxfp4::{E2M1, GROUP, GROUP_BYTES};

/// Whether the kernels here may run: the features they enable, detected.
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl")
}

/// `out[i] = dot_row(blocks[i], scales[i], x)` for `N` rows of `x.len() / 32` groups each
/// (four at a time in the matmul; one for the rows a block of four leaves over). Panics (a
/// caller's bug) without the features or when a row is shorter than `x`.
pub fn dot<const N: usize>(blocks: [&[u8]; N], scales: [&[f32]; N], x: &[f32]) -> [f32; N] {
    let groups = x.len() / GROUP;
    assert!(available(), "mxfp4 AVX-512 kernel without AVX-512F/VL");
    for (b, s) in blocks.iter().zip(&scales) {
        assert!(b.len() >= groups * GROUP_BYTES && s.len() >= groups);
    }
    // SAFETY: the features were detected just above, and every row holds `groups` groups of
    // blocks and scales, `x` `groups` groups of values (checked above).
    unsafe {
        dot_raw(
            blocks.map(<[u8]>::as_ptr),
            scales.map(<[f32]>::as_ptr),
            x.as_ptr(),
            groups,
        )
    }
}

/// The sixteen codes of eight bytes at `p` (nibble `i` of the little-endian word at bits
/// `4i`), as 32-bit lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn codes(p: *const u8, shifts: __m512i, nib: __m512i) -> __m512i {
    let lo = (p as *const u32).read_unaligned() as i32;
    let hi = (p.add(4) as *const u32).read_unaligned() as i32;
    let words = _mm512_inserti64x4::<1>(_mm512_set1_epi32(lo), _mm256_set1_epi32(hi));
    _mm512_and_si512(_mm512_srlv_epi32(words, shifts), nib)
}

#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn dot_raw<const N: usize>(
    b: [*const u8; N],
    s: [*const f32; N],
    x: *const f32,
    groups: usize,
) -> [f32; N] {
    let table = _mm512_loadu_ps(E2M1.as_ptr());
    let shifts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    let nib = _mm512_set1_epi32(0xF);
    let mut acc = [_mm256_setzero_ps(); N];
    for g in 0..groups {
        for h in 0..2 {
            let xv = _mm512_loadu_ps(x.add(g * GROUP + h * 16));
            for r in 0..N {
                let w = _mm512_permutexvar_ps(
                    codes(b[r].add(g * GROUP_BYTES + h * 8), shifts, nib),
                    table,
                );
                let prod = _mm512_mul_ps(_mm512_mul_ps(w, _mm512_set1_ps(*s[r].add(g))), xv);
                // Values 0..8 of the sixteen, then 8..16: the reference's two quads in order.
                let upper = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(prod)));
                acc[r] = _mm256_add_ps(acc[r], _mm512_castps512_ps256(prod));
                acc[r] = _mm256_add_ps(acc[r], upper);
            }
        }
    }
    acc.map(|a| {
        let mut l = [0.0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), a);
        ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
    })
}
