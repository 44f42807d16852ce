//! gpt-oss's published MXFP4 experts read in place (`--snap DIR` on the checkpoint as
//! published, no `convert`). A layer's experts are fused in six tensors:
//!
//! * `mlp.experts.gate_up_proj_blocks` `[E, 2 * inter, G, 16]` (u8: 32 e2m1 values a group,
//!   two a byte) and `..._scales` `[E, 2 * inter, G]` (u8: one e8m0 scale a group), rows in
//!   the `[out, in]` orientation, gate's and up's rows interleaved (even: gate, odd: up);
//! * `mlp.experts.down_proj_blocks` `[E, hidden, G', 16]` and `..._scales` `[E, hidden, G']`;
//! * `mlp.experts.gate_up_proj_bias` `[E, 2 * inter]` (interleaved too) and
//!   `mlp.experts.down_proj_bias` `[E, hidden]`.
//!
//! Expert `e`'s bytes of each are one contiguous slab, so each becomes a view (a
//! [`TensorInfo`] over that slab) under a per-expert name the expert store plans reads from:
//! `mlp.experts.{e}.gate_up_proj.weight` (+ `.qs`, `.bias`) and
//! `mlp.experts.{e}.down_proj.weight` (+ `.qs`, `.bias`). Gate and up stay interleaved in the
//! view; the store splits the rows when it decodes the expert (whole rows of blocks and
//! scales: a copy, no requantization).

use super::{Dtype, TensorInfo};

const FUSED: [(&str, &str); 2] = [("gate_up_proj", "gate_up"), ("down_proj", "down")];

/// The views of every layer whose fused MXFP4 experts are consistent; a layer whose tensors
/// do not fit together gets none (the model's load refuses it through [`check_layer`], by
/// name, before any weight is read).
pub fn views<'a>(get: impl Fn(&str) -> Option<&'a TensorInfo>, names: &[&str]) -> Vec<TensorInfo> {
    let mut out = Vec::new();
    for name in names {
        let Some(prefix) = name.strip_suffix(".mlp.experts.gate_up_proj_blocks") else {
            continue;
        };
        if let Ok(v) = check_layer(&get, prefix) {
            out.extend(v);
        }
    }
    out
}

