//! The probes `plan` predicts from: disk reads of one expert's size through O_DIRECT at the
//! I/O pool's depth (on a scratch file, so a model need not be on disk yet), the dense
//! prefill kernel on a chunk of positions, and the expert products at the rows one expert
//! gets in a chunk. The memory probe is the benchmarks' own (`crate::membw`).

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use super::prefill::MlaWidths;
use super::IO_DEPTH;
use crate::error::EngineError;
use crate::quant::QFormat;

/// The dense prefill probe's shape: one dense-sized matrix times a chunk of positions (the
/// engine feeds a prompt `PREFILL_CHUNK` positions at a time).
const PROBE_ROWS: usize = 2048;
const PROBE_COLS: usize = 2048;
const PROBE_BATCH: usize = crate::engine::PREFILL_CHUNK;

/// Reads `count` blocks of `len` bytes at random aligned offsets of `path` with `depth`
/// threads, through O_DIRECT when `direct` (buffered where the filesystem refuses it, said in
/// the result), else through the page cache.
pub(super) fn disk_read_probe(
    path: &Path,
    len: usize,
    depth: usize,
    count: usize,
    direct: bool,
) -> std::io::Result<(f64, bool)> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const ALIGN: usize = 4096;
    let len = len.div_ceil(ALIGN) * ALIGN;
    let size = std::fs::metadata(path)?.len();
    let blocks = (size / len as u64).max(1);
    let opened = if direct {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
            .open(path)
            .ok()
    } else {
        None
    };
    let (file, direct) = match opened {
        Some(f) => (f, true),
        None => (std::fs::File::open(path)?, false),
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t0 = Instant::now();
    let results: Vec<std::io::Result<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth.max(1))
            .map(|_| {
                s.spawn(|| -> std::io::Result<u64> {
                    // One aligned window per thread (O_DIRECT needs the buffer aligned too).
                    let mut raw = vec![0u8; len + ALIGN];
                    let pad = raw.as_ptr().align_offset(ALIGN);
                    let buf = &mut raw[pad..pad + len];
                    let mut bytes = 0u64;
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= count {
                            return Ok(bytes);
                        }
                        // splitmix64 of the index: a fixed, spread sequence of blocks.
                        let mut z = (i as u64)
                            .wrapping_add(1)
                            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                        z ^= z >> 31;
                        let at = (z % blocks) * len as u64;
                        file.read_exact_at(buf, at)?;
                        bytes += len as u64;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("probe thread panicked")))
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let mut bytes = 0;
    for r in results {
        bytes += r?;
    }
    Ok((bytes as f64 / secs.max(1e-9) / 1e9, direct))
}

/// The disk probe on a scratch file in `dir` (written, fsynced, read, removed).
pub(super) fn probe_disk(dir: &Path, read_len: u64) -> Result<(f64, String), EngineError> {
    let stat = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| EngineError::Usage(format!("--probe-dir {}: {e}", dir.display())))?;
    let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    // 1 GiB, or what the disk has room for; enough blocks that the reads spread.
    let size = (1u64 << 30).min(free / 4);
    if size < 64 * read_len.max(1 << 20) {
        return Err(EngineError::Usage(format!(
            "--probe-dir {}: {} MB free, the disk probe needs {} MB: give another --probe-dir or --disk-gbs",
            dir.display(),
            free / 1_000_000,
            64 * read_len.max(1 << 20) * 4 / 1_000_000
        )));
    }
    let path = dir.join(format!(".colibri-plan-probe.{}", std::process::id()));
    let result = (|| -> std::io::Result<(f64, bool)> {
        write_scratch(&path, size)?.sync_all()?;
        let reads = ((size / read_len.max(1)) as usize / 2).clamp(32, 2048);
        disk_read_probe(&path, read_len as usize, IO_DEPTH, reads, true)
    })();
    let _ = std::fs::remove_file(&path);
    let (gbs, direct) =
        result.map_err(|e| EngineError::Usage(format!("disk probe in {}: {e}", dir.display())))?;
    let how = format!(
        "{} reads of {:.1} MB at depth {IO_DEPTH} in {}{}",
        if direct { "O_DIRECT" } else { "buffered" },
        read_len as f64 / 1e6,
        dir.display(),
        if direct {
            ""
        } else {
            " (O_DIRECT refused: the page cache may inflate it)"
        }
    );
    Ok((gbs, how))
}

