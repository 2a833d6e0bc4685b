//! The entry encoding and the Raft message framing: round trips, and errors (never
//! panics) for garbage.

use nsq_replication::entry::{ENTRY_VERSION, MAX_NAME_LEN};
use nsq_replication::wire::{
    decode_frame, decode_frame_shared, encode_fetch, encode_frame, encode_hello, encode_ping,
    encode_propose, encode_reply, frame_len, EncodeError, Frame, Hello, Reply, MAX_FRAME_LEN,
    SHARE_MIN,
};
use nsq_replication::{ChannelOp, DecodeError, Entry, Message, PendingMessage, RaftMessage};
use raft::eraftpb::{Entry as RaftEntry, MessageType};

fn every_kind() -> Vec<Entry> {
    let id = *b"0123456789abcdef";
    let mut entries = vec![
        Entry::Publish(Vec::new()),
        Entry::Publish(vec![
            Message {
                id,
                timestamp_ns: 1_700_000_000_000_000_000,
                attempts: 0,
                defer_ms: 0,
                body: bytes::Bytes::from_static(b"hello"),
            },
            Message {
                id: [0xff; 16],
                timestamp_ns: u64::MAX,
                attempts: u16::MAX,
                defer_ms: 3_600_000,
                body: bytes::Bytes::new(),
            },
        ]),
        Entry::PublishAt {
            base: 1 << 33,
            messages: vec![Message {
                id,
                timestamp_ns: 1,
                attempts: 0,
                defer_ms: 0,
                body: bytes::Bytes::from_static(b"at"),
            }],
        },
        Entry::PublishAt {
            base: 0,
            messages: Vec::new(),
        },
        Entry::TopicPause(true),
        Entry::TopicPause(false),
        Entry::TopicDelete,
        Entry::TopicCreate,
        Entry::Compact { index: 0 },
        Entry::Compact { index: u64::MAX },
    ];
    let ops = [
        ChannelOp::Create,
        ChannelOp::Delete,
        ChannelOp::Fin { id },
        ChannelOp::Req { id, delay_ms: 1500 },
        ChannelOp::Attempt { id, attempts: 7 },
        ChannelOp::Cursor { offset: 1 << 40 },
        ChannelOp::Empty,
        ChannelOp::Pause(true),
        ChannelOp::Pause(false),
        ChannelOp::Position {
            cursor: 42,
            pending: Vec::new(),
        },
        ChannelOp::Position {
            cursor: u64::MAX,
            pending: vec![
                PendingMessage {
                    offset: 3,
                    attempts: 2,
                    due_unix_ns: 0,
                },
                PendingMessage {
                    offset: 41,
                    attempts: u16::MAX,
                    due_unix_ns: i64::MAX,
                },
            ],
        },
        ChannelOp::SendWhole,
        ChannelOp::Changes {
            cursor: 9,
            low: 0,
            finished: Vec::new(),
            pending: Vec::new(),
        },
        ChannelOp::Changes {
            cursor: u64::MAX,
            low: 1 << 33,
            finished: vec![1 << 33, u64::MAX - 1],
            pending: vec![PendingMessage {
                offset: 1 << 34,
                attempts: 1,
                due_unix_ns: -1,
            }],
        },
    ];
    for op in ops {
        entries.push(Entry::Channel {
            channel: "archive#ephemeral".to_owned(),
            op,
        });
    }
    entries
}

#[test]
fn every_entry_kind_round_trips() {
    for entry in every_kind() {
        let bytes = entry.encode();
        assert_eq!(bytes[0], ENTRY_VERSION);
        assert_eq!(Entry::decode(&bytes), Ok(entry));
    }
}

