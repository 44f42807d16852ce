//! Attention cores on the GPU, over the device mirror of a session's KV cache (`kv.rs`):
//!
//! * MLA, absorbed as the CPU's `Mla::attend_absorbed` computes it: `q_lat = W_k^T q_nope`
//!   through kv_b's key half, scores `(q_lat . c_t + q_rope . r_t) * scale` over the latent
//!   and rope-key caches (causal, or the DSA selection's keys), softmax, `sum_t p_t c_t`, then
//!   the up-projection through kv_b's value half;
//! * the DSA indexer's selection: `sum_h w_h relu(scale q_h . k_t)` over the indexer-key
//!   cache and the `index_topk` best keys by the CPU's total order (ties to the earlier key);
//! * grouped-query attention (qwen3_moe, glm4_moe): each query head over its key-value head's
//!   cached keys and values.
//!
//! All in f32; sums run in another order than the CPU's, so outputs agree to f32 rounding and
//! selections are equal where no two scores are closer than that (true on the fixtures).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::calls::Readback;
use super::ops::Kernels;
use super::{DeviceBuffer, Gpu, GpuError, GqaShape, MlaShape};

/// The uniform parameters every MLA kernel reads, in the order `AttnGpu::mla_core` packs
/// them (one WGSL module a kernel, so each module declares them again: this is that text).
macro_rules! mla_params {
    () => {
        "struct P { n: u32, heads: u32, nope: u32, rope: u32, v: u32, l: u32, maxk: u32, scale: f32 };
@group(0) @binding(0) var<uniform> p: P;
"
    };
}

/// As `mla_params` for the DSA indexer's kernels (`AttnGpu::index_select`).
macro_rules! ix_params {
    () => {
        "struct P { n: u32, hi: u32, di: u32, pos0: u32, total: u32, topk: u32, scale: f32, pad: u32 };
@group(0) @binding(0) var<uniform> p: P;
"
    };
}

/// As `mla_params` for the grouped-query kernels (`AttnGpu::gqa_core`).
macro_rules! gqa_params {
    () => {
        "struct P { n: u32, heads: u32, kv_heads: u32, hd: u32, pos0: u32, maxk: u32, scale: f32, pad: u32 };
@group(0) @binding(0) var<uniform> p: P;
"
    };
}

pub(super) const KERNELS: &[(&str, &str)] = &[
    ("mla_qlat", MLA_QLAT),
    ("mla_scores", MLA_SCORES),
    ("softmax", SOFTMAX),
    ("mla_ctx", MLA_CTX),
    ("mla_out", MLA_OUT),
    ("ix_scores", IX_SCORES),
    ("ix_topk", IX_TOPK),
    ("gqa_scores", GQA_SCORES),
    ("gqa_out", GQA_OUT),
];

// q_lat[s,h,j] = sum_i q[s,h,i] * W[h*(nope+v) + i, j]
const MLA_QLAT: &str = concat!(
    mla_params!(),
    r#"
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> qlat: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x; let h = gid.y; let s = gid.z;
    if (j >= p.l) { return; }
    let qb = (s * p.heads + h) * (p.nope + p.rope);
    let wb = h * (p.nope + p.v);
    var acc = 0.0;
    for (var i = 0u; i < p.nope; i = i + 1u) { acc = acc + q[qb + i] * w[(wb + i) * p.l + j]; }
    qlat[(s * p.heads + h) * p.l + j] = acc;
}
"#
);

const MLA_SCORES: &str = concat!(
    mla_params!(),
    r#"
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> qlat: array<f32>;
@group(0) @binding(3) var<storage, read> latent: array<f32>;
@group(0) @binding(4) var<storage, read> rk: array<f32>;
@group(0) @binding(5) var<storage, read> keys: array<u32>;
@group(0) @binding(6) var<storage, read> counts: array<u32>;
@group(0) @binding(7) var<storage, read_write> scores: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x; let h = gid.y; let s = gid.z;
    if (t >= counts[s]) { return; }
    let key = keys[s * p.maxk + t];
    let qr = (s * p.heads + h) * (p.nope + p.rope) + p.nope;
    let ql = (s * p.heads + h) * p.l;
    var a = 0.0;
    for (var j = 0u; j < p.l; j = j + 1u) { a = a + qlat[ql + j] * latent[key * p.l + j]; }
    var b = 0.0;
    for (var j = 0u; j < p.rope; j = j + 1u) { b = b + q[qr + j] * rk[key * p.rope + j]; }
    scores[(s * p.heads + h) * p.maxk + t] = (a + b) * p.scale;
}
"#
);

