//! The engine: a loaded model with its tokenizer, stop tokens, expert tiers and the sessions
//! it serves. Every subcommand starts one with [`Engine::start`] (or [`Engine::open`] for a
//! bare model) and drives it the same way: [`Engine::begin`] a request on a session, then
//! [`Engine::step`] until it is done; several sessions step together in one batched forward.
//! The engine never sees stdout: the protocol layer turns a [`StepReport`] into frames.

mod admit;
pub mod answer;
pub mod chat;
mod chat_dsv4;
mod chat_minimax;
mod checkpoint_chat;
pub mod conversation;
pub mod ctx;
pub mod facts;
mod grammar_turn;
pub mod harmony;
mod model_files;
mod prefix;
mod prefix_cache;
mod pyjson;
pub mod report;
mod session;
pub mod spec;
pub mod start;
pub mod state;
mod step;
mod strftime;
mod synthetic;
mod tenant;
mod tiers;
mod tiers_report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::EngineError;
use crate::identity::ModelIdentity;
use crate::kv_file::{KvBinding, KvFile, KvShape};
use crate::model::{LoadOptions, Model};
use crate::tokenizer::{ChatText, Tokenizer};
use crate::weights::{Dtype, ShardSet};

pub use admit::{AdmitRequest, Admitted, PromptInput, PromptToken, Refusal, READ_OUT_BLOCK};
pub use model_files::{template_origin, ModelFiles};
pub use prefix::{Adopted, PromptPlan};
pub use prefix_cache::PrefixCacheOptions;
pub use session::{Finish, Phase, Session, TurnOutcome, TurnSpec};
pub use step::{Event, StepReport, PREFILL_CHUNK};
pub use tenant::Tenant;
pub use tiers::tier_start;
pub use tiers_report::TiersReport;

/// Every field is private: a front (serve, api, cmd) reads what it needs through the methods
/// below and their report types ([`TiersReport`], [`Session`]'s counts), never the model, the
/// KV caches or the expert store themselves.
pub struct Engine {
    model: Model,
    tokenizer: Tokenizer,
    /// Config `eos_token_id` list plus `<|endoftext|>`.
    stops: Vec<u32>,
    /// The model directories, first one holding config.json and tokenizer.json.
    dirs: Vec<PathBuf>,
    load_s: f64,
    /// The context of every session (`--ctx`).
    ctx: usize,
    sessions: Vec<Session>,
    /// The last step's logits, one row per session that sampled.
    logits: Vec<f32>,
    /// Where the next scan for a prefill chunk starts (round robin).
    prefill_cursor: usize,
    /// Prompt positions of a prefill chunk while no session decodes (`experts/chunk.rs`:
    /// longer where the experts stream from disk); while one does, at most
    /// [`PREFILL_CHUNK`].
    prefill_chunk: usize,
    /// The step's plan, kept so a step does not allocate.
    plan: Vec<(usize, step::Role)>,
    /// The vocabulary as a byte trie for grammar masks, built at the first constrained
    /// request.
    grammar_trie: Option<Arc<crate::grammar::TokenTrie>>,
    /// Speculative decoding settings and figures (`--draft`).
    spec: spec::SpecEngine,
    /// The shards the model was loaded from (the identity fingerprints them).
    shards: Arc<ShardSet>,
    /// The compute formats in words: part of what a saved conversation is bound to.
    formats: String,
    /// What saved state is bound to; computed by [`Engine::start_sessions`] when state is
    /// read or saved.
    identity: Option<ModelIdentity>,
    /// The checkpoint's own chat template (`chat_template.jinja` or tokenizer_config.json's
    /// `chat_template`); `None`: the family's built-in one.
    checkpoint_chat: Option<checkpoint_chat::CheckpointTemplate>,
    /// Long shared prompt prefixes kept on disk (`--prefix-cache-gb`); `None`: off.
    prefix_cache: Option<prefix_cache::PrefixCache>,
    /// The most draft tokens [`Engine::set_max_draft`] may set: `--draft`.
    draft_limit: usize,
}

