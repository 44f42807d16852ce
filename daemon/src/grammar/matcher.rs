//! The matcher: the set of pushdown stacks the bytes so far can be in, as a lazily built
//! automaton.
//!
//! A stack is a chain of frames (`parent` links); frames are hash-consed, so two equal stacks
//! are the same frame id and a set of stacks is canonical as its sorted ids. Each distinct set
//! becomes a state, and a state's transition on a byte is computed once and then read from a
//! 256-entry row. Inside a JSON string, say, almost every byte leads back to the same few
//! states, so a mask's walk over a 150k-token trie is mostly table lookups. The top frame of
//! a live stack always points at a [`Sym::Bytes`]; the empty stack (`NIL`) means the bytes so
//! far are a complete sentence.

use std::collections::HashMap;
use std::sync::Arc;

use super::mask::ByteSet;
use super::{Grammar, Sym};

pub(crate) const NIL: u32 = u32::MAX;
/// A transition not computed yet.
const UNKNOWN: u32 = u32::MAX;
/// The transition to "no stack survives".
pub(crate) const DEAD: u32 = u32::MAX - 1;
/// States kept before the cache is rebuilt from the current state alone (a state's row is
/// 1 KiB; this bounds one request's cache to a few MiB).
const MAX_STATES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Frame {
    /// Index into the grammar's symbols.
    pub pos: u32,
    /// The frame below (`NIL`: the bottom).
    pub parent: u32,
}

#[derive(Clone, Debug)]
struct State {
    /// Sorted, deduplicated top frame ids (`NIL` last when present).
    stacks: Vec<u32>,
    next: Box<[u32; 256]>,
    /// The bytes that lead back to this state (computed at the first mask that asks).
    loops: Option<ByteSet>,
}

/// Where a constrained generation is: the grammar, the automaton built so far, and the
/// current state.
#[derive(Clone, Debug)]
pub struct GrammarState {
    g: Arc<Grammar>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    states: Vec<State>,
    state_ids: HashMap<Vec<u32>, u32>,
    cur: u32,
    /// Per frame, the step that last expanded it (`visit_mark`: the current one).
    visited: Vec<u32>,
    visit_mark: u32,
    /// Per frame, the shortest completion of its stack (`UNKNOWN`: not computed yet).
    chain: Vec<u32>,
}

impl GrammarState {
    /// The state before any byte.
    pub fn new(g: Arc<Grammar>) -> GrammarState {
        let mut s = GrammarState {
            g,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            states: Vec::new(),
            state_ids: HashMap::new(),
            cur: 0,
            visited: Vec::new(),
            visit_mark: 0,
            chain: Vec::new(),
        };
        let mut stacks = Vec::new();
        let g = s.g.clone();
        s.new_visit();
        for &a in g.alts(g.root) {
            let id = s.frame(a, NIL);
            s.expand(id, &mut stacks);
        }
        s.cur = s.intern(stacks);
        s
    }

    fn frame(&mut self, pos: u32, parent: u32) -> u32 {
        let f = Frame { pos, parent };
        if let Some(&id) = self.frame_ids.get(&f) {
            return id;
        }
        self.frames.push(f);
        let id = (self.frames.len() - 1) as u32;
        self.frame_ids.insert(f, id);
        id
    }

    fn intern(&mut self, mut stacks: Vec<u32>) -> u32 {
        if stacks.is_empty() {
            return DEAD;
        }
        stacks.sort_unstable();
        stacks.dedup();
        if let Some(&id) = self.state_ids.get(&stacks) {
            return id;
        }
        self.states.push(State {
            stacks: stacks.clone(),
            next: Box::new([UNKNOWN; 256]),
            loops: None,
        });
        let id = (self.states.len() - 1) as u32;
        self.state_ids.insert(stacks, id);
        id
    }

    /// Expands `top` until every resulting stack's top is a byte symbol or the stack is
    /// empty. Terminates because compile refused left recursion.
    ///
    /// A worklist rather than recursion: a chain of rules each ending in the next (an object
    /// of 100k optional members) expands 100k deep, past any thread's stack. Each frame is
    /// expanded once per step ([`Self::new_visit`]): a frame's expansion depends on the frame
    /// alone, and nullable choices in a row (`( a? | b? ) ( a? | b? ) ...`) reach the frame
    /// after them along 2^n paths.
    fn expand(&mut self, top: u32, out: &mut Vec<u32>) {
        let mut todo = vec![top];
        while let Some(top) = todo.pop() {
            if top == NIL {
                out.push(NIL);
                continue;
            }
            if !self.first_visit(top) {
                continue;
            }
            let f = self.frames[top as usize];
            match self.g.sym(f.pos) {
                Sym::Bytes(..) => out.push(top),
                Sym::End => todo.push(f.parent),
                Sym::Rule(r) => {
                    let ret = f.pos + 1;
                    // A reference that ends its alternative returns straight to the parent
                    // (right recursion like `list ::= item list | item` does not grow the
                    // stack).
                    let base = if self.g.sym(ret) == Sym::End {
                        f.parent
                    } else {
                        self.frame(ret, f.parent)
                    };
                    let g = self.g.clone();
                    for &a in g.alts(r).iter().rev() {
                        let id = self.frame(a, base);
                        todo.push(id);
                    }
                }
            }
        }
    }

