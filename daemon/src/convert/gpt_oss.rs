//! gpt-oss's published expert tensors, split per expert as the engine's expert store reads
//! them. A layer's experts are fused in four tensors:
//!
//! * `mlp.experts.gate_up_proj` `[E, hidden, 2 * inter]`: expert `e`'s input-major matrix
//!   whose even output columns are the gate's and odd ones the up projection's;
//! * `mlp.experts.gate_up_proj_bias` `[E, 2 * inter]`, interleaved the same way;
//! * `mlp.experts.down_proj` `[E, inter, hidden]` (input-major too) and
//!   `mlp.experts.down_proj_bias` `[E, hidden]`.
//!
//! Each becomes, per expert, `mlp.experts.{e}.{gate,up,down}_proj.{weight,bias}` in the
//! `[out, in]` orientation of every other matrix: one output tensor reads its expert's slab
//! (contiguous in the fused tensor) and [`gather`]s its values out of it, element by element
//! in the source dtype, so the split is exact and quantizing it is the loader's quantizer on
//! the same floats.

use crate::error::EngineError;
use crate::weights::{Dtype, ShardSet, TensorInfo};

/// Which values of an expert's slab an output tensor takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickKind {
    /// Gate (`odd` false) or up (`odd` true) of a `[hidden, 2 * inter]` slab, transposed.
    GateUp { odd: bool },
    /// Down of an `[inter, hidden]` slab, transposed.
    Down,
    /// Every other value of a `[2 * inter]` bias (even: gate, odd: up).
    GateUpBias { odd: bool },
    /// Every other row of an MXFP4 slab (`[2 * inter]` rows of bytes: a row's blocks or its
    /// scales), whole rows of bytes kept as they are (even: gate, odd: up).
    Rows { odd: bool },
}

/// How an output tensor's bytes come out of its source slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub kind: PickKind,
    /// The slab's `[rows, cols]` (`[1, len]` for a bias).
    pub slab: (usize, usize),
}

impl Pick {
    /// Bytes of the output, `elem` bytes an element.
    pub fn out_len(&self, elem: usize) -> u64 {
        let (rows, cols) = self.pick_shape();
        (rows * cols * elem) as u64
    }

    /// `[rows, cols]` of the output in elements.
    fn pick_shape(&self) -> (usize, usize) {
        let (rows, cols) = self.slab;
        match self.kind {
            PickKind::GateUp { .. } => (cols / 2, rows),
            PickKind::Down => (cols, rows),
            PickKind::GateUpBias { .. } => (1, cols / 2),
            PickKind::Rows { .. } => (rows / 2, cols),
        }
    }
}

/// The per-expert tensors one fused source tensor becomes, each with its [`Pick`] (`None` for
/// `down_proj_bias`, whose rows are already the output); `None` for any other tensor. The
/// `TensorInfo` of each is its expert's slab in the source file, under the output's name and
/// shape.
#[allow(clippy::type_complexity)]
pub fn split(
    info: &TensorInfo,
    src: &ShardSet,
) -> Option<Result<Vec<(TensorInfo, Option<Pick>)>, EngineError>> {
    let (prefix, fused) = info.name.rsplit_once(".mlp.experts.")?;
    if !prefix.starts_with("model.layers.") {
        return None;
    }
    match fused {
        "gate_up_proj" | "gate_up_proj_bias" | "down_proj" | "down_proj_bias" => {
            Some(split_known(info, prefix, fused))
        }
        "gate_up_proj_blocks" | "down_proj_blocks" => Some(split_mxfp4(info, src, prefix, fused)),
        // Read with their blocks; alone they are refused.
        "gate_up_proj_scales" | "down_proj_scales" => {
            let blocks = format!("{}_blocks", &info.name[..info.name.len() - "_scales".len()]);
            Some(if src.contains(&blocks) {
                Ok(Vec::new())
            } else {
                Err(EngineError::Usage(format!(
                    "tensor {} holds MXFP4 scales but {blocks}, their blocks, is missing",
                    info.name
                )))
            })
        }
        _ => None,
    }
}

