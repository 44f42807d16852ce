//! The prefix cache: the KV of long prompt prefixes that conversations shared, kept on disk
//! under the state folder (`<state>/prefix/`) so a new conversation, or the first one after a
//! restart, that starts with one adopts its rows instead of prefilling them again (agents
//! resend the same long system prompt and tool list with every new conversation).
//!
//! The rule for what is kept: when a prompt shares at least `--prefix-cache-min-tokens`
//! tokens with a conversation it does not continue (the slot's previous conversation, or
//! another slot's under `--kv-share`), those shared tokens are written as an entry at the end
//! of that request. A prefix seen twice is the mark of a system prompt, and the engine needs
//! no knowledge of the chat template to see it.
//!
//! An entry is a COLIKV2 file (checksummed records, bound to the model's identity) named by a
//! hash of its tokens, the binding and its tenant; it is written under a temporary name and
//! renamed, so a kill never leaves half an entry. It is adopted only by the tenant that made
//! it (how fast a prompt starts must not tell one client what another sent). An entry that
//! fails its checksum, or is bound to another model, is deleted with one log line (and, when
//! a prompt needed it, rewritten from that prompt's prefill). The entries' file sizes are
//! held under `--prefix-cache-gb` by evicting the least recently used.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::tenant::Tenant;
use crate::kv_file::{self, KvBinding, KvFile};
use crate::model::KvCache;

const EXT: &str = "coli_kv";

/// One kept prefix.
struct Entry {
    tokens: Vec<u32>,
    tenant: Tenant,
    key: String,
    path: PathBuf,
    bytes: u64,
    /// Higher is more recently used (adopted or written).
    used: u64,
}

/// A prefix a request shared, to be written from its slot's cache when the request ends.
struct Due {
    slot: usize,
    tokens: Vec<u32>,
    tenant: Tenant,
}

/// The settings of the prefix cache (`--prefix-cache-gb`, `--prefix-cache-min-tokens`).
#[derive(Clone, Copy, Debug)]
pub struct PrefixCacheOptions {
    pub max_bytes: u64,
    pub min_tokens: usize,
}

pub struct PrefixCache {
    dir: PathBuf,
    binding: KvBinding,
    opts: PrefixCacheOptions,
    entries: Vec<Entry>,
    clock: u64,
    due: Vec<Due>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

impl PrefixCache {
    /// Opens `<state_dir>/prefix/`, indexing the entries there: the tokens of each (its
    /// records are verified when adopted), least recently used by modification time. Half
    /// entries a kill left (`.tmp`), entries bound to another model and files that are not
    /// entries are deleted, each with one line.
    pub fn open(state_dir: &Path, binding: KvBinding, opts: PrefixCacheOptions) -> PrefixCache {
        let dir = state_dir.join("prefix");
        let mut cache = PrefixCache {
            dir,
            binding,
            opts,
            entries: Vec::new(),
            clock: 0,
            due: Vec::new(),
        };
        let Ok(listing) = std::fs::read_dir(&cache.dir) else {
            return cache;
        };
        let mut found = Vec::new();
        for f in listing.flatten() {
            let path = f.path();
            let name = f.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                remove(
                    &path,
                    "a half-written entry (the daemon was stopped while writing it)",
                );
                continue;
            }
            let Some(stem) = name.strip_suffix(&format!(".{EXT}")) else {
                continue;
            };
            let tenant = stem
                .split_once('-')
                .and_then(|(t, _)| u64::from_str_radix(t, 16).ok());
            let Some(tenant) = tenant.map(Tenant) else {
                continue;
            };
            match kv_file::read_tokens(&path, binding) {
                Ok(tokens) if cache.key(&tokens, tenant) == stem && !tokens.is_empty() => {
                    let meta = f.metadata().ok();
                    let mtime = meta
                        .as_ref()
                        .and_then(|m| m.modified().ok())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    found.push((mtime, tokens, tenant, stem.to_string(), path, meta));
                }
                Ok(_) => remove(&path, "its tokens do not match its name (damaged)"),
                Err(e) => {
                    // The error names the file first; said once.
                    let why = e.to_string();
                    let prefix = format!("{}: ", path.display());
                    remove(&path, why.strip_prefix(&prefix).unwrap_or(&why));
                }
            }
        }
        found.sort_by_key(|f| f.0);
        for (_, tokens, tenant, key, path, meta) in found {
            cache.clock += 1;
            cache.entries.push(Entry {
                tokens,
                tenant,
                key,
                path,
                bytes: meta.map_or(0, |m| m.len()),
                used: cache.clock,
            });
        }
        if !cache.entries.is_empty() {
            crate::elog!(
                "[API] prefix cache: {} entries, {:.1} MB in {}",
                cache.entries.len(),
                mb(cache.bytes()),
                cache.dir.display()
            );
        }
        cache.evict(None);
        cache
    }

