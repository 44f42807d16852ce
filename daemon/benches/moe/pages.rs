//! The medium model's MoE layer at decode with its weights in 2 MiB pages against 4 KiB pages
//! (`cargo bench --bench kernels -- moe pages`): what the TLB costs a decode step whose experts
//! are many separate buffers of 4 KiB pages. The layers' matrices lie one after another in a
//! slab (2 MiB aligned) that is advised `MADV_HUGEPAGE` or `MADV_NOHUGEPAGE` before its first
//! touch, so the two differ only in their page size; beside them the same layer with every
//! matrix in a buffer of its own, as the bench's other rows and the expert loads allocate
//! them, measured again after `quant::hugepages::collapse_resident` remapped those buffers.
//! Each row is best of the rounds, as microseconds a layer and a ratio to the probe of the
//! same round.

use std::alloc::{alloc, dealloc, Layout};
use std::hint::black_box;
use std::sync::Arc;

use colibri::membw::read_bandwidth_gbs;
use colibri::quant::{set_threading, QFormat, QMatrix, SharedBytes, Threading};

use super::{best_of, random_matrix, Rng, DECODE_BYTES};

const HUGE: usize = 2 << 20;

/// Bytes of one allocation, aligned to 2 MiB, advised before their first touch.
struct Slab {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the slab's bytes are written once, while it is built (through `&mut`), and only read
// afterwards; the pointer is owned by the slab alone and freed in `drop`.
unsafe impl Send for Slab {}
// SAFETY: as above: shared handles only read.
unsafe impl Sync for Slab {}

impl Slab {
    /// `len` bytes (rounded up to 2 MiB) in huge pages or not, filled from `rng`.
    fn new(len: usize, huge: bool, rng: &mut Rng) -> Slab {
        let len = len.next_multiple_of(HUGE);
        let layout = Layout::from_size_align(len, HUGE).expect("slab layout");
        // SAFETY: `layout` has a nonzero size.
        let ptr = unsafe { alloc(layout) };
        assert!(!ptr.is_null(), "slab allocation of {len} bytes failed");
        let advice = if huge {
            nix::libc::MADV_HUGEPAGE
        } else {
            nix::libc::MADV_NOHUGEPAGE
        };
        // SAFETY: `ptr..ptr + len` is this allocation, 2 MiB (so page) aligned; the advice only
        // chooses the page size of its later faults. A refusal leaves 4 KiB pages.
        unsafe { nix::libc::madvise(ptr.cast(), len, advice) };
        // SAFETY: the allocation is `len` bytes and nothing else refers to it yet.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        for chunk in bytes.chunks_mut(1 << 20) {
            chunk.copy_from_slice(&rng.bytes(chunk.len()));
        }
        Slab { ptr, len }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this size and alignment.
        unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, HUGE)) }
    }
}

/// One matrix's bytes inside a slab.
struct View {
    slab: Arc<Slab>,
    off: usize,
    len: usize,
}

impl SharedBytes for View {
    fn bytes(&self) -> &[u8] {
        assert!(self.off + self.len <= self.slab.len);
        // SAFETY: in bounds (asserted); the slab lives as long as this view and its bytes no
        // longer change (see `Slab`'s Send/Sync).
        unsafe { std::slice::from_raw_parts(self.slab.ptr.add(self.off), self.len) }
    }
}

/// A layer's experts: `[gate, up, down]` each, the shared one last.
type Layer = Vec<[QMatrix; 3]>;

/// `layers` layers of `top_k` int4-row experts and an int8 shared one (hidden, inter), in one
/// slab in order, or each matrix in its own buffer (`slab: None`).
fn build(
    rng: &mut Rng,
    layers: usize,
    top_k: usize,
    (hidden, inter): (usize, usize),
    slab: Option<bool>,
) -> Vec<Layer> {
    let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
    let fmt_of = |i: usize| {
        if i < top_k {
            QFormat::I4Row
        } else {
            QFormat::I8Row
        }
    };
    let slab = slab.map(|huge| {
        let per_layer: usize = (0..=top_k)
            .flat_map(|i| shapes.map(|(r, c)| fmt_of(i).data_len(r, c).next_multiple_of(64)))
            .sum();
        Arc::new(Slab::new(layers * per_layer, huge, rng))
    });
    let mut off = 0;
    (0..layers)
        .map(|_| {
            (0..=top_k)
                .map(|i| {
                    shapes.map(|(rows, cols)| {
                        let fmt = fmt_of(i);
                        let Some(slab) = &slab else {
                            return random_matrix(rng, fmt, rows, cols);
                        };
                        let len = fmt.data_len(rows, cols);
                        let view = View {
                            slab: slab.clone(),
                            off,
                            len,
                        };
                        off += len.next_multiple_of(64);
                        let scales = vec![0.01; fmt.scales_len(rows, cols)];
                        QMatrix::from_shared(rows, cols, Arc::new(view), scales)
                            .expect("lengths match")
                    })
                })
                .collect()
        })
        .collect()
}

