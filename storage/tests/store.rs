//! Round trip, rotation, retention, recovery and corruption handling of the segment
//! store, on a real glommio executor and real DMA files, for several segment sizes.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use bytes::Bytes;
use nsq_storage::{StoreConfig, StoredRecord, TopicStore};
use std::rc::Rc;
use std::time::Duration;

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move { f().await })
        .unwrap()
        .join()
        .unwrap();
}

fn rec(seq: u64) -> StoredRecord {
    StoredRecord {
        seq,
        timestamp: 1_000 + seq as i64,
        defer_until: if seq.is_multiple_of(7) { 99 } else { 0 },
        id: 0x1000 + seq,
        attempts: (seq % 3) as u16,
        body: Bytes::from(format!("message-{seq}-{}", "x".repeat((seq % 50) as usize))),
    }
}

/// The sequences of up to `max` records read from `from` on.
async fn read_seqs(s: &TopicStore, from: u64, max: usize) -> Vec<u64> {
    s.read(from, max)
        .await
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect()
}

/// `NSQD_SEGMENT_IO=threads` runs every test here on the blocking-thread segment path
/// (scripts/test.sh does, after the default run on io_uring).
fn segment_io() -> nsq_storage::SegmentIo {
    match std::env::var("NSQD_SEGMENT_IO").as_deref() {
        Ok("threads") => nsq_storage::SegmentIo::Threads,
        _ => nsq_storage::SegmentIo::Ring,
    }
}

fn cfg(max: u64, sync_every: u64) -> StoreConfig {
    StoreConfig {
        max_bytes_per_file: max,
        sync_every,
        sync_timeout: Duration::from_millis(50),
        io: segment_io(),
    }
}

/// Opens the store at `path` (recovering `keep` tail records, as `TopicStore::open`),
/// appends records `0..n` (`rec`) and waits until they are durable.
async fn filled(path: std::path::PathBuf, cfg: StoreConfig, keep: usize, n: u64) -> Rc<TopicStore> {
    let s = TopicStore::open(path, cfg, keep).await.unwrap().store;
    for i in 0..n {
        s.append(&rec(i));
    }
    s.wait_durable(n).await.unwrap();
    s
}

const SIZES: [u64; 3] = [4096, 64 * 1024, 100 * 1024 * 1024];

#[test]
fn append_read_recover_for_several_segment_sizes() {
    for size in SIZES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-topic");
        let p2 = path.clone();
        run(move || async move {
            let r = TopicStore::open(p2.clone(), cfg(size, 100), 10)
                .await
                .unwrap();
            assert_eq!(r.next_seq, 0);
            let s = r.store;
            for i in 0..2000u64 {
                s.append(&rec(i));
                if i % 97 == 0 {
                    // let the writer run between bursts
                    glommio::yield_if_needed().await;
                }
            }
            s.wait_durable(2000).await.unwrap();
            let got = s.read(0, 5000).await.unwrap();
            assert_eq!(got.len(), 2000, "segment size {size}");
            for (i, r) in got.iter().enumerate() {
                assert_eq!(r, &rec(i as u64));
            }
            let mid = s.read(1234, 10).await.unwrap();
            assert_eq!(
                mid.iter().map(|r| r.seq).collect::<Vec<_>>(),
                (1234..1244).collect::<Vec<_>>()
            );
            if size == 4096 {
                assert!(s.segment_count() > 3, "rotation happened");
            }
            s.close().await;
            // Recovery: same records, tail kept, new writes continue the sequence.
            let r = TopicStore::open(p2.clone(), cfg(size, 100), 10)
                .await
                .unwrap();
            assert_eq!(r.next_seq, 2000);
            assert_eq!(r.first_seq, 0);
            assert_eq!(r.tail.len(), 10);
            assert_eq!(r.tail.back().unwrap(), &rec(1999));
            let s = r.store;
            s.append(&rec(2000));
            s.wait_durable(2001).await.unwrap();
            let all = s.read(0, 5000).await.unwrap();
            assert_eq!(all.len(), 2001);
            s.close().await;
        });
    }
}

