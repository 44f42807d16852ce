//! DeepSeek-V4's forward pass in f32, one token at a time (transformers' `DeepseekV4Model`):
//! the embedding copied into `hc_mult` streams; per layer the attention and the feed-forward,
//! each between a hyper-connection's fold and put-back; the hyper-head's fold, the final norm
//! and the output head. Prefill is a loop of these steps: the compressors close a window the
//! token that fills it, and the result equals transformers' whole-sequence forward.
//!
//! It stands apart from [`super::Model`] (whose residual stream is one row per token): the
//! state of a sequence is a [`Dsv4State`] (the window's keys, the compressors' buffers,
//! overlap and entries, per layer).

use super::dsv4_attn::{rms, Attention, LayerState};
use super::dsv4_hc::{layer_prefix, pick, HyperConnection, HyperHead, Mat};
use super::dsv4_moe::Moe;
use super::rope::Rope;
use crate::config::{Dsv4Config, ModelConfig};
use crate::error::EngineError;
use crate::weights::ShardSet;

struct Layer {
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn: Attention,
    moe: Moe,
}

pub struct Dsv4Model {
    cfg: ModelConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    head: HyperHead,
    norm: Vec<f32>,
    lm_head: Mat,
    main_rope: Rope,
    compress_rope: Rope,
}

/// One sequence's state: per layer, its attention's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dsv4State {
    pub(crate) layers: Vec<LayerState>,
    /// Positions fed so far.
    pub len: usize,
}

