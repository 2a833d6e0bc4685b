//! Property tests: decode(encode(x)) == x for the V2 client/server codec, the snappy and
//! deflate streams (any split into reads), segment records, index and journal files,
//! meta.json and the nsqlookupd V1 reply framing.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]
use bytes::Bytes;
use nsq_shards::ClientState;
use nsq_storage::{index, journal, meta, record};
use nsq_wire::client;
use nsq_wire::v2::{self as protocol, Command, Context, Limits};
use proptest::prelude::*;

const LIMITS: Limits = Limits::NSQD_DEFAULTS;

fn ctx(state: ClientState) -> Context {
    Context {
        state,
        heartbeats_enabled: true,
        limits: LIMITS,
        eof: false,
    }
}

fn topic() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_.-]{1,50}(#ephemeral)?"
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 1..300)
}

fn msg_id() -> impl Strategy<Value = [u8; 16]> {
    "[0-9a-f]{16}".prop_map(|s| s.as_bytes().try_into().unwrap())
}

/// One client command, its encoding, and what the server must decode it to (ranges are
/// relative to the command's start).
#[derive(Debug, Clone)]
enum Cmd {
    Pub(String, Vec<u8>),
    Dpub(String, u32, Vec<u8>),
    Mpub(String, Vec<Vec<u8>>),
    Sub(String, String),
    Rdy(u16),
    Fin([u8; 16]),
    Req([u8; 16], u32),
    Touch([u8; 16]),
    Nop,
    Identify(Vec<u8>),
}

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        (topic(), body()).prop_map(|(t, b)| Cmd::Pub(t, b)),
        (topic(), 0u32..3_600_000, body()).prop_map(|(t, d, b)| Cmd::Dpub(t, d, b)),
        (topic(), proptest::collection::vec(body(), 1..5)).prop_map(|(t, b)| Cmd::Mpub(t, b)),
        (topic(), topic()).prop_map(|(t, c)| Cmd::Sub(t, c)),
        (0u16..=2500).prop_map(Cmd::Rdy),
        msg_id().prop_map(Cmd::Fin),
        (msg_id(), any::<u32>()).prop_map(|(i, t)| Cmd::Req(i, t)),
        msg_id().prop_map(Cmd::Touch),
        Just(Cmd::Nop),
        proptest::collection::vec(any::<u8>(), 1..200).prop_map(Cmd::Identify),
    ]
}

fn state_for(c: &Cmd) -> ClientState {
    match c {
        Cmd::Rdy(_) | Cmd::Fin(_) | Cmd::Req(..) | Cmd::Touch(_) => ClientState::Subscribed,
        _ => ClientState::Init,
    }
}

fn encode(c: &Cmd, out: &mut Vec<u8>) {
    match c {
        Cmd::Pub(t, b) => client::encode_pub(out, t, b),
        Cmd::Dpub(t, d, b) => client::encode_dpub(out, t, *d as u64, b),
        Cmd::Mpub(t, b) => client::encode_mpub(out, t, b),
        Cmd::Sub(t, ch) => client::encode_sub(out, t, ch),
        Cmd::Rdy(n) => client::encode_rdy(out, *n as u64),
        Cmd::Fin(id) => client::encode_fin(out, id),
        Cmd::Req(id, t) => client::encode_req(out, id, *t as u64),
        Cmd::Touch(id) => client::encode_touch(out, id),
        Cmd::Nop => client::encode_nop(out),
        Cmd::Identify(j) => client::encode_identify(out, j),
    }
}

