//! How many prompt positions one prefill forward takes (issue 50): pure arithmetic over the
//! RAM split, so the engine and `colibri plan` choose the same chunk.
//!
//! In each chunk every sparse layer fetches every expert the chunk's rows touch, which at 256
//! rows is nearly all of them. When the experts stream from disk (the budget cannot hold them
//! all), a prompt of `p` positions reads the model's experts about `p / chunk` times; one chunk
//! of up to [`MAX_AUTO_CHUNK`] positions reads them about once. Its rows' working set
//! (activations, per-expert products, attention blocks, the RAM split's `row_bytes`) grows
//! with the chunk, so the auto chunk is the largest multiple of [`DECODE_CHUNK`] whose working
//! set past that of [`DECODE_CHUNK`] rows takes at most [`ROOM_SHARE`] of the room the budget
//! leaves the experts. That excess comes out of the experts' cache only while such a chunk
//! runs ([`super::ram::RamInputs::prefill_ws`] in the split of those steps,
//! `ExpertStore::long_chunk`): decode, which a smaller cache slows every token, keeps the whole
//! room, and the forward's buffers shrink back after the prompt (`Scratch::shed_rows`).
//!
//! When the budget holds every routed expert, a chunk still matters. A cold model's first
//! prompt reads every expert from disk in its first chunk, where one long chunk spreads those
//! reads over the whole prompt's products, and warm or cold, an expert multiplies more rows a
//! pass in a longer chunk (8 at 256 positions for 256 experts of top 8). So the chunk is the
//! longest whose working set past [`DECODE_CHUNK`]'s fits the room the experts leave, which
//! nothing else uses: the cache gives up nothing for it (`colibri plan`: GLM-4.5-Air at int3
//! in 64 GB took longer to its first token than in 32 GB, where the experts stream and the
//! chunk was long).
//!
//! While a session decodes, a prefill chunk joining its step is never more than
//! [`DECODE_CHUNK`] (the engine's rule, `engine/step.rs`): a long chunk would freeze the
//! streams running.

use super::ram::{RamInputs, GB};

/// Prompt positions of a prefill chunk while any session decodes, and of every chunk when the
/// experts do not stream.
pub const DECODE_CHUNK: usize = 256;
/// The most positions `--prefill-chunk auto` gives a chunk: a 2k prompt, most agents' system
/// prompts, in one pass over the experts.
pub const MAX_AUTO_CHUNK: usize = 2048;
/// The range `--prefill-chunk N` accepts.
pub const MIN_CHUNK: usize = 1;
pub const MAX_CHUNK: usize = 8192;
/// The share of the experts' room (budget less dense weights and slack) a bigger chunk's
/// working set may take from the cache: an eighth leaves decode its cache nearly whole (the
/// hit rate falls by at most that share of what the cache held) while GLM-4.5-Air's shapes at
/// 21.5 GB get 1536 positions (`colibri plan`: a 1000-token prompt's experts read once,
/// 43.6 GB, where chunks of 256 read 148.9 GB).
pub const ROOM_SHARE: f64 = 1.0 / 8.0;

/// `--prefill-chunk`: `auto` or a number of positions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChunkRequest {
    #[default]
    Auto,
    Rows(usize),
}

impl ChunkRequest {
    /// `auto` or `N` in [`MIN_CHUNK`]`..=`[`MAX_CHUNK`]; the error names the range.
    pub fn parse(s: &str) -> Result<ChunkRequest, String> {
        let s = s.trim();
        if s.is_empty() || s == "auto" {
            return Ok(ChunkRequest::Auto);
        }
        match s.parse::<usize>() {
            Ok(n) if (MIN_CHUNK..=MAX_CHUNK).contains(&n) => Ok(ChunkRequest::Rows(n)),
            _ => Err(format!(
                "expected `auto` or a number of prompt positions from {MIN_CHUNK} to {MAX_CHUNK}"
            )),
        }
    }
}

/// The chunk chosen at start, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkChoice {
    /// Positions of a chunk when no session decodes.
    pub rows: usize,
    /// Working-set bytes of `rows` rows past those of [`DECODE_CHUNK`] rows: what the cache
    /// gives up while such a chunk runs.
    pub extra_bytes: u64,
    pub why: String,
}

/// Working-set bytes of a `rows`-position chunk past those of [`DECODE_CHUNK`] positions, at
/// `row_bytes` a row.
pub fn extra_bytes(rows: usize, row_bytes: u64) -> u64 {
    rows.saturating_sub(DECODE_CHUNK) as u64 * row_bytes
}

