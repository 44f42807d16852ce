//! `.coli_kv` persistence of one KV slot (CONTRACT.md §4, format in protocol/README.md).
//!
//! Written as COLIKV2, which checksums every record; upstream's COLIKV1 is still read.
//!
//! ```text
//! COLIKV1: "COLIKV1\0" | i32 h[8] = shape[6], nrec, 0 | nrec x record
//! COLIKV2: "COLIKV2\0" | u32 shape[6] | u32 nrec | u32 crc32c(bytes 0..36)
//!          | u64 family, index, content, formats | u32 crc32c(bytes 40..72)
//!          | nrec x (record | u32 crc32c(u32 index LE ++ record))
//! record:  i32 token, then per layer kv_lora f32 + qk_rope f32,
//!          then per full-indexer layer index_hd f32                        (all LE)
//! ```
//!
//! Records are only ever appended past the durable count, and the count (with the header
//! checksum that covers it, one 8-byte write at byte 32) is rewritten last, after the records
//! are on disk. A kill at any instant therefore leaves a file whose count names only complete,
//! durable records: it loads to a prefix of the conversation. A record whose checksum fails
//! (bit rot, a bad sector) ends the load there: the records before it are kept.
//!
//! A cache with recurrent states (Qwen3.5-MoE's DeltaNet layers, which keep nothing per
//! position) has them saved beside the records, `<file>.state` (`kv_state.rs`): a load
//! without the snapshot of exactly the loaded conversation resumes nothing.
//!
//! A COLIKV2 file is bound to what made it (`ModelIdentity`: family, tensor index, the
//! weights' fingerprint, the compute formats). A file bound to anything else, or to nothing,
//! is never resumed: the caller sets it aside ([`KvFile::set_aside`]). Upstream's COLIKV1
//! cannot carry a binding; it is resumed on its shape alone, as upstream does.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::identity::ModelIdentity;
use crate::model::KvCache;

