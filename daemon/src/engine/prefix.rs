//! Prefix reuse: a new prompt keeps the longest common token prefix of its session's history
//! (only the tail is prefilled), or adopts a longer one from another session's cache instead
//! of computing it again (upstream's `COLI_KV_SHARE`, here on by default): agents resend the
//! same long system prompt, and this is their time to first token. Past both, a longer
//! prefix kept on disk (`prefix_cache`) is adopted from there.

use super::session::Undo;
use super::tenant::Tenant;
use super::Engine;

/// What [`Engine::prepare_prompt`] kept: feed `ids[keep..]` next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptPlan {
    pub keep: usize,
    /// Rows `from_row..keep` copied from session `from` (when another session held a longer
    /// prefix than this one's own history).
    pub adopted: Option<Adopted>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adopted {
    pub from: usize,
    pub from_row: usize,
    /// The end of the rows copied (a prefix kept on disk may extend them to `keep`).
    pub to_row: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Engine {
    /// Readies idle session `slot` to be fed `ids` (non-empty) for `tenant`: its cache (and
    /// saved file) cut to the longest prefix it shares with `ids`, then, with `share`,
    /// extended with rows of another session of the same tenant that shares a longer one.
    /// A session holding another tenant's conversation is emptied first, for good (not even
    /// a failed request brings that conversation back into this tenant's session). At least
    /// the last prompt token is always left to feed, so the request gets its logits. The
    /// pending token is dropped: the prompt says what the history is.
    pub fn prepare_prompt(
        &mut self,
        slot: usize,
        ids: &[u32],
        share: bool,
        tenant: Tenant,
    ) -> PromptPlan {
        if self.sessions[slot].tenant != tenant {
            self.take_over(slot, tenant);
        }
        let own = common_prefix(&self.sessions[slot].kv.tokens, ids);
        let limit = ids.len().saturating_sub(1);
        let own = own.min(limit);
        // Where the prompt parts from the conversation teaches a recurrent cache where to
        // keep its next states (`KvCache::note_next_prompt`).
        self.sessions[slot].kv.note_next_prompt(own);
        // A prompt that leaves this slot's conversation shares its first `own` tokens with a
        // conversation it does not continue.
        let mut shared = if own < self.sessions[slot].kv.len() {
            own
        } else {
            0
        };
        let s = &mut self.sessions[slot];
        s.undo = Some(Undo {
            cut: (own < s.kv.len()).then(|| s.kv.clone()),
            own,
            pending: s.pending,
        });
        self.truncate(slot, own);
        // What was kept: a cache with a recurrent state keeps all of it or nothing.
        let own = self.sessions[slot].kv.len();
        self.sessions[slot].pending = None;
        let mut plan = PromptPlan {
            keep: own,
            adopted: None,
        };
        if share {
            if let Some(n) = self.adopt_from_slot(slot, ids, own, limit, tenant, &mut plan) {
                shared = shared.max(n);
            }
        }
        self.adopt_from_disk(slot, ids, limit, tenant, &mut plan);
        if let Some(pc) = &mut self.prefix_cache {
            pc.note_shared(slot, &ids[..shared], tenant);
        }
        plan
    }

    /// `--kv-share`: extends `slot`'s cache (holding `own` rows) with the rows of another
    /// session of `tenant` sharing a longer prefix of `ids`; how many it shares, when it did.
    fn adopt_from_slot(
        &mut self,
        slot: usize,
        ids: &[u32],
        own: usize,
        limit: usize,
        tenant: Tenant,
        plan: &mut PromptPlan,
    ) -> Option<usize> {
        let best = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(i, s)| *i != slot && s.tenant == tenant)
            .map(|(i, s)| {
                let n = common_prefix(&s.kv.tokens, ids).min(limit);
                // A recurrent state is adopted whole or up to one of its saved states
                // (`KvCache::adoptable_upto`).
                (self.sessions[slot].kv.adoptable_upto(&s.kv, n), i)
            })
            .max_by_key(|&(n, i)| (n, std::cmp::Reverse(i)));
        if let Some((n, from)) = best.filter(|&(n, _)| n > own) {
            let (src, dst) = if from < slot {
                let (a, b) = self.sessions.split_at_mut(slot);
                (&a[from], &mut b[0])
            } else {
                let (a, b) = self.sessions.split_at_mut(from);
                (&b[0], &mut a[slot])
            };
            dst.kv.extend_from(&src.kv, n);
            *plan = PromptPlan {
                keep: n,
                adopted: Some(Adopted {
                    from,
                    from_row: own,
                    to_row: n,
                }),
            };
            return Some(n);
        }
        None
    }

    /// Extends `slot`'s cache with the rows of a prefix kept on disk by `tenant` when one
    /// covers more of `ids` than the cache holds now.
    fn adopt_from_disk(
        &mut self,
        slot: usize,
        ids: &[u32],
        limit: usize,
        tenant: Tenant,
        plan: &mut PromptPlan,
    ) {
        let Some(pc) = &mut self.prefix_cache else {
            return;
        };
        let Some((idx, n)) = pc.best(ids, tenant, limit, plan.keep) else {
            return;
        };
        let scratch = self.model.new_cache();
        if pc.adopt(idx, n, slot, &mut self.sessions[slot].kv, scratch, self.ctx) {
            plan.keep = n;
        }
    }
}

impl Engine {
    /// Hands idle session `slot` to `tenant`: the conversation it held is forgotten (cache,
    /// pending token, saved rows) before the new owner is recorded beside the saved file, so
    /// a crash between the two leaves an empty conversation, never one under the wrong owner.
    fn take_over(&mut self, slot: usize, tenant: Tenant) {
        self.reset(slot);
        let s = &mut self.sessions[slot];
        s.tenant = tenant;
        if let Some(f) = &s.file {
            if let Err(e) = tenant.store(f.path()) {
                crate::elog!(
                    "[KV] slot {slot}: recording its owner beside {} failed: {e}",
                    f.path().display()
                );
            }
        }
    }
}

impl Engine {
    /// Forgets the prefixes `slot`'s request was to keep (it did not start).
    pub(crate) fn forget_shared(&mut self, slot: usize) {
        if let Some(pc) = &mut self.prefix_cache {
            pc.cancel(slot);
        }
    }
}
