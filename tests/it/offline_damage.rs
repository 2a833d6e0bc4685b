//! Damage to a stopped broker's data path, as an operator's bad day makes it: what is
//! not damaged is still delivered (RELIABILITY.md, "Offline damage"). The segment-level cases
//! (zeroed ranges, flipped headers, swapped or copied segments) are in
//! storage/tests/store.rs; these go through the broker.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::time::Duration;

const ARGS: [&str; 2] = ["--sync-every=1", "--sync-timeout=60s"];

fn drain(b: &Broker, topic: &str) -> Vec<String> {
    let mut s = b.subscribe(topic, "c");
    send(&mut s, &line("RDY 100"));
    s.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    let mut got = Vec::new();
    while let Ok((ft, data)) = read_frame_skip_hb(&mut s) {
        assert_eq!(ft, 2, "a message frame");
        let (_, _, id, body) = parse_message(&data);
        got.push(String::from_utf8(body).unwrap());
        send(&mut s, &line(&format!("FIN {id}")));
    }
    got
}

/// A channel cursor in `meta.json` past the topic's end cannot have been written by the
/// broker: clamped to the end it would count every stored message as consumed and
/// delete it. The channel starts at its oldest message instead (at least once), and the
/// damage is logged.
#[test]
fn a_cursor_past_the_end_delivers_the_backlog_again_rather_than_dropping_it() {
    for_each_shards(&[1, 2], |shards| {
        let dir = std::env::temp_dir().join(format!(
            "nsqd-damage-cursor-{shards}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        b.admin("/topic/create?topic=dmg");
        b.admin("/channel/create?topic=dmg&channel=c");
        let want: Vec<String> = (0..50).map(|i| format!("m{i:02}")).collect();
        for m in &want {
            b.tcp_pub("dmg", m.as_bytes());
        }
        assert_eq!(b.terminate().map(|s| s.success()), Some(true));
        let meta = dir.join("topics/t-dmg/meta.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
        v["channels"][0]["cursor"] = serde_json::json!(1_000_000_000_000u64);
        std::fs::write(&meta, serde_json::to_vec(&v).unwrap()).unwrap();

        let mut b = Broker::start_in(&dir, shards, &ARGS);
        let ch = b.channel_stats("dmg", "c").expect("channel recovered");
        assert_eq!(ch["depth"], 50, "shards={shards}: {ch}");
        let mut got = drain(&b, "dmg");
        got.sort();
        assert_eq!(got, want, "shards={shards}");
        let log = b.log.lock().unwrap().join("\n");
        assert!(
            log.contains("metadata cursor 1000000000000 is past the topic's end (50)"),
            "{log}"
        );
        b.terminate();
        let _ = std::fs::remove_dir_all(&dir);
    });
}
