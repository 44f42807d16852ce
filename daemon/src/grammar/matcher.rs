//! The matcher: the set of pushdown stacks the bytes so far can be in.
//!
//! A stack is a chain of frames in an arena (`parent` links), so advancing one shares every
//! frame below its top with the stack it came from; the mask's trie walk allocates frames on
//! top of the arena and truncates back after each subtree. The top frame of a live stack
//! always points at a [`Sym::Bytes`]; the empty stack (`NIL`) means the input so far is a
//! complete sentence.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Grammar, Sym};

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Frame {
    /// Index into the grammar's symbols.
    pub pos: u32,
    /// The frame below (`NIL`: the bottom).
    pub parent: u32,
}

/// Where a constrained generation is: the grammar and the stacks its bytes so far allow.
#[derive(Clone, Debug)]
pub struct GrammarState {
    pub(crate) g: Arc<Grammar>,
    pub(crate) arena: Vec<Frame>,
    pub(crate) stacks: Vec<u32>,
    /// Per trie depth, the stacks after that many bytes (the mask walk's scratch).
    pub(crate) levels: Vec<Vec<u32>>,
}

fn push(arena: &mut Vec<Frame>, pos: u32, parent: u32) -> u32 {
    arena.push(Frame { pos, parent });
    (arena.len() - 1) as u32
}

/// Expands `top` until every resulting stack's top is a byte symbol or the stack is empty.
/// Terminates because compile refused left recursion.
fn expand(arena: &mut Vec<Frame>, g: &Grammar, top: u32, out: &mut Vec<u32>) {
    if top == NIL {
        out.push(NIL);
        return;
    }
    let f = arena[top as usize];
    match g.syms[f.pos as usize] {
        Sym::Bytes(..) => out.push(top),
        Sym::End => expand(arena, g, f.parent, out),
        Sym::Rule(r) => {
            let ret = f.pos + 1;
            // A reference that ends its alternative returns straight to the parent (right
            // recursion like `list ::= item list | item` does not grow the stack).
            let base = if g.syms[ret as usize] == Sym::End {
                f.parent
            } else {
                push(arena, ret, f.parent)
            };
            for &a in &g.alts[r as usize] {
                let id = push(arena, a, base);
                expand(arena, g, id, out);
            }
        }
    }
}

/// The stacks of `input` that accept byte `b`, advanced and expanded, into `out` (deduplicated
/// by top frame).
pub(crate) fn advance(
    arena: &mut Vec<Frame>,
    g: &Grammar,
    input: &[u32],
    b: u8,
    out: &mut Vec<u32>,
) {
    for &top in input {
        if top == NIL {
            continue;
        }
        let f = arena[top as usize];
        if let Sym::Bytes(lo, hi) = g.syms[f.pos as usize] {
            if lo <= b && b <= hi {
                let next = f.pos + 1;
                if g.syms[next as usize] == Sym::End {
                    expand(arena, g, f.parent, out);
                } else {
                    let id = push(arena, next, f.parent);
                    expand(arena, g, id, out);
                }
            }
        }
    }
    if out.len() > 1 {
        let key = |id: u32| {
            if id == NIL {
                (NIL, NIL)
            } else {
                let f = arena[id as usize];
                (f.pos, f.parent)
            }
        };
        out.sort_unstable_by_key(|&id| key(id));
        out.dedup_by_key(|id| key(*id));
    }
}

impl GrammarState {
    /// The state before any byte.
    pub fn new(g: Arc<Grammar>) -> GrammarState {
        let mut arena = Vec::new();
        let mut stacks = Vec::new();
        for &a in &g.alts[g.root as usize] {
            let id = push(&mut arena, a, NIL);
            expand(&mut arena, &g, id, &mut stacks);
        }
        let mut s = GrammarState {
            g,
            arena,
            stacks,
            levels: Vec::new(),
        };
        s.compact();
        s
    }

    /// The bytes so far form a complete sentence of the grammar.
    pub fn accepting(&self) -> bool {
        self.stacks.contains(&NIL)
    }

    /// Some byte can follow.
    pub fn can_continue(&self) -> bool {
        self.stacks.iter().any(|&s| s != NIL)
    }

