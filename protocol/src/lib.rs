//! Wire types of the colibri line protocol: parsing and encoding, no I/O.
//!
//! The daemon decodes [`Request`]s from stdin with [`decode_request`] and encodes
//! [`Reply`]s to stdout; the client encodes requests with [`encode_request`] and decodes the
//! daemon's stdout with a [`ReplyDecoder`] and its telemetry descriptor with
//! [`parse_telemetry_line`]. In mux mode ([`mux`], upstream's `SERVE_BATCH=1` protocol) the
//! same roles are [`decode_mux_request`], [`MuxReply::encode`], [`encode_mux_request`] and
//! [`MuxReplyDecoder`]. Byte formats are documented in `protocol/README.md`.
//!
//! This crate is pure: no threads, no engine types, no I/O beyond `impl Write`. Every
//! decoder returns a value for every byte pattern and never panics.
//!
//! ```
//! use protocol::{decode_request, DecodeError, Reply, ReplyDecoder, Request, Stat};
//!
//! // Daemon: decode from the stdin buffer, answer on stdout.
//! let stdin = b"\x02PROMPT 5 64 0.7 0.9\nhello\n\x02PROMPT 2 0 0.7 0.9\nhi\n";
//! let (req, used) = decode_request(stdin).unwrap();
//! assert!(matches!(&req, Request::Prompt(p) if p.payload == b"hello"));
//! let (req, _) = decode_request(&stdin[used..]).unwrap();
//! assert!(matches!(req, Request::Rejected(_))); // max_tokens 0: END + zero STAT
//! let mut stdout = Vec::new();
//! Reply::End { leading_newline: false }.encode(&mut stdout);
//! Reply::Stat(Stat::zero6(1.5)).encode(&mut stdout);
//! assert_eq!(stdout, b"\x01\x01END\x01\x01\nSTAT 0 0.00 0.0 1.50 0 0\n");
//! assert_eq!(decode_request(b"\x02MO"), Err(DecodeError::Incomplete));
//!
//! // Client: decode the daemon's stdout in whatever chunks it arrives.
//! let mut dec = ReplyDecoder::new();
//! let mut replies = Vec::new();
//! dec.decode_chunk(b"\x01\x01READY\x01\x01\nSTAT 0 0.00 0.0 1.50\nHel", &mut replies);
//! dec.decode_chunk(b"lo\n\x01\x01END\x01\x01\nSTAT 2 4.00 50.0 1.50 3 0\n", &mut replies);
//! assert_eq!(replies[2], Reply::Text(b"Hel".to_vec()));
//! assert_eq!(replies[4], Reply::End { leading_newline: true });
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;

mod decoder;
pub mod drives;
pub mod mux;
pub mod num;
pub mod prefetch;
mod reply;
mod request;
pub mod route;
pub mod telemetry;

pub use decoder::{DecoderState, ReplyDecoder, MAX_TELEMETRY_LINE};
pub use drives::DriveFigures;
pub use mux::{
    decode_mux_request, decode_mux_request_eof, encode_mux_request, ErrorCode, LogprobTail,
    MuxRejected, MuxReply, MuxReplyDecoder, MuxRequest, Submit, MAX_DISCARD_BYTES,
    MAX_GRAMMAR_BYTES, MAX_SUBMIT_BYTES,
};
pub use prefetch::PrefetchBytes;
pub use reply::{parse_stat_line, Reply, Stat, END, READY};
pub use request::{
    check_slot, decode_request, decode_request_eof, encode_request, EncodeError, MalformedReason,
    Prompt, RejectReason, Rejected, Request, MAX_LINE_BYTES, MAX_PROMPT_BYTES,
};
pub use route::RouteAgree;
pub use telemetry::{
    parse_telemetry_line, DiskClass, DiskClassFigures, Emap, EngineState, GrammarEnd, Hits, HwInfo,
    KvSave, Live, Prof, Progress, ProgressPhase, Repin, SessionInfo, SessionState, Spec,
    SpecSource, Telemetry, Tiers,
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
