//! Start-up without re-reading the backlog: sealed segments are
//! recovered from their side index, only the segment a crash left open is scanned, and a
//! corrupt record of a sealed segment is found, logged and skipped when a channel reads
//! it, not at start-up.

use crate::common;

use common::*;
use std::collections::BTreeSet;
use std::time::Duration;

fn body(i: u64) -> Vec<u8> {
    format!("fast-{i:06}-{}", "z".repeat(40)).into_bytes()
}

fn recovered_line(b: &Broker) -> String {
    b.wait_log_line("TOPIC(big): recovered", Duration::from_secs(10))
        .unwrap_or_default()
}

#[test]
fn sealed_segments_are_not_rescanned_and_corruption_is_found_when_read() {
    let dir = std::env::temp_dir().join(format!("nsqd-fast-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let args = [
        "--max-bytes-per-file=4096",
        "--sync-every=1",
        "--sync-timeout=100ms",
    ];
    let mut b = Broker::start_in(&dir, 1, &args);
    b.admin("/topic/create?topic=big");
    b.admin("/channel/create?topic=big&channel=c");
    let mut s = b.connect_v2();
    for i in 0..200 {
        send(&mut s, &pub_cmd("big", &body(i)));
        expect_ok(&mut s);
    }
    drop(s);
    // Let a checkpoint record the channel, then kill -9: rotated segments are sealed;
    // only the one being written is scanned.
    std::thread::sleep(Duration::from_millis(400));
    b.kill9();
    let mut b = Broker::start_in(&dir, 1, &args);
    let recovered = recovered_line(&b);
    assert!(
        recovered.contains(": 200 records on disk, 1 channels, 200 messages left to deliver"),
        "{recovered}"
    );
    assert!(
        recovered.contains(", 1 scanned"),
        "only the open segment is scanned: {recovered}"
    );
    assert_eq!(b.channel_stats("big", "c").unwrap()["depth"], 200);
    // Clean shutdown seals everything: nothing is scanned.
    assert_eq!(b.terminate().map(|s| s.success()), Some(true));
    let segs = segments(&dir.join("topics/t-big"));
    assert!(segs.len() >= 3, "several segments: {segs:?}");
    let mut first = std::fs::read(&segs[0]).unwrap();
    let offs = record_offsets(&first);
    first[offs[2] + 30] ^= 0xff;
    std::fs::write(&segs[0], &first).unwrap();

    let b = Broker::start_in(&dir, 1, &args);
    let recovered = recovered_line(&b);
    assert!(recovered.contains(", 0 scanned"), "{recovered}");
    assert_eq!(b.channel_stats("big", "c").unwrap()["depth"], 200);
    let log = b.log.lock().unwrap().join("\n");
    assert!(
        !log.contains("crc mismatch"),
        "not reported at start-up: {log}"
    );
    // A consumer reaches the corrupt record: it is logged and skipped, the rest arrives.
    let mut s = b.subscribe("big", "c");
    send(&mut s, &line("RDY 100"));
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut got = BTreeSet::new();
    while let Ok(raw) = read_raw_frame_skip_hb(&mut s) {
        let (_, _, id, msg) = parse_message(&raw[8..]);
        let text = String::from_utf8_lossy(&msg).into_owned();
        let i: u64 = text[5..11].parse().unwrap();
        assert_eq!(msg, body(i), "intact body");
        got.insert(i);
        send(&mut s, &line(&format!("FIN {id}")));
    }
    assert_eq!(got.len(), 199, "every other message delivered");
    assert!(!got.contains(&2));
    let log = b.log.lock().unwrap().join("\n");
    assert!(
        log.contains("crc mismatch") && log.contains("offset"),
        "logged with file and offset when read: {log}"
    );
    drop(s);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