/// gpt-oss's published MXFP4 experts, kept as they are: `{proj}_blocks` `[E, rows, G, 16]`
/// (u8: 32 e2m1 values a group, two a byte) and `{proj}_scales` `[E, rows, G]` (u8: e8m0),
/// rows in the `[out, in]` orientation already; `gate_up`'s rows interleave gate (even) and
/// up (odd). Each expert's projection becomes a u8 blob of its rows' blocks beside a u8
/// `.qs` of their scales (the engine's MXFP4 container: a u8 `.qs`, where its own formats'
/// are f32).
fn split_mxfp4(
    blocks: &TensorInfo,
    src: &ShardSet,
    prefix: &str,
    fused: &str,
) -> Result<Vec<(TensorInfo, Option<Pick>)>, EngineError> {
    let base = &blocks.name[..blocks.name.len() - "_blocks".len()];
    let scales_name = format!("{base}_scales");
    let scales = src.get(&scales_name).ok_or_else(|| {
        EngineError::Usage(format!(
            "tensor {} holds MXFP4 blocks but {scales_name}, their scales, is missing",
            blocks.name
        ))
    })?;
    let &[experts, rows, groups, 16] = blocks.shape.as_slice() else {
        return Err(EngineError::Usage(format!(
            "tensor {} has shape {:?}: MXFP4 blocks are [experts, rows, groups, 16] (32 values \
             a group, two a byte)",
            blocks.name, blocks.shape
        )));
    };
    if blocks.dtype != Dtype::U8
        || scales.dtype != Dtype::U8
        || scales.shape != [experts, rows, groups]
    {
        return Err(EngineError::Usage(format!(
            "tensor {scales_name} is {:?} {:?}, but its blocks {} ({:?} {:?}) need u8 scales of \
             [{experts}, {rows}, {groups}]: one e8m0 scale per 32 values",
            scales.dtype, scales.shape, blocks.name, blocks.dtype, blocks.shape
        )));
    }
    let gate_up = fused == "gate_up_proj_blocks";
    if gate_up && rows % 2 != 0 {
        return Err(EngineError::Usage(format!(
            "tensor {} has {rows} rows: gate_up interleaves gate and up, so they must be even",
            blocks.name
        )));
    }
    let row_bytes = groups * 16;
    let mut out = Vec::new();
    for e in 0..experts {
        let projs: &[(&str, Option<bool>)] = if gate_up {
            &[("gate_proj", Some(false)), ("up_proj", Some(true))]
        } else {
            &[("down_proj", None)]
        };
        for &(proj, odd) in projs {
            let name = format!("{prefix}.mlp.experts.{e}.{proj}.weight");
            let out_rows = if odd.is_some() { rows / 2 } else { rows };
            for (t, width, out_name) in [
                (blocks, row_bytes, name.clone()),
                (scales, groups, format!("{name}.qs")),
            ] {
                let len = (rows * width) as u64;
                let slab = TensorInfo {
                    name: out_name,
                    dtype: Dtype::U8,
                    shape: vec![out_rows * width],
                    file: t.file,
                    offset: t.offset + e as u64 * len,
                    len,
                };
                let pick = odd.map(|odd| Pick {
                    kind: PickKind::Rows { odd },
                    slab: (rows, width),
                });
                out.push((slab, pick));
            }
        }
    }
    Ok(out)
}

