//! `.coli_kv` persistence of one KV slot, upstream's COLIKV1 format (CONTRACT.md §4):
//!
//! ```text
//! "COLIKV1\0"                                            8 bytes
//! i32 h[8] = n_layers, kv_lora, qk_rope, index_hd, n_index_layers, vocab, nrec, 0   (LE)
//! nrec records: i32 token, then per layer kv_lora f32 + qk_rope f32,
//!               then per full-indexer layer index_hd f32
//! ```
//!
//! Records are only ever appended past the durable count, and the count (`h[6]`, byte 32) is
//! rewritten last, after the records are on disk. A kill at any instant therefore leaves a file
//! whose count names only complete, durable records: it loads to a prefix of the conversation.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::model::KvCache;

pub const MAGIC: &[u8; 8] = b"COLIKV1\0";
const HEADER: u64 = 40;
const NREC_AT: u64 = 32;

/// The shape a file must have to belong to this model: h[0..6].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_layers: u32,
    pub kv_lora: u32,
    pub qk_rope: u32,
    pub index_hd: u32,
    pub n_index_layers: u32,
    pub vocab: u32,
}

impl KvShape {
    pub fn of(kv: &KvCache, vocab: usize) -> KvShape {
        let n_index = (0..kv.layers.len()).filter(|&l| kv.has_index(l)).count() as u32;
        KvShape {
            n_layers: kv.layers.len() as u32,
            kv_lora: kv.kv_lora as u32,
            qk_rope: kv.rope_dim as u32,
            index_hd: if n_index > 0 { kv.index_dim as u32 } else { 0 },
            n_index_layers: n_index,
            vocab: vocab as u32,
        }
    }

    /// Bytes of one record.
    pub fn record_bytes(&self) -> u64 {
        4 + 4
            * (self.n_layers as u64 * (self.kv_lora + self.qk_rope) as u64
                + self.n_index_layers as u64 * self.index_hd as u64)
    }

