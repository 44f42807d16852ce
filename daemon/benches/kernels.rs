//! Quantized matmul kernel benchmark: weight bytes per second at decode
//! shape (one activation row) and prefill shape (64 rows), beside a memory
//! read bandwidth probe run in the same process.
//!
//! `cargo bench -p colibri --bench kernels [-- quick] [threads] [fmt=int4-g64] [decode] [tune]
//! [attn] [gemm] [ggml] [kquant]` (`fmt=` keeps one format, `decode` skips the prefill rows;
//! `tune` runs only the sweep that chose `DecodeTuning::default`; `attn` only the attention-scores
//! table; `gemm` only the prefill products in multiply-adds/s against the integer compute
//! probe; `ggml` only the GGUF 32-element types computed as stored, `fmt=Q8_0` keeping one of
//! them, `ggml tile` only their tiles against their dots; `kquant` only the GGUF K-quant
//! table; `moe` only the MoE layer table, `moe pages` its weights by page size, `moe inplace`
//! the dense matrices read in place by page size).
//!
//! Decode figures cycle through distinct matrices totalling more than
//! `DECODE_BYTES` (several times the L3 cache) so every call streams its
//! weights from memory.  The probe (`colibri::membw`) sums a buffer with all
//! rayon threads and the widest vector loads: 1 GiB best of 5 at the start,
//! and 256 MiB again for every kernel row: a decode row alternates probe
//! and kernel passes and divides the kernel's best by the probe's best over
//! the same minute (a shared machine's bandwidth drifts by a quarter from
//! minute to minute, so a single probe before a row can land in a lull or a
//! rush the kernel never sees).

use std::hint::black_box;
use std::time::Instant;

use colibri::gguf::GgmlType;
use colibri::membw::read_bandwidth_gbs;
use colibri::quant::{
    dot_f32_gather, dot_f32_gather4, set_decode_tuning, set_threading, DecodeTuning, KernelSet,
    QFormat, QMatrix, Threading,
};
use rayon::prelude::*;

#[path = "attn/prefill.rs"]
mod attn_prefill;
#[path = "ggml/tile.rs"]
mod ggml_tile;
#[path = "moe/in_place_pages.rs"]
mod in_place_pages;
#[path = "moe/pages.rs"]
mod moe_pages;

/// Weights cycled per decode measurement (> 3x the 300 MiB L3 here).
const DECODE_BYTES: usize = 1 << 30;
/// Activation rows of the prefill shape.
const PREFILL_ROWS: usize = 64;

/// The crate's generator, for weights and activations.
struct Rng(colibri::rng::Rng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(colibri::rng::Rng::new(seed))
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        self.0.bytes(n)
    }

    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.0.unit_f32() - 0.5).collect()
    }
}

/// A random matrix in `fmt` (random packed bytes, small positive scales).
fn random_matrix(rng: &mut Rng, fmt: QFormat, rows: usize, cols: usize) -> QMatrix {
    if fmt == QFormat::F32 {
        return QMatrix::from_f32(rng.f32s(rows * cols), rows, cols);
    }
    let data = rng.bytes(fmt.data_len(rows, cols));
    let scales = vec![0.01; fmt.scales_len(rows, cols)];
    QMatrix::from_parts(fmt, rows, cols, data, scales).expect("lengths match")
}

/// Best-of-`reps` seconds of one pass of `f`.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// Decode: one activation row through `count` distinct matrices. Returns a measurement:
/// weight GB/s of the best of 2 passes, each call a fresh one over the same matrices.
fn decode_case(
    k: &'static KernelSet,
    fmt: QFormat,
    rows: usize,
    cols: usize,
    budget: usize,
) -> impl FnMut() -> f64 {
    let one = fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols);
    decode_case_of(k, rows, cols, budget, one, move |rng| {
        random_matrix(rng, fmt, rows, cols)
    })
}

/// [`decode_case`] over the matrices `make` draws, `one` bytes each.
fn decode_case_of(
    k: &'static KernelSet,
    rows: usize,
    cols: usize,
    budget: usize,
    one: usize,
    mut make: impl FnMut(&mut Rng) -> QMatrix,
) -> impl FnMut() -> f64 {
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15 ^ (rows * 31 + cols) as u64);
    let count = budget.div_ceil(one).max(2);
    let ms: Vec<QMatrix> = (0..count).map(|_| make(&mut rng)).collect();
    let x = rng.f32s(cols);
    let mut y = vec![0f32; rows];
    let mut pass = move || {
        for m in &ms {
            m.matmul_i8act_with(k, &x, 1, &mut y);
        }
        black_box(&y);
    };
    pass(); // warm-up (page faults, thread wake-up)
    move || (count * one) as f64 / best_of(2, &mut pass) / 1e9
}

/// Best weight GB/s and best probe GB/s over `rounds` alternations of a 256 MiB probe and
/// one decode measurement: on a shared machine another tenant can take a quarter of the
/// bandwidth for a while, and taking each side's best over the same minute compares the two
/// undisturbed (one probe, then one kernel pass, can each land in a different lull).
fn decode_vs_probe(rounds: usize, mut case: impl FnMut() -> f64) -> (f64, f64) {
    let (mut g, mut bw) = (0f64, 0f64);
    for _ in 0..rounds {
        bw = bw.max(read_bandwidth_gbs(256, 1));
        g = g.max(case());
    }
    (g, bw)
}

