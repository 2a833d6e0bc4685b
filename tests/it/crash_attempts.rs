//! Attempts and requeue delays survive kill -9: with
//! `--sync-every=1`, a message delivered and REQ'd three times comes back after a crash
//! with attempts 4, not before its REQ delay, and a message finished after a redelivery
//! is not delivered again (also under the default sync policy: a process crash keeps what
//! reached the page cache). No metadata checkpoint runs between the REQs and the kill
//! (`--sync-timeout=60s`), so only the delivery journal can carry this state.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::time::{Duration, Instant};

const ARGS: [&str; 2] = ["--sync-every=1", "--sync-timeout=60s"];
/// The default sync policy: the journal is not synced before the kill, but a process
/// crash keeps what reached the page cache.
const DEFAULT_POLICY: [&str; 1] = ["--sync-timeout=60s"];

/// Waits until the delivery journal's files hold what the test did to channel `c` of
/// `topic`: a REQ with a delay (a pending message due later) and the FIN of a
/// redelivered message. What a kill -9 keeps is what reached the files: on io_uring
/// the event is written before the command's processing returns, on the blocking-thread
/// path (`NSQD_SEGMENT_IO=threads`) by the journal flusher a moment later, so the state
/// `/stats` shows can be ahead of the files for about one blocking write.
fn wait_journaled(data: &std::path::Path, topic: &str, channel: &str) {
    use nsq_storage::journal::{self, MessageState};
    let dir = nsq_storage::topic_dir(data, topic);
    let mut last = None;
    let ok = wait_until(Duration::from_secs(5), || {
        let folded = journal::fold(journal::read_blocking(&dir, 0));
        let states: Vec<MessageState> = folded
            .get(channel)
            .map(|c| c.states.values().cloned().collect())
            .unwrap_or_default();
        let delayed = states
            .iter()
            .any(|s| matches!(s, MessageState::Pending { due_unix_ns, .. } if *due_unix_ns != 0));
        let finished = states.iter().any(|s| matches!(s, MessageState::Finished));
        last = Some(states);
        delayed && finished
    });
    assert!(
        ok,
        "journal files never held the REQ delay and the FIN: {last:?}"
    );
}