fn split_known(
    info: &TensorInfo,
    prefix: &str,
    kind: &str,
) -> Result<Vec<(TensorInfo, Option<Pick>)>, EngineError> {
    let bad = |why: &str| {
        EngineError::Usage(format!(
            "tensor {} has shape {:?}: {why}",
            info.name, info.shape
        ))
    };
    if !matches!(info.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return Err(EngineError::Usage(format!(
            "tensor {} has dtype {:?}: gpt-oss's fused experts are read from f32, bf16 or f16",
            info.name, info.dtype
        )));
    }
    let size = info.dtype.size() as u64;
    let name = |e: usize, proj: &str, what: &str| format!("{prefix}.mlp.experts.{e}.{proj}.{what}");
    let mut out = Vec::new();
    let mut slab = |e: usize, elems: usize, out_name: String, shape: Vec<usize>, pick| {
        let len = elems as u64 * size;
        out.push((
            TensorInfo {
                name: out_name,
                dtype: info.dtype,
                shape,
                file: info.file,
                offset: info.offset + e as u64 * len,
                len,
            },
            pick,
        ));
    };
    match (kind, info.shape.as_slice()) {
        ("gate_up_proj", &[experts, hidden, two_inter]) if two_inter % 2 == 0 => {
            let inter = two_inter / 2;
            for e in 0..experts {
                for (proj, odd) in [("gate_proj", false), ("up_proj", true)] {
                    let pick = Pick {
                        kind: PickKind::GateUp { odd },
                        slab: (hidden, two_inter),
                    };
                    slab(
                        e,
                        hidden * two_inter,
                        name(e, proj, "weight"),
                        vec![inter, hidden],
                        Some(pick),
                    );
                }
            }
        }
        ("gate_up_proj_bias", &[experts, two_inter]) if two_inter % 2 == 0 => {
            for e in 0..experts {
                for (proj, odd) in [("gate_proj", false), ("up_proj", true)] {
                    let pick = Pick {
                        kind: PickKind::GateUpBias { odd },
                        slab: (1, two_inter),
                    };
                    slab(
                        e,
                        two_inter,
                        name(e, proj, "bias"),
                        vec![two_inter / 2],
                        Some(pick),
                    );
                }
            }
        }
        ("down_proj", &[experts, inter, hidden]) => {
            for e in 0..experts {
                let pick = Pick {
                    kind: PickKind::Down,
                    slab: (inter, hidden),
                };
                slab(
                    e,
                    inter * hidden,
                    name(e, "down_proj", "weight"),
                    vec![hidden, inter],
                    Some(pick),
                );
            }
        }
        ("down_proj_bias", &[experts, hidden]) => {
            for e in 0..experts {
                slab(e, hidden, name(e, "down_proj", "bias"), vec![hidden], None);
            }
        }
        ("gate_up_proj", _) => {
            return Err(bad(
                "gpt-oss's gate_up_proj is [experts, hidden, 2 * intermediate] (an even last dimension)",
            ))
        }
        ("gate_up_proj_bias", _) => {
            return Err(bad(
                "gpt-oss's gate_up_proj_bias is [experts, 2 * intermediate] (an even last dimension)",
            ))
        }
        ("down_proj", _) => return Err(bad("gpt-oss's down_proj is [experts, intermediate, hidden]")),
        _ => return Err(bad("gpt-oss's down_proj_bias is [experts, hidden]")),
    }
    Ok(out)
}

