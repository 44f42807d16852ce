//! Syntax tree to the flat byte-level automaton, with the checks that keep the matcher
//! finite: every rule referenced is defined, no rule can reach itself without consuming a
//! byte (left recursion would expand forever), and every reachable rule can finish.

use std::collections::HashMap;

use super::gbnf::{RuleDef, Term};
use super::{utf8, Grammar, GrammarError, Sym};

/// Symbols a grammar may compile to (repetitions are copied out).
const MAX_SYMS: usize = 1 << 20;

#[derive(Clone, Copy)]
enum S0 {
    Bytes(u8, u8),
    Rule(usize),
}

struct Compiler<'a> {
    src: &'a str,
    names: HashMap<&'a str, usize>,
    rules: Vec<Vec<Vec<S0>>>,
    /// Per rule: the named rule it belongs to (errors name it) and its byte offset.
    origin: Vec<(usize, usize)>,
    defs: &'a [RuleDef],
    size: usize,
}

pub fn compile(src: &str, defs: &[RuleDef]) -> Result<Grammar, GrammarError> {
    let mut names = HashMap::new();
    for (i, d) in defs.iter().enumerate() {
        if names.insert(d.name.as_str(), i).is_some() {
            return Err(GrammarError::at(
                src,
                d.at,
                format!("a new rule name: `{}` is already defined", d.name),
            ));
        }
    }
    let root = *names.get("root").ok_or_else(|| {
        GrammarError::at(
            src,
            0,
            "expected a rule named `root` (the start rule)".into(),
        )
    })?;
    let mut c = Compiler {
        src,
        names,
        rules: vec![Vec::new(); defs.len()],
        origin: defs.iter().enumerate().map(|(i, d)| (i, d.at)).collect(),
        defs,
        size: 0,
    };
    for (i, d) in defs.iter().enumerate() {
        let mut alts = Vec::with_capacity(d.alts.len());
        for a in &d.alts {
            alts.push(c.seq(a, i)?);
        }
        c.rules[i] = alts;
    }
    c.check(root)?;
    Ok(c.flatten(root))
}

