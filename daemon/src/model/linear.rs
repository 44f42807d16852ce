//! A projection `y = W x (+ b)` over a quantized or f32 weight, loaded from a shard set.

use super::placement::{self, DeviceSlot};
use crate::error::EngineError;
use crate::quant::{QFormat, QMatrix};
use crate::weights::{Dtype, ShardSet, Warm, IN_PLACE_ALIGN};

pub use crate::quant::ActMode;

pub struct Linear {
    /// The weights; kept on the CPU even when `slot` holds a device copy, so a failed device
    /// falls back to the CPU mid-turn with the same answer.
    pub w: QMatrix,
    pub bias: Option<Vec<f32>>,
    /// The device copies of `w` (`--vram-gb`), which only the placement reads: where the
    /// product runs is its decision (`model::placement`).
    pub slot: DeviceSlot,
}

impl Linear {
    /// `w` (+ `bias`), placed nowhere yet.
    pub fn new(w: QMatrix, bias: Option<Vec<f32>>) -> Linear {
        Linear {
            w,
            bias,
            slot: DeviceSlot::default(),
        }
    }

    pub fn out_dim(&self) -> usize {
        self.w.rows()
    }

    pub fn in_dim(&self) -> usize {
        self.w.cols()
    }

    /// `y[s] = W x[s] + b` for each of the `n` rows of `x`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32], act: ActMode) {
        debug_assert_eq!(x.len(), n * self.in_dim());
        debug_assert_eq!(y.len(), n * self.out_dim());
        placement::product(&self.slot, &self.w, x, n, y, act);
        self.add_bias(y);
    }

    /// `y += b` on each of its rows, when there is a bias: the add every product of this
    /// projection ends with, for callers that run the product themselves.
    pub(crate) fn add_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(b.len()) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
    }

    /// `a` and `b` over the same rows `x` in one product (see [`placement::product_pair`]):
    /// bit-identical to two [`Linear::forward`] calls.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_pair(
        a: &Linear,
        b: &Linear,
        x: &[f32],
        n: usize,
        ya: &mut [f32],
        yb: &mut [f32],
        act: ActMode,
    ) {
        placement::product_pair((&a.slot, &a.w), (&b.slot, &b.w), x, n, ya, yb, act);
        a.add_bias(ya);
        b.add_bias(yb);
    }

    /// `q`, `k` and `v` over the same rows `x` (see [`placement::product_triple`]):
    /// bit-identical to `q`'s [`Linear::forward`] and `k`, `v`'s [`Linear::forward_pair`].
    pub fn forward_triple(
        [q, k, v]: [&Linear; 3],
        x: &[f32],
        n: usize,
        [yq, yk, yv]: [&mut [f32]; 3],
        act: ActMode,
    ) {
        let mats = [(&q.slot, &q.w), (&k.slot, &k.w), (&v.slot, &v.w)];
        placement::product_triple(mats, x, n, [&mut *yq, &mut *yk, &mut *yv], act);
        q.add_bias(yq);
        k.add_bias(yk);
        v.add_bias(yv);
    }

    /// Whether the CPU may take this product a block of output rows at a time from `w`: no
    /// bias (which the row products leave out) and not run whole by the placement.
    pub fn by_row_blocks(&self) -> bool {
        self.bias.is_none() && self.on_cpu()
    }

    /// Whether the product runs on the CPU from `w` (not whole on a device by the placement).
    pub fn on_cpu(&self) -> bool {
        !placement::runs_whole(&self.slot)
    }

    /// Allocating convenience for the load path and tests.
    pub fn apply(&self, x: &[f32], n: usize, act: ActMode) -> Vec<f32> {
        let mut y = vec![0.0; n * self.out_dim()];
        self.forward(x, n, &mut y, act);
        y
    }
}

/// Loads `name` as an `[rows, cols]` matrix: a pre-quantized container tensor (U8/I8 blob plus
/// `<name>.qs` scales) and a GGUF tensor of a type computed as stored keep their stored format;
/// f32/bf16/f16, FP8 (block-dequantized) and other GGUF sources are quantized to `fmt`.
pub fn load_matrix(
    shards: &ShardSet,
    name: &str,
    rows: usize,
    cols: usize,
    fmt: QFormat,
) -> Result<QMatrix, EngineError> {
    load_matrix_warm(shards, name, rows, cols, fmt, Warm::Whole)
}