/// A crash right after the store made a new segment file leaves that file without
/// records (here: without even its header): recovery still gives the newest records,
/// from the segment before it, so the caller knows its newest record and ID.
#[test]
fn an_empty_newest_segment_leaves_the_tail_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-topic");
    let p2 = path.clone();
    run(move || async move {
        let s = filled(p2.clone(), cfg(4096, 100), 10, 300).await;
        s.close().await;
        // Sealed with its index, then an empty file at the next base.
        let r = TopicStore::open(p2.clone(), cfg(4096, 100), 10)
            .await
            .unwrap();
        r.store.close().await;
        std::fs::write(p2.join(format!("{:020}.seg", 300)), b"").unwrap();
        let r = TopicStore::open(p2.clone(), cfg(4096, 100), 10)
            .await
            .unwrap();
        assert_eq!(r.next_seq, 300);
        assert_eq!(
            r.tail.back(),
            Some(&rec(299)),
            "{} in the tail",
            r.tail.len()
        );
        r.store.close().await;
    });
}

#[test]
fn retention_deletes_passed_segments_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-r");
    run(move || async move {
        let s = filled(path.clone(), cfg(4096, 1), 0, 500).await;
        let before = s.segment_count();
        s.delete_before(250).await;
        let after = s.segment_count();
        assert!(after < before);
        let rest = s.read(0, 1000).await.unwrap();
        assert!(
            rest[0].seq <= 250,
            "nothing at or above the watermark was deleted"
        );
        assert_eq!(rest.last().unwrap().seq, 499);
        s.delete_before(u64::MAX).await;
        assert_eq!(s.segment_count(), 1, "the segment being written is kept");
        s.close().await;
    });
}

#[test]
fn corrupt_and_torn_records_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-c");
    let p2 = path.clone();
    run(move || async move {
        let s = filled(p2, cfg(1 << 30, 1), 0, 100).await;
        s.close().await;
    });
    let seg = std::fs::read_dir(&path)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .unwrap()
        .path();
    let mut data = std::fs::read(&seg).unwrap();
    // Flip a byte inside record 10's body and cut the file in the middle of the last one.
    let mut off = 32usize;
    let mut offs = Vec::new();
    while off + 4 <= data.len() {
        let len = u32::from_be_bytes(data[off..off + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        offs.push(off);
        off += 8 + len;
    }
    assert_eq!(offs.len(), 100);
    data[offs[10] + 50] ^= 0x55;
    data.truncate(offs[99] + 20);
    std::fs::write(&seg, &data).unwrap();
    let p3 = path.clone();
    run(move || async move {
        let r = TopicStore::open(p3, cfg(1 << 30, 1), 1000).await.unwrap();
        let seqs: Vec<u64> = r.tail.iter().map(|r| r.seq).collect();
        let want: Vec<u64> = (0..99).filter(|s| *s != 10).collect();
        assert_eq!(seqs, want);
        let read = read_seqs(&r.store, 0, 1000).await;
        assert_eq!(read, want);
        r.store.close().await;
    });
}

fn files_with(dir: &std::path::Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    v.sort();
    v
}

fn gap_rec(seq: u64) -> StoredRecord {
    StoredRecord {
        seq,
        timestamp: 7,
        defer_until: 0,
        id: seq,
        attempts: 0,
        body: Bytes::from(format!("gap-{seq}-{}", "y".repeat(60))),
    }
}

#[test]
fn sealed_segments_recover_from_their_index_with_gaps_and_corruption_found_at_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-sealed");
    let p2 = path.clone();
    // Sequences with gaps (as when records every channel finished are never written).
    let seqs: Vec<u64> = (0..1500u64).map(|i| i * 3 + (i % 2)).collect();
    let s2 = seqs.clone();
    run(move || async move {
        let s = TopicStore::open(p2, cfg(16 * 1024, 100), 0)
            .await
            .unwrap()
            .store;
        for &q in &s2 {
            s.append(&gap_rec(q));
        }
        s.wait_durable(s2[s2.len() - 1] + 1).await.unwrap();
        s.close().await;
    });
    let segs = files_with(&path, ".seg");
    let idxs = files_with(&path, ".idx");
    assert!(segs.len() > 3, "rotation happened");
    assert_eq!(
        segs.len(),
        idxs.len(),
        "every segment sealed (rotation and close)"
    );
    // Corrupt a record in the middle of the first (sealed) segment.
    let mut first = std::fs::read(&segs[0]).unwrap();
    let mid = first.len() / 2;
    first[mid] ^= 0x5a;
    std::fs::write(&segs[0], &first).unwrap();
    let p3 = path.clone();
    let s3 = seqs.clone();
    run(move || async move {
        let r = TopicStore::open(p3.clone(), cfg(16 * 1024, 100), 50)
            .await
            .unwrap();
        assert_eq!(r.scanned_segments, 0, "nothing re-scanned");
        assert_eq!(r.sealed_segments, segs.len());
        assert_eq!(r.next_seq, s3[s3.len() - 1] + 1);
        assert_eq!(r.first_seq, 0);
        let tail: Vec<u64> = r.tail.iter().map(|r| r.seq).collect();
        assert!(!tail.is_empty() && tail.len() <= 50);
        assert_eq!(
            &s3[s3.len() - tail.len()..],
            &tail[..],
            "tail is the newest records"
        );
        // Reading skips exactly the corrupt record and returns every other one.
        let all = read_seqs(&r.store, 0, 5000).await;
        assert_eq!(all.len(), s3.len() - 1, "one corrupt record skipped");
        assert!(all.iter().all(|q| s3.contains(q)));
        let mid = read_seqs(&r.store, s3[700], 3).await;
        assert_eq!(mid, s3[700..703].to_vec());
        // New writes continue after the last sequence, in a new segment.
        r.store.append(&gap_rec(r.next_seq + 5));
        r.store.wait_durable(r.next_seq + 6).await.unwrap();
        r.store.close().await;
    });
}