    /// The entry name of `tokens` for `tenant`: its tenant, then a hash of the tokens, the
    /// model's binding and the tenant.
    fn key(&self, tokens: &[u32], tenant: Tenant) -> String {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.binding.identity.to_bytes());
        h.update(&tenant.0.to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        format!("{:016x}-{:016x}", tenant.0, h.digest())
    }

    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// The entry of `tenant` sharing the longest prefix with `ids`, capped at `limit`, when
    /// it shares more than `than` and at least the shortest prefix kept: its index and the
    /// shared length.
    pub fn best(
        &self,
        ids: &[u32],
        tenant: Tenant,
        limit: usize,
        than: usize,
    ) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.tenant == tenant)
            .map(|(i, e)| (i, common_prefix(&e.tokens, ids).min(limit)))
            // A few tokens in common are no reason to read a file.
            .filter(|&(_, n)| n > than && n >= self.opts.min_tokens)
            .max_by_key(|&(i, n)| (n, self.entries[i].used))
    }

    /// Appends rows `kv.len()..upto` of entry `idx` to `kv` (whose tokens are the entry's
    /// first ones), reading and verifying the file into `scratch` (an empty cache of the
    /// model). A damaged or vanished entry is deleted with one line and rewritten at the end
    /// of this request from `slot`'s prefill; `false` then, and `kv` is unchanged.
    pub fn adopt(
        &mut self,
        idx: usize,
        upto: usize,
        slot: usize,
        kv: &mut KvCache,
        mut scratch: KvCache,
        ctx: usize,
    ) -> bool {
        let e = &self.entries[idx];
        let loaded = KvFile::open(&e.path, self.binding)
            .map_err(|err| err.to_string())
            .and_then(|mut f| {
                f.load(&mut scratch, ctx.max(e.tokens.len() + 1))
                    .map_err(|err| err.to_string())
            });
        let why = match loaded {
            Ok(got) if got.damage.is_some() => got.damage.map(|d| d.to_string()),
            Ok(got) if got.tokens < upto || scratch.tokens[..upto] != e.tokens[..upto] => Some(
                format!("it holds {} of its {} tokens", got.tokens, e.tokens.len()),
            ),
            Ok(_) => None,
            Err(err) => Some(err),
        };
        if let Some(why) = why {
            let e = self.entries.swap_remove(idx);
            let _ = std::fs::remove_file(&e.path);
            crate::elog!(
                "[API] prefix cache: entry {} is damaged ({why}): deleted, rebuilt from this prefill",
                e.key
            );
            self.due.push(Due {
                slot,
                tokens: e.tokens[..upto].to_vec(),
                tenant: e.tenant,
            });
            return false;
        }
        kv.extend_from(&scratch, upto);
        self.clock += 1;
        let e = &mut self.entries[idx];
        e.used = self.clock;
        // The order survives a restart: the index sorts by modification time.
        if let Ok(f) = std::fs::File::options().write(true).open(&e.path) {
            let _ = f.set_modified(SystemTime::now());
        }
        crate::elog!("[API] prefix cache: adopted {upto} tokens from {}", e.key);
        true
    }

    /// A prompt on `slot` shared `tokens` with a conversation it does not continue: kept at
    /// the end of the request, when long enough and not already kept.
    pub fn note_shared(&mut self, slot: usize, tokens: &[u32], tenant: Tenant) {
        if tokens.len() < self.opts.min_tokens {
            return;
        }
        let kept = self
            .entries
            .iter()
            .any(|e| e.tenant == tenant && common_prefix(&e.tokens, tokens) == tokens.len());
        if kept
            || self
                .due
                .iter()
                .any(|d| d.slot == slot && d.tokens == tokens)
        {
            return;
        }
        self.due.push(Due {
            slot,
            tokens: tokens.to_vec(),
            tenant,
        });
    }

    /// Forgets what `slot` was to write (a request that did not start).
    pub fn cancel(&mut self, slot: usize) {
        self.due.retain(|d| d.slot != slot);
    }

    /// Writes the prefixes `slot`'s request shared, from its cache (which holds them unless
    /// the request failed and was undone: then nothing is written), then evicts the least
    /// recently used entries over the bound.
    pub fn write_due(&mut self, slot: usize, kv: &KvCache) {
        let (mine, rest): (Vec<Due>, Vec<Due>) = self.due.drain(..).partition(|d| d.slot == slot);
        self.due = rest;
        // An entry holds records only: a recurrent state (Qwen3.5-MoE) is not in them, so
        // its load would find no state and delete it again. Such a model shares prefixes
        // between live sessions only (at their marks, `kv_snap.rs`).
        if kv.has_recurrent_state() {
            return;
        }
        for d in mine {
            let n = d.tokens.len();
            if kv.len() < n || kv.tokens[..n] != d.tokens[..] {
                continue;
            }
            let key = self.key(&d.tokens, d.tenant);
            if self.entries.iter().any(|e| e.key == key) {
                continue;
            }
            let need = kv.bytes_per_position() as u64 * n as u64;
            if need > self.opts.max_bytes {
                crate::elog!(
                    "[API] prefix cache: a shared prefix of {n} tokens ({:.1} MB) is larger than --prefix-cache-gb: not kept",
                    mb(need)
                );
                continue;
            }
            let path = self.dir.join(format!("{key}.{EXT}"));
            let written = std::fs::create_dir_all(&self.dir)
                .and_then(|()| kv_file::write_file_prefix(&path, kv, n, self.binding))
                .and_then(|()| std::fs::metadata(&path));
            match written {
                Ok(meta) => {
                    self.clock += 1;
                    crate::elog!(
                        "[API] prefix cache: wrote {n} tokens as {key} ({:.1} MB)",
                        mb(meta.len())
                    );
                    self.entries.push(Entry {
                        tokens: d.tokens,
                        tenant: d.tenant,
                        key: key.clone(),
                        path,
                        bytes: meta.len(),
                        used: self.clock,
                    });
                    self.evict(Some(&key));
                }
                Err(e) => {
                    crate::elog!("[API] prefix cache: writing {} failed: {e}", path.display())
                }
            }
        }
    }

    /// Deletes least recently used entries (never `keep`) until the files fit the bound.
    fn evict(&mut self, keep: Option<&str>) {
        while self.bytes() > self.opts.max_bytes {
            let victim = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| Some(e.key.as_str()) != keep)
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i);
            let Some(i) = victim else { break };
            let e = self.entries.swap_remove(i);
            let _ = std::fs::remove_file(&e.path);
            crate::elog!(
                "[API] prefix cache: evicted {} ({} tokens, {:.1} MB) to stay under {:.2} GB",
                e.key,
                e.tokens.len(),
                mb(e.bytes),
                self.opts.max_bytes as f64 / 1e9
            );
        }
    }
}