/// Everything [`Engine::start`] needs.
pub struct StartOptions<'a> {
    pub dirs: Vec<PathBuf>,
    pub load: LoadOptions,
    /// Sessions (`--kv-slots`), each with a context of `ctx` tokens.
    pub sessions: usize,
    pub ctx: usize,
    /// Where `.coli_usage` and the sessions' `.coli_kv*` live (None: nothing is read or saved).
    pub state_dir: Option<PathBuf>,
    /// Whether sessions resume from and save to their `.coli_kv*` (`--kv-save`).
    pub kv_save: bool,
    /// Called with (done, total) as pinned experts load.
    pub progress: Option<&'a mut dyn FnMut(u64, u64)>,
}

impl Engine {
    /// Loads the model from a `:`-separated search path of directories, with one session and
    /// no tier start (tests and tools that drive the model directly).
    pub fn open(dirs: Vec<PathBuf>, opts: LoadOptions) -> Result<Engine, EngineError> {
        let t0 = Instant::now();
        let ModelFiles {
            cfg,
            tokenizer,
            template: checkpoint_chat,
        } = ModelFiles::check(&dirs)?;
        let shards = Arc::new(ShardSet::open(&dirs)?);
        check_dense_fits(&shards, &opts)?;
        let mut stops = cfg.eos_token_ids.clone();
        if let Some(id) = tokenizer.token_id("<|endoftext|>") {
            if !stops.contains(&id) {
                stops.push(id);
            }
        }
        // DeepSeek-V4 drafts too: its layers' verify trail (`model/dsv4_trail.rs`) cuts a
        // rejected draft from the window and the compressors.
        let draft = opts.draft;
        // Whatever changes the numbers a forward computes, so a conversation saved in one
        // format is never continued in another.
        let formats = format!(
            "experts={:?} dense={:?} act={:?} fake_quant={} index_topk={:?}",
            opts.expert_fmt, opts.dense_fmt, opts.act, opts.fake_quant, opts.index_topk
        );
        let model = Model::load(cfg, shards.clone(), opts)?;
        shards.release_mapped_pages();
        // The dense matrices the forward reads whole, read in place: every page mapped now
        // (reading a cold page cache from disk), so that the first token takes no faults.
        let t_warm = Instant::now();
        let warm = shards.warm_in_place()?;
        if warm > 0 {
            // In 2 MiB pages where the page cache's folios allow, read again where they do
            // not (`weights::in_place_huge`).
            let huge = shards.huge_in_place()?;
            crate::elog!(
                "[load] dense weights read in place: {:.2} GB mapped in {:.2}s (load {:.2}s); \
                 {:.2} of their {:.2} GB of whole 2 MiB extents in 2 MiB pages{}",
                warm as f64 / 1e9,
                t_warm.elapsed().as_secs_f64(),
                t0.elapsed().as_secs_f64(),
                huge.huge as f64 / 1e9,
                huge.extents as f64 / 1e9,
                if huge.reread > 0 {
                    format!(
                        " ({:.2} GB read again to get them)",
                        huge.reread as f64 / 1e9
                    )
                } else {
                    String::new()
                }
            );
        }
        let ctx = model.cfg.max_position_embeddings;
        let kv = model.new_cache();
        Ok(Engine {
            tokenizer,
            stops,
            dirs,
            load_s: t0.elapsed().as_secs_f64(),
            ctx,
            sessions: vec![Session::new(kv, None)],
            logits: Vec::with_capacity(model.cfg.vocab_size),
            prefill_cursor: 0,
            prefill_chunk: PREFILL_CHUNK,
            plan: Vec::with_capacity(1),
            grammar_trie: None,
            spec: spec::SpecEngine::new(draft),
            draft_limit: draft,
            model,
            shards,
            formats,
            identity: None,
            checkpoint_chat,
            prefix_cache: None,
        })
    }

