//! Where an expert's bytes lie (coalesced into as few positional reads as the file allows) and
//! how those bytes become its three matrices.

use std::sync::Arc;

use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix, SharedBytes};
use crate::weights::{f32_le, fp8, fp8_scale_name, Dtype, ShardSet, TensorInfo, WeightsError};

/// Projections in the order of [`Expert`](super::Expert)'s fields.
pub const PROJS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// Bytes of padding between two tensors that still count as adjacent (read and ignored).
const MAX_GAP: u64 = 4096;

/// gpt-oss's published MXFP4 gate_up, read in place (`weights::fused_experts`): gate's and
/// up's rows interleaved in one part, split when the expert is decoded.
pub const GATE_UP: u8 = 6;
/// The interleaved bias of [`GATE_UP`].
pub const GATE_UP_BIAS: u8 = 7;

/// Projection `proj`'s tensor of expert `e` (its `.qs` scales with `scales`); `proj` 3..6 are
/// the biases of gate, up and down (gpt-oss's experts), [`GATE_UP`] and [`GATE_UP_BIAS`] the
/// fused gate_up's.
pub fn tensor_name(layer: usize, e: usize, proj: usize, scales: bool) -> String {
    let fused = format!("model.layers.{layer}.mlp.experts.{e}.gate_up_proj");
    if proj == GATE_UP as usize {
        return format!("{fused}.weight{}", if scales { ".qs" } else { "" });
    }
    if proj == GATE_UP_BIAS as usize {
        return format!("{fused}.bias");
    }
    if proj >= 3 {
        return format!(
            "model.layers.{layer}.mlp.experts.{e}.{}.bias",
            PROJS[proj - 3]
        );
    }
    format!(
        "model.layers.{layer}.mlp.experts.{e}.{}.weight{}",
        PROJS[proj],
        if scales { ".qs" } else { "" }
    )
}

/// One tensor's bytes inside a [`Run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub proj: u8,
    pub scales: bool,
    /// Offset inside the run.
    pub rel: u32,
    pub len: u32,
}

/// One positional read: `len` bytes at `start` of shard `file`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub file: u32,
    pub start: u64,
    pub len: u64,
    pub parts: Vec<Part>,
}

#[derive(Clone, Debug)]
pub struct ExpertLayout {
    pub runs: Vec<Run>,
    /// Stored dtype of gate, up, down.
    pub dtypes: [Dtype; 3],
    /// Dtype of each projection's scales part: F32 for a packed blob's `.qs`, the
    /// `_scale_inv` tensor's dtype for FP8 (unused for the other float dtypes).
    pub scale_dtypes: [Dtype; 3],
    /// Weight and scale bytes (what DISK-CLASS and the read figures count).
    pub payload: u64,
    /// Dtype of the biases (parts 3..6), where the experts have them.
    pub bias_dtype: Dtype,
    /// gpt-oss's published MXFP4 gate_up: gate and up come interleaved in the [`GATE_UP`]
    /// and [`GATE_UP_BIAS`] parts (no part of proj 1 or bias 4).
    pub gate_up: bool,
}

/// The shapes and target format every expert shares.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub hidden: usize,
    pub inter: usize,
    pub fmt: QFormat,
    pub fake_quant: bool,
    /// gpt-oss: every expert has gate, up and down biases and computes the clamped SwiGLU
    /// of `(alpha, limit)`.
    pub oss: Option<(f32, f32)>,
    /// DeepSeek-V4: no biases, the SwiGLU clamped at this limit (`OssExpert::dsv4`).
    pub dsv4_limit: Option<f32>,
}

impl Geometry {
    /// `[rows, cols]` of projection `p`.
    pub fn shape(&self, p: usize) -> (usize, usize) {
        if p == 2 {
            (self.hidden, self.inter)
        } else {
            (self.inter, self.hidden)
        }
    }
}

fn missing(name: &str) -> EngineError {
    EngineError::from(WeightsError::Missing {
        name: name.to_string(),
    })
}