    /// Complete with nothing allowed after: generation must end here.
    pub fn complete(&self) -> bool {
        self.accepting() && !self.can_continue()
    }

    /// Feeds `bytes`; `false` (state unchanged) when the grammar does not allow them.
    pub fn advance_bytes(&mut self, bytes: &[u8]) -> bool {
        // Advancing only pushes frames, so truncating to `mark` undoes a rejected feed.
        let mark = self.arena.len();
        let mut cur = self.stacks.clone();
        let mut next = Vec::with_capacity(cur.len());
        for &b in bytes {
            next.clear();
            advance(&mut self.arena, &self.g, &cur, b, &mut next);
            if next.is_empty() {
                self.arena.truncate(mark);
                return false;
            }
            std::mem::swap(&mut cur, &mut next);
        }
        self.stacks = cur;
        self.compact();
        true
    }

    /// Whether `bytes` may come next (the state is not changed).
    pub fn allows(&self, bytes: &[u8]) -> bool {
        let mut arena = self.arena.clone();
        let mut cur = self.stacks.clone();
        let mut next = Vec::new();
        for &b in bytes {
            next.clear();
            advance(&mut arena, &self.g, &cur, b, &mut next);
            if next.is_empty() {
                return false;
            }
            std::mem::swap(&mut cur, &mut next);
        }
        true
    }

    /// The bytes the grammar allows next, as a 256-entry table.
    pub fn next_bytes(&self) -> [bool; 256] {
        let mut ok = [false; 256];
        for &top in &self.stacks {
            if top == NIL {
                continue;
            }
            if let Sym::Bytes(lo, hi) = self.g.syms[self.arena[top as usize].pos as usize] {
                for b in lo..=hi {
                    ok[b as usize] = true;
                }
            }
        }
        ok
    }

    /// The span the grammar forces from here: bytes while exactly one byte value may come
    /// next and the sentence is not complete (at most `max`). A draft source for speculative
    /// decoding: these bytes are the only continuation, whatever the model says.
    pub fn forced_bytes(&self, max: usize) -> Vec<u8> {
        let mut s = self.clone();
        let mut out = Vec::new();
        while out.len() < max && !s.accepting() {
            let ok = s.next_bytes();
            let mut it = (0..256).filter(|&b| ok[b]);
            let (Some(b), None) = (it.next(), it.next()) else {
                break;
            };
            let b = b as u8;
            if !s.advance_bytes(&[b]) {
                break;
            }
            out.push(b);
        }
        out
    }

    /// Rebuilds the arena with only the frames the stacks use, equal stacks made one
    /// (hash-consed), so a long generation does not grow it and ambiguity does not multiply.
    fn compact(&mut self) {
        let mut arena = Vec::new();
        let mut map: HashMap<Frame, u32> = HashMap::new();
        let mut memo: HashMap<u32, u32> = HashMap::new();
        let mut stacks = Vec::with_capacity(self.stacks.len());
        for &top in &self.stacks {
            stacks.push(copy(&self.arena, top, &mut arena, &mut map, &mut memo));
        }
        stacks.sort_unstable();
        stacks.dedup();
        self.arena = arena;
        self.stacks = stacks;
    }
}

fn copy(
    old: &[Frame],
    id: u32,
    arena: &mut Vec<Frame>,
    map: &mut HashMap<Frame, u32>,
    memo: &mut HashMap<u32, u32>,
) -> u32 {
    if id == NIL {
        return NIL;
    }
    if let Some(&n) = memo.get(&id) {
        return n;
    }
    // Iterative over the chain: deep stacks (long nested JSON) must not recurse per frame.
    let mut chain = Vec::new();
    let mut cur = id;
    while cur != NIL && !memo.contains_key(&cur) {
        chain.push(cur);
        cur = old[cur as usize].parent;
    }
    let mut parent = if cur == NIL { NIL } else { memo[&cur] };
    for &c in chain.iter().rev() {
        let f = Frame {
            pos: old[c as usize].pos,
            parent,
        };
        let n = *map.entry(f).or_insert_with(|| {
            arena.push(f);
            (arena.len() - 1) as u32
        });
        memo.insert(c, n);
        parent = n;
    }
    parent
}