    /// Loads the model and starts its tiers (usage history, pins, the RAM clamp of the LRU,
    /// which counts every session's KV pool), then opens the sessions, each resuming its
    /// saved conversation when there is one.
    pub fn start(opts: StartOptions<'_>) -> Result<Engine, EngineError> {
        let mut engine = Engine::open(opts.dirs, opts.load)?;
        engine.start_sessions(
            opts.sessions,
            opts.ctx,
            opts.state_dir.as_deref(),
            opts.kv_save,
            opts.progress,
        )?;
        Ok(engine)
    }

    /// The second half of [`Engine::start`], for a caller that needs the loaded tokenizer
    /// first (`run` sizes the context from its tokenized prompt): starts the tiers for
    /// `sessions` sessions of `ctx` tokens and opens them, resuming saved conversations from
    /// `state_dir` when `kv_save`.
    pub fn start_sessions(
        &mut self,
        sessions: usize,
        ctx: usize,
        state_dir: Option<&Path>,
        kv_save: bool,
        progress: Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<(), EngineError> {
        self.ctx = ctx;
        let usage_save = self.model.experts.saves_usage();
        if let Some(dir) = state_dir.filter(|_| kv_save || usage_save) {
            let id = ModelIdentity::compute(
                self.model.cfg.family.model_type(),
                &self.shards,
                &self.formats,
                Some(dir),
            )
            .map_err(|e| EngineError::io("fingerprinting the weights", e))?;
            self.identity = Some(id);
        }
        let usage = state_dir.map(crate::experts::usage_path);
        let mut start = tier_start(&self.model, sessions, ctx, usage);
        start.weights = self.identity.map(|id| id.content);
        start.progress = progress;
        self.model.experts.start(start)?;
        self.prefill_chunk = self.model.experts.prefill_chunk();
        let model = &self.model;
        let shape = KvShape::of(&model.new_cache(), model.cfg.vocab_size);
        self.sessions.clear();
        for i in 0..sessions {
            let mut kv = model.new_cache();
            let file = match (state_dir, kv_save, self.identity) {
                (Some(dir), true, Some(identity)) => {
                    let binding = KvBinding { shape, identity };
                    open_session_file(dir, i, binding, &mut kv, ctx)
                }
                _ => None,
            };
            let tenant = file
                .as_ref()
                .map_or(Tenant::LOCAL, |f| Tenant::load(f.path()));
            self.sessions.push(Session::new(kv, file).owned_by(tenant));
        }
        // The dense weights and the pinned experts are in memory now: remap them in 2 MiB
        // pages (a decode step's TLB misses), beside the first requests rather than before,
        // and the experts read later every minute after, unless the experts stream from disk:
        // the LRU's slots then churn, and a pass would copy gigabytes soon evicted (about a
        // second of a core a GB, measured at DeepSeek-V3's shapes) on a machine whose cores
        // decode; the first pass still takes the dense part and the pins.
        let period = (!self.experts().streams_from_disk()).then(|| Duration::from_secs(60));
        crate::quant::hugepages::remap_in_background(period, |done, took| {
            crate::elog!(
                "[tiers] huge pages: {:.2} GB of weights in 2 MiB pages ({} of {} resident \
                 extents; pass {:.2}s)",
                done.huge_bytes() as f64 / 1e9,
                done.huge,
                done.asked,
                took.as_secs_f64()
            )
        });
        Ok(())
    }

    /// Turns on the prefix cache in `state_dir/prefix/` (whose lock the caller holds):
    /// long prompt prefixes that conversations shared are kept there and adopted by later
    /// ones, across restarts (see `prefix_cache`).
    pub fn open_prefix_cache(
        &mut self,
        state_dir: &Path,
        opts: PrefixCacheOptions,
    ) -> Result<(), EngineError> {
        let identity = match self.identity {
            Some(id) => id,
            None => ModelIdentity::compute(
                self.model.cfg.family.model_type(),
                &self.shards,
                &self.formats,
                Some(state_dir),
            )
            .map_err(|e| EngineError::io("fingerprinting the weights", e))?,
        };
        let shape = KvShape::of(&self.model.new_cache(), self.model.cfg.vocab_size);
        let binding = KvBinding { shape, identity };
        self.prefix_cache = Some(prefix_cache::PrefixCache::open(state_dir, binding, opts));
        Ok(())
    }

    /// Whether a prompt of `len` bytes can be tokenized inside the RAM budget: encoding
    /// holds hundreds of bytes per input byte while it runs ([`Tokenizer::encode_peak_bytes`]),
    /// which no budget line reserves. `Err` ([`EngineError::EncodeBudget`]) gives the figures
    /// for the refusal.
    pub fn encode_fits(&self, len: usize) -> Result<(), EngineError> {
        // An ordinary prompt is covered by the fixed reserve, so it is never refused because
        // the guard is about to trim the cache.
        let need = Tokenizer::encode_peak_bytes(len);
        let Err((budget, rss, room)) = self.model.experts.transient_fits(need) else {
            return Ok(());
        };
        Err(EngineError::EncodeBudget {
            len,
            need,
            budget,
            room,
            rss,
        })
    }

    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }

    pub fn session(&self, slot: usize) -> &Session {
        &self.sessions[slot]
    }

    /// Whether any session has a request in flight.
    pub fn any_active(&self) -> bool {
        self.sessions.iter().any(Session::is_active)
    }

    /// Starts a request on an idle session: `spec.feed` goes after what its cache holds.
    /// `max_new` is clamped to the context left.
    pub fn begin(&mut self, slot: usize, mut spec: TurnSpec) -> Result<(), EngineError> {
        let ctx = self.ctx;
        let grammar = spec.grammar.take().map(|g| {
            let tokenizer = &self.tokenizer;
            let trie = self
                .grammar_trie
                .get_or_insert_with(|| Arc::new(grammar_turn::vocab_trie(tokenizer)));
            grammar_turn::GrammarTurn::new(g, trie.clone())
        });
        let s = self
            .sessions
            .get_mut(slot)
            .ok_or_else(|| EngineError::Usage(format!("session {slot} does not exist")))?;
        if s.is_active() {
            return Err(EngineError::Usage(format!("session {slot} is busy")));
        }
        if spec.feed.is_empty() {
            return Err(EngineError::Usage(
                "a request feeds at least one token".into(),
            ));
        }
        let fed = s.kv.len() + spec.feed.len();
        if fed > ctx {
            return Err(EngineError::Usage(format!(
                "session {slot}: {fed} tokens do not fit the context of {ctx}"
            )));
        }
        spec.max_new = spec.max_new.min(ctx - fed + 1);
        // The cache and the step's working memory sized for the whole request up front, so
        // decode steps do not allocate (a reservation is address space until a step reaches it).
        let limit = self.model.cfg.max_position_embeddings.max(fed);
        self.model
            .reserve(&mut s.kv, fed.saturating_add(spec.max_new).min(limit));
        let pending0 = s.pending.take();
        let mut turn = session::Turn::new(spec, s.kv.len(), pending0);
        turn.grammar = grammar;
        s.turn = Some(turn);
        Ok(())
    }

    /// Ends `slot`'s request now (STOP; with `cancel`, CANCEL), as the next step would have
    /// ended it: what was sampled last and not fed becomes the pending token. `None` when the
    /// session was idle.
    pub fn stop(&mut self, slot: usize, cancel: bool) -> Option<TurnOutcome> {
        self.end(
            slot,
            if cancel {
                Finish::Cancelled
            } else {
                Finish::Stopped
            },
        )
    }

    /// Runs `slot`'s request to its end alone, passing each event to `on_event`; returning
    /// `false` from it stops the request. (One-shot callers: `run`, `validate`, legacy serve.)
    pub fn finish_turn(
        &mut self,
        slot: usize,
        mut on_event: impl FnMut(&Engine, &Event, &StepReport) -> bool,
    ) -> Result<TurnOutcome, EngineError> {
        let mut report = StepReport::default();
        loop {
            if !self.sessions[slot].is_active() {
                return Err(EngineError::Usage(format!("session {slot} has no request")));
            }
            self.step(&mut report)?;
            let mut go_on = true;
            for e in &report.events {
                if let Event::Done { slot: s, outcome } = e {
                    if *s == slot {
                        return Ok(outcome.clone());
                    }
                }
                go_on &= on_event(self, e, &report);
            }
            if !go_on {
                if let Some(outcome) = self.stop(slot, false) {
                    return Ok(outcome);
                }
            }
        }
    }

