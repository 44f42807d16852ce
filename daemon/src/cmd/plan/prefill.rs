//! The first token of a prompt, as the engine computes it: the prompt goes through in chunks
//! of the engine's prefill chunk (`experts::chunk::choose`, which the plan calls with the
//! engine's inputs: 256 positions where the experts fit the budget, up to 2048 where they
//! stream), and in each chunk every sparse layer groups its rows by expert (about
//! `chunk x top_k / experts` rows each, 16 for Qwen3-30B-A3B at 256), fetches the experts the
//! chunk touched (nearly all of them at these sizes) and multiplies each by its rows. So the
//! prediction counts, per chunk:
//!
//! ```text
//! expert time    = expert MACs / the expert kernel at that many rows (the expert probe)
//! dense time     = the other matrices' MACs / the dense kernel at a chunk's rows
//! attention time = (query-key pairs x MACs per pair
//!                   + cached positions rebuilt x MACs per cached position)
//!                  / the attention probe (the quadratic part: f32 products, tens of times
//!                  slower than the int8 matrices; for MLA also each chunk's rebuild of every
//!                  head's keys and values from the whole cached latent, see
//!                  `attn_macs_per_cached_position`)
//! read time      = experts read from disk / disk probe: the first chunk reads what it
//!                  touches; a later chunk finds only the cache's share (held / experts) of
//!                  its experts still in RAM, so a cache smaller than the prompt's experts
//!                  reads them again. An expert's first touch comes from disk; read buffered,
//!                  a later one comes from the page cache when it holds the expert (its share
//!                  of the experts outside our cache)
//! copy time      = read buffered, every load (from disk or page cache) / the copy probe:
//!                  the kernel's copy to our buffer, on the cores (`super::Loads`)
//! ```
//!
//! and the first token takes the attention and dense time in full and, chunk by chunk, the
//! expert and copy time and that chunk's reads overlapped as a decode token's are (`super::token_s`:
//! a layer's reads start at its router, after its attention and dense matrices, and its
//! experts are computed as their reads land). Per chunk, because the disk reads bunch in the
//! first one when the page cache serves the later ones.

/// What the prefill model needs of the shapes (a subset of [`super::Shape`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillShape {
    pub experts: usize,
    pub top_k: usize,
    pub sparse_layers: usize,
    /// Parameters of one routed expert.
    pub expert_params: u64,
    /// Parameters a position multiplies outside the routed experts and the output head.
    pub dense_params: u64,
    /// Parameters of the output head (multiplied once, for the last position).
    pub head_params: u64,
    /// Multiply-adds of one query-key pair summed over the layers (scores and values).
    pub attn_macs_per_pair: u64,
    /// Multiply-adds a chunk spends on each cached position before its pairs, summed over the
    /// layers (MLA's rebuild; 0 for grouped-query attention).
    pub attn_macs_per_cached_position: u64,
}

/// MLA's widths, what the attention count and the attention probe need of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaWidths {
    pub heads: usize,
    /// The query-key width without and with rotary position, and the value width, per head.
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// The cached latent's width.
    pub kv_lora: usize,
}

/// The config's MLA widths (`None` for any other attention).
pub fn mla_widths(c: &crate::config::ModelConfig) -> Option<MlaWidths> {
    match &c.attn {
        crate::config::Attn::Mla(m) => Some(MlaWidths {
            heads: c.num_attention_heads,
            nope: m.qk_nope_head_dim,
            rope: m.qk_rope_head_dim,
            v: m.v_head_dim,
            kv_lora: m.kv_lora_rank,
        }),
        _ => None,
    }
}

/// Multiply-adds a prefill chunk spends per cached position before its query-key pairs,
/// summed over the layers. MLA's prefill (`model::mla`'s reconstruct path, which the engine
/// takes for any chunk longer than a head's key and value width) rebuilds every head's keys and
/// values, `kv_b_proj` (`heads x (nope + v)` outputs of `kv_lora` inputs), from the **whole**
/// cached latent in each chunk, not only the chunk's new positions: a 1000-position prompt in
/// chunks of 256 rebuilds 256 + 512 + 768 + 1000 positions, in one chunk 1000. Grouped-query attention caches its
/// keys and values as they are: 0.
pub fn attn_macs_per_cached_position(c: &crate::config::ModelConfig) -> u64 {
    mla_widths(c).map_or(0, |m| {
        (m.heads * (m.nope + m.v) * m.kv_lora) as u64 * c.num_hidden_layers as u64
    })
}