impl Dsv4Model {
    pub fn load(s: &ShardSet, cfg: ModelConfig) -> Result<Self, EngineError> {
        let d: Dsv4Config = cfg
            .dsv4()
            .cloned()
            .ok_or_else(|| EngineError::Load(format!("{:?} is not DeepSeek-V4", cfg.family)))?;
        let (h, v, eps) = (cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = layer_prefix(s, l);
            let hc = |which: &str| {
                HyperConnection::load(
                    s,
                    &p,
                    which,
                    d.hc_mult,
                    h,
                    d.hc_sinkhorn_iters,
                    d.hc_eps,
                    eps,
                )
            };
            layers.push(Layer {
                attn_hc: hc("attn")?,
                ffn_hc: hc("ffn")?,
                input_norm: s.read_f32(&format!("{p}.attn_norm.weight"), &[h])?,
                post_norm: s.read_f32(&format!("{p}.ffn_norm.weight"), &[h])?,
                attn: Attention::load(s, &p, l, &d, h, cfg.num_attention_heads, eps)?,
                moe: Moe::load(s, &cfg, &p, d.hash[l], d.swiglu_limit)?,
            });
        }
        // Under transformers' names (as it saves them) or the published checkpoints'.
        let name = |a: &str, b: &str| pick(s, &[a.to_string(), b.to_string()]);
        let embed = s.read_f32(&name("model.embed_tokens.weight", "embed.weight"), &[v, h])?;
        let lm_head = match cfg.tie_word_embeddings {
            true => Mat {
                rows: v,
                cols: h,
                w: embed.clone(),
            },
            false => Mat::read(s, &name("head.weight", "lm_head.weight"), v, h)?,
        };
        let compress_rope = match &d.compress_yarn {
            Some(y) => Rope::yarn(d.rope_dim, d.compress_rope_theta, y),
            None => Rope::new(d.rope_dim, d.compress_rope_theta),
        };
        Ok(Dsv4Model {
            embed,
            layers,
            head: HyperHead::load(s, d.hc_mult, h, d.hc_eps, eps)?,
            norm: s.read_f32(&name("model.norm.weight", "norm.weight"), &[h])?,
            lm_head,
            main_rope: Rope::new(d.rope_dim, cfg.rope_theta),
            compress_rope,
            cfg,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn new_state(&self) -> Dsv4State {
        Dsv4State {
            layers: vec![LayerState::default(); self.layers.len()],
            len: 0,
        }
    }

    /// Feeds `token` at position `st.len` and returns its logits.
    pub fn step(&self, st: &mut Dsv4State, token: u32) -> Result<Vec<f32>, EngineError> {
        let (h, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        if token as usize >= v {
            return Err(EngineError::Usage(format!(
                "token id {token} is outside the vocabulary (0..{v})"
            )));
        }
        let hc = self.cfg.dsv4().map_or(1, |d| d.hc_mult);
        let row = &self.embed[token as usize * h..(token as usize + 1) * h];
        let mut x: Vec<f32> = (0..hc).flat_map(|_| row.iter().copied()).collect();
        let pos = st.len;
        let eps = self.cfg.rms_norm_eps;
        for (layer, ls) in self.layers.iter().zip(st.layers.iter_mut()) {
            let mix = layer.attn_hc.mix(&x);
            let mut a = mix.collapsed.clone();
            rms(&mut a, &layer.input_norm, eps);
            let y = layer
                .attn
                .forward(&a, pos, ls, &self.main_rope, &self.compress_rope);
            x = mix.put_back(&x, &y);
            let mix = layer.ffn_hc.mix(&x);
            let mut b = mix.collapsed.clone();
            rms(&mut b, &layer.post_norm, eps);
            let z = layer.moe.forward(&b, token);
            x = mix.put_back(&x, &z);
        }
        st.len += 1;
        let mut out = self.head.fold(&x);
        rms(&mut out, &self.norm, eps);
        Ok(self.lm_head.apply(&out))
    }
}

/// The model of `dirs` when it is DeepSeek-V4 (`None` for another family).
pub fn load_if_dsv4(dirs: &[std::path::PathBuf]) -> Result<Option<Dsv4Model>, EngineError> {
    let Some(dir) = dirs.iter().find(|d| d.join("config.json").exists()) else {
        return Ok(None);
    };
    let cfg = ModelConfig::load(dir)?;
    if cfg.dsv4().is_none() {
        return Ok(None);
    }
    let s = ShardSet::open(dirs)?;
    Dsv4Model::load(&s, cfg).map(Some)
}

/// `colibri validate` on DeepSeek-V4: the teacher-forced logits of `full` (one step a token)
/// and the greedy continuation of `prompt` to `full`'s length, as the engine's check gives
/// them for the other families.
pub fn teacher_forced_and_greedy(
    m: &Dsv4Model,
    full: &[u32],
    prompt: &[u32],
) -> Result<(Vec<f32>, Vec<u32>), EngineError> {
    let mut st = m.new_state();
    let mut tf = Vec::with_capacity(full.len() * m.cfg.vocab_size);
    for &t in full {
        tf.extend(m.step(&mut st, t)?);
    }
    let mut st = m.new_state();
    let mut logits = Vec::new();
    for &t in prompt {
        logits = m.step(&mut st, t)?;
    }
    let mut generated = Vec::new();
    while prompt.len() + generated.len() < full.len() && !logits.is_empty() {
        let t = super::ops::argmax(&logits) as u32;
        generated.push(t);
        logits = m.step(&mut st, t)?;
    }
    Ok((tf, generated))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-deepseek-v4")
    }

    fn load() -> Dsv4Model {
        let dir = fixture();
        let cfg = ModelConfig::load(&dir).unwrap();
        let s = ShardSet::open(&[dir]).unwrap();
        Dsv4Model::load(&s, cfg).unwrap()
    }

    fn ids(v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    fn argmax(x: &[f32]) -> u32 {
        let mut best = 0;
        for (i, v) in x.iter().enumerate() {
            if *v > x[best] {
                best = i;
            }
        }
        best as u32
    }

    /// Teacher-forced over the oracle's whole sequence: every position's argmax and logits as
    /// transformers' uncached forward gives them; then greedy from the prompt alone, token
    /// for token the oracle's continuation.
    fn check(case: &str) {
        let m = load();
        let dir = fixture();
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("ref.json")).unwrap()).unwrap();
        let c = &r[case];
        let full = ids(&c["full_ids"]);
        let prompt = ids(&c["prompt_ids"]);
        let tf = ids(&c["tf_pred"]);
        let raw = std::fs::read(dir.join(c["logits_file"].as_str().unwrap())).unwrap();
        let want = crate::weights::f32_le(&raw);
        let v = m.config().vocab_size;
        let mut st = m.new_state();
        let mut worst = 0f32;
        for (p, &t) in full.iter().enumerate() {
            let got = m.step(&mut st, t).unwrap();
            assert_eq!(argmax(&got), tf[p], "{case}: teacher-forced argmax at {p}");
            for (g, w) in got.iter().zip(&want[p * v..(p + 1) * v]) {
                worst = worst.max((g - w).abs());
            }
        }
        assert!(worst < 1e-3, "{case}: logits differ by up to {worst}");
        let mut st = m.new_state();
        let mut seq = prompt.clone();
        let mut logits = Vec::new();
        for &t in &prompt {
            logits = m.step(&mut st, t).unwrap();
        }
        while seq.len() < full.len() {
            let t = argmax(&logits);
            seq.push(t);
            logits = m.step(&mut st, t).unwrap();
        }
        assert_eq!(seq, full, "{case}: greedy continuation");
    }

    #[test]
    fn short_case_is_token_exact_against_transformers() {
        check("short");
    }

    #[test]
    fn long_case_past_every_window_and_rate_is_token_exact() {
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture().join("ref.json")).unwrap())
                .unwrap();
        let n = r["long"]["full_ids"].as_array().unwrap().len();
        let cfg = ModelConfig::load(&fixture()).unwrap();
        let d = cfg.dsv4().unwrap();
        // The case is long enough to mean something: past the window, several HCA blocks,
        // and more CSA entries than the indexer keeps.
        assert!(n > 2 * d.sliding_window && n >= 4 * d.hca_rate);
        assert!(n / d.csa_rate > 2 * d.index_topk);
        assert!(r["long"]["sparse_rows"].as_u64().unwrap() > 0);
        check("long");
    }

    #[test]
    fn a_state_copied_midway_resumes_exactly() {
        let m = load();
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture().join("ref.json")).unwrap())
                .unwrap();
        let full = ids(&r["long"]["full_ids"]);
        let mut a = m.new_state();
        for &t in &full[..21] {
            m.step(&mut a, t).unwrap();
        }
        let mut b = a.clone();
        for &t in &full[21..] {
            assert_eq!(m.step(&mut a, t).unwrap(), m.step(&mut b, t).unwrap());
        }
        assert_eq!(a, b);
    }
}