    /// Keeps the first `n` positions of `slot`'s conversation (cache and saved file).
    pub fn truncate(&mut self, slot: usize, n: usize) {
        let s = &mut self.sessions[slot];
        s.kv.truncate(n);
        // A cache with a recurrent state is cut to its latest saved state at or before `n`,
        // else to 0 (`KvCache::truncate`).
        let n = s.kv.len();
        if let Some(f) = &mut s.file {
            if let Err(e) = f.truncate(n) {
                crate::elog!(
                    "[KV] slot {slot}: truncating {} failed: {e}",
                    f.path().display()
                );
            }
        }
    }

    /// Forgets `slot`'s conversation (RESET): cache, pending token and saved file.
    pub fn reset(&mut self, slot: usize) {
        let s = &mut self.sessions[slot];
        s.kv.clear();
        s.pending = None;
        if let Some(f) = &mut s.file {
            if let Err(e) = f.clear() {
                crate::elog!(
                    "[KV] slot {slot}: clearing {} failed: {e}",
                    f.path().display()
                );
            }
        }
    }

    /// Sets (or clears) the token a continuation of `slot` must feed first.
    pub fn set_pending(&mut self, slot: usize, tok: Option<u32>) {
        self.sessions[slot].pending = tok;
    }

    /// Makes `slot`'s saved file hold its conversation (at each request's end). `Err` says
    /// why it is not durable (also on stderr), for the front's KVSAVE line.
    pub fn save(&mut self, slot: usize) -> Result<(), EngineError> {
        if let Some(pc) = &mut self.prefix_cache {
            pc.write_due(slot, &self.sessions[slot].kv);
        }
        let s = &mut self.sessions[slot];
        if let Some(f) = &mut s.file {
            if let Err(e) = f.save(&s.kv) {
                let why = EngineError::io(format!("saving to {} failed", f.path().display()), e);
                crate::elog!("[KV] slot {slot}: {why}");
                return Err(why);
            }
        }
        Ok(())
    }

    /// Saves every session and the usage history (shutdown). Failures are on stderr.
    pub fn save_all(&mut self) {
        for i in 0..self.sessions.len() {
            let _ = self.save(i);
        }
        self.model.experts.save_usage();
    }

    /// The expert tiers (telemetry, counters, the turn-end safe point); the engine's own.
    fn experts(&self) -> &crate::experts::ExpertStore {
        &self.model.experts
    }