/// Cached positions the `chunk`-position chunks of a `prompt`-position prompt rebuild: each
/// chunk its end position.
pub fn positions_rebuilt(prompt: usize, chunk: usize) -> u64 {
    chunks(prompt, chunk)
        .iter()
        .scan(0u64, |end, &c| {
            *end += c as u64;
            Some(*end)
        })
        .sum()
}

/// Multiply-adds of one query-key pair summed over the layers: each query head's score (its
/// query-key width) and its share of the values (for MLA, each head's rebuilt key,
/// `qk_nope + qk_rope` wide, and its value, `v_head` wide, as the reconstruct path scores and
/// sums them). Linear-attention and compressed layers
/// (Qwen3.5's DeltaNet, DeepSeek-V4's) have no quadratic part to speak of at 1k positions:
/// counted as 0.
pub fn attn_macs_per_pair(c: &crate::config::ModelConfig) -> u64 {
    let heads = c.num_attention_heads as u64;
    let per_layer = match &c.attn {
        crate::config::Attn::Gqa(g) => heads * 2 * g.head_dim as u64,
        crate::config::Attn::Mla(m) => {
            heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) as u64
        }
        _ => 0,
    };
    per_layer * c.num_hidden_layers as u64
}

impl super::Shape {
    /// What the first token's model needs of the shapes.
    pub fn prefill(&self) -> PrefillShape {
        let routed_active = (self.top_k * self.sparse_layers) as u64 * self.expert_params();
        // MLA's kv_b_proj runs inside the attention core (over the whole cache each chunk,
        // counted there), not once per position as the other matrices do.
        let rebuilt_params = self.attn_macs_per_cached_position;
        PrefillShape {
            experts: self.experts,
            top_k: self.top_k,
            sparse_layers: self.sparse_layers,
            expert_params: self.expert_params(),
            dense_params: self
                .active
                .saturating_sub(self.embed_params() + routed_active + rebuilt_params),
            head_params: self.embed_params(),
            attn_macs_per_pair: self.attn_macs_per_pair,
            attn_macs_per_cached_position: rebuilt_params,
        }
    }
}

/// The speeds the prefill is predicted from, multiply-adds per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillSpeeds {
    /// The dense kernel at a chunk's rows.
    pub dense_gmacs: f64,
    /// The expert kernel at the rows one expert gets in a chunk.
    pub expert_gmacs: f64,
    /// Attention's core: its f32 query-key pairs (and MLA's rebuild of keys and values).
    pub attention_gmacs: f64,
    pub disk_gbs: f64,
    /// Bytes per second the cores copy buffered reads to our buffer at, billions (the copy
    /// probe); `None` when the reads go around the page cache (O_DIRECT, nothing copied).
    pub copy_gbs: Option<f64>,
}

/// The first token's terms, seconds and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ttft {
    pub expert_s: f64,
    pub dense_s: f64,
    pub attention_s: f64,
    /// Attention's multiply-adds: the query-key pairs', and the rebuild's of MLA's keys and
    /// values (0 for grouped-query).
    pub attention_pair_macs: f64,
    pub attention_rebuild_macs: f64,
    /// Expert bytes the chunks load, from disk and from the page cache together.
    pub read_bytes: f64,
    /// Of them, from the page cache.
    pub page_cache_bytes: f64,
    /// Seconds the disk reads.
    pub read_s: f64,
    /// Seconds the cores copy buffered loads to our buffers (0 with O_DIRECT).
    pub copy_s: f64,
    /// The expert time with the copies, and the reads, overlapped chunk by chunk.
    pub moe_s: f64,
}

impl Ttft {
    pub fn total_s(&self) -> f64 {
        self.dense_s + self.attention_s + self.moe_s
    }

