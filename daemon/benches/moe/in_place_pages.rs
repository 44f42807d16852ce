//! Dense matrices read in place from a shard's map, in 2 MiB pages against 4 KiB pages
//! (`cargo bench --bench kernels -- moe inplace`): what `weights::in_place_huge` buys a
//! decode step. Two files with the same bytes (int8 matrices at DeepSeek-V3's dense MLP
//! shapes, one after another): the first read by `ShardSet::warm_in_place` and
//! `ShardSet::huge_in_place` as the engine loads it (2 MiB pages where the page cache's folios
//! allow, read again where they do not), the second written 64 KiB at a time and synced, so
//! the page cache holds it in small folios, and only warmed (4 KiB pages). The same products
//! over each, alternated in one process; each row is the best of the rounds, as GB/s of
//! weights and a ratio to the memory probe of the same round.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use colibri::membw::read_bandwidth_gbs;
use colibri::quant::{set_threading, QMatrix, SharedBytes, Threading};
use colibri::weights::writer::SafetensorsWriter;
use colibri::weights::{Dtype, ShardSet, Warm};

use super::{best_of, Rng};

/// Bytes mapped in 2 MiB pages of files whose path contains `name`, from this process's smaps.
fn file_pmd_kb(name: &str) -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let mut ours = false;
    let mut kb = 0;
    for line in smaps.lines() {
        if let Some(v) = line.strip_prefix("FilePmdMapped:") {
            if ours {
                kb += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|w| w.contains('-'))
        {
            ours = line.contains(name);
        }
    }
    kb
}

/// `[rows, cols]` int8 matrices (bytes and one f32 scale a row) written to `dir/name`.
fn write_model(dir: &Path, shapes: &[(usize, usize)], rng: &mut Rng) -> PathBuf {
    let mut w = SafetensorsWriter::new();
    for (i, &(rows, cols)) in shapes.iter().enumerate() {
        w.add(
            &format!("m{i}"),
            Dtype::U8,
            &[rows * cols],
            rng.bytes(rows * cols),
        );
        let scales: Vec<u8> = (0..rows).flat_map(|_| 0.01f32.to_le_bytes()).collect();
        w.add(&format!("m{i}.qs"), Dtype::F32, &[rows], scales);
    }
    std::fs::create_dir_all(dir).expect("bench dir");
    let path = dir.join("m.safetensors");
    w.write(&path).expect("writing the bench's model");
    path
}

fn load(dir: &Path, shapes: &[(usize, usize)]) -> (ShardSet, Vec<QMatrix>) {
    let set = ShardSet::open(&[dir.to_path_buf()]).expect("opening the bench's model");
    let ms = shapes
        .iter()
        .enumerate()
        .map(|(i, &(rows, cols))| {
            let scales = set.read_f32(&format!("m{i}.qs"), &[rows]).expect("scales");
            let bytes: Arc<dyn SharedBytes> = set
                .in_place(&format!("m{i}"), Warm::Whole)
                .expect("in place");
            QMatrix::from_shared(rows, cols, bytes, scales).expect("int8 matrix")
        })
        .collect();
    (set, ms)
}

pub fn in_place_pages_table() {
    // DeepSeek-V3's dense MLP (gate, up, down) in int8, twice: 0.79 GB a set.
    let (hidden, inter) = (7168usize, 18432usize);
    let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
    let shapes: Vec<(usize, usize)> = shapes.iter().chain(&shapes).copied().collect();
    let bytes: usize = shapes.iter().map(|&(r, c)| r * c).sum();
    let root = std::env::temp_dir().join(format!("colibri-inplace-pages-{}", std::process::id()));
    let mut rng = Rng::new(0x1F1E);
    let huge_dir = root.join("huge");
    let small_dir = root.join("small");
    let path = write_model(&huge_dir, &shapes, &mut rng);
    // The same bytes, written in small pieces and synced: small clean folios in the cache.
    let whole = std::fs::read(&path).expect("reading the bench's model");
    std::fs::create_dir_all(&small_dir).expect("bench dir");
    let mut f = std::fs::File::create(small_dir.join("m.safetensors")).expect("bench file");
    for piece in whole.chunks(64 << 10) {
        f.write_all(piece).expect("writing the bench's model");
    }
    f.sync_all().expect("syncing the bench's model");
    drop((f, whole));

    let (huge_set, huge) = load(&huge_dir, &shapes);
    huge_set.warm_in_place().expect("warm-up");
    let got = huge_set.huge_in_place().expect("huge pages");
    let (small_set, small) = load(&small_dir, &shapes);
    small_set.warm_in_place().expect("warm-up");
    println!(
        "\nDense int8 matrices read in place at decode by page size ({} of DeepSeek-V3's \
         gate/up/down, {:.2} GB a set); spin pool\n2 MiB set: {:.0} of {:.0} MB of whole \
         extents in 2 MiB pages ({:.0} MB read again); smaps FilePmdMapped: 2 MiB set {} MB, \
         4 KiB set {} MB",
        shapes.len(),
        bytes as f64 / 1e9,
        got.huge as f64 / 1e6,
        got.extents as f64 / 1e6,
        got.reread as f64 / 1e6,
        file_pmd_kb("inplace-pages") / 1024 - file_pmd_kb("/small/") / 1024,
        file_pmd_kb("/small/") / 1024,
    );
    set_threading(Threading::Spin);
    let x = rng.f32s(inter);
    let mut y = vec![0f32; inter];
    let sets: [&Vec<QMatrix>; 2] = [&huge, &small];
    let mut best = [(f64::MAX, 0f64); 2];
    for round in 0..6 {
        let bw = read_bandwidth_gbs(256, 1);
        for k in 0..2 {
            let s = if round % 2 == 0 { k } else { 1 - k };
            let mut pass = || {
                for m in sets[s] {
                    m.matmul_i8act(&x[..m.cols()], 1, &mut y[..m.rows()]);
                }
            };
            pass();
            let t = best_of(2, &mut pass);
            best[s].0 = best[s].0.min(t);
            best[s].1 = best[s].1.max(bytes as f64 / t / 1e9 / bw);
        }
    }
    for (label, (t, ratio)) in ["in place, 2 MiB pages", "in place, 4 KiB pages"]
        .iter()
        .zip(best)
    {
        println!(
            "{label:<24} {:>7.2} ms a pass, {:>6.2} GB/s, ratio to the probe {ratio:.3}",
            t * 1e3,
            bytes as f64 / t / 1e9
        );
    }
    println!("2 MiB over 4 KiB: {:.2}x", best[1].0 / best[0].0);
    drop((huge, small, huge_set, small_set));
    let _ = std::fs::remove_dir_all(&root);
}
