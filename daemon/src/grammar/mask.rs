//! The token mask: which tokens the grammar allows next.
//!
//! The vocabulary's byte strings go into a trie once per model; a mask walks it depth first
//! carrying the matcher's stack set, so a shared prefix is matched once for every token
//! under it and a byte the grammar refuses prunes its whole subtree.

use super::matcher::{GrammarState, DEAD};

#[derive(Clone, Copy, Debug)]
struct Node {
    byte: u8,
    first_child: u32,
    children: u32,
    /// `tokens[tok_start..tok_end]` end at this node.
    tok_start: u32,
    tok_end: u32,
}

/// The vocabulary as a byte trie (token ids whose bytes end at each node).
#[derive(Debug)]
pub struct TokenTrie {
    nodes: Vec<Node>,
    tokens: Vec<u32>,
    vocab: usize,
}

impl TokenTrie {
    /// Builds the trie from `(id, bytes)` for ids below `vocab`. Tokens with no bytes (or
    /// left out, like special tokens) are never allowed by a mask.
    pub fn new<'a>(vocab: usize, tokens: impl IntoIterator<Item = (u32, &'a [u8])>) -> TokenTrie {
        let mut items: Vec<(&[u8], u32)> = tokens
            .into_iter()
            .filter(|(id, b)| !b.is_empty() && (*id as usize) < vocab)
            .map(|(id, b)| (b, id))
            .collect();
        items.sort_unstable();
        let mut t = TokenTrie {
            nodes: vec![Node {
                byte: 0,
                first_child: 0,
                children: 0,
                tok_start: 0,
                tok_end: 0,
            }],
            tokens: Vec::with_capacity(items.len()),
            vocab,
        };
        t.build(0, &items, 0);
        t
    }

    fn build(&mut self, node: usize, items: &[(&[u8], u32)], depth: usize) {
        let mut i = 0;
        let start = self.tokens.len() as u32;
        // Sorted: the strings that end here come first.
        while i < items.len() && items[i].0.len() == depth {
            self.tokens.push(items[i].1);
            i += 1;
        }
        self.nodes[node].tok_start = start;
        self.nodes[node].tok_end = self.tokens.len() as u32;
        let mut groups = Vec::new();
        while i < items.len() {
            let b = items[i].0[depth];
            let s = i;
            while i < items.len() && items[i].0[depth] == b {
                i += 1;
            }
            groups.push((b, s, i));
        }
        let first = self.nodes.len();
        self.nodes[node].first_child = first as u32;
        self.nodes[node].children = groups.len() as u32;
        for &(b, _, _) in &groups {
            self.nodes.push(Node {
                byte: b,
                first_child: 0,
                children: 0,
                tok_start: 0,
                tok_end: 0,
            });
        }
        for (k, &(_, s, e)) in groups.iter().enumerate() {
            self.build(first + k, &items[s..e], depth + 1);
        }
    }

    /// The vocabulary size a mask covers.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

impl GrammarState {
    /// Sets `allowed[id]` (length = the trie's vocabulary) to whether token `id`'s bytes may
    /// come next. Returns how many are allowed. Stop tokens are the caller's to add (allowed
    /// exactly when [`GrammarState::accepting`]).
    pub fn fill_mask(&mut self, trie: &TokenTrie, allowed: &mut [bool]) -> usize {
        allowed.iter_mut().for_each(|a| *a = false);
        self.bound_cache();
        let s = self.current();
        self.walk(trie, 0, s, allowed)
    }

    fn walk(&mut self, trie: &TokenTrie, node: usize, state: u32, allowed: &mut [bool]) -> usize {
        let mut n = 0;
        let Node {
            first_child,
            children,
            ..
        } = trie.nodes[node];
        for c in first_child..first_child + children {
            let child = trie.nodes[c as usize];
            let next = self.step(state, child.byte);
            if next == DEAD {
                continue;
            }
            for &id in &trie.tokens[child.tok_start as usize..child.tok_end as usize] {
                allowed[id as usize] = true;
                n += 1;
            }
            if child.children > 0 {
                n += self.walk(trie, c as usize, next, allowed);
            }
        }
        n
    }
}