// Softmax of each (row, head)'s first counts[row] scores, as the CPU's: the max, exp of the
// differences, their sum in order, each divided by it.
const SOFTMAX: &str = r#"
struct P { heads: u32, maxk: u32, n: u32, pad: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> counts: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let h = gid.x; let s = gid.y;
    if (h >= p.heads || s >= p.n) { return; }
    let c = counts[s];
    if (c == 0u) { return; }
    let b = (s * p.heads + h) * p.maxk;
    var m = x[b];
    for (var t = 1u; t < c; t = t + 1u) { m = max(m, x[b + t]); }
    var sum = 0.0;
    for (var t = 0u; t < c; t = t + 1u) { let e = exp(x[b + t] - m); x[b + t] = e; sum = sum + e; }
    for (var t = 0u; t < c; t = t + 1u) { x[b + t] = x[b + t] / sum; }
}
"#;

// ctx[s,h,j] = sum_t p[s,h,t] * latent[key_t, j], in key order.
const MLA_CTX: &str = concat!(
    mla_params!(),
    r#"
@group(0) @binding(1) var<storage, read> latent: array<f32>;
@group(0) @binding(2) var<storage, read> keys: array<u32>;
@group(0) @binding(3) var<storage, read> counts: array<u32>;
@group(0) @binding(4) var<storage, read> probs: array<f32>;
@group(0) @binding(5) var<storage, read_write> ctx: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x; let h = gid.y; let s = gid.z;
    if (j >= p.l) { return; }
    let pb = (s * p.heads + h) * p.maxk;
    var acc = 0.0;
    for (var t = 0u; t < counts[s]; t = t + 1u) {
        acc = acc + probs[pb + t] * latent[keys[s * p.maxk + t] * p.l + j];
    }
    ctx[(s * p.heads + h) * p.l + j] = acc;
}
"#
);

// out[s, h*v + i] = W[h*(nope+v) + nope + i, :] . ctx[s,h]
const MLA_OUT: &str = concat!(
    mla_params!(),
    r#"
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> ctx: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x; let h = gid.y; let s = gid.z;
    if (i >= p.v) { return; }
    let wr = (h * (p.nope + p.v) + p.nope + i) * p.l;
    let cb = (s * p.heads + h) * p.l;
    var acc = 0.0;
    for (var j = 0u; j < p.l; j = j + 1u) { acc = acc + w[wr + j] * ctx[cb + j]; }
    o[(s * p.heads + h) * p.v + i] = acc;
}
"#
);

// The indexer's score of key t for row s (visible: t <= pos0 + s), heads summed in order.
const IX_SCORES: &str = concat!(
    ix_params!(),
    r#"
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> k: array<f32>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x; let s = gid.y;
    if (t > p.pos0 + s || s >= p.n) { return; }
    var score = 0.0;
    for (var h = 0u; h < p.hi; h = h + 1u) {
        let qb = (s * p.hi + h) * p.di;
        var d = 0.0;
        for (var i = 0u; i < p.di; i = i + 1u) { d = d + q[qb + i] * k[t * p.di + i]; }
        score = score + w[s * p.hi + h] * max(d * p.scale, 0.0);
    }
    scores[s * p.total + t] = score;
}
"#
);

// The topk best visible keys of row s (one workgroup per row) in the CPU's order: higher score
// first by f32's total order, ties to the earlier key. A radix select over the scores' order
// keys, eight bits a round from the top, finds the topk-th best key value K and how many keys
// equal to K are kept; every key above K is kept, and the earliest of those equal to K, in
// one scan. Linear in the visible keys (a rank per key would be quadratic). Rows with at most
// topk visible keys are dense and not asked.
const IX_TOPK: &str = concat!(
    ix_params!(),
    r#"
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> keep: array<u32>;
var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> prefix: u32;
var<workgroup> need: u32;

// f32's total order as a u32 order.
fn key(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let s = wg.x;
    let visible = p.pos0 + s + 1u;
    let b = s * p.total;
    if (li == 0u) { prefix = 0u; need = p.topk; }
    for (var round = 0u; round < 4u; round = round + 1u) {
        let shift = 24u - 8u * round;
        // The bits decided by the rounds before; none on the first.
        let mask = select(0u, 0xffffffffu << (shift + 8u), round > 0u);
        atomicStore(&hist[li], 0u);
        workgroupBarrier();
        let want = prefix & mask;
        for (var t = li; t < visible; t = t + 256u) {
            let k = key(scores[b + t]);
            if ((k & mask) == want) { atomicAdd(&hist[(k >> shift) & 255u], 1u); }
        }
        workgroupBarrier();
        if (li == 0u) {
            var above = 0u;
            var bin = 255u;
            loop {
                let c = atomicLoad(&hist[bin]);
                if (above + c >= need || bin == 0u) { break; }
                above = above + c;
                bin = bin - 1u;
            }
            prefix = prefix | (bin << shift);
            need = need - above;
        }
        workgroupBarrier();
    }
    let kth = prefix;
    for (var t = li; t < visible; t = t + 256u) {
        if (key(scores[b + t]) > kth) { keep[b + t] = 1u; }
    }
    if (li == 0u) {
        var taken = 0u;
        for (var t = 0u; t < visible && taken < need; t = t + 1u) {
            if (key(scores[b + t]) == kth) { keep[b + t] = 1u; taken = taken + 1u; }
        }
    }
}
"#
);

