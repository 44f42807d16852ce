//! What a conversion writes, decided before a byte is written: every output tensor's format,
//! its place in which shard, and so every shard's header and exact size.
//!
//! The formats are the ones the loader would pick at the same flags (`model::load`): routed
//! experts at `--expert-bits`, the embedding and lm_head at `--io-bits`, the router
//! (`mlp.gate.weight`) and the indexer's `weights_proj` in f32, every other matrix at
//! `--dense-bits`, and every tensor that is not a matrix (norms, biases, the router's
//! `e_score_correction_bias`) in f32. So loading the output gives the same matrices, bit for
//! bit, as quantizing the source at load. The MTP head (layers at or past `num_hidden_layers`)
//! takes `--mtp-bits` for all its matrices, as upstream's `--mtp` pass does.
//!
//! Layout, upstream's (reference/upstream-behaviour.md §5.1): each quantized weight `<name>`
//! is a 1-D U8 blob beside its 1-D F32 `<name>.qs`; the main model goes to `out-NNNNN`, the
//! MTP head to `out-mtp-NNNNN`, the DSA indexer's weights to `out-idx-NNNNN`. Within a shard a
//! routed expert's gate, up and down (each followed by its scales) are adjacent, so one read
//! covers the expert, and an expert never straddles two shards.

use crate::error::EngineError;
use crate::quant::QFormat;
use crate::weights::writer::{header_bytes, HeaderEntry};
use crate::weights::{Dtype, ShardSet, TensorInfo};

/// The target format of each class of tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Formats {
    pub expert: QFormat,
    pub dense: QFormat,
    pub io: QFormat,
    pub mtp: QFormat,
}

/// How a source tensor becomes its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encode {
    /// f32, shape kept.
    F32,
    /// A `[rows, cols]` matrix quantized to this (canonical) format: blob plus `.qs`.
    Quant(QFormat),
    /// Already packed (a U8/I8 container tensor): bytes copied as they are.
    Copy,
}

/// Which output files a tensor goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    Main,
    Mtp,
    Indexer,
}

impl Group {
    pub fn prefix(self) -> &'static str {
        match self {
            Group::Main => "out-",
            Group::Mtp => "out-mtp-",
            Group::Indexer => "out-idx-",
        }
    }
}

/// One source tensor's output.
#[derive(Clone, Debug)]
pub struct OutTensor {
    pub source: TensorInfo,
    pub encode: Encode,
    /// `[rows, cols]` for matrices; `[1, elements]` for anything else.
    pub rows: usize,
    pub cols: usize,
    /// Bytes of the tensor's data (the blob for `Quant`).
    pub data_len: u64,
    /// Number of f32 scales in `<name>.qs` (`Quant` only).
    pub scales: usize,
    /// gpt-oss: the values come out of an expert's slab of a fused tensor (`source` is that
    /// slab, under the output's name and shape); `None`: the source's bytes in order.
    pub pick: Option<super::gpt_oss::Pick>,
}

impl OutTensor {
    /// Output bytes: data plus scales.
    pub fn out_bytes(&self) -> u64 {
        self.data_len + 4 * self.scales as u64
    }

    fn entries(&self) -> Vec<(String, Dtype, Vec<usize>, u64)> {
        let name = self.source.name.clone();
        match self.encode {
            Encode::F32 => vec![(name, Dtype::F32, self.source.shape.clone(), self.data_len)],
            Encode::Copy => vec![(
                name,
                self.source.dtype,
                self.source.shape.clone(),
                self.data_len,
            )],
            Encode::Quant(_) => vec![
                (
                    name.clone(),
                    Dtype::U8,
                    vec![self.data_len as usize],
                    self.data_len,
                ),
                (
                    format!("{name}.qs"),
                    Dtype::F32,
                    vec![self.scales],
                    4 * self.scales as u64,
                ),
            ],
        }
    }
}

/// One output file.
#[derive(Debug)]
pub struct Shard {
    pub name: String,
    pub tensors: Vec<OutTensor>,
    /// The file's first bytes: length and JSON header.
    pub header: Vec<u8>,
    /// Size of the whole file.
    pub bytes: u64,
}