    pub fn compute_s(&self) -> f64 {
        self.expert_s + self.dense_s + self.attention_s
    }
}

/// The lengths a prompt of `prompt` positions is fed in, chunks of `chunk` positions (at
/// least 1).
pub fn chunks(prompt: usize, chunk: usize) -> Vec<usize> {
    let chunk = chunk.max(1);
    let mut out = vec![chunk; prompt / chunk];
    if prompt % chunk > 0 {
        out.push(prompt % chunk);
    }
    out
}

/// Distinct experts `rows` rows touch in one layer under uniform routing: `E(1-(1-k/E)^rows)`.
pub fn touched(experts: usize, top_k: usize, rows: usize) -> f64 {
    let e = experts.max(1) as f64;
    e * (1.0 - (1.0 - (top_k as f64 / e).min(1.0)).powi(rows as i32))
}

/// Rows one touched expert gets in a chunk of `chunk` positions (at least 1): what the expert
/// probe is timed at.
pub fn rows_per_expert(experts: usize, top_k: usize, chunk: usize) -> usize {
    let t = touched(experts, top_k, chunk).max(1.0);
    ((chunk * top_k) as f64 / t).round().max(1.0) as usize
}

/// Experts read per sparse layer for a prompt of `prompt` positions fed in `chunk`-position
/// chunks with `held` experts per layer kept in RAM (cache empty at the start).
pub fn experts_read_per_layer(
    experts: usize,
    top_k: usize,
    held: usize,
    prompt: usize,
    chunk: usize,
) -> f64 {
    let e = experts.max(1) as f64;
    let all = touched(experts, top_k, prompt);
    if held as f64 >= all {
        // Everything the prompt touches stays: each is read once.
        return all;
    }
    let keep = (held as f64 / e).min(1.0);
    chunks(prompt, chunk)
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let t = touched(experts, top_k, c);
            if i == 0 {
                t
            } else {
                t * (1.0 - keep)
            }
        })
        .sum()
}

/// One chunk's expert loads in one sparse layer: experts read from disk and experts copied
/// from the page cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkReads {
    pub disk: f64,
    pub page_cache: f64,
}

/// [`experts_read_per_layer`] chunk by chunk, split by where the loads come from: an expert
/// the prompt touches for the first time (`touched` up to the chunk's end less up to its
/// start) from disk, a later load of one our cache let go from the page cache when it holds
/// it: `page_cache` of the `experts - held` experts outside our cache (uniform routing), the
/// rest from disk again. `page_cache` 0: every load from disk (O_DIRECT).
pub fn chunk_reads(
    experts: usize,
    top_k: usize,
    held: usize,
    page_cache: usize,
    prompt: usize,
    chunk: usize,
) -> Vec<ChunkReads> {
    let e = experts.max(1) as f64;
    let all = touched(experts, top_k, prompt);
    let keep = (held as f64 / e).min(1.0);
    let outside = experts.saturating_sub(held);
    let served = if outside == 0 {
        0.0
    } else {
        (page_cache as f64 / outside as f64).min(1.0)
    };
    let mut start = 0;
    chunks(prompt, chunk)
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let first = touched(experts, top_k, start + c) - touched(experts, top_k, start);
            start += c;
            let loads = if held as f64 >= all {
                // Everything the prompt touches stays: each is read once.
                first
            } else if i == 0 {
                touched(experts, top_k, c)
            } else {
                touched(experts, top_k, c) * (1.0 - keep)
            };
            let first = first.min(loads);
            let again = loads - first;
            ChunkReads {
                disk: first + again * (1.0 - served),
                page_cache: again * served,
            }
        })
        .collect()
}

