use super::probe::{disk_read_probe, probe_copy_of};
use super::*;

fn shape() -> Shape {
    Shape {
        family: "qwen3_moe",
        params: 30_000_000_000,
        active: 3_000_000_000,
        layers: 48,
        sparse_layers: 48,
        experts: 128,
        top_k: 8,
        hidden: 2048,
        moe_intermediate: 768,
        vocab: 151_936,
        tied_embeddings: false,
        max_positions: 40_960,
        kv_bytes_per_position: 48 * 2 * 4 * 128 * 4,
        kvb_bytes_per_position: 0,
        attn_macs_per_pair: 48 * 32 * 2 * 128,
        attn_macs_per_cached_position: 0,
        mla: None,
        // Qwen3-30B-A3B's (`the_plan_chooses_the_engines_prefill_chunk`).
        prefill_row_bytes: 324_096,
    }
}

/// A cold window the `--measure` report tests print: 1 tok/s, 100 MB read a token.
const WINDOW: Window = Window {
    tok_s: 1.0,
    disk_bytes: 1e8,
    page_cache_bytes: 0.0,
};

/// A budget of `ram` bytes, no VRAM, one slot of 4096 positions.
fn budget(ram: u64) -> Budget {
    Budget {
        ram,
        vram: 0,
        ctx: 4096,
        kv_slots: 1,
        page_cache: 0,
        copied: false,
    }
}

fn probes() -> Probes {
    Probes {
        disk_gbs: 2.0,
        disk_how: String::new(),
        mem_gbs: 20.0,
        mem_how: String::new(),
        copy_gbs: 10.0,
        copy_how: String::new(),
        dense_gbs: 30.0,
        dense_how: String::new(),
        expert_decode_gbs: 30.0,
        expert_decode_how: String::new(),
        prefill_gmacs: 100.0,
        prefill_how: String::new(),
        expert_gmacs: 50.0,
        expert_how: String::new(),
        attention_gmacs: 10.0,
        attention_how: String::new(),
    }
}

#[test]
fn a_model_in_ram_decodes_at_the_memory_limit() {
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let b = budget(200_000_000_000);
    let p = predict(&s, &sizes, &probes(), &b, &Routing::Uniform);
    assert!(p.fits);
    assert_eq!(p.split.experts_in_ram, 128);
    assert_eq!(p.hit_rate, 1.0);
    assert_eq!(p.disk_bytes_per_token, 0);
    assert_eq!(p.limit, "memory bandwidth");
    let want = 20e9 * WHOLE_TOKEN_OF_PROBE / p.bytes_per_token as f64;
    assert!((p.warm_decode_tok_s - want).abs() < 1e-9 * want);
    // Cold, every expert a token meets is read first.
    assert!(p.decode_tok_s < p.warm_decode_tok_s);
}

#[test]
fn a_model_bigger_than_ram_reads_its_misses() {
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let b = budget(12_000_000_000);
    let p = predict(&s, &sizes, &probes(), &b, &Routing::Uniform);
    assert!(p.fits);
    let held = p.split.experts_in_ram;
    assert!(held > 0 && held < 128, "{held}");
    assert_eq!(p.hit_rate, held as f64 / 128.0);
    let misses = 48.0 * 8.0 * (1.0 - p.hit_rate) * sizes.expert_disk as f64;
    assert_eq!(p.disk_bytes_per_token, misses as u64);
    // The split adds up to no more than the budget.
    let sp = p.split;
    assert!(
        sp.dense + sp.kv + sp.kvb + sp.reserve + sp.working_set + sp.expert_ram_bytes <= sp.budget
    );
    // A skewed history holding the same experts hits more.
    let skewed: Vec<Vec<u64>> = (0..48)
        .map(|_| (0..128u64).map(|e| 1000 / (e + 1)).collect())
        .collect();
    let h = Routing::History {
        path: PathBuf::new(),
        per_layer: skewed,
    };
    let q = predict(&s, &sizes, &probes(), &b, &h);
    assert!(q.hit_rate > p.hit_rate);
    assert!(q.warm_decode_tok_s > p.warm_decode_tok_s);
    // Over a cold window too: once the cache is full it misses the history's share.
    let uniform = cold_window(&s, &sizes, &probes(), &p, false, 256);
    let (uniform_tok_s, uniform_bytes) = (uniform.tok_s, uniform.disk_bytes);
    let w = cold_window(&s, &sizes, &probes(), &q, false, 256);
    let (tok_s, bytes) = (w.tok_s, w.disk_bytes);
    assert_eq!((uniform.page_cache_bytes, w.page_cache_bytes), (0.0, 0.0));
    assert!(bytes < uniform_bytes && tok_s > uniform_tok_s);
    let steady = 48.0 * 8.0 * (1.0 - q.hit_rate) * sizes.expert_disk as f64;
    assert!(
        bytes > steady && bytes < steady * 1.2,
        "{bytes} vs {steady}"
    );
}