/// Checks expert `e` of `layer` and plans its reads.
pub fn plan(
    shards: &ShardSet,
    geom: &Geometry,
    layer: usize,
    e: usize,
) -> Result<ExpertLayout, EngineError> {
    let mut pieces: Vec<(&TensorInfo, Part)> = Vec::with_capacity(6);
    let mut dtypes = [Dtype::F32; 3];
    let mut scale_dtypes = [Dtype::F32; 3];
    let gate_up = !shards.contains(&tensor_name(layer, e, 0, false))
        && shards.contains(&tensor_name(layer, e, GATE_UP as usize, false));
    for (p, dt) in dtypes.iter_mut().enumerate() {
        if gate_up && p < 2 {
            if p == 0 {
                plan_gate_up(shards, geom, layer, e, &mut pieces)?;
            }
            *dt = Dtype::U8;
            scale_dtypes[p] = Dtype::U8;
            continue;
        }
        let name = tensor_name(layer, e, p, false);
        let info = shards.get(&name).ok_or_else(|| missing(&name))?;
        let (rows, cols) = geom.shape(p);
        *dt = info.dtype;
        let part = |scales| Part {
            proj: p as u8,
            scales,
            rel: 0,
            len: 0,
        };
        match info.dtype {
            Dtype::U8 | Dtype::I8 => {
                let qs_name = tensor_name(layer, e, p, true);
                let qs = shards.get(&qs_name).ok_or_else(|| {
                    EngineError::Load(format!("tensor {name} is packed but {qs_name} is missing"))
                })?;
                match qs.dtype {
                    Dtype::F32 => {}
                    // gpt-oss's MXFP4, as `convert` keeps it: e8m0 bytes, one per 32 inputs.
                    Dtype::U8 if info.dtype == Dtype::U8 => {
                        let (blob, scales) = (rows * cols / 2, rows * (cols / 32));
                        if cols % 32 != 0 || info.len != blob as u64 || qs.len != scales as u64 {
                            return Err(EngineError::Load(format!(
                                "tensor {name} ({} bytes) with its MXFP4 scales {qs_name} ({} \
                                 bytes) is not a [{rows}, {cols}] MXFP4 matrix: that is \
                                 {blob} and {scales} bytes, with {cols} a multiple of 32",
                                info.len, qs.len
                            )));
                        }
                        scale_dtypes[p] = Dtype::U8;
                    }
                    dt => {
                        return Err(EngineError::Load(format!(
                            "tensor {qs_name} has dtype {dt:?}, expected F32 scales (or U8 \
                             e8m0 ones beside a U8 MXFP4 blob)"
                        )))
                    }
                }
                pieces.push((info, part(false)));
                pieces.push((qs, part(true)));
            }
            Dtype::F8E4M3 => {
                if info.shape != [rows, cols] {
                    return Err(EngineError::Load(format!(
                        "tensor {name} has shape {:?}, expected [{rows}, {cols}]",
                        info.shape
                    )));
                }
                // Checks the scales' shape and dtype once here, so decoding cannot fail on them.
                let s = shards.fp8_scale_info(&name)?;
                scale_dtypes[p] = s.dtype;
                pieces.push((info, part(false)));
                pieces.push((s, part(true)));
            }
            _ => {
                if info.shape != [rows, cols] {
                    return Err(EngineError::Load(format!(
                        "tensor {name} has shape {:?}, expected [{rows}, {cols}]",
                        info.shape
                    )));
                }
                pieces.push((info, part(false)));
            }
        }
    }
    let mut bias_dtype = Dtype::F32;
    if geom.oss.is_some() {
        for p in 0..3 {
            if gate_up && p == 1 {
                continue; // interleaved in gate's
            }
            let (proj, rows) = match (gate_up, p) {
                (true, 0) => (GATE_UP_BIAS as usize, 2 * geom.inter),
                _ => (3 + p, geom.shape(p).0),
            };
            let name = tensor_name(layer, e, proj, false);
            let info = shards.get(&name).ok_or_else(|| missing(&name))?;
            if info.shape != [rows] || !matches!(info.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16)
            {
                return Err(EngineError::Load(format!(
                    "tensor {name} is {:?} {:?}, expected an f32/bf16/f16 vector of [{rows}]",
                    info.dtype, info.shape
                )));
            }
            bias_dtype = info.dtype;
            pieces.push((
                info,
                Part {
                    proj: proj as u8,
                    scales: false,
                    rel: 0,
                    len: 0,
                },
            ));
        }
        let dts: Vec<Dtype> = [3, 4, 5, GATE_UP_BIAS as usize]
            .iter()
            .filter_map(|&p| {
                shards
                    .get(&tensor_name(layer, e, p, false))
                    .map(|i| i.dtype)
            })
            .collect();
        if dts.iter().any(|d| *d != bias_dtype) {
            return Err(EngineError::Load(format!(
                "the biases of expert {e} of layer {layer} differ in dtype ({dts:?})"
            )));
        }
    }
    pieces.sort_by_key(|(i, _)| (i.file, i.offset));
    let mut runs: Vec<Run> = Vec::new();
    let mut payload = 0;
    for (info, mut part) in pieces {
        payload += info.len;
        let too_long = |len: u64| {
            u32::try_from(len)
                .map_err(|_| EngineError::Load(format!("tensor {} is over 4 GiB", info.name)))
        };
        part.len = too_long(info.len)?;
        let joins = runs.last().is_some_and(|r| {
            r.file as usize == info.file
                && info.offset >= r.start + r.len
                && info.offset - (r.start + r.len) <= MAX_GAP
        });
        if joins {
            let r = runs.last_mut().expect("checked just above");
            part.rel = too_long(info.offset - r.start)?;
            r.len = info.offset + info.len - r.start;
            r.parts.push(part);
        } else {
            runs.push(Run {
                file: info.file as u32,
                start: info.offset,
                len: info.len,
                parts: vec![part],
            });
        }
    }
    Ok(ExpertLayout {
        runs,
        dtypes,
        scale_dtypes,
        payload,
        bias_dtype,
        gate_up,
    })
}