/// The first token of a `prompt`-position prompt fed in `chunk`-position chunks with `held`
/// experts per layer in RAM, `page_cache` more per layer in the page cache (0 unless read
/// buffered) and experts of `expert_disk` bytes on disk.
pub fn ttft(
    s: &PrefillShape,
    v: &PrefillSpeeds,
    (held, page_cache): (usize, usize),
    expert_disk: u64,
    prompt: usize,
    chunk: usize,
) -> Ttft {
    let p = prompt as f64;
    let expert_macs = p * (s.top_k * s.sparse_layers) as f64 * s.expert_params as f64;
    let dense_macs = p * s.dense_params as f64 + s.head_params as f64;
    // Position i attends to the i + 1 positions up to it.
    let pairs = p * (p + 1.0) / 2.0;
    let pair_macs = pairs * s.attn_macs_per_pair as f64;
    let rebuild_macs =
        positions_rebuilt(prompt, chunk) as f64 * s.attn_macs_per_cached_position as f64;
    let expert_s = expert_macs / (v.expert_gmacs * 1e9);
    let per_layer = s.sparse_layers as f64 * expert_disk as f64;
    let (mut read_bytes, mut page_cache_bytes) = (0.0, 0.0);
    let (mut read_s, mut copy_s, mut moe_s) = (0.0, 0.0, 0.0);
    let lengths = chunks(prompt, chunk);
    let reads = chunk_reads(s.experts, s.top_k, held, page_cache, prompt, chunk);
    for (&c, r) in lengths.iter().zip(&reads) {
        let (disk, copied) = (r.disk * per_layer, r.page_cache * per_layer);
        let loads = super::Loads::at(disk, copied, v.disk_gbs, v.copy_gbs);
        read_bytes += disk + copied;
        page_cache_bytes += copied;
        read_s += loads.read_s;
        copy_s += loads.copy_s;
        moe_s += super::overlapped(
            expert_s * c as f64 / p.max(1.0) + loads.copy_s,
            loads.read_s,
        );
    }
    Ttft {
        expert_s,
        dense_s: dense_macs / (v.dense_gmacs * 1e9),
        attention_s: (pair_macs + rebuild_macs) / (v.attention_gmacs * 1e9),
        attention_pair_macs: pair_macs,
        attention_rebuild_macs: rebuild_macs,
        read_bytes,
        page_cache_bytes,
        read_s,
        copy_s,
        moe_s,
    }
}

#[cfg(test)]
mod tests {
    use super::super::overlapped;
    use super::*;

    fn qwen() -> PrefillShape {
        PrefillShape {
            experts: 128,
            top_k: 8,
            sparse_layers: 48,
            expert_params: 3 * 2048 * 768,
            dense_params: 1_000_000,
            head_params: 151_936 * 2048,
            attn_macs_per_pair: 48 * 32 * 2 * 128,
            attn_macs_per_cached_position: 0,
        }
    }

    #[test]
    fn a_prompt_is_fed_in_chunks_of_the_engines_size() {
        assert_eq!(chunks(1000, 256), vec![256, 256, 256, 232]);
        assert_eq!(chunks(512, 256), vec![256, 256]);
        assert_eq!(chunks(10, 256), vec![10]);
        assert!(chunks(0, 256).is_empty());
        assert_eq!(chunks(1000, 2048), vec![1000]);
        assert_eq!(chunks(1000, 97).len(), 11);
        assert_eq!(chunks(1000, 97)[10], 30);
    }

    #[test]
    fn experts_get_a_chunks_share_of_rows() {
        // 256 x 8 picks over ~128 touched experts: 16 rows each.
        assert_eq!(rows_per_expert(128, 8, 256), 16);
        // One position: each of its top_k experts gets its one row.
        assert_eq!(rows_per_expert(128, 8, 1), 1);
        assert!((touched(128, 8, 1) - 8.0).abs() < 1e-9);
        assert!(touched(128, 8, 256) > 127.99);
    }