/// Blocks [`write_scratch`] writes: a scratch file is a whole number of them.
const SCRATCH_BLOCK: usize = 8 << 20;

/// Writes a scratch file of `size` bytes rounded up to whole [`SCRATCH_BLOCK`]s (at least
/// one) of pseudo-random bytes, which no filesystem compresses; returns it open for writing.
fn write_scratch(path: &Path, size: u64) -> std::io::Result<std::fs::File> {
    let mut block = vec![0u8; SCRATCH_BLOCK];
    let mut x = crate::rng::XorShift64(0x2545_f491_4f6c_dd1d);
    for b in block.chunks_mut(8) {
        b.copy_from_slice(&x.next_u64().to_le_bytes()[..b.len()]);
    }
    let mut f = std::fs::File::create(path)?;
    for _ in 0..size.div_ceil(SCRATCH_BLOCK as u64).max(1) {
        f.write_all(&block)?;
    }
    Ok(f)
}

/// Bytes per second, billions, at which a page-cache hit lands in the reader's buffer: reads
/// of `read_len` bytes (one expert) at the I/O pool's depth from a scratch file in `dir`
/// that the page cache holds (written, then read once through), the kernel copying each to
/// the reader. The copies run on the cores the products run on: `plan` prices them as compute
/// ([`super::Loads`]), at this rate (all the cores copying).
pub(super) fn probe_copy(dir: &Path, read_len: u64) -> Result<(f64, String), EngineError> {
    // 256 MiB: far past the caches, well inside any page cache `plan` would count.
    probe_copy_of(dir, read_len, 256 << 20)
}

/// [`probe_copy`] on a scratch file of `size` bytes (rounded up to whole 8 MiB blocks).
pub(super) fn probe_copy_of(
    dir: &Path,
    read_len: u64,
    size: usize,
) -> Result<(f64, String), EngineError> {
    let size = size.div_ceil(SCRATCH_BLOCK).max(1) * SCRATCH_BLOCK;
    let len = (read_len as usize).clamp(4096, size / 8);
    let path = dir.join(format!(".colibri-plan-copy.{}", std::process::id()));
    let result = (|| -> std::io::Result<f64> {
        drop(write_scratch(&path, size as u64)?);
        // Once through, so that every page is cached whatever the write left.
        std::io::copy(&mut std::fs::File::open(&path)?, &mut std::io::sink())?;
        let reads = (size / len * 4).clamp(64, 4096);
        // The median of three, as the compute probes take (`median_pass`).
        let mut rates = Vec::new();
        for _ in 0..3 {
            rates.push(disk_read_probe(&path, len, IO_DEPTH, reads, false)?.0);
        }
        rates.sort_by(f64::total_cmp);
        Ok(rates[1])
    })();
    let _ = std::fs::remove_file(&path);
    let gbs =
        result.map_err(|e| EngineError::Usage(format!("copy probe in {}: {e}", dir.display())))?;
    Ok((
        gbs,
        format!(
            "page-cache reads of {:.1} MB at depth {IO_DEPTH}, {} MiB cached",
            len as f64 / 1e6,
            size >> 20
        ),
    ))
}

