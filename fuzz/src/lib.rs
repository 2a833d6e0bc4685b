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
//! `src/bin/netfuzz.rs`) and `chaos` (kill -9 under load, `src/bin/chaos.rs`), with
//! their shared helpers in [`net`]. RELIABILITY.md describes each and its figures.
#![allow(
    clippy::unwrap_used,
    reason = "fuzzing and chaos tools: a panic is a reported failure of the run"
)]
#![forbid(unsafe_code)]

pub mod mutate;
pub mod net;

use bytes::Bytes;
use nsq_shards::ClientState;
use nsq_wire::v2::{self as protocol, Command, Context, Limits};
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
        Limits {
            max_msg_size: 1024 * 1024,
            max_body_size: 5 * 1024 * 1024,
            max_rdy_count: 2500,
            max_req_timeout_ms: 3_600_000,
        }
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

/// Checks one decoded command against the limits; `n` is the bytes it consumed.
fn check_command(cmd: &Command, n: usize, buf: &[u8], ctx: &Context) {
    let l = &ctx.limits;
    assert!(n > 0 && n <= buf.len(), "consumed {n} of {}", buf.len());
    match cmd {
        Command::Identify { body } | Command::Auth { body } => {
            check_range(body, n);
            assert!(
                body.len() as i64 <= l.max_body_size,
                "body over max-body-size"
            );
            assert_eq!(ctx.state, ClientState::Init);
        }
        Command::Pub { topic, body } | Command::Dpub { topic, body, .. } => {
            check_range(body, n);
            assert!(
                body.len() as i64 <= l.max_msg_size,
                "PUB body over max-msg-size"
            );
            assert!(!body.is_empty(), "empty PUB body");
            assert!(nsq_shards::names::is_valid_topic_name(topic));
            if let Command::Dpub { defer_ms, .. } = cmd {
                assert!((0..=l.max_req_timeout_ms).contains(defer_ms));
            }
        }
        Command::Mpub { topic, bodies } => {
            assert!(nsq_shards::names::is_valid_topic_name(topic));
            assert!(!bodies.is_empty());
            assert!(bodies.len() as i64 <= (l.max_body_size - 4) / 5);
            let mut prev = 0;
            for b in bodies {
                check_range(b, n);
                assert!(b.start >= prev + 4, "MPUB bodies overlap");
                prev = b.end;
                assert!(!b.is_empty() && b.len() as i64 <= l.max_msg_size);
            }
        }
        Command::Rdy { count } => {
            assert!((0..=l.max_rdy_count).contains(count));
            assert_eq!(ctx.state, ClientState::Subscribed);
        }
        Command::Sub { topic, channel } => {
            assert!(nsq_shards::names::is_valid_topic_name(topic));
            assert!(nsq_shards::names::is_valid_channel_name(channel));
        }
        _ => {}
    }
}

/// Decodes a whole stream as the connection does; returns the commands and the final
/// outcome (`None`: clean end or more bytes wanted).
/// (`resumable`: through `decode_resume`, as the connection does, keeping its progress
/// across reads; else plain `decode`).
fn decode_stream(
    reads: &[&[u8]],
    ctx: &Context,
    resumable: bool,
) -> (Vec<(Command, Vec<u8>)>, Option<protocol::ProtocolError>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut i = 0;
    let mut resume = protocol::Resume::default();
    loop {
        let last = i >= reads.len();
        let c = Context { eof: last, ..*ctx };
        let r = if resumable {
            protocol::decode_resume(&buf, &c, &mut resume)
        } else {
            protocol::decode(&buf, &c)
        };
        match r {
            Ok(Some((cmd, n))) => {
                resume.clear();
                check_command(&cmd, n, &buf, &c);
                out.push((cmd, buf[..n].to_vec()));
                buf.drain(..n);
                if out.len() > 10_000 {
                    return (out, None);
                }
            }
            Ok(None) => {
                if last {
                    return (out, None);
                }
                buf.extend_from_slice(reads[i]);
                i += 1;
            }
            Err(e) => {
                if !e.silent {
                    assert!(e.code.starts_with("E_"), "bad error code {:?}", e.code);
                }
                return (out, Some(e));
            }
        }
    }
}

