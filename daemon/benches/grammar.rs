//! Grammar mask cost: microseconds to compute one token mask, on the demo model's vocabulary
//! (4096 byte-level BPE tokens) and on a synthetic 150k-token byte vocabulary, at the
//! matcher states a JSON-Schema generation passes through (structural, inside a string, in a
//! number), warm (transitions cached) and the first time at that state. The mask is the
//! whole per-token overhead of constrained output; `colibri run` reports it beside the
//! decode speed (`[grammar] ... us per token`).
//!
//! `cargo bench -p colibri --bench grammar`

use std::sync::Arc;
use std::time::Instant;

use colibri::grammar::{Grammar, GrammarState, TokenTrie};
use colibri::tokenizer::Tokenizer;

const SCHEMA: &str = r#"{"type":"object","properties":{
  "name":{"type":"string"},"count":{"type":"integer"},
  "tags":{"type":"array","items":{"type":"string"}},"ok":{"type":"boolean"}},
  "required":["name","count","ok"]}"#;

/// A Pydantic model: `$defs` / `$ref`, bounds as digit automata, a pattern, `Optional`.
const PYDANTIC: &str = r##"{"$defs":{"Address":{"properties":{"street":{"type":"string"},
  "zip":{"pattern":"^[0-9]{5}$","type":"string"}},"required":["street","zip"],"type":"object"}},
  "properties":{"name":{"type":"string","maxLength":20},
  "age":{"minimum":1,"maximum":150,"type":"integer"},
  "score":{"exclusiveMinimum":-2.5,"maximum":99.75,"type":"number"},
  "home":{"anyOf":[{"$ref":"#/$defs/Address"},{"type":"null"}]}},
  "required":["name","age","score"],"type":"object","additionalProperties":{"type":"string"}}"##;

const PYDANTIC_STATES: &[(&str, &str)] = &[
    ("start", ""),
    ("bounded int", "{\"name\":\"x\",\"age\":1"),
    ("bounded num", "{\"name\":\"x\",\"age\":12,\"score\":-1.2"),
    (
        "pattern",
        "{\"name\":\"x\",\"age\":12,\"score\":3,\"home\":{\"street\":\"a\",\"zip\":\"12",
    ),
    ("extra key", "{\"name\":\"x\",\"age\":12,\"score\":3,\"na"),
];

/// (label, bytes fed before the mask).
const STATES: &[(&str, &str)] = &[
    ("start", ""),
    ("key", "{\"name\""),
    ("string", "{\"name\":\"The quick "),
    ("number", "{\"name\":\"x\",\"count\":12"),
    ("after value", "{\"name\":\"x\",\"count\":12,\"ok\":true"),
];

fn demo_trie() -> TokenTrie {
    let tok =
        Tokenizer::from_bytes(include_bytes!("../demo/tokenizer.json")).expect("demo tokenizer");
    let n = tok.vocab_size();
    TokenTrie::new(
        n,
        (0..n as u32)
            .filter(|&id| !tok.is_special(id))
            .map(|id| (id, tok.token_bytes(id))),
    )
}

/// 150k distinct byte strings shaped like a BPE vocabulary: every single byte, then words
/// with and without a leading space, digit runs, punctuation clusters and multi-byte UTF-8.
fn synthetic_vocab(n: usize) -> Vec<Vec<u8>> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    out.iter().for_each(|t| {
        seen.insert(t.clone());
    });
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = |m: u64| {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) % m
    };
    let letters = b"etaoinshrdlcumwfgypbvkjxqz";
    let punct: &[&[u8]] = &[
        b"\"", b"\",", b"\":", b"{", b"}", b"[", b"]", b",", b".", b"\n", b"  ", b"\\n",
    ];
    let uni = ["é", "ü", "日本", "语", "α", "ß", "—", "…"];
    while out.len() < n {
        let mut t = Vec::new();
        match rnd(10) {
            0..=5 => {
                if rnd(2) == 0 {
                    t.push(b' ');
                }
                for i in 0..1 + rnd(9) {
                    let c = letters[(rnd(26) * rnd(26) / 26) as usize];
                    t.push(if i == 0 && rnd(5) == 0 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    });
                }
            }
            6 => (0..1 + rnd(4)).for_each(|_| t.push(b'0' + rnd(10) as u8)),
            7 => (0..1 + rnd(3))
                .for_each(|_| t.extend_from_slice(punct[rnd(punct.len() as u64) as usize])),
            _ => (0..1 + rnd(3))
                .for_each(|_| t.extend_from_slice(uni[rnd(uni.len() as u64) as usize].as_bytes())),
        }
        if seen.insert(t.clone()) {
            out.push(t);
        }
    }
    out
}

fn measure(label: &str, trie: &TokenTrie, g: &Arc<Grammar>, states: &[(&str, &str)]) {
    let mut allowed = vec![false; trie.vocab()];
    for &(name, prefix) in states {
        let mut st = GrammarState::new(g.clone());
        assert!(st.advance_bytes(prefix.as_bytes()), "{prefix}");
        // The first mask at a state builds its transitions; later ones read them.
        let t0 = Instant::now();
        let n_allowed = st.fill_mask(trie, &mut allowed);
        let cold = t0.elapsed().as_secs_f64() * 1e6;
        let reps = 50;
        let t0 = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(st.fill_mask(trie, &mut allowed));
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
        // The budget's query: the shortest completion from here.
        let t0 = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(st.shortest_completion());
        }
        let close = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
        println!(
            "{label:>10} {name:>12}: {us:>9.1} us per mask warm, {cold:>9.1} us the first time, {n_allowed:>6} of {} tokens allowed, {close:.1} us shortest completion",
            trie.vocab()
        );
    }
}

fn main() {
    let g = Arc::new(Grammar::from_json_schema(SCHEMA).expect("schema"));
    let p = Arc::new(Grammar::from_json_schema(PYDANTIC).expect("schema"));
    let demo = demo_trie();
    measure("demo 4k", &demo, &g, STATES);
    measure("demo 4k", &demo, &p, PYDANTIC_STATES);
    let vocab = synthetic_vocab(150_000);
    let trie = TokenTrie::new(
        vocab.len(),
        vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (i as u32, t.as_slice())),
    );
    measure("synth 150k", &trie, &g, STATES);
    measure("synth 150k", &trie, &p, PYDANTIC_STATES);
}