/// [`load_matrix`], saying when a packed matrix read in place has its pages mapped: the
/// embedding, of which a token reads one row, maps them as its rows are read
/// ([`Warm::ByRows`]); every other matrix once the load is done.
pub fn load_matrix_warm(
    shards: &ShardSet,
    name: &str,
    rows: usize,
    cols: usize,
    fmt: QFormat,
    warm: Warm,
) -> Result<QMatrix, EngineError> {
    let info = shards.get(name).ok_or_else(|| {
        EngineError::from(crate::weights::WeightsError::Missing {
            name: name.to_string(),
        })
    })?;
    if info.dtype.is_packed() {
        let scales_name = format!("{name}.qs");
        let scale_info = shards.get(&scales_name).ok_or_else(|| {
            EngineError::Load(format!(
                "tensor {name} is stored as {:?} but its scales {scales_name} are missing",
                info.dtype
            ))
        })?;
        let scales = shards.read_f32(&scales_name, &scale_info.shape.clone())?;
        let m = if info.offset % IN_PLACE_ALIGN == 0 && shards.in_place_allowed() {
            // Stored as the kernels compute it: read where the shard's map holds it, no copy
            // (`weights::in_place`).
            QMatrix::from_shared(rows, cols, shards.in_place(name, warm)?, scales)
        } else {
            // Off a 64-byte boundary the products run slower over the map than over a copy,
            // and beside experts streamed through the page cache its pages would not stay
            // (`weights::in_place`): copied, as before.
            QMatrix::from_packed(rows, cols, shards.read_owned(name)?, scales)
        };
        return m.map_err(|e| EngineError::Load(format!("tensor {name}: {e}")));
    }
    // A GGUF tensor of a type the kernels compute as stored keeps its blocks, as a packed
    // container tensor keeps its format: llama.cpp computes it so, and turning it into `fmt`
    // would cost memory (f32: 4 bytes a weight, the default) or round it a second time.
    if let Dtype::Ggml(t) = info.dtype {
        if crate::quant::ggml::act_kind(t).is_some() {
            let data = shards.read_owned(name)?;
            return QMatrix::from_ggml(t, rows, cols, data)
                .map_err(|e| EngineError::Load(format!("tensor {name}: {e}")));
        }
    }
    let w = shards.read_f32(name, &[rows, cols])?;
    Ok(if fmt == QFormat::F32 {
        QMatrix::from_f32(w, rows, cols)
    } else {
        QMatrix::quantize(&w, rows, cols, fmt)
    })
}

