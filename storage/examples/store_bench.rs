//! The segment store alone, without sockets: how fast the writer streams records to disk
//! and how fast a sequential reader reads them back, to set beside the device's O_DIRECT
//! sequential write speed (`dd oflag=direct`), as `scripts/storage-bench.sh` does.
//!
//! Usage: `store_bench DIR [MIB=2048] [RECORD_BODY_BYTES=4096]`. Prints one JSON line:
//! `{"write_mib_s":..,"read_mib_s":..,"records":..,"body":..}` (MiB of record bytes).

use bytes::Bytes;
use nsq_storage::{StoreConfig, StoredRecord, TopicStore};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: store_bench DIR [MIB] [BODY]");
        std::process::exit(2);
    };
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2048);
    let body_len: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let dir = std::path::PathBuf::from(dir).join("t-store-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move {
            let cfg = StoreConfig {
                max_bytes_per_file: 100 << 20,
                sync_every: 2500,
                sync_timeout: Duration::from_secs(2),
                io: nsq_storage::SegmentIo::choose(&dir, std::env::var("NSQD_SEGMENT_IO").ok().as_deref())
                    .map(|(io, _)| io)
                    .unwrap_or_default(),
            };
            let store = match TopicStore::create(dir.clone(), cfg.clone(), 0) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("store: {e}");
                    std::process::exit(1);
                }
            };
            let body = Bytes::from(vec![b'x'; body_len]);
            let rec_len = (nsq_storage::record::RECORD_OVERHEAD + body_len) as u64;
            let n = (mib << 20) / rec_len;
            let t0 = Instant::now();
            for seq in 0..n {
                store.append(&StoredRecord {
                    seq,
                    timestamp: 0,
                    defer_until: 0,
                    id: seq,
                    attempts: 0,
                    body: body.clone(),
                });
                if seq % 256 == 0 {
                    store.wait_pending_below(32 << 20).await;
                }
            }
            store.close().await;
            let write_s = t0.elapsed().as_secs_f64();
            let recovered = match TopicStore::open(dir.clone(), cfg, 0).await {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("reopen: {e}");
                    std::process::exit(1);
                }
            };
            let t1 = Instant::now();
            let (mut from, mut hint, mut got) = (0u64, None, 0u64);
            loop {
                match recovered.store.read_at(from, 8192, 2 << 20, hint).await {
                    Ok((recs, pos)) if !recs.is_empty() => {
                        got += recs.len() as u64;
                        from = recs.last().map(|r| r.seq + 1).unwrap_or(from);
                        hint = pos;
                    }
                    Ok(_) => break,
                    Err(e) => {
                        eprintln!("read: {e}");
                        std::process::exit(1);
                    }
                }
            }
            let read_s = t1.elapsed().as_secs_f64();
            recovered.store.close().await;
            let total = (n * rec_len) as f64 / (1 << 20) as f64;
            println!(
                "{{\"write_mib_s\":{:.0},\"read_mib_s\":{:.0},\"records\":{n},\"read\":{got},\"body\":{body_len}}}",
                total / write_s,
                total / read_s
            );
            let _ = std::fs::remove_dir_all(&dir);
        })
        .expect("executor");
    let _ = ex.join();
}