#[test]
fn a_segment_left_open_by_a_crash_is_scanned_once_then_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-crash");
    let p2 = path.clone();
    run(move || async move {
        let _s = filled(p2, cfg(1 << 30, 1), 0, 300).await;
        // No close: the executor ends as if the process was killed.
    });
    assert!(files_with(&path, ".idx").is_empty());
    for round in 0..2 {
        let p3 = path.clone();
        run(move || async move {
            let r = TopicStore::open(p3, cfg(1 << 30, 1), 10).await.unwrap();
            assert_eq!(r.next_seq, 300);
            assert_eq!(r.tail.len(), 10);
            assert_eq!(r.tail.back().unwrap(), &rec(299));
            assert_eq!(
                r.scanned_segments,
                if round == 0 { 1 } else { 0 },
                "round {round}"
            );
            // Give the background seal time to finish, then crash again.
            glommio::timer::sleep(Duration::from_millis(200)).await;
        });
    }
    // A segment whose size no longer matches its index is scanned again.
    let seg = files_with(&path, ".seg").remove(0);
    let data = std::fs::read(&seg).unwrap();
    let mut off = 32usize;
    let mut last = off;
    while off + 4 <= data.len() {
        let len = u32::from_be_bytes(data[off..off + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        last = off;
        off += 8 + len;
    }
    std::fs::write(&seg, &data[..last + 10]).unwrap();
    let p4 = path.clone();
    run(move || async move {
        let r = TopicStore::open(p4, cfg(1 << 30, 1), 1000).await.unwrap();
        assert_eq!(r.scanned_segments, 1);
        assert_eq!(r.next_seq, 299, "torn last record dropped");
        assert_eq!(r.tail.len(), 299);
    });
}

/// Offsets and encoded lengths of the records of a segment file (a clean one).
fn record_spans(data: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut off = 32usize;
    while off + 4 <= data.len() {
        let len = u32::from_be_bytes(data[off..off + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        spans.push((off, 8 + len));
        off += 8 + len;
    }
    spans
}

#[test]
fn offline_damage_loses_only_the_damaged_records() {
    // A 4 KiB block zeroed in the middle of a segment (read through its index, then
    // scanned without it, with its header's base flipped as well): every record outside
    // the block is still served, in order.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-damage");
    write_store(&path, 400, 1 << 30, true);
    let seg = files_with(&path, ".seg").remove(0);
    assert_eq!(files_with(&path, ".idx").len(), 1, "sealed at close");
    let mut data = std::fs::read(&seg).unwrap();
    let spans = record_spans(&data);
    assert_eq!(spans.len(), 400);
    let (z0, z1) = (8192usize, 12288usize);
    assert!(data.len() > z1 + 4096);
    data[z0..z1].iter_mut().for_each(|b| *b = 0);
    std::fs::write(&seg, &data).unwrap();
    let want: Vec<u64> = spans
        .iter()
        .enumerate()
        .filter(|(_, (off, n))| off + n <= z0 || *off >= z1)
        .map(|(i, _)| i as u64)
        .collect();
    assert!(want.len() < 400 && want.len() > 300, "{}", want.len());
    for round in ["with its index", "scanned, header base flipped"] {
        let p3 = path.clone();
        let w = want.clone();
        let scanned = round.starts_with("scanned");
        run(move || async move {
            let r = TopicStore::open(p3, cfg(1 << 30, 1), 1000).await.unwrap();
            assert_eq!(r.scanned_segments, usize::from(scanned), "{round}");
            assert_eq!(r.next_seq, 400, "{round}");
            let read = read_seqs(&r.store, 0, 1000).await;
            assert_eq!(read, w, "{round}: read");
            // From a sequence inside the zeroed block: the next record after it.
            let after = read_seqs(
                &r.store,
                w[w.iter()
                    .position(|q| *q > w[0] + 1 && !w.contains(&(q - 1)))
                    .unwrap()]
                    - 1,
                1,
            )
            .await;
            assert_eq!(after.len(), 1, "{round}: read from inside the block");
            if scanned {
                let tail: Vec<u64> = r.tail.iter().map(|r| r.seq).collect();
                assert_eq!(tail, w, "{round}: recovered tail");
            }
            r.store.close().await;
        });
        // Next round: no index, and a header that names another base.
        for ix in files_with(&path, ".idx") {
            std::fs::remove_file(ix).unwrap();
        }
        let mut d = std::fs::read(&seg).unwrap();
        d[12..20].copy_from_slice(&250u64.to_be_bytes());
        std::fs::write(&seg, &d).unwrap();
    }
}

/// Writes `n` records (`rec`) in segments of `max` bytes; closes cleanly (every segment
/// sealed) or not (the newest left open, as by kill -9).
fn write_store(path: &std::path::Path, n: u64, max: u64, close: bool) {
    let p = path.to_path_buf();
    run(move || async move {
        let s = filled(p, cfg(max, 1), 0, n).await;
        if close {
            s.close().await;
        }
    });
}

/// Every sequence the store serves from the start, after a restart.
fn read_all(path: &std::path::Path) -> Vec<u64> {
    let p = path.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    run(move || async move {
        let r = TopicStore::open(p, cfg(4096, 1), 10).await.unwrap();
        let seqs = read_seqs(&r.store, 0, 100_000).await;
        tx.send(seqs).unwrap();
        r.store.close().await;
    });
    rx.recv().unwrap()
}

#[test]
fn misnamed_swapped_and_copied_segments_are_read_by_their_contents() {
    let all: Vec<u64> = (0..600).collect();
    // Two sealed segments swap names.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-swap");
    write_store(&path, 600, 4096, true);
    let segs = files_with(&path, ".seg");
    assert!(segs.len() > 6, "{}", segs.len());
    let tmp = path.join("x");
    std::fs::rename(&segs[2], &tmp).unwrap();
    std::fs::rename(&segs[4], &segs[2]).unwrap();
    std::fs::rename(&tmp, &segs[4]).unwrap();
    assert_eq!(read_all(&path), all, "swapped names");
    // A stray copy of a segment under a higher name.
    let stray = path.join(format!("{:020}.seg", 1_000_000));
    std::fs::copy(&segs[1], &stray).unwrap();
    assert_eq!(read_all(&path), all, "stray copy");
    assert!(!stray.exists());
    assert!(path
        .join(format!("{:020}.seg.misnamed", 1_000_000))
        .exists());
    // A segment's first record sequence damaged (below its name now, its CRC fails): the
    // file is not moved, only that record is lost.
    let path2 = dir.path().join("t-seqflip");
    write_store(&path2, 600, 4096, true);
    let segs2 = files_with(&path2, ".seg");
    let mut d = std::fs::read(&segs2[3]).unwrap();
    let first_seq = u64::from_be_bytes(d[32 + 13..32 + 21].try_into().unwrap());
    // Damaged to the base of an earlier segment, so that moving the file would collide.
    let earlier: u64 = segs2[2]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    d[32 + 13..32 + 21].copy_from_slice(&earlier.to_be_bytes());
    std::fs::write(&segs2[3], &d).unwrap();
    let want: Vec<u64> = all.iter().copied().filter(|q| *q != first_seq).collect();
    assert_eq!(read_all(&path2), want, "first record's sequence flipped");
    assert!(segs2[3].exists());
    // The newest segment, left open by a crash, with its header's salt flipped.
    let path = dir.path().join("t-salt");
    write_store(&path, 600, 4096, false);
    let newest = files_with(&path, ".seg").pop().unwrap();
    let mut d = std::fs::read(&newest).unwrap();
    d[21] ^= 1;
    std::fs::write(&newest, &d).unwrap();
    assert_eq!(read_all(&path), all, "newest segment's salt flipped");
    // A valid older record written over records of a sealed segment: only the records
    // it covers are lost.
    let path = dir.path().join("t-stale");
    write_store(&path, 600, 16 * 1024, true);
    let segs = files_with(&path, ".seg");
    let mut d = std::fs::read(&segs[1]).unwrap();
    let spans = record_spans(&d);
    let first = std::fs::read(&segs[0]).unwrap();
    let (o0, n0) = record_spans(&first)[3];
    let (at, _) = spans[10];
    d[at..at + n0].copy_from_slice(&first[o0..o0 + n0]);
    std::fs::write(&segs[1], &d).unwrap();
    let base = u64::from_be_bytes(d[12..20].try_into().unwrap());
    let covered: Vec<u64> = spans
        .iter()
        .enumerate()
        .filter(|(_, (o, n))| *o < at + n0 && o + n > at)
        .map(|(i, _)| base + i as u64)
        .collect();
    let want: Vec<u64> = all
        .iter()
        .copied()
        .filter(|q| !covered.contains(q))
        .collect();
    assert!(covered.len() < 4, "{covered:?}");
    assert_eq!(
        read_all(&path),
        want,
        "a stale record written over a sealed segment"
    );
}

#[test]
fn journal_events_are_written_synced_and_dropped_once_covered() {
    use nsq_storage::journal::{self, EventKind, MessageState};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-j");
    let p2 = path.clone();
    run(move || async move {
        let s = TopicStore::open(p2.clone(), cfg(1 << 30, 1), 0)
            .await
            .unwrap()
            .store;
        s.append(&rec(0));
        s.journal(EventKind::Requeued, "c", 0, 3, 12345);
        s.wait_durable(1).await.unwrap();
        glommio::timer::sleep(Duration::from_millis(20)).await;
        // Written (and synced) without a close: a crash keeps it.
        let evs = journal::read_blocking(&p2, 0);
        assert_eq!(evs.len(), 1);
        let f = journal::fold(evs);
        assert_eq!(
            f["c"].states[&0],
            MessageState::Pending {
                attempts: 3,
                due_unix_ns: 12345
            }
        );
        // A checkpoint covers generation 1; later events go to generation 2.
        let g = s.journal_snapshot();
        s.journal(EventKind::Finished, "c", 0, 4, 0);
        s.journal_covered(g).await;
        glommio::timer::sleep(Duration::from_millis(50)).await;
        let evs = journal::read_blocking(&p2, g);
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].kind, EventKind::Finished);
        assert!(
            !journal::path(&p2, g).exists(),
            "covered generation deleted"
        );
        s.close().await;
    });
}

/// An event is in its file (the page cache) when `journal` returns, before anything else
/// runs on the thread: the connection's writer may hand the redelivery it records to the
/// consumer in the next task turn, and a kill -9 after that must not lose its attempts.
/// The events were written a task turn later; on a loaded machine a kill -9 in between
/// (tens of milliseconds) lost REQs, redeliveries and FINs, and messages came back with
/// fewer attempts than a consumer had seen.
#[test]
fn journal_event_reaches_its_file_before_journal_returns() {
    use nsq_storage::journal::{self, EventKind};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-jnow");
    let p2 = path.clone();
    run(move || async move {
        let s = TopicStore::open(p2.clone(), cfg(1 << 30, 1), 0)
            .await
            .unwrap()
            .store;
        s.append(&rec(0));
        s.wait_durable(1).await.unwrap();
        // On the blocking-thread path (FUSE, network filesystems) the write is the
        // flusher task's, off the shard: there the events reach the file a moment later.
        let threads = segment_io() == nsq_storage::SegmentIo::Threads;
        let settle = || async {
            if threads {
                glommio::timer::sleep(Duration::from_millis(200)).await;
            }
        };
        s.journal(EventKind::Requeued, "c", 0, 1, 0);
        s.journal(EventKind::Delivered, "c", 0, 2, 0);
        // No await since: neither the flusher nor the writer task ran.
        settle().await;
        let kinds: Vec<_> = journal::read_blocking(&p2, 0)
            .into_iter()
            .map(|e| (e.kind, e.attempts))
            .collect();
        assert_eq!(kinds, [(EventKind::Requeued, 1), (EventKind::Delivered, 2)]);
        // And after a checkpoint, in the next generation's file.
        let g = s.journal_snapshot();
        s.journal(EventKind::Finished, "c", 0, 2, 0);
        settle().await;
        let evs = journal::read_blocking(&p2, g);
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].kind, EventKind::Finished);
        s.close().await;
    });
}

