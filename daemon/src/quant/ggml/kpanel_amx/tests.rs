//! The AMX K-quant panels' bit-equality test and their timing.

use super::super::tests::Rng;
use super::super::tests_panel::{amx_against_vnni, check_panel_bits, AMX_SHAPES};
use super::super::{dot, kpanel};
use super::*;

/// Q6_K's extremes in every block of `w`: scales -128 and 127 alternating, each quant byte
/// all zeros or all ones (quants 0 and 63, so `(q - 32) x scale` reaches 4096 and -4064,
/// the split's widest high bytes).
fn q6_k_extremes(w: &mut [u8], rng: &mut Rng) {
    for b in w.chunks_exact_mut(210) {
        for (k, s) in b[192..208].iter_mut().enumerate() {
            *s = if k % 2 == 0 { 0x80 } else { 0x7F };
        }
        for q in &mut b[..192] {
            *q = if rng.byte() % 2 == 0 { 0 } else { 0xFF };
        }
    }
}

/// The AMX panels (where this CPU and OS have them) and the VNNI panels they replace give
/// the portable reference dot's bits for every output, in both layouts: row counts that
/// are not whole sixteens, 1 to 130 positions (one group, a last single group paired with
/// itself, partial groups), random and extreme blocks (every scale and min up to 63,
/// every quant up to 15 or 31; Q6_K's signed scales at -128 and 127 with quants 0 and 63)
/// and extreme activations.
#[test]
fn amx_and_vnni_k_panels_give_the_reference_bits() {
    let mut rng = Rng(0x0049_A3C0_0000_0001);
    let mut checked = 0usize;
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        let reference: fn(&[u8], &Q8Row) -> f32 = match ty {
            GgmlType::Q4_K => dot::q4_k,
            GgmlType::Q5_K => dot::q5_k,
            _ => dot::q6_k,
        };
        for (name, panel) in [("amx", panel(ty)), ("vnni", kpanel::vnni_panel(ty))] {
            let Some(panel) = panel else {
                continue;
            };
            let mut tweak = |w: &mut [u8], mode: u32, rng: &mut Rng| {
                if ty == GgmlType::Q6_K && mode == 1 {
                    q6_k_extremes(w, rng);
                }
            };
            checked += check_panel_bits(
                name,
                ty,
                panel,
                reference,
                &AMX_SHAPES,
                &mut tweak,
                &mut rng,
            );
        }
    }
    if super::super::x86::has_panel_features() {
        let want = if amx_ready() {
            2 * 3 * 9 * 3
        } else {
            3 * 9 * 3
        };
        assert_eq!(checked, want, "panel shapes checked");
    }
}

/// The AMX panels at a pp64 expert's position counts give the reference dot's bits: 1, 7
/// and 16 positions (the VNNI panel), 17 (one pair of groups), 33, 40 and 49 (a last single
/// group on its own tile product, `tile_one`), 64; rows past the last whole sixteen too.
#[test]
fn amx_k_panels_at_a_pp64_experts_positions_give_the_reference_bits() {
    let shapes = [
        (2048, 17, 1),
        (2048, 17, 7),
        (256, 32, 16),
        (2048, 17, 17),
        (768, 32, 33),
        (256, 16, 40),
        (256, 33, 49),
        (2048, 17, 64),
    ];
    let mut rng = Rng(0x0064_A3C0_0000_0017);
    let mut checked = 0usize;
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        let Some(panel) = panel(ty) else {
            continue;
        };
        let reference: fn(&[u8], &Q8Row) -> f32 = match ty {
            GgmlType::Q4_K => dot::q4_k,
            GgmlType::Q5_K => dot::q5_k,
            _ => dot::q6_k,
        };
        let mut tweak = |w: &mut [u8], mode: u32, rng: &mut Rng| {
            if ty == GgmlType::Q6_K && mode == 1 {
                q6_k_extremes(w, rng);
            }
        };
        checked += check_panel_bits("amx", ty, panel, reference, &shapes, &mut tweak, &mut rng);
    }
    if amx_ready() {
        assert_eq!(checked, 3 * shapes.len() * 3, "panel shapes checked");
    }
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::kpanel_amx::tests::bench_amx_k_panels -- --ignored --nocapture`. One
// thread: a [768, 2048] Q4_K/Q5_K/Q6_K matrix (an expert's gate) against 16 to 256 positions by
// the VNNI panel and the AMX panel, in one run; GMAC/s and the ratio.
#[test]
#[ignore]
fn bench_amx_k_panels() {
    let types = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
    let panels = |ty| (panel(ty), kpanel::vnni_panel(ty));
    amx_against_vnni(
        &types,
        &[16, 32, 64, 128, 256],
        panels,
        &mut Rng(0xA3C0_BE4C),
    );
}
