//! The per-conversation KV cache: per layer, MLA's compressed latent plus the DSA indexer's
//! keys (GLM-5, DeepSeek-V3/V3.2), or grouped-query attention's keys and values (Qwen3-MoE,
//! GLM-4.x), as [`LayerKv`] says.
//!
//! Per position and layer MLA keeps only the normalised latent `c` (kv_lora values) and the
//! rotated shared rope key (qk_rope values); every full-indexer layer also keeps its
//! LayerNorm'd, rotated indexer key (index_head_dim values). Grouped-query attention keeps
//! each key-value head's normed, rotated key and its value (`kv_dim` values each). This is
//! what `.coli_kv` persists.
//!
//! A Gated DeltaNet layer (Qwen3.5-MoE) keeps no row per position: its conv state and
//! recurrent state ([`LinearKv`]) summarise every position so far. Such a state cannot be cut
//! back to an earlier position, so cutting a cache that holds one (`truncate` below `len`)
//! forgets the whole cache and the caller feeds its history again from position 0.

use crate::config::{Attn, IndexerKind, ModelConfig};

/// One layer's cached keys, in the layout of the model's attention.
#[derive(Clone, Debug)]
pub enum LayerKv {
    Mla(MlaKv),
    Gqa(GqaKv),
    /// A Gated DeltaNet layer's state after `pos` positions.
    Linear(LinearKv),
    /// A DeepSeek-V4 layer's state after `pos` positions (`Dsv4Kv`).
    Dsv4(Box<Dsv4Kv>),
}

/// A DeepSeek-V4 layer's attention state (`dsv4_attn.rs`): the sliding window's keys, each
/// compressor's open window, overlap and closed entries. Like a DeltaNet state it is kept
/// whole, not as a row per position: a cut below `pos` forgets it (the cache is then fed
/// again from 0) unless the verify trail of the latest step reaches there (`dsv4_trail.rs`),
/// and `.coli_kv` saves it in the `.state` snapshot (`kv_state.rs`).
#[derive(Clone, Debug, Default)]
pub struct Dsv4Kv {
    pub(crate) state: super::dsv4_attn::LayerState,
    /// Positions absorbed.
    pub pos: usize,
}

/// A Gated DeltaNet layer's state (`delta_net.rs`).
#[derive(Clone, Debug, Default)]
pub struct LinearKv {
    /// (conv_dim, conv_kernel - 1): each channel's last inputs, oldest first.
    pub conv: Vec<f32>,
    /// (value_heads, key_head_dim, value_head_dim).
    pub state: Vec<f32>,
    /// Positions absorbed.
    pub pos: usize,
}