/// The median seconds of `pass` over at least `min_passes` passes and `window`: on a shared
/// machine the median is what a minute-long prefill gets, where the best pass is the one
/// moment the other processes left the cores alone (it predicted prefills 1.4x too fast at
/// load 12 on 2 cores).
fn median_pass(min_passes: usize, window: Duration, mut pass: impl FnMut()) -> f64 {
    let mut times = Vec::new();
    let t_all = Instant::now();
    while t_all.elapsed() < window || times.len() < min_passes {
        let t = Instant::now();
        pass();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// One random expert's `[inter, hidden]` gate (also used as its up) and `[hidden, inter]`
/// down in `fmt`, weights of a trained layer's scale, for the expert probes.
fn expert_matrices(
    fmt: QFormat,
    hidden: usize,
    inter: usize,
    x: &mut crate::rng::XorShift64,
) -> (crate::quant::QMatrix, crate::quant::QMatrix) {
    let scale = 1.0 / (hidden as f32).sqrt();
    let mut next = || (x.unit_f32() - 0.5) * scale;
    let gate: Vec<f32> = (0..inter * hidden).map(|_| next()).collect();
    let down: Vec<f32> = (0..hidden * inter).map(|_| next()).collect();
    (
        crate::quant::QMatrix::quantize(&gate, inter, hidden, fmt),
        crate::quant::QMatrix::quantize(&down, hidden, inter, fmt),
    )
}

/// The prefill's expert products: `n` experts of `[inter, hidden]` gate and up and
/// `[hidden, inter]` down in `fmt`, each multiplied by its `rows` rows on one thread, the
/// experts spread over the threads, as the engine runs a chunk's experts when each has few
/// rows (`experts::run`'s few-rows way). `n` is large enough that the weights stream from
/// memory as a chunk's do (one copy of the quantized bytes per expert). The median of a few
/// passes.
pub(super) fn probe_experts(
    fmt: QFormat,
    hidden: usize,
    inter: usize,
    rows: usize,
) -> (f64, String) {
    use rayon::prelude::*;
    use std::sync::Arc;
    let (hidden, inter, rows) = (hidden.max(1), inter.max(1), rows.max(1));
    let mut x = crate::rng::XorShift64(0x51_7cc1_b727);
    let (g, d) = expert_matrices(fmt, hidden, inter, &mut x);
    let mut next = || x.unit_f32() - 0.5;
    let one = (g.resident_bytes() * 2 + d.resident_bytes()).max(1);
    // 128 MB of distinct weights (past any last-level cache), at least one expert a thread.
    let n = (128_000_000 / one)
        .max(rayon::current_num_threads())
        .min(512);
    let experts: Vec<[Arc<crate::quant::QMatrix>; 3]> = (0..n)
        .map(|_| {
            [
                Arc::new(g.clone()),
                Arc::new(g.clone()),
                Arc::new(d.clone()),
            ]
        })
        .collect();
    let xs: Vec<f32> = (0..rows * hidden).map(|_| next()).collect();
    let pass = || {
        experts.par_iter().for_each(|[gate, up, down]| {
            let (mut gy, mut uy) = (vec![0f32; rows * inter], vec![0f32; rows * inter]);
            let mut y = vec![0f32; rows * hidden];
            crate::quant::QMatrix::matmul_pair_i8act_on_caller(
                gate, up, &xs, rows, &mut gy, &mut uy,
            );
            crate::quant::expf::silu_mul(&mut gy, &uy);
            down.matmul_i8act_on_caller(&gy, rows, &mut y);
        })
    };
    let secs = median_pass(5, Duration::from_millis(600), pass);
    let gmacs = (n * 3 * hidden * inter * rows) as f64 / secs / 1e9;
    (
        gmacs,
        format!(
            "{} experts {inter}x{hidden} x {rows} rows each, {n} experts over {} threads",
            fmt.name(),
            rayon::current_num_threads()
        ),
    )
}

/// Heads the MLA probe runs at most: heads are independent tasks of the same size, so a
/// share of the model's 128 keeps a pass under 100 ms on a quiet 2-core machine, and the
/// rate is the rate.
const MLA_PROBE_HEADS: usize = 8;

/// Attention's core as the CPU path computes it for a `prompt`-position prompt: grouped-query
/// models through `model::gqa`'s core on a chunk of the prompt's middle, MLA models (`mla`:
/// their widths and the dense format kv_b_proj is in) through `model::mla`'s on the whole
/// prompt's chunks (see [`probe_mla_attention`]). Multiply-adds per second, the median of a
/// few passes.
pub(super) fn probe_attention(prompt: usize, mla: Option<(MlaWidths, QFormat)>) -> (f64, String) {
    match mla {
        Some((m, fmt)) => probe_mla_attention(prompt, m, fmt),
        // The middle of the prompt: the mean keys a position sees.
        None => probe_gqa_attention(prompt / 2),
    }
}

/// Attention's quadratic part as the grouped-query CPU path computes it (`model::gqa` through
/// `model::attn_core`, the same code): f32 dot products of each query head with every visible
/// key, a softmax, the weighted sum of the values, a chunk's row tiles across the threads.
/// Timed at grouped-query heads of 128 (32 query heads, 4 key-value heads), a chunk ending at
/// position `ctx`, the middle of a 1k prompt; the rate is multiply-adds of query-key pairs
/// (scores and values) per second. The median of a few passes.
fn probe_gqa_attention(ctx: usize) -> (f64, String) {
    use crate::model::attn_core::{Attend, AttnShape, Visible};
    const HEADS: usize = 32;
    const KV_HEADS: usize = 4;
    const HD: usize = 128;
    // The chunk's rows are the last of a `ctx`-position prompt, each seeing the keys up to
    // its own position, as the model's prefill runs them (`model::attn_core`).
    let ctx = ctx.max(1);
    let rows = crate::engine::PREFILL_CHUNK.min(ctx);
    let (qw, kw) = (HEADS * HD, KV_HEADS * HD);
    let mut x = crate::rng::XorShift64(0x2f_1d3b_7a09);
    let mut next = || x.unit_f32() - 0.5;
    let q: Vec<f32> = (0..rows * qw).map(|_| next()).collect();
    let k: Vec<f32> = (0..ctx * kw).map(|_| next()).collect();
    let v: Vec<f32> = (0..ctx * kw).map(|_| next()).collect();
    let mut out = vec![0f32; rows * qw];
    let core = Attend {
        shape: AttnShape {
            heads: HEADS,
            kv_heads: KV_HEADS,
            head_dim: HD,
            scale: 1.0 / (HD as f32).sqrt(),
        },
        q: &q,
        k: &k,
        v: &v,
        visible: Visible {
            pos0: ctx - rows,
            window: None,
        },
        sinks: None,
    };
    let keys: usize = (0..rows).map(|s| core.visible.keys(s).len()).sum();
    let secs = median_pass(5, Duration::from_millis(400), || core.run_par(&mut out));
    let gmacs = (keys * HEADS * 2 * HD) as f64 / secs / 1e9;
    (
        gmacs,
        format!(
            "f32, {rows} queries x up to {ctx} keys (causal), {HEADS} heads of {HD} on \
             {KV_HEADS}, {} threads",
            rayon::current_num_threads()
        ),
    )
}

/// MLA's prefill attention as the engine runs a prompt (`model::mla`'s core, the same code,
/// on synthetic weights): the prompt's chunks in turn, each appended to the cache, then every
/// head rebuilding its keys and values from the whole cached latent (`kv_b_proj` in `fmt`,
/// int8 activations as the engine's default) and scoring its `nope + rope`-wide keys and
/// summing its `v`-wide values for each row of the chunk. At the model's widths and up to
/// [`MLA_PROBE_HEADS`] of its heads (at least two a thread); the rate counts both parts, as
/// the plan's attention term does (`prefill::ttft`), over the same chunks, so the mix of the
/// two (int8 products and f32 gathers, whose share grows with the cache) is the prompt's.
fn probe_mla_attention(prompt: usize, m: MlaWidths, fmt: QFormat) -> (f64, String) {
    use crate::model::mla::{probe::PrefillProbe, MlaDims};
    let chunks = super::prefill::chunks(prompt.max(1), crate::engine::PREFILL_CHUNK);
    let threads = rayon::current_num_threads();
    let heads = m.heads.min(MLA_PROBE_HEADS.max(2 * threads)).max(1);
    let dims = MlaDims {
        heads,
        nope: m.nope,
        rope: m.rope,
        v: m.v,
        kv_lora: m.kv_lora.max(1),
        softmax_factor: 1.0,
        interleave: true,
    };
    let act = crate::quant::ActMode::Int8;
    let mut probe = PrefillProbe::new(dims, fmt, act, &chunks);
    let p = prompt.max(1) as f64;
    let pairs = p * (p + 1.0) / 2.0;
    let rebuilt =
        super::prefill::positions_rebuilt(prompt.max(1), crate::engine::PREFILL_CHUNK) as f64;
    let macs = pairs * (heads * (m.nope + m.rope + m.v)) as f64
        + rebuilt * (heads * (m.nope + m.v) * dims.kv_lora) as f64;
    let secs = median_pass(3, Duration::from_millis(300), || {
        probe.run();
    });
    (
        macs / secs / 1e9,
        format!(
            "MLA core: a {prompt}-position prompt in chunks of {}, kv_b_proj {} rebuilt over \
             the cache each chunk, {heads} of {} heads of {}+{} / {}, latent {}, {threads} \
             threads",
            crate::engine::PREFILL_CHUNK,
            fmt.name(),
            m.heads,
            m.nope,
            m.rope,
            m.v,
            m.kv_lora,
        ),
    )
}

/// Weights the dense decode probe's products read a pass: well past a core's caches, as a
/// decode token's dense part is (hundreds of megabytes at real shapes).
pub(super) const DENSE_DECODE_BYTES: usize = 512 << 20;

/// The dense format's matrix-vector product, a decode token's dense part: copies of one
/// `[width, width]` matrix in `fmt` (the model's hidden size, at most 8192) until `bytes` of
/// weights, each times one position in turn on all threads, in 2 MiB pages as the engine holds
/// its weights (`quant::hugepages`; `COLI_HUGEPAGES=0` keeps 4 KiB pages for both). Weight
/// bytes a second, billions, the median of a few passes: below the memory probe where the
/// format's unpacking, not the memory, bounds the product.
pub(super) fn probe_dense_decode(fmt: QFormat, hidden: usize, bytes: usize) -> (f64, String) {
    let width = (hidden.clamp(64, 8192) / 64) * 64;
    let mut x = crate::rng::XorShift64(0x6a09_e667_f3bc);
    let mut next = || x.unit_f32() - 0.5;
    let w: Vec<f32> = (0..width * width).map(|_| next() * 0.05).collect();
    let m = crate::quant::QMatrix::quantize(&w, width, width, fmt);
    drop(w);
    let one = m.resident_bytes().max(1);
    let copies: Vec<crate::quant::QMatrix> = (0..(bytes / one).max(1)).map(|_| m.clone()).collect();
    drop(m);
    crate::quant::hugepages::remap_weights();
    let xs: Vec<f32> = (0..width).map(|_| next()).collect();
    let mut y = vec![0f32; width];
    let secs = median_pass(3, Duration::from_millis(600), || {
        for c in &copies {
            c.matmul_i8act(&xs, 1, &mut y);
        }
    });
    let total = copies.len() * one;
    (
        total as f64 / secs / 1e9,
        format!(
            "{} {width}x{width} x 1 position, {:.0} MB of weights, {} threads",
            fmt.name(),
            total as f64 / 1e6,
            rayon::current_num_threads()
        ),
    )
}

/// A decode token's routed experts as the engine runs them: groups of `top_k` experts of
/// `[inter, hidden]` gate and up and `[hidden, inter]` down in `fmt`, one position, each group
/// in one region of the spin pool (`QMatrix::matmul_experts_i8act`, or gate/up then down
/// where one region does not apply), until `bytes` of distinct weights, in 2 MiB pages as the
/// engine holds them. Weight bytes a second, billions, the median of a few passes: an int2 or
/// int3 expert's unpacking can bound its product below the memory, as the dense decode probe
/// finds for the dense format.
pub(super) fn probe_expert_decode(
    fmt: QFormat,
    (hidden, inter, top_k): (usize, usize, usize),
    bytes: usize,
) -> (f64, String) {
    let (hidden, inter, k) = (hidden.max(64), inter.max(64), top_k.max(1));
    let mut x = crate::rng::XorShift64(0x3c6e_f372_fe94);
    let (g, d) = expert_matrices(fmt, hidden, inter, &mut x);
    let mut next = || x.unit_f32() - 0.5;
    let one = (2 * g.resident_bytes() + d.resident_bytes()).max(1);
    // Whole groups of top_k, at least one.
    let n = (bytes / one).div_ceil(k).max(1) * k;
    let experts: Vec<[crate::quant::QMatrix; 3]> =
        (0..n).map(|_| [g.clone(), g.clone(), d.clone()]).collect();
    drop((g, d));
    crate::quant::hugepages::remap_weights();
    let xs: Vec<f32> = (0..hidden).map(|_| next()).collect();
    let (mut gu, mut h) = (vec![0f32; 2 * k * inter], vec![0f32; k * inter]);
    let mut y = vec![0f32; k * hidden];
    let mut chain = crate::quant::ChainScratch::default();
    let secs = median_pass(3, Duration::from_millis(600), || {
        for group in experts.chunks_exact(k) {
            let mats = |i: usize| -> [&crate::quant::QMatrix; 3] {
                let [a, b, c] = &group[i];
                [a, b, c]
            };
            let region = crate::quant::Experts {
                members: k,
                x: &xs,
                mats,
                given: None,
                glu: |_: usize, hi: &mut [f32], g: &[f32], u: &[f32]| {
                    crate::quant::expf::silu_mul_into(hi, g, u)
                },
            };
            if crate::quant::QMatrix::matmul_experts_i8act(
                &region, &mut gu, &mut h, &mut y, &mut chain,
            ) {
                continue;
            }
            // The engine's two-region form: every gate and up, then every down.
            for (i, [gate, up, down]) in group.iter().enumerate() {
                let (gi, ui) = gu[2 * i * inter..2 * (i + 1) * inter].split_at_mut(inter);
                crate::quant::QMatrix::matmul_pair_i8act(gate, up, &xs, 1, gi, ui);
                let hi = &mut h[i * inter..(i + 1) * inter];
                crate::quant::expf::silu_mul_into(hi, gi, ui);
                down.matmul_i8act(hi, 1, &mut y[i * hidden..(i + 1) * hidden]);
            }
        }
    });
    let total = n * one;
    (
        total as f64 / secs / 1e9,
        format!(
            "{} experts {inter}x{hidden} x 1 position in groups of {k}, {:.0} MB of weights, {} threads",
            fmt.name(),
            total as f64 / 1e6,
            rayon::current_num_threads()
        ),
    )
}

/// The dense prefill kernel on a chunk of positions, all threads, the median of a few passes.
pub(super) fn probe_prefill(fmt: QFormat) -> (f64, String) {
    let mut x = crate::rng::XorShift64(0x9e37_79b9);
    let mut next = || x.unit_f32() - 0.5;
    let w: Vec<f32> = (0..PROBE_ROWS * PROBE_COLS)
        .map(|_| next() * 0.05)
        .collect();
    let xs: Vec<f32> = (0..PROBE_COLS * PROBE_BATCH).map(|_| next()).collect();
    let m = crate::quant::QMatrix::quantize(&w, PROBE_ROWS, PROBE_COLS, fmt);
    let mut y = vec![0f32; PROBE_ROWS * PROBE_BATCH];
    let secs = median_pass(5, Duration::from_millis(600), || {
        m.matmul_i8act(&xs, PROBE_BATCH, &mut y)
    });
    let gmacs = (PROBE_ROWS * PROBE_COLS * PROBE_BATCH) as f64 / secs / 1e9;
    (
        gmacs,
        format!(
            "{} {PROBE_ROWS}x{PROBE_COLS} x {PROBE_BATCH} positions, {} threads",
            fmt.name(),
            rayon::current_num_threads()
        ),
    )
}
