//! Writing one planned shard: a reader, the quantizer and a writer in a pipeline, so the
//! disk reads the next piece while both cores quantize this one and the last one is written.
//!
//! Memory: tensors travel in pieces of at most [`CHUNK_ELEMS`] elements (whole rows; one row
//! when a row is longer). At most `2 * QUEUE + 3` = 7 pieces are alive at once (queued on both
//! sides, plus one in each stage), each at most 4 bytes per element (an f32 source or an f32
//! output), and the quantizer holds one piece as f32 and its output twice more while it works;
//! the writer keeps one tensor's scales until that tensor's blob is written (1/16 of its
//! elements in bytes at int4-g64, 4 bytes per row at int8). The bound is therefore about
//! 10 x 32 MiB plus the largest tensor's scales, whatever the model's size (see README). The source is read with `pread`, not through the memory
//! map, so its pages never count as ours.
//!
//! The file is written front to back (header, then each tensor's blob and its scales), so its
//! hash and each tensor's checksum (`colibri-checksums.json`) are computed as it goes, and
//! `sync_all` makes it durable before the caller renames it into place.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::bounded;
use rayon::prelude::*;

use super::manifest::{Found, Hasher};
use super::plan::{Encode, OutTensor, Shard};
use super::progress::Progress;
use crate::error::EngineError;
use crate::quant::QMatrix;
use crate::weights::checksums::Hasher as TensorHasher;
use crate::weights::{fp8, Dtype, ShardSet};

/// Largest piece of a tensor handled at once, in elements (8 Mi: 32 MiB as f32).
pub const CHUNK_ELEMS: usize = 8 << 20;
/// Pieces queued between two stages.
const QUEUE: usize = 2;
/// Elements per parallel task when decoding.
const TASK_ELEMS: usize = 1 << 16;

/// The test aid `COLI_CONVERT_STOP_AFTER=N`: the process exits (status 75, as a kill would
/// leave it: no cleanup, the shard in progress half written) once N pieces are written.
pub struct StopHook {
    after: Option<u64>,
    written: AtomicU64,
}

impl StopHook {
    pub fn from_env() -> StopHook {
        StopHook {
            after: std::env::var("COLI_CONVERT_STOP_AFTER")
                .ok()
                .and_then(|v| v.parse().ok()),
            written: AtomicU64::new(0),
        }
    }

    fn piece_written(&self, file: &mut File) {
        let n = self.written.fetch_add(1, Ordering::Relaxed) + 1;
        if self.after.is_some_and(|a| n >= a) {
            let _ = file.flush();
            crate::elog!("[convert] COLI_CONVERT_STOP_AFTER={n}: stopping here (test aid)");
            std::process::exit(75);
        }
    }
}

/// One piece: rows `r0..r1` of tensor `t` (bytes `r0..r1` for a copied tensor).
#[derive(Clone, Copy, Debug)]
struct Piece {
    t: usize,
    r0: usize,
    r1: usize,
    last: bool,
}

fn pieces(tensors: &[OutTensor], chunk_elems: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    for (t, x) in tensors.iter().enumerate() {
        let (n, step) = match x.encode {
            // A slab of a fused tensor is gathered whole (one expert's matrix).
            _ if x.pick.is_some() => (x.rows, x.rows.max(1)),
            Encode::Copy => (x.data_len as usize, chunk_elems.max(1)),
            _ => (x.rows, (chunk_elems / x.cols.max(1)).max(1)),
        };
        let mut r0 = 0;
        loop {
            let r1 = (r0 + step).min(n);
            out.push(Piece {
                t,
                r0,
                r1,
                last: r1 == n,
            });
            if r1 == n {
                break;
            }
            r0 = r1;
        }
    }
    out
}

/// The source byte range of a piece.
fn source_range(x: &OutTensor, p: &Piece) -> (u64, usize) {
    if x.pick.is_some() {
        return (x.source.offset, x.source.len as usize);
    }
    match x.encode {
        Encode::Copy => (x.source.offset + p.r0 as u64, p.r1 - p.r0),
        _ => {
            let row = x.cols * x.source.dtype.size();
            (x.source.offset + (p.r0 * row) as u64, (p.r1 - p.r0) * row)
        }
    }
}

/// Source bytes as f32: FP8 through its block scales, the other float dtypes as they are.
fn decode(x: &OutTensor, r0: usize, raw: &[u8], fp8_scales: Option<&[f32]>) -> Vec<f32> {
    let dt = x.source.dtype;
    let n = raw.len() / dt.size();
    let mut out = vec![0.0f32; n];
    if dt == Dtype::F8E4M3 {
        let scales = fp8_scales.expect("FP8 scales are loaded before an FP8 piece is decoded");
        let cols = x.cols;
        let rows_per_task = (TASK_ELEMS / cols.max(1)).max(1);
        out.par_chunks_mut(rows_per_task * cols)
            .zip(raw.par_chunks(rows_per_task * cols))
            .enumerate()
            .for_each(|(i, (o, r))| fp8::dequant_rows(r, cols, r0 + i * rows_per_task, scales, o));
    } else {
        out.par_chunks_mut(TASK_ELEMS)
            .zip(raw.par_chunks(TASK_ELEMS * dt.size()))
            .for_each(|(o, r)| {
                dt.to_f32_into(r, o)
                    .expect("the plan sends only float dtypes to decode");
            });
    }
    out
}