/// The output tensor's bytes (row-major, the source dtype) out of its slab's `raw` bytes.
pub fn gather(pick: &Pick, raw: &[u8], elem: usize) -> Vec<u8> {
    let (rows, cols) = pick.slab;
    let mut out = Vec::with_capacity(raw.len());
    let mut put = |i: usize| out.extend_from_slice(&raw[i * elem..(i + 1) * elem]);
    match pick.kind {
        // Output row r (of inter), column c (of hidden): slab[c][2r + odd].
        PickKind::GateUp { odd } => {
            for r in 0..cols / 2 {
                for c in 0..rows {
                    put(c * cols + 2 * r + odd as usize);
                }
            }
        }
        // Output row r (of hidden), column c (of inter): slab[c][r].
        PickKind::Down => {
            for r in 0..cols {
                for c in 0..rows {
                    put(c * cols + r);
                }
            }
        }
        PickKind::GateUpBias { odd } => {
            for r in 0..cols / 2 {
                put(2 * r + odd as usize);
            }
        }
        PickKind::Rows { odd } => {
            for r in (odd as usize..rows).step_by(2) {
                out.extend_from_slice(&raw[r * cols * elem..(r + 1) * cols * elem]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, shape: Vec<usize>) -> TensorInfo {
        let len = shape.iter().product::<usize>() as u64 * 4;
        TensorInfo {
            name: name.into(),
            dtype: Dtype::F32,
            shape,
            file: 0,
            offset: 100,
            len,
        }
    }

    #[test]
    fn gate_and_up_are_the_even_and_odd_columns_transposed() {
        // One expert, hidden 2, inter 2: slab [2, 4] = [[0, 1, 2, 3], [4, 5, 6, 7]].
        let raw: Vec<u8> = (0..8u8).collect();
        let pick = |odd| Pick {
            kind: PickKind::GateUp { odd },
            slab: (2, 4),
        };
        // gate[r][c] = slab[c][2r]: [[0, 4], [2, 6]]; up: [[1, 5], [3, 7]].
        assert_eq!(gather(&pick(false), &raw, 1), vec![0, 4, 2, 6]);
        assert_eq!(gather(&pick(true), &raw, 1), vec![1, 5, 3, 7]);
        // down: slab [inter 2, hidden 3] = [[0, 1, 2], [3, 4, 5]] -> [[0, 3], [1, 4], [2, 5]].
        let down = Pick {
            kind: PickKind::Down,
            slab: (2, 3),
        };
        assert_eq!(
            gather(&down, &[0, 1, 2, 3, 4, 5], 1),
            vec![0, 3, 1, 4, 2, 5]
        );
        // Two-byte elements move whole.
        let bias = Pick {
            kind: PickKind::GateUpBias { odd: true },
            slab: (1, 4),
        };
        assert_eq!(
            gather(&bias, &[0, 1, 2, 3, 4, 5, 6, 7], 2),
            vec![2, 3, 6, 7]
        );
        // MXFP4 rows of 2 bytes: the odd rows whole.
        let rows = Pick {
            kind: PickKind::Rows { odd: true },
            slab: (4, 2),
        };
        assert_eq!(
            gather(&rows, &[0, 1, 2, 3, 4, 5, 6, 7], 1),
            vec![2, 3, 6, 7]
        );
        assert_eq!(rows.out_len(1), 4);
    }

    #[test]
    fn each_expert_reads_its_own_slab_under_the_engines_names() {
        let t = info("model.layers.3.mlp.experts.gate_up_proj", vec![2, 4, 6]);
        let v = split_known(
            &t,
            "model.layers.3",
            t.name.rsplit_once(".mlp.experts.").unwrap().1,
        )
        .unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[2].0.name, "model.layers.3.mlp.experts.1.gate_proj.weight");
        assert_eq!(v[3].0.name, "model.layers.3.mlp.experts.1.up_proj.weight");
        assert_eq!(v[3].0.shape, vec![3, 4]);
        assert_eq!((v[3].0.offset, v[3].0.len), (100 + 96, 96));
        let t = info("model.layers.3.mlp.experts.down_proj_bias", vec![2, 4]);
        let v = split_known(
            &t,
            "model.layers.3",
            t.name.rsplit_once(".mlp.experts.").unwrap().1,
        )
        .unwrap();
        assert_eq!(v[1].0.name, "model.layers.3.mlp.experts.1.down_proj.bias");
        assert!(v[1].1.is_none());
        let t = info("model.layers.3.mlp.experts.gate_up_proj", vec![2, 4, 5]);
        let e = split_known(&t, "model.layers.3", "gate_up_proj")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gate_up_proj") && e.contains("[2, 4, 5]"), "{e}");
    }
}