pub fn load_linear(
    shards: &ShardSet,
    name: &str,
    rows: usize,
    cols: usize,
    fmt: QFormat,
    with_bias: bool,
) -> Result<Linear, EngineError> {
    let w = load_matrix(shards, &format!("{name}.weight"), rows, cols, fmt)?;
    let bias = if with_bias {
        Some(shards.read_f32(&format!("{name}.bias"), &[rows])?)
    } else {
        None
    };
    Ok(Linear::new(w, bias))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::writer::SafetensorsWriter;

    /// Writes the five packed formats of `w` after a `pad`-byte tensor (which moves their
    /// offsets in the file) and opens the folder.
    fn container(tag: &str, pad: usize, w: &[f32], rows: usize, cols: usize) -> ShardSet {
        let dir = std::env::temp_dir().join(format!("colibri-linear-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut writer = SafetensorsWriter::new();
        writer.add("a_pad", Dtype::U8, &[pad], vec![0; pad]);
        for (i, &fmt) in FORMATS.iter().enumerate() {
            let (data, scales) = QMatrix::quantize(w, rows, cols, fmt).into_parts();
            let name = format!("m{i}.weight");
            writer.add(&name, Dtype::U8, &[data.len()], data);
            let qs: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
            writer.add(&format!("{name}.qs"), Dtype::F32, &[scales.len()], qs);
        }
        writer.write(&dir.join("m.safetensors")).unwrap();
        let set = ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        // The set keeps its files open and mapped: the folder can go.
        std::fs::remove_dir_all(&dir).unwrap();
        set
    }

    const FORMATS: [QFormat; 5] = [
        QFormat::I8Row,
        QFormat::I4Row,
        QFormat::I4G64,
        QFormat::I3G64,
        QFormat::I2Row,
    ];

    /// A container's packed matrices load as exactly the matrix the copying loader built
    /// (`pread` into a buffer, `QMatrix::from_packed`): the same format, bytes and scales, and
    /// the same product bits, in every format a container stores dense weights in; read in
    /// place when their bytes start on a 64-byte boundary of the file, copied otherwise.
    #[test]
    fn packed_matrices_load_in_place_as_the_copy_did() {
        let (rows, cols) = (96, 320);
        let mut rng = crate::rng::Rng::new(7);
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.unit_f32() * 2.0 - 1.0)
            .collect();
        let x: Vec<f32> = (0..3 * cols).map(|_| rng.unit_f32() - 0.5).collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        // Pads that put the matrices on and off a 64-byte boundary (every matrix's bytes here
        // are a multiple of 64, so they all move together).
        let (mut on, mut off) = (false, false);
        for pad in 1..=64 {
            let set = container(&format!("pad{pad}"), pad, &w, rows, cols);
            let aligned = set.get("m0.weight").unwrap().offset % IN_PLACE_ALIGN == 0;
            if (aligned && on) || (!aligned && off) {
                continue;
            }
            (on, off) = (on || aligned, off || !aligned);
            let mut whole = 0;
            let mut kept = Vec::new();
            for (i, &fmt) in FORMATS.iter().enumerate() {
                let name = format!("m{i}.weight");
                let info = set.get(&name).unwrap();
                assert_eq!(info.offset % IN_PLACE_ALIGN == 0, aligned, "{fmt:?}");
                whole += info.len;
                let loaded = load_matrix(&set, &name, rows, cols, QFormat::F32).unwrap();
                let shape = set.get(&format!("{name}.qs")).unwrap().shape.clone();
                let scales = set.read_f32(&format!("{name}.qs"), &shape).unwrap();
                let copied =
                    QMatrix::from_packed(rows, cols, set.read_owned(&name).unwrap(), scales)
                        .unwrap();
                assert_eq!(loaded.is_shared(), aligned, "{fmt:?}");
                assert_eq!(loaded.format(), copied.format(), "{fmt:?}");
                assert_eq!(loaded.format(), fmt.canonical(cols), "{fmt:?}");
                assert!(loaded.data() == copied.data(), "{fmt:?}");
                assert_eq!(loaded.scales(), copied.scales(), "{fmt:?}");
                let (mut a, mut b) = (vec![0.0; 3 * rows], vec![0.0; 3 * rows]);
                loaded.matmul(&x, 3, &mut a);
                copied.matmul(&x, 3, &mut b);
                assert_eq!(bits(&a), bits(&b), "{fmt:?}");
                kept.push(loaded);
            }
            // The warm-up maps the live matrices read in place, and not an embedding's.
            let embed = load_matrix_warm(&set, "m0.weight", rows, cols, QFormat::F32, Warm::ByRows)
                .unwrap();
            assert_eq!(embed.is_shared(), aligned);
            assert_eq!(
                set.warm_in_place().unwrap(),
                if aligned { whole } else { 0 }
            );
            drop(kept);
            assert_eq!(set.warm_in_place().unwrap(), 0, "the matrices were dropped");
            if on && off {
                return;
            }
        }
        panic!("no pad put the matrices both on and off a 64-byte boundary");
    }

    /// Once the set is told to copy (experts streamed through the page cache), a matrix on a
    /// 64-byte boundary is copied as an unaligned one is, with the same bytes and products,
    /// and the warm-up finds nothing in place; one handed out before keeps its map.
    #[test]
    fn copy_dense_copies_aligned_matrices_too() {
        let (rows, cols) = (64, 256);
        let mut rng = crate::rng::Rng::new(11);
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.unit_f32() * 2.0 - 1.0)
            .collect();
        let x: Vec<f32> = (0..2 * cols).map(|_| rng.unit_f32() - 0.5).collect();
        let set = (1..=64)
            .map(|pad| container(&format!("copy{pad}"), pad, &w, rows, cols))
            .find(|set| set.get("m0.weight").unwrap().offset % IN_PLACE_ALIGN == 0)
            .expect("a pad puts the matrices on a 64-byte boundary");
        let before = load_matrix(&set, "m0.weight", rows, cols, QFormat::F32).unwrap();
        assert!(before.is_shared());
        assert!(set.in_place_allowed());
        set.copy_dense();
        assert!(!set.in_place_allowed());
        for (i, fmt) in FORMATS.iter().enumerate() {
            let name = format!("m{i}.weight");
            let copied = load_matrix(&set, &name, rows, cols, QFormat::F32).unwrap();
            assert!(!copied.is_shared(), "{fmt:?}");
            let again = load_matrix(&set, &name, rows, cols, QFormat::F32).unwrap();
            let (mut a, mut b) = (vec![0.0; 2 * rows], vec![0.0; 2 * rows]);
            copied.matmul(&x, 2, &mut a);
            again.matmul(&x, 2, &mut b);
            assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
            if i == 0 {
                let mut c = vec![0.0; 2 * rows];
                before.matmul(&x, 2, &mut c);
                assert!(a.iter().zip(&c).all(|(p, q)| p.to_bits() == q.to_bits()));
                assert!(copied.data() == before.data());
            }
        }
        assert_eq!(
            set.warm_in_place().unwrap(),
            set.get("m0.weight").unwrap().len,
            "only the matrix handed out before is mapped"
        );
    }
}
