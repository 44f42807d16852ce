//! Choosing each session's drafts for the next step (see the parent module for how they are
//! verified).
//!
//! The choice is made before any draft is produced: for each source the best length k and
//! its value (expected tokens per unit of cost) come from the source's acceptance and the
//! measured costs, a verify position for both and one MTP forward per MTP draft. Only then
//! does the MTP head run, for the sessions that chose it and only for the k drafts chosen, so
//! a session the n-gram lookup serves better, or one for which no draft pays, costs the head
//! nothing.

use super::{best_draft_len, break_even, ngram_draft, DraftSource, SourceStats, CALIBRATE_EVERY};
use super::{MIN_EVIDENCE, RETRY_MAX};
use crate::engine::step::Role;
use crate::engine::Engine;

/// The highest acceptance a source is assumed capable of before it has been measured.
const PLAUSIBLE_BEST: f64 = 0.95;

/// Expected tokens per unit of cost of `k` drafts at acceptance `a`, cost `c` per draft.
fn value(a: f64, c: f64, k: usize) -> f64 {
    (0..=k).map(|i| a.powi(i as i32)).sum::<f64>() / (1.0 + c * k as f64)
}

/// The number of drafts `src` should give a session now (0: none), at cost `c` per draft and
/// at most `room`; turns the source off (with a `[SPEC]` line) when no length pays, or back
/// on when its pause is over.
fn decide(
    st: &mut SourceStats,
    src: DraftSource,
    c: f64,
    room: usize,
    steps: u64,
    slot: usize,
) -> usize {
    if st.off_until > steps {
        return 0;
    }
    if st.off_until != 0 {
        // A retry: one draft, from a rate just above break-even, so one rejection turns the
        // source off again (for twice as long) and an acceptance keeps it on.
        st.off_until = 0;
        st.retries += 1;
        st.since_on = 0;
        st.rate = (break_even(c) / (1.0 - super::EMA / 2.0)).min(0.95);
        return 1;
    }
    let k = best_draft_len(st.rate, c, room);
    // A fresh source needs some evidence before it is judged: one slow step or a few
    // unlucky drafts on a shared machine are not. A retried one was judged already, and
    // none is needed where drafts cost so much that even a near-perfect source cannot pay.
    if k == 0
        && st.retries == 0
        && st.since_on < MIN_EVIDENCE
        && best_draft_len(PLAUSIBLE_BEST, c, room) > 0
    {
        return 1;
    }
    if k == 0 {
        st.off_until = steps + st.backoff;
        st.switched_off += 1;
        crate::elog!(
            "[SPEC] slot {slot}: {} drafts off (acceptance {:.0}%, cost of a draft {:.2} x a decode row); retry in {} steps",
            src.name(),
            100.0 * st.rate,
            c,
            st.backoff
        );
        st.backoff = (st.backoff * 2).min(RETRY_MAX);
    }
    k
}

