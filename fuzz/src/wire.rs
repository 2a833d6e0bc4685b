//! Harnesses of the V2 protocol: frame and command decoding over any split of a stream,
//! client frames, IDENTIFY, and the snappy and deflate streams.

use super::{check_range, limits, splits, Knobs};
use nsq_shards::ClientState;
use nsq_wire::v2::{self as protocol, Command, Context};

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
    let opts = nsq_wire::identify::IdentifyLimits {
        snappy: f & 1 != 0,
        deflate: f & 2 != 0,
        max_deflate_level: (f >> 4) as i64 % 9 + 1,
        ..nsq_shards::Options::default().identify
    };
    let mut s = default_settings("127.0.0.1", opts);
    let before = s.clone();
    match apply_identify(body, &mut s, opts) {
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
                let reply = identify_response(&s, opts, &n, false);
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
