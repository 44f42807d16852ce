//! What a load checks before an expert is built from its bytes: that every float in them
//! (f32/bf16/f16/FP8 weights, `.qs` and `_scale_inv` scales) is finite, and with
//! `--verify-reads` that each tensor's bytes hash to the checksum `colibri convert` recorded.
//!
//! A NaN scale would otherwise turn every product of its rows into NaN and the answer into
//! whatever the sampler makes of NaN logits, silently. A failed check is an error naming the
//! shard, the tensor, the layer and the expert; it takes the path a failed read takes (the
//! request ends with an error, the daemon stays up), and since no expert is built, nothing is
//! cached: once the file is repaired the next request reads it again.

use std::collections::HashMap;
use std::path::PathBuf;

use super::io::{Io, Loaded};
use super::layout::{tensor_name, ExpertLayout, Part, GATE_UP};
use crate::error::EngineError;
use crate::weights::checksums::{self, hex, Checksums};
use crate::weights::{fp8_scale_name, Dtype, ShardSet, WeightsError};

/// The checksum of every expert tensor, for `--verify-reads`.
pub struct ReadSums {
    sums: HashMap<String, u64>,
}

/// The name of the tensor `part` of expert `e` in `layer` holds.
pub fn part_name(layout: &ExpertLayout, layer: usize, e: usize, part: &Part) -> String {
    let p = part.proj as usize;
    if p == GATE_UP as usize {
        return tensor_name(layer, e, p, part.scales);
    }
    if p >= 3 {
        return tensor_name(layer, e, p, false);
    }
    match (part.scales, layout.dtypes[p]) {
        (true, Dtype::F8E4M3) => fp8_scale_name(&tensor_name(layer, e, p, false)),
        (scales, _) => tensor_name(layer, e, p, scales),
    }
}

/// The dtype of the values in `part`.
fn part_dtype(layout: &ExpertLayout, part: &Part) -> Dtype {
    let mut p = part.proj as usize;
    if p == GATE_UP as usize {
        p = 0; // gate's (and up's) dtypes
    } else if p >= 3 {
        return layout.bias_dtype;
    }
    match (part.scales, layout.dtypes[p]) {
        (false, dt) => dt,
        // F32 for our packed formats; U8 (e8m0) for gpt-oss's MXFP4.
        (true, dt) if dt.is_packed() => layout.scale_dtypes[p],
        (true, _) => layout.scale_dtypes[p],
    }
}

impl ReadSums {
    /// The checksums of the model in `shards`' directories, one for every part of every
    /// layout; refused (a usage error: the option cannot work here) when there are none or
    /// they miss an expert tensor.
    pub fn load(
        shards: &ShardSet,
        layouts: &[Option<Vec<ExpertLayout>>],
    ) -> Result<ReadSums, EngineError> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for i in 0..shards.num_files() {
            let d = shards
                .file_path(i)
                .parent()
                .map(PathBuf::from)
                .unwrap_or_default();
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        let all = Checksums::load(&dirs)?.ok_or_else(|| {
            EngineError::Usage(format!(
                "--verify-reads (COLI_VERIFY_READS): {} has no {}: the model was not made by \
                 colibri convert, or by an older one that wrote no checksums; run colibri \
                 convert again to get them, or leave --verify-reads off",
                shown.join(":"),
                checksums::FILE
            ))
        })?;
        let mut sums = HashMap::new();
        for (layer, l) in layouts.iter().enumerate() {
            for (e, layout) in l.iter().flatten().enumerate() {
                for part in layout.runs.iter().flat_map(|r| &r.parts) {
                    let name = part_name(layout, layer, e, part);
                    let Some(entry) = all.get(&name) else {
                        return Err(EngineError::Usage(format!(
                            "--verify-reads (COLI_VERIFY_READS): {} holds no checksum for \
                             tensor \"{name}\": it does not describe this model's shards \
                             (run colibri convert again to rewrite it)",
                            all.files
                                .iter()
                                .map(|f| f.display().to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )));
                    };
                    sums.insert(name, entry.xxh3);
                }
            }
        }
        crate::elog!(
            "[VERIFY] expert reads are checked against {} checksums ({})",
            sums.len(),
            shown.join(":")
        );
        Ok(ReadSums { sums })
    }
}

/// Checks expert `e` of `layer`'s bytes as read (see the module's doc).
pub fn loaded(
    io: &Io,
    sums: Option<&ReadSums>,
    layout: &ExpertLayout,
    bytes: &Loaded,
    layer: usize,
    e: usize,
) -> Result<(), EngineError> {
    for (ri, run) in layout.runs.iter().enumerate() {
        for (pi, part) in run.parts.iter().enumerate() {
            let b = bytes.part(ri, pi, part);
            let fail = |reason: String| {
                EngineError::Weights(WeightsError::Tensor {
                    file: io.shard_path(run.file as usize).to_path_buf(),
                    tensor: part_name(layout, layer, e, part),
                    reason,
                })
            };
            if let Some(s) = sums {
                let name = part_name(layout, layer, e, part);
                let want = s.sums.get(&name).copied();
                let found = checksums::hash(b);
                if want != Some(found) {
                    return Err(fail(format!(
                        "the bytes read hash to xxh3 {}, the checksum colibri convert recorded \
                         is {} (expert {e} of layer {layer}): the file changed since it was \
                         written, or the disk returned bad data",
                        hex(found),
                        want.map_or_else(|| "missing".into(), hex)
                    )));
                }
            }
            let dt = part_dtype(layout, part);
            if let Some((count, first)) = dt.non_finite(b) {
                return Err(fail(format!(
                    "{count} of {} {} values are not finite, the first at element {first} \
                     (expert {e} of layer {layer}): the file is damaged; `colibri verify` \
                     checks a converted model's every tensor",
                    b.len() / dt.size(),
                    dt.safetensors_name()
                )));
            }
        }
    }
    Ok(())
}