#[test]
fn after_a_crash_only_what_follows_the_open_segments_last_checkpoint_is_scanned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-partial");
    let p2 = path.clone();
    run(move || async move {
        let s = filled(p2, cfg(1 << 30, 1), 0, 2000).await;
        // A sync after --sync-timeout (50 ms here) writes the open segment's partial index.
        glommio::timer::sleep(Duration::from_millis(80)).await;
        s.append(&rec(2000));
        s.wait_durable(2001).await.unwrap();
        glommio::timer::sleep(Duration::from_millis(30)).await;
        for i in 2001..2100u64 {
            s.append(&rec(i));
        }
        s.wait_durable(2100).await.unwrap();
        // No close: a crash.
    });
    assert_eq!(files_with(&path, ".pidx").len(), 1, "partial index written");
    let seg_len = std::fs::metadata(files_with(&path, ".seg").remove(0))
        .unwrap()
        .len();
    let p3 = path.clone();
    run(move || async move {
        let r = TopicStore::open(p3, cfg(1 << 30, 1), 10).await.unwrap();
        assert_eq!(r.next_seq, 2100);
        assert_eq!(r.scanned_segments, 1);
        assert!(
            r.scanned_bytes < seg_len / 4,
            "scanned {} of {seg_len} bytes",
            r.scanned_bytes
        );
        let tail: Vec<u64> = r.tail.iter().map(|r| r.seq).collect();
        assert_eq!(tail, (2090..2100).collect::<Vec<_>>());
        let all = r.store.read(0, 5000).await.unwrap();
        assert_eq!(all.len(), 2100);
        for (i, got) in all.iter().enumerate() {
            assert_eq!(got, &rec(i as u64));
        }
        glommio::timer::sleep(Duration::from_millis(200)).await;
        r.store.close().await;
    });
    assert_eq!(files_with(&path, ".idx").len(), 1, "sealed after recovery");
    assert!(
        files_with(&path, ".pidx").is_empty(),
        "partial index removed"
    );
}