/// Upstream's format, read only.
pub const MAGIC_V1: &[u8; 8] = b"COLIKV1\0";
/// The checksummed format this engine writes.
pub const MAGIC: &[u8; 8] = b"COLIKV2\0";
/// COLIKV1's header, and the first part of COLIKV2's (the part upstream also has).
const HEADER_V1: u64 = 40;
/// COLIKV2's header: the first part, then the binding and its checksum.
pub const HEADER: u64 = 76;
const NREC_AT: u64 = 32;
/// The checksum after each COLIKV2 record.
const REC_CRC: u64 = 4;

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
        // A grouped-query cache's keys and values fill the two widths MLA's latent and rope
        // key use (one layout per cache; the binding's family says which).
        // DeltaNet layers keep no row per position (their state is saved apart,
        // `kv_state.rs`): the records hold the other layers'.
        let rows_layers = kv.layers.iter().filter(|l| !l.is_state()).count();
        KvShape {
            n_layers: rows_layers as u32,
            kv_lora: (kv.kv_lora + kv.kv_dim) as u32,
            qk_rope: (kv.rope_dim + kv.kv_dim) as u32,
            index_hd: if n_index > 0 { kv.index_dim as u32 } else { 0 },
            n_index_layers: n_index,
            vocab: vocab as u32,
        }
    }

    /// Bytes of one record's payload (without the COLIKV2 checksum).
    pub fn record_bytes(&self) -> u64 {
        4 + 4
            * (self.n_layers as u64 * (self.kv_lora + self.qk_rope) as u64
                + self.n_index_layers as u64 * self.index_hd as u64)
    }

    fn fields(&self) -> [u8; 24] {
        let mut f = [0u8; 24];
        let vals = [
            self.n_layers,
            self.kv_lora,
            self.qk_rope,
            self.index_hd,
            self.n_index_layers,
            self.vocab,
        ];
        for (i, v) in vals.iter().enumerate() {
            f[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        f
    }

    /// The first 40 bytes of a COLIKV2 header holding `nrec` (count and checksum last).
    fn header_head(&self, nrec: u32) -> [u8; 40] {
        let mut h = [0u8; 40];
        h[..8].copy_from_slice(MAGIC);
        h[8..32].copy_from_slice(&self.fields());
        h[32..36].copy_from_slice(&nrec.to_le_bytes());
        let crc = crc32c::crc32c(&h[..36]);
        h[36..40].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Upstream's COLIKV1 header (tests and tools that make files for upstream).
    pub fn header_v1(&self, nrec: u32) -> [u8; 40] {
        let mut h = [0u8; 40];
        h[..8].copy_from_slice(MAGIC_V1);
        h[8..32].copy_from_slice(&self.fields());
        h[32..36].copy_from_slice(&nrec.to_le_bytes());
        h
    }
}

/// What a COLIKV2 file is bound to: the shape of its records and what made them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBinding {
    pub shape: KvShape,
    pub identity: ModelIdentity,
}

impl KvBinding {
    /// The whole COLIKV2 header holding `nrec`.
    fn header(&self, nrec: u32) -> [u8; HEADER as usize] {
        let mut h = [0u8; HEADER as usize];
        h[..40].copy_from_slice(&self.shape.header_head(nrec));
        h[40..72].copy_from_slice(&self.identity.to_bytes());
        let crc = crc32c::crc32c(&h[40..72]);
        h[72..76].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

/// The binding a COLIKV2 file records, when it has an intact one (tools and tests that open
/// a file a daemon wrote).
pub fn saved_identity(path: &Path) -> std::io::Result<Option<ModelIdentity>> {
    let file = File::open(path)?;
    let mut head = [0u8; HEADER as usize];
    if read_up_to(&file, &mut head)? < HEADER as usize || &head[..8] != MAGIC {
        return Ok(None);
    }
    Ok(binding_of(&head))
}

/// The identity in a COLIKV2 header, if its checksum holds.
fn binding_of(head: &[u8; HEADER as usize]) -> Option<ModelIdentity> {
    let crc = u32::from_le_bytes(head[72..76].try_into().expect("4 bytes"));
    (crc == crc32c::crc32c(&head[40..72]))
        .then(|| ModelIdentity::from_bytes(head[40..72].try_into().expect("32 bytes")))
}

/// The checksum of record `index`: its position is part of what is checked, so a record
/// copied, shifted or replayed into another place fails too.
pub fn record_crc(index: usize, record: &[u8]) -> u32 {
    let seed = crc32c::crc32c(&(index as u32).to_le_bytes());
    crc32c::crc32c_append(seed, record)
}

/// Why a saved file was not resumed at all. Never fatal: the slot starts empty and says why.
#[derive(Debug, thiserror::Error)]
pub enum KvLoadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: not a .coli_kv file (no COLIKV1 or COLIKV2 magic)")]
    NotKv(PathBuf),
    #[error("{path}: header cut short ({len} of 40 bytes)")]
    ShortHeader { path: PathBuf, len: u64 },
    #[error("{0}: header checksum mismatch (damaged file): kept 0 tokens")]
    HeaderChecksum(PathBuf),
    #[error("{0}: saved by a model of another shape")]
    Foreign(PathBuf),
    #[error("{0}: saved without a model binding (by an older colibri, or its binding is damaged)")]
    Unbound(PathBuf),
    #[error("{path}: {why}")]
    Mismatch { path: PathBuf, why: &'static str },
    #[error("{path}: saved conversation ({nrec} tokens) does not fit the context of {ctx}")]
    TooLong {
        path: PathBuf,
        nrec: usize,
        ctx: usize,
    },
}

impl KvLoadError {
    /// Whether the file holds a conversation that must be kept but never resumed here: it is
    /// set aside rather than overwritten by the next save.
    pub fn sets_aside(&self) -> bool {
        matches!(
            self,
            KvLoadError::Foreign(_)
                | KvLoadError::Unbound(_)
                | KvLoadError::Mismatch { .. }
                | KvLoadError::TooLong { .. }
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    /// Upstream's, without checksums: its records cannot be verified.
    V1,
    V2,
}

/// Why a load stopped before the count the header claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDamage {
    /// Record `index` failed its checksum.
    Checksum { index: usize },
    /// Record `index` holds a token outside the vocabulary.
    BadToken { index: usize, token: i64 },
    /// The file ends inside record `index` (cut short by something other than this engine).
    Truncated { index: usize },
}

impl KvDamage {
    pub fn index(&self) -> usize {
        match *self {
            KvDamage::Checksum { index }
            | KvDamage::BadToken { index, .. }
            | KvDamage::Truncated { index } => index,
        }
    }
}

impl std::fmt::Display for KvDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvDamage::Checksum { index } => write!(f, "record {index} failed its checksum"),
            KvDamage::BadToken { index, token } => {
                write!(
                    f,
                    "record {index} holds token {token}, outside the vocabulary"
                )
            }
            KvDamage::Truncated { index } => write!(f, "the file ends inside record {index}"),
        }
    }
}

/// What a load kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLoaded {
    /// Records (tokens) now in the cache.
    pub tokens: usize,
    /// Records the header claims.
    pub claimed: usize,
    pub format: KvFormat,
    /// Set when the load stopped early; `tokens` is then the damaged record's index.
    pub damage: Option<KvDamage>,
}

