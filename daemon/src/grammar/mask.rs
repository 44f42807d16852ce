//! The token mask: which tokens the grammar allows next.
//!
//! The vocabulary's byte strings go into a trie once per model; a mask walks it depth first
//! carrying the matcher's state, so a shared prefix is matched once for every token under it
//! and a byte the grammar refuses prunes its whole subtree. A subtree whose bytes all lead
//! the state back to itself (ordinary characters inside a JSON string) is allowed whole
//! without being walked: its tokens are one contiguous range.

use super::matcher::{GrammarState, DEAD};

/// Subtrees smaller than this are walked; the shortcut's set test is not worth it below.
const SHORTCUT_TOKENS: u32 = 32;

#[derive(Clone, Copy, Debug)]
struct Node {
    byte: u8,
    first_child: u32,
    children: u32,
    /// `tokens[tok_start..tok_end]` end at this node; `tokens[tok_start..sub_end]` are the
    /// tokens of its whole subtree (depth-first order keeps them contiguous).
    tok_start: u32,
    tok_end: u32,
    sub_end: u32,
}

/// A set of bytes.
pub(crate) type ByteSet = [u64; 4];

/// The vocabulary as a byte trie (token ids whose bytes end at each node).
#[derive(Debug)]
pub struct TokenTrie {
    nodes: Vec<Node>,
    /// Per node: every byte on an edge below it.
    below: Vec<ByteSet>,
    tokens: Vec<u32>,
    vocab: usize,
    /// Token `id`'s bytes are `bytes[offs[id]..offs[id + 1]]` (the budget's check of a
    /// sampled token).
    bytes: Vec<u8>,
    offs: Vec<u32>,
}

const EMPTY: Node = Node {
    byte: 0,
    first_child: 0,
    children: 0,
    tok_start: 0,
    tok_end: 0,
    sub_end: 0,
};

impl TokenTrie {
    /// Builds the trie from `(id, bytes)` for ids below `vocab`. Tokens with no bytes (or
    /// left out, like special tokens) are never allowed by a mask.
    pub fn new<'a>(vocab: usize, tokens: impl IntoIterator<Item = (u32, &'a [u8])>) -> TokenTrie {
        let mut items: Vec<(&[u8], u32)> = tokens
            .into_iter()
            .filter(|(id, b)| !b.is_empty() && (*id as usize) < vocab)
            .map(|(id, b)| (b, id))
            .collect();
        let mut by_id: Vec<&[u8]> = vec![&[]; vocab];
        for &(b, id) in &items {
            by_id[id as usize] = b;
        }
        let mut bytes = Vec::with_capacity(by_id.iter().map(|b| b.len()).sum());
        let mut offs = Vec::with_capacity(vocab + 1);
        for b in &by_id {
            offs.push(bytes.len() as u32);
            bytes.extend_from_slice(b);
        }
        offs.push(bytes.len() as u32);
        items.sort_unstable();
        let mut t = TokenTrie {
            nodes: vec![EMPTY],
            below: vec![[0; 4]],
            tokens: Vec::with_capacity(items.len()),
            vocab,
            bytes,
            offs,
        };
        t.build(0, &items, 0);
        t
    }

    /// Fills `node` from `items` (all sharing its `depth`-byte prefix); returns the bytes on
    /// the edges below it.
    fn build(&mut self, node: usize, items: &[(&[u8], u32)], depth: usize) -> ByteSet {
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
            self.nodes.push(Node { byte: b, ..EMPTY });
            self.below.push([0; 4]);
        }
        let mut below: ByteSet = [0; 4];
        for (k, &(b, s, e)) in groups.iter().enumerate() {
            below[(b >> 6) as usize] |= 1 << (b & 63);
            let sub = self.build(first + k, &items[s..e], depth + 1);
            for w in 0..4 {
                below[w] |= sub[w];
            }
        }
        self.below[node] = below;
        self.nodes[node].sub_end = self.tokens.len() as u32;
        below
    }

    /// The longest token whose bytes begin `bytes`: (id, its length). How a span the grammar
    /// forces becomes draft tokens.
    pub fn longest_prefix(&self, bytes: &[u8]) -> Option<(u32, usize)> {
        let mut node = 0usize;
        let mut best = None;
        for (depth, &b) in bytes.iter().enumerate() {
            let n = &self.nodes[node];
            let kids = n.first_child as usize..(n.first_child + n.children) as usize;
            // Children are in byte order (built from sorted strings).
            let Ok(k) = self.nodes[kids.clone()].binary_search_by_key(&b, |c| c.byte) else {
                break;
            };
            node = kids.start + k;
            let n = &self.nodes[node];
            if n.tok_start < n.tok_end {
                best = Some((self.tokens[n.tok_start as usize], depth + 1));
            }
        }
        best
    }

    /// Token `id`'s bytes (empty for one left out of the trie).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.vocab {
            return &[];
        }
        &self.bytes[self.offs[i] as usize..self.offs[i + 1] as usize]
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
            let whole = child.sub_end - child.tok_start >= SHORTCUT_TOKENS && {
                let below = &trie.below[c as usize];
                // One probe first: a state that does not loop (a bounded repetition's count,
                // say) then costs one transition, not the 256 of its full loop set.
                let probe = (0..4)
                    .find(|&w| below[w] != 0)
                    .map(|w| (w * 64) as u32 + below[w].trailing_zeros());
                probe.is_some_and(|b| self.step(next, b as u8) == next) && {
                    let keep = self.self_loops(next);
                    (0..4).all(|w| below[w] & !keep[w] == 0)
                }
            };
            let end = if whole { child.sub_end } else { child.tok_end };
            for &id in &trie.tokens[child.tok_start as usize..end as usize] {
                allowed[id as usize] = true;
            }
            n += (end - child.tok_start) as usize;
            if !whole && child.children > 0 {
                n += self.walk(trie, c as usize, next, allowed);
            }
        }
        n
    }
}