/// A piece's output bytes: (data, scales).
fn encode(x: &OutTensor, p: &Piece, raw: Vec<u8>, scales: Option<&[f32]>) -> (Vec<u8>, Vec<f32>) {
    let raw = match &x.pick {
        Some(pick) => super::gpt_oss::gather(pick, &raw, x.source.dtype.size()),
        None => raw,
    };
    match x.encode {
        Encode::Copy => (raw, Vec::new()),
        Encode::F32 => {
            let w = decode(x, p.r0, &raw, scales);
            let mut bytes = vec![0u8; w.len() * 4];
            bytes
                .par_chunks_mut(4 * TASK_ELEMS)
                .zip(w.par_chunks(TASK_ELEMS))
                .for_each(|(b, v)| {
                    for (d, f) in b.chunks_exact_mut(4).zip(v) {
                        d.copy_from_slice(&f.to_le_bytes());
                    }
                });
            (bytes, Vec::new())
        }
        Encode::Quant(fmt) => {
            let w = decode(x, p.r0, &raw, scales);
            // The loader's own quantizer, so the bytes are the ones a load would make.
            QMatrix::quantize(&w, p.r1 - p.r0, x.cols, fmt).into_parts()
        }
    }
}

/// Writes `shard` to `path` (created or truncated) in pieces of at most `chunk_elems`
/// elements ([`CHUNK_ELEMS`]; the bytes do not depend on it); returns its size, hash and
/// tensor checksums.
pub fn write(
    src: &ShardSet,
    shard: &Shard,
    path: &Path,
    chunk_elems: usize,
    progress: &Progress,
    stop: &StopHook,
) -> Result<Found, EngineError> {
    let tensors = &shard.tensors;
    let list = pieces(tensors, chunk_elems);
    let (raw_tx, raw_rx) = bounded::<Result<(Piece, Vec<u8>), EngineError>>(QUEUE);
    let (out_tx, out_rx) = bounded::<(Piece, u64, Vec<u8>, Vec<f32>)>(QUEUE);
    let ctx = |what: &str| format!("{what} {}", path.display());
    let mut file = File::create(path).map_err(|e| EngineError::io(ctx("creating"), e))?;

    std::thread::scope(|s| {
        // Reader: positional reads of each piece's source bytes, in order.
        s.spawn(move || {
            for p in &list {
                let x = &tensors[p.t];
                let (off, len) = source_range(x, p);
                let mut buf = vec![0u8; len];
                let r = src
                    .read_at(x.source.file, off, &mut buf)
                    .map(|_| (*p, buf))
                    .map_err(EngineError::from);
                let failed = r.is_err();
                if raw_tx.send(r).is_err() || failed {
                    return;
                }
            }
        });

        // Writer: header, then every piece in order; a tensor's scales after its blob.
        let writer = s.spawn(move || -> Result<Found, EngineError> {
            let mut h = Hasher::default();
            let mut sums: Vec<(String, u64)> = Vec::with_capacity(2 * tensors.len());
            let mut blob = TensorHasher::default();
            let mut put = |f: &mut File, bytes: &[u8]| -> Result<(), EngineError> {
                h.update(bytes);
                f.write_all(bytes).map_err(|e| {
                    let hint = if e.raw_os_error() == Some(nix::libc::ENOSPC) {
                        " (disk full: free space and run the same command again to resume)"
                    } else {
                        ""
                    };
                    EngineError::io(format!("writing {}{hint}", path.display()), e)
                })
            };
            put(&mut file, &shard.header)?;
            let mut pending_scales: Vec<u8> = Vec::new();
            for (p, read, data, scales) in out_rx.iter() {
                put(&mut file, &data)?;
                blob.update(&data);
                pending_scales.extend(scales.iter().flat_map(|v| v.to_le_bytes()));
                let mut written = data.len() as u64;
                if p.last {
                    let x = &tensors[p.t];
                    sums.push((x.source.name.clone(), blob.finish()));
                    blob = TensorHasher::default();
                    if matches!(x.encode, Encode::Quant(_)) {
                        sums.push((
                            format!("{}.qs", x.source.name),
                            crate::weights::checksums::hash(&pending_scales),
                        ));
                    }
                }
                if p.last && !pending_scales.is_empty() {
                    put(&mut file, &pending_scales)?;
                    written += pending_scales.len() as u64;
                    pending_scales.clear();
                }
                progress.add(read, written);
                stop.piece_written(&mut file);
            }
            file.sync_all()
                .map_err(|e| EngineError::io(ctx("syncing"), e))?;
            Ok(Found {
                bytes: file
                    .metadata()
                    .map_err(|e| EngineError::io(ctx("reading the size of"), e))?
                    .len(),
                hash: h.finish(),
                tensors: sums,
            })
        });

        // Quantizer (this thread, both cores through rayon).
        let mut fp8_for: Option<(usize, Vec<f32>)> = None;
        let mut result: Result<(), EngineError> = Ok(());
        for msg in raw_rx.iter() {
            let (p, raw) = match msg {
                Ok(m) => m,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            let x = &tensors[p.t];
            if x.source.dtype == Dtype::F8E4M3 && fp8_for.as_ref().is_none_or(|(t, _)| *t != p.t) {
                match src.fp8_scales_pread(&x.source.name) {
                    Ok(s) => fp8_for = Some((p.t, s)),
                    Err(e) => {
                        result = Err(e.into());
                        break;
                    }
                }
            }
            let scales = fp8_for.as_ref().map(|(_, s)| s.as_slice());
            let read = raw.len() as u64;
            let (data, qs) = encode(x, &p, raw, scales);
            if out_tx.send((p, read, data, qs)).is_err() {
                break; // the writer failed; its error is the one to report
            }
        }
        drop(raw_rx);
        drop(out_tx);
        let written = writer.join().expect("the writer thread does not panic");
        result?;
        let done = written?;
        if done.bytes != shard.bytes {
            return Err(EngineError::Load(format!(
                "{}: wrote {} bytes but the plan says {}",
                path.display(),
                done.bytes,
                shard.bytes
            )));
        }
        Ok(done)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::plan::{plan, Formats};
    use crate::quant::QFormat;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(name)
    }

    /// Pieces of a few rows (FP8 block rows split across pieces, scales gathered over many
    /// pieces, copied tensors in byte pieces) give the same file as whole tensors.
    #[test]
    fn bytes_do_not_depend_on_the_piece_size() {
        let formats = Formats {
            expert: QFormat::I4G64,
            dense: QFormat::I8Row,
            io: QFormat::I8Row,
            mtp: QFormat::I4Row,
        };
        let dir = std::env::temp_dir().join(format!("colibri-pieces-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (src_dir, layers) in [("fp8", 0), ("hf-fp8-moe", 3), ("hf-bf16-moe", 3)] {
            let src = ShardSet::open(&[fixture(src_dir)]).unwrap();
            let p = plan(&src, layers, &formats, 1 << 40).unwrap();
            for s in &p.shards {
                let mut files = Vec::new();
                for (k, chunk) in [CHUNK_ELEMS, 7 * 140, 100, 1].into_iter().enumerate() {
                    let path = dir.join(format!("{k}-{}", s.name));
                    let progress = Progress::new(0);
                    let stop = StopHook {
                        after: None,
                        written: AtomicU64::new(0),
                    };
                    let done = write(&src, s, &path, chunk, &progress, &stop).unwrap();
                    assert_eq!(done.bytes, s.bytes);
                    // The checksums made while writing are those of the file read back.
                    let entries = s.entries();
                    let back = crate::convert::manifest::hash_shard(
                        &path,
                        s.header.len() as u64,
                        &entries,
                    )
                    .unwrap()
                    .unwrap();
                    assert_eq!(back.tensors, done.tensors);
                    assert_eq!((back.bytes, back.hash), (done.bytes, done.hash));
                    let names: Vec<&String> = entries.iter().map(|e| &e.0).collect();
                    let got: Vec<&String> = done.tensors.iter().map(|e| &e.0).collect();
                    assert_eq!(names, got);
                    files.push((std::fs::read(&path).unwrap(), done.hash));
                }
                for f in &files[1..] {
                    assert!(
                        f == &files[0],
                        "{src_dir} {}: pieces change the bytes",
                        s.name
                    );
                }
            }
        }
        // The FP8 reference tensor converted at int8 equals quantizing torch's dequantization.
        let src = ShardSet::open(&[fixture("fp8")]).unwrap();
        let p = plan(&src, 0, &formats, 1 << 40).unwrap();
        let check = dir.join("check");
        std::fs::create_dir_all(&check).unwrap();
        let path = check.join("out.safetensors");
        let progress = Progress::new(0);
        let stop = StopHook {
            after: None,
            written: AtomicU64::new(0),
        };
        write(&src, &p.shards[0], &path, 1000, &progress, &stop).unwrap();
        let out = ShardSet::open(&[check]).unwrap();
        let want = QMatrix::quantize(
            &src.read_f32("expected", &[136, 140]).unwrap(),
            136,
            140,
            QFormat::I8Row,
        );
        assert_eq!(out.bytes("w").unwrap(), want.data());
        let got_scales = out.read_f32("w.qs", &[136]).unwrap();
        assert_eq!(got_scales, want.scales());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