    /// What the fronts read of the expert tiers: counters, the tier map, snapshots, sizes.
    pub fn tiers(&self) -> TiersReport<'_> {
        TiersReport::of(&self.model.experts)
    }

    /// End of a served turn: saves `.coli_usage`, flushes the route trace and runs the tiers'
    /// safe point counting `tokens` more; the re-pins it made are for the REPIN lines.
    pub fn turn_end(&self, tokens: usize) -> crate::experts::SafePoint {
        self.experts().turn_end(tokens)
    }

    /// Saves the usage history (`.coli_usage`) now (a one-shot command's end).
    pub fn save_usage(&self) {
        self.experts().save_usage();
    }

    /// The tokenizer (encoding prompts, a token's text).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The tokenizer alone, the model dropped (tests that only count tokens).
    pub fn into_tokenizer(self) -> Tokenizer {
        self.tokenizer
    }

    /// The bytes token `id` stands for.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.tokenizer.token_bytes(id)
    }

    /// The context of every session, in tokens.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Positions `slot`'s context has left after what its cache holds.
    pub fn room_left(&self, slot: usize) -> usize {
        self.ctx.saturating_sub(self.sessions[slot].held())
    }

    /// Seconds the model took to load.
    pub fn load_s(&self) -> f64 {
        self.load_s
    }

    /// Prompt positions of a prefill chunk while no session decodes (see `prefill_chunk`).
    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// Sets the chunk [`Engine::start_sessions`] chose (tests and tools comparing chunks: the
    /// bits do not depend on it, only the working set does, which the RAM budget counted for
    /// the chosen chunk, not for this one). At least 1.
    pub fn set_prefill_chunk(&mut self, rows: usize) {
        self.prefill_chunk = rows.max(1);
    }

    /// The model directories (the first holds config.json and tokenizer.json).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The tokens that end an answer.
    pub fn stops(&self) -> &[u32] {
        &self.stops
    }

    /// Keeps only `<|endoftext|>` as a stop token, when the vocabulary has it (upstream's
    /// multiplexed protocol: the gateway owns the other stops). Before any request.
    pub fn stop_on_end_of_text_only(&mut self) {
        if let Some(eot) = self.tokenizer.token_id("<|endoftext|>") {
            self.stops = vec![eot];
        }
    }

    /// Speculative decoding's settings and figures.
    pub fn spec(&self) -> &spec::SpecEngine {
        &self.spec
    }

    /// Sets the most draft tokens a step verifies, up to the limit the engine was opened with
    /// (`--draft`): a draft limit is only ever lowered or restored, never raised past what the
    /// caches were sized for.
    /// Returns the limit in use before.
    pub fn set_max_draft(&mut self, n: usize) -> usize {
        let limit = self.draft_limit;
        std::mem::replace(&mut self.spec.max_draft, n.min(limit))
    }

    /// What saved state is bound to, once computed (`None` before).
    pub fn identity(&self) -> Option<ModelIdentity> {
        self.identity
    }

    /// The model itself, for the engine's own integration tests (`daemon/tests`); a front
    /// reads what it needs through the methods above.
    #[doc(hidden)]
    pub fn model_for_tests(&self) -> &Model {
        &self.model
    }

    /// Mutable [`Engine::model_for_tests`].
    #[doc(hidden)]
    pub fn model_for_tests_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    /// Speculative decoding's switches, for the engine's own integration tests.
    #[doc(hidden)]
    pub fn spec_for_tests_mut(&mut self) -> &mut spec::SpecEngine {
        &mut self.spec
    }

    /// The forward's per-stage timings (PROF).
    pub fn profile(&self) -> &crate::model::profile::Profile {
        &self.model.profile
    }

    pub fn vocab_size(&self) -> usize {
        self.model.cfg.vocab_size
    }

    /// The model's own context limit (`max_position_embeddings`).
    pub fn max_positions(&self) -> usize {
        self.model.cfg.max_position_embeddings
    }

    /// KV cache bytes one position takes in one session.
    pub fn kv_bytes_per_position(&self) -> usize {
        self.model.new_cache().bytes_per_position()
    }

    /// The most the caches of `sessions` sessions of `ctx` tokens take: their rows, and the
    /// recurrent states with their saved copies (Qwen3.5-MoE). What the RAM clamp counts.
    pub fn kv_pool_bytes(&self, sessions: usize, ctx: usize) -> u64 {
        tiers::kv_pool(&self.model, sessions, ctx, self.draft_limit)
    }

    /// The DSA indexer's top-k in use (`--index-topk` or the config's).
    pub fn index_topk(&self) -> usize {
        self.model.index_topk()
    }

    /// The DSA indexer's top-k cuts on the CPU since the last call: rows that selected and
    /// rows whose cut fell inside a tie.
    pub fn take_index_cuts(&self) -> crate::model::IndexCuts {
        self.model.take_index_cuts()
    }

    /// A teacher-forced forward on a fresh cache, outside every session: `prefix` fed first
    /// (its logits dropped), then `ids`, whose every position's logits go to `logits`
    /// (`(ids.len(), vocab)`). What the oracle checks (`validate`) and perplexity (`score`)
    /// need.
    pub fn teacher_forced(
        &self,
        prefix: &[u32],
        ids: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let mut kv = self.model.new_cache();
        if !prefix.is_empty() {
            self.model
                .forward_into(&mut kv, prefix, crate::model::Logits::Last, logits)?;
        }
        self.model
            .forward_into(&mut kv, ids, crate::model::Logits::All, logits)
    }

    /// The formats the routed experts and the dense weights compute in (`--expert-bits`,
    /// `--dense-bits`), by name.
    /// How activations meet quantized weights in this run.
    pub fn act_mode(&self) -> crate::model::ActMode {
        self.model.opts.act
    }

    /// Weight bytes one decode token reads: the dense part plus the routed experts it uses.
    /// Bytes of the weights outside the routed experts, as loaded.
    pub fn dense_bytes(&self) -> usize {
        self.model.dense_bytes()
    }

    pub fn decode_weight_bytes_per_token(&self) -> usize {
        self.model.decode_weight_bytes_per_token()
    }

    /// Multiply-accumulates of one prefill position in the weight products.
    pub fn prefill_macs_per_position(&self) -> u64 {
        self.model.prefill_macs_per_position()
    }

    /// Layers with routed experts.
    pub fn n_sparse_layers(&self) -> usize {
        self.model.cfg.n_sparse_layers()
    }

    pub fn format_names(&self) -> (&'static str, &'static str) {
        (
            self.model.experts.format().name(),
            self.model.dense_format().name(),
        )
    }

    /// One user turn in the model's chat template (the checkpoint's own when it ships one,
    /// else the family's) and the opening of the answer; see [`chat::ChatTemplate::turn`].
    /// The system prompt and the text are content: the special tokens they spell are text.
    pub fn chat_turn(
        &self,
        system: Option<&str>,
        text: &str,
        first: bool,
        think: bool,
    ) -> Result<ChatText, EngineError> {
        chat::render_turn(
            &self.tokenizer,
            self.checkpoint_chat.as_ref(),
            chat::ChatTemplate::for_family(self.model.cfg.family),
            (system, text),
            first,
            think,
        )
    }
}

