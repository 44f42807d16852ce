//! DeepSeek-V4 as deepseek-ai publishes it (DeepSeek-V4-Flash: 48 shards, names of DeepSeek's
//! own `inference/model.py`), read under the names the engine loads (transformers' as its
//! `save_pretrained` writes them, which the tiny oracle fixtures have), with no conversion.
//!
//! * Names. A set holding the top-level `hc_head_fn` is published V4: `embed.weight`,
//!   `norm.weight`, `hc_head_{fn,base,scale}` and `layers.{l}.*` are read as
//!   `model.embed_tokens.weight`, `model.norm.weight`, `model.hc_head.hc_{fn,base,scale}`
//!   and `model.layers.{l}.*` (`head.weight` and every name under a layer are the same in both;
//!   the routed experts' `ffn.experts.{e}.w1/w3/w2` were already read as `mlp.experts.{e}.
//!   gate_proj/up_proj/down_proj` by `names::canonical`). The MTP layers (`mtp.*`) keep their
//!   names and are not read, as transformers leaves them.
//! * Scales. A quantized matrix `P.weight` has its scales in `P.scale`, `F8_E8M0` (one power
//!   of two a byte), where transformers' FP8 loader renames them `P.weight_scale_inv`
//!   (`quantizer_finegrained_fp8.py`):
//!   - beside an `F8_E4M3` weight (attention, shared experts), one per 128x128 block: read
//!     as `P.weight_scale_inv`, the FP8 path DeepSeek-V3's checkpoints take (`fp8.rs`),
//!     dequantized exactly at load;
//!   - beside an `I8` weight (routed experts, `expert_dtype: fp4`): two e2m1 values a byte,
//!     the even element in the low nibble (transformers' `_unpack_fp4`), one scale per 32
//!     inputs of a row: MXFP4's arithmetic exactly. The weight is read as `U8` and the scales
//!     as its `P.weight.qs` `U8`, the layout gpt-oss's MXFP4 experts take once `convert`
//!     splits them, so the expert store computes them as stored (`quant/mxfp4.rs`), nothing
//!     dequantized, and `convert` copies their bytes as they are.
//!
//! Refused here, naming the tensor, its dtype and shape, and what was expected: a `.scale`
//! beside a weight of another dtype, an FP4 scale grid that is not `[rows, 2 * bytes / 32]`, an
//! I8 weight with no scales at all.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Dtype, TensorInfo, WeightsError};

/// The top-level name only the published V4 layout has.
const SIGNATURE: &str = "hc_head_fn";

