//! The AMX lattice panels' bit tests and their timing.

use super::super::dot_fn;
use super::super::tests::Rng;
use super::super::tests_panel::{amx_against_vnni, check_panel_bits, panel_acts, AMX_SHAPES};
use super::super::tests_simd::extreme_row;
use super::*;

const TYPES: [GgmlType; 9] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ4_XS,
    GgmlType::Q2_K,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// The AMX panels (where this CPU and OS have them) and the VNNI panels they fall back to
/// give the portable reference dot's bits for every output, in both layouts: row counts
/// that are not whole sixteens, 1 to 130 positions (one group, a last single group paired
/// with itself, partial groups), random and extreme blocks (largest scales, grid values
/// and IQ4_XS's scale -32 by its table's -127; Q2_K's mins, IQ1's delta signs) and extreme
/// activations. IQ1_S/IQ1_M have no VNNI panel: every shape of theirs is on the tiles.
#[test]
fn amx_and_vnni_iq_panels_give_the_reference_bits() {
    let mut rng = Rng(0x0049_A3C0_0000_0002);
    let mut checked = 0usize;
    for ty in TYPES {
        let reference = dot_fn(ty).unwrap();
        for (name, panel) in [("amx", panel(ty)), ("vnni", iqpanel::vnni_panel(ty))] {
            let Some(panel) = panel else {
                continue;
            };
            let shapes = &AMX_SHAPES;
            checked += check_panel_bits(
                name,
                ty,
                panel,
                reference,
                shapes,
                &mut |_, _, _| {},
                &mut rng,
            );
        }
    }
    if super::super::x86::has_panel_features() {
        let want = if amx_ready() {
            (9 + 7) * 9 * 3
        } else {
            7 * 9 * 3
        };
        assert_eq!(checked, want, "panel shapes checked");
    }
}

/// Each type's panel with every call of whole sixteens of rows on the tiles (`amx_from`
/// 1), whatever its routing says.
macro_rules! forced_amx {
    ($($name:ident: $ty:ident),*) => {
        $(fn $name(w: &[u8], cols: usize, x: &[Q8Row], out: &mut [f32], rs: usize, ps: usize) {
            let mut k = kind(GgmlType::$ty).unwrap();
            k.amx_from = 1;
            split_rows(GgmlType::$ty, &k, w, cols, x, out, [rs, ps]);
        })*
        fn forced(ty: GgmlType) -> PanelFn {
            match ty {
                $(GgmlType::$ty => $name,)*
                _ => unreachable!("a type of TYPES"),
            }
        }
    };
}

forced_amx!(f_iq2_xxs: IQ2_XXS, f_iq2_xs: IQ2_XS, f_iq2_s: IQ2_S, f_iq3_xxs: IQ3_XXS,
    f_iq3_s: IQ3_S, f_iq4_xs: IQ4_XS, f_q2_k: Q2_K, f_iq1_s: IQ1_S, f_iq1_m: IQ1_M);

/// Calls of 1 to 16 positions (one partial group: [`tile_one`], zero activations past
/// the last position), whole sixteens of rows and a partial last one.
const FEW_SHAPES: [(usize, usize, usize); 6] = [
    (256, 16, 1),
    (2048, 17, 4),
    (768, 32, 8),
    (512, 33, 12),
    (2048, 16, 15),
    (256, 48, 16),
];

/// Calls of 1 to 16 positions give the reference dot's bits through every type's panel
/// as routed (the tiles from the type's `amx_from`, else the VNNI panel) and with the
/// tiles forced at every count, both layouts, random and extreme blocks and activations.
#[test]
fn few_positions_give_the_reference_bits_routed_and_on_the_tiles() {
    if !amx_ready() {
        return;
    }
    let mut rng = Rng(0x0049_A3C0_F3E0_0005);
    let mut checked = 0usize;
    for ty in TYPES {
        let reference = dot_fn(ty).unwrap();
        for (name, p) in [("routed", panel(ty).unwrap()), ("forced amx", forced(ty))] {
            checked += check_panel_bits(
                name,
                ty,
                p,
                reference,
                &FEW_SHAPES,
                &mut |_, _, _| {},
                &mut rng,
            );
        }
    }
    assert_eq!(checked, 9 * 2 * 6 * 3, "panel shapes checked");
}

/// The folded weights' split is exact at the extremes of every type's product range:
/// `64 (v >> 6) + (v & 63) = v` for every |v| <= 4064 through the vector path.
#[test]
fn the_hi_lo_split_rebuilds_every_folded_weight() {
    if !amx_ready() {
        return;
    }
    // IQ4_XS's extreme: table value -127 by scale -32, and 113 by 31; a mixed block.
    let lat = kind(GgmlType::IQ4_XS).unwrap();
    let mut rng = Rng(0x0049_A3C0_5971_0003);
    for mode in [0, 1, 2] {
        let b = extreme_row(GgmlType::IQ4_XS, 1, mode, &mut rng);
        let mut u = Unpacked::zeroed();
        // SAFETY: `amx_ready` includes the features `unpack_row` is compiled for.
        unsafe { unpack_row(&b, &mut u, 3, &lat) };
        let q: Vec<i8> =
            u.q.iter()
                .flat_map(|w| w.to_le_bytes())
                .map(|v| v as i8)
                .collect();
        for (e, &qe) in q.iter().enumerate() {
            let want = qe as i32 * u.sc[e / 32];
            let (hi, lo) = (u.hi[e / 64][3][e % 64], u.lo[e / 64][3][e % 64]);
            assert!((0..64).contains(&lo), "low part {lo}");
            assert_eq!(64 * hi as i32 + lo as i32, want, "element {e}, mode {mode}");
        }
    }
}