/// The decode tuning sweep: prefetch distance and level, and the shortest
/// row read in four-row tiles, per format and shape.  Each round measures a
/// fresh probe (256 MiB) and then every configuration, and a configuration
/// keeps its best ratio to its own round's probe: the bandwidth of this
/// shared machine drifts by a quarter between minutes.
fn tune_table(only: Option<&str>) {
    let fmts = [QFormat::I4G64, QFormat::I8Row, QFormat::I4Row];
    let shapes = [
        ("6144->2048", 2048, 6144),
        ("2048->6144", 6144, 2048),
        ("1024->2048", 2048, 1024),
        ("16384->6144", 6144, 16384),
    ];
    let mut configs = vec![];
    for prefetch_bytes in [0, 4096, 8192, 16384] {
        for tile_min_row_bytes in [256, 1 << 20] {
            for prefetch_l2 in [false, true] {
                // The level only moves the one-row path (tiles ask for L1).
                let one_row = tile_min_row_bytes > 1 << 19;
                if prefetch_bytes > 0 && one_row || !prefetch_l2 {
                    configs.push(DecodeTuning {
                        prefetch_bytes,
                        tile_min_row_bytes,
                        prefetch_l2,
                        ..DecodeTuning::default()
                    });
                }
            }
        }
    }
    let k = KernelSet::detected();
    println!(
        "decode tuning sweep ({}), best ratio of weight GB/s to the round's probe",
        k.name()
    );
    println!("columns: pf<KiB ahead><L1|L2>/<t: tiles from 256-byte rows | 1: one row a call>");
    print!("{:<9} {:<11}", "format", "shape");
    for c in &configs {
        let tiles = if c.tile_min_row_bytes < 1 << 20 {
            "t"
        } else {
            "1"
        };
        let level = if c.prefetch_l2 { "L2" } else { "L1" };
        print!(
            " {:>8}",
            format!("{}{level}/{tiles}", c.prefetch_bytes / 1024)
        );
    }
    println!();
    for fmt in fmts {
        if only.is_some_and(|o| o != fmt.name()) {
            continue;
        }
        for (label, rows, cols) in shapes {
            let mut rng = Rng::new(0xC0FFEE ^ (rows * 31 + cols) as u64);
            let one = fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols);
            let count = (DECODE_BYTES / 2).div_ceil(one).max(2);
            let ms: Vec<QMatrix> = (0..count)
                .map(|_| random_matrix(&mut rng, fmt, rows, cols))
                .collect();
            let x = rng.f32s(cols);
            let mut y = vec![0f32; rows];
            let mut best = vec![0f64; configs.len()];
            for _round in 0..3 {
                let bw = read_bandwidth_gbs(256, 2);
                for (b, c) in best.iter_mut().zip(&configs) {
                    set_decode_tuning(*c);
                    let dt = best_of(2, || {
                        for m in &ms {
                            m.matmul_i8act_with(k, &x, 1, &mut y);
                        }
                    });
                    *b = b.max((count * one) as f64 / dt / 1e9 / bw);
                }
            }
            print!("{:<9} {:<11}", fmt.name(), label);
            for r in &best {
                print!(" {:>8.2}", r);
            }
            println!();
        }
    }
    set_decode_tuning(DecodeTuning::default());
    println!();
}

/// Kernel speed without memory: one 256x6144 matrix (in L2) on one
/// thread.
fn hot_one_thread_gbs(k: &KernelSet, fmt: QFormat, cols: usize) -> f64 {
    let mut rng = Rng::new(42);
    let rows = 256 * 6144 / cols;
    let m = random_matrix(&mut rng, fmt, rows, cols);
    hot_one_thread_matrix_gbs(k, &m, rows, cols)
}

/// Prefill: `PREFILL_ROWS` activation rows through one matrix.
fn prefill_gbs(k: &KernelSet, fmt: QFormat, rows: usize, cols: usize) -> f64 {
    let mut rng = Rng::new(0x1234_5678 ^ (rows * 31 + cols) as u64);
    let m = random_matrix(&mut rng, fmt, rows, cols);
    let x = rng.f32s(cols * PREFILL_ROWS);
    let mut y = vec![0f32; rows * PREFILL_ROWS];
    m.matmul_i8act_with(k, &x, PREFILL_ROWS, &mut y);
    let dt = best_of(3, || m.matmul_i8act_with(k, &x, PREFILL_ROWS, &mut y));
    m.resident_bytes() as f64 / dt / 1e9
}

fn kernels_table(quick: bool, only: Option<&str>, decode_only: bool) {
    // (label, rows, cols): y = W x with W [rows, cols].
    // GLM-5's expert gate/up and down, a wide dense projection, and the
    // medium test model's expert down (short rows: 512 bytes at int4), and GLM-5's
    // attention output projection (long rows: 16 KB at int8).
    let shapes: [(&str, usize, usize); 5] = [
        ("6144->2048", 2048, 6144),
        ("2048->6144", 6144, 2048),
        ("6144->16384", 16384, 6144),
        ("1024->2048", 2048, 1024),
        ("16384->6144", 6144, 16384),
    ];
    let fmts = [
        QFormat::I8Row,
        QFormat::I4Row,
        QFormat::I4G64,
        QFormat::I3G64,
        QFormat::I2Row,
    ];
    let budget = if quick {
        DECODE_BYTES / 4
    } else {
        DECODE_BYTES
    };
    let sets = KernelSet::available();
    let sets: Vec<_> = if quick { vec![sets[0]] } else { sets };
    let rounds = if quick { 3 } else { 5 };
    println!(
        "decode rows: best weight GB/s over {rounds} passes alternated with a 256 MiB probe, \
         against that probe's best; prefill rows: against a probe just before"
    );
    println!(
        "{:<9} {:<11} {:<11} {:>8} {:>9} {:>7} {:>6}",
        "format", "kernels", "shape", "mode", "GB/s", "probe", "ratio"
    );
    let row = |fmt: QFormat, k: &KernelSet, label: &str, mode: &str, g: f64, bw: f64| {
        println!(
            "{:<9} {:<11} {:<11} {:>8} {:>9.2} {:>7.2} {:>6.2}",
            fmt.name(),
            k.name(),
            label,
            mode,
            g,
            bw,
            g / bw
        )
    };
    for fmt in fmts {
        if only.is_some_and(|o| o != fmt.name()) {
            continue;
        }
        for k in &sets {
            for (label, rows, cols) in shapes {
                let (g, bw) = decode_vs_probe(rounds, decode_case(k, fmt, rows, cols, budget));
                row(fmt, k, label, "decode", g, bw);
            }
            if decode_only {
                continue;
            }
            let (label, rows, cols) = shapes[0];
            let bw = read_bandwidth_gbs(256, 2);
            row(
                fmt,
                k,
                label,
                "prefill",
                prefill_gbs(k, fmt, rows, cols),
                bw,
            );
        }
    }
}