impl Compiler<'_> {
    fn new_rule(&mut self, alts: Vec<Vec<S0>>, owner: usize) -> usize {
        self.rules.push(alts);
        self.origin.push((owner, self.defs[owner].at));
        self.rules.len() - 1
    }

    fn grow(&mut self, n: usize, owner: usize) -> Result<(), GrammarError> {
        self.size += n;
        if self.size > MAX_SYMS {
            return Err(GrammarError::at(
                self.src,
                self.defs[owner].at,
                format!(
                    "a smaller grammar: rule `{}` takes it past {MAX_SYMS} symbols once its repetitions are copied out",
                    self.defs[owner].name
                ),
            ));
        }
        Ok(())
    }

    fn seq(&mut self, terms: &[Term], owner: usize) -> Result<Vec<S0>, GrammarError> {
        let mut out = Vec::new();
        for t in terms {
            self.term(t, owner, &mut out)?;
        }
        self.grow(out.len() + 1, owner)?;
        Ok(out)
    }

    fn term(&mut self, t: &Term, owner: usize, out: &mut Vec<S0>) -> Result<(), GrammarError> {
        match t {
            Term::Literal(cps) => {
                for &cp in cps {
                    let ch = char::from_u32(cp).expect("the parser yields scalar values");
                    let mut buf = [0u8; 4];
                    for &b in ch.encode_utf8(&mut buf).as_bytes() {
                        out.push(S0::Bytes(b, b));
                    }
                }
            }
            Term::Class { negated, ranges } => {
                let mut set = utf8::normalize(ranges);
                if *negated {
                    set = utf8::complement(&set);
                }
                let mut seqs = Vec::new();
                for (lo, hi) in set {
                    utf8::sequences(lo, hi, &mut seqs);
                }
                let alts: Vec<Vec<S0>> = seqs
                    .into_iter()
                    .map(|s| s.into_iter().map(|(lo, hi)| S0::Bytes(lo, hi)).collect())
                    .collect();
                if alts.len() == 1 {
                    out.extend_from_slice(&alts[0]);
                } else {
                    self.grow(alts.iter().map(|a| a.len() + 1).sum(), owner)?;
                    out.push(S0::Rule(self.new_rule(alts, owner)));
                }
            }
            Term::Ref { name, at } => match self.names.get(name.as_str()) {
                Some(&r) => out.push(S0::Rule(r)),
                None => {
                    return Err(GrammarError::at(
                        self.src,
                        *at,
                        format!("a defined rule: `{name}` is never defined"),
                    ))
                }
            },
            Term::Group(alts) => {
                let mut compiled = Vec::with_capacity(alts.len());
                for a in alts {
                    compiled.push(self.seq(a, owner)?);
                }
                out.push(S0::Rule(self.new_rule(compiled, owner)));
            }
            Term::Repeat { term, min, max } => {
                let mut unit = Vec::new();
                self.term(term, owner, &mut unit)?;
                if unit.len() != 1 {
                    unit = vec![S0::Rule(self.new_rule(vec![unit], owner))];
                }
                let u = unit[0];
                self.grow(*min as usize, owner)?;
                out.extend(std::iter::repeat_n(u, *min as usize));
                match max {
                    None => {
                        // star ::= unit star | (empty)
                        let star = self.new_rule(Vec::new(), owner);
                        self.rules[star] = vec![vec![u, S0::Rule(star)], Vec::new()];
                        out.push(S0::Rule(star));
                    }
                    Some(max) if max > min => {
                        // opt_1 ::= unit | ();  opt_k ::= unit opt_(k-1) | ()
                        let mut prev: Option<usize> = None;
                        for _ in 0..(max - min) {
                            let mut first = vec![u];
                            first.extend(prev.map(S0::Rule));
                            self.grow(first.len() + 2, owner)?;
                            prev = Some(self.new_rule(vec![first, Vec::new()], owner));
                        }
                        out.push(S0::Rule(prev.expect("max > min")));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    fn err_rule(&self, r: usize, msg: String) -> GrammarError {
        let (owner, at) = self.origin[r];
        let name = &self.defs[owner].name;
        let what = if r == owner {
            format!("rule `{name}`")
        } else {
            format!("a group, class or repetition in rule `{name}`")
        };
        GrammarError::at(self.src, at, msg.replace("{}", &what))
    }

    fn check(&self, root: usize) -> Result<(), GrammarError> {
        let n = self.rules.len();
        // Reachable from root.
        let mut reach = vec![false; n];
        let mut todo = vec![root];
        reach[root] = true;
        while let Some(r) = todo.pop() {
            for a in &self.rules[r] {
                for s in a {
                    if let S0::Rule(x) = *s {
                        if !reach[x] {
                            reach[x] = true;
                            todo.push(x);
                        }
                    }
                }
            }
        }
        let productive = self.least_fixpoint(true);
        // Name the cause: a rule that recurses into itself or has no alternatives, rather
        // than every rule that merely refers to it.
        let dead = |r: usize| reach[r] && !productive[r];
        let cause = (0..n)
            .filter(|&r| dead(r))
            .find(|&r| {
                self.rules[r].is_empty()
                    || self.rules[r]
                        .iter()
                        .any(|a| a.iter().any(|s| matches!(*s, S0::Rule(x) if x == r)))
            })
            .or_else(|| (0..n).find(|&r| dead(r)));
        if let Some(r) = cause {
            return Err(self.err_rule(
                r,
                "a rule that can finish: {} never ends (every alternative recurses forever) or matches nothing".into(),
            ));
        }
        let nullable = self.least_fixpoint(false);
        // Left recursion: a cycle among "may be expanded before any byte" edges.
        let mut color = vec![0u8; n];
        for start in 0..n {
            if color[start] != 0 || !reach[start] {
                continue;
            }
            let mut stack = vec![(start, self.left_edges(start, &nullable), 0usize)];
            color[start] = 1;
            while let Some((r, edges, i)) = stack.last_mut() {
                if *i == edges.len() {
                    color[*r] = 2;
                    stack.pop();
                    continue;
                }
                let x = edges[*i];
                *i += 1;
                match color[x] {
                    0 => {
                        color[x] = 1;
                        let e = self.left_edges(x, &nullable);
                        stack.push((x, e, 0));
                    }
                    1 => {
                        return Err(self.err_rule(
                            x,
                            "no left recursion: {} can reach itself without consuming input".into(),
                        ))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The rules with an alternative whose every symbol holds: a byte symbol holds when
    /// `bytes_hold` (productive: a rule that can finish; nullable: a rule that can match
    /// nothing when it does not), a rule symbol when that rule is in the set.
    ///
    /// A worklist, not passes until nothing changes: each alternative counts the rule
    /// symbols it still waits for, and a rule joining the set visits only the alternatives
    /// that refer to it, so the cost is linear in the grammar's size whatever the order of
    /// its rules (passes over `a ::= "x" b`, `b ::= "x" c`, ... written top down take one
    /// pass per rule: quadratic).
    fn least_fixpoint(&self, bytes_hold: bool) -> Vec<bool> {
        let n = self.rules.len();
        // Per alternative (numbered across all rules): its rule and the symbols it waits for.
        let mut owner = Vec::new();
        let mut waits = Vec::new();
        // Per rule, the alternatives referring to it, once per reference.
        let mut users: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut done = vec![false; n];
        let mut ready = Vec::new();
        for (r, alts) in self.rules.iter().enumerate() {
            for a in alts {
                let id = owner.len() as u32;
                owner.push(r);
                let mut wait = 0usize;
                let mut possible = true;
                for s in a {
                    match *s {
                        S0::Bytes(..) => possible &= bytes_hold,
                        S0::Rule(x) => {
                            wait += 1;
                            users[x].push(id);
                        }
                    }
                }
                // An alternative that can never hold waits for more than it has.
                waits.push(if possible { wait } else { usize::MAX });
                if possible && wait == 0 && !done[r] {
                    done[r] = true;
                    ready.push(r);
                }
            }
        }
        while let Some(x) = ready.pop() {
            for &a in &users[x] {
                let w = &mut waits[a as usize];
                if *w == usize::MAX {
                    continue;
                }
                *w -= 1;
                let r = owner[a as usize];
                if *w == 0 && !done[r] {
                    done[r] = true;
                    ready.push(r);
                }
            }
        }
        done
    }

    fn left_edges(&self, r: usize, nullable: &[bool]) -> Vec<usize> {
        let mut out = Vec::new();
        for a in &self.rules[r] {
            for s in a {
                match *s {
                    S0::Bytes(..) => break,
                    S0::Rule(x) => {
                        out.push(x);
                        if !nullable[x] {
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    fn flatten(self, root: usize) -> Grammar {
        let mut syms = Vec::with_capacity(self.rules.iter().flatten().map(|a| a.len() + 1).sum());
        let mut alt_starts = Vec::with_capacity(self.rules.iter().map(Vec::len).sum());
        let mut rule_alts = Vec::with_capacity(self.rules.len() + 1);
        for r in &self.rules {
            rule_alts.push(alt_starts.len() as u32);
            for a in r {
                alt_starts.push(syms.len() as u32);
                syms.extend(a.iter().map(|s| match *s {
                    S0::Bytes(lo, hi) => Sym::Bytes(lo, hi).pack(),
                    S0::Rule(x) => Sym::Rule(x as u32).pack(),
                }));
                syms.push(Sym::End.pack());
            }
        }
        rule_alts.push(alt_starts.len() as u32);
        let mut g = Grammar {
            syms,
            alt_starts,
            rule_alts,
            root: root as u32,
            min_len: Vec::new(),
            min_alt: Vec::new(),
        };
        (g.min_len, g.min_alt) = super::shortest::shortest(&g);
        g
    }
}