/// The direct plane writers (`planes.rs`: IQ2_XXS, IQ2_S) give every plane byte and the
/// block scale of their VNNI unpacker folded and split (`fold_split`): random blocks
/// (every grid index, sign pattern and scale many times over) and extreme scales, into
/// every row of the sixteen.
#[test]
fn direct_planes_give_the_folded_split_bytes() {
    if !amx_ready() {
        return;
    }
    let mut rng = Rng(0x0049_A3C0_D12E_0004);
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_S] {
        let Some(direct) = direct_kind(ty) else {
            return;
        };
        let folded = lattice_kind(ty).unwrap();
        assert!(matches!(folded.source, Source::Lattice { .. }));
        for mode in [0, 1, 2] {
            let w = extreme_row(ty, 256, mode, &mut rng);
            for (i, b) in w.chunks_exact(direct.bb).enumerate() {
                let r = i % R;
                let (mut a, mut f) = (Unpacked::zeroed(), Unpacked::zeroed());
                // SAFETY: `amx_ready` (and `direct_kind`'s VBMI check) include the
                // features `unpack_row` and the plane writers are compiled for.
                unsafe {
                    unpack_row(b, &mut a, r, &direct);
                    unpack_row(b, &mut f, r, &folded);
                }
                let at = format!("{} block {i} mode {mode}", ty.name());
                assert_eq!(a.hi, f.hi, "hi plane, {at}");
                assert_eq!(a.lo, f.lo, "lo plane, {at}");
                assert_eq!(a.d[r].to_bits(), f.d[r].to_bits(), "scale, {at}");
            }
        }
    }
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::iqpanel_amx::tests::bench_amx_iq_panels -- --ignored --nocapture`. One
// thread: a [768, 2048] matrix (an expert's gate) of each type against 16 to 256
// positions by the VNNI panel and the AMX panel, in one run; GMAC/s and the ratio.
#[test]
#[ignore]
fn bench_amx_iq_panels() {
    let types = [GgmlType::IQ2_XXS, GgmlType::IQ4_XS, GgmlType::Q2_K];
    let panels = |ty| (panel(ty), iqpanel::vnni_panel(ty));
    let positions = [16, 17, 24, 32, 64, 128, 256];
    amx_against_vnni(&types, &positions, panels, &mut Rng(0xA3C0_BE4D));
}

// Timing (not a correctness test): `cargo test --release -p colibri --lib
// quant::ggml::iqpanel_amx::tests::bench_iq2_planes -- --ignored --nocapture`. One
// thread, a [768, 2048] matrix of IQ2_XXS and IQ2_S against 4 to 256 positions: the VNNI
// panel, the AMX panel through the VNNI unpacker folded and split, and through the
// direct plane writers (both on the tiles at every count), interleaved in one run.
#[test]
#[ignore]
fn bench_iq2_planes() {
    if !amx_ready() {
        return;
    }
    const SPLIT: u8 = Combine::Split as u8;
    let (rows, cols) = (768, 2048);
    let mut rng = Rng(0xA3C0_D12E);
    println!("type     pos    vnni  amx-folded  amx-direct (GMAC/s)  direct/vnni");
    for ty in [GgmlType::IQ2_XXS, GgmlType::IQ2_S] {
        let (Some(direct), Some(folded)) = (direct_kind(ty), lattice_kind(ty)) else {
            return;
        };
        let vnni = iqpanel::vnni_panel(ty).unwrap();
        let w = extreme_row(ty, rows * cols / 256, 2, &mut rng);
        for n in [4, 8, 12, 16, 24, 32, 64, 128, 256] {
            let act = panel_acts(ty, cols, n, &mut rng);
            let xr: Vec<Q8Row> = (0..n).map(|s| act.row(s)).collect();
            let mut out = vec![0f32; rows * n];
            let reps = (1 << 28) / (rows * n * cols) + 1;
            let mut best = [f64::INFINITY; 3];
            for _ in 0..5 {
                for (v, b) in best.iter_mut().enumerate() {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        let o = &mut out;
                        // SAFETY: `amx_ready` includes every feature the panel needs.
                        match v {
                            0 => vnni(&w, cols, &xr, o, n, 1),
                            1 => unsafe { amx_panel::<SPLIT>(&w, cols, &xr, o, [n, 1], &folded) },
                            _ => unsafe { amx_panel::<SPLIT>(&w, cols, &xr, o, [n, 1], &direct) },
                        }
                    }
                    *b = b.min(t.elapsed().as_secs_f64());
                }
            }
            std::hint::black_box(&out);
            let g = best.map(|t| (reps * rows * cols * n) as f64 / t / 1e9);
            println!(
                "{:<8} {n:4} {:7.1} {:11.1} {:11.1} {:20.2}x",
                ty.name(),
                g[0],
                g[1],
                g[2],
                g[2] / g[0]
            );
        }
    }
}