/// GGUF's 256-element types computed as stored, per kernel set: one thread on a 256 x 6144
/// matrix in L2 (the kernel's speed), prefill of 64 positions on all threads (the 4-position
/// tiles where the type has them), and decode of 2048 x 6144 matrices from memory against the
/// probe, all in GB/s of weights. `cargo bench -p colibri --bench kernels -- kquant [quick]`.
fn ggml_kquant_table(quick: bool) {
    use GgmlType::*;
    let types = [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS];
    let sets = KernelSet::available();
    let sets: Vec<_> = if quick { vec![sets[0]] } else { sets };
    let (rounds, budget) = if quick {
        (2, DECODE_BYTES / 4)
    } else {
        (3, DECODE_BYTES / 2)
    };
    println!(
        "GGUF K-quants, GB/s of weights: hot = one thread, 256 x 6144 in L2; prefill = 64 \
         positions of 2048 x 6144, all threads; decode = 2048 x 6144 from memory, best of {rounds} \
         alternated with a 256 MiB probe"
    );
    println!(
        "{:<7} {:<11} {:>7} {:>8} {:>7} {:>7} {:>6}",
        "type", "kernels", "hot", "prefill", "decode", "probe", "ratio"
    );
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for ty in types {
        for k in &sets {
            let mut rng = Rng::new(0x4747_4D4C ^ ty.block_bytes() as u64);
            let hot = {
                let m = random_ggml(&mut rng, ty, 256, 6144);
                let x = rng.f32s(6144);
                let mut y = vec![0f32; 256];
                one.install(|| {
                    m.matmul_i8act_with(k, &x, 1, &mut y);
                    let dt = best_of(20, || m.matmul_i8act_with(k, &x, 1, &mut y));
                    m.resident_bytes() as f64 / dt / 1e9
                })
            };
            let prefill = {
                let m = random_ggml(&mut rng, ty, 2048, 6144);
                let x = rng.f32s(6144 * PREFILL_ROWS);
                let mut y = vec![0f32; 2048 * PREFILL_ROWS];
                m.matmul_i8act_with(k, &x, PREFILL_ROWS, &mut y);
                let dt = best_of(3, || m.matmul_i8act_with(k, &x, PREFILL_ROWS, &mut y));
                m.resident_bytes() as f64 / dt / 1e9
            };
            let one_bytes = random_ggml(&mut rng, ty, 2048, 6144).resident_bytes();
            let ms: Vec<QMatrix> = (0..budget.div_ceil(one_bytes).max(2))
                .map(|_| random_ggml(&mut rng, ty, 2048, 6144))
                .collect();
            let x = rng.f32s(6144);
            let mut y = vec![0f32; 2048];
            let mut pass = || {
                for m in &ms {
                    m.matmul_i8act_with(k, &x, 1, &mut y);
                }
                black_box(&y);
            };
            pass();
            let total = (ms.len() * one_bytes) as f64;
            let (g, bw) = decode_vs_probe(rounds, || total / best_of(2, &mut pass) / 1e9);
            println!(
                "{:<7} {:<11} {hot:>7.2} {prefill:>8.2} {g:>7.2} {bw:>7.2} {:>6.2}",
                ty.name(),
                k.name(),
                g / bw
            );
        }
    }
    println!();
}

/// One routed expert's weights (GLM-5: hidden 6144, moe intermediate 2048).
struct Expert {
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
}

fn expert_pass_seq(es: &[Expert], x: &[f32], fused: bool) {
    let inter = es[0].gate.rows();
    let (mut g, mut u) = (vec![0f32; inter], vec![0f32; inter]);
    let mut out = vec![0f32; es[0].down.rows()];
    for e in es {
        if fused {
            QMatrix::matmul_pair_i8act(&e.gate, &e.up, x, 1, &mut g, &mut u);
        } else {
            e.gate.matmul_i8act(x, 1, &mut g);
            e.up.matmul_i8act(x, 1, &mut u);
        }
        for (a, b) in g.iter_mut().zip(&u) {
            *a = *a / (1.0 + (-*a).exp()) * b;
        }
        e.down.matmul_i8act(&g, 1, &mut out);
        black_box(&out);
    }
}

