//! The GPU's names in a build without it (no cargo feature `gpu`): the same types and
//! signatures as the real module, so the rest of the crate compiles unchanged, but no device
//! type can be made. [`shared`] is the only way to a device and always answers that the GPU
//! is not built in, so every path that would use one takes the CPU's, as on a machine without
//! an adapter; the method bodies are never reached (each matches on an uninhabited field).

use std::convert::Infallible;
use std::sync::Arc;

use super::{ExpertRows, GpuChoice, GpuError, GqaShape, MlaShape};
use crate::quant::{ActMode, QMatrix};

/// What every stub type holds: nothing can be made without a `Gpu`, and no `Gpu` can be.
type Never = Infallible;

/// No adapter can be opened: this build has no GPU.
pub fn shared(_choice: GpuChoice) -> Result<Arc<Gpu>, GpuError> {
    Err(GpuError::NoAdapter(
        "this build has no GPU support (cargo build --features gpu)".into(),
    ))
}

pub struct Gpu {
    pub name: String,
    pub adapter: String,
    pub max_buffer: u64,
    never: Never,
}

impl Gpu {
    pub fn failed(&self) -> bool {
        match self.never {}
    }

    pub fn announce_loss(&self, _why: &GpuError) {
        match self.never {}
    }

    pub fn read_bandwidth_gbs(&self, _bytes: u64, _rounds: usize) -> Result<f64, GpuError> {
        match self.never {}
    }
}

/// Device rows: none can exist here.
pub enum DeviceBuffer {}

pub struct DeviceF32 {
    never: Never,
}

impl DeviceF32 {
    pub fn bytes(&self) -> u64 {
        match self.never {}
    }
}

pub struct KeptKeys {
    never: Never,
}

impl KeptKeys {
    pub fn row(&self, _s: usize) -> std::iter::Empty<usize> {
        match self.never {}
    }
}

pub struct Kernels {
    never: Never,
}

impl Kernels {
    pub fn name(&self) -> &str {
        match self.never {}
    }

    pub fn rms_norm_rows(&self, _x: &mut [f32], _w: &[f32], _eps: f32) -> Result<(), GpuError> {
        match self.never {}
    }
}

pub struct AttnGpu {
    never: Never,
}

impl AttnGpu {
    pub fn new(gpu: Arc<Gpu>) -> Result<AttnGpu, GpuError> {
        match gpu.never {}
    }

    pub fn kernels(&self) -> &Kernels {
        match self.never {}
    }

    pub fn is_on(&self) -> bool {
        match self.never {}
    }

    pub fn fail(&self, _e: &GpuError) {
        match self.never {}
    }

    pub fn upload(&self, _w: &[f32]) -> Result<DeviceF32, GpuError> {
        match self.never {}
    }

    pub fn f32_rows<'s>(
        &self,
        _slot: &'s DeviceSlot,
        _w: &QMatrix,
    ) -> Result<&'s DeviceF32, GpuError> {
        match self.never {}
    }

    #[allow(clippy::too_many_arguments)]
    pub fn mla_core<'s>(
        &self,
        _d: MlaShape,
        _kv_b: &DeviceF32,
        _q: &[f32],
        _n: usize,
        _pos0: usize,
        _latent: &DeviceBuffer,
        _rope: &DeviceBuffer,
        _sel: impl Fn(usize) -> Option<&'s [usize]>,
    ) -> Result<Vec<f32>, GpuError> {
        match self.never {}
    }

    #[allow(clippy::too_many_arguments)]
    pub fn index_select(
        &self,
        _q: &[f32],
        _w: &[f32],
        _keys: &DeviceBuffer,
        _heads: (usize, usize),
        _n: usize,
        _pos0: usize,
        _topk: usize,
    ) -> Result<Option<KeptKeys>, GpuError> {
        match self.never {}
    }

    pub fn gqa_core(
        &self,
        _d: GqaShape,
        _q: &[f32],
        _n: usize,
        _pos0: usize,
        _kv: (&DeviceBuffer, &DeviceBuffer),
    ) -> Result<Vec<f32>, GpuError> {
        match self.never {}
    }
}

/// A `Linear`'s device copies: always empty here.
#[derive(Default)]
pub struct DeviceSlot;

impl DeviceSlot {
    pub fn placed(&self) -> bool {
        false
    }

    /// Never computed here: the caller computes on the CPU.
    pub fn forward_all(
        _slots: &[&DeviceSlot],
        _x: &[f32],
        _n: usize,
        _ys: &mut [&mut [f32]],
        _act: ActMode,
    ) -> bool {
        false
    }
}

pub struct Placer {
    never: Never,
}

impl Placer {
    pub fn new(gpu: Arc<Gpu>, _budget: u64) -> Placer {
        match gpu.never {}
    }

    pub fn reserve_attention(&mut self, _bytes: u64) {
        match self.never {}
    }

    pub fn offer(&mut self, _w: &QMatrix, _slot: &mut DeviceSlot) {
        match self.never {}
    }

    pub fn done(self) -> (super::DensePlaced, Arc<Gpu>) {
        match self.never {}
    }
}

/// A session's device rows: none here (the cache is the only copy).
#[derive(Clone, Debug, Default)]
pub struct KvMirror;

impl KvMirror {
    pub fn keep(&mut self, _layer: usize, _lens: [usize; 3]) {}

    pub fn held(&self, _layer: usize, _part: usize) -> usize {
        0
    }

    pub fn sync<'a, const N: usize>(
        &'a mut self,
        k: &Kernels,
        _layer: usize,
        _cpu: [&[f32]; N],
    ) -> Result<[&'a DeviceBuffer; N], GpuError> {
        match k.never {}
    }
}

pub struct VramTier {
    never: Never,
}

impl VramTier {
    pub fn new(gpu: Arc<Gpu>) -> VramTier {
        match gpu.never {}
    }

    pub fn device_name(&self) -> &str {
        match self.never {}
    }

    pub fn add(
        &self,
        _layer: usize,
        _e: usize,
        _w: [&QMatrix; 3],
        _oss: Option<Box<crate::experts::OssExpert>>,
    ) -> Result<(), GpuError> {
        match self.never {}
    }

    pub fn remove(&self, _layer: usize, _e: usize) {
        match self.never {}
    }

    pub fn active(&self) -> bool {
        match self.never {}
    }

    pub fn holds(&self, _layer: usize, _e: usize) -> bool {
        match self.never {}
    }

    pub fn held(&self) -> Vec<(usize, usize)> {
        match self.never {}
    }

    pub fn resident(&self) -> (usize, u64) {
        match self.never {}
    }

    pub fn fail(&self, _why: &GpuError) {
        match self.never {}
    }

    pub fn run(&self, _layer: usize, _jobs: &mut [ExpertRows<'_>]) -> Result<(), GpuError> {
        match self.never {}
    }
}