#[test]
fn a_deleted_store_counts_as_released_once_it_has_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-gone");
    run(move || async move {
        let s = TopicStore::create(path.clone(), cfg(1 << 20, 100), 0).unwrap();
        s.append(&rec(0));
        s.wait_durable(1).await.unwrap();
        assert_eq!(nsq_storage::take_stores_released(), 0);
        s.destroy();
        drop(s);
        let mut released = 0;
        for _ in 0..5000 {
            released += nsq_storage::take_stores_released();
            if released > 0 {
                break;
            }
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(released, 1);
        assert!(!path.exists());
    });
}

#[test]
fn a_directory_in_place_of_the_open_segment_is_set_aside_and_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-dir");
    write_store(&path, 600, 4096, false);
    let segs = files_with(&path, ".seg");
    let newest = segs.last().unwrap().clone();
    let base: u64 = newest
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    std::fs::remove_file(&newest).unwrap();
    std::fs::create_dir(&newest).unwrap();
    // An index name taken by a directory too.
    let idx = segs[0].with_extension("idx");
    let _ = std::fs::remove_file(&idx);
    std::fs::create_dir(&idx).unwrap();
    let p = path.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    run(move || async move {
        let r = TopicStore::open(p, cfg(4096, 1), 10).await.unwrap();
        let s = r.store;
        let next = r.next_seq.max(base);
        for i in next..next + 50 {
            s.append(&rec(i));
        }
        s.wait_durable(next + 50).await.unwrap();
        assert!(s.error().is_none(), "{:?}", s.error());
        let seqs = read_seqs(&s, 0, 100_000).await;
        s.close().await;
        tx.send((next, seqs)).unwrap();
    });
    let (next, seqs) = rx.recv().unwrap();
    let want: Vec<u64> = (0..base).chain(next..next + 50).collect();
    assert_eq!(seqs, want);
    assert!(path
        .join(format!(
            "{}.notafile",
            newest.file_name().unwrap().to_str().unwrap()
        ))
        .is_dir());
    // Writes after the restart are read back after another one.
    assert_eq!(read_all(&path), want);
}

