//! The expert seam: one call runs a layer's routed experts for a batch of rows (fetch through
//! the tiers, gate/up, SwiGLU, down, the weighted sum, and the shared expert riding along), so
//! the model only routes and never touches an expert matrix. Today's implementation is the
//! CPU's, with three ways through a layer chosen by the batch's shape: one decode row (every
//! ready expert in one or two parallel regions), a few rows (one expert a thread), or many (each
//! expert's products split across the threads). Another backend (a GPU's) goes here, behind
//! the same call.

use std::sync::Arc;

use super::{Expert, ExpertStore, Fetch};
use crate::error::EngineError;
use crate::model::ops::swiglu;
use crate::quant::expf::{silu_mul, silu_mul_into};
use crate::quant::ggml::{ActKind, Q8Act};
use crate::quant::{ActMode, BatchInputs, ChainScratch, Experts, QMatrix};

/// `buf[..len]`, growing `buf` first when it is shorter. The values are whatever an earlier
/// step left: for outputs that are fully overwritten.
pub(crate) fn grow<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}

/// One layer's routed work for a batch of rows, as the router laid it out.
pub struct LayerBatch<'a> {
    /// The layer's index in the store.
    pub layer: usize,
    /// The rows, `(n, hidden)`.
    pub x: &'a [f32],
    pub n: usize,
    pub act: ActMode,
    /// `(row, weight)` pairs grouped by expert, ascending expert then ascending row: expert
    /// `e` owns `pairs[start[e]..start[e + 1]]`.
    pub pairs: &'a [(usize, f32)],
    /// n_experts + 1 prefix offsets into `pairs`.
    pub start: &'a [usize],
    /// The experts with at least one row, ascending.
    pub wanted: &'a [usize],
    /// The shared expert's gate, up and down, which every row also goes through; `None` in
    /// families without one.
    pub shared: Option<[&'a QMatrix; 3]>,
    /// The shared expert's gate then up outputs of a decode row (int8 activations), when the
    /// caller computed them already (with the router's logits): then only its SwiGLU and down
    /// run here.
    pub shared_gu: Option<&'a [f32]>,
}

/// What [`ExpertStore::run_layer`] computes in, kept between steps so a decode step does not
/// allocate.
#[derive(Default)]
pub(crate) struct RunScratch {
    /// Whether each wanted expert's product was computed.
    pub delivered: Vec<bool>,
    /// Expert products, laid out like `pairs` (one hidden-sized row per pair).
    pub products: Vec<f32>,
    /// The rows of `x` routed to one expert, gathered contiguously, and its gate / up outputs.
    pub gathered: Vec<f32>,
    pub g: Vec<f32>,
    pub u: Vec<f32>,
    pub batch: DecodeBatch,
    /// The wanted experts the VRAM tier does not hold.
    pub cpu_wanted: Vec<usize>,
    /// A multi-row step's rows quantized once for every expert's gate and up.
    pub q8: Q8Act,
}

impl RunScratch {
    /// Sized for one decode row of `top_k` experts of `inter` and a shared expert of
    /// `shared_inter` (0: none) over `hidden`, among `n_experts`.
    pub fn for_decode(
        hidden: usize,
        n_experts: usize,
        top_k: usize,
        inter: usize,
        shared_inter: usize,
    ) -> RunScratch {
        let f = |len: usize| vec![0.0f32; len];
        RunScratch {
            delivered: vec![false; n_experts],
            products: f(top_k * hidden),
            gathered: f(hidden),
            g: Vec::new(),
            u: Vec::new(),
            cpu_wanted: Vec::with_capacity(top_k),
            q8: Q8Act::default(),
            batch: DecodeBatch {
                experts: Vec::with_capacity(top_k),
                gu: f(2 * (top_k * inter + shared_inter)),
                h: f(top_k * inter + shared_inter),
                out: f((top_k + 1) * hidden),
                down_in: BatchInputs::default(),
                chain: ChainScratch::default(),
            },
        }
    }
}