#[test]
fn the_plan_chooses_the_engines_prefill_chunk() {
    let c = ModelConfig::from_json(include_str!(
        "../../../../tests/fixtures/configs/qwen3-30b-a3b.json"
    ))
    .unwrap();
    assert_eq!(
        Shape::from_config(&c).prefill_row_bytes,
        shape().prefill_row_bytes
    );
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    // Every expert held, room to spare: the longest chunk, the prompt in one, its experts
    // read once and every expert still held.
    let all = predict(
        &s,
        &sizes,
        &probes(),
        &budget(200_000_000_000),
        &Routing::Uniform,
    );
    assert_eq!(all.prefill_chunk, crate::experts::chunk::MAX_AUTO_CHUNK);
    assert_eq!(all.split.experts_in_ram, 128);
    let once = 48.0 * prefill::touched(128, 8, TTFT_PROMPT) * sizes.expert_disk as f64;
    assert!((all.ttft.read_bytes - once).abs() < 1e-6 * once);
    // Streaming: the engine's rule on the same inputs; its working set comes out of the cache
    // only while the chunk runs, so the split (decode's) holds what the budget gives without
    // it; and the 1000-position prompt in one chunk reads each expert it touches once, where
    // chunks of 256 read them again in each chunk.
    let b = budget(12_000_000_000);
    let p = predict(&s, &sizes, &probes(), &b, &Routing::Uniform);
    let inputs = ram_inputs(&s, &sizes, &b);
    let per_layer = 48 * sizes.expert_ram;
    let want = crate::experts::chunk::choose(
        crate::experts::chunk::ChunkRequest::Auto,
        &inputs,
        128 * per_layer,
        s.prefill_row_bytes,
    );
    assert_eq!(p.prefill_chunk, want.rows);
    assert!(p.prefill_chunk >= TTFT_PROMPT, "{}", p.prefill_chunk);
    assert_eq!(
        p.split.working_set,
        inputs.slack() - inputs.reserve - inputs.kv_pool - inputs.kvb
    );
    let held_without = inputs.expert_room() as u64 / per_layer;
    let with = crate::experts::ram::RamInputs {
        prefill_ws: want.extra_bytes,
        ..inputs
    };
    let held_with = with.expert_room() as u64 / per_layer;
    assert!(held_with < held_without, "{held_with} {held_without}");
    assert_eq!(p.split.experts_in_ram as u64, held_without);
    // (`once` as above.)
    assert!((p.ttft.read_bytes - once).abs() < 1e-6 * once);
    let held = p.split.experts_in_ram;
    let chunked = 48.0
        * prefill::experts_read_per_layer(128, 8, held, TTFT_PROMPT, 256)
        * sizes.expert_disk as f64;
    assert!(
        chunked > 2.0 * p.ttft.read_bytes,
        "{chunked} {}",
        p.ttft.read_bytes
    );
}

#[test]
fn reads_hide_half_of_the_shorter_time() {
    assert_eq!(READ_OVERLAP, 0.5);
    assert_eq!(overlapped(2.0, 1.0), 2.5);
    assert_eq!(overlapped(1.0, 2.0), 2.5);
    assert_eq!(overlapped(3.0, 0.0), 3.0);
    assert_eq!(token_s(1.0, 2.0, 1.0), 3.5);
    assert_eq!(token_s(1.0, 0.5, 2.0), 3.25);
    // Warm decode of a model bigger than RAM: the dense part in full, the experts' products
    // and the disk time overlapped.
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let b = budget(12_000_000_000);
    let p = predict(&s, &sizes, &probes(), &b, &Routing::Uniform);
    let whole = 20e9 * WHOLE_TOKEN_OF_PROBE;
    let dense_s = sizes.dense_per_token as f64 / whole;
    let expert_s = (p.bytes_per_token - sizes.dense_per_token) as f64 / whole;
    let disk_s = p.disk_bytes_per_token as f64 / 2e9;
    let want = 1.0 / (dense_s + overlapped(expert_s, disk_s));
    assert!((p.warm_decode_tok_s - want).abs() < 1e-6 * want);
    assert!(p.warm_decode_tok_s > 1.0 / (dense_s + expert_s + disk_s));
    assert!(p.warm_decode_tok_s < 1.0 / overlapped(dense_s + expert_s, disk_s));
    // The first token likewise, in one chunk here: attention and the dense matrices in full,
    // the experts' products against the reads.
    let t = p.ttft;
    assert_eq!(p.prefill_chunk.min(TTFT_PROMPT), TTFT_PROMPT);
    let want = t.dense_s + t.attention_s + overlapped(t.expert_s, t.read_s);
    assert!((p.ttft_s - want).abs() < 1e-9 * want);
}