/// Renames `tensors` (the set's index, names as stored) to the engine's names, as the module
/// note says; `path(file)` is shard `file`'s path, for the messages.
pub(super) fn adopt<'a>(
    tensors: &mut BTreeMap<String, TensorInfo>,
    path: impl Fn(usize) -> &'a Path,
) -> Result<(), WeightsError> {
    let err = |t: &TensorInfo, reason: String| WeightsError::Refused {
        file: path(t.file).to_path_buf(),
        tensor: t.name.clone(),
        reason,
    };
    if tensors.contains_key(SIGNATURE) {
        let renames: Vec<(String, String)> = tensors
            .keys()
            .filter_map(|n| published_name(n).map(|to| (n.clone(), to)))
            .collect();
        for (from, to) in renames {
            let mut t = tensors.remove(&from).expect("listed from the map");
            if let Some(prev) = tensors.get(&to) {
                return Err(WeightsError::Duplicate {
                    name: format!("{to} (stored as {from})"),
                    first: path(prev.file).to_path_buf(),
                    second: path(t.file).to_path_buf(),
                });
            }
            t.name = to.clone();
            tensors.insert(to, t);
        }
    }
    // The `.scale` companions, by the dtype of the weight they scale.
    let scales: Vec<String> = tensors
        .keys()
        .filter(|n| n.ends_with(".scale"))
        .cloned()
        .collect();
    for scale_name in scales {
        let base = scale_name.trim_end_matches(".scale");
        let weight_name = format!("{base}.weight");
        let s = &tensors[&scale_name];
        let Some(w) = tensors.get(&weight_name) else {
            if s.dtype == Dtype::F8E8M0 {
                return Err(err(
                    s,
                    format!(
                        "F8_E8M0 scales {:?} with no weight {weight_name} to scale",
                        s.shape
                    ),
                ));
            }
            continue; // some other family's `.scale` parameter
        };
        let (to, dtype) = match (w.dtype, s.dtype) {
            (Dtype::F8E4M3, Dtype::F8E8M0) => (super::fp8_scale_name(&weight_name), s.dtype),
            (Dtype::I8, Dtype::F8E8M0) => {
                check_fp4(w, s).map_err(|reason| err(s, reason))?;
                (format!("{weight_name}.qs"), Dtype::U8)
            }
            (Dtype::I8, dt) => {
                return Err(err(
                    s,
                    format!(
                        "dtype {dt:?} beside the I8 (FP4) weight {weight_name}: FP4 weights are \
                         scaled by F8_E8M0, one per 32 inputs"
                    ),
                ))
            }
            (wd, Dtype::F8E8M0) => {
                return Err(err(
                    s,
                    format!(
                        "F8_E8M0 scales beside {weight_name}, which is {wd:?}: they scale \
                         F8_E4M3 weights (128x128 blocks) or I8 FP4 ones (32 inputs)"
                    ),
                ))
            }
            _ => continue,
        };
        if let Some(prev) = tensors.get(&to) {
            return Err(WeightsError::Duplicate {
                name: format!("{to} (stored as {scale_name})"),
                first: path(prev.file).to_path_buf(),
                second: path(s.file).to_path_buf(),
            });
        }
        let mut s = tensors.remove(&scale_name).expect("listed from the map");
        s.name = to.clone();
        s.dtype = dtype;
        tensors.insert(to.clone(), s);
        if dtype == Dtype::U8 {
            // The nibbles read as bytes: the MXFP4 container's blob.
            if let Some(w) = tensors.get_mut(&weight_name) {
                w.dtype = Dtype::U8;
            }
        }
    }
    // An I8 weight left without scales is FP4 that cannot be read (the engine's own containers
    // write `.qs` beside every packed blob).
    for (name, t) in tensors.iter() {
        if t.dtype == Dtype::I8
            && name.ends_with(".weight")
            && !tensors.contains_key(&format!("{name}.qs"))
        {
            let base = name.trim_end_matches(".weight");
            return Err(err(
                t,
                format!(
                    "I8 {:?} (FP4, two e2m1 values a byte) without its scales: neither \
                     {base}.scale (F8_E8M0, one per 32 inputs) nor {name}.qs is in the set",
                    t.shape
                ),
            ));
        }
    }
    Ok(())
}

/// The engine's name of published name `n`, if it differs.
fn published_name(n: &str) -> Option<String> {
    match n {
        "embed.weight" => return Some("model.embed_tokens.weight".into()),
        "norm.weight" => return Some("model.norm.weight".into()),
        _ => {}
    }
    if let Some(part) = n.strip_prefix("hc_head_") {
        return Some(format!("model.hc_head.hc_{part}"));
    }
    let rest = n.strip_prefix("layers.")?;
    let (l, _) = rest.split_once('.')?;
    l.parse::<u32>().ok()?;
    Some(format!("model.{n}"))
}