/// A decode step's batch of ready experts ([`decode_batches`]).
#[derive(Default)]
pub(crate) struct DecodeBatch {
    pub experts: Vec<(usize, Arc<Expert>)>,
    /// Every member's gate and up outputs, then their SwiGLU products, then their downs.
    pub gu: Vec<f32>,
    pub h: Vec<f32>,
    pub out: Vec<f32>,
    /// The downs' inputs (the SwiGLU products), quantized as they are made.
    pub down_in: BatchInputs,
    /// The one-region form's quantized inputs.
    pub chain: ChainScratch,
}

impl ExpertStore {
    /// The routed experts of `b` (and its shared expert) into `out`, `(n, hidden)`: each
    /// expert's product weighted and summed in ascending expert order, then the shared
    /// expert's added, so the bytes do not depend on the order the tiers deliver experts in.
    pub(crate) fn run_layer(
        &self,
        b: LayerBatch<'_>,
        sc: &mut RunScratch,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let LayerBatch {
            layer,
            x,
            n,
            act,
            pairs,
            start,
            wanted,
            shared: shared_mats,
            shared_gu,
        } = b;
        let hidden = x.len() / n.max(1);
        let RunScratch {
            delivered,
            products,
            gathered,
            g,
            u,
            batch,
            cpu_wanted,
            q8,
        } = sc;
        let delivered = grow(delivered, self.n_experts());
        delivered.fill(false);
        // The store yields experts as they become ready (resident first, loads as they
        // complete); each product goes to its own rows of `products` and the sum below runs in
        // ascending expert order, so the output bytes do not depend on the arrival order (nor
        // on the tier, the VRAM one included, that computed a product).
        // The shared expert's output in the `n` rows after the routed products: a decode
        // step's down products then land in place, the shared one beside the routed ones.
        let split = pairs.len() * hidden;
        let all = grow(products, split + n * hidden);
        let mut to_fetch = wanted;
        if let Some(v) = self.vram.get() {
            if act == ActMode::Int8 && wanted.iter().any(|&e| v.holds(layer, e)) {
                let on_gpu = RoutedRows {
                    x,
                    hidden,
                    pairs,
                    start,
                    wanted,
                };
                match self.run_on_gpu(v, layer, &on_gpu, &mut all[..split], gathered) {
                    Ok(done) => {
                        cpu_wanted.clear();
                        for &e in wanted {
                            if done.contains(&e) {
                                delivered[e] = true;
                            } else {
                                cpu_wanted.push(e);
                            }
                        }
                        to_fetch = cpu_wanted;
                    }
                    // The device is gone: the tier is off for good, and these experts come
                    // from disk like any other, now.
                    Err(why @ crate::gpu::GpuError::Lost(_)) => v.fail(&why),
                    // Work past the device's buffers (a long prefill): this layer's rows run
                    // on the CPU (its VRAM experts read from disk this once); the tier stays.
                    Err(_) => {}
                }
            }
        }
        let wanted_all = wanted;
        let wanted = to_fetch;
        let mut fetch = self.fetch_layer(layer, wanted);
        let shared_done = if n == 1 && act == ActMode::Int8 {
            let sink = DecodeSink {
                start,
                rows: &mut *all,
                shared_row: pairs.len(),
                delivered,
            };
            decode_batches(
                &mut fetch,
                x,
                shared_mats.map(|m| (m, shared_gu)),
                sink,
                batch,
            )?;
            true
        } else if act == ActMode::Int8 && (n <= FEW_ROWS || by_tasks(wanted, start)) {
            let products = &mut all[..split];
            let routed = RoutedRows {
                x,
                hidden,
                pairs,
                start,
                wanted,
            };
            few_rows_batches(&mut fetch, &routed, q8, products, delivered)?;
            false
        } else {
            let products = &mut all[..split];
            for item in &mut fetch {
                let (e, expert) = item?;
                let rows = &pairs[start[e]..start[e + 1]];
                let gathered = grow(gathered, rows.len() * hidden);
                for (g, &(s, _)) in gathered.chunks_exact_mut(hidden).zip(rows) {
                    g.copy_from_slice(&x[s * hidden..(s + 1) * hidden]);
                }
                swiglu(
                    [&expert.gate, &expert.up, &expert.down],
                    expert.oss.as_deref(),
                    gathered,
                    rows.len(),
                    act,
                    (&mut *g, &mut *u),
                    &mut products[start[e] * hidden..start[e + 1] * hidden],
                );
                delivered[e] = true;
            }
            false
        };
        drop(fetch);
        let (products, shared) = all.split_at_mut(split);
        if let Some(&e) = wanted_all.iter().find(|&&e| !delivered[e]) {
            return Err(EngineError::ExpertNotDelivered { layer, expert: e });
        }
        if n >= 2 * SUM_ROWS {
            if let Some([gate, up, down]) = shared_mats.filter(|_| !shared_done) {
                swiglu([gate, up, down], None, x, n, act, (g, u), shared);
            }
            let shared = shared_mats.map(|_| &*shared);
            weighted_sum_par(out, products, pairs, hidden, shared);
            return Ok(());
        }
        out.fill(0.0);
        for &e in wanted_all.iter() {
            let y = &products[start[e] * hidden..start[e + 1] * hidden];
            for (i, &(s, w)) in pairs[start[e]..start[e + 1]].iter().enumerate() {
                for (o, v) in out[s * hidden..(s + 1) * hidden]
                    .iter_mut()
                    .zip(&y[i * hidden..(i + 1) * hidden])
                {
                    *o += v * w;
                }
            }
        }
        if let Some([gate, up, down]) = shared_mats {
            if !shared_done {
                swiglu([gate, up, down], None, x, n, act, (g, u), shared);
            }
            for (o, v) in out.iter_mut().zip(shared.iter()) {
                *o += v;
            }
        }
        Ok(())
    }
}