const GQA_SCORES: &str = concat!(
    gqa_params!(),
    r#"
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x; let h = gid.y; let s = gid.z;
    if (t > p.pos0 + s) { return; }
    let kvh = h / (p.heads / p.kv_heads);
    let qb = (s * p.heads + h) * p.hd;
    let kb = (t * p.kv_heads + kvh) * p.hd;
    var acc = 0.0;
    for (var i = 0u; i < p.hd; i = i + 1u) { acc = acc + q[qb + i] * k[kb + i]; }
    scores[(s * p.heads + h) * p.maxk + t] = acc * p.scale;
}
"#
);

const GQA_OUT: &str = concat!(
    gqa_params!(),
    r#"
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read> probs: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x; let h = gid.y; let s = gid.z;
    if (i >= p.hd) { return; }
    let kvh = h / (p.heads / p.kv_heads);
    let pb = (s * p.heads + h) * p.maxk;
    var acc = 0.0;
    for (var t = 0u; t <= p.pos0 + s; t = t + 1u) {
        acc = acc + probs[pb + t] * v[(t * p.kv_heads + kvh) * p.hd + i];
    }
    o[(s * p.heads + h) * p.hd + i] = acc;
}
"#
);

/// An f32 matrix in device memory (kv_b's rows, dequantized): what the absorbed MLA core
/// multiplies by.
pub struct DeviceF32 {
    pub(super) buf: wgpu::Buffer,
    len: usize,
}

impl DeviceF32 {
    /// Device bytes held.
    pub fn bytes(&self) -> u64 {
        self.len as u64 * 4
    }
}

/// The DSA indexer's kept keys, as the device chose them ([`AttnGpu::index_select`]): one
/// flag per visible key of each row.
pub struct KeptKeys {
    /// `(n, total)`: 1 (as f32 bits) where row `s` keeps key `t`.
    flags: Vec<f32>,
    total: usize,
}

impl KeptKeys {
    /// The keys row `s` keeps, in increasing order; only rows with more than `topk` visible
    /// keys were chosen (the others attend to every key and are not asked).
    pub fn row(&self, s: usize) -> impl Iterator<Item = usize> + '_ {
        let flags = self.flags.chunks_exact(self.total).nth(s).unwrap_or(&[]);
        flags
            .iter()
            .enumerate()
            .filter(|(_, f)| f.to_bits() == 1)
            .map(|(t, _)| t)
    }
}

/// Attention on the GPU for a model: the kernels, and whether they are still in use (a device
/// failure turns them off for the rest of the process; the CPU computes from there).
pub struct AttnGpu {
    kernels: Kernels,
    on: AtomicBool,
    /// Whether work too big for the device was met (said once).
    too_big: AtomicBool,
}

impl AttnGpu {
    pub fn new(gpu: Arc<Gpu>) -> Result<AttnGpu, GpuError> {
        gpu.note_attention();
        Ok(AttnGpu {
            kernels: Kernels::new(gpu)?,
            on: AtomicBool::new(true),
            too_big: AtomicBool::new(false),
        })
    }

    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// After `e`, the caller computes on the CPU. Work too big for the device (a long
    /// prefill's scores) leaves GPU attention on for the steps that fit, with one `[GPU]` line
    /// the first time; anything else turns it off, with one `[GPU]` line.
    pub fn fail(&self, e: &GpuError) {
        if matches!(e, GpuError::TooBig { .. }) {
            if !self.too_big.swap(true, Ordering::Relaxed) {
                crate::elog!("[GPU] {e}: attention that large runs on the CPU");
            }
            return;
        }
        if self.on.swap(false, Ordering::Relaxed) {
            match e {
                // The device is gone for every user: one line says what each moved.
                GpuError::Lost(_) => self.kernels.gpu.announce_loss(e),
                _ => crate::elog!(
                    "[GPU] {e}: attention is off, the CPU computes it from its own KV cache (the \
                     reference copy), nothing is lost"
                ),
            }
        }
    }