/// Opens session `i`'s `.coli_kv*` in `dir` and resumes it into `kv` (a problem with the file
/// is a message, never a failure: the session then starts empty, or unsaved).
fn open_session_file(
    dir: &Path,
    i: usize,
    binding: KvBinding,
    kv: &mut crate::model::KvCache,
    ctx: usize,
) -> Option<KvFile> {
    let path = dir.join(state::kv_file_name(i));
    match KvFile::open(&path, binding) {
        Ok(mut f) => {
            let t0 = Instant::now();
            match f.load(kv, ctx) {
                Ok(got) => report_kv_load(i, f.path(), &got, t0.elapsed().as_secs_f64()),
                Err(e) if e.sets_aside() => match f.set_aside() {
                    Ok(to) => crate::elog!(
                        "[KV] slot {i}: not resuming the saved conversation: {e}; kept as {}, starting over",
                        to.display()
                    ),
                    Err(err) => {
                        // Never overwrite what cannot be kept aside: this slot goes unsaved.
                        crate::elog!(
                            "[KV] slot {i}: not resuming the saved conversation: {e}; it cannot be set aside ({err}), so this slot is not saved"
                        );
                        return None;
                    }
                },
                Err(e) => {
                    crate::elog!("[KV] slot {i}: ignoring saved conversation: {e}; starting over")
                }
            }
            Some(f)
        }
        Err(e) => {
            crate::elog!(
                "[KV] slot {i}: cannot open {} ({e}): this slot is not saved",
                path.display()
            );
            None
        }
    }
}