/// The [`GATE_UP`] parts of expert `e`: gpt-oss's interleaved MXFP4 gate_up (`2 * inter`
/// rows of blocks, one e8m0 byte a group), as `weights::fused_experts` views it.
fn plan_gate_up<'a>(
    shards: &'a ShardSet,
    geom: &Geometry,
    layer: usize,
    e: usize,
    pieces: &mut Vec<(&'a TensorInfo, Part)>,
) -> Result<(), EngineError> {
    let name = tensor_name(layer, e, GATE_UP as usize, false);
    let qs_name = tensor_name(layer, e, GATE_UP as usize, true);
    let info = shards.get(&name).ok_or_else(|| missing(&name))?;
    let qs = shards.get(&qs_name).ok_or_else(|| missing(&qs_name))?;
    let (rows, cols) = (2 * geom.inter, geom.hidden);
    let (blob, scales) = (rows * cols / 2, rows * (cols / 32));
    if info.dtype != Dtype::U8
        || qs.dtype != Dtype::U8
        || cols % 32 != 0
        || info.len != blob as u64
        || qs.len != scales as u64
    {
        return Err(EngineError::Load(format!(
            "tensor {name} ({:?}, {} bytes) with its scales {qs_name} ({:?}, {} bytes) is not \
             an interleaved [{rows}, {cols}] MXFP4 gate_up: that is u8 {blob} and {scales} bytes",
            info.dtype, info.len, qs.dtype, qs.len
        )));
    }
    for (t, scales) in [(info, false), (qs, true)] {
        pieces.push((
            t,
            Part {
                proj: GATE_UP,
                scales,
                rel: 0,
                len: 0,
            },
        ));
    }
    Ok(())
}

/// Resident bytes of one expert once loaded (the RAM clamp's unit).
pub fn resident_bytes(geom: &Geometry, layout: &ExpertLayout) -> u64 {
    let mut total = 0u64;
    for (p, dt) in layout.dtypes.iter().enumerate() {
        let (rows, cols) = geom.shape(p);
        total += match dt {
            // pre-quantized (a container's blob or a GGUF's blocks): kept as stored
            dt if dt.is_packed() || matches!(dt, Dtype::Ggml(_)) => layout
                .runs
                .iter()
                .flat_map(|r| &r.parts)
                .filter(|x| x.proj as usize == p || (p == 0 && x.proj == GATE_UP))
                // MXFP4's e8m0 bytes are kept as f32 scales in memory.
                .map(|x| {
                    let widen = x.scales && layout.scale_dtypes[p] == Dtype::U8;
                    x.len as u64 * if widen { 4 } else { 1 }
                })
                .sum(),
            _ if geom.fake_quant || geom.fmt == QFormat::F32 => (rows * cols * 4) as u64,
            _ => (geom.fmt.data_len(rows, cols) + geom.fmt.scales_len(rows, cols) * 4) as u64,
        };
        if geom.oss.is_some() {
            total += (rows * 4) as u64;
        }
    }
    total
}

/// A gpt-oss MXFP4 matrix (U8 blob plus its U8 e8m0 `.qs`, used as stored).
pub fn decode_mxfp4(
    geom: &Geometry,
    layer: usize,
    e: usize,
    p: usize,
    raw: Vec<u8>,
    scales: Option<&[u8]>,
) -> Result<QMatrix, EngineError> {
    let qs = scales.ok_or_else(|| missing(&tensor_name(layer, e, p, true)))?;
    let (rows, cols) = geom.shape(p);
    QMatrix::from_mxfp4(rows, cols, raw, qs).map_err(|err| {
        EngineError::Load(format!("tensor {}: {err}", tensor_name(layer, e, p, false)))
    })
}