/// Deletes a file of the prefix folder that cannot be used, saying why in one line.
fn remove(path: &Path, why: &str) {
    match std::fs::remove_file(path) {
        Ok(()) => crate::elog!("[API] prefix cache: deleted {}: {why}", path.display()),
        Err(e) => crate::elog!(
            "[API] prefix cache: {} cannot be used ({why}) nor deleted: {e}",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ModelIdentity;
    use crate::kv_file::KvShape;

    /// tiny-qwen3-moe's (grouped-query) cache holding `tokens`, each row filled from its token.
    fn cache(tokens: &[u32]) -> (KvCache, KvBinding) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-qwen3-moe");
        let cfg = crate::config::ModelConfig::load(&dir).unwrap();
        let mut kv = KvCache::new(&cfg);
        let shape = KvShape::of(&kv, cfg.vocab_size);
        let floats = (shape.record_bytes() as usize - 4) / 4;
        for &t in tokens {
            let body: Vec<u8> = (0..floats)
                .flat_map(|i| (t as f32 + i as f32 * 0.5).to_le_bytes())
                .collect();
            kv.push_record(t, &body);
        }
        let identity = ModelIdentity {
            family: 1,
            index: 2,
            content: 3,
            formats: 4,
        };
        (kv, KvBinding { shape, identity })
    }

    fn opts(max_bytes: u64) -> PrefixCacheOptions {
        PrefixCacheOptions {
            max_bytes,
            min_tokens: 16,
        }
    }

    fn prompt(first: u32) -> Vec<u32> {
        (first..first + 40).collect()
    }

    /// Keeps `ids[..32]` for `tenant` as slot 0's shared prefix.
    fn keep(pc: &mut PrefixCache, ids: &[u32], tenant: Tenant) {
        let (kv, _) = cache(ids);
        pc.note_shared(0, &ids[..32], tenant);
        pc.write_due(0, &kv);
    }

    #[test]
    fn entries_survive_a_reopen_stay_with_their_tenant_and_evict_the_least_recently_used() {
        let state = std::env::temp_dir().join(format!("colibri-prefix-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        let (probe, binding) = cache(&prompt(0)[..32]);
        let one = file_bytes(&binding, 32);
        let alice = Tenant::of(&[b"alice"]);
        let mut pc = PrefixCache::open(&state, binding, opts(one * 5 / 2));
        // Too short to keep.
        pc.note_shared(0, &prompt(0)[..15], alice);
        assert!(pc.due.is_empty());
        keep(&mut pc, &prompt(0), alice);
        keep(&mut pc, &prompt(100), alice);
        assert_eq!(pc.entries.len(), 2);
        assert_eq!(std::fs::metadata(&pc.entries[0].path).unwrap().len(), one);
        // Kept once: the same prefix again writes nothing.
        pc.note_shared(0, &prompt(0)[..32], alice);
        assert!(pc.due.is_empty());

        // Only alice adopts, and exactly the rows a prefill would have made.
        let ids = prompt(0);
        assert_eq!(pc.best(&ids, Tenant::LOCAL, 39, 0), None);
        let (idx, n) = pc.best(&ids, alice, 39, 0).unwrap();
        assert_eq!(n, 32);
        assert_eq!(
            pc.best(&ids, alice, 39, 32),
            None,
            "not more than the slot holds"
        );
        let (mut kv, _) = cache(&[]);
        assert!(pc.adopt(idx, n, 0, &mut kv, probe.clone(), 4096));
        let mut got = Vec::new();
        let mut want = Vec::new();
        for pos in 0..32 {
            kv.write_record(pos, &mut got);
            probe.write_record(pos, &mut want);
        }
        assert_eq!(got, want);

        // A reopen (a restart) finds both; the one adopted last is the most recent, so a
        // third entry evicts the other; a half-written file is deleted.
        std::fs::write(state.join("prefix").join("x.coli_kv.tmp"), b"half").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut pc = PrefixCache::open(&state, binding, opts(one * 5 / 2));
        assert_eq!(pc.entries.len(), 2);
        assert!(!state.join("prefix").join("x.coli_kv.tmp").exists());
        keep(&mut pc, &prompt(200), alice);
        let mut firsts: Vec<u32> = pc.entries.iter().map(|e| e.tokens[0]).collect();
        firsts.sort();
        assert_eq!(firsts, vec![0, 200]);
        assert_eq!(std::fs::read_dir(state.join("prefix")).unwrap().count(), 2);

        // A flipped byte: not adopted, deleted, and due to be written again from the prefill.
        let e = pc.entries.iter().position(|e| e.tokens[0] == 200).unwrap();
        let path = pc.entries[e].path.clone();
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 5;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (mut kv, _) = cache(&[]);
        assert!(!pc.adopt(e, 32, 3, &mut kv, probe.clone(), 4096));
        assert!(kv.is_empty() && !path.exists());
        let (full, _) = cache(&prompt(200));
        pc.write_due(3, &full);
        assert!(path.exists(), "rebuilt under its key");

        // Bound to other weights: deleted at the next open.
        let mut other = binding;
        other.identity.content = 99;
        let pc = PrefixCache::open(&state, other, opts(one * 5 / 2));
        assert!(pc.entries.is_empty());
        assert_eq!(std::fs::read_dir(state.join("prefix")).unwrap().count(), 0);
        std::fs::remove_dir_all(&state).unwrap();
    }

    /// A COLIKV2 file's size with `n` records.
    fn file_bytes(binding: &KvBinding, n: u64) -> u64 {
        kv_file::HEADER + n * (binding.shape.record_bytes() + 4)
    }
}
