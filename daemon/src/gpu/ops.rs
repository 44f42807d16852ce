//! The forward's small kernels on the GPU: RMSNorm rows, rotary (interleaved or rotate-half,
//! on a leading part of each head), SwiGLU, the residual add and the MoE router's top-k; they
//! and the attention kernels (`attention.rs`) run through `calls.rs`.
//!
//! Unlike the products of `matvec.rs` these are not bit-exact to the CPU: sums run in another
//! order and `exp`/`sqrt` are the device's, so results agree to f32 rounding (about 1e-6
//! relative) and discrete choices (the router's experts) are equal on the tests' inputs. The
//! rotary angles are the CPU's own: the host computes the `(cos, sin)` table with the very
//! code `Rope` uses, so no device `sin` ever differs.

use std::collections::HashMap;
use std::sync::Arc;

use super::calls::{PoolLock, Readback};
use super::{Gpu, GpuError};

/// Every kernel of this module and of `attention.rs`, by entry point. One WGSL module each,
/// so a pipeline's automatic layout holds exactly the bindings its entry point uses.
pub(super) const KERNELS: &[(&str, &str)] = &[
    ("rms_norm", RMS_NORM),
    ("rope", ROPE),
    ("swiglu", SWIGLU),
    ("add", ADD),
    ("router", ROUTER),
];

const RMS_NORM: &str = r#"
struct P { cols: u32, rows: u32, eps: f32, pad: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
var<workgroup> part: array<f32, 64>;

// One workgroup per row: the squares summed in 64 strided partial sums, then a tree.
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let base = wg.x * p.cols;
    var s = 0.0;
    for (var i = li; i < p.cols; i = i + 64u) { let v = x[base + i]; s = s + v * v; }
    part[li] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k >> 1u) {
        if (li < k) { part[li] = part[li] + part[li + k]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(part[0] / f32(p.cols) + p.eps);
    for (var i = li; i < p.cols; i = i + 64u) { x[base + i] = w[i] * (x[base + i] * inv); }
}
"#;

const ROPE: &str = r#"
struct P { half: u32, heads: u32, rows: u32, row_len: u32, head_len: u32, offset: u32, mode: u32, pad: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;

// Pair i of head h of row r: (2i, 2i + 1) interleaved (mode 0) or (i, i + half) (mode 1),
// rotated by row r's angle i, whose (cos, sin) the host computed.
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x; let h = gid.y; let r = gid.z;
    if (i >= p.half || h >= p.heads || r >= p.rows) { return; }
    let base = r * p.row_len + h * p.head_len + p.offset;
    var a = base + 2u * i;
    var b = a + 1u;
    if (p.mode == 1u) { a = base + i; b = base + i + p.half; }
    let c = cs[2u * (r * p.half + i)];
    let s = cs[2u * (r * p.half + i) + 1u];
    let x0 = x[a]; let x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x1 * c + x0 * s;
}
"#;

const SWIGLU: &str = r#"
struct P { n: u32, pad0: u32, pad1: u32, pad2: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> g: array<f32>;
@group(0) @binding(2) var<storage, read> u: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * 65535u * 64u;
    if (i >= p.n) { return; }
    let v = g[i];
    g[i] = v / (1.0 + exp(-v)) * u[i];
}
"#;

const ADD: &str = r#"
struct P { n: u32, pad0: u32, pad1: u32, pad2: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> d: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * 65535u * 64u;
    if (i >= p.n) { return; }
    x[i] = x[i] + d[i];
}
"#;

/// One invocation per row, as `Router::select`: scores (sigmoid, or softmax over every
/// expert), the eligible groups (each scored by its two best biased scores), the `top_k` best
/// biased scores among them (ties to the lower id, the CPU's total order), their unbiased
/// scores as weights, normalised and scaled.
const ROUTER: &str = r#"
struct P { experts: u32, rows: u32, top_k: u32, n_group: u32, topk_group: u32, softmax: u32, norm: u32, scaling: f32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> s: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> taken: array<u32>;
@group(0) @binding(4) var<storage, read_write> chosen: array<u32>;
@group(0) @binding(5) var<storage, read_write> weights: array<f32>;

// f32's total order (Rust's total_cmp) as an i32 order.
fn ord(f: f32) -> i32 { let b = bitcast<i32>(f); return select(b, b ^ 0x7fffffff, b < 0); }

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= p.rows) { return; }
    let e0 = r * p.experts;
    if (p.softmax == 1u) {
        var m = s[e0];
        for (var e = 1u; e < p.experts; e = e + 1u) { m = max(m, s[e0 + e]); }
        var sum = 0.0;
        for (var e = 0u; e < p.experts; e = e + 1u) { let v = exp(s[e0 + e] - m); s[e0 + e] = v; sum = sum + v; }
        for (var e = 0u; e < p.experts; e = e + 1u) { s[e0 + e] = s[e0 + e] / sum; }
    } else {
        for (var e = 0u; e < p.experts; e = e + 1u) { s[e0 + e] = 1.0 / (1.0 + exp(-s[e0 + e])); }
    }
    // taken: 0 eligible, 1 not eligible or already chosen.
    for (var e = 0u; e < p.experts; e = e + 1u) { taken[e0 + e] = 0u; }
    if (p.n_group > 1u) {
        let per = p.experts / p.n_group;
        var gscore: array<f32, 64>;
        var gtaken: array<u32, 64>;
        for (var g = 0u; g < p.n_group; g = g + 1u) {
            var first = -3.4e38; var second = -3.4e38;
            for (var e = g * per; e < (g + 1u) * per; e = e + 1u) {
                let v = s[e0 + e] + bias[e];
                if (v > first) { second = first; first = v; } else if (v > second) { second = v; }
            }
            gscore[g] = first + second;
            gtaken[g] = 0u;
        }
        for (var k = 0u; k < p.topk_group; k = k + 1u) {
            var best = 0xffffffffu;
            for (var g = 0u; g < p.n_group; g = g + 1u) {
                if (gtaken[g] == 0u && (best == 0xffffffffu || ord(gscore[g]) > ord(gscore[best]))) { best = g; }
            }
            gtaken[best] = 2u;
        }
        for (var g = 0u; g < p.n_group; g = g + 1u) {
            if (gtaken[g] != 2u) {
                for (var e = g * per; e < (g + 1u) * per; e = e + 1u) { taken[e0 + e] = 1u; }
            }
        }
    }
    var denom = 0.0;
    for (var k = 0u; k < p.top_k; k = k + 1u) {
        var best = 0xffffffffu;
        for (var e = 0u; e < p.experts; e = e + 1u) {
            if (taken[e0 + e] == 0u && (best == 0xffffffffu
                || ord(s[e0 + e] + bias[e]) > ord(s[e0 + best] + bias[best]))) { best = e; }
        }
        taken[e0 + best] = 1u;
        chosen[r * p.top_k + k] = best;
        weights[r * p.top_k + k] = s[e0 + best];
        denom = denom + s[e0 + best];
    }
    for (var k = 0u; k < p.top_k; k = k + 1u) {
        var w = weights[r * p.top_k + k];
        if (p.norm == 1u) { w = w / (denom + 1e-20); }
        weights[r * p.top_k + k] = w * p.scaling;
    }
}
"#;