/// The V2 server decoder over any byte stream, any split into reads: every command within
/// the limits, and the same commands and outcome whether the stream arrives at once or in
/// pieces.
pub fn v2_decode(data: &[u8]) {
    let mut k = Knobs(data);
    let flags = k.byte();
    let lim = k.byte();
    let seed = k.byte();
    let stream = k.rest();
    let state = match flags & 3 {
        0 => ClientState::Init,
        1 => ClientState::Subscribed,
        _ => ClientState::Closing,
    };
    let ctx = Context {
        state,
        heartbeats_enabled: flags & 4 == 0,
        limits: limits(lim),
        eof: false,
    };
    let whole = decode_stream(&[stream], &ctx, false);
    let pieces = decode_stream(&splits(stream, seed), &ctx, false);
    assert_eq!(whole, pieces, "decode differs with the split into reads");
    let resumed = decode_stream(&splits(stream, seed), &ctx, true);
    assert_eq!(whole, resumed, "decode_resume differs from decode");
}

/// The client-side frame decoder (nsq-bench and the tests use it): a frame never exceeds
/// the limit, and re-encoding a response or error frame gives its bytes back.
pub fn v2_client_frame(data: &[u8]) {
    use nsq_wire::client::{decode_frame_limited, Decoded, Frame};
    let mut k = Knobs(data);
    let max = k.byte() as usize * 4 + 8;
    let mut buf = k.rest();
    while let Ok(d) = decode_frame_limited(buf, max) {
        match d {
            Decoded::Incomplete { need } => {
                assert!(need > buf.len() && need <= max + 4);
                break;
            }
            Decoded::Frame(f, n) => {
                assert!(
                    n <= buf.len() && n <= max + 4,
                    "frame of {n} over the limit {max}"
                );
                let mut re = Vec::new();
                match f {
                    Frame::Response(d) => protocol::write_frame(&mut re, 0, d),
                    Frame::Error(d) => protocol::write_frame(&mut re, 1, d),
                    Frame::Message(m) => {
                        let mut d = m.timestamp_ns.to_be_bytes().to_vec();
                        d.extend_from_slice(&m.attempts.to_be_bytes());
                        d.extend_from_slice(&m.id);
                        d.extend_from_slice(m.body);
                        protocol::write_frame(&mut re, 2, &d);
                    }
                }
                assert_eq!(re, &buf[..n], "re-encoded frame differs");
                buf = &buf[n..];
            }
        }
    }
}

// ---------------------------------------------------------------- IDENTIFY

/// IDENTIFY JSON and its negotiation: an accepted body leaves settings within nsqd's
/// bounds and a reply that is a JSON object; a refused one changes nothing.
pub fn identify(data: &[u8]) {
    use nsq_wire::identify::{apply_identify, default_settings, identify_response};
    use std::time::Duration;
    let mut k = Knobs(data);
    let f = k.byte();
    let body = k.rest();
    let opts = nsq_shards::Options {
        snappy: f & 1 != 0,
        deflate: f & 2 != 0,
        max_deflate_level: (f >> 4) as i64 % 9 + 1,
        ..Default::default()
    };
    let mut s = default_settings("127.0.0.1", &opts);
    let before = s.clone();
    match apply_identify(body, &mut s, &opts) {
        Err(e) => {
            assert_eq!(e.code, "E_BAD_BODY");
            assert!(e.text.starts_with("IDENTIFY "), "{}", e.text);
            assert_eq!(format!("{s:?}"), format!("{before:?}"));
        }
        Ok(n) => {
            assert!(s.identified);
            if let Some(hb) = s.heartbeat_interval {
                assert!(
                    hb == opts.client_timeout / 2
                        || (hb >= Duration::from_secs(1) && hb <= opts.max_heartbeat_interval)
                );
            }
            assert!(
                s.output_buffer_size == 1
                    || s.output_buffer_size == 16 * 1024
                    || (s.output_buffer_size >= 64
                        && s.output_buffer_size as i64 <= opts.max_output_buffer_size)
            );
            assert!(s.output_buffer_timeout <= opts.max_output_buffer_timeout);
            assert!(s.sample_rate <= 99);
            assert!(s.msg_timeout >= Duration::from_secs(1) || s.msg_timeout == opts.msg_timeout);
            assert!(s.msg_timeout <= opts.max_msg_timeout.max(opts.msg_timeout));
            assert!(!n.snappy || (opts.snappy && n.negotiate));
            assert!(!n.deflate || (opts.deflate && n.negotiate));
            assert!(n.deflate_level >= 1 && n.deflate_level <= opts.max_deflate_level);
            if n.negotiate {
                let reply = identify_response(&s, &opts, &n, false);
                let v: serde_json::Value =
                    serde_json::from_slice(&reply).expect("IDENTIFY reply is not JSON");
                assert!(v.is_object());
            }
        }
    }
}

