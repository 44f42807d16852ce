//! The per-conversation KV cache: MLA's compressed latent plus the DSA indexer's keys (GLM-5),
//! or grouped-query attention's keys and values (the other families).
//!
//! Per position and layer MLA keeps only the normalised latent `c` (kv_lora values) and the
//! rotated shared rope key (qk_rope values); every full-indexer layer also keeps its
//! LayerNorm'd, rotated indexer key (index_head_dim values). Grouped-query attention keeps
//! each key-value head's normed, rotated key and its value (`kv_dim` values each). A cache
//! holds one layout or the other; the other's vectors stay empty. This is what `.coli_kv`
//! persists.

use crate::config::{IndexerKind, ModelConfig};

#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    /// (len, kv_lora)
    pub latent: Vec<f32>,
    /// (len, qk_rope)
    pub rope: Vec<f32>,
    /// (len, index_head_dim); empty on shared-indexer layers.
    pub index: Vec<f32>,
    /// Grouped-query attention: (len, kv_heads * head_dim) keys, normed and rotated.
    pub k: Vec<f32>,
    /// Grouped-query attention: (len, kv_heads * head_dim) values.
    pub v: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct KvCache {
    len: usize,
    /// The token fed at each cached position: the conversation history this cache encodes.
    pub tokens: Vec<u32>,
    pub kv_lora: usize,
    pub rope_dim: usize,
    pub index_dim: usize,
    /// Grouped-query attention's key (and value) width per layer; 0 for MLA.
    pub kv_dim: usize,
    pub layers: Vec<LayerKv>,
    has_index: Vec<bool>,
    /// The device copy GPU attention reads; this cache stays the reference (see `gpu::kv`).
    pub(crate) device: crate::gpu::KvMirror,
}

impl LayerKv {
    /// Keeps the first `n` positions' rows.
    fn truncate_rows(
        &mut self,
        n: usize,
        (kv_lora, rope, index, kv): (usize, usize, usize, usize),
    ) {
        self.latent.truncate(n * kv_lora);
        self.rope.truncate(n * rope);
        self.index.truncate(n * index);
        self.k.truncate(n * kv);
        self.v.truncate(n * kv);
    }
}

impl KvCache {
    /// Row widths: (kv_lora, rope, index, kv_dim).
    fn dims(&self) -> (usize, usize, usize, usize) {
        (self.kv_lora, self.rope_dim, self.index_dim, self.kv_dim)
    }

    pub fn new(cfg: &ModelConfig) -> KvCache {
        KvCache {
            len: 0,
            tokens: Vec::new(),
            kv_lora: cfg.mla().map_or(0, |m| m.kv_lora_rank),
            rope_dim: cfg.mla().map_or(0, |m| m.qk_rope_head_dim),
            index_dim: cfg.indexer().map_or(0, |ix| ix.index_head_dim),
            kv_dim: cfg.gqa().map_or(0, |g| g.kv_heads * g.head_dim),
            layers: vec![LayerKv::default(); cfg.num_hidden_layers],
            has_index: (0..cfg.num_hidden_layers)
                .map(|l| cfg.indexer_kind(l) == IndexerKind::Full)
                .collect(),
            device: Default::default(),
        }
    }

    /// A cache of `has_index.len()` layers (the MTP head's own), `has_index[l]` when layer l
    /// keeps indexer keys.
    pub fn with_layers(cfg: &ModelConfig, has_index: Vec<bool>) -> KvCache {
        KvCache {
            len: 0,
            tokens: Vec::new(),
            kv_lora: cfg.mla().map_or(0, |m| m.kv_lora_rank),
            rope_dim: cfg.mla().map_or(0, |m| m.qk_rope_head_dim),
            index_dim: cfg.indexer().map_or(0, |ix| ix.index_head_dim),
            kv_dim: cfg.gqa().map_or(0, |g| g.kv_heads * g.head_dim),
            layers: vec![LayerKv::default(); has_index.len()],
            has_index,
            device: Default::default(),
        }
    }

