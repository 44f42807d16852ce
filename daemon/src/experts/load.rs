//! Reading and decoding one expert ([`Core::load`]): what the store and its I/O workers
//! share. The plan of an expert's byte runs comes from `layout`, the read from `io`, the
//! checks from `check`; here the parts become the three matrices (kept as stored where the
//! kernels compute the format as it is, decoded otherwise) and, for gpt-oss and
//! DeepSeek-V4, their biases. The demand loads' DISK-CLASS and byte counters are taken here.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::layout::{self, ExpertLayout, Geometry};
use super::stats::{Class, Stats};
use super::{check, gate_up, io, Expert, OssExpert};
use crate::error::EngineError;
use crate::quant::{QMatrix, SharedBytes};

/// What the I/O workers share with the store: how to find, read and decode an expert.
pub(crate) struct Core {
    pub(super) geom: Geometry,
    /// Indexed by layer; `None` for dense layers.
    pub(super) layouts: Vec<Option<Vec<ExpertLayout>>>,
    pub(super) io: io::Io,
    pub(super) stats: Stats,
    /// `--verify-reads`: the checksum of every expert tensor.
    pub(super) sums: Option<check::ReadSums>,
}

impl Core {
    pub(super) fn layout(&self, layer: usize, e: usize) -> Result<&ExpertLayout, EngineError> {
        self.layouts
            .get(layer)
            .and_then(|l| l.as_ref())
            .and_then(|l| l.get(e))
            .ok_or_else(|| EngineError::Load(format!("no routed expert {e} in layer {layer}")))
    }