#[test]
fn too_little_ram_does_not_fit() {
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let b = budget(2_000_000_000);
    let p = predict(&s, &sizes, &probes(), &b, &Routing::Uniform);
    assert!(!p.fits);
    assert_eq!(p.limit, "RAM");
    assert_eq!(p.warm_decode_tok_s, 0.0);
    let all = ram_for_all(&s, &sizes, &b);
    let q = predict(
        &s,
        &sizes,
        &probes(),
        &Budget { ram: all, ..b },
        &Routing::Uniform,
    );
    assert_eq!(q.split.experts_in_ram, 128);
    let r = predict(
        &s,
        &sizes,
        &probes(),
        &Budget {
            ram: all - 1_000_000_000,
            ..b
        },
        &Routing::Uniform,
    );
    assert!(r.split.experts_in_ram < 128);
}

#[test]
fn converted_sizes_count_scales() {
    let s = shape();
    let i4 = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    // int4 with an f32 scale per 64: 4.5 bits a weight.
    assert_eq!(
        i4.expert_disk,
        (s.expert_params() as f64 * 4.5 / 8.0) as u64
    );
    let i8 = Sizes::converted(&s, QFormat::I8Row, QFormat::I8Row);
    assert!(i8.expert_disk > i4.expert_disk);
    assert!(i4.dense_per_token < i4.dense);
}