/// The whole layer in two parallel regions: every expert's gate and up
/// rows, then every down.
fn expert_pass_batched(es: &[Expert], x: &[f32]) {
    let (inter, hidden) = (es[0].gate.rows(), es[0].down.rows());
    let mut gu = vec![0f32; 2 * es.len() * inter];
    let gate_up = |j: usize| {
        let e = &es[j / 2];
        ([&e.gate, &e.up][j % 2], x)
    };
    QMatrix::matmul_batch_i8act(2 * es.len(), gate_up, &mut gu);
    let mut hs = vec![0f32; es.len() * inter];
    for (h, gu) in hs.chunks_exact_mut(inter).zip(gu.chunks_exact(2 * inter)) {
        let (g, u) = gu.split_at(inter);
        for ((h, a), b) in h.iter_mut().zip(g).zip(u) {
            *h = *a / (1.0 + (-*a).exp()) * b;
        }
    }
    let mut out = vec![0f32; es.len() * hidden];
    let down = |j: usize| (&es[j].down, &hs[j * inter..(j + 1) * inter]);
    QMatrix::matmul_batch_i8act(es.len(), down, &mut out);
    black_box(&out);
}

fn expert_pass_per_thread(es: &[Expert], x: &[f32]) {
    es.par_iter().for_each(|e| {
        let inter = e.gate.rows();
        let (mut g, mut u) = (vec![0f32; inter], vec![0f32; inter]);
        let mut out = vec![0f32; e.down.rows()];
        e.gate.matmul_i8act_on_caller(x, 1, &mut g);
        e.up.matmul_i8act_on_caller(x, 1, &mut u);
        for (a, b) in g.iter_mut().zip(&u) {
            *a = *a / (1.0 + (-*a).exp()) * b;
        }
        e.down.matmul_i8act_on_caller(&g, 1, &mut out);
        black_box(&out);
    });
}

/// Whole expert per thread vs rows split across threads, for GLM-shaped
/// and small experts (8 routed experts per token, many layers cycled).
fn threads_table() {
    println!("\nthreading: 8 experts per token, int4-g64, decode; cycled > L3; run on a pool");
    println!("thread as the daemon runs its forwards; ratio to a probe measured before each row");
    println!(
        "{:<22} {:<26} {:>9} {:>9} {:>6}",
        "expert (hidden, inter)", "strategy", "us/layer", "GB/s", "ratio"
    );
    for (hidden, inter) in [
        (6144usize, 2048usize),
        (6144, 256),
        (2048, 1024),
        (2048, 256),
    ] {
        let mut rng = Rng::new(77 + inter as u64);
        let fmt = QFormat::I4G64;
        let one = 3 * (fmt.data_len(inter, hidden) + 4 * fmt.scales_len(inter, hidden));
        let layers = (DECODE_BYTES / 2).div_ceil(8 * one).max(2);
        let experts: Vec<Vec<Expert>> = (0..layers)
            .map(|_| {
                (0..8)
                    .map(|_| Expert {
                        gate: random_matrix(&mut rng, fmt, inter, hidden),
                        up: random_matrix(&mut rng, fmt, inter, hidden),
                        down: random_matrix(&mut rng, fmt, hidden, inter),
                    })
                    .collect()
            })
            .collect();
        let x = rng.f32s(hidden);
        type Strategy<'a> = (&'a str, &'a (dyn Fn(&[Expert]) + Sync));
        let strategies: [Strategy; 7] = [
            ("batched layer (rayon)", &|es| expert_pass_batched(es, &x)),
            ("batched layer (spin)", &|es| expert_pass_batched(es, &x)),
            ("split rows (rayon)", &|es| expert_pass_seq(es, &x, false)),
            ("split rows, fused (rayon)", &|es| {
                expert_pass_seq(es, &x, true)
            }),
            ("split rows (spin)", &|es| expert_pass_seq(es, &x, false)),
            ("split rows, fused (spin)", &|es| {
                expert_pass_seq(es, &x, true)
            }),
            ("expert per thread (rayon)", &|es| {
                expert_pass_per_thread(es, &x)
            }),
        ];
        for (name, f) in strategies {
            set_threading(if name.contains("spin") {
                Threading::Spin
            } else {
                Threading::Rayon
            });
            let bw = read_bandwidth_gbs(256, 2);
            let pass = || experts.iter().for_each(|es| f(es));
            let dt = rayon::scope(|_| {
                pass();
                best_of(3, pass)
            });
            let gbs = (layers * 8 * one) as f64 / dt / 1e9;
            println!(
                "{:<22} {:<26} {:>9.1} {:>9.2} {:>6.2}",
                format!("({hidden}, {inter})"),
                name,
                dt / layers as f64 * 1e6,
                gbs,
                gbs / bw
            );
        }
        set_threading(Threading::Rayon);
    }
}