#[test]
fn kill_9_keeps_attempts_and_requeue_delay() {
    for (shards, args) in [
        (1usize, &ARGS[..]),
        (2, &ARGS[..]),
        (1, &DEFAULT_POLICY[..]),
    ] {
        let policy = if args.len() == 2 {
            "sync-every=1"
        } else {
            "default"
        };
        let dir = std::env::temp_dir().join(format!(
            "nsqd-crash-attempts-{shards}-{policy}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The topic and channel exist in meta.json (a clean restart writes it).
        let mut b = Broker::start_in(&dir, shards, args);
        b.admin("/topic/create?topic=poison");
        b.admin("/channel/create?topic=poison&channel=c");
        b.tcp_pub("poison", b"message-a");
        b.tcp_pub("poison", b"message-b");
        assert_eq!(b.terminate().map(|s| s.success()), Some(true));

        let mut b = Broker::start_in(&dir, shards, args);
        let mut s = b.subscribe("poison", "c");
        send(&mut s, &line("RDY 1"));
        let mut req_at = None;
        for attempt in 1..=3u16 {
            let m = read_msg(&mut s);
            assert_eq!(
                (m.body.as_slice(), m.attempts),
                (&b"message-a"[..], attempt)
            );
            if attempt < 3 {
                send(&mut s, &line(&format!("REQ {} 0", m.id)));
            } else {
                send(&mut s, &line(&format!("REQ {} 3000", m.id)));
                req_at = Some(Instant::now());
            }
        }
        // b: requeued once, then finished on its second delivery.
        let m = read_msg(&mut s);
        assert_eq!((m.body.as_slice(), m.attempts), (&b"message-b"[..], 1));
        send(&mut s, &line(&format!("REQ {} 0", m.id)));
        let m = read_msg(&mut s);
        assert_eq!((m.body.as_slice(), m.attempts), (&b"message-b"[..], 2));
        send(&mut s, &line(&format!("FIN {}", m.id)));
        b.wait_channel_field("poison", "c", "in_flight_count", 0);
        b.wait_channel_field("poison", "c", "deferred_count", 1);
        wait_journaled(&dir, "poison", "c");
        b.kill9();
        drop(s);

        let b = Broker::start_in(&dir, shards, args);
        let ch = b.channel_stats("poison", "c").expect("channel recovered");
        assert_eq!(
            ch["deferred_count"], 1,
            "shards={shards} {policy}: REQ delay kept: {ch}"
        );
        assert_eq!(
            ch["depth"], 0,
            "shards={shards} {policy}: b is finished: {ch}"
        );
        let mut s = b.subscribe("poison", "c");
        send(&mut s, &line("RDY 10"));
        let m = read_msg(&mut s);
        let waited = req_at.unwrap().elapsed();
        assert_eq!(
            (m.body.as_slice(), m.attempts),
            (&b"message-a"[..], 4),
            "shards={shards} {policy}: attempts never go back"
        );
        assert!(
            waited >= Duration::from_millis(2900),
            "shards={shards} {policy}: delivered {waited:?} after a 3 s REQ"
        );
        send(&mut s, &line(&format!("FIN {}", m.id)));
        assert_no_frame(&mut s, Duration::from_millis(500));
        let log = b.log.lock().unwrap().join("\n");
        assert!(log.contains("journal events"), "{log}");
        drop(s);
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn kill_9_after_channel_empty_does_not_bring_requeued_messages_back() {
    let dir = std::env::temp_dir().join(format!("nsqd-crash-empty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut b = Broker::start_in(&dir, 1, &ARGS);
    b.admin("/topic/create?topic=emptied");
    b.admin("/channel/create?topic=emptied&channel=c");
    for i in 0..3 {
        b.tcp_pub("emptied", format!("m{i}").as_bytes());
    }
    assert_eq!(b.terminate().map(|s| s.success()), Some(true));
    // Every journal generation is covered by the clean shutdown's meta.json.
    let journals = |d: &std::path::Path| {
        std::fs::read_dir(d.join("topics/t-emptied"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("journal-"))
            .count()
    };
    assert_eq!(journals(&dir), 0);

    let mut b = Broker::start_in(&dir, 1, &ARGS);
    let mut s = b.subscribe("emptied", "c");
    send(&mut s, &line("RDY 3"));
    for _ in 0..3 {
        let m = read_msg(&mut s);
        send(&mut s, &line(&format!("REQ {} 10000", m.id)));
    }
    b.wait_channel_field("emptied", "c", "deferred_count", 3);
    b.admin("/channel/empty?topic=emptied&channel=c");
    b.wait_channel_field("emptied", "c", "deferred_count", 0);
    assert!(journals(&dir) > 0, "REQs are journaled");
    // REQs have no answer: time for the broker to read them (their events are in the
    // file once they are handled).
    std::thread::sleep(Duration::from_millis(100));
    b.kill9();
    drop(s);

    let b = Broker::start_in(&dir, 1, &ARGS);
    let ch = b.channel_stats("emptied", "c").expect("channel recovered");
    assert_eq!(
        (ch["depth"].as_i64(), ch["deferred_count"].as_i64()),
        (Some(0), Some(0)),
        "{ch}"
    );
    let mut s = b.subscribe("emptied", "c");
    send(&mut s, &line("RDY 10"));
    assert_no_frame(&mut s, Duration::from_millis(500));
    drop(s);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Consumes every message channel `c` of `topic` delivers (RDY 100), FINs each, until
/// none comes for 500 ms; returns the bodies and their attempts in delivery order.
fn drain_and_fin(b: &Broker, topic: &str) -> Vec<(String, u16)> {
    let mut s = b.subscribe(topic, "c");
    send(&mut s, &line("RDY 100"));
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut got = Vec::new();
    while let Ok((ft, data)) = read_frame_skip_hb(&mut s) {
        assert_eq!(ft, 2, "a message frame");
        let (_, attempts, id, body) = parse_message(&data);
        got.push((String::from_utf8(body).unwrap(), attempts));
        send(&mut s, &line(&format!("FIN {id}")));
    }
    b.wait_channel_field(topic, "c", "in_flight_count", 0);
    // FINs are not answered: time for the broker to read the last ones.
    std::thread::sleep(Duration::from_millis(100));
    got
}

/// A crash loop faster than the checkpoint (RELIABILITY.md, "Chaos: kill -9 under load"): kill -9, restart,
/// consume and FIN everything that came back, kill -9 again before the next checkpoint
/// (`--sync-timeout=60s`). What was finished after the first restart must not come back
/// after the second: those messages were recovered as possibly delivered (their
/// attempts, 1, cannot tell), so their FIN is journaled. Before, every restart delivered
/// the whole backlog since the last checkpoint again.
#[test]
fn kill_9_loop_faster_than_the_checkpoint_does_not_redeliver_what_was_finished() {
    const N: usize = 20;
    for (shards, args) in [
        (1usize, &ARGS[..]),
        (2, &ARGS[..]),
        (1, &DEFAULT_POLICY[..]),
    ] {
        let ctx = format!("shards={shards} {args:?}");
        let dir = std::env::temp_dir().join(format!(
            "nsqd-crash-loop-{shards}-{}-{}",
            args.len(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut b = Broker::start_in(&dir, shards, args);
        b.admin("/topic/create?topic=loop");
        b.admin("/channel/create?topic=loop&channel=c");
        assert_eq!(b.terminate().map(|s| s.success()), Some(true));

        // Run 1: published, written (older than the store delay), delivered once and
        // finished: not journaled, so the crash brings them back (at least once).
        let mut b = Broker::start_in(&dir, shards, args);
        for i in 0..N {
            b.tcp_pub("loop", format!("m{i:02}").as_bytes());
        }
        // Past the store's 100 ms delay: the records are written before they finish.
        std::thread::sleep(Duration::from_millis(300));
        let first = drain_and_fin(&b, "loop");
        assert_eq!(first.len(), N, "{ctx}: run 1 delivers each once: {first:?}");
        b.kill9();

        // Run 2: they come back with attempts 1 and are finished again; crash at once.
        let mut b = Broker::start_in(&dir, shards, args);
        let second = drain_and_fin(&b, "loop");
        assert!(second.len() <= N, "{ctx}: {second:?}");
        if args == &ARGS[..] {
            // Synced at publish: every one of them is on disk and comes back.
            assert_eq!(second.len(), N, "{ctx}: {second:?}");
        }
        assert!(second.iter().all(|(_, a)| *a == 1), "{ctx}: {second:?}");
        b.kill9();

        // Run 3: nothing finished in run 2 is delivered again.
        let b = Broker::start_in(&dir, shards, args);
        let ch = b.channel_stats("loop", "c").expect("channel recovered");
        assert_eq!(ch["depth"].as_i64(), Some(0), "{ctx}: {ch}");
        let third = drain_and_fin(&b, "loop");
        assert!(third.is_empty(), "{ctx}: delivered again: {third:?}");
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A message published with a defer time goes to the channel's deferred heap at once and
/// the cursor steps over its record later; when it is finished before the cursor gets
/// there, the channel's state must say so. It did not: the metadata held only the cursor
/// and the unfinished messages, so after a clean shutdown, or a kill -9 after a
/// checkpoint, the cursor reached the record again and delivered the finished message a
/// second time, with attempts 1. Here the consumer holds `m1`, so the cursor stops just
/// below the finished deferred message `d2`.
#[test]
fn deferred_message_finished_ahead_of_the_cursor_is_not_delivered_again() {
    for (shards, kill) in [(1usize, false), (2, false), (1, true), (2, true)] {
        let ctx = format!("shards={shards} kill9={kill}");
        let dir = std::env::temp_dir().join(format!(
            "nsqd-crash-ahead-{shards}-{kill}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        b.admin("/topic/create?topic=ahead");
        b.admin("/channel/create?topic=ahead&channel=c");
        b.tcp_pub("ahead", b"m0");
        b.tcp_pub("ahead", b"m1");
        let mut s = b.subscribe("ahead", "c");
        send(&mut s, &line("RDY 1"));
        let m0 = read_msg(&mut s);
        assert_eq!((m0.body.as_slice(), m0.attempts), (&b"m0"[..], 1), "{ctx}");
        // Deferred at publish, ahead of the cursor (which is at m1).
        let mut p = b.connect_v2();
        send(&mut p, &dpub_cmd("ahead", 200, b"d2"));
        expect_ok(&mut p);
        // Due: it is ready again (depth m1 + d2) and goes before the cursor's next record.
        b.wait_channel_field("ahead", "c", "depth", 2);
        send(&mut s, &line(&format!("FIN {}", m0.id)));
        let d2 = read_msg(&mut s);
        assert_eq!((d2.body.as_slice(), d2.attempts), (&b"d2"[..], 1), "{ctx}");
        send(&mut s, &line(&format!("FIN {}", d2.id)));
        // m1 comes once d2's FIN is done; it is held (in flight) across the restart.
        let m1 = read_msg(&mut s);
        assert_eq!((m1.body.as_slice(), m1.attempts), (&b"m1"[..], 1), "{ctx}");
        if kill {
            // A checkpoint after the FIN (a pause is answered once meta.json says so),
            // then kill -9: what the checkpoint knew holds.
            b.admin("/channel/pause?topic=ahead&channel=c");
            b.admin("/channel/unpause?topic=ahead&channel=c");
            b.kill9();
        } else {
            assert_eq!(b.terminate().map(|s| s.success()), Some(true), "{ctx}");
        }
        drop(s);
        drop(p);

        let b = Broker::start_in(&dir, shards, &ARGS);
        let ch = b.channel_stats("ahead", "c").expect("channel recovered");
        assert_eq!(
            ch["depth"].as_i64(),
            Some(1),
            "{ctx}: only m1 is left: {ch}"
        );
        let mut s = b.subscribe("ahead", "c");
        send(&mut s, &line("RDY 10"));
        let m = read_msg(&mut s);
        assert_eq!((m.body.as_slice(), m.attempts), (&b"m1"[..], 2), "{ctx}");
        send(&mut s, &line(&format!("FIN {}", m.id)));
        assert_no_frame(&mut s, Duration::from_millis(500));
        drop(s);
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