    /// Marks `frame` as expanded in the current step; false when it already was.
    fn first_visit(&mut self, frame: u32) -> bool {
        let i = frame as usize;
        if self.visited.len() <= i {
            self.visited.resize(self.frames.len().max(i + 1), 0);
        }
        if self.visited[i] == self.visit_mark {
            return false;
        }
        self.visited[i] = self.visit_mark;
        true
    }

    /// Starts a new step: every frame may be expanded again.
    fn new_visit(&mut self) {
        self.visit_mark = self.visit_mark.wrapping_add(1);
        if self.visit_mark == 0 {
            // Wrapped: old marks could read as current.
            self.visited.iter_mut().for_each(|v| *v = 0);
            self.visit_mark = 1;
        }
    }

    /// The state after byte `b` from state `s` (`DEAD` when no stack accepts it).
    pub(crate) fn step(&mut self, s: u32, b: u8) -> u32 {
        let known = self.states[s as usize].next[b as usize];
        if known != UNKNOWN {
            return known;
        }
        let tops = self.states[s as usize].stacks.clone();
        let mut out = Vec::with_capacity(tops.len());
        self.new_visit();
        for top in tops {
            if top == NIL {
                continue;
            }
            let f = self.frames[top as usize];
            if let Sym::Bytes(lo, hi) = self.g.sym(f.pos) {
                if lo <= b && b <= hi {
                    let next = f.pos + 1;
                    if self.g.sym(next) == Sym::End {
                        self.expand(f.parent, &mut out);
                    } else {
                        let id = self.frame(next, f.parent);
                        self.expand(id, &mut out);
                    }
                }
            }
        }
        let n = self.intern(out);
        self.states[s as usize].next[b as usize] = n;
        n
    }

    /// The bytes whose transition from `s` is `s` itself.
    pub(crate) fn self_loops(&mut self, s: u32) -> ByteSet {
        if let Some(l) = self.states[s as usize].loops {
            return l;
        }
        let mut l: ByteSet = [0; 4];
        for b in 0..=255u8 {
            if self.step(s, b) == s {
                l[(b >> 6) as usize] |= 1 << (b & 63);
            }
        }
        self.states[s as usize].loops = Some(l);
        l
    }

    /// Rebuilds the cache from the current state alone once it has grown past its bound
    /// (between calls only: state ids are not held anywhere else then).
    pub(crate) fn bound_cache(&mut self) {
        if self.states.len() <= MAX_STATES {
            return;
        }
        let old_frames = std::mem::take(&mut self.frames);
        self.frame_ids.clear();
        self.chain.clear();
        let stacks = self.states[self.cur as usize].stacks.clone();
        self.states.clear();
        self.state_ids.clear();
        let mut memo = HashMap::new();
        let copied: Vec<u32> = stacks
            .iter()
            .map(|&t| self.copy_chain(&old_frames, t, &mut memo))
            .collect();
        self.cur = self.intern(copied);
    }

    fn copy_chain(&mut self, old: &[Frame], id: u32, memo: &mut HashMap<u32, u32>) -> u32 {
        // Iterative: a deeply nested sentence must not recurse per frame.
        let mut chain = Vec::new();
        let mut cur = id;
        while cur != NIL && !memo.contains_key(&cur) {
            chain.push(cur);
            cur = old[cur as usize].parent;
        }
        let mut parent = if cur == NIL { NIL } else { memo[&cur] };
        for &c in chain.iter().rev() {
            parent = self.frame(old[c as usize].pos, parent);
            memo.insert(c, parent);
        }
        parent
    }

    pub(crate) fn current(&self) -> u32 {
        self.cur
    }

    /// The bytes so far form a complete sentence of the grammar.
    pub fn accepting(&self) -> bool {
        self.states[self.cur as usize].stacks.last() == Some(&NIL)
    }

    /// Some byte can follow.
    pub fn can_continue(&self) -> bool {
        self.states[self.cur as usize]
            .stacks
            .iter()
            .any(|&s| s != NIL)
    }

    /// Complete with nothing allowed after: generation must end here.
    pub fn complete(&self) -> bool {
        self.accepting() && !self.can_continue()
    }