fn check(c: &Cmd, got: &Command, buf: &[u8]) {
    match (c, got) {
        (Cmd::Pub(t, b), Command::Pub { topic, body }) => {
            assert_eq!((t, &b[..]), (topic, &buf[body.clone()]))
        }
        (
            Cmd::Dpub(t, d, b),
            Command::Dpub {
                topic,
                defer_ms,
                body,
            },
        ) => assert_eq!(
            (t, *d as i64, &b[..]),
            (topic, *defer_ms, &buf[body.clone()])
        ),
        (Cmd::Mpub(t, b), Command::Mpub { topic, bodies }) => {
            assert_eq!(t, topic);
            let got: Vec<&[u8]> = bodies.iter().map(|r| &buf[r.clone()]).collect();
            let want: Vec<&[u8]> = b.iter().map(|x| &x[..]).collect();
            assert_eq!(want, got);
        }
        (Cmd::Sub(t, ch), Command::Sub { topic, channel }) => assert_eq!((t, ch), (topic, channel)),
        (Cmd::Rdy(n), Command::Rdy { count }) => assert_eq!(*n as i64, *count),
        (Cmd::Fin(i), Command::Fin { id }) | (Cmd::Touch(i), Command::Touch { id }) => {
            assert_eq!(i, id)
        }
        (Cmd::Req(i, t), Command::Req { id, timeout_ms }) => {
            assert_eq!((i, *t as i64), (id, *timeout_ms))
        }
        (Cmd::Nop, Command::Nop) => {}
        (Cmd::Identify(j), Command::Identify { body }) => assert_eq!(&j[..], &buf[body.clone()]),
        (c, g) => panic!("{c:?} decoded as {g:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Client encoders -> server decoder, any number of commands in one buffer.
    #[test]
    fn v2_client_to_server(cmds in proptest::collection::vec(cmd(), 1..6)) {
        for c in &cmds {
            let mut buf = Vec::new();
            encode(c, &mut buf);
            // Trailing bytes of the next command must not change the result.
            buf.extend_from_slice(b"NOP\n");
            let (got, n) = protocol::decode(&buf, &ctx(state_for(c))).unwrap().unwrap();
            prop_assert_eq!(n, buf.len() - 4);
            check(c, &got, &buf);
            // Every strict prefix is incomplete.
            for cut in [0, n / 2, n - 1] {
                prop_assert!(protocol::decode(&buf[..cut], &ctx(state_for(c))).unwrap().is_none());
            }
        }
    }

    /// Server frames -> client decoder.
    #[test]
    fn v2_server_to_client(kind in 0u32..3, ts in any::<i64>(), attempts in any::<u16>(),
                           id in msg_id(), data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut out = Vec::new();
        let payload = if kind == 2 {
            let mut d = ts.to_be_bytes().to_vec();
            d.extend_from_slice(&attempts.to_be_bytes());
            d.extend_from_slice(&id);
            d.extend_from_slice(&data);
            d
        } else {
            data.clone()
        };
        protocol::write_frame(&mut out, kind, &payload);
        let client::Decoded::Frame(f, n) = client::decode_frame(&out).unwrap() else {
            panic!("incomplete")
        };
        prop_assert_eq!(n, out.len());
        match f {
            client::Frame::Response(d) => prop_assert!(kind == 0 && d == &data[..]),
            client::Frame::Error(d) => prop_assert!(kind == 1 && d == &data[..]),
            client::Frame::Message(m) => {
                prop_assert_eq!(kind, 2);
                prop_assert_eq!((m.timestamp_ns, m.attempts, m.id, m.body), (ts, attempts, id, &data[..]));
            }
        }
    }

    /// Snappy and deflate streams: the encoder's output decodes to the input in any split.
    #[test]
    fn compression_streams(parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 1..5),
                           cut in 1usize..64, level in 1u32..10) {
        use nsq_wire::compress::deflate::{DeflateDecoder, DeflateEncoder};
        use nsq_wire::compress::snappy::{SnappyDecoder, SnappyEncoder};
        let want: Vec<u8> = parts.concat();
        let mut se = SnappyEncoder::default();
        let mut de = DeflateEncoder::new(level, &[]).unwrap();
        let (mut sw, mut dw) = (Vec::new(), Vec::new());
        for p in &parts {
            se.encode(p, &mut sw);
            de.encode(p, &mut dw).unwrap();
        }
        let mut sd = SnappyDecoder::default();
        let mut dd = DeflateDecoder::new(Vec::new()).unwrap();
        let (mut so, mut doo) = (Vec::new(), Vec::new());
        for c in sw.chunks(cut) { sd.feed(c, &mut so).unwrap(); }
        for c in dw.chunks(cut) { dd.feed(c, &mut doo).unwrap(); }
        prop_assert_eq!(&so, &want);
        prop_assert_eq!(&doo, &want);
        prop_assert!(sd.pending().is_empty());
        prop_assert!(dd.at_flush_point());
    }

    /// Segment records: encode -> decode and scan give the records back.
    #[test]
    fn records(recs in proptest::collection::vec((any::<i64>(), any::<i64>(), any::<u64>(), any::<u16>(),
                                                   proptest::collection::vec(any::<u8>(), 0..200)), 1..8),
               salt in any::<u32>()) {
        let mut buf = Vec::new();
        let mut want = Vec::new();
        for (i, (ts, defer, id, attempts, body)) in recs.into_iter().enumerate() {
            let r = record::StoredRecord { seq: i as u64 + 1, timestamp: ts, defer_until: defer, id, attempts,
                                           body: Bytes::from(body) };
            record::encode(&r, salt, &mut buf);
            want.push(r);
        }
        let data = Bytes::from(buf);
        let (got, skipped, end) = record::scan(&data, 0, salt, None);
        prop_assert!(skipped.is_empty());
        prop_assert_eq!(end, data.len());
        let got: Vec<_> = got.into_iter().map(|(r, _)| r).collect();
        prop_assert_eq!(got, want);
    }

    /// Index files: a consistent index round-trips; any other decodes to an error or
    /// to itself.
    #[test]
    fn index_files(base in 0u64..1 << 62, salt in any::<u32>(), count in 1u64..3000,
                   steps in proptest::collection::vec((1u64..1000, 1u64..100_000), 12),
                   extra in any::<[u16; 4]>(), f in any::<[u64; 5]>()) {
        let n = count.div_ceil(nsq_storage::store::INDEX_EVERY) as usize;
        let first_seq = base + extra[0] as u64;
        let (mut seq, mut off) = (first_seq, record::SEGMENT_HEADER_LEN as u64 + extra[1] as u64);
        let mut entries = Vec::new();
        for (i, (ds, d_off)) in steps.iter().take(n).enumerate() {
            if i > 0 { seq += ds; off += d_off; }
            entries.push((seq, off));
        }
        let data_end = off + 1 + extra[2] as u64;
        let ix = index::SegmentIndex { base, salt, file_len: data_end + extra[3] as u64, data_end, count,
                                       first_seq, last_seq: seq + extra[3] as u64, entries: entries.clone() };
        prop_assert_eq!(index::decode(&index::encode(&ix)).unwrap(), ix);
        let any = index::SegmentIndex { base, salt, file_len: f[0], data_end: f[1], count: f[2],
                                        first_seq: f[3], last_seq: f[4], entries };
        if let Ok(got) = index::decode(&index::encode(&any)) {
            prop_assert_eq!(got, any);
        }
    }

    /// Journal files.
    #[test]
    fn journal_files(evs in proptest::collection::vec((1u8..5, "[a-z0-9_.#-]{1,64}", any::<u64>(),
                                                       any::<u16>(), any::<i64>()), 0..10)) {
        let mut buf = Vec::new();
        let mut want = Vec::new();
        for (k, ch, seq, attempts, due) in evs {
            let kind = match k { 1 => journal::EventKind::Delivered, 2 => journal::EventKind::Requeued,
                                 3 => journal::EventKind::Finished, _ => journal::EventKind::Emptied };
            journal::encode(&mut buf, kind, &ch, seq, attempts, due);
            want.push(journal::Event { kind, channel: ch, seq, attempts, due_unix_ns: due });
        }
        let (got, stop) = journal::decode(&buf);
        prop_assert!(stop.is_none());
        prop_assert_eq!(got, want);
    }

    /// meta.json through its writer and reader.
    #[test]
    fn meta_files(name in topic(), paused in any::<bool>(), pumped in any::<u64>(),
                  holes in proptest::collection::vec(any::<(u64, u64)>(), 0..4),
                  chans in proptest::collection::vec((topic(), any::<bool>(), any::<u64>(),
                      proptest::collection::vec(any::<(u64, u16, i64)>(), 0..4)), 0..4),
                  next_seq in any::<u64>(), journal_gen in any::<u64>(), last_id in any::<u64>()) {
        let m = meta::TopicMeta {
            version: meta::META_VERSION, name, paused, pumped, holes, next_seq, last_id,
            journal_gen,
            pending_file: None,
            channels: chans.into_iter().map(|(name, paused, cursor, p)| meta::ChannelMeta {
                name, paused, cursor,
                pending: p.into_iter().map(|(seq, attempts, due_unix_ns)|
                    meta::PendingMessage { seq, attempts, due_unix_ns }).collect(),
                finished: Vec::new(),
                limits: Default::default(),
            }).collect(),
        };
        let d = tempfile::tempdir().unwrap();
        meta::write_blocking(d.path(), &m).unwrap();
        prop_assert_eq!(meta::read_blocking(d.path()).unwrap(), Some(m));
    }

    /// nsqlookupd V1 replies: `[u32 size][data]`, and IDENTIFY bodies.
    #[test]
    fn lookupd_v1(data in proptest::collection::vec(any::<u8>(), 0..300), host in "[a-z.]{0,20}",
                  tcp in any::<i64>(), http in any::<i64>()) {
        let mut out = Vec::new();
        nsq_wire::lookupd_v1::write_response(&mut out, &data);
        prop_assert_eq!(u32::from_be_bytes(out[..4].try_into().unwrap()) as usize, data.len());
        prop_assert_eq!(&out[4..], &data[..]);
        let body = serde_json::json!({"hostname": host, "broadcast_address": host, "tcp_port": tcp,
                                      "http_port": http, "version": "1.3.0"}).to_string();
        let f = nsq_wire::lookupd_v1::decode_identify(body.as_bytes()).unwrap();
        prop_assert_eq!((f.hostname, f.tcp_port, f.http_port), (host, tcp, http));
    }
}