/// The stderr lines of a resumed slot: how much was kept and, when the file was damaged or
/// unverifiable, why.
fn report_kv_load(i: usize, path: &Path, got: &crate::kv_file::KvLoaded, secs: f64) {
    use crate::kv_file::KvFormat;
    if got.format == KvFormat::V1 && got.claimed > 0 {
        crate::elog!(
            "[KV] slot {i}: {} is COLIKV1 (upstream's format): no checksums, its records cannot be verified; the next save rewrites it as COLIKV2",
            path.display()
        );
    }
    if let Some(d) = got.damage {
        crate::elog!(
            "[KV] slot {i}: {}: {d} (damaged file): kept {} of {} tokens, the rest is dropped",
            path.display(),
            got.tokens,
            got.claimed
        );
    }
    if got.tokens > 0 {
        crate::elog!(
            "[KV] slot {i}: resumed conversation from disk: {} tokens in {secs:.3}s (no re-prefill)",
            got.tokens
        );
    }
}

/// Splits `a:b:c` into directories (empty parts ignored).
pub fn split_search_path(s: &str) -> Vec<PathBuf> {
    s.split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// Bytes the dense (non-expert) weights will take once loaded: packed tensors as stored,
/// 2-D float tensors in `--dense-bits` with their scales (embedding and lm_head at >= 8 bits;
/// the router and the indexer's weights_proj stay f32, and DeepSeek-V4's hyper-connection
/// mixers, compressor position biases and hash tables), everything else f32.
pub fn projected_dense_bytes(shards: &ShardSet, opts: &LoadOptions) -> u64 {
    use crate::quant::QFormat;
    let io_fmt = if opts.dense_fmt.bits() < 8 {
        QFormat::I8Row
    } else {
        opts.dense_fmt
    };
    let mut total = 0u64;
    for name in shards.names() {
        let Some(info) = shards.get(name) else {
            continue;
        };
        if name.contains(".mlp.experts.") || name.contains(".ffn.experts.") {
            continue;
        }
        let elems: u64 = info.shape.iter().map(|&d| d as u64).product();
        let f32_kept = name.ends_with("mlp.gate.weight")
            || name.contains("weights_proj")
            || name.ends_with("ffn.gate.weight")
            || name.ends_with(".ape")
            || name.ends_with("tid2eid")
            || (name.contains("hc_") && name.ends_with("_fn"));
        total += match (info.dtype, info.shape.as_slice()) {
            (Dtype::U8 | Dtype::I8, _) => info.len,
            // GGUF blocks the kernels compute keep their stored bytes (`load_matrix`).
            (Dtype::Ggml(t), &[_, _]) if !f32_kept && crate::quant::ggml::act_kind(t).is_some() => {
                info.len
            }
            (_, &[rows, cols]) => {
                let fmt = if f32_kept {
                    QFormat::F32
                } else if name.contains("embed_tokens")
                    || name.starts_with("lm_head")
                    || name == "head.weight"
                {
                    io_fmt
                } else {
                    opts.dense_fmt
                }
                .canonical(cols);
                (fmt.data_len(rows, cols) + 4 * fmt.scales_len(rows, cols)) as u64
            }
            _ => elems * 4,
        };
    }
    total
}

/// Refuses, before anything is loaded, dense weights that cannot fit the available memory:
/// a clear message with the way out instead of an out-of-memory kill minutes later.
fn check_dense_fits(shards: &ShardSet, opts: &LoadOptions) -> Result<(), EngineError> {
    let need = projected_dense_bytes(shards, opts);
    let (_, avail) = crate::telemetry::meminfo();
    if avail == 0 || need <= avail || std::env::var("COLI_RAM_OVERCOMMIT").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    let at = |bits: u32| {
        let o = LoadOptions {
            dense_fmt: crate::quant::QFormat::from_bits(bits, 64).unwrap_or(opts.dense_fmt),
            ..opts.clone()
        };
        projected_dense_bytes(shards, &o) as f64 / 1e9
    };
    Err(EngineError::Usage(format!(
        "[RAM] the dense weights would take {:.1} GB at --dense-bits {} but only {:.1} GB are available; \
         try --dense-bits 8 ({:.1} GB) or 4 ({:.1} GB), or set COLI_RAM_OVERCOMMIT=1 to try anyway",
        need as f64 / 1e9,
        if opts.dense_fmt.bits() == 32 { 16 } else { opts.dense_fmt.bits() },
        avail as f64 / 1e9,
        at(8),
        at(4)
    )))
}