    /// Number of positions whose keys are stored (in every layer).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn has_index(&self, layer: usize) -> bool {
        self.has_index[layer]
    }

    /// Makes room for `positions` positions in total (tokens and every layer's keys), so
    /// appending up to there never reallocates: a decode step must not pay for (or be timed
    /// with) an amortized regrowth of a long cache.
    pub fn reserve(&mut self, positions: usize) {
        let extra = positions.saturating_sub(self.len);
        self.tokens.reserve(extra);
        for (l, has_index) in self.layers.iter_mut().zip(&self.has_index) {
            l.latent.reserve(extra * self.kv_lora);
            l.rope.reserve(extra * self.rope_dim);
            l.k.reserve(extra * self.kv_dim);
            l.v.reserve(extra * self.kv_dim);
            if *has_index {
                l.index.reserve(extra * self.index_dim);
            }
        }
    }

    /// Forgets every position at or after `n`.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        let dims = self.dims();
        for l in &mut self.layers {
            l.truncate_rows(n, dims);
        }
        self.tokens.truncate(n);
        self.len = n;
        self.cut_device_rows();
    }

    /// Tells the device mirror which rows each layer kept (see `gpu::kv`), its parts in the
    /// order the attention syncs them: MLA's latent, rope and index keys, or grouped-query
    /// attention's keys and values.
    fn cut_device_rows(&mut self) {
        for (i, l) in self.layers.iter().enumerate() {
            let lens = if self.kv_dim == 0 {
                [l.latent.len(), l.rope.len(), l.index.len()]
            } else {
                [l.k.len(), l.v.len(), 0]
            };
            self.device.keep(i, lens);
        }
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Appends positions `self.len()..upto` of `other`, whose history must start with this
    /// one's (the rows of a shared prefix are the same numbers in every cache that holds it:
    /// each position's keys depend only on the tokens up to it).
    pub fn extend_from(&mut self, other: &KvCache, upto: usize) {
        let from = self.len;
        debug_assert!(upto <= other.len && other.tokens[..from] == self.tokens[..]);
        if upto <= from {
            return;
        }
        for ((dst, src), has_index) in self
            .layers
            .iter_mut()
            .zip(&other.layers)
            .zip(&self.has_index)
        {
            dst.latent
                .extend_from_slice(&src.latent[from * self.kv_lora..upto * self.kv_lora]);
            dst.rope
                .extend_from_slice(&src.rope[from * self.rope_dim..upto * self.rope_dim]);
            dst.k
                .extend_from_slice(&src.k[from * self.kv_dim..upto * self.kv_dim]);
            dst.v
                .extend_from_slice(&src.v[from * self.kv_dim..upto * self.kv_dim]);
            if *has_index {
                dst.index
                    .extend_from_slice(&src.index[from * self.index_dim..upto * self.index_dim]);
            }
        }
        self.tokens.extend_from_slice(&other.tokens[from..upto]);
        self.len = upto;
    }

    /// Drops keys appended by a forward that failed part-way, so the cache stays consistent.
    pub(crate) fn rollback(&mut self) {
        let n = self.len;
        let dims = self.dims();
        for l in &mut self.layers {
            l.truncate_rows(n, dims);
        }
        self.cut_device_rows();
    }

    /// Called by the forward after every layer appended its `n` new positions.
    pub(crate) fn commit(&mut self, tokens: &[u32]) {
        self.len += tokens.len();
        self.tokens.extend_from_slice(tokens);
        debug_assert!(self
            .layers
            .iter()
            .all(|l| l.latent.len() == self.len * self.kv_lora
                && l.k.len() == self.len * self.kv_dim));
    }

    /// Bytes of one position across all layers (latent + rope + indexer keys), as f32.
    pub fn bytes_per_position(&self) -> usize {
        let per_layer = (self.kv_lora + self.rope_dim + 2 * self.kv_dim) * 4;
        let index = self.has_index.iter().filter(|h| **h).count() * self.index_dim * 4;
        per_layer * self.layers.len() + index
    }
}

impl KvCache {
    /// Appends one `.coli_kv` record of position `pos` (token, then per layer latent + rope,
    /// then per full-indexer layer the indexer key), little-endian.
    pub fn write_record(&self, pos: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.tokens[pos] as i32).to_le_bytes());
        for l in &self.layers {
            for v in &l.latent[pos * self.kv_lora..(pos + 1) * self.kv_lora] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            for v in &l.rope[pos * self.rope_dim..(pos + 1) * self.rope_dim] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            for part in [&l.k, &l.v] {
                for v in &part[pos * self.kv_dim..(pos + 1) * self.kv_dim] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        for (i, l) in self.layers.iter().enumerate() {
            if self.has_index[i] {
                for v in &l.index[pos * self.index_dim..(pos + 1) * self.index_dim] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }

    /// The inverse of `write_record`: `body` is the record after its token.
    pub fn push_record(&mut self, token: u32, body: &[u8]) {
        let mut vals = body
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        for l in &mut self.layers {
            l.latent.extend(vals.by_ref().take(self.kv_lora));
            l.rope.extend(vals.by_ref().take(self.rope_dim));
            l.k.extend(vals.by_ref().take(self.kv_dim));
            l.v.extend(vals.by_ref().take(self.kv_dim));
        }
        for (i, l) in self.layers.iter_mut().enumerate() {
            if self.has_index[i] {
                l.index.extend(vals.by_ref().take(self.index_dim));
            }
        }
        self.tokens.push(token);
        self.len += 1;
    }
}