impl Engine {
    /// After a step: every decoding session gets its next feed, `[next, drafts..]`, from the
    /// source whose drafts are worth most (or none), and the MTP head runs for the sessions
    /// that chose it (catching up on the hidden states it has not seen first).
    pub(in crate::engine) fn spec_plan(&mut self, plan: &[(usize, Role)]) {
        let max = self.spec.max_draft;
        if max == 0 {
            // Allocation-free: the feed is the pending token alone.
            for &(slot, _) in plan {
                let s = &mut self.sessions[slot];
                s.spec.feed.clear();
                s.spec.source = None;
                if let Some(next) = s.turn.as_ref().and_then(|t| t.next) {
                    s.spec.feed.push(next);
                }
            }
            return;
        }
        self.spec.planned += 1;
        let calibrate = self.spec.adaptive
            && (self.spec.base_s.is_empty() || self.spec.planned.is_multiple_of(CALIBRATE_EVERY));
        let (adaptive, enabled) = (self.spec.adaptive, self.spec.enabled);
        let c_verify = self.spec.extra_cost();
        let c_mtp = c_verify + self.spec.mtp_cost();
        let has_mtp = self.model.mtp.is_some();
        let mut mtp_want: Vec<(usize, usize)> = Vec::new();
        for &(slot, _) in plan {
            let s = &mut self.sessions[slot];
            s.spec.feed.clear();
            s.spec.source = None;
            s.spec.mtp_drafts.clear();
            let Some(t) = s.turn.as_mut() else { continue };
            let Some(next) = t.next else { continue };
            s.spec.feed.push(next);
            // Never draft past the request's budget: the last token needs no verify row.
            let room = t.max_new.saturating_sub(t.emitted + 1);
            let room = room.min(self.ctx.saturating_sub(s.kv.len() + 1)).min(max);
            // A constrained session drafts only what its grammar forces (each verify row is
            // then checked under the grammar's mask): no model source proposes past it.
            if let Some(g) = t.grammar.as_mut() {
                g.forced_tokens(room, &mut self.spec.forced);
                s.spec.feed.extend_from_slice(&self.spec.forced);
                continue;
            }
            s.spec.steps += 1;
            if room == 0 || calibrate {
                continue;
            }
            let steps = s.spec.steps;
            // The n-gram proposal, when the history repeats (no forward, but a pass over the
            // history: skipped while the source is off).
            s.spec.ngram.clear();
            let ng = &s.spec.stats[DraftSource::NGram.index()];
            if enabled[DraftSource::NGram.index()] && (!adaptive || ng.off_until <= steps) {
                let history = &mut self.spec.history;
                history.clear();
                history.extend_from_slice(&s.kv.tokens);
                history.push(next);
                ngram_draft(history, room, &mut s.spec.ngram);
            }
            let mut best: Option<(DraftSource, usize, f64)> = None;
            for src in DraftSource::ALL {
                let (avail, c) = match src {
                    DraftSource::Mtp => (
                        if has_mtp && s.spec.mtp_live() {
                            room
                        } else {
                            0
                        },
                        c_mtp,
                    ),
                    DraftSource::NGram => (s.spec.ngram.len(), c_verify),
                };
                if avail == 0 || !enabled[src.index()] {
                    continue;
                }
                let st = &mut s.spec.stats[src.index()];
                let (k, v) = if adaptive {
                    let k = decide(st, src, c, avail, steps, slot);
                    let v = value(st.rate, c, k);
                    if src == DraftSource::Mtp && st.off_until > steps {
                        s.spec.mtp_off();
                    }
                    (k, v)
                } else if best.is_none() {
                    (avail, 0.0)
                } else {
                    (0, 0.0)
                };
                if k > 0 && best.is_none_or(|b| v > b.2) {
                    best = Some((src, k, v));
                }
            }
            match best {
                Some((DraftSource::NGram, k, _)) => {
                    s.spec.feed.extend_from_slice(&s.spec.ngram[..k]);
                    s.spec.source = Some(DraftSource::NGram);
                }
                Some((DraftSource::Mtp, k, _)) => mtp_want.push((slot, k)),
                None => {}
            }
        }
        if mtp_want.is_empty() {
            return;
        }
        // The head runs only for the sessions that take its drafts now; the others keep their
        // hidden rows and catch up when it is their turn again.
        let t0 = std::time::Instant::now();
        let steady = self.spec_mtp(&mtp_want);
        let mut drafted = 0;
        for &(slot, k) in &mtp_want {
            let s = &mut self.sessions[slot].spec;
            let k = k.min(s.mtp_drafts.len());
            drafted += k;
            if k > 0 {
                s.feed.extend_from_slice(&s.mtp_drafts[..k]);
                s.source = Some(DraftSource::Mtp);
            }
        }
        // Timed only in the steady state: a catch-up over a prompt (and the first reads of
        // the head's experts) is not what the next drafts cost.
        if drafted > 0 && steady {
            self.spec
                .mtp_s
                .push(t0.elapsed().as_secs_f64() / drafted as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::RETRY_STEPS;
    use super::*;

    #[test]
    fn a_losing_source_backs_off_longer_each_time() {
        let mut st = SourceStats {
            rate: 0.05,
            since_on: MIN_EVIDENCE,
            ..SourceStats::default()
        };
        assert_eq!(decide(&mut st, DraftSource::Mtp, 0.3, 4, 10, 0), 0);
        assert_eq!(st.off_until, 10 + RETRY_STEPS);
        // Off until then.
        assert_eq!(decide(&mut st, DraftSource::Mtp, 0.3, 4, 20, 0), 0);
        // The retry drafts one, from just above break-even.
        assert_eq!(
            decide(&mut st, DraftSource::Mtp, 0.3, 4, 10 + RETRY_STEPS, 0),
            1
        );
        assert!(st.rate > break_even(0.3) && st.rate < break_even(0.3) + 0.05);
        // One rejection and it is off again, for twice as long.
        st.rate *= 0.9;
        let now = 11 + RETRY_STEPS;
        assert_eq!(decide(&mut st, DraftSource::Mtp, 0.3, 4, now, 0), 0);
        assert_eq!(st.off_until, now + 2 * RETRY_STEPS);
        assert_eq!((st.switched_off, st.retries), (2, 1));
    }

    #[test]
    fn a_fresh_source_gets_evidence_first() {
        let mut st = SourceStats {
            rate: 0.0,
            ..SourceStats::default()
        };
        assert_eq!(decide(&mut st, DraftSource::NGram, 0.3, 4, 1, 0), 1);
        assert_eq!(st.switched_off, 0);
        // Unless drafts cost so much that even a near-perfect source would not pay.
        assert_eq!(decide(&mut st, DraftSource::NGram, 1.2, 4, 2, 0), 0);
        assert_eq!(st.switched_off, 1);
    }

    #[test]
    fn the_value_of_no_draft_is_one() {
        assert_eq!(value(0.7, 0.2, 0), 1.0);
        assert!(value(0.7, 0.2, 1) > 1.0);
        assert!(value(0.1, 0.2, 1) < 1.0);
    }
}