/// The medium model's MoE layer at decode, as `experts/run.rs` runs it: 8 routed experts
/// (hidden 2048, intermediate 768, int4 per row) and a shared one (int8), every gate and up in
/// one parallel region, SwiGLU, then every down in another; layers cycled through more than
/// the L3. Beside it, each a ratio to the probe of the same round (and in microseconds a
/// layer, steadier on a shared machine): each region alone, the downs' region with one input,
/// the routed downs alone and their bytes as one matrix (what the matrix boundaries cost), the
/// layer's bytes as one long int4 matrix (2048 and 768 columns: one stream a thread), and
/// three of them with equal tasks instead of the guided split. `moe` on the command line runs
/// only this.
fn moe_table() {
    let (hidden, inter, top_k) = (2048usize, 768usize, 8usize);
    let mut rng = Rng::new(0x3E3E);
    let bytes =
        |fmt: QFormat, rows, cols| fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols);
    let expert = |rng: &mut Rng, fmt| Expert {
        gate: random_matrix(rng, fmt, inter, hidden),
        up: random_matrix(rng, fmt, inter, hidden),
        down: random_matrix(rng, fmt, hidden, inter),
    };
    let per_expert = |fmt| 2 * bytes(fmt, inter, hidden) + bytes(fmt, hidden, inter);
    let layer_bytes = top_k * per_expert(QFormat::I4Row) + per_expert(QFormat::I8Row);
    let layers = DECODE_BYTES.div_ceil(layer_bytes);
    let moe: Vec<(Vec<Expert>, Expert)> = (0..layers)
        .map(|_| {
            let routed = (0..top_k)
                .map(|_| expert(&mut rng, QFormat::I4Row))
                .collect();
            (routed, expert(&mut rng, QFormat::I8Row))
        })
        .collect();
    // One int4 matrix of the layer's bytes (rows of `hidden` columns).
    let long_rows = layer_bytes / bytes(QFormat::I4Row, 1, hidden);
    let long: Vec<QMatrix> = (0..layers)
        .map(|_| random_matrix(&mut rng, QFormat::I4Row, long_rows, hidden))
        .collect();
    let x = rng.f32s(hidden);
    let members = top_k + 1;
    let mut gu = vec![0f32; 2 * members * inter];
    let mut h = vec![0f32; members * inter];
    let mut out = vec![0f32; members * hidden];
    let mut y_long = vec![0f32; long_rows];
    set_threading(Threading::Spin);
    println!(
        "\nMoE layer at decode, medium shape ({top_k} x int4-row {hidden}x{inter} + int8 shared), \
         {layers} layers of {:.1} MB cycled; spin pool; best ratio to the probe of the same round",
        layer_bytes as f64 / 1e6
    );
    let mut layer_pass = || {
        for (routed, shared) in &moe {
            let mats = |i: usize| -> [&QMatrix; 3] {
                let e = routed.get(i).unwrap_or(shared);
                [&e.gate, &e.up, &e.down]
            };
            QMatrix::matmul_batch_i8act(2 * members, |j| (mats(j / 2)[j % 2], &x[..]), &mut gu);
            for (i, hi) in h.chunks_exact_mut(inter).enumerate() {
                let (g, u) = gu[2 * i * inter..2 * (i + 1) * inter].split_at(inter);
                colibri::quant::expf::silu_mul_into(hi, g, u);
            }
            let h = &h;
            QMatrix::matmul_batch_i8act(
                members,
                |i| (mats(i)[2], &h[i * inter..(i + 1) * inter]),
                &mut out,
            );
            black_box(&out);
        }
    };
    let mut long_pass = || {
        for m in &long {
            m.matmul_i8act(&x, 1, &mut y_long);
            black_box(&y_long);
        }
    };
    // The same long bytes as rows of the down projections' width (384-byte int4 rows).
    let short_rows = layer_bytes / bytes(QFormat::I4Row, 1, inter);
    let short: Vec<QMatrix> = (0..layers)
        .map(|_| random_matrix(&mut rng, QFormat::I4Row, short_rows, inter))
        .collect();
    let xs = rng.f32s(inter);
    let mut y_short = vec![0f32; short_rows];
    let mut short_pass = || {
        for m in &short {
            m.matmul_i8act(&xs, 1, &mut y_short);
            black_box(&y_short);
        }
    };
    // Each region alone: every gate and up (bytes of 2/3 of the layer), every down (1/3).
    let gu_bytes =
        top_k * 2 * bytes(QFormat::I4Row, inter, hidden) + 2 * bytes(QFormat::I8Row, inter, hidden);
    let mut gu_only = vec![0f32; 2 * members * inter];
    let mut gate_up_pass = || {
        for (routed, shared) in &moe {
            let mats = |i: usize| -> [&QMatrix; 2] {
                let e = routed.get(i).unwrap_or(shared);
                [&e.gate, &e.up]
            };
            QMatrix::matmul_batch_i8act(
                2 * members,
                |j| (mats(j / 2)[j % 2], &x[..]),
                &mut gu_only,
            );
            black_box(&gu_only);
        }
    };
    let hs = rng.f32s(members * inter);
    let mut down_only = vec![0f32; members * hidden];
    let mut down_pass = || {
        for (routed, shared) in &moe {
            let w = |i: usize| &routed.get(i).unwrap_or(shared).down;
            QMatrix::matmul_batch_i8act(
                members,
                |i| (w(i), &hs[i * inter..(i + 1) * inter]),
                &mut down_only,
            );
            black_box(&down_only);
        }
    };
    // The down region with one input for every member: its inputs quantized once, not 9 times.
    let mut down_one = vec![0f32; members * hidden];
    let mut down_one_input_pass = || {
        for (routed, shared) in &moe {
            let w = |i: usize| &routed.get(i).unwrap_or(shared).down;
            QMatrix::matmul_batch_i8act(members, |i| (w(i), &hs[..inter]), &mut down_one);
            black_box(&down_one);
        }
    };
    // The routed downs alone (int4 only, no int8 shared one).
    let mut down_routed = vec![0f32; top_k * hidden];
    let mut down_routed_pass = || {
        for (routed, _) in &moe {
            QMatrix::matmul_batch_i8act(
                top_k,
                |i| (&routed[i].down, &hs[i * inter..(i + 1) * inter]),
                &mut down_routed,
            );
            black_box(&down_routed);
        }
    };
    // The routed downs' bytes as one matrix a layer (one allocation, one region of the same
    // size): what the matrix boundaries cost, against `down_routed_pass`.
    let joined: Vec<QMatrix> = (0..layers)
        .map(|_| random_matrix(&mut rng, QFormat::I4Row, top_k * hidden, inter))
        .collect();
    let mut y_joined = vec![0f32; top_k * hidden];
    let mut joined_pass = || {
        for m in &joined {
            m.matmul_i8act(&xs, 1, &mut y_joined);
            black_box(&y_joined);
        }
    };
    let mut best_bw = 0f64;
    // (label, bytes a layer, best seconds, best ratio)
    let mut rows: Vec<(&str, usize, f64, f64)> = vec![
        ("layer as decode runs it", layer_bytes, f64::MAX, 0.0),
        ("its gate/up region alone", gu_bytes, f64::MAX, 0.0),
        (
            "its down region alone",
            layer_bytes - gu_bytes,
            f64::MAX,
            0.0,
        ),
        ("one long int4 matrix", layer_bytes, f64::MAX, 0.0),
        ("one long, 768 columns", layer_bytes, f64::MAX, 0.0),
        (
            "down region, one input",
            layer_bytes - gu_bytes,
            f64::MAX,
            0.0,
        ),
        (
            "routed downs alone",
            top_k * bytes(QFormat::I4Row, hidden, inter),
            f64::MAX,
            0.0,
        ),
        (
            "their bytes as one matrix",
            top_k * bytes(QFormat::I4Row, hidden, inter),
            f64::MAX,
            0.0,
        ),
    ];
    rayon::scope(|_| {
        layer_pass();
        long_pass();
        short_pass();
        gate_up_pass();
        down_pass();
        down_one_input_pass();
        down_routed_pass();
        joined_pass();
        for _ in 0..4 {
            let bw = read_bandwidth_gbs(256, 1);
            best_bw = best_bw.max(bw);
            let passes: [&mut dyn FnMut(); 8] = [
                &mut layer_pass,
                &mut gate_up_pass,
                &mut down_pass,
                &mut long_pass,
                &mut short_pass,
                &mut down_one_input_pass,
                &mut down_routed_pass,
                &mut joined_pass,
            ];
            for (row, pass) in rows.iter_mut().zip(passes) {
                let t = best_of(2, pass);
                row.2 = row.2.min(t);
                row.3 = row.3.max((layers * row.1) as f64 / t / 1e9 / bw);
            }
        }
    });
    // The same, with equal tasks (two a thread) instead of the guided split: what the guided
    // split's many task starts cost.
    set_decode_tuning(DecodeTuning {
        guided: false,
        ..DecodeTuning::default()
    });
    let mut equal = [
        (f64::MAX, "routed downs, equal tasks"),
        (f64::MAX, "joined, equal tasks"),
        (f64::MAX, "layer, equal tasks"),
    ];
    rayon::scope(|_| {
        for _ in 0..4 {
            let passes: [&mut dyn FnMut(); 3] =
                [&mut down_routed_pass, &mut joined_pass, &mut layer_pass];
            for (e, pass) in equal.iter_mut().zip(passes) {
                e.0 = e.0.min(best_of(2, pass));
            }
        }
    });
    set_decode_tuning(DecodeTuning::default());
    for (t, label) in equal {
        println!("{label:<26} {:>7.1} us/layer", t / layers as f64 * 1e6);
    }
    println!("probe (256 MiB, best): {best_bw:.2} GB/s");
    for (label, _, t, ratio) in rows {
        println!(
            "{label:<26} {:>7.1} us/layer, ratio {ratio:.3}",
            t / layers as f64 * 1e6
        );
    }
    set_threading(Threading::Rayon);
}