/// An I8 FP4 weight `[rows, bytes]` needs F8_E8M0 scales `[rows, 2 * bytes / 32]`.
fn check_fp4(w: &TensorInfo, s: &TensorInfo) -> Result<(), String> {
    let &[rows, bytes] = w.shape.as_slice() else {
        return Err(format!(
            "scales of {}, which has shape {:?}: FP4 weights are [rows, inputs / 2]",
            w.name, w.shape
        ));
    };
    let cols = 2 * bytes;
    if cols % 32 != 0 || s.shape != [rows, cols / 32] {
        return Err(format!(
            "F8_E8M0 {:?}, but the I8 FP4 weight {} {:?} ({rows} rows of {cols} inputs) needs \
             [{rows}, {}]: one scale per 32 inputs, the inputs a multiple of 32",
            s.shape,
            w.name,
            w.shape,
            cols.div_ceil(32)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dtype: Dtype, shape: &[usize]) -> (String, TensorInfo) {
        let len = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
        let info = TensorInfo {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            file: 0,
            offset: 0,
            len,
        };
        (name.into(), info)
    }

    fn adopt_all(list: Vec<(String, TensorInfo)>) -> Result<BTreeMap<String, TensorInfo>, String> {
        let mut m: BTreeMap<_, _> = list.into_iter().collect();
        adopt(&mut m, |_| Path::new("shard.safetensors"))
            .map(|()| m)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn e8m0_bytes_read_as_their_powers_of_two() {
        let dt = Dtype::from_safetensors("F8_E8M0").unwrap();
        assert_eq!(
            (dt, dt.size(), dt.safetensors_name()),
            (Dtype::F8E8M0, 1, "F8_E8M0")
        );
        let v = dt.to_f32(&[127, 128, 120, 0, 254, 255]).unwrap();
        assert_eq!(
            v[..5],
            [1.0, 2.0, 2f32.powi(-7), 2f32.powi(-127), 2f32.powi(127)]
        );
        assert!(v[5].is_nan());
        assert_eq!(dt.non_finite(&[127, 255, 3, 255]), Some((2, 1)));
    }

    #[test]
    fn published_names_and_scales_read_as_the_engine_names_them() {
        let e = "model.layers.0.mlp.experts.3.gate_proj";
        let m = adopt_all(vec![
            t("hc_head_fn", Dtype::F32, &[2, 8]),
            t("hc_head_base", Dtype::F32, &[2]),
            t("embed.weight", Dtype::BF16, &[10, 4]),
            t("norm.weight", Dtype::BF16, &[4]),
            t("head.weight", Dtype::BF16, &[10, 4]),
            t("layers.0.attn.wq_a.weight", Dtype::F8E4M3, &[130, 64]),
            t("layers.0.attn.wq_a.scale", Dtype::F8E8M0, &[2, 1]),
            t(&format!("{e}.weight"), Dtype::I8, &[16, 32]),
            t(&format!("{e}.scale"), Dtype::F8E8M0, &[16, 2]),
            t("mtp.0.norm.weight", Dtype::BF16, &[4]),
        ])
        .unwrap();
        let names: Vec<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "head.weight",
                "model.embed_tokens.weight",
                "model.hc_head.hc_base",
                "model.hc_head.hc_fn",
                "model.layers.0.attn.wq_a.weight",
                "model.layers.0.attn.wq_a.weight_scale_inv",
                &format!("{e}.weight"),
                &format!("{e}.weight.qs"),
                "model.norm.weight",
                "mtp.0.norm.weight",
            ]
        );
        assert_eq!(
            m["model.layers.0.attn.wq_a.weight_scale_inv"].dtype,
            Dtype::F8E8M0
        );
        assert_eq!(m[&format!("{e}.weight")].dtype, Dtype::U8);
        assert_eq!(m[&format!("{e}.weight.qs")].dtype, Dtype::U8);
    }

    #[test]
    fn without_the_signature_only_the_scales_are_read_differently() {
        let m = adopt_all(vec![
            t("embed.weight", Dtype::BF16, &[10, 4]),
            t("layers.0.x.weight", Dtype::F32, &[4, 4]),
            t("layers.0.q_norm.scale", Dtype::F32, &[4]),
        ])
        .unwrap();
        assert!(m.contains_key("embed.weight") && m.contains_key("layers.0.x.weight"));
        assert!(m.contains_key("layers.0.q_norm.scale"));
    }

    #[test]
    fn bad_scales_are_refused_naming_the_tensor_its_dtype_and_shape() {
        let w = "model.layers.1.mlp.experts.0.down_proj";
        let e = adopt_all(vec![
            t(&format!("{w}.weight"), Dtype::I8, &[32, 8]),
            t(&format!("{w}.scale"), Dtype::F8E8M0, &[32, 2]),
        ])
        .unwrap_err();
        assert!(
            e.contains(&format!("{w}.scale")) && e.contains("[32, 2]") && e.contains("[32, 1]"),
            "{e}"
        );
        let e = adopt_all(vec![t(&format!("{w}.weight"), Dtype::I8, &[32, 8])]).unwrap_err();
        assert!(
            e.contains(&format!("{w}.weight")) && e.contains("I8") && e.contains(".scale"),
            "{e}"
        );
        let e = adopt_all(vec![
            t(&format!("{w}.weight"), Dtype::I8, &[32, 16]),
            t(&format!("{w}.scale"), Dtype::F32, &[32, 1]),
        ])
        .unwrap_err();
        assert!(
            e.contains(&format!("{w}.scale")) && e.contains("F32"),
            "{e}"
        );
        let e = adopt_all(vec![
            t("a.weight", Dtype::BF16, &[4, 4]),
            t("a.scale", Dtype::F8E8M0, &[1, 1]),
        ])
        .unwrap_err();
        assert!(e.contains("a.scale") && e.contains("BF16"), "{e}");
    }
}