    #[test]
    fn a_small_cache_reads_each_chunks_experts_again() {
        // Everything held: the prompt's experts read once.
        let all = experts_read_per_layer(128, 8, 128, 1000, 256);
        assert!((all - touched(128, 8, 1000)).abs() < 1e-9);
        // 21 of 128 held: the first chunk reads its ~128, each later one 107/128 of its ~128.
        let small = experts_read_per_layer(128, 8, 21, 1000, 256);
        let want = touched(128, 8, 256)
            + (2.0 * touched(128, 8, 256) + touched(128, 8, 232)) * (1.0 - 21.0 / 128.0);
        assert!((small - want).abs() < 1e-9, "{small} {want}");
        assert!(small > 3.4 * all && small < 3.6 * all, "{small} vs {all}");
        // A prompt of one chunk reads what it touches whatever the cache: the streaming
        // engine's longer chunk reads the 1000-position prompt's experts once.
        assert_eq!(
            experts_read_per_layer(128, 8, 5, 200, 256),
            touched(128, 8, 200)
        );
        assert_eq!(
            experts_read_per_layer(128, 8, 21, 1000, 2048),
            touched(128, 8, 1000)
        );
    }

    /// Read buffered, a prompt's first touch of each expert comes from disk and its later
    /// loads from the page cache, for the share of the experts outside our cache it holds. By
    /// hand: 28 of 128 held, a chunk of 256 touches all 128 (to 1e-5), so the first chunk
    /// reads 128, each of the three later ones the 100 not held, all of them touched before.
    #[test]
    fn the_page_cache_serves_a_prompts_later_loads() {
        let loads = |room| -> (f64, f64) {
            let r = chunk_reads(128, 8, 28, room, 1000, 256);
            assert_eq!(r.len(), 4);
            (
                r.iter().map(|c| c.disk).sum(),
                r.iter().map(|c| c.page_cache).sum(),
            )
        };
        let close = |(a, b): (f64, f64), (x, y): (f64, f64)| {
            assert!(
                (a - x).abs() < 1e-3 && (b - y).abs() < 1e-3,
                "{a} {b} vs {x} {y}"
            );
        };
        // No room (O_DIRECT): every load from disk, the loads as before.
        close(loads(0), (428.0, 0.0));
        let total = experts_read_per_layer(128, 8, 28, 1000, 256);
        assert!((loads(0).0 - total).abs() < 1e-9);
        // Room for half of the 100 outside our cache: half the later loads.
        close(loads(50), (128.0 + 150.0, 150.0));
        // Room for all of them, or more: only the first touches from disk.
        close(loads(100), (128.0, 300.0));
        close(loads(128), (128.0, 300.0));
        // The first chunk's loads are all first touches, whatever the room.
        let first = chunk_reads(128, 8, 28, 100, 1000, 256)[0];
        assert!((first.disk - 128.0).abs() < 1e-3 && first.page_cache == 0.0);
        // Everything held: each touched expert read once, from disk.
        close(
            (
                chunk_reads(128, 8, 128, 0, 1000, 256)
                    .iter()
                    .map(|c| c.disk)
                    .sum(),
                0.0,
            ),
            (touched(128, 8, 1000), 0.0),
        );
        // The first token's bytes and seconds: 48 layers of 1 MB experts, disk 2 GB/s,
        // copies 10 GB/s. Read buffered, the disk reads the 128 first touches and the cores
        // copy all 428 loads.
        let buffered = PrefillSpeeds {
            dense_gmacs: 100.0,
            expert_gmacs: 50.0,
            attention_gmacs: 10.0,
            disk_gbs: 2.0,
            copy_gbs: Some(10.0),
        };
        let t = ttft(&qwen(), &buffered, (28, 100), 1_000_000, 1000, 256);
        assert!((t.read_bytes - 428.0 * 48e6).abs() < 1e-3 * 48e6);
        assert!((t.page_cache_bytes - 300.0 * 48e6).abs() < 1e-3 * 48e6);
        let want = 128.0 * 48e6 / 2e9;
        assert!((t.read_s - want).abs() < 1e-4, "{} {want}", t.read_s);
        assert!(
            (t.copy_s - 428.0 * 48e6 / 10e9).abs() < 1e-4,
            "{}",
            t.copy_s
        );
        // Chunk by chunk, the copies join the products, the disk reads beside them: the
        // first chunk reads its 128 from disk and copies them; the later ones only copy.
        let share = t.expert_s * 256.0 / 1000.0;
        let last = t.expert_s * 232.0 / 1000.0;
        let (d0, c) = (128.0 * 48e6 / 2e9, 100.0 * 48e6 / 10e9);
        let c0 = 128.0 * 48e6 / 10e9;
        let moe = overlapped(share + c0, d0) + 2.0 * (share + c) + (last + c);
        assert!((t.moe_s - moe).abs() < 1e-3, "{} {moe}", t.moe_s);
        // O_DIRECT: every load from disk, nothing copied.
        let direct_v = PrefillSpeeds {
            copy_gbs: None,
            ..buffered
        };
        let direct = ttft(&qwen(), &direct_v, (28, 0), 1_000_000, 1000, 256);
        assert!((direct.read_s - 428.0 * 48e6 / 2e9).abs() < 1e-4);
        assert_eq!(direct.copy_s, 0.0);
        assert_eq!(direct.read_bytes.round(), t.read_bytes.round());
        assert!(t.total_s() < direct.total_s());
        // Buffered with no room counted: the disk's reads as O_DIRECT's, and copied too.
        let no_room = ttft(&qwen(), &buffered, (28, 0), 1_000_000, 1000, 256);
        assert_eq!(no_room.read_s, direct.read_s);
        assert!((no_room.copy_s - 428.0 * 48e6 / 10e9).abs() < 1e-4);
        assert!(no_room.total_s() > direct.total_s());
    }