impl Shard {
    /// `(name, bytes)` of every entry in file order, the first at `header.len()`.
    pub fn entries(&self) -> Vec<(String, u64)> {
        self.tensors
            .iter()
            .flat_map(|t| t.entries().into_iter().map(|e| (e.0, e.3)))
            .collect()
    }

    /// The `(name, dtype, shape, len)` of every tensor in file order (for the index json).
    pub fn entry_names(&self) -> Vec<String> {
        self.tensors
            .iter()
            .flat_map(|t| t.entries().into_iter().map(|e| e.0))
            .collect()
    }
}

#[derive(Debug)]
pub struct Plan {
    pub shards: Vec<Shard>,
    /// Bytes of source tensors read (scale_inv tensors included).
    pub source_bytes: u64,
}

impl Plan {
    pub fn out_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes).sum()
    }

    pub fn n_tensors(&self) -> usize {
        self.shards.iter().map(|s| s.tensors.len()).sum()
    }

    pub fn count(&self, g: Group) -> usize {
        self.shards
            .iter()
            .filter(|s| group_of_file(&s.name) == g)
            .count()
    }
}

fn group_of_file(name: &str) -> Group {
    if name.starts_with(Group::Mtp.prefix()) {
        Group::Mtp
    } else if name.starts_with(Group::Indexer.prefix()) {
        Group::Indexer
    } else {
        Group::Main
    }
}

/// `model.layers.{L}.` -> L.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// `...mlp.experts.{E}.{proj}...` -> (E, rank of proj: gate 0, up 1, down 2, other 3).
pub(crate) fn expert_of(name: &str) -> Option<(usize, u8)> {
    let rest = &name[name.find(".mlp.experts.")? + ".mlp.experts.".len()..];
    let mut it = rest.split('.');
    let e = it.next()?.parse().ok()?;
    let rank = match it.next()? {
        "gate_proj" => 0,
        "up_proj" => 1,
        "down_proj" => 2,
        _ => 3,
    };
    Some((e, rank))
}

fn group_of(name: &str, n_layers: usize) -> Group {
    if layer_of(name).is_some_and(|l| l >= n_layers) {
        Group::Mtp
    } else if name.contains(".indexer.") {
        Group::Indexer
    } else {
        Group::Main
    }
}

fn is_io(name: &str) -> bool {
    name.contains("embed_tokens.")
        || name.starts_with("lm_head.")
        // DeepSeek-V4's output head as transformers saves it.
        || name == "head.weight"
        || name.contains("shared_head.head.")
}

/// The target format of a 2-D float source tensor.
fn matrix_format(name: &str, group: Group, f: &Formats) -> QFormat {
    // The router (gpt-oss's is `mlp.router`) stays f32, as the loader keeps it.
    if name.ends_with("mlp.gate.weight")
        || name.ends_with("mlp.router.weight")
        || name.contains("weights_proj")
        || name.ends_with("shared_expert_gate.weight")
        // DeepSeek-V4: its router (and the hash layers' token-id table), hyper-connections and
        // compressors' position biases, read as f32 (`model/dsv4_*.rs`).
        || name.ends_with("ffn.gate.weight")
        || name.ends_with(".tid2eid")
        || name.contains(".hc_")
        || name.starts_with("hc_head")
        || name.ends_with(".ape")
    {
        QFormat::F32
    } else if is_io(name) {
        f.io
    } else if group == Group::Mtp {
        f.mtp
    } else if name.contains(".mlp.experts.") {
        f.expert
    } else {
        f.dense
    }
}

/// The order tensors are written in: the embedding, then layer by layer (a layer's routed
/// experts in expert order, gate-up-down), then everything else, ties by name.
fn order_key(name: &str) -> (u8, usize, usize, u8, &str) {
    let top = if name.contains("embed_tokens.") && layer_of(name).is_none() {
        0
    } else if layer_of(name).is_some() {
        1
    } else {
        2
    };
    let (e, rank) = expert_of(name).map_or((0, 0), |(e, r)| (e + 1, r));
    (top, layer_of(name).unwrap_or(0), e, rank, name)
}

