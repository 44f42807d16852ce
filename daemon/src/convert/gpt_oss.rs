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
use crate::weights::{Dtype, TensorInfo};

/// Which values of an expert's slab an output tensor takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickKind {
    /// Gate (`odd` false) or up (`odd` true) of a `[hidden, 2 * inter]` slab, transposed.
    GateUp { odd: bool },
    /// Down of an `[inter, hidden]` slab, transposed.
    Down,
    /// Every other value of a `[2 * inter]` bias (even: gate, odd: up).
    GateUpBias { odd: bool },
}

/// How an output tensor's bytes come out of its source slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub kind: PickKind,
    /// The slab's `[rows, cols]` (`[1, len]` for a bias).
    pub slab: (usize, usize),
}

/// The per-expert tensors one fused source tensor becomes, each with its [`Pick`] (`None` for
/// `down_proj_bias`, whose rows are already the output); `None` for any other tensor. The
/// `TensorInfo` of each is its expert's slab in the source file, under the output's name and
/// shape.
#[allow(clippy::type_complexity)]
pub fn split(info: &TensorInfo) -> Option<Result<Vec<(TensorInfo, Option<Pick>)>, EngineError>> {
    let (prefix, fused) = info.name.rsplit_once(".mlp.experts.")?;
    if !prefix.starts_with("model.layers.") {
        return None;
    }
    let kind = match fused {
        "gate_up_proj" | "gate_up_proj_bias" | "down_proj" | "down_proj_bias" => fused,
        _ => return None,
    };
    Some(split_known(info, prefix, kind))
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
    }

    #[test]
    fn each_expert_reads_its_own_slab_under_the_engines_names() {
        let t = info("model.layers.3.mlp.experts.gate_up_proj", vec![2, 4, 6]);
        let v = split(&t).unwrap().unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[2].0.name, "model.layers.3.mlp.experts.1.gate_proj.weight");
        assert_eq!(v[3].0.name, "model.layers.3.mlp.experts.1.up_proj.weight");
        assert_eq!(v[3].0.shape, vec![3, 4]);
        assert_eq!((v[3].0.offset, v[3].0.len), (100 + 96, 96));
        let t = info("model.layers.3.mlp.experts.down_proj_bias", vec![2, 4]);
        let v = split(&t).unwrap().unwrap();
        assert_eq!(v[1].0.name, "model.layers.3.mlp.experts.1.down_proj.bias");
        assert!(v[1].1.is_none());
        assert!(split(&info("model.layers.3.mlp.router.weight", vec![2, 4])).is_none());
        let e = split(&info(
            "model.layers.3.mlp.experts.gate_up_proj",
            vec![2, 4, 5],
        ))
        .unwrap()
        .unwrap_err()
        .to_string();
        assert!(e.contains("gate_up_proj") && e.contains("[2, 4, 5]"), "{e}");
    }
}