/// Absorbed attention's scores at GLM-5 shapes on one thread: 64 heads' 512-wide latent
/// queries against 2048 gathered cached latents (8 MiB, in L3 as they are during a decode
/// step), keys in chunks of 64 as `Mla::attend_absorbed` takes them; one head per pass over
/// the chunk against four. Reported in multiply-adds per second.
fn attention_table() {
    let (heads, l, nk, chunk) = (64, 512, 2048, 64);
    let mut rng = Rng::new(0x5eed);
    let latent = rng.f32s(nk * l);
    let q = rng.f32s(heads * l);
    // Selected keys: a scattered permutation, as the DSA indexer's top-k is.
    let keys: Vec<usize> = (0..nk).map(|i| (i * 977) % nk).collect();
    let mut out = vec![0f32; heads * nk];
    let macs = (heads * nk * l) as f64;
    let one = best_of(5, || {
        for (c, ks) in keys.chunks(chunk).enumerate() {
            for h in 0..heads {
                let dst = &mut out[h * nk + c * chunk..][..ks.len()];
                dot_f32_gather(&q[h * l..][..l], &latent, l, ks, dst);
            }
        }
        black_box(&out);
    });
    let mut four = vec![0f32; heads * nk];
    let tiled = best_of(5, || {
        for (c, ks) in keys.chunks(chunk).enumerate() {
            for h in (0..heads).step_by(4) {
                let qs = [0, 1, 2, 3].map(|i| &q[(h + i) * l..][..l]);
                let (a, rest) = four[h * nk..(h + 4) * nk].split_at_mut(nk);
                let (b, rest) = rest.split_at_mut(nk);
                let (cc, d) = rest.split_at_mut(nk);
                let outs = [a, b, cc, d].map(|o| &mut o[c * chunk..][..ks.len()]);
                dot_f32_gather4(qs, &latent, l, ks, outs);
            }
        }
        black_box(&four);
    });
    assert!(out
        .iter()
        .zip(&four)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    println!(
        "attention scores, one thread, {heads} heads x {nk} keys x {l}: one head a pass {:.1} GMAC/s, four heads a pass {:.1} GMAC/s ({:.2}x), same bits",
        macs / one / 1e9,
        macs / tiled / 1e9,
        one / tiled
    );
}

/// `gemm`: the prefill products at expert and dense shapes, in multiply-adds per second
/// beside the integer compute probe of the same run, over the rayon pool and on one thread.
fn gemm_table() {
    let (peak, instr) = colibri::computebw::int8_peak_gmacs(5);
    let threads = rayon::current_num_threads();
    println!("8-bit compute probe ({instr}, {threads} threads): {peak:.1} G multiply-adds/s");
    println!(
        "  {:<7} {:>5} x {:>5} {:>5}  {:>9} {:>6}  {:>9} {:>6}  {:>9} {:>6}",
        "format", "rows", "cols", "pos", "G MAC/s", "ratio", "1 thread", "ratio", "cold", "ratio"
    );
    println!("  (last pair: one thread, a different matrix each call, 256 MiB of them)");
    let mut rng = Rng::new(0x9e37_79b9);
    let only = std::env::var("GEMM_FMT").ok();
    for fmt in [
        QFormat::I4G64,
        QFormat::I3G64,
        QFormat::I4Row,
        QFormat::I8Row,
    ] {
        if only.as_deref().is_some_and(|o| o != fmt.name()) {
            continue;
        }
        for (rows, cols) in [(768, 2048), (2048, 768), (2048, 2048)] {
            let m = random_matrix(&mut rng, fmt, rows, cols);
            let count = (256 << 20) / fmt.data_len(rows, cols);
            let cold_set: Vec<QMatrix> = (0..count)
                .map(|_| random_matrix(&mut rng, fmt, rows, cols))
                .collect();
            for n in [2, 4, 8, 16, 64] {
                let x = rng.f32s(cols * n);
                let mut y = vec![0f32; rows * n];
                let macs = (rows * cols * n) as f64;
                let reps = ((4e9 / macs) as usize).clamp(3, 200);
                let mut rate = || {
                    m.matmul_i8act(&x, n, &mut y);
                    macs / best_of(reps, || m.matmul_i8act(&x, n, &mut y)) / 1e9
                };
                let all = rate();
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .expect("a one-thread pool");
                let one = pool.install(&mut rate);
                // The same product over matrices cycled from memory (as a prefill meets each
                // expert once a chunk), on one thread.
                let cold = pool.install(|| {
                    let t = Instant::now();
                    for m in &cold_set {
                        m.matmul_i8act(&x, n, &mut y);
                    }
                    macs * cold_set.len() as f64 / t.elapsed().as_secs_f64() / 1e9
                });
                println!(
                    "  {:<7} {rows:>5} x {cols:>5} {n:>5}  {all:>9.1} {:>6.3}  {one:>9.1} {:>6.3}  {cold:>9.1} {:>6.3}",
                    fmt.name(),
                    all / peak,
                    one * threads as f64 / peak,
                    cold * threads as f64 / peak
                );
            }
        }
    }
}

/// The GGUF types [`ggml_table`] measures (the 32-element types; the K-quants and IQ types
/// join the same list).
const GGML_TYPES: [GgmlType; 7] = [
    GgmlType::Q8_0,
    GgmlType::MXFP4,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
];

/// Where a block of `ty` keeps an f16 scale to be set to a sane value (`None`: MXFP4's e8m0
/// byte 0; empty: leave the random bytes, which decode to finite values anyway).
fn ggml_scale_offsets(ty: GgmlType) -> Option<&'static [usize]> {
    use GgmlType::*;
    match ty {
        MXFP4 => None,
        Q4_1 | Q5_1 | Q4_K | Q5_K => Some(&[0, 2]),
        Q2_K => Some(&[80, 82]),
        Q3_K => Some(&[108]),
        Q6_K => Some(&[208]),
        IQ1_M => Some(&[]),
        _ => Some(&[0]),
    }
}