/// Plans the conversion of every tensor of `src`.
pub fn plan(
    src: &ShardSet,
    n_layers: usize,
    formats: &Formats,
    shard_size: u64,
) -> Result<Plan, EngineError> {
    let mut source_bytes = 0u64;
    let mut outs: Vec<(Group, OutTensor)> = Vec::new();
    for name in src.names() {
        let whole = src
            .get(name)
            .expect("names() lists the set's own tensors")
            .clone();
        source_bytes += whole.len;
        if let Some(base) = name.strip_suffix("_scale_inv") {
            if src.get(base).is_some_and(|b| b.dtype == Dtype::F8E4M3) {
                continue; // read with its weight
            }
        }
        // gpt-oss's fused experts: one output per expert and projection, each from its slab.
        let parts = match super::gpt_oss::split(&whole, src) {
            Some(split) => split?,
            None => vec![(whole, None)],
        };
        for (info, pick) in parts {
            let out = plan_one(info, pick, n_layers, formats, src)?;
            outs.push(out);
        }
    }
    plan_shards(outs, source_bytes, shard_size)
}

/// The output of one source tensor (or of one expert's slab of a fused one, `pick`).
fn plan_one(
    info: TensorInfo,
    pick: Option<super::gpt_oss::Pick>,
    n_layers: usize,
    formats: &Formats,
    src: &ShardSet,
) -> Result<(Group, OutTensor), EngineError> {
    {
        let name = &info.name.clone();
        let group = group_of(name, n_layers);
        let elems: usize = info.shape.iter().product();
        let out = match (info.dtype, info.shape.as_slice()) {
            (dt, _) if dt.is_packed() => OutTensor {
                encode: Encode::Copy,
                rows: 1,
                // gpt-oss's MXFP4 rows picked out of a slab are fewer bytes than it.
                cols: pick.map_or(info.len, |p| p.out_len(1)) as usize,
                data_len: pick.map_or(info.len, |p| p.out_len(1)),
                scales: 0,
                source: info,
                pick: None,
            },
            (dt, &[rows, cols]) => {
                if dt == Dtype::F8E4M3 {
                    src.fp8_scale_info(name)?; // the scales' shape and dtype, from the header
                }
                let fmt = matrix_format(name, group, formats).canonical(cols);
                let (data_len, scales) = if fmt == QFormat::F32 {
                    ((elems * 4) as u64, 0)
                } else {
                    (fmt.data_len(rows, cols) as u64, fmt.scales_len(rows, cols))
                };
                if fmt != QFormat::F32
                    && QFormat::infer(rows, cols, data_len as usize, scales) != Some(fmt)
                {
                    let read_as = QFormat::infer(rows, cols, data_len as usize, scales)
                        .map_or("nothing".into(), |f| f.to_string());
                    return Err(EngineError::Usage(format!(
                        "tensor {name} [{rows}, {cols}] in {fmt} has the byte counts of {read_as}, \
                         which is how a loader would read it (the container stores no format); \
                         pick other bits for it"
                    )));
                }
                OutTensor {
                    encode: if fmt == QFormat::F32 {
                        Encode::F32
                    } else {
                        Encode::Quant(fmt)
                    },
                    rows,
                    cols,
                    data_len,
                    scales,
                    source: info,
                    pick: None,
                }
            }
            (Dtype::F8E4M3, shape) => {
                return Err(EngineError::Load(format!(
                    "FP8 tensor {name} has shape {shape:?}: only 2-D FP8 matrices (with \
                     128x128 block scales) can be read"
                )))
            }
            _ => OutTensor {
                encode: Encode::F32,
                rows: 1,
                cols: elems,
                data_len: (elems * 4) as u64,
                scales: 0,
                source: info,
                pick: None,
            },
        };
        Ok((group, OutTensor { pick, ..out }))
    }
}