/// Rows a task of [`weighted_sum_par`] sums.
const SUM_ROWS: usize = 16;

/// `out` (`(n, hidden)`) as [`ExpertStore::run_layer`]'s serial sum makes it: each row the
/// sum of its experts' products (`products`, one row a pair of `pairs`) times their weights
/// in ascending expert order from zero, then the shared expert's row (`shared`, `(n,
/// hidden)`) added; the rows across the threads, [`SUM_ROWS`] a task. Each task walks every
/// pair in order and takes its own rows', so every output element sees the serial sum's
/// additions in the serial sum's order: the same bits. (On the caller alone, a 256-row
/// prefill's sums were a few percent of its experts' stage, the other threads idle.)
pub(super) fn weighted_sum_par(
    out: &mut [f32],
    products: &[f32],
    pairs: &[(usize, f32)],
    hidden: usize,
    shared: Option<&[f32]>,
) {
    let n = out.len() / hidden.max(1);
    crate::quant::par_chunks_mut(out, SUM_ROWS * hidden, n, |t, o| {
        let rows = t * SUM_ROWS..t * SUM_ROWS + o.len() / hidden;
        o.fill(0.0);
        for (j, &(s, w)) in pairs.iter().enumerate() {
            if !rows.contains(&s) {
                continue;
            }
            let at = (s - rows.start) * hidden;
            for (o, v) in o[at..at + hidden]
                .iter_mut()
                .zip(&products[j * hidden..(j + 1) * hidden])
            {
                *o += v * w;
            }
        }
        if let Some(sh) = shared {
            for (o, v) in o
                .iter_mut()
                .zip(sh.get(rows.start * hidden..).unwrap_or(&[]))
            {
                *o += v;
            }
        }
    });
}

/// A layer's rows as the router grouped them (see [`LayerBatch`]).
struct RoutedRows<'a> {
    x: &'a [f32],
    hidden: usize,
    pairs: &'a [(usize, f32)],
    start: &'a [usize],
    wanted: &'a [usize],
}

