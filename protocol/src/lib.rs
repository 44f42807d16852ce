//! Wire types of the colibri line protocol: parsing and encoding, no I/O.
//!
//! The daemon decodes [`Request`]s from stdin with [`decode_request`] and encodes
//! [`Reply`]s to stdout; the client encodes requests with [`encode_request`] and decodes the
//! daemon's stdout with a [`ReplyDecoder`] and its telemetry descriptor with
//! [`parse_telemetry_line`]. Byte formats are documented in `protocol/README.md`.
//!
//! This crate is pure: no threads, no engine types, no I/O beyond `impl Write`. Every
//! decoder returns a value for every byte pattern and never panics.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;

mod decoder;
pub mod num;
mod reply;
mod request;
pub mod telemetry;

pub use decoder::{DecoderState, ReplyDecoder, MAX_TELEMETRY_LINE};
pub use reply::{parse_stat_line, Reply, Stat, END, READY};
pub use request::{
    check_slot, decode_request, decode_request_eof, encode_request, EncodeError, MalformedReason,
    Prompt, RejectReason, Rejected, Request, MAX_LINE_BYTES, MAX_PROMPT_BYTES,
};
pub use telemetry::{
    parse_telemetry_line, DiskClass, DiskClassFigures, Emap, EngineState, Hits, HwInfo, Live, Prof,
    Progress, ProgressPhase, Repin, Telemetry, Tiers,
};

/// Why [`decode_request`] returned no request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The buffer holds only part of a request: read more, call again with all of it.
    Incomplete,
    /// The stream cannot be decoded from here on; `at` is the offset where that became
    /// clear. The reader should stop, as at EOF.
    Malformed {
        /// Offset into the buffer.
        at: usize,
        /// What is wrong.
        reason: MalformedReason,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Incomplete => write!(f, "incomplete request"),
            DecodeError::Malformed { at, reason } => {
                write!(f, "malformed request at byte {at}: {reason}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}