/// A random `[rows, cols]` matrix of GGUF type `ty`: random quants, scales near 0.01 (no
/// infinities, NaNs or subnormals to slow a float unit).
fn random_ggml(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> QMatrix {
    let data = random_ggml_bytes(rng, ty, rows, cols);
    QMatrix::from_ggml(ty, rows, cols, data).expect("whole blocks")
}

/// The blocks of [`random_ggml`]'s matrix.
fn random_ggml_bytes(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut data = rng.bytes(rows * cols / ty.block_elems() * bb);
    let f = half::f16::from_f32(0.01).to_le_bytes();
    for b in data.chunks_exact_mut(bb) {
        match ggml_scale_offsets(ty) {
            None => b[0] = 120 + b[0] % 8,
            Some(offs) => offs.iter().for_each(|&o| b[o..o + 2].copy_from_slice(&f)),
        }
    }
    data
}

/// GGUF types computed as stored, per kernel set: one thread on a matrix in L2 (the kernel's
/// own speed, GB/s of weights), and decode from memory with every thread against the probe.
fn ggml_table(quick: bool, only: Option<&str>) {
    // Expert gate/up and down of a qwen3_moe-like model, and a square dense projection.
    let shapes: [(&str, usize, usize); 3] = [
        ("2048->768", 768, 2048),
        ("768->2048", 2048, 768),
        ("4096->4096", 4096, 4096),
    ];
    let budget = if quick {
        DECODE_BYTES / 4
    } else {
        DECODE_BYTES
    };
    let rounds = if quick { 2 } else { 4 };
    println!("GGUF types: one thread, matrix in L2 (GB/s of weights); decode from memory");
    println!(
        "{:<7} {:<11} {:>9} {:>9} {:<11} {:>7} {:>7} {:>6}",
        "type", "kernels", "L2 2048", "L2 768", "decode", "GB/s", "probe", "ratio"
    );
    let mut sets = vec![KernelSet::portable()];
    sets.extend(
        KernelSet::available()
            .into_iter()
            .filter(|k| k.name() != "portable"),
    );
    for ty in GGML_TYPES {
        if only.is_some_and(|o| o != ty.name()) {
            continue;
        }
        for &k in &sets {
            let hot = |cols: usize| {
                let mut rng = Rng::new(42);
                let rows = 256 * 6144 / cols;
                let m = random_ggml(&mut rng, ty, rows, cols);
                hot_one_thread_matrix_gbs(k, &m, rows, cols)
            };
            let (h2048, h768) = (hot(2048), hot(768));
            for (n, (label, rows, cols)) in shapes.into_iter().enumerate() {
                // The portable reference is the baseline, not a candidate: one shape.
                if k.name() == "portable" && n > 0 {
                    continue;
                }
                let (g, bw) = decode_vs_probe(rounds, ggml_decode_case(k, ty, rows, cols, budget));
                let hots = if n == 0 {
                    format!("{h2048:>9.2} {h768:>9.2}")
                } else {
                    format!("{:>9} {:>9}", "", "")
                };
                println!(
                    "{:<7} {:<11} {hots} {:<11} {:>7.2} {:>7.2} {:>6.2}",
                    ty.name(),
                    k.name(),
                    label,
                    g,
                    bw,
                    g / bw
                );
            }
        }
    }
    println!();
}

/// One thread, `m` (in L2) times one activation row: GB/s of weights.
fn hot_one_thread_matrix_gbs(k: &KernelSet, m: &QMatrix, rows: usize, cols: usize) -> f64 {
    let mut rng = Rng::new(7);
    let x = rng.f32s(cols);
    let mut y = vec![0f32; rows];
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    one.install(|| {
        m.matmul_i8act_with(k, &x, 1, &mut y);
        let dt = best_of(20, || m.matmul_i8act_with(k, &x, 1, &mut y));
        m.resident_bytes() as f64 / dt / 1e9
    })
}

/// [`decode_case`] for a GGUF type.
fn ggml_decode_case(
    k: &'static KernelSet,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    budget: usize,
) -> impl FnMut() -> f64 {
    let one = rows * cols / ty.block_elems() * ty.block_bytes();
    decode_case_of(k, rows, cols, budget, one, move |rng| {
        random_ggml(rng, ty, rows, cols)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "gemm") {
        gemm_table();
        return;
    }
    if args.iter().any(|a| a == "attn") {
        attention_table();
        attn_prefill::prefill_table();
        return;
    }
    let quick = args.iter().any(|a| a == "quick");
    if args.iter().any(|a| a == "kquant") {
        ggml_kquant_table(quick);
        return;
    }
    if args.iter().any(|a| a == "moe") {
        colibri::quant::pool::SpinPool::global();
        if args.iter().any(|a| a == "inplace") {
            in_place_pages::in_place_pages_table();
        } else if args.iter().any(|a| a == "pages") {
            moe_pages::pages_table();
        } else {
            moe_table();
        }
        return;
    }
    let threads_only = args.iter().any(|a| a == "threads");
    let only = args.iter().find_map(|a| a.strip_prefix("fmt="));
    let decode_only = args.iter().any(|a| a == "decode");
    let tune = args.iter().any(|a| a == "tune");
    // The spin pool takes its size from the rayon pool of its first caller: made here, on
    // the global pool's threads, not inside the one-thread pools below (which left it with
    // no worker, so every "spin" row ran on one thread).
    colibri::quant::pool::SpinPool::global();
    let bw = read_bandwidth_gbs(1024, 5);
    if args.iter().any(|a| a == "ggml") {
        println!("memory read bandwidth probe (1 GiB, all threads, best of 5): {bw:.2} GB/s\n");
        ggml_tile::tile_table(only);
        if !args.iter().any(|a| a == "tile") {
            ggml_table(quick, only);
        }
        return;
    }
    println!(
        "kernels: detected {} (available: {:?}); rayon threads: {}",
        KernelSet::detected().name(),
        KernelSet::available()
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>(),
        rayon::current_num_threads()
    );
    println!("memory read bandwidth probe (1 GiB, all threads, best of 5): {bw:.2} GB/s\n");
    println!("kernel speed, one thread, 1.5M weights in L2 (rows x cols), GB/s of weights:");
    let fmts = [
        QFormat::I8Row,
        QFormat::I4Row,
        QFormat::I4G64,
        QFormat::I3G64,
        QFormat::I2Row,
    ];
    print!("  {:<11} {:>5}", "", "cols");
    fmts.iter().for_each(|f| print!(" {:>9}", f.name()));
    println!();
    let sets = KernelSet::available();
    let sets = if quick { &sets[..1] } else { &sets[..] };
    for k in sets {
        for cols in [6144, 2048, 1024] {
            print!("  {:<11} {cols:>5}", k.name());
            fmts.iter()
                .for_each(|&f| print!(" {:>9.2}", hot_one_thread_gbs(k, f, cols)));
            println!();
        }
    }
    println!();
    if tune {
        tune_table(only);
        return;
    }
    if !threads_only {
        kernels_table(quick, only, decode_only);
    }
    if only.is_none() {
        threads_table();
    }
}