    #[test]
    fn the_first_token_overlaps_its_compute_and_reads() {
        let s = qwen();
        let v = PrefillSpeeds {
            dense_gmacs: 100.0,
            expert_gmacs: 50.0,
            attention_gmacs: 10.0,
            disk_gbs: 2.0,
            copy_gbs: None,
        };
        let t = ttft(&s, &v, (128, 0), 1_000_000, 1000, 256);
        let expert = 1000.0 * 8.0 * 48.0 * (3.0 * 2048.0 * 768.0) / 50e9;
        assert!((t.expert_s - expert).abs() < 1e-9 * expert);
        let dense = (1000.0 * 1e6 + 151_936.0 * 2048.0) / 100e9;
        assert!((t.dense_s - dense).abs() < 1e-9 * dense);
        let attn = 1000.0 * 1001.0 / 2.0 * (48.0 * 32.0 * 2.0 * 128.0) / 10e9;
        assert!((t.attention_s - attn).abs() < 1e-9 * attn);
        let read = 48.0 * touched(128, 8, 1000) * 1e6;
        assert!((t.read_bytes - read).abs() < 1e-6 * read);
        assert!((t.read_s - read / 2e9).abs() < 1e-9);
        assert_eq!(t.page_cache_bytes, 0.0);
        // Attention and the dense matrices in full; each chunk's expert time against its
        // reads. Everything held: each chunk reads the experts it touches first.
        let moe: f64 = [(0, 256), (256, 512), (512, 768), (768, 1000)]
            .iter()
            .map(|&(a, b)| {
                let first = touched(128, 8, b) - touched(128, 8, a);
                let reads = 48.0 * first * 1e6 / 2e9;
                let share = expert * (b - a) as f64 / 1000.0;
                share.max(reads) + 0.5 * share.min(reads)
            })
            .sum();
        assert!((t.moe_s - moe).abs() < 1e-9, "{} {moe}", t.moe_s);
        assert!((t.total_s() - (dense + attn + moe)).abs() < 1e-9);
        // A cache too small for the prompt's experts reads more, and nothing else changes.
        let small = ttft(&s, &v, (21, 0), 1_000_000, 1000, 256);
        assert!(small.read_bytes > 3.0 * t.read_bytes);
        assert_eq!(small.compute_s(), t.compute_s());
        // In one chunk the small cache reads what the whole one did, overlapped at once.
        let one = ttft(&s, &v, (21, 0), 1_000_000, 1000, 2048);
        let (compute, reads) = (expert, read / 2e9);
        let want = dense + attn + compute.max(reads) + 0.5 * compute.min(reads);
        assert!((one.total_s() - want).abs() < 1e-9);
        // (Summed chunk by chunk in `t`: equal to rounding.)
        assert!((one.read_bytes - t.read_bytes).abs() < 1e-9 * t.read_bytes);
        assert_eq!(one.compute_s(), t.compute_s());
    }
}