    /// Reads and decodes one expert. `class` is set for demand loads (DISK-CLASS).
    pub(crate) fn load(
        &self,
        layer: usize,
        e: usize,
        class: Option<Class>,
    ) -> Result<Expert, EngineError> {
        let layout = self.layout(layer, e)?;
        if let Some(c) = class {
            self.stats.dc_begin(c);
        }
        let t0 = Instant::now();
        let (result, direct, read_ns) = match self.io.read(layout, layer, e) {
            Ok(mut loaded) => {
                let (direct, read_ns) = (loaded.direct, loaded.read_ns);
                let t1 = Instant::now();
                let checked =
                    check::loaded(&self.io, self.sums.as_ref(), layout, &loaded, layer, e);
                let t2 = Instant::now();
                let x = checked.and_then(|()| self.decode(layout, &mut loaded, layer, e));
                self.io.recycle(loaded);
                let s = &self.stats;
                s.read_ns.fetch_add(read_ns, Ordering::Relaxed);
                s.check_ns
                    .fetch_add((t2 - t1).as_nanos() as u64, Ordering::Relaxed);
                s.build_ns
                    .fetch_add(t2.elapsed().as_nanos() as u64, Ordering::Relaxed);
                (x, direct, read_ns)
            }
            Err(err) => (Err(err), false, t0.elapsed().as_nanos() as u64),
        };
        let ok = result.is_ok();
        let bytes = if ok { layout.payload } else { 0 };
        if let Some(c) = class {
            self.stats.dc_end(c, bytes, read_ns, direct && ok);
        }
        let s = &self.stats;
        s.load_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if ok {
            s.bytes_read.fetch_add(bytes, Ordering::Relaxed);
            if class.is_some() {
                s.loads.fetch_add(1, Ordering::Relaxed);
            } else {
                s.other_loads.fetch_add(1, Ordering::Relaxed);
            }
            if direct {
                s.direct_loads.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    fn decode(
        &self,
        layout: &ExpertLayout,
        loaded: &mut io::Loaded,
        layer: usize,
        e: usize,
    ) -> Result<Expert, EngineError> {
        // Packed matrices read into buffers of their own keep them as storage (no copy), and
        // those read as handles into the map use the map's pages (zero-copy).
        let mut owned: [Option<Vec<u8>>; 3] = [None, None, None];
        let mut shared: [Option<Arc<dyn SharedBytes>>; 3] = [None, None, None];
        for (ri, run) in layout.runs.iter().enumerate() {
            for (pi, part) in run.parts.iter().enumerate() {
                let p = part.proj as usize;
                // Parts past the three matrices (biases, gpt-oss's fused gate_up) have no
                // dtype slot of their own: only a matrix is kept as stored.
                if p >= 3 || part.scales {
                    continue;
                }
                let as_stored = layout.dtypes[p].is_packed()
                    || matches!(layout.dtypes[p], crate::weights::Dtype::Ggml(_));
                if as_stored {
                    owned[p] = loaded.take_part(ri, pi);
                    shared[p] = loaded.shared_part(ri, pi, part);
                }
            }
        }
        let loaded = &*loaded;
        let mut raw: [Option<&[u8]>; 3] = [None; 3];
        let mut scales: [Option<&[u8]>; 3] = [None; 3];
        let mut biases: [Option<&[u8]>; 3] = [None; 3];
        // gpt-oss's published interleaved gate_up: (blocks, scales, bias).
        let mut fused: [Option<&[u8]>; 3] = [None; 3];
        for (ri, run) in layout.runs.iter().enumerate() {
            for (pi, part) in run.parts.iter().enumerate() {
                let b = loaded.part(ri, pi, part);
                let p = part.proj as usize;
                if part.proj == layout::GATE_UP {
                    fused[part.scales as usize] = Some(b);
                } else if part.proj == layout::GATE_UP_BIAS {
                    fused[2] = Some(b);
                } else if p >= 3 {
                    biases[p - 3] = Some(b);
                } else if part.scales {
                    scales[p] = Some(b);
                } else {
                    raw[p] = Some(b);
                }
            }
        }
        let mut m = |p: usize| {
            // A GGUF's quantized expert: its blocks as read, computed as stored.
            if let crate::weights::Dtype::Ggml(ty) = layout.dtypes[p] {
                let (rows, cols) = self.geom.shape(p);
                let built = match (owned[p].take(), shared[p].take(), raw[p]) {
                    (Some(b), _, _) => QMatrix::from_ggml(ty, rows, cols, b),
                    (None, Some(s), _) => QMatrix::from_ggml_shared(ty, rows, cols, s),
                    (None, None, r) => QMatrix::from_ggml(
                        ty,
                        rows,
                        cols,
                        r.map(<[u8]>::to_vec).unwrap_or_default(),
                    ),
                };
                return built.map_err(|err| {
                    EngineError::Load(format!(
                        "tensor {}: {err}",
                        layout::tensor_name(layer, e, p, false)
                    ))
                });
            }
            if layout.scale_dtypes[p] == crate::weights::Dtype::U8 {
                let bytes = match (owned[p].take(), shared[p].take(), raw[p]) {
                    (Some(b), _, _) => b,
                    (None, Some(s), _) => s.bytes().to_vec(),
                    (None, None, r) => r.map(<[u8]>::to_vec).unwrap_or_default(),
                };
                return layout::decode_mxfp4(&self.geom, layer, e, p, bytes, scales[p]);
            }
            if let Some(bytes) = owned[p].take() {
                return layout::decode_packed(&self.geom, layer, e, p, bytes, scales[p]);
            }
            if let Some(bytes) = shared[p].take() {
                return layout::decode_shared(&self.geom, layer, e, p, bytes, scales[p]);
            }
            let r = raw[p].ok_or_else(|| {
                EngineError::Load(format!(
                    "no bytes planned for {}",
                    layout::tensor_name(layer, e, p, false)
                ))
            })?;
            layout::decode_matrix(
                &self.geom,
                layer,
                e,
                p,
                layout.dtypes[p],
                layout.scale_dtypes[p],
                r,
                scales[p],
            )
        };
        let (gate, up, down) = if layout.gate_up {
            let no = |scales| {
                let name = layout::tensor_name(layer, e, layout::GATE_UP as usize, scales);
                EngineError::Load(format!("no bytes planned for {name}"))
            };
            let (blocks, scales) = (
                fused[0].ok_or_else(|| no(false))?,
                fused[1].ok_or_else(|| no(true))?,
            );
            let (gate, up) = gate_up::split(&self.geom, layer, e, blocks, scales)?;
            (gate, up, m(2)?)
        } else {
            (m(0)?, m(1)?, m(2)?)
        };
        let oss = match self.geom.oss {
            None => None,
            Some((alpha, limit)) => {
                let bias = |proj: usize, rows: usize| -> Result<Vec<f32>, EngineError> {
                    let name = layout::tensor_name(layer, e, proj, false);
                    let bytes = match proj {
                        p if p == layout::GATE_UP_BIAS as usize => fused[2],
                        _ => biases[proj - 3],
                    };
                    bytes
                        .and_then(|b| layout.bias_dtype.to_f32(b))
                        .filter(|v| v.len() == rows)
                        .ok_or_else(|| {
                            EngineError::Load(format!("tensor {name}: not {rows} values"))
                        })
                };
                let (gate_bias, up_bias) = if layout.gate_up {
                    let both = bias(layout::GATE_UP_BIAS as usize, 2 * self.geom.inter)?;
                    gate_up::split_bias(&both)
                } else {
                    (bias(3, self.geom.inter)?, bias(4, self.geom.inter)?)
                };
                Some(Box::new(OssExpert {
                    gate_bias,
                    up_bias,
                    down_bias: bias(5, self.geom.hidden)?,
                    alpha,
                    limit,
                    dsv4: false,
                }))
            }
        };
        let oss = match (oss, self.geom.dsv4_limit) {
            (None, Some(limit)) => Some(Box::new(OssExpert::dsv4(
                self.geom.inter,
                self.geom.hidden,
                limit,
            ))),
            (oss, _) => oss,
        };
        Ok(Expert {
            gate,
            up,
            down,
            oss,
        })
    }
}