/// One decode pass of a layer: every gate and up in one region, SwiGLU, every down.
fn layer_pass(layer: &Layer, x: &[f32], gu: &mut [f32], h: &mut [f32], out: &mut [f32]) {
    let inter = layer[0][0].rows();
    let members = layer.len();
    QMatrix::matmul_batch_i8act(2 * members, |j| (&layer[j / 2][j % 2], x), gu);
    for (i, hi) in h.chunks_exact_mut(inter).enumerate() {
        let (g, u) = gu[2 * i * inter..2 * (i + 1) * inter].split_at(inter);
        colibri::quant::expf::silu_mul_into(hi, g, u);
    }
    let h = &*h;
    QMatrix::matmul_batch_i8act(
        members,
        |i| (&layer[i][2], &h[i * inter..(i + 1) * inter]),
        out,
    );
    black_box(&*out);
}

/// Kilobytes of this process's memory in huge pages (`AnonHugePages`), if readable.
fn anon_huge_kb() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = s.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub fn pages_table() {
    let (hidden, inter, top_k) = (2048usize, 768usize, 8usize);
    let mut rng = Rng::new(0x9A6E);
    let bytes =
        |fmt: QFormat, rows, cols| fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols);
    let per_expert = |fmt| 2 * bytes(fmt, inter, hidden) + bytes(fmt, hidden, inter);
    let layer_bytes = top_k * per_expert(QFormat::I4Row) + per_expert(QFormat::I8Row);
    let layers = DECODE_BYTES.div_ceil(layer_bytes);
    let before = anon_huge_kb().unwrap_or(0);
    let huge = build(&mut rng, layers, top_k, (hidden, inter), Some(true));
    let huge_kb = anon_huge_kb().unwrap_or(0).saturating_sub(before);
    let small = build(&mut rng, layers, top_k, (hidden, inter), Some(false));
    let own = build(&mut rng, layers, top_k, (hidden, inter), None);
    let x = rng.f32s(hidden);
    let members = top_k + 1;
    let (mut gu, mut h) = (vec![0f32; 2 * members * inter], vec![0f32; members * inter]);
    let mut out = vec![0f32; members * hidden];
    set_threading(Threading::Spin);
    println!(
        "\nMoE layer at decode by page size ({top_k} x int4-row {hidden}x{inter} + int8 shared), \
         {layers} layers of {:.1} MB cycled; spin pool; {} MB of the 2 MiB slab in huge pages",
        layer_bytes as f64 / 1e6,
        huge_kb / 1024
    );
    // Before and after `hugepages::collapse_resident` (what the daemon runs once its weights
    // are loaded): it remaps the buffers of `own` and leaves the slabs as they are (the 2 MiB
    // one is huge already, the 4 KiB one is advised against huge pages).
    let labels = [
        [
            "slab, 2 MiB pages",
            "slab, 4 KiB pages",
            "a buffer a matrix",
        ],
        [
            "slab, 2 MiB pages",
            "slab, 4 KiB pages",
            "a buffer a matrix, remapped",
        ],
    ];
    let sets: [&Vec<Layer>; 3] = [&huge, &small, &own];
    for (phase, labels) in labels.iter().enumerate() {
        if phase == 1 {
            let t0 = std::time::Instant::now();
            let done = colibri::quant::hugepages::collapse_resident();
            println!(
                "collapse_resident: {} of {} resident 2 MiB extents now huge ({:.0} MB) in {:.2}s",
                done.huge,
                done.asked,
                done.huge_bytes() as f64 / 1e6,
                t0.elapsed().as_secs_f64()
            );
        }
        // (best seconds, best ratio) per set
        let mut best = [(f64::MAX, 0f64); 3];
        let mut best_bw = 0f64;
        rayon::scope(|_| {
            for round in 0..6 {
                let bw = read_bandwidth_gbs(256, 1);
                best_bw = best_bw.max(bw);
                // Alternate the order so no set always runs right after the probe.
                for k in 0..3 {
                    let s = if round % 2 == 0 { k } else { 2 - k };
                    let mut pass = || {
                        for l in sets[s] {
                            layer_pass(l, &x, &mut gu, &mut h, &mut out);
                        }
                    };
                    pass();
                    let t = best_of(2, &mut pass);
                    best[s].0 = best[s].0.min(t);
                    best[s].1 = best[s].1.max((layers * layer_bytes) as f64 / t / 1e9 / bw);
                }
            }
        });
        println!("probe (256 MiB, best): {best_bw:.2} GB/s");
        for (label, (t, ratio)) in labels.iter().zip(best) {
            println!(
                "{label:<30} {:>7.1} us/layer, ratio {ratio:.3}",
                t / layers as f64 * 1e6
            );
        }
    }
    set_threading(Threading::Rayon);
}