/// The compiled kernels of this module and `attention.rs` on the process's one device.
pub struct Kernels {
    pub(super) gpu: Arc<Gpu>,
    pipes: HashMap<&'static str, wgpu::ComputePipeline>,
    /// The calls' grow-only buffers (`calls.rs`).
    pub(super) pool: PoolLock,
}

impl Kernels {
    /// Compiles every kernel; a shader the device rejects is an error, not a panic.
    pub fn new(gpu: Arc<Gpu>) -> Result<Kernels, GpuError> {
        let dev = &gpu.device;
        let mut pipes = HashMap::new();
        for &(name, src) in KERNELS.iter().chain(super::attention::KERNELS) {
            // One scope per kernel, so a rejected one is named.
            let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
            let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
            let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            if let Some(e) = pollster::block_on(scope.pop()) {
                let why = match e {
                    wgpu::Error::Validation { description, .. } => description,
                    other => other.to_string(),
                };
                return Err(GpuError::Device(format!("the {name} kernel: {why}")));
            }
            pipes.insert(name, pipe);
        }
        Ok(Kernels {
            gpu,
            pipes,
            pool: Default::default(),
        })
    }

    /// The device's `name (backend, driver)`.
    pub fn name(&self) -> &str {
        &self.gpu.name
    }

    /// The compiled kernel `name`.
    pub(super) fn pipe(&self, name: &str) -> Result<&wgpu::ComputePipeline, GpuError> {
        self.pipes
            .get(name)
            .ok_or_else(|| GpuError::Device(format!("no kernel {name}")))
    }

    /// `rms_norm_rows` (model/ops.rs) on the device: each row of `x` (`w.len()` wide).
    pub fn rms_norm_rows(&self, x: &mut [f32], w: &[f32], eps: f32) -> Result<(), GpuError> {
        let cols = w.len();
        let rows = x.len() / cols.max(1);
        let mut c = self.call();
        let xb = c.upload(x)?;
        let wb = c.upload(w)?;
        let out = c.submit(
            |r| {
                let p = [cols as u32, rows as u32, eps.to_bits()];
                r.dispatch("rms_norm", &p, &[&xb, &wb], [rows, 1, 1])?;
                Ok(())
            },
            &[Readback {
                buf: &xb,
                len: x.len(),
            }],
        )?;
        x.copy_from_slice(&out[0]);
        Ok(())
    }