/// Sorts the outputs and cuts them into shards.
fn plan_shards(
    mut outs: Vec<(Group, OutTensor)>,
    source_bytes: u64,
    shard_size: u64,
) -> Result<Plan, EngineError> {
    outs.sort_by(|(ga, a), (gb, b)| {
        (ga, order_key(&a.source.name)).cmp(&(gb, order_key(&b.source.name)))
    });

    // Units that must share a shard: a routed expert's projections; anything else alone.
    let unit_of = |t: &OutTensor| {
        let n = &t.source.name;
        expert_of(n).map(|(e, _)| (layer_of(n), e))
    };
    let mut shards: Vec<Shard> = Vec::new();
    let mut i = 0;
    let mut current: Option<(Group, usize, Vec<OutTensor>, u64)> = None;
    while i < outs.len() {
        let group = outs[i].0;
        let unit = unit_of(&outs[i].1);
        let mut j = i + 1;
        while j < outs.len() && outs[j].0 == group && unit.is_some() && unit_of(&outs[j].1) == unit
        {
            j += 1;
        }
        let unit_bytes: u64 = outs[i..j].iter().map(|(_, t)| t.out_bytes()).sum();
        let start_new = match &current {
            None => true,
            Some((g, _, ts, b)) => *g != group || (!ts.is_empty() && b + unit_bytes > shard_size),
        };
        if start_new {
            let index = match &current {
                Some((g, n, _, _)) if *g == group => n + 1,
                _ => 0,
            };
            if let Some((g, n, ts, _)) = current.take() {
                shards.push(finish(g, n, ts)?);
            }
            current = Some((group, index, Vec::new(), 0));
        }
        let cur = current.as_mut().expect("set just above");
        cur.2.extend(outs[i..j].iter().map(|(_, t)| t.clone()));
        cur.3 += unit_bytes;
        i = j;
    }
    if let Some((g, n, ts, _)) = current {
        shards.push(finish(g, n, ts)?);
    }
    Ok(Plan {
        shards,
        source_bytes,
    })
}

fn finish(group: Group, index: usize, tensors: Vec<OutTensor>) -> Result<Shard, EngineError> {
    let entries: Vec<_> = tensors.iter().flat_map(|t| t.entries()).collect();
    let header_entries: Vec<HeaderEntry> = entries
        .iter()
        .map(|(name, dtype, shape, len)| HeaderEntry {
            name,
            dtype: *dtype,
            shape,
            len: *len,
        })
        .collect();
    let header = header_bytes(&header_entries)
        .map_err(|e| EngineError::io("building a safetensors header", e))?;
    let data: u64 = tensors.iter().map(|t| t.out_bytes()).sum();
    Ok(Shard {
        name: format!("{}{index:05}.safetensors", group.prefix()),
        bytes: header.len() as u64 + data,
        header,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(layer_of("model.layers.12.mlp.gate.weight"), Some(12));
        assert_eq!(layer_of("model.norm.weight"), None);
        assert_eq!(
            expert_of("model.layers.3.mlp.experts.17.down_proj.weight"),
            Some((17, 2))
        );
        assert_eq!(
            expert_of("model.layers.3.mlp.shared_experts.down_proj.weight"),
            None
        );
        assert_eq!(group_of("model.layers.78.eh_proj.weight", 78), Group::Mtp);
        assert_eq!(
            group_of("model.layers.2.self_attn.indexer.wk.weight", 78),
            Group::Indexer
        );
        assert_eq!(group_of("lm_head.weight", 78), Group::Main);
    }

    #[test]
    fn formats_follow_the_loader() {
        let f = Formats {
            expert: QFormat::I4G64,
            dense: QFormat::I3G64,
            io: QFormat::I8Row,
            mtp: QFormat::I8Row,
        };
        let m = |n: &str| matrix_format(n, group_of(n, 3), &f);
        assert_eq!(
            m("model.layers.0.mlp.experts.1.up_proj.weight"),
            QFormat::I4G64
        );
        assert_eq!(m("model.layers.0.mlp.gate.weight"), QFormat::F32);
        assert_eq!(
            m("model.layers.0.self_attn.indexer.weights_proj.weight"),
            QFormat::F32
        );
        assert_eq!(
            m("model.layers.0.self_attn.indexer.wk.weight"),
            QFormat::I3G64
        );
        assert_eq!(m("model.embed_tokens.weight"), QFormat::I8Row);
        assert_eq!(m("lm_head.weight"), QFormat::I8Row);
        assert_eq!(
            m("model.layers.3.mlp.experts.1.up_proj.weight"),
            QFormat::I8Row
        );
        assert_eq!(m("model.layers.3.eh_proj.weight"), QFormat::I8Row);
        assert_eq!(m("model.layers.1.self_attn.o_proj.weight"), QFormat::I3G64);
    }
}