/// A segment whose header write failed (a FUSE server's EIO) is left empty in the topic
/// directory; the next try creates it again, on both segment I/O paths. On the
/// blocking-thread path the file was opened with O_EXCL: every later write failed with
/// `File exists (os error 17)` until a restart (a write EIO of 0.3 s is enough).
#[test]
fn a_leftover_empty_segment_is_created_again() {
    for io in [
        nsq_storage::SegmentIo::Ring,
        nsq_storage::SegmentIo::Threads,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-leftover");
        run(move || async move {
            std::fs::create_dir_all(&path).unwrap();
            std::fs::write(path.join(format!("{:020}.seg", 0)), b"").unwrap();
            let cfg = StoreConfig {
                io,
                ..cfg(1 << 20, 1)
            };
            let s = TopicStore::create(path.clone(), cfg, 0).unwrap();
            for seq in 0..3 {
                s.append(&rec(seq));
            }
            s.wait_durable(3)
                .await
                .unwrap_or_else(|e| panic!("{io:?}: {e}"));
            assert_eq!(read_seqs(&s, 0, 10).await, [0, 1, 2], "{io:?}");
            assert!(s.error().is_none(), "{io:?}: {:?}", s.error());
            s.close().await;
        });
    }
}

/// Ten channels reading the same backlog from disk, each in its own batches and at its
/// own position, share the reads: each 1 MiB block of the log is read from the disk
/// about once, not once per channel, and every
/// channel gets every record intact, across segment and block boundaries.
#[test]
fn channels_reading_the_same_region_share_the_disk_reads() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t-shared");
    run(move || async move {
        let s = TopicStore::open(p, cfg(3 << 20, 1 << 20), 0)
            .await
            .unwrap()
            .store;
        // 8 MiB of 3,000-byte bodies in segments of 3 MiB (records cross blocks).
        let n = 2800u64;
        let body = |i: u64| Bytes::from(format!("{i:08}-{}", "b".repeat(2991)));
        for i in 0..n {
            s.append(&StoredRecord {
                body: body(i),
                ..rec(i)
            });
        }
        s.wait_durable(n).await.unwrap();
        let mut pos: Vec<(u64, Option<nsq_storage::ReadPos>)> = vec![(0, None); 10];
        let mut rounds = 0;
        // Round-robin, channel c reading c + 1 records more per batch than channel 0, so
        // the channels drift apart (by at most a few blocks here).
        while pos.iter().any(|(next, _)| *next < n) {
            rounds += 1;
            for (c, (next, hint)) in pos.iter_mut().enumerate() {
                if *next >= n {
                    continue;
                }
                let (recs, end) = s
                    .read_at(*next, 100 + c * 7, usize::MAX, *hint)
                    .await
                    .unwrap();
                for r in &recs {
                    assert_eq!(r.seq, *next, "channel {c}: in order, none missing");
                    assert_eq!(r.body, body(r.seq), "channel {c}: intact");
                    *next += 1;
                }
                *hint = end;
            }
        }
        let (disk, shared) = s.block_reads();
        let blocks = (n * 3021).div_ceil(1 << 20);
        assert!(rounds > 1);
        assert!(
            disk <= blocks + 6,
            "{disk} blocks read from the disk for a log of about {blocks} ({shared} shared)"
        );
        assert!(shared >= 8 * blocks, "{shared} block reads shared");
        s.close().await;
    });
}