/// The views of layer `prefix` (`model.layers.N`), or why its fused MXFP4 experts cannot be
/// read: the tensor, its shape and what it must be.
pub fn check_layer<'a>(
    get: &impl Fn(&str) -> Option<&'a TensorInfo>,
    prefix: &str,
) -> Result<Vec<TensorInfo>, String> {
    let p = format!("{prefix}.mlp.experts");
    let need = |name: String| get(&name).ok_or(name);
    let mut out = Vec::new();
    let mut experts = None;
    for (fused, what) in FUSED {
        let blocks_name = format!("{p}.{fused}_blocks");
        let blocks = need(blocks_name.clone())
            .map_err(|n| format!("tensor {n} is missing: gpt-oss's MXFP4 experts need it"))?;
        let scales_name = format!("{p}.{fused}_scales");
        let scales = need(scales_name.clone()).map_err(|n| {
            format!("tensor {blocks_name} holds MXFP4 blocks but {n}, their scales, is missing")
        })?;
        let &[e, rows, groups, 16] = blocks.shape.as_slice() else {
            return Err(format!(
                "tensor {blocks_name} has shape {:?}: MXFP4 blocks are [experts, rows, groups, \
                 16] (32 values a group, two a byte)",
                blocks.shape
            ));
        };
        if blocks.dtype != Dtype::U8
            || scales.dtype != Dtype::U8
            || scales.shape != [e, rows, groups]
        {
            return Err(format!(
                "tensor {scales_name} is {:?} {:?}, but its blocks {blocks_name} ({:?} {:?}) \
                 need u8 scales of [{e}, {rows}, {groups}]: one e8m0 scale per 32 values",
                scales.dtype, scales.shape, blocks.dtype, blocks.shape
            ));
        }
        if *experts.get_or_insert(e) != e {
            return Err(format!(
                "tensor {blocks_name} has {e} experts, the layer's gate_up_proj_blocks {}",
                experts.unwrap_or(0)
            ));
        }
        if what == "gate_up" && rows % 2 != 0 {
            return Err(format!(
                "tensor {blocks_name} has {rows} rows: gate_up interleaves gate and up, so they \
                 must be even"
            ));
        }
        let bias_name = format!("{p}.{fused}_bias");
        let bias = need(bias_name.clone())
            .map_err(|n| format!("tensor {n} is missing: gpt-oss's experts are biased"))?;
        if bias.shape != [e, rows] || !matches!(bias.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(format!(
                "tensor {bias_name} is {:?} {:?}, expected an f32/bf16/f16 [{e}, {rows}] (one \
                 value per row of {blocks_name})",
                bias.dtype, bias.shape
            ));
        }
        let per = |t: &TensorInfo, ex: usize, name: String, elems: usize| TensorInfo {
            name,
            dtype: t.dtype,
            shape: vec![elems],
            file: t.file,
            offset: t.offset + (ex * elems * t.dtype.size()) as u64,
            len: (elems * t.dtype.size()) as u64,
        };
        for ex in 0..e {
            let w = format!("{p}.{ex}.{fused}.weight");
            out.push(per(blocks, ex, w.clone(), rows * groups * 16));
            out.push(per(scales, ex, format!("{w}.qs"), rows * groups));
            out.push(per(bias, ex, format!("{p}.{ex}.{fused}.bias"), rows));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn t(name: &str, dtype: Dtype, shape: &[usize], offset: u64) -> (String, TensorInfo) {
        let len = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
        let info = TensorInfo {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            file: 0,
            offset,
            len,
        };
        (name.into(), info)
    }

    fn layer(scales_shape: &[usize]) -> BTreeMap<String, TensorInfo> {
        let p = "model.layers.1.mlp.experts";
        [
            t(
                &format!("{p}.gate_up_proj_blocks"),
                Dtype::U8,
                &[2, 4, 2, 16],
                1000,
            ),
            t(
                &format!("{p}.gate_up_proj_scales"),
                Dtype::U8,
                scales_shape,
                2000,
            ),
            t(
                &format!("{p}.gate_up_proj_bias"),
                Dtype::BF16,
                &[2, 4],
                3000,
            ),
            t(
                &format!("{p}.down_proj_blocks"),
                Dtype::U8,
                &[2, 3, 1, 16],
                4000,
            ),
            t(
                &format!("{p}.down_proj_scales"),
                Dtype::U8,
                &[2, 3, 1],
                5000,
            ),
            t(&format!("{p}.down_proj_bias"), Dtype::F32, &[2, 3], 6000),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn each_expert_is_a_view_of_its_own_slab() {
        let m = layer(&[2, 4, 2]);
        let names: Vec<&str> = m.keys().map(String::as_str).collect();
        let v = views(|n| m.get(n), &names);
        assert_eq!(v.len(), 2 * 2 * 3);
        let find = |n: &str| v.iter().find(|x| x.name == n).unwrap();
        let p = "model.layers.1.mlp.experts.1";
        // Expert 1's gate_up: 4 rows of 2 groups of 16 bytes, after expert 0's 128.
        let w = find(&format!("{p}.gate_up_proj.weight"));
        assert_eq!((w.offset, w.len, w.dtype), (1000 + 128, 128, Dtype::U8));
        let qs = find(&format!("{p}.gate_up_proj.weight.qs"));
        assert_eq!((qs.offset, qs.len), (2000 + 8, 8));
        let b = find(&format!("{p}.gate_up_proj.bias"));
        assert_eq!(
            (b.offset, b.len, b.dtype, &b.shape),
            (3000 + 8, 8, Dtype::BF16, &vec![4])
        );
        let d = find(&format!("{p}.down_proj.bias"));
        assert_eq!((d.offset, d.len), (6000 + 12, 12));
    }

    #[test]
    fn scales_that_do_not_match_their_blocks_are_named() {
        let m = layer(&[2, 2, 4]);
        let names: Vec<&str> = m.keys().map(String::as_str).collect();
        assert!(views(|n| m.get(n), &names).is_empty());
        let e = check_layer(&|n: &str| m.get(n), "model.layers.1").unwrap_err();
        assert!(
            e.contains("model.layers.1.mlp.experts.gate_up_proj_scales")
                && e.contains("[2, 2, 4]")
                && e.contains("[2, 4, 2]")
                && e.contains("gate_up_proj_blocks"),
            "{e}"
        );
    }
}