    /// Rotary on the device: in each of the `x.len() / row_len` rows, each of `heads` heads
    /// (`head_len` apart) has its values `offset..offset + 2 * half` rotated by that row's
    /// angles, `cos_sin[row]` holding `half` `(cos, sin)` pairs (`Rope::cos_sin`). `half_pairs`:
    /// rotate-half pairing (i, i + half) instead of interleaved (2i, 2i + 1).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut [f32],
        row_len: usize,
        heads: usize,
        head_len: usize,
        offset: usize,
        cos_sin: &[f32],
        half_pairs: bool,
    ) -> Result<(), GpuError> {
        let rows = x.len() / row_len.max(1);
        let half = cos_sin.len() / 2 / rows.max(1);
        let mut c = self.call();
        let xb = c.upload(x)?;
        let cb = c.upload(cos_sin)?;
        let out = c.submit(
            |r| {
                let p = [
                    half,
                    heads,
                    rows,
                    row_len,
                    head_len,
                    offset,
                    half_pairs as usize,
                ]
                .map(|v| v as u32);
                let groups = [half.div_ceil(64), heads, rows];
                r.dispatch("rope", &p, &[&xb, &cb], groups)?;
                Ok(())
            },
            &[Readback {
                buf: &xb,
                len: x.len(),
            }],
        )?;
        x.copy_from_slice(&out[0]);
        Ok(())
    }

    /// `g = silu(g) * u`, element-wise (`quant::expf::silu_mul`).
    pub fn swiglu(&self, g: &mut [f32], u: &[f32]) -> Result<(), GpuError> {
        self.elementwise("swiglu", g, u)
    }

    /// `x += d`, element-wise: the residual add.
    pub fn add(&self, x: &mut [f32], d: &[f32]) -> Result<(), GpuError> {
        self.elementwise("add", x, d)
    }

    fn elementwise(&self, name: &str, x: &mut [f32], y: &[f32]) -> Result<(), GpuError> {
        if x.len() != y.len() {
            return Err(GpuError::Device(format!(
                "{name}: {} values against {}",
                x.len(),
                y.len()
            )));
        }
        let n = x.len();
        let mut c = self.call();
        let xb = c.upload(x)?;
        let yb = c.upload(y)?;
        let groups = n.div_ceil(64);
        let grid = [groups.min(65535), groups.div_ceil(65535), 1];
        let out = c.submit(
            |r| {
                r.dispatch(name, &[n as u32], &[&xb, &yb], grid)?;
                Ok(())
            },
            &[Readback { buf: &xb, len: n }],
        )?;
        x.copy_from_slice(&out[0]);
        Ok(())
    }

    /// The MoE router's choice for each row of `logits` (`(rows, experts)`, the gate's
    /// output), as `Router::select` makes it: `top_k` experts and their weights per row.
    pub fn route(
        &self,
        logits: &[f32],
        r: &RouterSpec<'_>,
    ) -> Result<(Vec<u32>, Vec<f32>), GpuError> {
        let experts = r.bias.len();
        let rows = logits.len() / experts.max(1);
        if r.n_group > 64
            || (r.n_group > 1 && !experts.is_multiple_of(r.n_group))
            || r.top_k > experts
        {
            return Err(GpuError::Device(format!(
                "routing of {experts} experts in {} groups, top {}: not on the device",
                r.n_group, r.top_k
            )));
        }
        let mut c = self.call();
        let sb = c.upload(logits)?;
        let bb = c.upload(r.bias)?;
        let taken = c.scratch(logits.len())?;
        let chosen = c.scratch(rows * r.top_k)?;
        let weights = c.scratch(rows * r.top_k)?;
        let out = c.submit(
            |rec| {
                let p = [
                    experts as u32,
                    rows as u32,
                    r.top_k as u32,
                    r.n_group as u32,
                    r.topk_group as u32,
                    r.softmax as u32,
                    r.norm_topk_prob as u32,
                    r.scaling.to_bits(),
                ];
                let bufs = [&sb, &bb, &taken, &chosen, &weights];
                rec.dispatch("router", &p, &bufs, [rows.div_ceil(64), 1, 1])?;
                Ok(())
            },
            &[
                Readback {
                    buf: &chosen,
                    len: rows * r.top_k,
                },
                Readback {
                    buf: &weights,
                    len: rows * r.top_k,
                },
            ],
        )?;
        let chosen = out[0].iter().map(|v| v.to_bits()).collect();
        Ok((chosen, out[1].clone()))
    }
}

/// What [`Kernels::route`] needs of a router (`model::moe::Router`'s fields).
pub struct RouterSpec<'a> {
    pub bias: &'a [f32],
    pub softmax: bool,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub scaling: f32,
}

pub(super) const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// A 32-bit word a buffer holds.
pub(super) trait Word: Copy {
    fn word(self) -> u32;
}

impl Word for f32 {
    fn word(self) -> u32 {
        self.to_bits()
    }
}

impl Word for u32 {
    fn word(self) -> u32 {
        self
    }
}