/// Bytes as the chunk's lines say them: tiny models' experts are kilobytes, so megabytes
/// under a tenth of a GB.
pub fn size_text(b: u64) -> String {
    if b as f64 >= 0.1 * GB {
        format!("{:.2} GB", b as f64 / GB)
    } else {
        format!("{:.1} MB", b as f64 / 1e6)
    }
}

/// The chunk for `req` under `inputs` (their `prefill_ws` not yet counted), where holding every
/// routed expert in RAM takes `all_experts` bytes and a batch row's working set is `row_bytes`.
pub fn choose(
    req: ChunkRequest,
    inputs: &RamInputs,
    all_experts: u64,
    row_bytes: u64,
) -> ChunkChoice {
    let gb = size_text;
    let without = RamInputs {
        prefill_ws: 0,
        ..*inputs
    };
    let room = without.expert_room().max(0) as u64;
    if let ChunkRequest::Rows(rows) = req {
        return ChunkChoice {
            rows,
            extra_bytes: extra_bytes(rows, row_bytes),
            why: format!(
                "--prefill-chunk {rows}; its working set {} past {DECODE_CHUNK} positions' comes out of the expert cache while such a chunk runs",
                gb(extra_bytes(rows, row_bytes))
            ),
        };
    }
    if room >= all_experts {
        let spare = room - all_experts;
        let rows = longest(|x| x <= spare, row_bytes);
        let x = extra_bytes(rows, row_bytes);
        let why = if rows == DECODE_CHUNK {
            format!(
                "the routed experts fit the budget ({} of room for {}); the {} left is less than {} positions' working set past {DECODE_CHUNK}'s ({})",
                gb(room),
                gb(all_experts),
                gb(spare),
                2 * DECODE_CHUNK,
                gb(extra_bytes(2 * DECODE_CHUNK, row_bytes))
            )
        } else {
            format!(
                "the routed experts fit the budget ({} of room for {}): the longest chunk whose working set past {DECODE_CHUNK} positions' ({}) fits the {} they leave, so a cold prompt's reads spread over its products and each expert multiplies more rows a pass",
                gb(room),
                gb(all_experts),
                gb(x),
                gb(spare)
            )
        };
        return ChunkChoice {
            rows,
            extra_bytes: x,
            why,
        };
    }
    let allowed = (room as f64 * ROOM_SHARE) as u64;
    // One expert per layer must stay cached whatever the chunk.
    let floor = without.sparse_layers as u64 * without.expert_bytes;
    let rows = longest(
        |x| x <= allowed && room.saturating_sub(x) >= floor,
        row_bytes,
    );
    let x = extra_bytes(rows, row_bytes);
    let why = if rows == DECODE_CHUNK {
        format!(
            "the routed experts stream from disk ({} of room for {}), but {} positions' working set, {} past {DECODE_CHUNK}'s, takes more than 1/{:.0} of that room",
            gb(room),
            gb(all_experts),
            2 * DECODE_CHUNK,
            gb(extra_bytes(2 * DECODE_CHUNK, row_bytes)),
            1.0 / ROOM_SHARE
        )
    } else {
        format!(
            "the routed experts stream from disk ({} of room for {}): a prompt reads them once a chunk, so the longest chunk whose working set past {DECODE_CHUNK} positions' ({}, taken from the expert cache while such a chunk runs) takes at most 1/{:.0} of the room",
            gb(room),
            gb(all_experts),
            gb(x),
            1.0 / ROOM_SHARE
        )
    };
    ChunkChoice {
        rows,
        extra_bytes: x,
        why,
    }
}

