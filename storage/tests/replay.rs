//! Replay helpers of the segment store: `seek_timestamp` (first record at or after a
//! publish time, by binary search over the sparse index of every segment) and
//! `segment_list`, on a real glommio executor and real DMA files.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use bytes::Bytes;
use nsq_storage::{StoreConfig, StoredRecord, TopicStore};
use std::time::Duration;

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move { f().await })
        .unwrap()
        .join()
        .unwrap();
}

/// Record `seq` published at 1_000_000 + 10 * (seq / 3) ns: three records per time.
/// The store settings of these tests: segments of `max_bytes_per_file`, a sync every
/// 100 records or 50 ms, io_uring segment I/O.
fn cfg(max_bytes_per_file: u64) -> StoreConfig {
    StoreConfig {
        max_bytes_per_file,
        sync_every: 100,
        sync_timeout: Duration::from_millis(50),
        io: nsq_storage::SegmentIo::Ring,
    }
}

fn rec(seq: u64) -> StoredRecord {
    StoredRecord {
        seq,
        timestamp: ts_of(seq),
        defer_until: 0,
        id: seq,
        attempts: 0,
        body: Bytes::from(format!("m-{seq}-{}", "y".repeat((seq % 40) as usize))),
    }
}

fn ts_of(seq: u64) -> i64 {
    1_000_000 + 10 * (seq / 3) as i64
}

#[test]
fn seek_timestamp_finds_the_first_record_at_or_after() {
    for size in [4096u64, 1 << 20] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-seek");
        run(move || async move {
            let cfg = cfg(size);
            let s = TopicStore::open(path.clone(), cfg, 0).await.unwrap().store;
            assert_eq!(s.seek_timestamp(0).await.unwrap(), None, "empty store");
            let n = 3000u64;
            for i in 0..n {
                s.append(&rec(i));
                if i % 100 == 0 {
                    glommio::yield_if_needed().await;
                }
            }
            s.wait_durable(n).await.unwrap();
            assert_eq!(s.seek_timestamp(i64::MIN).await.unwrap(), Some(0));
            assert_eq!(s.seek_timestamp(ts_of(0)).await.unwrap(), Some(0));
            for seq in [1u64, 3, 255, 256, 257, 1000, 1500, 2997, 2999] {
                let first = seq - seq % 3;
                // Exactly a record's time: the first record of that time.
                assert_eq!(s.seek_timestamp(ts_of(seq)).await.unwrap(), Some(first));
                // Just after the previous time: the same record.
                assert_eq!(
                    s.seek_timestamp(ts_of(seq) - 9).await.unwrap(),
                    Some(first),
                    "seq {seq}"
                );
            }
            assert_eq!(s.seek_timestamp(ts_of(n - 1) + 1).await.unwrap(), None);

            let list = s.segment_list().await;
            assert_eq!(list.len(), s.segment_count());
            assert_eq!(s.first_seq(), Some(0));
            assert_eq!(list[0].base, 0);
            for w in list.windows(2) {
                assert_eq!(w[0].end_seq, w[1].base, "contiguous");
                assert!(w[0].bytes > 0);
            }
            assert_eq!(list.last().unwrap().end_seq, n);
            if size == 4096 {
                assert!(list.len() > 5);
                // After retention deleted the oldest segments, the search starts at the
                // oldest one left.
                let cut = list[2].end_seq;
                s.delete_before(cut).await;
                assert_eq!(s.first_seq(), Some(cut));
                assert_eq!(s.seek_timestamp(0).await.unwrap(), Some(cut));
                assert_eq!(
                    s.seek_timestamp(ts_of(cut + 100)).await.unwrap(),
                    Some(cut + 100 - (cut + 100) % 3)
                );
            }
            s.close().await;
        });
    }
}

/// `find_id`: records with increasing IDs (with gaps, as a guid generator makes them)
/// are found by ID across segments; IDs between, before, after or deleted are not.
/// A record acknowledged and still waiting in the pending buffer (appended, the writer
/// not yet run) is found by its ID, body and all.
#[test]
fn find_id_finds_records_not_yet_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-pending");
    run(move || async move {
        let cfg = cfg(1 << 20);
        let s = TopicStore::open(path.clone(), cfg, 0).await.unwrap().store;
        for i in 0..5u64 {
            s.append(&StoredRecord {
                id: 500 + i,
                ..rec(i)
            });
        }
        // No await since the appends: the writer task has not taken them.
        assert!(s.pending_bytes() > 0, "still pending");
        let r = s
            .find_id(503)
            .await
            .unwrap()
            .expect("found in the pending buffer");
        assert_eq!((r.seq, r.id, r.body.clone()), (3, 503, rec(3).body));
        assert_eq!(s.find_id(505).await.unwrap(), None);
        s.close().await;
    });
}

#[test]
fn find_id_finds_records_by_increasing_id() {
    for size in [4096u64, 1 << 20] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-find");
        run(move || async move {
            let cfg = cfg(size);
            let s = TopicStore::open(path.clone(), cfg, 0).await.unwrap().store;
            let id_of = |seq: u64| 1_000 + 7 * seq;
            assert_eq!(s.find_id(id_of(0)).await.unwrap(), None, "empty store");
            let n = 3000u64;
            for i in 0..n {
                s.append(&StoredRecord {
                    id: id_of(i),
                    ..rec(i)
                });
                if i % 100 == 0 {
                    glommio::yield_if_needed().await;
                }
            }
            s.wait_durable(n).await.unwrap();
            for seq in [0u64, 1, 255, 256, 257, 1000, 1500, 2998, 2999] {
                let r = s.find_id(id_of(seq)).await.unwrap().expect("found");
                assert_eq!((r.seq, r.body.clone()), (seq, rec(seq).body));
                assert_eq!(s.find_id(id_of(seq) + 1).await.unwrap(), None);
            }
            assert_eq!(s.find_id(0).await.unwrap(), None, "before the first");
            assert_eq!(s.find_id(id_of(n)).await.unwrap(), None, "after the last");
            if size == 4096 {
                let list = s.segment_list().await;
                let cut = list[2].end_seq;
                s.delete_before(cut).await;
                assert_eq!(s.find_id(id_of(cut - 1)).await.unwrap(), None, "deleted");
                let r = s.find_id(id_of(cut)).await.unwrap().expect("kept");
                assert_eq!(r.seq, cut);
            }
            s.close().await;
        });
    }
}