    /// Feeds `bytes`; `false` (state unchanged) when the grammar does not allow them.
    pub fn advance_bytes(&mut self, bytes: &[u8]) -> bool {
        self.bound_cache();
        let mut s = self.cur;
        for &b in bytes {
            s = self.step(s, b);
            if s == DEAD {
                return false;
            }
        }
        self.cur = s;
        true
    }

    /// Whether `bytes` may come next (the current state is not changed).
    pub fn allows(&mut self, bytes: &[u8]) -> bool {
        let mut s = self.cur;
        for &b in bytes {
            s = self.step(s, b);
            if s == DEAD {
                return false;
            }
        }
        true
    }

    /// The bytes the grammar allows next, as a 256-entry table.
    pub fn next_bytes(&self) -> [bool; 256] {
        let mut ok = [false; 256];
        for &top in &self.states[self.cur as usize].stacks {
            if top == NIL {
                continue;
            }
            if let Sym::Bytes(lo, hi) = self.g.sym(self.frames[top as usize].pos) {
                for b in lo..=hi {
                    ok[b as usize] = true;
                }
            }
        }
        ok
    }

    /// The span the grammar forces from here: bytes while exactly one byte value may come
    /// next and the sentence is not complete (at most `max`). A draft source for speculative
    /// decoding: these bytes are the only continuation, whatever the model says. The current
    /// state is not changed.
    pub fn forced_bytes(&mut self, max: usize) -> Vec<u8> {
        let start = self.cur;
        let mut out = Vec::new();
        while out.len() < max && !self.accepting() {
            let ok = self.next_bytes();
            let mut it = (0..256).filter(|&b| ok[b]);
            let (Some(b), None) = (it.next(), it.next()) else {
                break;
            };
            let n = self.step(self.cur, b as u8);
            if n == DEAD {
                break;
            }
            self.cur = n;
            out.push(b as u8);
        }
        self.cur = start;
        out
    }

    /// The length of the shortest completion of the stack topped by `frame`: what is left of
    /// each frame's alternative, down to the bottom. Memoized per frame (frames are shared).
    fn chain_len(&mut self, frame: u32) -> u64 {
        if self.chain.len() < self.frames.len() {
            self.chain.resize(self.frames.len(), UNKNOWN);
        }
        // Up to the first known frame, then back down (iterative: stacks may be deep).
        let mut path = Vec::new();
        let mut cur = frame;
        let mut base = 0u64;
        while cur != NIL {
            let known = self.chain[cur as usize];
            if known != UNKNOWN {
                base = known as u64;
                break;
            }
            path.push(cur);
            cur = self.frames[cur as usize].parent;
        }
        for &f in path.iter().rev() {
            base += self.g.rest_len(self.frames[f as usize].pos);
            self.chain[f as usize] = base.min(UNKNOWN as u64 - 1) as u32;
        }
        base
    }

    /// The shortest completion's length in bytes from state `s` (0: complete), and the
    /// stack it takes.
    fn completion_of(&mut self, s: u32) -> (u64, u32) {
        let tops = self.states[s as usize].stacks.clone();
        let mut best = (u64::MAX, NIL);
        for top in tops {
            let l = if top == NIL { 0 } else { self.chain_len(top) };
            if l < best.0 {
                best = (l, top);
            }
        }
        best
    }

    /// The length in bytes of the shortest completion from here (0 when the bytes so far
    /// are a sentence).
    pub fn completion_len(&mut self) -> usize {
        self.completion_of(self.cur).0 as usize
    }

    /// As [`Self::completion_len`], after `bytes` (`None`: the grammar refuses them). The
    /// current state is not changed.
    pub fn completion_len_after(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut s = self.cur;
        for &b in bytes {
            s = self.step(s, b);
            if s == DEAD {
                return None;
            }
        }
        Some(self.completion_of(s).0 as usize)
    }

    /// The shortest bytes that make the output so far a sentence of the grammar (closing
    /// strings, arrays, objects; writing the required members). The state is not changed.
    pub fn shortest_completion(&mut self) -> Vec<u8> {
        self.completion_from(self.cur)
    }

    /// As [`Self::shortest_completion`], after `bytes` (`None`: the grammar refuses them).
    pub fn shortest_completion_after(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        let mut s = self.cur;
        for &b in bytes {
            s = self.step(s, b);
            if s == DEAD {
                return None;
            }
        }
        Some(self.completion_from(s))
    }

    fn completion_from(&mut self, s: u32) -> Vec<u8> {
        let (_, top) = self.completion_of(s);
        let mut out = Vec::new();
        let mut f = top;
        while f != NIL {
            let fr = self.frames[f as usize];
            self.g.write_rest(fr.pos, &mut out);
            f = fr.parent;
        }
        out
    }

    /// Frames held (tests: right recursion must not grow them).
    pub fn frames_held(&self) -> usize {
        self.frames.len()
    }
}