impl LinearKv {
    fn zeroed(d: &crate::config::DeltaNetConfig) -> LinearKv {
        LinearKv {
            conv: vec![0.0; d.conv_state_len()],
            state: vec![0.0; d.state_len()],
            pos: 0,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct MlaKv {
    /// (len, kv_lora)
    pub latent: Vec<f32>,
    /// (len, qk_rope)
    pub rope: Vec<f32>,
    /// (len, index_head_dim); empty on shared-indexer layers.
    pub index: Vec<f32>,
}

#[derive(Clone, Debug, Default)]
pub struct GqaKv {
    /// (len, kv_heads * head_dim) keys, normed and rotated.
    pub k: Vec<f32>,
    /// (len, kv_heads * head_dim) values.
    pub v: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct KvCache {
    len: usize,
    /// The token fed at each cached position: the conversation history this cache encodes.
    pub tokens: Vec<u32>,
    /// MLA's row widths (0 for grouped-query attention).
    pub kv_lora: usize,
    pub rope_dim: usize,
    pub index_dim: usize,
    /// Grouped-query attention's key (and value) width per layer; 0 for MLA.
    pub kv_dim: usize,
    pub layers: Vec<LayerKv>,
    has_index: Vec<bool>,
    /// The device copy GPU attention reads; this cache stays the reference (see `gpu::kv`).
    pub(crate) device: crate::gpu::KvMirror,
    /// Saved recurrent states, so a cut can go back to them (`kv_snap.rs`).
    pub(crate) snaps: super::kv_snap::Snaps,
    /// DeepSeek-V4's layers' f32 values for the RAM clamp: fixed, and per position
    /// (`dsv4_state::sizes`); 0 for other families.
    dsv4_values: (usize, usize),
}

/// Row widths: (kv_lora, rope, index, kv_dim).
type Dims = (usize, usize, usize, usize);

impl LayerKv {
    /// An empty layer `l` of `cfg`'s attention.
    fn empty(cfg: &ModelConfig, l: usize) -> LayerKv {
        match &cfg.attn {
            Attn::Mla(_) => LayerKv::Mla(MlaKv::default()),
            Attn::Gqa(_) => LayerKv::Gqa(GqaKv::default()),
            Attn::Hybrid(h) => match h.mixer(l) {
                crate::config::MixerKind::Full => LayerKv::Gqa(GqaKv::default()),
                crate::config::MixerKind::Linear => LayerKv::Linear(LinearKv::zeroed(&h.delta)),
            },
            Attn::Dsv4(_) => LayerKv::Dsv4(Box::default()),
        }
    }

    /// MLA's keys, when the layer holds them.
    pub fn mla(&self) -> Option<&MlaKv> {
        match self {
            LayerKv::Mla(m) => Some(m),
            LayerKv::Gqa(_) | LayerKv::Linear(_) | LayerKv::Dsv4(_) => None,
        }
    }

    /// Grouped-query attention's keys and values, when the layer holds them.
    pub fn gqa(&self) -> Option<&GqaKv> {
        match self {
            LayerKv::Gqa(g) => Some(g),
            LayerKv::Mla(_) | LayerKv::Linear(_) | LayerKv::Dsv4(_) => None,
        }
    }

    /// A DeltaNet layer's state, when the layer holds one.
    pub fn linear(&self) -> Option<&LinearKv> {
        match self {
            LayerKv::Linear(s) => Some(s),
            _ => None,
        }
    }

    /// Whether the layer keeps a state rather than a row per position (DeltaNet, V4).
    pub fn is_state(&self) -> bool {
        matches!(self, LayerKv::Linear(_) | LayerKv::Dsv4(_))
    }

    /// Keeps the first `n` positions' rows.
    fn truncate_rows(&mut self, n: usize, (kv_lora, rope, index, kv): Dims) {
        match self {
            LayerKv::Mla(m) => {
                m.latent.truncate(n * kv_lora);
                m.rope.truncate(n * rope);
                m.index.truncate(n * index);
            }
            LayerKv::Gqa(g) => {
                g.k.truncate(n * kv);
                g.v.truncate(n * kv);
            }
            // Only a cut to 0 reaches here (`KvCache::truncate`): the state of nothing.
            LayerKv::Linear(s) if n < s.pos => {
                s.conv.fill(0.0);
                s.state.fill(0.0);
                s.pos = 0;
            }
            LayerKv::Linear(_) => {}
            LayerKv::Dsv4(s) if n < s.pos => **s = Dsv4Kv::default(),
            LayerKv::Dsv4(_) => {}
        }
    }

    /// Its parts in the order the attention syncs them to the device mirror: MLA's latent,
    /// rope and index keys, or grouped-query attention's keys and values (and nothing).
    pub fn parts(&self) -> [&[f32]; 3] {
        match self {
            LayerKv::Mla(m) => [&m.latent, &m.rope, &m.index],
            LayerKv::Gqa(g) => [&g.k, &g.v, &[]],
            // Nothing per position: no device mirror.
            LayerKv::Linear(_) | LayerKv::Dsv4(_) => [&[], &[], &[]],
        }
    }

    /// Positions held (rows of the latent or of the keys), for the width of a row in `dims`.
    fn rows(&self, (kv_lora, _, _, kv): Dims) -> usize {
        match self {
            LayerKv::Mla(m) => m.latent.len().checked_div(kv_lora).unwrap_or(0),
            LayerKv::Gqa(g) => g.k.len().checked_div(kv).unwrap_or(0),
            LayerKv::Linear(s) => s.pos,
            LayerKv::Dsv4(s) => s.pos,
        }
    }
}

impl KvCache {
    fn dims(&self) -> Dims {
        (self.kv_lora, self.rope_dim, self.index_dim, self.kv_dim)
    }

    pub fn new(cfg: &ModelConfig) -> KvCache {
        let has_index = (0..cfg.num_hidden_layers)
            .map(|l| cfg.indexer_kind(l) == IndexerKind::Full)
            .collect();
        KvCache::with_layers(cfg, has_index)
    }

    /// A cache of `has_index.len()` layers (the MTP head's own), `has_index[l]` when layer l
    /// keeps indexer keys.
    pub fn with_layers(cfg: &ModelConfig, has_index: Vec<bool>) -> KvCache {
        let dsv4_values =
            (cfg.dsv4()).map_or((0, 0), |d| super::dsv4_state::sizes(d, has_index.len()));
        KvCache {
            len: 0,
            tokens: Vec::new(),
            kv_lora: cfg.mla().map_or(0, |m| m.kv_lora_rank),
            rope_dim: cfg.mla().map_or(0, |m| m.qk_rope_head_dim),
            index_dim: cfg.indexer().map_or(0, |ix| ix.index_head_dim),
            kv_dim: cfg.gqa().map_or(0, |g| g.kv_heads * g.head_dim),
            layers: (0..has_index.len())
                .map(|l| LayerKv::empty(cfg, l))
                .collect(),
            has_index,
            device: Default::default(),
            snaps: Default::default(),
            dsv4_values,
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
            match l {
                LayerKv::Mla(m) => {
                    m.latent.reserve(extra * self.kv_lora);
                    m.rope.reserve(extra * self.rope_dim);
                    if *has_index {
                        m.index.reserve(extra * self.index_dim);
                    }
                }
                LayerKv::Gqa(g) => {
                    g.k.reserve(extra * self.kv_dim);
                    g.v.reserve(extra * self.kv_dim);
                }
                LayerKv::Linear(_) | LayerKv::Dsv4(_) => {}
            }
        }
    }

    /// Forgets every position at or after `n`; a cache with a recurrent state (which
    /// cannot be cut) goes back to its latest saved state at or before `n` (`kv_snap.rs`),
    /// else forgets every position: `len()` says where it stands.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        let n = if self.has_recurrent_state() {
            self.restore_at_most(n)
        } else {
            n
        };
        let dims = self.dims();
        for l in &mut self.layers {
            l.truncate_rows(n, dims);
        }
        self.tokens.truncate(n);
        self.len = n;
        self.cut_device_rows();
    }

    /// Tells the device mirror which rows each layer kept (see `gpu::kv`).
    fn cut_device_rows(&mut self) {
        for (i, l) in self.layers.iter().enumerate() {
            self.device.keep(i, l.parts().map(<[f32]>::len));
        }
    }

    /// Whether a layer keeps a recurrent state (Qwen3.5-MoE's DeltaNet layers): the cache
    /// can then only be cut to 0, and a prefix of another cache adopted only whole.
    pub fn has_recurrent_state(&self) -> bool {
        self.layers.iter().any(LayerKv::is_state)
    }

    /// Whether a layer keeps DeepSeek-V4's state, which no mark saves: a cut goes back to 0,
    /// unless it falls within the latest verify step (its trail, `dsv4_trail.rs`).
    pub(crate) fn has_dsv4_state(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerKv::Dsv4(_)))
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Appends positions `self.len()..upto` of `other`, whose history must start with this
    /// one's (the rows of a shared prefix are the same numbers in every cache that holds it:
    /// each position's keys depend only on the tokens up to it). Both are caches of one model,
    /// so their layers have one layout.
    pub fn extend_from(&mut self, other: &KvCache, upto: usize) {
        let from = self.len;
        debug_assert!(upto <= other.len && other.tokens[..from] == self.tokens[..]);
        if upto <= from {
            return;
        }
        let (kv_lora, rope, index, kv) = self.dims();
        for ((dst, src), has_index) in self
            .layers
            .iter_mut()
            .zip(&other.layers)
            .zip(&self.has_index)
        {
            debug_assert_eq!(std::mem::discriminant(dst), std::mem::discriminant(src));
            match (dst, src) {
                (LayerKv::Mla(d), LayerKv::Mla(s)) => {
                    d.latent
                        .extend_from_slice(&s.latent[from * kv_lora..upto * kv_lora]);
                    d.rope.extend_from_slice(&s.rope[from * rope..upto * rope]);
                    if *has_index {
                        d.index
                            .extend_from_slice(&s.index[from * index..upto * index]);
                    }
                }
                (LayerKv::Gqa(d), LayerKv::Gqa(s)) => {
                    d.k.extend_from_slice(&s.k[from * kv..upto * kv]);
                    d.v.extend_from_slice(&s.v[from * kv..upto * kv]);
                }
                // A state is adopted whole, or from `other`'s mark at `upto` (below): the
                // caller checks one of them holds (`can_extend_from`).
                (LayerKv::Linear(d), LayerKv::Linear(s)) if upto == s.pos => {
                    d.clone_from(s);
                }
                (LayerKv::Dsv4(d), LayerKv::Dsv4(s)) if upto == s.pos => {
                    d.clone_from(s);
                }
                // Caches of one model have one layout (asserted above).
                _ => {}
            }
        }
        if other.has_recurrent_state() && upto != other.len {
            let adopted = self.adopt_mark(other, upto);
            debug_assert!(
                adopted,
                "a recurrent state adopted short of its end needs a mark"
            );
        }
        self.snaps_after_failure();
        self.tokens.extend_from_slice(&other.tokens[from..upto]);
        self.len = upto;
    }

    /// Whether `extend_from(other, upto)` can give this cache `other`'s first `upto`
    /// positions: always, unless a recurrent state would have to be cut (it is only known
    /// at `other.len()` and at `other`'s marks).
    pub fn can_extend_from(&self, other: &KvCache, upto: usize) -> bool {
        upto <= self.len
            || !other.has_recurrent_state()
            || upto == other.len
            || other.has_mark(upto)
    }

    /// Drops keys appended by a forward that failed part-way, so the cache stays consistent.
    /// A recurrent state advanced part-way cannot be undone: the cache then goes back to its
    /// latest saved state (`kv_snap.rs`), else to 0, and keeps the tokens of the positions it
    /// lost (`take_lost`) so that a retry feeds them again before its own.
    pub(crate) fn rollback(&mut self) {
        self.snaps_after_failure();
        if self.has_recurrent_state()
            && self.layers.iter().any(|l| match l {
                LayerKv::Linear(s) => s.pos != self.len,
                LayerKv::Dsv4(s) => s.pos != self.len,
                _ => false,
            })
        {
            let p = self.restore_at_most(self.len);
            let lost = self.tokens.split_off(p);
            self.len = p;
            let dims = self.dims();
            for l in &mut self.layers {
                l.truncate_rows(p, dims);
            }
            self.cut_device_rows();
            self.note_lost(lost);
            return;
        }
        let n = self.len;
        let dims = self.dims();
        for l in &mut self.layers {
            l.truncate_rows(n, dims);
        }
        self.cut_device_rows();
    }

    /// Called by the forward after every layer appended its `n` new positions.
    pub(crate) fn commit(&mut self, tokens: &[u32]) {
        self.snaps_after_forward(self.len, tokens.len());
        self.len += tokens.len();
        self.tokens.extend_from_slice(tokens);
        let dims = self.dims();
        debug_assert!(self.layers.iter().all(|l| l.rows(dims) == self.len));
    }

    /// Bytes of one position across all layers (latent + rope + indexer keys, or keys and
    /// values), as f32.
    pub fn bytes_per_position(&self) -> usize {
        let per_layer = (self.kv_lora + self.rope_dim + 2 * self.kv_dim) * 4;
        let index = self.has_index.iter().filter(|h| **h).count() * self.index_dim * 4;
        // A DeltaNet layer keeps no row per position (its state is `state_bytes`).
        let rows = self
            .layers
            .iter()
            .filter(|l| !matches!(l, LayerKv::Linear(_)))
            .count();
        per_layer * rows + index + self.dsv4_values.1 * 4
    }

    /// Bytes of the recurrent states (conv and state, f32; DeepSeek-V4's window and open
    /// compressor windows, full), whatever the length: 0 without DeltaNet or V4 layers.
    pub fn state_bytes(&self) -> usize {
        let values: usize = (self.layers.iter())
            .filter_map(LayerKv::linear)
            .map(|s| s.conv.len() + s.state.len())
            .sum();
        (values + self.dsv4_values.0) * 4
    }

    /// The most a session's cache takes at `ctx` positions with drafts of up to `max_draft`
    /// tokens: its rows, and every copy of the recurrent state kept for cuts
    /// ([`super::kv_snap::state_copies`]). DeepSeek-V4 keeps no marks and its verify trail
    /// (`dsv4_trail.rs`) holds one copy of the open windows plus a row per fed row, inside
    /// what the copies count.
    pub fn session_bytes(&self, ctx: usize, max_draft: usize) -> usize {
        ctx * self.bytes_per_position()
            + self.state_bytes() * super::kv_snap::state_copies(max_draft)
    }
}

impl KvCache {
    /// Appends one `.coli_kv` record of position `pos` (token, then per layer latent + rope or
    /// keys + values, then per full-indexer layer the indexer key), little-endian.
    pub fn write_record(&self, pos: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.tokens[pos] as i32).to_le_bytes());
        let mut put = |v: &[f32], w: usize| {
            for x in &v[pos * w..(pos + 1) * w] {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
        for l in &self.layers {
            match l {
                LayerKv::Mla(m) => {
                    put(&m.latent, self.kv_lora);
                    put(&m.rope, self.rope_dim);
                }
                LayerKv::Gqa(g) => {
                    put(&g.k, self.kv_dim);
                    put(&g.v, self.kv_dim);
                }
                // No row per position (the state is saved apart, `kv_file.rs`).
                LayerKv::Linear(_) | LayerKv::Dsv4(_) => {}
            }
        }
        for (l, has_index) in self.layers.iter().zip(&self.has_index) {
            if let (LayerKv::Mla(m), true) = (l, *has_index) {
                put(&m.index, self.index_dim);
            }
        }
    }

    /// The inverse of `write_record`: `body` is the record after its token.
    pub fn push_record(&mut self, token: u32, body: &[u8]) {
        let mut vals = body
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        for l in &mut self.layers {
            match l {
                LayerKv::Mla(m) => {
                    m.latent.extend(vals.by_ref().take(self.kv_lora));
                    m.rope.extend(vals.by_ref().take(self.rope_dim));
                }
                LayerKv::Gqa(g) => {
                    g.k.extend(vals.by_ref().take(self.kv_dim));
                    g.v.extend(vals.by_ref().take(self.kv_dim));
                }
                LayerKv::Linear(_) | LayerKv::Dsv4(_) => {}
            }
        }
        for (l, has_index) in self.layers.iter_mut().zip(&self.has_index) {
            if let (LayerKv::Mla(m), true) = (l, *has_index) {
                m.index.extend(vals.by_ref().take(self.index_dim));
            }
        }
        self.tokens.push(token);
        self.len += 1;
    }
}
