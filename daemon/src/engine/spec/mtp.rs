//! The MTP head's part of a step: catching up on the hidden states it has not seen and
//! chaining its drafts (see the parent module for how they are verified).

use super::super::Engine;
use crate::model::{KvCache, Logits, MtpStep};

impl Engine {
    /// Runs the MTP head for the sessions in `want` (slot, most drafts): the positions it has
    /// not seen yet, the last of which gives the first draft, then the chained drafts, into
    /// their `mtp_drafts`.
    pub(super) fn spec_mtp(&mut self, want: &[(usize, usize)]) -> bool {
        let Some(mtp) = self.model.mtp.as_ref() else {
            return false;
        };
        let h = self.model.cfg.hidden_size;
        let mut tokens: Vec<Vec<u32>> = Vec::new();
        let mut members: Vec<(usize, Logits)> = Vec::new();
        for &(slot, _) in want {
            let s = &mut self.sessions[slot];
            if !s.spec.mtp_live() {
                continue;
            }
            let mlen = s.spec.mtp_kv.as_ref().map_or(0, KvCache::len);
            // Positions t in mlen..kv.len() - 1 have their next token in the cache; the last
            // one takes the pending token.
            let mut next: Vec<u32> = s.kv.tokens[mlen + 1..].to_vec();
            next.push(s.spec.feed[0]);
            tokens.push(next);
            members.push((slot, Logits::Last));
        }
        if members.is_empty() {
            return false;
        }
        // At most the one new position per accepted token of a step: not a catch-up.
        let steady = tokens.iter().all(|t| t.len() <= 1 + self.spec.max_draft)
            && self.spec.mtp_s_samples > 0
            || tokens.iter().all(|t| t.len() <= 1 + self.spec.max_draft) && {
                self.spec.mtp_s_samples += 1;
                false
            };
        let mut logits = std::mem::take(&mut self.spec.mtp_logits);
        let mut last = std::mem::take(&mut self.spec.mtp_hidden);
        let result = {
            let mut steps: Vec<MtpStep> = Vec::with_capacity(members.len());
            let mut rest = &mut self.sessions[..];
            let mut base = 0;
            for ((slot, lg), next) in members.iter().zip(&tokens) {
                let (_, tail) = rest.split_at_mut(slot - base);
                let (one, tail) = tail.split_first_mut().expect("slot in range");
                rest = tail;
                base = slot + 1;
                let spec = &mut one.spec;
                steps.push(MtpStep {
                    kv: spec.mtp_kv.as_mut().expect("live MTP has a cache"),
                    next_tokens: next,
                    hidden: &spec.hidden[..next.len() * h],
                    logits: *lg,
                });
            }
            mtp.forward_draft(&self.model, &mut steps, &mut logits, &mut last)
        };
        if let Err(e) = result {
            crate::elog!("[SPEC] MTP forward failed, MTP drafts off: {e}");
            for &(slot, _) in &members {
                self.sessions[slot].spec.broken = true;
            }
            self.spec.mtp_logits = logits;
            self.spec.mtp_hidden = last;
            return false;
        }
        // Consumed hidden rows go; a drafting session's last position was fed the pending
        // token, which is not in the cache yet: it is undone below, its row kept.
        let vocab = self.model.cfg.vocab_size;
        let mut chain: Vec<(usize, usize, u32, Vec<f32>)> = Vec::new();
        let mut lrow = 0;
        for (i, ((slot, lg), next)) in members.iter().zip(&tokens).enumerate() {
            let s = &mut self.sessions[*slot];
            let consumed = if *lg == Logits::Last {
                next.len() - 1
            } else {
                next.len()
            };
            s.spec.hidden.drain(..consumed * h);
            if *lg == Logits::Last {
                let row = &logits[lrow * vocab..(lrow + 1) * vocab];
                lrow += 1;
                let d = crate::model::ops::argmax(row) as u32;
                s.spec.mtp_drafts.push(d);
                let room = want.iter().find(|w| w.0 == *slot).map_or(0, |w| w.1);
                chain.push((*slot, room, d, last[i * h..(i + 1) * h].to_vec()));
            }
        }
        // Chained drafts: the head's own output hidden state and its draft feed the next
        // position, one position per round, batched over the sessions still drafting.
        let mut round = 1;
        loop {
            chain.retain(|c| c.1 > round);
            if chain.is_empty() {
                break;
            }
            let result = {
                let mut steps: Vec<MtpStep> = Vec::with_capacity(chain.len());
                let mut rest = &mut self.sessions[..];
                let mut base = 0;
                for (slot, _, d, hid) in chain.iter() {
                    let (_, tail) = rest.split_at_mut(slot - base);
                    let (one, tail) = tail.split_first_mut().expect("slot in range");
                    rest = tail;
                    base = slot + 1;
                    steps.push(MtpStep {
                        kv: one.spec.mtp_kv.as_mut().expect("live MTP has a cache"),
                        next_tokens: std::slice::from_ref(d),
                        hidden: hid,
                        logits: Logits::Last,
                    });
                }
                mtp.forward_draft(&self.model, &mut steps, &mut logits, &mut last)
            };
            if let Err(e) = result {
                crate::elog!("[SPEC] chained MTP forward failed: {e}");
                break;
            }
            for (i, c) in chain.iter_mut().enumerate() {
                let d = crate::model::ops::argmax(&logits[i * vocab..(i + 1) * vocab]) as u32;
                self.sessions[c.0].spec.mtp_drafts.push(d);
                c.2 = d;
                c.3.copy_from_slice(&last[i * h..(i + 1) * h]);
            }
            round += 1;
        }
        // The head's cache keeps only positions whose next token is in the main cache.
        for &(slot, _) in &members {
            let s = &mut self.sessions[slot];
            let keep = s.kv.len().saturating_sub(1);
            if let Some(kv) = s.spec.mtp_kv.as_mut() {
                kv.truncate(keep);
            }
        }
        self.spec.mtp_logits = logits;
        self.spec.mtp_hidden = last;
        steady
    }
}