/// The longest multiple of [`DECODE_CHUNK`] up to [`MAX_AUTO_CHUNK`] whose working set past
/// [`DECODE_CHUNK`] rows' (at `row_bytes` a row) `fits`; [`DECODE_CHUNK`] when none longer does.
fn longest(fits: impl Fn(u64) -> bool, row_bytes: u64) -> usize {
    (2..=MAX_AUTO_CHUNK / DECODE_CHUNK)
        .rev()
        .map(|k| k * DECODE_CHUNK)
        .find(|&r| fits(extra_bytes(r, row_bytes)))
        .unwrap_or(DECODE_CHUNK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 layers of 256 experts of 20 MB: 51.2 GB of experts.
    fn inputs(budget: u64) -> RamInputs {
        crate::experts::ram::test_inputs(budget)
    }
    const ALL: u64 = 10 * 256 * 20_000_000;

    /// Every expert held: the chunk takes the room the experts leave and no more. By hand,
    /// the room at a budget `b` is b - 2 GB of dense weights - 1.1 GB of KV - the reserve
    /// (`RamInputs::slack`), the experts 51.2 GB.
    #[test]
    fn experts_held_in_ram_get_the_chunk_the_room_they_leave_holds() {
        let spare = |b: u64| inputs(b).expert_room() - ALL as i128;
        // Plenty left: the longest chunk.
        let c = choose(ChunkRequest::Auto, &inputs(100_000_000_000), ALL, 1_000_000);
        assert_eq!((c.rows, c.extra_bytes), (2048, 1792 * 1_000_000));
        assert!(c.why.contains("fit the budget"), "{}", c.why);
        // Room for 1000 extra rows of 1 MB past the experts: 1024 positions (768 extra).
        let b = (50..200_000)
            .map(|k| 50_000_000_000 + k * 1_000_000)
            .find(|&b| spare(b) >= 1_000_000_000)
            .unwrap();
        assert!(spare(b) < 1_001_000_000, "{}", spare(b));
        let c = choose(ChunkRequest::Auto, &inputs(b), ALL, 1_000_000);
        assert_eq!((c.rows, c.extra_bytes), (1024, 768 * 1_000_000));
        // The experts just fit: the decode chunk, and the line says why.
        let b = (0..200_000)
            .map(|k| 50_000_000_000 + k * 1_000_000)
            .find(|&b| spare(b) >= 0)
            .unwrap();
        assert!(spare(b) < 256 * 1_000_000);
        let c = choose(ChunkRequest::Auto, &inputs(b), ALL, 1_000_000);
        assert_eq!((c.rows, c.extra_bytes), (DECODE_CHUNK, 0));
        assert!(c.why.contains("is less than 512 positions"), "{}", c.why);
        // No routed experts to hold (a dense model, or all of them in VRAM): the room is spare.
        let c = choose(ChunkRequest::Auto, &inputs(20_000_000_000), 0, 1_000_000);
        assert_eq!(c.rows, 2048);
    }

    #[test]
    fn streaming_experts_get_the_longest_chunk_an_eighth_of_the_room_holds() {
        // room = 20 - 2 - 6.08 = 11.92 GB, an eighth 1.49 GB: 1792 extra rows of 0.5 MB fit.
        let c = choose(ChunkRequest::Auto, &inputs(20_000_000_000), ALL, 500_000);
        assert_eq!((c.rows, c.extra_bytes), (2048, 1792 * 500_000));
        // 1 MB a row: 1.49 GB holds 1490 extra rows, so 1536 positions (1280 extra).
        let c = choose(ChunkRequest::Auto, &inputs(20_000_000_000), ALL, 1_000_000);
        assert_eq!((c.rows, c.extra_bytes), (1536, 1280 * 1_000_000));
        // A tight budget: room 0.92 GB, an eighth 115 MB, under 256 extra rows of 1 MB.
        let c = choose(ChunkRequest::Auto, &inputs(9_000_000_000), ALL, 1_000_000);
        assert_eq!((c.rows, c.extra_bytes), (DECODE_CHUNK, 0));
        assert!(c.why.contains("more than 1/8"), "{}", c.why);
    }

    #[test]
    fn a_given_chunk_is_kept_and_its_working_set_counted() {
        let c = choose(
            ChunkRequest::Rows(97),
            &inputs(20_000_000_000),
            ALL,
            1_000_000,
        );
        assert_eq!((c.rows, c.extra_bytes), (97, 0));
        let c = choose(
            ChunkRequest::Rows(4096),
            &inputs(100_000_000_000),
            ALL,
            1_000,
        );
        assert_eq!((c.rows, c.extra_bytes), (4096, 3840 * 1_000));
        // The budget counts it: the room shrinks by exactly that.
        let i = inputs(20_000_000_000);
        let counted = RamInputs {
            prefill_ws: c.extra_bytes,
            ..i
        };
        assert_eq!(i.expert_room() - counted.expert_room(), 3_840_000);
    }

    #[test]
    fn the_option_names_its_range() {
        assert_eq!(ChunkRequest::parse("auto"), Ok(ChunkRequest::Auto));
        assert_eq!(ChunkRequest::parse(" 97 "), Ok(ChunkRequest::Rows(97)));
        assert_eq!(ChunkRequest::parse("8192"), Ok(ChunkRequest::Rows(8192)));
        for bad in ["0", "8193", "-1", "big"] {
            let e = ChunkRequest::parse(bad).unwrap_err();
            assert!(e.contains("from 1 to 8192"), "{bad}: {e}");
        }
    }
}