    fn header(&self, nrec: u32) -> [u8; 40] {
        let mut h = [0u8; 40];
        h[..8].copy_from_slice(MAGIC);
        let fields = [
            self.n_layers,
            self.kv_lora,
            self.qk_rope,
            self.index_hd,
            self.n_index_layers,
            self.vocab,
            nrec,
            0,
        ];
        for (i, v) in fields.iter().enumerate() {
            h[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        h
    }
}

/// Why a saved file was not resumed. Never fatal: the slot starts empty and says why.
#[derive(Debug, thiserror::Error)]
pub enum KvLoadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: not a COLIKV1 file")]
    NotKv(PathBuf),
    #[error("{0}: saved by a different model or version")]
    Foreign(PathBuf),
    #[error("{path}: saved conversation ({nrec} tokens) does not fit the context of {ctx}")]
    TooLong {
        path: PathBuf,
        nrec: usize,
        ctx: usize,
    },
    #[error("{path}: record {index} holds token {token}, outside the vocabulary")]
    BadToken {
        path: PathBuf,
        index: usize,
        token: i64,
    },
}

/// An open `.coli_kv` file and how many of its records are durable.
pub struct KvFile {
    path: PathBuf,
    file: File,
    shape: KvShape,
    nrec: usize,
}

impl KvFile {
    /// Opens (creating, mode 0600) the file of a slot. An existing file that does not match is
    /// left alone until the first save overwrites its header.
    pub fn open(path: &Path, shape: KvShape) -> std::io::Result<KvFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        Ok(KvFile {
            path: path.to_path_buf(),
            file,
            shape,
            nrec: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the saved conversation into `kv` (which must be empty). On any problem `kv` stays
    /// empty and the error says why; the file's durable count then restarts at 0.
    pub fn load(&mut self, kv: &mut KvCache, ctx: usize) -> Result<usize, KvLoadError> {
        let io = |source| KvLoadError::Io {
            path: self.path.clone(),
            source,
        };
        let len = self.file.metadata().map_err(io)?.len();
        if len == 0 {
            return Ok(0);
        }
        let mut head = [0u8; 40];
        if len < HEADER {
            return Err(KvLoadError::NotKv(self.path.clone()));
        }
        self.file.read_exact_at(&mut head, 0).map_err(io)?;
        if &head[..8] != MAGIC {
            return Err(KvLoadError::NotKv(self.path.clone()));
        }
        let field =
            |i: usize| i32::from_le_bytes(head[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes"));
        if head[8..32] != self.shape.header(0)[8..32] {
            return Err(KvLoadError::Foreign(self.path.clone()));
        }
        let rec = self.shape.record_bytes();
        let claimed = field(6).max(0) as u64;
        // A count beyond what was physically written (a torn tail) keeps the complete records.
        let nrec = claimed.min((len - HEADER) / rec) as usize;
        if nrec >= ctx {
            return Err(KvLoadError::TooLong {
                path: self.path.clone(),
                nrec,
                ctx,
            });
        }
        let mut reader = std::io::BufReader::new(&self.file);
        std::io::Seek::seek(&mut reader, std::io::SeekFrom::Start(HEADER)).map_err(io)?;
        let mut buf = vec![0u8; rec as usize];
        let mut loaded = kv.clone();
        loaded.clear();
        for index in 0..nrec {
            reader.read_exact(&mut buf).map_err(io)?;
            let token = i32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
            if token < 0 || token as u32 >= self.shape.vocab {
                return Err(KvLoadError::BadToken {
                    path: self.path.clone(),
                    index,
                    token: token as i64,
                });
            }
            loaded.push_record(token as u32, &buf[4..]);
        }
        *kv = loaded;
        self.nrec = nrec;
        Ok(nrec)
    }

    /// Makes the file hold exactly `kv`: records past the longest durable prefix that still
    /// matches are rewritten. Called at each turn end.
    pub fn save(&mut self, kv: &KvCache) -> std::io::Result<()> {
        // Keep the durable prefix only where its tokens still agree with the history.
        let keep = self.nrec.min(kv.len());
        if keep < self.nrec {
            self.set_count(keep)?;
        }
        let rec = self.shape.record_bytes() as usize;
        let mut out = Vec::with_capacity((kv.len() - keep) * rec);
        for pos in keep..kv.len() {
            kv.write_record(pos, &mut out);
        }
        if self.nrec == 0 && keep == 0 {
            // A fresh (or foreign) file: header with count 0 first.
            self.file.write_all_at(&self.shape.header(0), 0)?;
        }
        self.file.write_all_at(&out, HEADER + (keep * rec) as u64)?;
        self.file.sync_data()?;
        self.set_count(kv.len())
    }

    /// Forgets everything (RESET): the count goes to 0, the file is cut to its header.
    pub fn clear(&mut self) -> std::io::Result<()> {
        self.file.write_all_at(&self.shape.header(0), 0)?;
        self.file.sync_data()?;
        self.file.set_len(HEADER)?;
        self.nrec = 0;
        Ok(())
    }

    /// Drops records past `n` (a reused prefix shorter than what is saved).
    pub fn truncate(&mut self, n: usize) -> std::io::Result<()> {
        if n < self.nrec {
            self.set_count(n)?;
        }
        Ok(())
    }

    fn set_count(&mut self, n: usize) -> std::io::Result<()> {
        self.file.write_all_at(&(n as i32).to_le_bytes(), NREC_AT)?;
        self.file.sync_data()?;
        self.nrec = n;
        Ok(())
    }

    pub fn durable_records(&self) -> usize {
        self.nrec
    }
}

/// Writes a whole file at once (tests, tools).
pub fn write_file(path: &Path, kv: &KvCache, shape: KvShape) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(&shape.header(kv.len() as u32))?;
    let mut out = Vec::new();
    for pos in 0..kv.len() {
        kv.write_record(pos, &mut out);
    }
    f.write_all(&out)?;
    f.sync_all()
}