/// Records waiting to be written that every channel finished are dropped from the
/// pending buffer, never written: the log then holds only the later ones, and the
/// sequences of the dropped ones are gaps.
#[test]
fn finished_records_waiting_to_be_written_are_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t-forget");
    run(move || async move {
        let s = TopicStore::open(p, cfg(1 << 20, 1 << 20), 0)
            .await
            .unwrap()
            .store;
        for i in 0..10 {
            s.append(&rec(i));
        }
        // Before the writer task ran (no await since the appends).
        assert_eq!(s.forget_unwritten_below(6), 6);
        assert_eq!(s.forget_unwritten_below(6), 0);
        s.wait_durable(10).await.unwrap();
        assert_eq!(read_seqs(&s, 0, 100).await, vec![6, 7, 8, 9]);
        s.close().await;
    });
}

#[test]
fn a_publisher_waiting_for_records_finished_before_their_write_is_released() {
    // `--sync-every=1`: a publisher waits until its records are synced; the checkpoint
    // may drop them first when every channel finished them (they need no write). The
    // wait must end then too, with a segment open (one write made it) and nothing left
    // to write: the writer had synced up to the last record it wrote and looped on syncs
    // that released nothing, never letting the shard's other tasks run.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t-forget-tail");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        run(move || async move {
            let s = filled(p, cfg(1 << 20, 1), 0, 10).await;
            for i in 10..20 {
                s.append(&rec(i));
            }
            // Before the writer task ran (no await since the appends).
            assert_eq!(s.forget_unwritten_below(20), 10);
            s.wait_durable(20).await.unwrap();
            assert_eq!(read_seqs(&s, 0, 100).await, (0..10).collect::<Vec<_>>());
            s.close().await;
            done_tx.send(()).unwrap();
        });
    });
    done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the publisher's wait for records every channel finished never ended");
}
