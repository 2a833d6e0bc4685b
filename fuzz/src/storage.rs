//! Harnesses of the on-disk formats: segment scans, index and journal decoding, topic
//! metadata, and the import of nsqd's diskqueue files.

use super::{scratch_dir, Knobs};
use bytes::Bytes;

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