/// An open `.coli_kv` file and how many of its records are durable.
pub struct KvFile {
    path: PathBuf,
    file: File,
    binding: KvBinding,
    nrec: usize,
    /// The open file's device and inode: a save checks that `path` still names it.
    id: (u64, u64),
}

impl KvFile {
    /// Opens (creating, mode 0600) the file of a slot. An existing file that does not match is
    /// left alone until [`KvFile::load`] says so and the caller sets it aside.
    pub fn open(path: &Path, binding: KvBinding) -> std::io::Result<KvFile> {
        let (file, id) = open_rw(path)?;
        Ok(KvFile {
            path: path.to_path_buf(),
            file,
            binding,
            nrec: 0,
            id,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the file out of the way (kept, never overwritten) and starts a new, empty one
    /// at the path. Returns where the old one went.
    pub fn set_aside(&mut self) -> std::io::Result<PathBuf> {
        let to = crate::durable::set_aside(&self.path)?;
        let (file, id) = open_rw(&self.path)?;
        self.file = file;
        self.id = id;
        self.nrec = 0;
        Ok(to)
    }

    /// Reads the saved conversation into `kv` (which must be empty): every record up to the
    /// first damaged one. On an error `kv` stays empty and the error says why. Either way the
    /// durable count restarts at what was kept, so the next save rewrites the rest.
    pub fn load(&mut self, kv: &mut KvCache, ctx: usize) -> Result<KvLoaded, KvLoadError> {
        let io = |source| KvLoadError::Io {
            path: self.path.clone(),
            source,
        };
        self.nrec = 0;
        let len = self.file.metadata().map_err(io)?.len();
        let empty = KvLoaded {
            tokens: 0,
            claimed: 0,
            format: KvFormat::V2,
            damage: None,
        };
        if len == 0 {
            return Ok(empty);
        }
        let mut head = [0u8; HEADER as usize];
        let got = read_up_to(&self.file, &mut head).map_err(io)?;
        let format = match &head[..8.min(got)] {
            m if m == MAGIC => KvFormat::V2,
            m if m == MAGIC_V1 => KvFormat::V1,
            _ => return Err(KvLoadError::NotKv(self.path.clone())),
        };
        let header = match format {
            KvFormat::V1 => HEADER_V1,
            KvFormat::V2 => HEADER,
        };
        if (got as u64) < HEADER_V1 {
            return Err(KvLoadError::ShortHeader {
                path: self.path.clone(),
                len,
            });
        }
        if format == KvFormat::V2 {
            let crc = u32::from_le_bytes(head[36..40].try_into().expect("4 bytes"));
            if crc != crc32c::crc32c(&head[..36]) {
                return Err(KvLoadError::HeaderChecksum(self.path.clone()));
            }
        }
        if head[8..32] != self.binding.shape.fields() {
            return Err(KvLoadError::Foreign(self.path.clone()));
        }
        if format == KvFormat::V2 {
            // A file cut inside its binding has none.
            let saved = if (got as u64) < HEADER {
                None
            } else {
                binding_of(&head)
            };
            let Some(saved) = saved else {
                return Err(KvLoadError::Unbound(self.path.clone()));
            };
            if let Some(why) = self.binding.identity.mismatch(&saved) {
                return Err(KvLoadError::Mismatch {
                    path: self.path.clone(),
                    why,
                });
            }
        }
        let shape = self.binding.shape;
        let payload = shape.record_bytes();
        let stride = payload + if format == KvFormat::V2 { REC_CRC } else { 0 };
        // COLIKV1 stores the count as an i32; a negative one names no records.
        let claimed = match format {
            KvFormat::V1 => {
                i32::from_le_bytes(head[32..36].try_into().expect("4 bytes")).max(0) as i64
            }
            KvFormat::V2 => u32::from_le_bytes(head[32..36].try_into().expect("4 bytes")) as i64,
        } as u64;
        let complete = (len - header) / stride;
        let readable = claimed.min(complete) as usize;
        if readable >= ctx {
            return Err(KvLoadError::TooLong {
                path: self.path.clone(),
                nrec: readable,
                ctx,
            });
        }
        let mut damage = (claimed > complete).then_some(KvDamage::Truncated { index: readable });
        let mut reader = std::io::BufReader::new(&self.file);
        std::io::Seek::seek(&mut reader, std::io::SeekFrom::Start(header)).map_err(io)?;
        let mut buf = vec![0u8; stride as usize];
        let mut loaded = kv.clone();
        loaded.clear();
        loaded.reserve(readable);
        for index in 0..readable {
            reader.read_exact(&mut buf).map_err(io)?;
            let (record, crc) = buf.split_at(payload as usize);
            if format == KvFormat::V2
                && u32::from_le_bytes(crc.try_into().expect("4 bytes")) != record_crc(index, record)
            {
                damage = Some(KvDamage::Checksum { index });
                break;
            }
            let token = i32::from_le_bytes(record[..4].try_into().expect("4 bytes"));
            if token < 0 || token as u32 >= shape.vocab {
                damage = Some(KvDamage::BadToken {
                    index,
                    token: token as i64,
                });
                break;
            }
            loaded.push_record(token as u32, &record[4..]);
        }
        if loaded.has_recurrent_state() && !loaded.is_empty() {
            if let Err(why) = crate::kv_state::load(&self.path, &mut loaded) {
                crate::elog!(
                    "[KV] {}: {why}: its {} positions are not resumed (computed again from the next prompt)",
                    self.path.display(),
                    loaded.len()
                );
                loaded.clear();
            }
        }
        let tokens = loaded.len();
        *kv = loaded;
        // A COLIKV1 file is rewritten whole at the next save (header first), never appended
        // to: records of the two formats must not mix in one file.
        self.nrec = if format == KvFormat::V2 { tokens } else { 0 };
        Ok(KvLoaded {
            tokens,
            claimed: claimed as usize,
            format,
            damage,
        })
    }

    /// Makes the file hold exactly `kv`: records past the longest durable prefix that still
    /// matches are rewritten. Called at each turn end. When the path no longer names the
    /// open file (deleted or replaced under the daemon), the file is made anew there (its
    /// folder too) and the whole conversation written, so a save never goes into an
    /// unreachable inode.
    pub fn save(&mut self, kv: &KvCache) -> std::io::Result<()> {
        self.relink()?;
        // Keep the durable prefix only where its tokens still agree with the history.
        let keep = self.nrec.min(kv.len());
        if keep < self.nrec {
            self.set_count(keep)?;
        }
        let stride = (self.binding.shape.record_bytes() + REC_CRC) as usize;
        let mut out = Vec::with_capacity((kv.len() - keep) * stride);
        for pos in keep..kv.len() {
            push_record_v2(kv, pos, &mut out);
        }
        if keep == 0 {
            // A fresh, foreign, damaged or COLIKV1 file: a durable header with count 0 first,
            // so no kill can leave the old header naming records that are half rewritten.
            self.file.write_all_at(&self.binding.header(0), 0)?;
            self.file.sync_data()?;
        }
        self.file
            .write_all_at(&out, HEADER + (keep * stride) as u64)?;
        self.file.sync_data()?;
        self.set_count(kv.len())?;
        // After the records: a kill in between leaves records without their state, which a
        // load then declines (never a state beside records it does not belong to).
        crate::kv_state::save(&self.path, kv)
    }

    /// Forgets everything (RESET): the count goes to 0, the file is cut to its header.
    pub fn clear(&mut self) -> std::io::Result<()> {
        self.relink()?;
        self.file.write_all_at(&self.binding.header(0), 0)?;
        self.file.sync_data()?;
        self.file.set_len(HEADER)?;
        self.nrec = 0;
        match std::fs::remove_file(crate::kv_state::state_path(&self.path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Drops records past `n` (a reused prefix shorter than what is saved).
    pub fn truncate(&mut self, n: usize) -> std::io::Result<()> {
        if n < self.nrec {
            self.set_count(n)?;
        }
        Ok(())
    }

    /// Reopens the file at its path when the path no longer names the open file (device and
    /// inode): deleted, or replaced. Nothing of the old inode is trusted: the count restarts
    /// at 0, so the next write is the whole conversation.
    fn relink(&mut self) -> std::io::Result<()> {
        let here = std::fs::metadata(&self.path).map(|m| (m.dev(), m.ino()));
        if matches!(here, Ok(id) if id == self.id) {
            return Ok(());
        }
        let why = match here {
            Err(_) => "was deleted",
            Ok(_) => "was replaced by another file",
        };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let (file, id) = create_new(&self.path)?;
        crate::elog!(
            "[KV] {} {why} while the daemon ran: made anew, the whole conversation is written to it",
            self.path.display()
        );
        self.file = file;
        self.id = id;
        self.nrec = 0;
        Ok(())
    }

    /// Rewrites the count and the header checksum that covers it, in one write inside the
    /// first sector, so the pair is never seen torn.
    fn set_count(&mut self, n: usize) -> std::io::Result<()> {
        let h = self.binding.shape.header_head(n as u32);
        self.file.write_all_at(&h[32..40], NREC_AT)?;
        self.file.sync_data()?;
        self.nrec = n;
        Ok(())
    }

    pub fn durable_records(&self) -> usize {
        self.nrec
    }
}

/// Opens `path` read-write, creating it (mode 0600, its folder entry made durable).
fn open_rw(path: &Path) -> std::io::Result<(File, (u64, u64))> {
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    if !existed {
        crate::durable::sync_dir(path)?;
    }
    let m = file.metadata()?;
    Ok((file, (m.dev(), m.ino())))
}

/// Creates `path` anew, emptying whatever file another process put there.
fn create_new(path: &Path) -> std::io::Result<(File, (u64, u64))> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    crate::durable::sync_dir(path)?;
    let m = file.metadata()?;
    Ok((file, (m.dev(), m.ino())))
}

/// Fills as much of `buf` from the file's start as the file holds.
fn read_up_to(file: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn push_record_v2(kv: &KvCache, pos: usize, out: &mut Vec<u8>) {
    let start = out.len();
    kv.write_record(pos, out);
    let crc = record_crc(pos, &out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// Writes a whole COLIKV2 file at once (tests, tools).
pub fn write_file(path: &Path, kv: &KvCache, binding: KvBinding) -> std::io::Result<()> {
    let mut out = binding.header(kv.len() as u32).to_vec();
    for pos in 0..kv.len() {
        push_record_v2(kv, pos, &mut out);
    }
    write_new(path, &out)?;
    crate::kv_state::save(path, kv)
}

/// Writes a whole upstream COLIKV1 file (no checksums) at once: for tests of the COLIKV1
/// reader and for handing a conversation back to upstream.
pub fn write_file_v1(path: &Path, kv: &KvCache, shape: KvShape) -> std::io::Result<()> {
    let mut out = shape.header_v1(kv.len() as u32).to_vec();
    for pos in 0..kv.len() {
        kv.write_record(pos, &mut out);
    }
    write_new(path, &out)
}

fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Writes the first `n` positions of `kv` as a whole COLIKV2 file at `path`, through a
/// temporary name renamed into place once it is durable: a kill at any instant leaves the
/// old file (or none) at `path`, never a half-written one (the prefix cache's entries).
pub fn write_file_prefix(
    path: &Path,
    kv: &KvCache,
    n: usize,
    binding: KvBinding,
) -> std::io::Result<()> {
    let n = n.min(kv.len());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_all(&binding.header(n as u32))?;
    let mut rec = Vec::with_capacity((binding.shape.record_bytes() + REC_CRC) as usize);
    for pos in 0..n {
        rec.clear();
        push_record_v2(kv, pos, &mut rec);
        w.write_all(&rec)?;
    }
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    crate::durable::sync_dir(path)
}

/// The tokens a COLIKV2 file holds, read without its payload (a record's token is its first
/// four bytes), for an index of files whose records are verified only when loaded. Refused
/// like [`KvFile::load`] refuses: not COLIKV2, a damaged header, another shape or binding.
/// Records past the file's end are not counted.
pub fn read_tokens(path: &Path, binding: KvBinding) -> Result<Vec<u32>, KvLoadError> {
    let io = |source| KvLoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut head = [0u8; HEADER as usize];
    let got = read_up_to(&file, &mut head).map_err(io)?;
    if got < 8 || &head[..8] != MAGIC {
        return Err(KvLoadError::NotKv(path.to_path_buf()));
    }
    if (got as u64) < HEADER {
        return Err(KvLoadError::ShortHeader {
            path: path.to_path_buf(),
            len,
        });
    }
    let crc = u32::from_le_bytes(head[36..40].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&head[..36]) {
        return Err(KvLoadError::HeaderChecksum(path.to_path_buf()));
    }
    if head[8..32] != binding.shape.fields() {
        return Err(KvLoadError::Foreign(path.to_path_buf()));
    }
    let Some(saved) = binding_of(&head) else {
        return Err(KvLoadError::Unbound(path.to_path_buf()));
    };
    if let Some(why) = binding.identity.mismatch(&saved) {
        return Err(KvLoadError::Mismatch {
            path: path.to_path_buf(),
            why,
        });
    }
    let stride = binding.shape.record_bytes() + REC_CRC;
    let claimed = u32::from_le_bytes(head[32..36].try_into().expect("4 bytes")) as u64;
    let n = claimed.min((len - HEADER) / stride);
    let mut tokens = Vec::with_capacity(n as usize);
    let mut tok = [0u8; 4];
    for i in 0..n {
        file.read_exact_at(&mut tok, HEADER + i * stride)
            .map_err(io)?;
        tokens.push(u32::from_le_bytes(tok));
    }
    Ok(tokens)
}