#[test]
fn a_disk_probe_reads_a_file() {
    let dir = std::env::temp_dir().join(format!("colibri-plan-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("blob");
    std::fs::write(&path, vec![7u8; 8 << 20]).unwrap();
    let (gbs, _) = disk_read_probe(&path, 1 << 20, 2, 16, true).unwrap();
    assert!(gbs > 0.0);
    let (gbs, direct) = disk_read_probe(&path, 1 << 20, 2, 16, false).unwrap();
    assert!(gbs > 0.0 && !direct);
    std::fs::remove_file(&path).unwrap();
    // The copy probe leaves nothing behind and says what it read.
    let (gbs, how) = probe_copy_of(&dir, 1 << 20, 16 << 20).unwrap();
    assert!(gbs > 0.0);
    assert_eq!(how, "page-cache reads of 1.0 MB at depth 4, 16 MiB cached");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `--measure` table's pilot rows: its bytes per token read ahead in time, late and never
/// used, and the share of all the expert bytes read that arrived ahead in time.
#[test]
fn the_measure_table_shows_what_the_pilot_read_ahead() {
    let (b, p) = planned_8gb();
    let run = measure::Run {
        decode_tok_s: 1.0,
        mb_read_per_token: 200.0,
        prefetch_mb: Some((50.0, 20.0, 5.0)),
        ..measure::Run::default()
    };
    let m = measured_with(run);
    let text = report::measured_text(&probes(), &b, (&p, WINDOW), None, &m);
    let value = |key: &str| measured_value(&text, key);
    assert_eq!(value("prefetched MB/token: in time"), "50.0");
    assert_eq!(value("prefetched MB/token: late"), "20.0");
    assert_eq!(value("prefetched MB/token: never used"), "5.0");
    assert_eq!(value("of those, read ahead in time (%)"), "25.0");
    // Its decode against the disk bound counts every byte it read, as the cold run's does.
    let of_bound = 1.0 / (probes().disk_gbs * 1e3 / 200.0);
    assert_eq!(
        value("decode cold with --pilot / disk bound"),
        format!("{of_bound:.2}")
    );
    let json = report::measured_json(&probes(), &b, &m);
    assert_eq!(json["pilot"]["disk_gb_s"], 0.2);
    assert_eq!(json["pilot"]["of_disk_bound"], of_bound);
    // A pilot run that failed shows none of them.
    let mut failed = m.clone();
    failed.pilot.failed = Some("exit status 1".into());
    let text = report::measured_text(&probes(), &b, (&p, WINDOW), None, &failed);
    assert!(!text.contains("prefetched MB/token"), "{text}");
}

/// The `--measure` table's device rows: the MB a token the device delivered (the kernel's
/// count), decode against the disk bound of those alone, and a warm load's time split; none
/// of them where the child could not count.
#[test]
fn the_measure_table_shows_what_the_device_delivered() {
    let (mut b, p) = planned_8gb();
    b.page_cache = 10_000_000_000;
    let run = measure::Run {
        decode_tok_s: 2.0,
        mb_read_per_token: 200.0,
        device_mb_per_token: Some(50.0),
        load_ms: Some(measure::LoadMs {
            each: 3.5,
            read: 3.0,
            check: 0.25,
            build: 0.25,
        }),
        wait_ms_per_token: Some(12.0),
        ..measure::Run::default()
    };
    let m = measured_with(run);
    let text = report::measured_text(&probes(), &b, (&p, WINDOW), None, &m);
    let value = |key: &str| measured_value(&text, key);
    assert_eq!(value("of those from disk, 32 cold"), "50.0");
    assert_eq!(value("of those from disk, warm"), "50.0");
    assert_eq!(value("  of which the device delivered"), "0.10");
    // 2 GB/s over 50 MB a token: a bound of 40 tok/s, of which 2 is 0.05.
    assert_eq!(value("decode warm / device bound"), "0.05");
    assert_eq!(value("decode warm / disk bound"), "0.20");
    assert_eq!(value("a load on its thread, warm (ms)"), "3.50");
    assert_eq!(value("  its read (ms)"), "3.00");
    assert_eq!(value("  its checks (ms)"), "0.25");
    assert_eq!(value("  its matrices built (ms)"), "0.25");
    assert_eq!(value("products waited, warm (ms/token)"), "12.0");
    let json = report::measured_json(&probes(), &b, &m);
    assert_eq!(json["warm"]["of_device_bound"], 0.05);
    assert_eq!(json["device_gb_s"], 0.1);
    assert_eq!(json["runs"]["warm"]["device_bytes_per_token"], 50_000_000);
    assert_eq!(json["runs"]["warm"]["load_ms"]["read"], 3.0);
    // Not counted: no device rows, no device bound.
    let m = measured_with(measure::Run {
        decode_tok_s: 2.0,
        mb_read_per_token: 200.0,
        ..measure::Run::default()
    });
    let text = report::measured_text(&probes(), &b, (&p, WINDOW), None, &m);
    assert!(
        !text.contains("device bound") && !text.contains("device delivered"),
        "{text}"
    );
    assert!(report::measured_json(&probes(), &b, &m)["warm"]["of_device_bound"].is_null());
}

/// The measure records how each child read its experts (its `[IO] expert reads:` line), and
/// the plan's `reads` line says what the figures assume for either mode.
#[test]
fn the_read_mode_is_stated_and_measured() {
    let mut run = measure::Run::default();
    let stderr = [
        "[RAM] budget 2.93 GB".to_string(),
        "[IO] expert reads: O_DIRECT (auto: experts 7.00 GB on disk > page cache room 399.60 MB \
         = the cgroup's memory limit 3.33 GB - 2.93 GB held (its budget))"
            .to_string(),
    ];
    measure::parse(&[], &stderr, &mut run);
    assert_eq!(run.reads, "O_DIRECT");
    assert_eq!(run.experts_per_layer, None, "a [RAM] line without its cap");
    let facts = IoFacts {
        expert_bytes: 7_000_000_000,
        budget: 2_930_000_000,
        whole_model: 8_000_000_000,
        cgroup_limit: Some(3_330_000_000),
        mem_total: 24_000_000_000,
        mappable: true,
    };
    let direct = reads_line(&choose_io(IoMode::Auto, facts));
    assert!(direct.starts_with("O_DIRECT (auto: "), "{direct}");
    assert!(
        direct.ends_with(": reads at the disk probe's rate"),
        "{direct}"
    );
    let roomy = IoFacts {
        cgroup_limit: None,
        ..facts
    };
    // The 8 GB model exceeds its 2.93 GB budget: mapped; with copies on several drives,
    // buffered.
    for (mappable, mode) in [(true, "mmap"), (false, "buffered")] {
        let line = reads_line(&choose_io(IoMode::Auto, IoFacts { mappable, ..roomy }));
        assert!(line.starts_with(&format!("{mode} (auto: ")), "{line}");
        assert!(
            line.contains("later ones from the page cache while it holds them"),
            "{line}"
        );
    }
}

/// Each child's experts held per layer come from its `[RAM]` line (kept, lowered or raised),
/// the table shows them beside the plan's, and a run that held another number is named.
#[test]
fn the_children_hold_the_plans_experts_per_layer() {
    let held = |line: &str| {
        let mut run = measure::Run::default();
        measure::parse(&[], &[line.to_string()], &mut run);
        run.experts_per_layer
    };
    assert_eq!(
        held("[RAM] budget 10.00 GB: cap=25 ok per layer (projected peak 9.10 GB)"),
        Some(25)
    );
    assert_eq!(
        held("[RAM] budget 3.00 GB: cap lowered 25->7 per layer (projected peak 2.90 GB)"),
        Some(7)
    );
    assert_eq!(
        held("[RAM] budget 3.00 GB: cap raised 8->128 per layer (projected peak 2.90 GB)"),
        Some(128)
    );
    let (b, p) = planned_8gb();
    let run = measure::Run {
        decode_tok_s: 1.0,
        mb_read_per_token: 200.0,
        experts_per_layer: Some(25),
        ..measure::Run::default()
    };
    let mut m = measured_with(run);
    assert!(m.held_apart().is_empty());
    let text = report::measured_text(&probes(), &b, (&p, WINDOW), None, &m);
    let line = text
        .lines()
        .find(|l| l.starts_with("experts held per layer"))
        .unwrap_or_else(|| panic!("no row in\n{text}"));
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>()[4..],
        ["25", "-", "25"]
    );
    assert!(!text.contains("not the plan's"), "{text}");
    m.warm.experts_per_layer = Some(31);
    m.pilot.experts_per_layer = None;
    assert_eq!(m.held_apart(), [("warm", Some(31)), ("pilot", None)]);
    let text = report::measured_text(&probes(), &b, (&p, WINDOW), None, &m);
    assert!(
        text.contains("the warm run held 31 experts per layer, not the plan's 25"),
        "{text}"
    );
    let json = report::measured_json(&probes(), &b, &m);
    assert_eq!(json["experts_per_layer"]["planned"], 25);
    assert_eq!(json["experts_per_layer"]["warm"], 31);
    assert!(json["experts_per_layer"]["pilot"].is_null());
}

/// A `--measure` result whose four runs are `run`, at a 25-experts-a-layer plan.
/// The measured column of the `--measure` table's row `key` (the row's last field).
fn measured_value(text: &str, key: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key:?} in\n{text}"));
    line.split_whitespace().last().unwrap().to_string()
}

fn measured_with(run: measure::Run) -> measure::Measured {
    measure::Measured {
        cold: run.clone(),
        first: run.clone(),
        warm: run.clone(),
        pilot: run,
        load: "1.00 1.00 1.00".into(),
        cgroup_bytes: None,
        tokens: 32,
        usage: None,
        planned_per_layer: 25,
    }
}

/// The test shape's plan at an 8 GB budget (int4-g64 experts, int8 dense, uniform routing),
/// the one the `--measure` report tests print beside their runs.
fn planned_8gb() -> (Budget, Prediction) {
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let b = budget(8_000_000_000);
    let p = predict(&s, &sizes, &probes(), &b, &Routing::Uniform);
    (b, p)
}

/// A dense format whose product runs slower than the whole token's share of the memory probe
/// paces the token's dense bytes; the experts' stay at the memory's.
#[test]
fn a_dense_product_slower_than_memory_paces_the_dense_part() {
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let b = budget(200_000_000_000);
    let slow = Probes {
        dense_gbs: 5.0,
        ..probes()
    };
    let p = predict(&s, &sizes, &slow, &b, &Routing::Uniform);
    let experts = (p.bytes_per_token - sizes.dense_per_token) as f64;
    let secs = experts / (20e9 * WHOLE_TOKEN_OF_PROBE) + sizes.dense_per_token as f64 / 5e9;
    assert!((p.warm_decode_tok_s - 1.0 / secs).abs() < 1e-9 / secs);
    // Faster than the memory: the memory's pace, as with no dense probe.
    let fast = predict(&s, &sizes, &probes(), &b, &Routing::Uniform);
    assert!(fast.warm_decode_tok_s > p.warm_decode_tok_s * 1.5);
    let want = 20e9 * WHOLE_TOKEN_OF_PROBE / fast.bytes_per_token as f64;
    assert!((fast.warm_decode_tok_s - want).abs() < 1e-9 * want);
}

/// The dense decode probe runs the format's product and says what it ran.
#[test]
fn the_dense_decode_probe_measures_the_formats_product() {
    let (gbs, how) = super::probe::probe_dense_decode(QFormat::I8Row, 256, 1 << 20);
    assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
    assert!(how.starts_with("int8 256x256 x 1 position"), "{how}");
}

/// The expert decode probe runs groups of top-k experts in the format and says what it ran;
/// a top-k that does not divide the weights still gets whole groups.
#[test]
fn the_expert_decode_probe_measures_the_formats_experts() {
    let (gbs, how) = super::probe::probe_expert_decode(
        QFormat::from_bits(2, 64).unwrap(),
        (256, 128, 3),
        1 << 20,
    );
    assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
    assert!(
        how.starts_with("int2") && how.contains("experts 128x256 x 1 position in groups of 3"),
        "{how}"
    );
}

/// Routed experts whose product runs slower than the whole token's share of the memory probe
/// (an int2 expert's unpacking) pace the token's expert bytes; the dense part keeps its own.
#[test]
fn an_expert_product_slower_than_memory_paces_the_experts() {
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let b = budget(200_000_000_000);
    let slow = Probes {
        expert_decode_gbs: 4.0,
        ..probes()
    };
    let p = predict(&s, &sizes, &slow, &b, &Routing::Uniform);
    let experts = (p.bytes_per_token - sizes.dense_per_token) as f64;
    let secs = experts / 4e9 + sizes.dense_per_token as f64 / (20e9 * WHOLE_TOKEN_OF_PROBE);
    assert!((p.warm_decode_tok_s - 1.0 / secs).abs() < 1e-9 / secs);
}

/// DeepSeek-V3's published config, as `plan --config` reads it.
fn deepseek_v3() -> ModelConfig {
    ModelConfig::from_json(include_str!(
        "../../../../tests/fixtures/configs/deepseek-v3.json"
    ))
    .unwrap()
}

#[test]
fn mla_attention_counts_the_engines_rebuild_and_pairs() {
    let c = deepseek_v3();
    let s = Shape::from_config(&c);
    let m = s.mla.expect("DeepSeek-V3 is MLA");
    assert_eq!(
        (m.heads, m.nope, m.rope, m.v, m.kv_lora),
        (128, 128, 64, 128, 512)
    );
    // A pair: each head's 192-wide score and its 128-wide share of the values, every layer.
    assert_eq!(s.attn_macs_per_pair, 61 * 128 * (192 + 128));
    // Each chunk rebuilds every head's 128 + 128 key and value widths from the 512-wide latent
    // at every cached position.
    assert_eq!(s.attn_macs_per_cached_position, 61 * 128 * 256 * 512);
    // kv_b_proj is priced in the attention core, not again with the other matrices.
    let p = s.prefill();
    let routed = (s.top_k * s.sparse_layers) as u64 * s.expert_params();
    assert_eq!(
        p.dense_params + s.attn_macs_per_cached_position,
        s.active - s.embed_params() - routed
    );
    // A 1000-position prompt in chunks of 256 rebuilds 256 + 512 + 768 + 1000 positions.
    assert_eq!(prefill::positions_rebuilt(1000, 256), 2536);
    assert_eq!(prefill::positions_rebuilt(100, 256), 100);
    // One chunk of 2048 (the streaming engine's) rebuilds the 1000 once.
    assert_eq!(prefill::positions_rebuilt(1000, 2048), 1000);
    let v = prefill::PrefillSpeeds {
        dense_gmacs: 100.0,
        expert_gmacs: 50.0,
        attention_gmacs: 10.0,
        disk_gbs: 2.0,
        copy_gbs: None,
    };
    let t = prefill::ttft(&p, &v, (256, 0), 1, 1000, 256);
    let want = (1000.0 * 1001.0 / 2.0 * s.attn_macs_per_pair as f64
        + 2536.0 * s.attn_macs_per_cached_position as f64)
        / 10e9;
    assert!(
        (t.attention_s - want).abs() < 1e-9 * want,
        "{} {want}",
        t.attention_s
    );
    assert_eq!(
        t.attention_rebuild_macs,
        2536.0 * s.attn_macs_per_cached_position as f64
    );
    assert_eq!(
        t.attention_pair_macs,
        1000.0 * 1001.0 / 2.0 * s.attn_macs_per_pair as f64
    );
    // The rebuild is most of it at these widths: the pairs alone were the old term.
    let pairs_only = 1000.0 * 1001.0 / 2.0 * s.attn_macs_per_pair as f64 / 10e9;
    assert!(t.attention_s > 2.5 * pairs_only);
}

#[test]
fn grouped_query_attention_has_no_rebuild() {
    let c = ModelConfig::from_json(include_str!(
        "../../../../tests/fixtures/configs/qwen3-30b-a3b.json"
    ))
    .unwrap();
    let s = Shape::from_config(&c);
    assert_eq!(s.mla, None);
    assert_eq!(s.attn_macs_per_cached_position, 0);
    assert_eq!(s.attn_macs_per_pair, 48 * 32 * 2 * 128);
    assert_eq!(s.prefill().attn_macs_per_cached_position, 0);
}

/// The MLA probe runs the engine's core at the model's widths and says so; a grouped-query
/// model keeps the grouped-query probe.
#[test]
fn the_attention_probe_follows_the_models_attention() {
    let m = Shape::from_config(&deepseek_v3()).mla.unwrap();
    let (gmacs, how) = probe::probe_attention(300, Some((m, QFormat::I8Row)));
    assert!(gmacs.is_finite() && gmacs > 0.0, "{gmacs}");
    assert!(how.starts_with("MLA core: a 300-position prompt"), "{how}");
    assert!(
        how.contains("of 128 heads of 128+64 / 128, latent 512"),
        "{how}"
    );
    let (gmacs, how) = probe::probe_attention(600, None);
    assert!(gmacs.is_finite() && gmacs > 0.0);
    assert!(how.contains("32 heads of 128 on 4"), "{how}");
}

/// Read buffered, the page cache holds the experts our cache lets go, as many as its room
/// takes: at no room every miss is a disk read (the O_DIRECT figures), at room for half of the
/// experts outside our cache it serves half the misses (uniform routing), at room for all of
/// them every miss. Read buffered, every load is copied to our buffer on the cores (the copy
/// probe's rate, priced as compute), from the disk or the page cache. A cold token's experts
/// are first reads and come from disk whatever the room.
#[test]
fn the_page_cache_serves_the_misses_it_has_room_for() {
    let s = shape();
    let sizes = Sizes::converted(&s, QFormat::I4G64, QFormat::I8Row);
    let per_layer = 48 * sizes.expert_disk;
    let at = |page_cache: u64| {
        let b = Budget {
            page_cache,
            copied: page_cache > 0,
            ..budget(12_200_000_000)
        };
        predict(&s, &sizes, &probes(), &b, &Routing::Uniform)
    };
    let none = at(0);
    let held = none.split.experts_in_ram;
    let outside = 128 - held;
    assert!(held > 0 && outside % 2 == 0, "{held}");
    let half = at((outside / 2) as u64 * per_layer + per_layer - 1);
    let all = at(outside as u64 * per_layer);
    let more = at(1000 * per_layer);
    assert_eq!(
        (
            none.page_cache_experts,
            half.page_cache_experts,
            all.page_cache_experts
        ),
        (0, outside / 2, outside)
    );
    assert_eq!(more.page_cache_experts, outside);
    assert_eq!(
        (
            none.page_cache_share,
            half.page_cache_share,
            all.page_cache_share
        ),
        (0.0, 0.5, 1.0)
    );
    // By hand: 384 picks a token, the misses 384 x (1 - held/128) experts.
    let misses = 384.0 * outside as f64 / 128.0 * sizes.expert_disk as f64;
    assert_eq!(none.disk_bytes_per_token, misses as u64);
    assert_eq!(none.page_cache_bytes_per_token, 0);
    assert_eq!(half.page_cache_bytes_per_token, (misses / 2.0) as u64);
    assert_eq!(all.disk_bytes_per_token, 0);
    assert_eq!(all.page_cache_bytes_per_token, misses as u64);
    let whole = 20e9 * WHOLE_TOKEN_OF_PROBE;
    let dense_s = sizes.dense_per_token as f64 / whole;
    let expert_s = (none.bytes_per_token - sizes.dense_per_token) as f64 / whole;
    let cold_disk = none.cold_disk_bytes_per_token as f64;
    for (p, disk, copied, buffered) in [
        (&none, misses, 0.0, false),
        (&half, misses / 2.0, misses / 2.0, true),
        (&all, 0.0, misses, true),
    ] {
        let copy_s = |bytes: f64| if buffered { bytes / 10e9 } else { 0.0 };
        let want = 1.0 / (dense_s + overlapped(expert_s + copy_s(disk + copied), disk / 2e9));
        assert!((p.warm_decode_tok_s - want).abs() < 1e-6 * want);
        // Cold: every pick a first read, from disk (and copied, read buffered).
        assert_eq!(p.cold_disk_bytes_per_token, none.cold_disk_bytes_per_token);
        let want = 1.0 / (dense_s + overlapped(expert_s + copy_s(cold_disk), cold_disk / 2e9));
        assert!((p.decode_tok_s - want).abs() < 1e-6 * want);
    }
    assert!(half.decode_tok_s < none.decode_tok_s);
    assert!(all.warm_decode_tok_s > half.warm_decode_tok_s);
    assert!(half.warm_decode_tok_s > none.warm_decode_tok_s);
    assert_eq!(none.limit, "disk");
    assert_eq!(all.limit, "memory bandwidth");
    // The first token reads the same experts in one chunk, each a first touch: from disk.
    assert_eq!(all.ttft.read_bytes, none.ttft.read_bytes);
    assert_eq!(all.ttft.page_cache_bytes, 0.0);
    // A window of 256 cold tokens: the first touches from disk, the later misses from the
    // page cache when it holds them all.
    let w0 = cold_window(&s, &sizes, &probes(), &none, false, 256);
    let w1 = cold_window(&s, &sizes, &probes(), &all, true, 256);
    assert!((w0.loaded_bytes() - w1.loaded_bytes()).abs() < 1e-6 * w0.loaded_bytes());
    let first = 128.0 * (1.0 - (1.0 - 8.0 / 128.0f64).powi(256)) * per_layer as f64 / 256.0;
    // (A token's loads cap its first touches: the uniform steady rate 8 x (1 - held/128) is a
    // little under the second token's 7.5 first touches, a few tenths of an expert in all.)
    assert!(
        w1.disk_bytes <= first * (1.0 + 1e-9) && w1.disk_bytes > 0.99 * first,
        "{} {first}",
        w1.disk_bytes
    );
    assert!(w1.tok_s > w0.tok_s);
    assert_eq!(w0.page_cache_bytes, 0.0);
}

/// The room the plan counts is the one `--direct auto` judged by, and only when the reads go
/// through the page cache: DeepSeek-V3's 8 layers (14.15 GB of experts, 10 GB budget,
/// MemTotal 25.28 GB) read buffered with 15.28 GB of room; GLM-4.5-Air's 43.6 GB beside a
/// 21.12 GB budget read O_DIRECT and count none.
#[test]
fn the_page_cache_room_is_the_read_rules() {
    use crate::experts::io_auto::IoReason;
    const G: u64 = 1_000_000_000;
    let facts = |experts: u64, budget: u64, cgroup_limit| IoFacts {
        expert_bytes: experts,
        budget,
        whole_model: experts + 5 * G,
        cgroup_limit,
        mem_total: 25_280_000_000,
        mappable: true,
    };
    let ds = choose_io(IoMode::Auto, facts(14_150_000_000, 10 * G, None));
    assert_eq!(ds.mode, IoMode::Mmap);
    assert_eq!(page_cache_room(&ds), 15_280_000_000);
    let glm = choose_io(IoMode::Auto, facts(43_600_000_000, 21_120_000_000, None));
    assert_eq!(glm.mode, IoMode::Direct);
    assert_eq!(page_cache_room(&glm), 0);
    // A cgroup bounds the page cache too: 16 GB of Qwen3 experts in an 8 GB cgroup.
    let qwen = choose_io(IoMode::Auto, facts(16 * G, 7_040_000_000, Some(8 * G)));
    assert_eq!((qwen.mode, page_cache_room(&qwen)), (IoMode::Direct, 0));
    // Named modes: --direct on counts none; nothing to judge by counts none.
    assert_eq!(
        page_cache_room(&choose_io(IoMode::Direct, facts(G, G, None))),
        0
    );
    let unknown = IoChoice {
        mode: IoMode::Buffered,
        reason: IoReason::Unknown,
        facts: facts(G, G, None),
    };
    assert_eq!(page_cache_room(&unknown), 0);
}

/// A child's decode reads a token: its loads times the expert's bytes where bench's two
/// decimals lose a small model's, and bench's own MB where the pilot read ahead (those reads
/// are not loads): GLM-4.5-Air's pilot run loaded 77.82 experts of 7.57 MB a token (589 MB)
/// while the disk delivered 1314.86 MB a token.
#[test]
fn a_childs_reads_count_every_byte_the_disk_delivered() {
    let read = |line: &str, expert_bytes: u64| {
        let mut run = measure::Run::default();
        measure::parse(&[], &[line.to_string()], &mut run);
        measure::counted_reads(run, expert_bytes).mb_read_per_token
    };
    let pilot = "  [bench] decode: 77.82 expert loads/token, 1314.86 MB read/token";
    assert_eq!(read(pilot, 7_569_408), 1314.86);
    let plain = "  [bench] decode: 164.75 expert loads/token, 1247.06 MB read/token";
    // The loads and the printed MB agree to bench's two decimals: the larger counts.
    assert_eq!(read(plain, 7_569_408), 1247.06f64.max(164.75 * 7.569408));
    // A tiny model: 0.00 MB printed for 3.5 loads of 1 kB.
    let tiny = "  [bench] decode: 3.50 expert loads/token, 0.00 MB read/token";
    assert!((read(tiny, 1000) - 0.0035).abs() < 1e-12);
}
