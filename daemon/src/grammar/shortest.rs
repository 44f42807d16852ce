//! The shortest sentence each rule derives, for "the shortest completion from here": a
//! constrained answer whose token budget runs out is closed by it (strings, arrays and
//! objects closed, required members written) so it always parses.
//!
//! Knuth's generalization of Dijkstra: an alternative's length is the sum of its symbols'
//! (a byte is 1), known once every rule it refers to is settled; the smallest known length
//! settles its rule. O(n log n) in the grammar's size, whatever the order of its rules.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{Grammar, Sym};

/// Unreachable length (a rule that cannot finish; compile refuses those when reachable).
pub(crate) const NEVER: u32 = u32::MAX;

/// Per rule: the shortest length it derives and the alternative (its index in the rule's
/// list) that derives it.
pub(crate) fn shortest(g: &Grammar) -> (Vec<u32>, Vec<u32>) {
    let n = g.rule_alts.len() - 1;
    let n_alts = g.alt_starts.len();
    let mut len = vec![NEVER; n];
    let mut best = vec![0u32; n];
    // Per alternative: its rule, the rule symbols it still waits for, the length so far.
    let mut owner = vec![0u32; n_alts];
    let mut waits = vec![0u32; n_alts];
    let mut sum = vec![0u64; n_alts];
    let mut users: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut heap = BinaryHeap::new();
    for r in 0..n {
        let first = g.rule_alts[r] as usize;
        for (k, &start) in g.alts(r as u32).iter().enumerate() {
            let a = first + k;
            owner[a] = r as u32;
            let mut i = start;
            loop {
                match g.sym(i) {
                    Sym::End => break,
                    Sym::Bytes(..) => sum[a] += 1,
                    Sym::Rule(x) => {
                        waits[a] += 1;
                        users[x as usize].push(a as u32);
                    }
                }
                i += 1;
            }
            if waits[a] == 0 {
                heap.push(Reverse((sum[a], r as u32, k as u32)));
            }
        }
    }
    while let Some(Reverse((l, r, k))) = heap.pop() {
        let r = r as usize;
        if len[r] != NEVER {
            continue;
        }
        len[r] = l.min(NEVER as u64 - 1) as u32;
        best[r] = k;
        for &a in &users[r] {
            let a = a as usize;
            sum[a] += l;
            waits[a] -= 1;
            if waits[a] == 0 {
                let o = owner[a];
                let k = a - g.rule_alts[o as usize] as usize;
                heap.push(Reverse((sum[a], o, k as u32)));
            }
        }
    }
    (len, best)
}