impl ExpertStore {
    /// The wanted experts the VRAM tier holds, computed there into their rows of `products`
    /// (`gathered` takes their input rows); which ones, ascending. Counted as pinned hits, as
    /// upstream counts its VRAM tier.
    fn run_on_gpu(
        &self,
        v: &crate::gpu::VramTier,
        layer: usize,
        r: &RoutedRows<'_>,
        products: &mut [f32],
        gathered: &mut Vec<f32>,
    ) -> Result<Vec<usize>, crate::gpu::GpuError> {
        let h = r.hidden;
        let on: Vec<usize> = r
            .wanted
            .iter()
            .copied()
            .filter(|&e| v.holds(layer, e))
            .collect();
        let rows: usize = on.iter().map(|&e| r.start[e + 1] - r.start[e]).sum();
        let gathered = grow(gathered, rows * h);
        let mut at = 0;
        for &e in &on {
            for &(s, _) in &r.pairs[r.start[e]..r.start[e + 1]] {
                gathered[at..at + h].copy_from_slice(&r.x[s * h..(s + 1) * h]);
                at += h;
            }
        }
        // Each expert's rows of `gathered` and of `products`, carved in ascending order.
        let mut jobs = Vec::with_capacity(on.len());
        let (mut xs, mut rest) = (&gathered[..], &mut products[..]);
        let mut done_rows = 0;
        for &e in &on {
            let n = r.start[e + 1] - r.start[e];
            let (x, xt) = xs.split_at(n * h);
            let skip = (r.start[e] - done_rows) * h;
            let tail = std::mem::take(&mut rest).split_at_mut(skip).1;
            let (out, tail) = tail.split_at_mut(n * h);
            jobs.push(crate::gpu::ExpertRows {
                expert: e,
                x,
                n,
                out,
            });
            xs = xt;
            rest = tail;
            done_rows = r.start[e + 1];
        }
        v.run(layer, &mut jobs)?;
        self.core
            .stats
            .hits_pin
            .fetch_add(on.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(on)
    }
}

/// Rows at or below which a multi-row MoE step (several sessions decoding together) computes
/// its experts one per thread, each expert's products on that thread alone, instead of
/// splitting every expert's small matmuls across the threads (two forks and joins per expert).
const FEW_ROWS: usize = 32;

/// A prefill's experts also go one per thread while they have this many rows or fewer on
/// average: each expert's share of a chunk is then too small to split well (4 rows an expert
/// at 64 positions, 16 at 256 with 8 of 128 experts, 32 with 8 of 64).
pub(super) const TASK_ROWS: usize = 64;

/// The most rows a task takes: an expert with more is cut into several tasks by rows
/// ([`task_rows`]), each unpacking its weights once for its rows, as a product split across
/// the threads by positions unpacks them once a share of at most this many positions
/// (`ggml::rows`' panel chunk).
pub(super) const MAX_TASK_ROWS: usize = 128;

/// Whether a prefill's experts go one task a thread ([`few_rows_batches`]): while they have
/// [`TASK_ROWS`] or fewer on average, or while their tasks are at least four a thread, enough
/// to keep the threads busy to the end with the largest first. Else (few experts with many
/// rows, many threads) each expert's products are split across all the threads.
///
/// (Whether every expert had at most [`TASK_ROWS`] decided it before: at 256 positions on 8 of
/// 64 experts, a few popular experts sent every layer of the IQ2_XXS bench model to the split
/// products, each expert's three matmuls forked across the threads, with their activations
/// quantized, their SwiGLU and their transposes on the caller alone.)
fn by_tasks(wanted: &[usize], start: &[usize]) -> bool {
    let rows = |e: usize| start[e + 1] - start[e];
    let all: usize = wanted.iter().map(|&e| rows(e)).sum();
    let tasks: usize = wanted
        .iter()
        .map(|&e| rows(e).div_ceil(task_rows(rows(e))))
        .sum();
    all.div_ceil(wanted.len().max(1)) <= TASK_ROWS || tasks >= 4 * rayon::current_num_threads()
}

/// The rows a task of an expert with `rows` rows takes (the last task the rest): `rows` in
/// as few tasks of at most [`MAX_TASK_ROWS`] as there can be, each a whole number of the AMX
/// panels' sixteen positions where it can be. Each product row is its dot's bits whatever
/// the rows beside it in a call, so the cut does not change a bit.
pub(super) fn task_rows(rows: usize) -> usize {
    let tasks = rows.div_ceil(MAX_TASK_ROWS).max(1);
    rows.div_ceil(tasks).next_multiple_of(16).min(MAX_TASK_ROWS)
}

thread_local! {
    /// A worker's gathered rows and gate / up products in [`few_rows_batches`] (taken, then
    /// put back, so a nested task finds it empty and grows its own).
    static FEW: std::cell::Cell<[Vec<f32>; 3]> = std::cell::Cell::new(Default::default());
}

/// The few-rows MoE step: the experts the store can hand over without waiting go through
/// together, one task per expert or per piece of an expert's rows ([`task_rows`]; compute
/// still overlaps the loads in flight), each writing its own rows of `products`. The rows are
/// quantized once for every expert's gate and up (they were quantized again for each expert a
/// row went to, after a copy into that expert's gathered rows). Each product is bit-identical
/// to [`swiglu`]'s: the same kernels on the same quantized rows, run on one thread.
fn few_rows_batches(
    fetch: &mut Fetch,
    r: &RoutedRows<'_>,
    q8: &mut Q8Act,
    products: &mut [f32],
    delivered: &mut [bool],
) -> Result<(), EngineError> {
    use rayon::prelude::*;
    let RoutedRows {
        x,
        hidden,
        pairs,
        start,
        ..
    } = *r;
    let mut batch = Vec::new();
    // The rows quantized once, as the first expert's gate and up take them, for every
    // expert whose gate and up take the same (`None`: not yet, or not a GGUF type).
    let mut quantized: Option<ActKind> = None;
    loop {
        batch.clear();
        match fetch.next() {
            Some(item) => batch.push(item?),
            None => return Ok(()),
        }
        while let Some(item) = fetch.next_ready() {
            batch.push(item?);
        }
        // Each task's rows of `products` (an expert's, or a piece of them: [`task_rows`]),
        // carved in ascending expert order.
        batch.sort_unstable_by_key(|(e, _)| *e);
        let mut jobs = Vec::with_capacity(batch.len());
        let mut rest = &mut products[..];
        let mut at = 0;
        for (e, expert) in &batch {
            let (first, end) = (start[*e], start[e + 1]);
            let (lo, hi) = (first * hidden, end * hidden);
            let tail = std::mem::take(&mut rest).split_at_mut(lo - at).1;
            let (mut mine, tail) = tail.split_at_mut(hi - lo);
            let per = task_rows(end - first);
            for r0 in (first..end).step_by(per) {
                let r1 = (r0 + per).min(end);
                let (piece, more) = std::mem::take(&mut mine).split_at_mut((r1 - r0) * hidden);
                jobs.push((r0..r1, expert, piece));
                mine = more;
            }
            rest = tail;
            at = hi;
        }
        if quantized.is_none() {
            if let Some(kind) = batch.first().and_then(|(_, e)| e.gate.ggml_act()) {
                q8.fill(kind, x, x.len() / hidden.max(1), hidden);
                quantized = Some(kind);
            }
        }
        let q8 = &*q8;
        // Largest first, one task a steal: the threads end together.
        jobs.sort_by_key(|(rows, _, _)| std::cmp::Reverse(rows.len()));
        jobs.par_iter_mut()
            .with_max_len(1)
            .for_each(|(rows, expert, y)| {
                let rows = &pairs[rows.clone()];
                expert_rows(expert, (x, quantized.map(|_| q8)), hidden, rows, y)
            });
        for (e, _) in &batch {
            delivered[*e] = true;
        }
    }
}

/// One few-rows task: `expert`'s products of the rows of `x` named in `rows` into `y`
/// (`(rows.len(), hidden)`), on this thread; each is [`swiglu`]'s bits. `q8`: every row of
/// `x` quantized already (as [`Q8Act::fill`] of the whole `x`), which the gate and up read
/// in place where their panels take them.
pub(super) fn expert_rows(
    expert: &Expert,
    (x, q8): (&[f32], Option<&Q8Act>),
    hidden: usize,
    rows: &[(usize, f32)],
    y: &mut [f32],
) {
    let n = rows.len();
    let inter = expert.gate.rows();
    let mut bufs = FEW.with(|c| c.take());
    let [gathered, g, u] = &mut bufs;
    let (g, u) = (grow(g, n * inter), grow(u, n * inter));
    let mut picks = [0usize; MAX_TASK_ROWS];
    let picked = q8.filter(|_| n <= MAX_TASK_ROWS).is_some_and(|q8| {
        for (p, &(s, _)) in picks.iter_mut().zip(rows) {
            *p = s;
        }
        QMatrix::pair_panels_picked(&expert.gate, &expert.up, q8, &picks[..n], g, u)
    });
    if !picked {
        let gathered = grow(gathered, n * hidden);
        for (gr, &(s, _)) in gathered.chunks_exact_mut(hidden).zip(rows) {
            gr.copy_from_slice(&x[s * hidden..(s + 1) * hidden]);
        }
        // Gate and up share their input: quantized (and laid out) once for both.
        QMatrix::matmul_pair_i8act_on_caller(&expert.gate, &expert.up, gathered, n, g, u);
    }
    match expert.oss.as_deref() {
        None => silu_mul(g, u),
        Some(o) => o.glu(g, u),
    }
    expert.down.matmul_i8act_on_caller(g, n, y);
    if let Some(o) = expert.oss.as_deref() {
        o.add_down_bias(y);
    }
    FEW.with(|c| c.set(bufs));
}

/// Where a decode step's expert products go: expert `e`'s one product to row `start[e]` of
/// `rows`, the shared expert's to row `shared_row`.
struct DecodeSink<'a> {
    start: &'a [usize],
    rows: &'a mut [f32],
    shared_row: usize,
    delivered: &'a mut [bool],
}