// ---------------------------------------------------------------- compression

/// The snappy stream decoder: the same output and outcome for any split into reads; and
/// the encoder's stream of the input decodes back to it, in any split.
pub fn snappy(data: &[u8]) {
    use nsq_wire::compress::snappy::{SnappyDecoder, SnappyEncoder};
    let mut k = Knobs(data);
    let seed = k.byte();
    let input = k.rest();
    let run = |reads: &[&[u8]]| {
        let mut d = SnappyDecoder::default();
        let mut out = Vec::new();
        for r in reads {
            if let Err(e) = d.feed(r, &mut out) {
                return (out, Some(e));
            }
        }
        (out, None)
    };
    let whole = run(&[input]);
    let pieces = run(&splits(input, seed));
    // A stream that fails may fail at a chunk the whole read never decoded past; both
    // must agree on success and on every byte decoded before it.
    assert_eq!(
        whole.1.is_some(),
        pieces.1.is_some(),
        "outcome differs with the split"
    );
    if whole.1.is_none() {
        assert_eq!(whole.0, pieces.0, "output differs with the split");
    }
    // Round trip.
    let mut enc = SnappyEncoder::default();
    let mut wire = Vec::new();
    for part in splits(input, seed ^ 0x55) {
        enc.encode(part, &mut wire);
    }
    let (out, err) = run(&splits(&wire, seed));
    assert!(err.is_none(), "own stream refused: {err:?}");
    assert_eq!(out, input, "snappy round trip differs");
}

/// The deflate stream decoder: no panic on any stream (input capped at 8 KiB: the
/// inflated size is bounded by the caller), the same output for any split; and (one
/// input in four) the encoder's stream of the input decodes back to it.
pub fn deflate(data: &[u8]) {
    use nsq_wire::compress::deflate::{DeflateDecoder, DeflateEncoder};
    let mut k = Knobs(data);
    let seed = k.byte();
    let level = (k.byte() % 10) as u32;
    let input = k.rest();
    // 8 KiB of input (it may inflate to far more): larger inputs made this target run
    // at under 2,000 executions a second without reaching new code.
    let input = &input[..input.len().min(8 * 1024)];
    let run = |reads: &[&[u8]]| {
        let mut d = DeflateDecoder::new(Vec::new()).unwrap();
        let mut out = Vec::new();
        for r in reads {
            if let Err(e) = d.feed(r, &mut out) {
                return (out, Some(e));
            }
        }
        (out, None)
    };
    let whole = run(&[input]);
    let pieces = run(&splits(input, seed));
    if whole.1.is_none() && pieces.1.is_none() {
        assert_eq!(whole.0, pieces.0, "inflated output differs with the split");
    }
    // The round trip on one input in four: a compressor's state (hundreds of KiB to
    // set up) made it most of this target's time.
    if seed % 4 != 0 {
        return;
    }
    // The encoder flushes (a sync block) after every part, as the connection does after
    // every write: 1-16 parts. (One to sixteen bytes per part, as the decoder's splits,
    // built a Huffman tree per byte or so and made this target run at 1,000/s.)
    let mut enc = DeflateEncoder::new(level, &[]).unwrap();
    let mut wire = Vec::new();
    let size = input.len().div_ceil(seed as usize % 16 + 1).max(1);
    for part in input.chunks(size) {
        enc.encode(part, &mut wire).unwrap();
    }
    let (out, err) = run(&splits(&wire, seed));
    assert!(err.is_none(), "own stream refused: {err:?}");
    assert_eq!(out, input, "deflate round trip differs");
}

// ---------------------------------------------------------------- HTTP

