//! gpt-oss's published MXFP4 gate_up, read in place (`weights::fused_experts`): gate's and
//! up's rows come interleaved (even rows gate, odd rows up), each row whole groups of 16
//! bytes of e2m1 pairs with one e8m0 byte a group. Splitting them into the gate and up
//! matrices an expert computes with copies whole rows of blocks and of scales: the values are
//! the published ones, nothing is requantized.

use super::layout::{tensor_name, Geometry, GATE_UP};
use crate::error::EngineError;
use crate::quant::QMatrix;

/// (gate, up) of expert `e` of `layer` out of its interleaved `blocks` and `scales`.
pub fn split(
    geom: &Geometry,
    layer: usize,
    e: usize,
    blocks: &[u8],
    scales: &[u8],
) -> Result<(QMatrix, QMatrix), EngineError> {
    let (inter, hidden) = (geom.inter, geom.hidden);
    let (row, srow) = (hidden / 2, hidden / 32);
    let name = || tensor_name(layer, e, GATE_UP as usize, false);
    if blocks.len() != 2 * inter * row || scales.len() != 2 * inter * srow {
        return Err(EngineError::Load(format!(
            "tensor {}: {} block bytes and {} scales, an interleaved [{}, {hidden}] MXFP4 \
             gate_up has {} and {}",
            name(),
            blocks.len(),
            scales.len(),
            2 * inter,
            2 * inter * row,
            2 * inter * srow
        )));
    }
    let mut halves = [
        (
            Vec::with_capacity(inter * row),
            Vec::with_capacity(inter * srow),
        ),
        (
            Vec::with_capacity(inter * row),
            Vec::with_capacity(inter * srow),
        ),
    ];
    for (r, (b, s)) in blocks
        .chunks_exact(row)
        .zip(scales.chunks_exact(srow))
        .enumerate()
    {
        let (hb, hs) = &mut halves[r % 2];
        hb.extend_from_slice(b);
        hs.extend_from_slice(s);
    }
    let [(gb, gs), (ub, us)] = halves;
    let m = |b, s: Vec<u8>| {
        QMatrix::from_mxfp4(inter, hidden, b, &s)
            .map_err(|err| EngineError::Load(format!("tensor {}: {err}", name())))
    };
    Ok((m(gb, gs)?, m(ub, us)?))
}

/// (gate's, up's) bias out of the interleaved gate_up bias.
pub fn split_bias(v: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let gate = v.iter().step_by(2).copied().collect();
    let up = v.iter().skip(1).step_by(2).copied().collect();
    (gate, up)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QFormat;

    #[test]
    fn gate_is_the_even_rows_and_up_the_odd_ones() {
        // inter 2, hidden 32: 4 interleaved rows of 16 block bytes and one scale each.
        let geom = Geometry {
            hidden: 32,
            inter: 2,
            fmt: QFormat::Mxfp4,
            fake_quant: false,
            oss: Some((1.702, 7.0)),
            dsv4_limit: None,
        };
        let blocks: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
        let scales = [125u8, 126, 127, 128];
        let (gate, up) = split(&geom, 0, 0, &blocks, &scales).unwrap();
        let rows = |idx: [usize; 2]| {
            let b: Vec<u8> = idx
                .iter()
                .flat_map(|&r| blocks[r * 16..][..16].to_vec())
                .collect();
            let s: Vec<u8> = idx.iter().map(|&r| scales[r]).collect();
            QMatrix::from_mxfp4(2, 32, b, &s).unwrap().dequantize()
        };
        assert_eq!(gate.dequantize(), rows([0, 2]));
        assert_eq!(up.dequantize(), rows([1, 3]));
        assert_ne!(gate.dequantize(), up.dequantize());
        let e = split(&geom, 3, 5, &blocks[..48], &scales)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model.layers.3.mlp.experts.5.gate_up_proj.weight"),
            "{e}"
        );
        assert_eq!(
            split_bias(&[0.0, 1.0, 2.0, 3.0]),
            (vec![0.0, 2.0], vec![1.0, 3.0])
        );
    }
}
