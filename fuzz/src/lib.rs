//! Fuzz harnesses of every parser of the broker. Each `fn(&[u8])` panics when an
//! invariant breaks (not only when the parser panics): frames within the configured
//! limits, decode(encode(x)) == x, the same result for any split of a stream into reads,
//! and no record from a segment scan whose CRC does not match.
//!
//! The same functions run under AFL++ (`src/bin/fuzz-afl.rs`), under the in-process
//! smoke fuzzer (`src/bin/fuzz-smoke.rs`, with the mutator in [`mutate`]) and in
//! `cargo test` (tests/).
//!
//! The crate also holds the tools that test the running broker from outside, over
//! loopback: `netfuzz` (mutated V2 and HTTP sessions beside an exactly-once checker,
//! `src/bin/netfuzz/`), `chaos` (kill -9 under load, `src/bin/chaos.rs`) and
//! `cluster-chaos` (a 3-node cluster under load: kill -9 of the leader or a follower,
//! a wiped leader, SIGSTOP; `src/bin/cluster-chaos.rs`), with their shared helpers in
//! [`net`]. RELIABILITY.md describes each and its figures.
#![allow(
    clippy::unwrap_used,
    reason = "fuzzing and chaos tools: a panic is a reported failure of the run"
)]
#![forbid(unsafe_code)]

pub mod mutate;
pub mod net;

mod config;
mod http;
mod lookupd;
mod storage;
mod wire;

pub use config::*;
pub use http::*;
pub use lookupd::*;
pub use storage::*;
pub use wire::*;

use nsq_wire::v2::Limits;
use std::ops::Range;

/// A fuzz target: its name (also its corpus folder, `fuzz/corpus/<name>`) and harness.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "v2_decode",
        run: v2_decode,
    },
    Target {
        name: "v2_client_frame",
        run: v2_client_frame,
    },
    Target {
        name: "identify",
        run: identify,
    },
    Target {
        name: "snappy",
        run: snappy,
    },
    Target {
        name: "deflate",
        run: deflate,
    },
    Target {
        name: "http_head",
        run: http_head,
    },
    Target {
        name: "http_query",
        run: http_query,
    },
    Target {
        name: "http_mpub",
        run: http_mpub,
    },
    Target {
        name: "lookupd_v1",
        run: lookupd_v1,
    },
    Target {
        name: "lookupd_identify",
        run: lookupd_identify,
    },
    Target {
        name: "segment_scan",
        run: segment_scan,
    },
    Target {
        name: "index_decode",
        run: index_decode,
    },
    Target {
        name: "journal_decode",
        run: journal_decode,
    },
    Target {
        name: "meta_json",
        run: meta_json,
    },
    Target {
        name: "import_diskqueue",
        run: import_diskqueue,
    },
    Target {
        name: "go_duration",
        run: go_duration,
    },
    Target {
        name: "config_file",
        run: config_file,
    },
    Target {
        name: "auth_reply",
        run: auth_reply,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Reads bytes off the front of the input for harness parameters.
struct Knobs<'a>(&'a [u8]);

impl<'a> Knobs<'a> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// Limits chosen by one byte: small ones (so "too big" paths are reachable with short
/// inputs) or nsqd's defaults.
fn limits(b: u8) -> Limits {
    if b & 0x80 != 0 {
        Limits::NSQD_DEFAULTS
    } else {
        Limits {
            max_msg_size: (b & 0x3f) as i64 + 1,
            max_body_size: ((b & 0x3f) as i64 + 1) * 4 + 8,
            max_rdy_count: (b & 0x0f) as i64,
            max_req_timeout_ms: (b & 0x1f) as i64 * 100,
        }
    }
}

/// Cuts `data` into reads whose sizes come from `seed` (1..=16 bytes, cycling).
fn splits(data: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut s = seed as usize | 1;
    while at < data.len() {
        s = (s * 37 + 11) % 251;
        let n = (s % 16 + 1).min(data.len() - at);
        out.push(&data[at..at + n]);
        at += n;
    }
    out
}

// ---------------------------------------------------------------- protocol V2 server

fn check_range(r: &Range<usize>, end: usize) {
    assert!(
        r.start <= r.end && r.end <= end,
        "range {r:?} outside 0..{end}"
    );
}

/// A target's scratch directory, made once per thread (a fresh temporary directory per
/// input made the file targets syscall-bound; one per process was shared by the test
/// threads that run a target at once, which then read each other's files), its files
/// rewritten for every input; in memory where there is a tmpfs (the disk's journal made
/// them slow).
fn scratch_dir(target: &'static str) -> std::path::PathBuf {
    thread_local! {
        static DIRS: std::cell::RefCell<std::collections::HashMap<&'static str, tempfile::TempDir>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    DIRS.with(|d| {
        d.borrow_mut()
            .entry(target)
            .or_insert_with(|| {
                tempfile::tempdir_in("/dev/shm")
                    .or_else(|_| tempfile::tempdir())
                    .unwrap()
            })
            .path()
            .to_path_buf()
    })
}