/// A down product's job: `w` and its input, the `w.cols()` values of `h` from `at`.
fn down_job<'a>(w: &'a QMatrix, h: &'a [f32], at: usize) -> (&'a QMatrix, &'a [f32]) {
    (w, &h[at..at + w.cols()])
}

/// Decode (one row, int8 activations): the experts that are ready go through together, in
/// two parallel regions per batch (every gate and up, then every down; or one, each member's
/// down once its own gate and up are done, with `DecodeTuning::one_region`:
/// [`QMatrix::matmul_experts_i8act`]) instead of two per expert, and the shared expert rides with the first batch (its gate and up already
/// computed when `shared` carries them). A batch is whatever the store can hand over without
/// waiting, so compute still overlaps the loads in flight. Every product is bit-identical to
/// [`swiglu`]'s.
fn decode_batches(
    fetch: &mut Fetch,
    x: &[f32],
    shared: Option<([&QMatrix; 3], Option<&[f32]>)>,
    sink: DecodeSink,
    b: &mut DecodeBatch,
) -> Result<(), EngineError> {
    let hidden = x.len();
    let (shared, shared_gu) = match shared {
        Some((m, gu)) => (Some(m), gu),
        None => (None, None),
    };
    let mut with_shared = shared.is_some();
    loop {
        b.experts.clear();
        match fetch.next() {
            Some(item) => b.experts.push(item?),
            None if with_shared => {}
            None => break,
        }
        while let Some(item) = fetch.next_ready() {
            b.experts.push(item?);
        }
        let experts = &b.experts;
        let ne = experts.len();
        let members = ne + with_shared as usize;
        // Member `i`: a routed expert, or (last, in the first batch) the shared one.
        let mats = |i: usize| -> [&QMatrix; 3] {
            match (experts.get(i), shared) {
                (Some((_, e)), _) => [&e.gate, &e.up, &e.down],
                (None, Some(s)) => s,
                // `members` counts a member past the experts only when there is a
                // shared expert.
                (None, None) => unreachable!("a batch member past the routed experts"),
            }
        };
        // Gate and up of member `i` at `2 * off(i)`, its SwiGLU product at `off(i)`.
        let inter = experts.first().map_or(0, |(_, e)| e.gate.rows());
        let off = |i: usize| i * inter;
        let last = mats(members - 1)[0].rows();
        let total = off(members - 1) + last;
        let (gu, h, out) = (&mut b.gu, &mut b.h, &mut b.out);
        let (down_in, chain) = (&mut b.down_in, &mut b.chain);
        let gu = grow(gu, 2 * total);
        let h = grow(h, total);
        // Member `i`'s SwiGLU product into `h` from its gate and up outputs `g`, `u`.
        let glu = |i: usize, hi: &mut [f32], g: &[f32], u: &[f32]| match experts
            .get(i)
            .and_then(|(_, e)| e.oss.as_deref())
        {
            None => silu_mul_into(hi, g, u),
            Some(o) => o.glu_into(hi, g, u),
        };
        // The members whose gate and up run here: all but a shared expert computed already
        // (the last member, so the others' offsets are as above).
        let given = with_shared.then_some(shared_gu).flatten();
        let computed = members - given.is_some() as usize;
        // Member `i`'s row in the sink. The downs write there directly when the members' rows
        // follow one another (a step's resident experts, ascending, then the shared one), else
        // into `out`, copied to their rows after.
        let row = |i: usize| {
            experts
                .get(i)
                .map_or(sink.shared_row, |(e, _)| sink.start[*e])
        };
        let first = row(0);
        let in_place = (1..members).all(|i| row(i) == first + i);
        let y = if in_place {
            &mut sink.rows[first * hidden..(first + members) * hidden]
        } else {
            grow(out, members * hidden)
        };
        // One region for the whole batch where the spin pool runs it: each member's down
        // starts once its own gate/up rows are done, no join between the two phases.
        let one_region = Experts {
            members,
            x,
            mats,
            given,
            glu,
        };
        if !QMatrix::matmul_experts_i8act(&one_region, gu, h, y, chain) {
            let Experts { mats, glu, .. } = one_region;
            two_regions(
                (members, computed, given),
                inter,
                x,
                &mats,
                &glu,
                &mut gu[..],
                &mut h[..],
                down_in,
                y,
            );
        }
        for (yi, (e, expert)) in y.chunks_exact_mut(hidden).zip(experts.iter()) {
            if let Some(o) = expert.oss.as_deref() {
                o.add_down_bias(yi);
            }
            sink.delivered[*e] = true;
        }
        if !in_place {
            for (i, yi) in out[..members * hidden].chunks_exact(hidden).enumerate() {
                let at = row(i) * hidden;
                sink.rows[at..at + hidden].copy_from_slice(yi);
            }
        }
        with_shared = false;
    }
    Ok(())
}