/// A packed matrix (U8/I8 blob plus its `.qs` scales, used as stored) that keeps `raw` as
/// its storage.
pub fn decode_packed(
    geom: &Geometry,
    layer: usize,
    e: usize,
    p: usize,
    raw: Vec<u8>,
    scales: Option<&[u8]>,
) -> Result<QMatrix, EngineError> {
    packed_with(layer, e, p, scales, |qs| {
        let (rows, cols) = geom.shape(p);
        QMatrix::from_packed(rows, cols, raw, qs)
    })
}

/// As [`decode_packed`], over bytes shared with their owner (a shard's map): no copy.
pub fn decode_shared(
    geom: &Geometry,
    layer: usize,
    e: usize,
    p: usize,
    raw: Arc<dyn SharedBytes>,
    scales: Option<&[u8]>,
) -> Result<QMatrix, EngineError> {
    packed_with(layer, e, p, scales, |qs| {
        let (rows, cols) = geom.shape(p);
        QMatrix::from_shared(rows, cols, raw, qs)
    })
}

/// `build(scales)` for projection `p` of expert `e`, its `.qs` scales required, an error
/// naming the tensor.
fn packed_with(
    layer: usize,
    e: usize,
    p: usize,
    scales: Option<&[u8]>,
    build: impl FnOnce(Vec<f32>) -> Result<QMatrix, crate::quant::QuantError>,
) -> Result<QMatrix, EngineError> {
    let qs = scales.ok_or_else(|| missing(&tensor_name(layer, e, p, true)))?;
    build(f32_le(qs)).map_err(|err| {
        EngineError::Load(format!("tensor {}: {err}", tensor_name(layer, e, p, false)))
    })
}

/// One projection from its stored bytes (`scales`: a packed blob's `.qs`, or an FP8 tensor's
/// `_scale_inv` of dtype `scale_dtype`), quantized to the target format for float sources
/// exactly as the store always has.
#[allow(clippy::too_many_arguments)]
pub fn decode_matrix(
    geom: &Geometry,
    layer: usize,
    e: usize,
    p: usize,
    dtype: Dtype,
    scale_dtype: Dtype,
    raw: &[u8],
    scales: Option<&[u8]>,
) -> Result<QMatrix, EngineError> {
    let (rows, cols) = geom.shape(p);
    let name = || tensor_name(layer, e, p, false);
    let floats = match dtype {
        // Packed container: U8/I8 blob plus its `.qs` scales, used as stored.
        dt if dt.is_packed() => return decode_packed(geom, layer, e, p, raw.to_vec(), scales),
        // A GGUF's blocks, computed as stored.
        Dtype::Ggml(ty) => {
            return QMatrix::from_ggml(ty, rows, cols, raw.to_vec())
                .map_err(|err| EngineError::Load(format!("tensor {}: {err}", name())))
        }
        Dtype::F8E4M3 => {
            let sname = fp8_scale_name(&name());
            let s = scales
                .and_then(|b| scale_dtype.to_f32(b))
                .filter(|s| s.len() == fp8::scale_shape(rows, cols).iter().product::<usize>())
                .ok_or_else(|| EngineError::Load(format!("tensor {sname}: bad block scales")))?;
            let mut w = vec![0.0; rows * cols];
            if raw.len() != w.len() {
                return Err(EngineError::Load(format!(
                    "tensor {}: {} bytes, expected {}",
                    name(),
                    raw.len(),
                    w.len()
                )));
            }
            fp8::dequant_rows(raw, cols, 0, &s, &mut w);
            Some(w)
        }
        dt => dt.to_f32(raw),
    };
    match floats {
        None => Err(EngineError::Load(format!(
            "tensor {}: dtype {dtype:?} cannot be decoded",
            name()
        ))),
        Some(w) => Ok(match (geom.fmt, geom.fake_quant) {
            (QFormat::F32, _) => QMatrix::from_f32(w, rows, cols),
            (fmt, false) => QMatrix::quantize(&w, rows, cols, fmt),
            (fmt, true) => QMatrix::from_f32(
                QMatrix::quantize(&w, rows, cols, fmt).dequantize(),
                rows,
                cols,
            ),
        }),
    }
}
