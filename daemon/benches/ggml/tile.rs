//! The GGUF 32-element types' prefill tiles against their row dot products: one thread, one
//! matrix in L2 (2048 inputs, 512 rows) against 64 quantized positions, the same products
//! computed as 64 dot calls a row and as 16 tile calls a row, in the same run. Figures are
//! GMAC/s (weights x positions per second); the ratio is the tile's gain.

use std::hint::black_box;

use colibri::quant::ggml::{act_kind, dot_for, tile_for, Q8Act, Q8Row};
use colibri::quant::KernelSet;

use super::{best_of, random_ggml_bytes, Rng, GGML_TYPES};

/// Prints the table (`only`: one type by name).
pub fn tile_table(only: Option<&str>) {
    let (rows, cols, n_seq) = (512, 2048, 64);
    println!(
        "GGUF 32-element tiles: one thread, [{rows}, {cols}] in L2, {n_seq} positions (GMAC/s)"
    );
    println!(
        "{:<7} {:<11} {:>8} {:>8} {:>6}",
        "type", "kernels", "dots", "tile", "ratio"
    );
    let mut rng = Rng::new(0x49);
    let x = rng.f32s(n_seq * cols);
    for ty in GGML_TYPES {
        if only.is_some_and(|o| o != ty.name()) {
            continue;
        }
        let w = random_ggml_bytes(&mut rng, ty, rows, cols);
        let rb = w.len() / rows;
        let mut act = Q8Act::new();
        act.fill(act_kind(ty).unwrap(), &x, n_seq, cols);
        let pos: Vec<Q8Row> = (0..n_seq).map(|p| act.row(p)).collect();
        for k in KernelSet::available() {
            let (Some(dot), Some(tile)) = (dot_for(k, ty), tile_for(k, ty)) else {
                continue;
            };
            let mut sink = 0f32;
            let dots = best_of(7, || {
                for r in w.chunks_exact(rb) {
                    for a in &pos {
                        sink += dot(r, a);
                    }
                }
            });
            let tiles = best_of(7, || {
                for r in w.chunks_exact(rb) {
                    for a in pos.chunks_exact(4) {
                        sink += tile(r, &[a[0], a[1], a[2], a[3]])[3];
                    }
                }
            });
            black_box(sink);
            let macs = (rows * cols * n_seq) as f64 / 1e9;
            println!(
                "{:<7} {:<11} {:>8.2} {:>8.2} {:>6.2}",
                ty.name(),
                k.name(),
                macs / dots,
                macs / tiles,
                dots / tiles
            );
        }
    }
    println!();
}
