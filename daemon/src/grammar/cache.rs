//! Compiled JSON-Schema grammars shared between requests.
//!
//! An agent sends the same tools with every request, and a queued request holds its grammar
//! until it runs: compiled once and shared, 64 queued requests with one toolset hold one
//! grammar rather than 64, and the compile is paid once. A grammar holds about 5 KB per KB
//! of schema (measured: 30k optional integer members, 868 KB, compile to 4.1 MB; half of
//! them required, 3 KB per KB), and at most about 7 MB whatever the schema (the compiler's
//! bound of 2^20 symbols: 37k such members, 1.07 MB, compile to 5.2 MB).

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_128;

use super::{Grammar, GrammarError};

/// Grammars kept (the most recently used), and the most bytes they may hold together
/// (schema text and compiled grammar; one larger than that is compiled but not kept).
const ENTRIES: usize = 16;
const BYTES: usize = 64 << 20;

struct Entry {
    hash: u128,
    /// Compared on a hash match: a client that crafts a colliding schema must not be
    /// handed another client's grammar, nor hand its own to them.
    text: Box<str>,
    grammar: Arc<Grammar>,
    /// The keywords relaxed (a strict request refuses a schema with any).
    warnings: Arc<[String]>,
    bytes: usize,
}

/// A compiled schema as the cache hands it out.
pub type Checked = (Arc<Grammar>, Arc<[String]>);

/// A small cache of compiled schemas, most recently used first.
pub struct SchemaCache {
    entries: Mutex<Vec<Entry>>,
    max_entries: usize,
    max_bytes: usize,
}

impl SchemaCache {
    pub fn new(max_entries: usize, max_bytes: usize) -> SchemaCache {
        SchemaCache {
            entries: Mutex::new(Vec::new()),
            max_entries,
            max_bytes,
        }
    }

    /// The process's cache (the API's requests share it).
    pub fn shared() -> &'static SchemaCache {
        static CACHE: OnceLock<SchemaCache> = OnceLock::new();
        CACHE.get_or_init(|| SchemaCache::new(ENTRIES, BYTES))
    }

    /// The grammar of JSON Schema `text` if the cache has it (cheap: a hash and a compare,
    /// no compile).
    pub fn cached(&self, text: &str) -> Option<Arc<Grammar>> {
        self.cached_checked(text).map(|(g, _)| g)
    }

    /// As [`Self::cached`], with the schema's warnings.
    pub fn cached_checked(&self, text: &str) -> Option<Checked> {
        self.lookup(xxh3_128(text.as_bytes()), text)
    }

    /// The grammar of JSON Schema `text`, from the cache or compiled. The compile runs
    /// without the lock held, so two different schemas compile side by side (the same one
    /// sent twice at once may compile twice; both requests then share the first kept).
    pub fn json_schema(&self, text: &str) -> Result<Arc<Grammar>, GrammarError> {
        self.json_schema_checked(text).map(|(g, _)| g)
    }

    /// As [`Self::json_schema`], with the keywords relaxed (compiled leniently once; a
    /// strict request refuses the schema when there is any).
    pub fn json_schema_checked(&self, text: &str) -> Result<Checked, GrammarError> {
        let hash = xxh3_128(text.as_bytes());
        if let Some(c) = self.lookup(hash, text) {
            return Ok(c);
        }
        let (g, warnings) = Grammar::from_json_schema_checked(text, false)?;
        Ok(self.insert(hash, text, (Arc::new(g), warnings.into())))
    }

    fn lookup(&self, hash: u128, text: &str) -> Option<Checked> {
        let mut entries = self.entries.lock();
        let i = entries
            .iter()
            .position(|e| e.hash == hash && *e.text == *text)?;
        let e = entries.remove(i);
        let c = (e.grammar.clone(), e.warnings.clone());
        entries.insert(0, e);
        Some(c)
    }

    fn insert(&self, hash: u128, text: &str, (grammar, warnings): Checked) -> Checked {
        let bytes = text.len() + grammar.heap_bytes();
        if bytes > self.max_bytes || self.max_entries == 0 {
            return (grammar, warnings);
        }
        let mut entries = self.entries.lock();
        if let Some(e) = entries.iter().find(|e| e.hash == hash && *e.text == *text) {
            return (e.grammar.clone(), e.warnings.clone());
        }
        entries.insert(
            0,
            Entry {
                hash,
                text: text.into(),
                grammar: grammar.clone(),
                warnings: warnings.clone(),
                bytes,
            },
        );
        let mut total = 0;
        let keep = entries
            .iter()
            .take(self.max_entries)
            .take_while(|e| {
                total += e.bytes;
                total <= self.max_bytes
            })
            .count();
        entries.truncate(keep);
        (grammar, warnings)
    }

    /// Grammars kept now.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