/// The HTTP request head parser: a complete head lies within the input, parses the
/// same from exactly its own bytes, and its query goes through parse_query.
pub fn http_head(data: &[u8]) {
    if let Ok(Some(h)) = nsqd::http::parse_head(data) {
        assert!(h.head_len <= data.len());
        // The query is cut at the first `?`; the path holds one only from an escape
        // (`%3F`, as Go's URL.Path does).
        let escaped_q = data.windows(3).any(|w| w.eq_ignore_ascii_case(b"%3f"));
        assert!(!h.path.contains('?') || escaped_q);
        let again = nsqd::http::parse_head(&data[..h.head_len])
            .expect("own head refused")
            .expect("own head incomplete");
        assert_eq!(again.head_len, h.head_len);
        assert_eq!(again.query, h.query);
        let _ = nsqd::http::parse_query(&h.query);
    }
}

fn url_escape(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// Query-string parsing (Go's url.ParseQuery): what it accepts re-escapes to a query
/// that parses to the same pairs.
pub fn http_query(data: &[u8]) {
    let q = String::from_utf8_lossy(data);
    if let Ok(pairs) = nsqd::http::parse_query(&q) {
        let re: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{}={}", url_escape(k), url_escape(v)))
            .collect();
        let again = nsqd::http::parse_query(&re.join("&")).expect("re-escaped query refused");
        // Go drops pairs with an empty key only when the whole part is empty.
        assert_eq!(again, pairs, "query round trip differs");
    }
}

/// `/mpub` bodies, binary and text: every message non-empty, within the body and within
/// max-msg-size; text messages hold no newline; binary messages account for the body.
pub fn http_mpub(data: &[u8]) {
    let mut k = Knobs(data);
    let f = k.byte();
    let lim = limits(k.byte());
    let body = k.rest();
    let binary = f & 1 != 0;
    match nsqd::http::parse_mpub_body(body, binary, &lim) {
        Ok(ranges) => {
            let mut prev = 0;
            for r in &ranges {
                check_range(r, body.len());
                assert!(r.start >= prev);
                prev = r.end;
                assert!(!r.is_empty() && r.len() as i64 <= lim.max_msg_size);
                if !binary {
                    assert!(!body[r.clone()].contains(&b'\n'));
                }
            }
            if binary {
                assert!(!ranges.is_empty());
                let used: usize = 4 + ranges.iter().map(|r| r.len() + 4).sum::<usize>();
                assert!(used <= body.len());
            } else {
                assert!(body.len() as i64 <= lim.max_body_size);
            }
        }
        Err((status, text)) => {
            assert!(status == 413 || status == 500, "status {status}");
            assert!(!text.is_empty());
        }
    }
}

// ---------------------------------------------------------------- nsqlookupd V1

/// A fresh nsqlookupd context per input: registration keys stay in the database after
/// their producers leave (as nsqlookupd's), so one shared database grew with every
/// input and slowed the target down to a tenth of its speed.
fn lookupd_context() -> std::sync::Arc<nsqlookupd::Context> {
    let addr: std::net::SocketAddr = "127.0.0.1:4160".parse().unwrap();
    std::sync::Arc::new(nsqlookupd::Context {
        opts: nsqlookupd::Options {
            tcp_address: "127.0.0.1:4160".into(),
            http_address: "127.0.0.1:4161".into(),
            broadcast_address: "fuzz".into(),
            inactive_producer_timeout: std::time::Duration::from_secs(300),
            tombstone_lifetime: std::time::Duration::from_secs(45),
        },
        db: nsqlookupd::registration_db::RegistrationDb::new(),
        tcp_addr: addr,
        http_addr: addr,
        hostname: "fuzz".into(),
    })
}

/// The nsqlookupd V1 connection handler (`protocol_v1::serve`, what `handle` runs over
/// TCP) over memory: the input is what the client sends (then it closes); every reply is
/// a well-formed `[u32 size][data]` frame, and the handler returns.
pub fn lookupd_v1(data: &[u8]) {
    let mut out = Vec::new();
    let ctx = lookupd_context();
    nsqlookupd::protocol_v1::serve(ctx.clone(), "127.0.0.1:4150".into(), data, &mut out);
    let mut rest = &out[..];
    while !rest.is_empty() {
        assert!(rest.len() >= 4, "torn reply frame");
        let n = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        assert!(rest.len() >= 4 + n, "reply frame size {n} beyond the reply");
        rest = &rest[4 + n..];
    }
    // The connection's end removed the peer from every registration.
    let db = &ctx.db;
    assert!(
        db.lookup_registrations("127.0.0.1:4150").is_empty(),
        "registrations left after the connection closed"
    );
}

/// nsqlookupd's IDENTIFY JSON decoding: no panic; an accepted body's fields survive a
/// JSON round trip.
pub fn lookupd_identify(data: &[u8]) {
    use nsq_wire::lookupd_v1::decode_identify;
    if let Ok(f) = decode_identify(data) {
        let v = serde_json::json!({
            "hostname": f.hostname,
            "broadcast_address": f.broadcast_address,
            "tcp_port": f.tcp_port,
            "http_port": f.http_port,
            "version": f.version,
        });
        let again = decode_identify(v.to_string().as_bytes()).expect("own IDENTIFY refused");
        assert_eq!(again, f);
    }
}

// ---------------------------------------------------------------- storage

/// Rewrites the CRC of every record whose length field fits (so the fuzzer reaches the
/// checks behind the CRC).
fn fix_record_crcs(seg: &mut [u8]) {
    let mut at = 0;
    while at + 8 <= seg.len() {
        let len = u32::from_be_bytes(seg[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 8 + len > seg.len() {
            break;
        }
        let crc = crc32fast_hash(&seg[at + 8..at + 8 + len]);
        seg[at + 4..at + 8].copy_from_slice(&crc.to_be_bytes());
        at += 8 + len;
    }
}

fn crc32fast_hash(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

/// The segment record reader and recovery scan over arbitrary and bit-flipped segment
/// data: every record it yields re-encodes to exactly the bytes at its offset (so its CRC
/// matches), sequences increase, and scan_up_to agrees with scan.
pub fn segment_scan(data: &[u8]) {
    use nsq_storage::record::{self, StoredRecord};
    let mut k = Knobs(data);
    let mode = k.byte();
    let salt = u32::from(k.byte()) | 0x5a00;
    let after = match k.byte() {
        0 => None,
        b => Some(b as u64),
    };
    let rest = k.rest();
    let mut seg: Vec<u8> = match mode & 3 {
        // Raw bytes.
        0 => rest.to_vec(),
        // Raw bytes with their CRCs fixed up.
        1 => {
            let mut v = rest.to_vec();
            fix_record_crcs(&mut v);
            v
        }
        // Valid records made from the input, then bit flips chosen by the input.
        _ => {
            let mut v = Vec::new();
            let (bodies, flips) = rest.split_at(rest.len() / 2);
            let mut seq = 1u64;
            for (i, chunk) in bodies.chunks(7).enumerate() {
                let r = StoredRecord {
                    seq,
                    timestamp: i as i64,
                    defer_until: 0,
                    id: i as u64,
                    attempts: 1,
                    body: Bytes::copy_from_slice(chunk),
                };
                seq += 1 + (chunk[0] & 1) as u64;
                record::encode(&r, if chunk[0] == 0xee { salt ^ 1 } else { salt }, &mut v);
            }
            if !v.is_empty() {
                for f in flips.chunks(3) {
                    if f.len() == 3 {
                        let pos = (u16::from_be_bytes([f[0], f[1]]) as usize) % v.len();
                        v[pos] ^= 1 << (f[2] % 8);
                    }
                }
            }
            if mode & 4 != 0 {
                let cut = rest.len() % (v.len() + 1);
                v.truncate(cut);
            }
            v
        }
    };
    let mut file = record::segment_header(1, salt).to_vec();
    file.append(&mut seg);
    let data = Bytes::from(file);
    if let Ok((_, s)) = record::parse_segment_header(&data) {
        assert_eq!(s, salt);
    }
    let at = record::SEGMENT_HEADER_LEN;
    let (recs, skipped, end) = record::scan(&data, at, salt, after);
    assert!(
        end >= at && end <= data.len(),
        "scan end {end} outside the data"
    );
    let mut last = after;
    let mut prev_end = at;
    for (r, off) in &recs {
        assert!(*off >= prev_end, "records overlap");
        let mut re = Vec::new();
        let n = record::encode(r, salt, &mut re);
        assert!(off + n <= data.len());
        assert_eq!(
            &data[*off..off + n],
            &re[..],
            "record at {off} does not re-encode (CRC)"
        );
        assert!(last.is_none_or(|l| r.seq > l), "sequence does not increase");
        last = Some(r.seq);
        prev_end = off + n;
    }
    for s in &skipped {
        assert!(s.offset >= at && s.offset < data.len());
    }
    let max = (mode >> 4) as usize + 1;
    let (few, _, _) = record::scan_up_to(&data, at, salt, after, max);
    assert_eq!(few.len(), recs.len().min(max));
    assert_eq!(&few[..], &recs[..few.len()], "scan_up_to differs from scan");
}

fn fix_trailing_crc(v: &mut [u8]) {
    if v.len() >= 4 {
        let n = v.len() - 4;
        let crc = crc32fast_hash(&v[..n]);
        v[n..].copy_from_slice(&crc.to_be_bytes());
    }
}

/// Segment index files: what decodes re-encodes to the same bytes.
pub fn index_decode(data: &[u8]) {
    use nsq_storage::index;
    let mut k = Knobs(data);
    let mode = k.byte();
    let mut v = k.rest().to_vec();
    if mode & 1 != 0 {
        if v.len() >= 8 {
            v[..8].copy_from_slice(index::INDEX_MAGIC);
        }
        if v.len() >= 12 {
            v[8..12].copy_from_slice(&index::INDEX_VERSION.to_be_bytes());
        }
        if v.len() >= 72 && mode & 2 != 0 {
            let n = ((v.len() - 72) / 16) as u32;
            v[64..68].copy_from_slice(&n.to_be_bytes());
        }
        fix_trailing_crc(&mut v);
    }
    if let Ok(ix) = index::decode(&v) {
        assert_eq!(index::encode(&ix), v, "index does not re-encode");
    }
}

/// Journal files: decoding stops at the first bad event; the events before it re-encode
/// to exactly the bytes before that offset.
pub fn journal_decode(data: &[u8]) {
    use nsq_storage::journal;
    let mut k = Knobs(data);
    let mode = k.byte();
    let mut v = k.rest().to_vec();
    if mode & 1 != 0 {
        // Fix up each event's CRC.
        let mut at = 0;
        while at + 8 <= v.len() {
            let len = u32::from_be_bytes(v[at..at + 4].try_into().unwrap()) as usize;
            if len == 0 || at + 8 + len > v.len() {
                break;
            }
            let crc = crc32fast_hash(&v[at + 8..at + 8 + len]);
            v[at + 4..at + 8].copy_from_slice(&crc.to_be_bytes());
            at += 8 + len;
        }
    }
    let (events, stop) = journal::decode(&v);
    let end = match &stop {
        Some((at, _)) => *at,
        None => v.len(),
    };
    assert!(end <= v.len());
    let mut re = Vec::new();
    for e in &events {
        journal::encode(
            &mut re,
            e.kind,
            &e.channel,
            e.seq,
            e.attempts,
            e.due_unix_ns,
        );
    }
    if !events.iter().any(|e| e.channel.contains('\u{fffd}')) {
        assert_eq!(re, &v[..end], "journal events do not re-encode");
    } else {
        assert_eq!(events.len(), journal::decode(&re).0.len());
    }
    let _ = journal::fold(events);
}

/// meta.json: what loads survives a save/load round trip.
pub fn meta_json(data: &[u8]) {
    use nsq_storage::meta::TopicMeta;
    if let Ok(m) = serde_json::from_slice::<TopicMeta>(data) {
        let out = serde_json::to_vec(&m).unwrap();
        let again: TopicMeta = serde_json::from_slice(&out).expect("own meta.json refused");
        assert_eq!(again, m);
    }
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

/// nsqd's go-diskqueue files (--import-nsqd-data): the first input byte is the length of
/// meta.dat's text, the rest one queue file; every message read lies within max-msg-size
/// and the callback count equals the returned count.
pub fn import_diskqueue(data: &[u8]) {
    let mut k = Knobs(data);
    let n = k.byte() as usize;
    let lim = k.byte() as i64;
    let rest = k.rest();
    let (meta, file) = rest.split_at(n.min(rest.len()));
    let dp = scratch_dir("import_diskqueue");
    let dp = dp.as_path();
    std::fs::write(nsqd::import_nsqd::queue_meta_file(dp, "t"), meta).unwrap();
    std::fs::write(nsqd::import_nsqd::queue_file(dp, "t", 0), file).unwrap();
    let mut seen = 0u64;
    let got = nsqd::import_nsqd::read_queue(dp, "t", lim, |m| {
        assert!(
            m.body.len() as i64 <= lim.max(0),
            "message over max-msg-size"
        );
        seen += 1;
        Ok(())
    });
    if let Ok(c) = got {
        assert_eq!(c, seen);
    }
}

/// Go durations (flags, the config file, IDENTIFY-free options): `parse_go_duration`
/// never panics; what it accepts formats (Go's `Duration.String`) and parses back to the
/// same nanoseconds; the flag parser agrees with it (refusing only negative values); and
/// any duration from the input's first 8 bytes formats and parses back.
pub fn go_duration(data: &[u8]) {
    use nsq_wire::duration::{go_duration_string, parse_duration, parse_go_duration};
    use std::time::Duration;
    let s = String::from_utf8_lossy(data);
    let got = parse_go_duration(&s);
    match (&got, parse_duration(&s)) {
        (Ok(ns), Ok(d)) => assert_eq!(u128::try_from(*ns).ok(), Some(d.as_nanos())),
        (Ok(ns), Err(_)) => assert!(*ns < 0, "{s:?}: {ns} refused by the flag parser"),
        (Err(a), Err(b)) => assert_eq!(a, &b),
        (Err(e), Ok(d)) => panic!("{s:?}: flag parser took {d:?}, Go's refused: {e}"),
    }
    let round_trip = |ns: u64| {
        let text = go_duration_string(Duration::from_nanos(ns));
        assert_eq!(parse_go_duration(&text), Ok(ns as i64), "{text}");
    };
    if let Ok(ns) = got {
        if let Ok(ns) = u64::try_from(ns) {
            round_trip(ns);
        }
    }
    if let Some(b) = data.get(..8) {
        let n = u64::from_le_bytes(b.try_into().unwrap()) >> (data.len() % 64);
        round_trip(n & (i64::MAX as u64));
    }
}

/// nsqd's `--config` file (TOML, go-options coercion, then the broker's own option
/// checks): never a panic; the same file gives the same options twice.
pub fn config_file(data: &[u8]) {
    let path = scratch_dir("config_file").join("nsqd.cfg");
    std::fs::write(&path, data).unwrap();
    // The command line is the same for every input of a thread (its scratch file):
    // parsed once (clap's parse was 90 % of the time), then each load reads the file as
    // `Cli::load` does.
    // (Leaked, one per thread, to be borrowed for the whole call.)
    thread_local! {
        static FLAGS: std::cell::OnceCell<&'static nsqd::config::Flags> =
            const { std::cell::OnceCell::new() };
    }
    let (base, matches) = FLAGS.with(|f| {
        *f.get_or_init(|| {
            Box::leak(Box::new(nsqd::config::Cli::parse_flags([
                "nsqd".to_string(),
                format!("--config={}", path.display()),
            ])))
        })
    });
    let load = || {
        let mut cli = base.clone();
        nsqd::config_file::apply(&mut cli, matches).map(|()| {
            let options = nsqd::config_file::resolved(&cli);
            let cfg = nsqd::config::Config::from_cli(cli).map(|_| ());
            (options, cfg)
        })
    };
    // Compared as text: a NaN option (TOML `nan`) is not equal to itself.
    let first = format!("{:?}", load());
    assert_eq!(
        first,
        format!("{:?}", load()),
        "the same config file loaded twice differs"
    );
}

/// The auth server's HTTP reply (`--auth-http-address`), as read to EOF: never a panic;
/// a reply taken has a body that parses as the auth JSON, a ttl > 0 and an expiry at or
/// after the query.
pub fn auth_reply(data: &[u8]) {
    let now = std::time::Instant::now();
    let Ok(body) = nsqd::auth::reply_body(data) else {
        return;
    };
    assert!(body.len() <= data.len());
    if let Ok(st) = nsqd::auth::parse_reply(&body, now) {
        assert!(st.expires >= now);
        let _ = st.is_allowed("t", "c");
    }
}
