//! A running `colibri serve --mux` with piped stdio: requests written as bytes, replies read
//! on a thread into a channel (so a test can wait with a deadline) and decoded with the
//! protocol crate's client-side decoder; every raw byte is kept for byte-exact checks.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use protocol::mux::{ErrorCode, MuxReply, MuxReplyDecoder};

/// How long a test waits for one frame before failing (the machine may be busy).
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(120);

pub struct MuxDaemon {
    pub child: Child,
    stdin: Option<ChildStdin>,
    chunks: Receiver<Vec<u8>>,
    decoder: MuxReplyDecoder,
    /// Every byte of stdout so far.
    pub raw: Vec<u8>,
    stderr_path: PathBuf,
    eof: bool,
}

impl MuxDaemon {
    /// Starts `colibri serve --mux <args>` and reads its five startup frames (READY, STAT,
    /// HWINFO, TIERS, EMAP), which it returns.
    pub fn start(args: &[&str], state: &Path) -> (MuxDaemon, Vec<MuxReply>) {
        Self::start_with(crate::colibri().args(["serve", "--mux"]).args(args), state)
    }

    /// Starts an already configured command (for upstream-style launches).
    pub fn start_with(cmd: &mut std::process::Command, state: &Path) -> (MuxDaemon, Vec<MuxReply>) {
        let stderr_path = state.join(format!(
            "mux-stderr-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let stderr = std::fs::File::create(&stderr_path).expect("stderr log");
        let mut child = cmd
            .env("COLI_STATE_DIR", state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawning colibri serve --mux");
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut d = MuxDaemon {
            child,
            stdin,
            chunks: rx,
            decoder: MuxReplyDecoder::new(),
            raw: Vec::new(),
            stderr_path,
            eof: false,
        };
        let startup = (0..5).map(|_| d.next()).collect();
        (d, startup)
    }

    pub fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("writing daemon stdin");
        stdin.flush().expect("flushing daemon stdin");
    }

    /// Sends a SUBMIT for `prompt` (greedy unless `temp` says otherwise).
    pub fn submit(&mut self, id: u64, slot: u32, prompt: &str, max_tokens: u32) {
        self.send(&submit_bytes(id, slot, prompt, max_tokens));
    }

    /// The next reply, or `None` once stdout closed.
    pub fn try_next(&mut self, timeout: Duration) -> Option<MuxReply> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.decoder.next_reply() {
                return Some(r);
            }
            if self.eof {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => {
                    self.raw.extend_from_slice(&chunk);
                    self.decoder.feed(&chunk);
                }
                Err(RecvTimeoutError::Disconnected) => self.eof = true,
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no reply within {timeout:?}; stdout so far:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&self.raw),
                    self.stderr()
                ),
            }
        }
    }

    /// The next reply (the daemon must still be running). Not an `Iterator`: a closed stream
    /// is a test failure here, never the end of a sequence.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> MuxReply {
        self.try_next(FRAME_TIMEOUT).unwrap_or_else(|| {
            panic!(
                "daemon stdout closed; stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&self.raw),
                self.stderr()
            )
        })
    }

    /// Reads until request `id` ends (DONE or ERROR); returns every reply read meanwhile.
    pub fn until_end_of(&mut self, id: u64) -> Vec<MuxReply> {
        let mut got = Vec::new();
        loop {
            let r = self.next();
            let end = matches!(&r, MuxReply::Done { id: i, .. } | MuxReply::Error { id: i, .. } if *i == id);
            got.push(r);
            if end {
                return got;
            }
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Closes stdin, reads what is left and waits for the exit.
    pub fn finish(mut self) -> (std::process::ExitStatus, Vec<MuxReply>) {
        drop(self.stdin.take());
        let mut rest = Vec::new();
        while let Some(r) = self.try_next(FRAME_TIMEOUT) {
            rest.push(r);
        }
        (self.child.wait().expect("waiting for the daemon"), rest)
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `SUBMIT <id> <slot> <bytes> <max_tokens> 0 1\n<prompt>\n` (greedy).
pub fn submit_bytes(id: u64, slot: u32, prompt: &str, max_tokens: u32) -> Vec<u8> {
    let mut b = format!("SUBMIT {id} {slot} {} {max_tokens} 0 1\n", prompt.len()).into_bytes();
    b.extend_from_slice(prompt.as_bytes());
    b.push(b'\n');
    b
}

/// The DATA bytes of request `id` among `replies`, concatenated.
pub fn data_of(replies: &[MuxReply], id: u64) -> Vec<u8> {
    replies
        .iter()
        .filter_map(|r| match r {
            MuxReply::Data { id: i, bytes } | MuxReply::DataLogprobs { id: i, bytes, .. }
                if *i == id =>
            {
                Some(bytes.as_slice())
            }
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

/// The error code of request `id` among `replies`, if it was refused.
pub fn error_of(replies: &[MuxReply], id: u64) -> Option<ErrorCode> {
    replies.iter().find_map(|r| match r {
        MuxReply::Error { id: i, code } if *i == id => Some(*code),
        _ => None,
    })
}