#[test]
fn bad_entries_are_errors() {
    assert_eq!(Entry::decode(&[]), Err(DecodeError::Truncated));
    assert_eq!(Entry::decode(&[2, 1]), Err(DecodeError::Version(2)));
    assert_eq!(Entry::decode(&[1, 0]), Err(DecodeError::Tag(0)));
    assert_eq!(Entry::decode(&[1, 200]), Err(DecodeError::Tag(200)));
    assert_eq!(Entry::decode(&[1, 10, 2]), Err(DecodeError::Bool(2)));
    assert_eq!(Entry::decode(&[1, 10, 1, 0]), Err(DecodeError::Trailing(1)));
    // The topic's deletion and re-creation are a tag alone.
    assert_eq!(Entry::TopicDelete.encode(), [1, 14]);
    assert_eq!(Entry::TopicCreate.encode(), [1, 15]);
    assert_eq!(Entry::decode(&[1, 14, 0]), Err(DecodeError::Trailing(1)));
    assert_eq!(Entry::decode(&[1, 16]), Err(DecodeError::Tag(16)));
    // A count of 2^32-1 messages in a 6-byte input: refused before allocating.
    assert_eq!(
        Entry::decode(&[1, 1, 0xff, 0xff, 0xff, 0xff]),
        Err(DecodeError::Truncated)
    );
    // A name length over the limit, and a name that is not UTF-8.
    let long = u16::try_from(MAX_NAME_LEN + 1).unwrap().to_le_bytes();
    assert_eq!(
        Entry::decode(&[1, 2, long[0], long[1]]),
        Err(DecodeError::Name)
    );
    assert_eq!(Entry::decode(&[1, 2, 1, 0, 0xff]), Err(DecodeError::Name));
    // Every strict prefix of every valid entry is an error.
    for entry in every_kind() {
        let bytes = entry.encode();
        for cut in 0..bytes.len() {
            assert!(
                Entry::decode(&bytes[..cut]).is_err(),
                "{entry:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn every_entry_kind_round_trips_as_a_raft_entry() {
    for entry in every_kind() {
        let (context, data) = entry.encode_raft(None);
        if let Entry::PublishAt { messages, .. } | Entry::Publish(messages) = &entry {
            // The split layout: the fields in the context, the bodies after their
            // big-endian sizes in the data.
            let tag = if matches!(entry, Entry::Publish(_)) {
                17
            } else {
                16
            };
            assert_eq!(&context[..2], &[ENTRY_VERSION, tag]);
            let sizes: usize = messages.iter().map(|m| 4 + m.body.len()).sum();
            assert_eq!(data.len(), sizes);
        } else {
            assert!(context.is_empty(), "{entry:?}");
            assert_eq!(data.as_ref(), entry.encode().as_slice());
        }
        assert_eq!(Entry::decode_raft(&context, &data), Ok(entry));
    }
}

/// An MPUB frame as a connection reads it, and the ranges of its bodies.
fn mpub_frame(bodies: &[&[u8]]) -> (bytes::Bytes, Vec<std::ops::Range<usize>>) {
    let mut frame = b"MPUB t\n".to_vec();
    let size: usize = 4 + bodies.iter().map(|b| 4 + b.len()).sum::<usize>();
    frame.extend_from_slice(&u32::try_from(size).unwrap().to_be_bytes());
    frame.extend_from_slice(&u32::try_from(bodies.len()).unwrap().to_be_bytes());
    let mut ranges = Vec::new();
    for b in bodies {
        frame.extend_from_slice(&u32::try_from(b.len()).unwrap().to_be_bytes());
        ranges.push(frame.len()..frame.len() + b.len());
        frame.extend_from_slice(b);
    }
    (frame.into(), ranges)
}

fn numbered(bodies: Vec<bytes::Bytes>) -> Entry {
    Entry::PublishAt {
        base: 7,
        messages: bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Message {
                id: [b'a' + i as u8; 16],
                timestamp_ns: 1_700_000_000_000_000_000 + i as u64,
                attempts: 0,
                defer_ms: 250,
                body,
            })
            .collect(),
    }
}

fn within(inner: &[u8], outer: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    i >= o && i + inner.len() <= o + outer.len()
}

#[test]
fn a_batch_from_one_frame_is_proposed_with_the_frames_own_bytes() {
    let big = vec![b'x'; 5000];
    let (frame, ranges) = mpub_frame(&[b"one", &big, b"three"]);
    let wire = frame.slice(ranges[0].start - 4..ranges[2].end);
    let entry = numbered(ranges.iter().map(|r| frame.slice(r.clone())).collect());
    let (context, data) = entry.encode_raft(Some(&wire));
    // The data is the frame's message part itself, not a copy of it.
    assert_eq!(data.as_ptr(), wire.as_ptr());
    assert_eq!(data.len(), wire.len());
    let decoded = Entry::decode_raft(&context, &data).unwrap();
    assert_eq!(decoded, entry);
    let Entry::PublishAt { messages, .. } = decoded else {
        unreachable!()
    };
    for m in &messages {
        assert!(within(&m.body, &frame), "a body was copied");
    }

    // Bytes that do not hold exactly the bodies are not used: the data is a copy.
    let copies = numbered(
        [&b"one"[..], &big, b"three"]
            .iter()
            .map(|b| bytes::Bytes::copy_from_slice(b))
            .collect(),
    );
    let cases = vec![
        (&copies, wire.clone()),
        (&entry, wire.slice(4..)),
        (&entry, wire.slice(..wire.len() - 1)),
    ];
    for (case, (entry, wire)) in cases.into_iter().enumerate() {
        let (context, data) = entry.encode_raft(Some(&wire));
        assert!(!within(&data, &frame), "case {case}");
        assert_eq!(Entry::decode_raft(&context, &data).as_ref(), Ok(entry));
    }
    // A byte after the last body.
    let (frame, ranges) = mpub_frame(&[b"one", b"two"]);
    let frame = bytes::Bytes::from([frame.as_ref(), b"!"].concat());
    let entry = numbered(ranges.iter().map(|r| frame.slice(r.clone())).collect());
    let (context, data) = entry.encode_raft(Some(&frame.slice(ranges[0].start - 4..)));
    assert!(!within(&data, &frame));
    assert_eq!(Entry::decode_raft(&context, &data), Ok(entry));
}

#[test]
fn a_forwarded_batch_is_proposed_from_the_frame_it_came_in() {
    let big = bytes::Bytes::from(vec![b'y'; SHARE_MIN]);
    let forwarded = Entry::Publish(vec![Message {
        id: [b'0'; 16],
        timestamp_ns: 0,
        attempts: 0,
        defer_ms: 0,
        body: big.clone(),
    }]);
    let (context, data) = forwarded.encode_raft(None);
    let out = encode_propose(1, "t", &context, &data).unwrap();
    // The forwarding member writes the data from its own buffer, not a copy.
    let mut pieces = Vec::new();
    out.pieces(|p| pieces.push(p.as_ptr()));
    assert!(
        pieces.contains(&data.as_ptr()),
        "the data was copied into the frame"
    );
    let frame = bytes::Bytes::from(out.to_vec());
    let Some((Frame::Propose { context, data, .. }, _)) = decode_frame_shared(&frame).unwrap()
    else {
        panic!("not a propose frame");
    };
    assert!(
        within(&data, &frame),
        "the data was copied out of the frame"
    );
    let Ok(Entry::Publish(messages)) = Entry::decode_raft(&context, &data) else {
        panic!("not a batch");
    };
    assert_eq!(messages[0].body, big);
    // The leader numbers it and proposes the frame's bytes as the Raft entry's data.
    let numbered = Entry::PublishAt { base: 3, messages };
    let (_, proposed) = numbered.encode_raft(Some(&data));
    assert_eq!(proposed.as_ptr(), data.as_ptr());
}

#[test]
fn bad_split_publishes_are_errors() {
    let entry = numbered(vec![
        bytes::Bytes::from_static(b"first"),
        bytes::Bytes::from_static(b"second"),
    ]);
    let (context, data) = entry.encode_raft(None);
    let d = |b: &[u8]| bytes::Bytes::copy_from_slice(b);
    // Version and tag of the context.
    let mut c = context.clone();
    c[0] = 2;
    assert_eq!(Entry::decode_raft(&c, &data), Err(DecodeError::Version(2)));
    let mut c = context.clone();
    c[1] = 1;
    assert_eq!(Entry::decode_raft(&c, &data), Err(DecodeError::Tag(1)));
    // A batch without a base (tag 17) read as one with a base, and the other way.
    let mut c = context.clone();
    c[1] = 17;
    assert!(Entry::decode_raft(&c, &data).is_err());
    let (unnumbered, _) = Entry::Publish(vec![]).encode_raft(None);
    assert_eq!(unnumbered, [ENTRY_VERSION, 17, 0, 0, 0, 0]);
    // A count of 2^32-1: refused before allocating.
    let mut c = context.clone();
    c[10..14].copy_from_slice(&[0xff; 4]);
    assert_eq!(Entry::decode_raft(&c, &data), Err(DecodeError::Truncated));
    // A body size past the data's end.
    let mut bad = data.to_vec();
    bad[..4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        Entry::decode_raft(&context, &d(&bad)),
        Err(DecodeError::Truncated)
    );
    // Bytes after the last body, and after the last message's fields.
    let longer = [data.as_ref(), b"?"].concat();
    assert_eq!(
        Entry::decode_raft(&context, &d(&longer)),
        Err(DecodeError::Trailing(1))
    );
    let longer = [context.as_slice(), &[0; 3]].concat();
    assert!(Entry::decode_raft(&longer, &data).is_err());
    // Every strict prefix of either field.
    for cut in 1..context.len() {
        assert!(
            Entry::decode_raft(&context[..cut], &data).is_err(),
            "context cut at {cut}"
        );
    }
    for cut in 0..data.len() {
        assert!(
            Entry::decode_raft(&context, &data.slice(..cut)).is_err(),
            "data cut at {cut}"
        );
    }
    // Noise in either field never panics.
    let mut rng = fastrand::Rng::with_seed(0x5917);
    for _ in 0..10_000 {
        let mut c = context.clone();
        let mut b = data.to_vec();
        for _ in 0..rng.usize(1..4) {
            if rng.bool() {
                let at = rng.usize(0..c.len());
                c[at] = rng.u8(..);
            } else {
                let at = rng.usize(0..b.len());
                b[at] = rng.u8(..);
            }
        }
        let _ = Entry::decode_raft(&c, &d(&b));
    }
}

#[test]
fn random_bytes_never_panic_the_decoders() {
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let valid: Vec<Vec<u8>> = every_kind().iter().map(Entry::encode).collect();
    let frame = encode_frame("topic", &mut append_message())
        .unwrap()
        .to_vec();
    for round in 0..20_000 {
        // Pure noise, and valid inputs with a few bytes changed.
        let bytes = if round % 2 == 0 {
            let len = rng.usize(0..64);
            (0..len).map(|_| rng.u8(..)).collect()
        } else {
            let mut b = if round % 4 == 1 {
                valid[rng.usize(0..valid.len())].clone()
            } else {
                frame.clone()
            };
            for _ in 0..rng.usize(1..4) {
                let at = rng.usize(0..b.len());
                b[at] = rng.u8(..);
            }
            b
        };
        let _ = Entry::decode(&bytes);
        let _ = decode_frame(&bytes);
    }
}

fn append_message() -> RaftMessage {
    let mut m = RaftMessage::default();
    m.set_msg_type(MessageType::MsgAppend);
    m.from = 1;
    m.to = 2;
    m.term = 3;
    m.index = 10;
    m.log_term = 2;
    m.commit = 9;
    let e = RaftEntry {
        index: 11,
        term: 3,
        data: Entry::TopicPause(true).encode().into(),
        ..RaftEntry::default()
    };
    m.entries = vec![e].into();
    m
}

fn raft(frame: Frame) -> (String, RaftMessage) {
    match frame {
        Frame::Raft { topic, message } => (topic, message),
        other => panic!("not a Raft frame: {other:?}"),
    }
}

/// An append with a small entry and one whose data is written from its own buffer.
fn append_with_large_entry() -> RaftMessage {
    let mut m = append_message();
    let big = Entry::Publish(vec![Message {
        id: *b"0123456789abcdef",
        timestamp_ns: 1_700_000_000_000_000_000,
        attempts: 1,
        defer_ms: 0,
        body: vec![7u8; SHARE_MIN * 2].into(),
    }])
    .encode();
    m.entries.push(RaftEntry {
        index: 12,
        term: 3,
        data: big.into(),
        context: b"ctx".to_vec().into(),
        ..RaftEntry::default()
    });
    m.entries.push(RaftEntry {
        index: 13,
        term: 3,
        ..RaftEntry::default()
    });
    m
}

#[test]
fn large_entry_data_is_sent_and_received_without_a_copy() {
    let mut m = append_with_large_entry();
    let before = m.clone();
    let frame = encode_frame("orders", &mut m).unwrap();
    assert_eq!(m, before, "the message is as it was");
    // The large entry's data is one of the frame's pieces, in the entry's own buffer;
    // the small one's was copied.
    let big = &m.entries[1].data;
    let mut pieces = Vec::new();
    frame.pieces(|p| pieces.push(p));
    assert!(pieces
        .iter()
        .any(|p| p.as_ptr() == big.as_ptr() && p.len() == big.len()));
    assert!(!pieces
        .iter()
        .any(|p| p.as_ptr() == m.entries[0].data.as_ptr()));
    let bytes = frame.to_vec();
    assert_eq!(bytes.len(), frame.len());
    assert_eq!(frame_len(&bytes), Ok(Some(bytes.len())));
    // protobuf reads what it did not write itself: the same message.
    let (plain, used) = decode_frame(&bytes).unwrap().unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(raft(plain), ("orders".to_string(), before.clone()));
    // Read from a shared buffer, the large data is a slice of it; the small data and
    // the contexts are copies (they would keep the whole buffer alive).
    let shared = bytes::Bytes::from(bytes);
    let (frame, _) = decode_frame_shared(&shared).unwrap().unwrap();
    let (_, got) = raft(frame);
    assert_eq!(got, before);
    let inside = |b: &bytes::Bytes| {
        let start = shared.as_ptr() as usize;
        let at = b.as_ptr() as usize;
        at >= start && at < start + shared.len()
    };
    assert!(inside(&got.entries[1].data));
    assert!(!inside(&got.entries[0].data));
    assert!(!inside(&got.entries[1].context));
}

#[test]
fn frames_round_trip_and_wait_for_whole_frames() {
    let mut m = append_message();
    let mut stream = encode_frame("orders", &mut m).unwrap().to_vec();
    let second = encode_frame("payments", &mut RaftMessage::default())
        .unwrap()
        .to_vec();
    stream.extend_from_slice(&second);
    let (frame, used) = decode_frame(&stream).unwrap().unwrap();
    assert_eq!(raft(frame), ("orders".to_string(), m));
    let (frame2, used2) = decode_frame(&stream[used..]).unwrap().unwrap();
    assert_eq!(raft(frame2).0, "payments");
    assert_eq!(used + used2, stream.len());
    // A frame not yet whole: wait for more bytes.
    for cut in 0..used {
        assert_eq!(decode_frame(&stream[..cut]), Ok(None), "cut at {cut}");
    }
}

#[test]
fn hello_propose_and_reply_frames_round_trip() {
    let hello = Hello {
        node_id: 7,
        replica: 0xdead_beef,
        address: "10.0.0.7:4153".to_string(),
        tcp: "10.0.0.7:4150".to_string(),
        members: 0x0102_0304,
    };
    let (context, data) = Entry::TopicPause(false).encode_raft(None);
    assert!(context.is_empty());
    let batch = Entry::Publish(vec![Message {
        id: [b'0'; 16],
        timestamp_ns: 0,
        attempts: 0,
        defer_ms: 0,
        body: bytes::Bytes::from_static(b"forwarded"),
    }]);
    let (batch_context, batch_data) = batch.encode_raft(None);
    let frames = [
        (encode_hello(&hello).unwrap(), Frame::Hello(hello.clone())),
        (
            encode_propose(9, "orders", &context, &data)
                .unwrap()
                .to_vec(),
            Frame::Propose {
                request: 9,
                topic: "orders".to_string(),
                context: Vec::new(),
                data: data.clone(),
            },
        ),
        (
            encode_propose(10, "orders", &batch_context, &batch_data)
                .unwrap()
                .to_vec(),
            Frame::Propose {
                request: 10,
                topic: "orders".to_string(),
                context: batch_context.clone(),
                data: batch_data.clone(),
            },
        ),
        (
            encode_reply(9, &Reply::Acked).unwrap(),
            Frame::Reply {
                request: 9,
                reply: Reply::Acked,
            },
        ),
        (
            encode_reply(10, &Reply::NotLeader { leader: 3 }).unwrap(),
            Frame::Reply {
                request: 10,
                reply: Reply::NotLeader { leader: 3 },
            },
        ),
        (
            encode_reply(11, &Reply::Failed("no quorum".to_string())).unwrap(),
            Frame::Reply {
                request: 11,
                reply: Reply::Failed("no quorum".to_string()),
            },
        ),
        (
            encode_fetch(12, "orders", 1 << 40, 4 << 20).unwrap(),
            Frame::Fetch {
                request: 12,
                topic: "orders".to_string(),
                from: 1 << 40,
                max_bytes: 4 << 20,
            },
        ),
        (
            encode_reply(12, &Reply::Records(vec![0, 1, 2, 255])).unwrap(),
            Frame::Reply {
                request: 12,
                reply: Reply::Records(vec![0, 1, 2, 255]),
            },
        ),
        (
            encode_reply(13, &Reply::Records(Vec::new())).unwrap(),
            Frame::Reply {
                request: 13,
                reply: Reply::Records(Vec::new()),
            },
        ),
    ];
    for (bytes, want) in frames {
        let (got, used) = decode_frame(&bytes).unwrap().unwrap();
        assert_eq!(got, want);
        assert_eq!(used, bytes.len());
    }
    // A failure text is cut at 1,024 bytes, on a character boundary.
    let long = "é".repeat(600);
    let (got, _) = decode_frame(&encode_reply(1, &Reply::Failed(long)).unwrap())
        .unwrap()
        .unwrap();
    let Frame::Reply {
        reply: Reply::Failed(text),
        ..
    } = got
    else {
        panic!("not a failure: {got:?}");
    };
    assert_eq!(text, "é".repeat(512));
}

#[test]
fn a_ping_carries_the_senders_contact_number_clock_and_echo() {
    let ping = encode_ping(
        0x0102_0304_0506_0708,
        0x1112_1314_1516_1718,
        0x2122_2324_2526_2728,
    );
    let mut want = vec![26, 0, 0, 0, 8, 5];
    want.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
    want.extend_from_slice(&[0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]);
    want.extend_from_slice(&[0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21]);
    assert_eq!(ping, want);
    assert_eq!(
        decode_frame(&ping),
        Ok(Some((
            Frame::Ping {
                contact: 0x0102_0304_0506_0708,
                sent: 0x1112_1314_1516_1718,
                echo: 0x2122_2324_2526_2728,
            },
            30
        )))
    );
    // A short or long ping is out of step.
    let mut short = ping[..ping.len() - 1].to_vec();
    short[0] = 25;
    assert!(decode_frame(&short).is_err());
    let mut long = ping.clone();
    long.push(0);
    long[0] = 27;
    assert!(decode_frame(&long).is_err());
}

#[test]
fn bad_frames_are_errors() {
    assert_eq!(
        encode_frame("", &mut RaftMessage::default()),
        Err(EncodeError::Topic)
    );
    let too_long = u32::try_from(MAX_FRAME_LEN + 1).unwrap().to_le_bytes();
    assert_eq!(decode_frame(&too_long), Err(DecodeError::Truncated));
    assert_eq!(decode_frame(&[1, 0, 0, 0, 2]), Err(DecodeError::Truncated));
    assert_eq!(
        decode_frame(&[2, 0, 0, 0, 9, 2]),
        Err(DecodeError::Version(9))
    );
    // Version 7 frames (members of a release whose pings carry no clocks) are refused.
    assert_eq!(
        decode_frame(&[2, 0, 0, 0, 7, 2]),
        Err(DecodeError::Version(7))
    );
    assert_eq!(decode_frame(&[2, 0, 0, 0, 8, 9]), Err(DecodeError::Tag(9)));
    assert_eq!(decode_frame(&[3, 0, 0, 0, 8, 2, 0]), Err(DecodeError::Name));
    assert_eq!(
        decode_frame(&[3, 0, 0, 0, 8, 2, 5]),
        Err(DecodeError::Truncated)
    );
    // A valid header and a body that is not a protobuf message (field 0 is invalid).
    assert_eq!(
        decode_frame(&[6, 0, 0, 0, 8, 2, 1, b't', 0x00, 0x00]),
        Err(DecodeError::Protobuf)
    );
    // A fetch cut short, and one with a byte after it.
    let fetch = encode_fetch(1, "t", 5, 9).unwrap();
    let mut short = fetch[..fetch.len() - 1].to_vec();
    short[0] -= 1;
    assert_eq!(decode_frame(&short), Err(DecodeError::Truncated));
    let mut long = fetch.clone();
    long.push(0);
    long[0] += 1;
    assert_eq!(decode_frame(&long), Err(DecodeError::Trailing(1)));
    // A reply with an unknown status, and a hello with bytes after it.
    let mut bad = encode_reply(1, &Reply::Acked).unwrap();
    *bad.last_mut().unwrap() = 7;
    assert_eq!(decode_frame(&bad), Err(DecodeError::Tag(7)));
    let mut hello = encode_hello(&Hello {
        node_id: 1,
        replica: 1,
        address: "a:1".to_string(),
        tcp: "a:2".to_string(),
        members: 9,
    })
    .unwrap();
    // Without its member list (a greeting of the release before): cut short.
    let mut short = hello[..hello.len() - 4].to_vec();
    short[0] -= 4;
    assert_eq!(decode_frame(&short), Err(DecodeError::Truncated));
    hello.push(0);
    hello[0] += 1;
    assert_eq!(decode_frame(&hello), Err(DecodeError::Trailing(1)));
}