    /// `w` (row-major f32) in device memory.
    pub fn upload(&self, w: &[f32]) -> Result<DeviceF32, GpuError> {
        Ok(DeviceF32 {
            buf: self.kernels.upload_owned(w)?,
            len: w.len(),
        })
    }

    /// The MLA core of one sequence's `n` query rows `q` (`(n, heads, nope + rope)`, rope
    /// applied) at positions `pos0..`, over its cache's device rows `latent` and `rope`
    /// (this batch's keys included), restricted to the keys `sel(s)` lists for row `s` where
    /// it lists any (`None`: every key up to the row's own, causal): the heads' outputs,
    /// `(n, heads * v)`.
    #[allow(clippy::too_many_arguments)]
    pub fn mla_core<'s>(
        &self,
        d: MlaShape,
        kv_b: &DeviceF32,
        q: &[f32],
        n: usize,
        pos0: usize,
        latent: &DeviceBuffer,
        rope: &DeviceBuffer,
        sel: impl Fn(usize) -> Option<&'s [usize]>,
    ) -> Result<Vec<f32>, GpuError> {
        let (latent, rope) = (&latent.buf, &rope.buf);
        let k = &self.kernels;
        let counts: Vec<u32> = (0..n)
            .map(|s| sel(s).map_or(pos0 + s + 1, <[usize]>::len) as u32)
            .collect();
        let maxk = counts.iter().copied().max().unwrap_or(0) as usize;
        let mut keys = vec![0u32; n * maxk];
        for (s, row) in keys.chunks_exact_mut(maxk.max(1)).enumerate().take(n) {
            match sel(s) {
                Some(list) => row.iter_mut().zip(list).for_each(|(k, &t)| *k = t as u32),
                None => row
                    .iter_mut()
                    .take(pos0 + s + 1)
                    .enumerate()
                    .for_each(|(t, k)| *k = t as u32),
            }
        }
        let (h, l) = (d.heads, d.kv_lora);
        let mut c = k.call();
        let qb = c.upload(q)?;
        let keys_b = c.upload(&keys)?;
        let counts_b = c.upload(&counts)?;
        let qlat = c.scratch(n * h * l)?;
        let scores = c.scratch(n * h * maxk)?;
        let ctx = c.scratch(n * h * l)?;
        let out = c.scratch(n * h * d.v)?;
        let p = [
            n as u32,
            h as u32,
            d.nope as u32,
            d.rope as u32,
            d.v as u32,
            l as u32,
            maxk as u32,
            d.scale.to_bits(),
        ];
        let res = c.submit(
            |r| {
                let w = &kv_b.buf;
                r.dispatch("mla_qlat", &p, &[&qb, w, &qlat], [l.div_ceil(64), h, n])?;
                let bufs = [&qb, &qlat, latent, rope, &keys_b, &counts_b, &scores];
                r.dispatch("mla_scores", &p, &bufs, [maxk.div_ceil(64), h, n])?;
                let sp = [h as u32, maxk as u32, n as u32];
                r.dispatch(
                    "softmax",
                    &sp,
                    &[&counts_b, &scores],
                    [h.div_ceil(64), n, 1],
                )?;
                let bufs = [latent, &keys_b, &counts_b, &scores, &ctx];
                r.dispatch("mla_ctx", &p, &bufs, [l.div_ceil(64), h, n])?;
                r.dispatch("mla_out", &p, &[w, &ctx, &out], [d.v.div_ceil(64), h, n])?;
                Ok(())
            },
            &[Readback {
                buf: &out,
                len: n * h * d.v,
            }],
        )?;
        Ok(res.into_iter().next().unwrap_or_default())
    }

    /// The DSA indexer's selection for one sequence's `n` rows at positions `pos0..`: `q`
    /// (`(n, hi, di)`, rotated) and the head weights `w` (`(n, hi)`, scaled) against the
    /// device rows `keys` of its indexer-key cache (`pos0 + n` keys). Rows with more than
    /// `topk` visible keys keep the `topk` best ([`KeptKeys::row`]); the others stay dense.
    /// `None` when every row is dense (no row sees more than `topk` keys).
    #[allow(clippy::too_many_arguments)]
    pub fn index_select(
        &self,
        q: &[f32],
        w: &[f32],
        keys: &DeviceBuffer,
        (hi, di): (usize, usize),
        n: usize,
        pos0: usize,
        topk: usize,
    ) -> Result<Option<KeptKeys>, GpuError> {
        if pos0 + n <= topk {
            return Ok(None);
        }
        let keys = &keys.buf;
        let k = &self.kernels;
        let total = pos0 + n;
        let mut c = k.call();
        let qb = c.upload(q)?;
        let wb = c.upload(w)?;
        let scores = c.scratch(n * total)?;
        let keep = c.scratch(n * total)?;
        let scale = (di as f32).powf(-0.5);
        let p = [
            n as u32,
            hi as u32,
            di as u32,
            pos0 as u32,
            total as u32,
            topk as u32,
            scale.to_bits(),
        ];
        let out = c.submit(
            |r| {
                let grid = [total.div_ceil(64), n, 1];
                r.dispatch("ix_scores", &p, &[&qb, &wb, keys, &scores], grid)?;
                r.dispatch("ix_topk", &p, &[&scores, &keep], [n, 1, 1])?;
                Ok(())
            },
            &[Readback {
                buf: &keep,
                len: n * total,
            }],
        )?;
        Ok(Some(KeptKeys {
            flags: out.into_iter().next().unwrap_or_default(),
            total,
        }))
    }

    /// The grouped-query core of one sequence's `n` rows `q` (`(n, heads, head_dim)`, normed
    /// and rotated) at positions `pos0..`, causal over the device rows of its key and value
    /// caches: `(n, heads * head_dim)`.
    pub fn gqa_core(
        &self,
        d: GqaShape,
        q: &[f32],
        n: usize,
        pos0: usize,
        (kc, vc): (&DeviceBuffer, &DeviceBuffer),
    ) -> Result<Vec<f32>, GpuError> {
        let (kc, vc) = (&kc.buf, &vc.buf);
        if d.kv_heads == 0 || !d.heads.is_multiple_of(d.kv_heads) {
            return Err(GpuError::Device(format!(
                "{} heads over {} key-value heads",
                d.heads, d.kv_heads
            )));
        }
        let k = &self.kernels;
        let (h, hd) = (d.heads, d.head_dim);
        let maxk = pos0 + n;
        let counts: Vec<u32> = (0..n).map(|s| (pos0 + s + 1) as u32).collect();
        let mut c = k.call();
        let qb = c.upload(q)?;
        let counts_b = c.upload(&counts)?;
        let scores = c.scratch(n * h * maxk)?;
        let out = c.scratch(n * h * hd)?;
        let p = [
            n as u32,
            h as u32,
            d.kv_heads as u32,
            hd as u32,
            pos0 as u32,
            maxk as u32,
            d.scale.to_bits(),
        ];
        let res = c.submit(
            |r| {
                let grid = [maxk.div_ceil(64), h, n];
                r.dispatch("gqa_scores", &p, &[&qb, kc, &scores], grid)?;
                let sp = [h as u32, maxk as u32, n as u32];
                r.dispatch(
                    "softmax",
                    &sp,
                    &[&counts_b, &scores],
                    [h.div_ceil(64), n, 1],
                )?;
                let grid = [hd.div_ceil(64), h, n];
                r.dispatch("gqa_out", &p, &[vc, &scores, &out], grid)?;
                Ok(())
            },
            &[Readback {
                buf: &out,
                len: n * h * hd,
            }],
        )?;
        Ok(res.into_iter().next().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work too big for the device is refused before the device is asked, and leaves GPU
    /// attention on; a device failure turns it off.
    #[test]
    fn too_big_work_keeps_gpu_attention_on_a_failure_turns_it_off() {
        // A device of its own: the simulated loss below marks its device lost for every user,
        // and the other tests of this process share theirs.
        let gpu = match Gpu::open(crate::gpu::GpuChoice::Vulkan) {
            Ok(g) => Arc::new(g),
            Err(e) => {
                crate::elog!("too_big_work_keeps_gpu_attention_on: skipped: {e}");
                return;
            }
        };
        let g = AttnGpu::new(gpu.clone()).unwrap();
        let words = (g.kernels.gpu.max_buffer / 4 + 1) as usize;
        let Err(e) = g.kernels.alloc(words) else {
            panic!("a buffer past the largest binding was made");
        };
        g.fail(&e);
        assert!(g.is_on(), "{e}");
        assert!(!gpu.failed());
        g.fail(&GpuError::Lost("simulated".into()));
        assert!(!g.is_on());
        // A loss is the device's: the dense weights and the expert tier stop using it too.
        assert!(gpu.failed());
    }
}