/// [`decode_batches`]' batch in two regions, where one does not apply
/// ([`QMatrix::matmul_experts_i8act`]): every gate and up (the members before the last computed
/// one made ready for their downs by the thread that completes their rows, while the others
/// compute the last one's), the rest of the SwiGLU products between the regions, then every
/// down. `(members, computed, given)` and the buffers as [`QMatrix::matmul_experts_i8act`]
/// takes them; every member but a shared last one has `inter` gate rows.
#[allow(clippy::too_many_arguments)]
fn two_regions<'a>(
    (members, computed, given): (usize, usize, Option<&[f32]>),
    inter: usize,
    x: &'a [f32],
    mats: &(impl Fn(usize) -> [&'a QMatrix; 3] + Sync),
    glu: &(impl Fn(usize, &mut [f32], &[f32], &[f32]) + Sync),
    gu: &mut [f32],
    h: &mut [f32],
    down_in: &mut BatchInputs,
    y: &mut [f32],
) {
    let off = |i: usize| i * inter;
    let total = off(members - 1) + mats(members - 1)[0].rows();
    down_in.clear();
    // The members before the last computed one: their SwiGLU and its quantization for the
    // down run inside the gate/up region, on the thread that completes their rows, while
    // the other threads compute the last member's; only the rest runs between the regions.
    let early = computed.saturating_sub(1);
    if computed > 0 {
        let rows = if computed == members {
            total
        } else {
            off(computed)
        };
        let gate_up = |j: usize| (mats(j / 2)[j % 2], x);
        let (gu_early, gu_late) = gu[..2 * rows].split_at_mut(2 * off(early));
        let h_early = &mut h[..off(early)];
        let prepare = |gu_early: &mut [f32]| {
            for i in 0..early {
                let rows = mats(i)[0].rows();
                let (g, u) = gu_early[2 * off(i)..2 * off(i) + 2 * rows].split_at(rows);
                glu(i, &mut h_early[off(i)..off(i) + rows], g, u);
            }
            let h_early = &*h_early;
            down_in.add(early, |i| down_job(mats(i)[2], h_early, off(i)));
        };
        QMatrix::matmul_batch_i8act_then(
            2 * computed,
            2 * early,
            gate_up,
            gu_early,
            gu_late,
            prepare,
        );
    }
    for i in early..members {
        let rows = mats(i)[0].rows();
        let (g, u) = match given.filter(|_| i == computed) {
            Some(gu) => gu[..2 * rows].split_at(rows),
            None => gu[2 * off(i)..2 * off(i) + 2 * rows].split_at(rows),
        };
        glu(i, &mut h[off(i)..off(i) + rows], g, u);
    }
    let h = &*h;
    QMatrix::matmul_batch_i8act_prepared(down_in, members, |i| down_job(mats(i)[2], h, off(i)), y);
}
