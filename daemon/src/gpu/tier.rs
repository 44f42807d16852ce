//! The VRAM tier: the experts the usage history ranks hottest, uploaded once at start, computed
//! on the GPU when a layer routes rows to them. Gate and up run on the device, the activation
//! on the CPU, then down on the device: every product equals the CPU's bit for bit. The
//! activation is the CPU expert's own code, so its bits are the CPU's too: `silu_mul`, or for
//! an expert with an [`OssExpert`] (gpt-oss's biases and clamped SwiGLU, DeepSeek-V4's clamp)
//! its `glu` (the gate and up biases, the clamps) and, after down, its `add_down_bias`. The
//! biases stay in RAM beside the device matrices (a few KB an expert). A device failure turns
//! the tier off for good; the experts it held are then read from disk like any other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::{ExpertRows, Gpu, GpuError, GpuMatrix, Product};
use crate::experts::OssExpert;
use crate::quant::expf::silu_mul;
use crate::quant::{ActMode, QMatrix};

struct GpuExpert {
    gate: GpuMatrix,
    up: GpuMatrix,
    down: GpuMatrix,
    /// The biases and clamped activation, as the CPU expert holds them; `None`: plain SwiGLU.
    oss: Option<Box<OssExpert>>,
}

impl GpuExpert {
    fn bytes(&self) -> u64 {
        self.gate.bytes + self.up.bytes + self.down.bytes
    }
}

pub struct VramTier {
    gpu: std::sync::Arc<Gpu>,
    /// By `(layer, expert)`; written only between turns (placement, re-plan).
    experts: RwLock<HashMap<(usize, usize), GpuExpert>>,
    bytes: AtomicU64,
}

impl VramTier {
    pub fn new(gpu: std::sync::Arc<Gpu>) -> VramTier {
        VramTier {
            gpu,
            experts: RwLock::new(HashMap::new()),
            bytes: AtomicU64::new(0),
        }
    }

    /// The adapter's name, for the `[GPU]` line.
    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }

    /// Uploads expert `e` of `layer`, given its gate, up and down matrices and, for a biased
    /// or clamped expert, what the CPU expert adds to them (kept here, in RAM).
    pub fn add(
        &self,
        layer: usize,
        e: usize,
        [gate, up, down]: [&QMatrix; 3],
        oss: Option<Box<OssExpert>>,
    ) -> Result<(), GpuError> {
        if let Some(o) = &oss {
            let (inter, hidden) = (gate.rows(), down.rows());
            if o.gate_bias.len() != inter || o.up_bias.len() != inter || o.down_bias.len() != hidden
            {
                return Err(GpuError::Device(format!(
                    "expert {e} of layer {layer}: biases of {}, {} and {} values for {inter} \
                     intermediate and {hidden} hidden rows",
                    o.gate_bias.len(),
                    o.up_bias.len(),
                    o.down_bias.len()
                )));
            }
        }
        let g = GpuExpert {
            gate: GpuMatrix::upload(&self.gpu, gate)?,
            up: GpuMatrix::upload(&self.gpu, up)?,
            down: GpuMatrix::upload(&self.gpu, down)?,
            oss,
        };
        self.bytes.fetch_add(g.bytes(), Ordering::Relaxed);
        if self.experts.write().insert((layer, e), g).is_none() {
            self.gpu.experts_held.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Frees expert `e` of `layer`'s device memory.
    pub fn remove(&self, layer: usize, e: usize) {
        if let Some(g) = self.experts.write().remove(&(layer, e)) {
            self.bytes.fetch_sub(g.bytes(), Ordering::Relaxed);
            self.gpu.experts_held.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether the device still answers (no failure so far).
    pub fn active(&self) -> bool {
        !self.gpu.failed()
    }

    /// Whether expert `e` of `layer` is computed here (never once the device failed).
    pub fn holds(&self, layer: usize, e: usize) -> bool {
        self.active() && self.experts.read().contains_key(&(layer, e))
    }

    /// The experts held, `(layer, expert)`.
    pub fn held(&self) -> Vec<(usize, usize)> {
        self.experts.read().keys().copied().collect()
    }

    /// Experts held and their device bytes (0 once the device failed).
    pub fn resident(&self) -> (usize, u64) {
        if self.active() {
            (
                self.experts.read().len(),
                self.bytes.load(Ordering::Relaxed),
            )
        } else {
            (0, 0)
        }
    }

    /// After the device was lost: it is marked lost for all its users (which turns this tier
    /// off) and says so once.
    pub fn fail(&self, why: &GpuError) {
        self.gpu.announce_loss(why);
    }

    /// The experts of `jobs` (all held, of `layer`), each over its rows.
    pub fn run(&self, layer: usize, jobs: &mut [ExpertRows<'_>]) -> Result<(), GpuError> {
        let experts = self.experts.read();
        let get = |e: usize| {
            experts.get(&(layer, e)).ok_or_else(|| {
                GpuError::Device(format!("expert {e} of layer {layer} is not in VRAM"))
            })
        };
        let mut gate_up = Vec::with_capacity(2 * jobs.len());
        for j in jobs.iter() {
            let g = get(j.expert)?;
            gate_up.push(Product {
                matrix: &g.gate,
                x: j.x,
                n: j.n,
                act: ActMode::Int8,
            });
            gate_up.push(Product {
                matrix: &g.up,
                x: j.x,
                n: j.n,
                act: ActMode::Int8,
            });
        }
        let mut gu = vec![Vec::new(); gate_up.len()];
        self.gpu.run(&gate_up, &mut gu)?;
        // The activation on the CPU, by the CPU expert's own code: the result lands in each
        // gate output.
        for (j, pair) in jobs.iter().zip(gu.chunks_exact_mut(2)) {
            let (g, u) = pair.split_at_mut(1);
            match get(j.expert)?.oss.as_deref() {
                None => silu_mul(&mut g[0], &u[0]),
                Some(o) => o.glu(&mut g[0], &u[0]),
            }
        }
        let mut downs = Vec::with_capacity(jobs.len());
        for (j, pair) in jobs.iter().zip(gu.chunks_exact(2)) {
            downs.push(Product {
                matrix: &get(j.expert)?.down,
                x: &pair[0],
                n: j.n,
                act: ActMode::Int8,
            });
        }
        let mut y = vec![Vec::new(); downs.len()];
        self.gpu.run(&downs, &mut y)?;
        for (j, y) in jobs.iter_mut().zip(&y) {
            j.out.copy_from_slice(y);
            if let Some(o) = get(j.expert)?.oss.as_deref() {
                o.add_down_bias(j.out);
            }
        }
        Ok(())
    }
}
