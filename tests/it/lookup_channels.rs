//! A new topic first creates the channels nsqlookupd knows for it (nsqd: GetTopic with
//! GetLookupdTopicChannels), so that a message published right after the topic appears
//! reaches every channel that exists elsewhere in the cluster:
//!
//! * the real `nsqlookupd` of this repository knows channels `c1`, `c2` and `c3#ephemeral`
//!   of topics no broker has (registered over its HTTP `/channel/create`, as another node's
//!   registration would); the broker, once registered with it, publishes to each topic
//!   over HTTP and every topic shows `c1` and `c2` (not the #ephemeral one) with the
//!   message in each, with 1, 2 and 4 shards (topics on every shard);
//! * a lookupd whose HTTP API hangs neither blocks nor loses the publish: the topic waits
//!   at most `--http-client-request-timeout` (a channel created meanwhile gets nothing
//!   until then), then starts without channels and its backlog goes to the first channel
//!   created;
//! * a lookupd whose HTTP API is down: the other lookupd's channels are still created;
//! * a SUB that creates the topic: its channel and lookupd's share the first message.

use crate::common;

use common::{for_each_shards, sized, topic_names, wait_for, Broker, Lookupd, SHARD_COUNTS};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A lookupd TCP endpoint that answers IDENTIFY with `http_port` (and broadcast address
/// 127.0.0.1) and everything else with OK.
fn fake_lookupd_tcp(http_port: u16) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let reply = format!(
        r#"{{"broadcast_address":"127.0.0.1","hostname":"fake","http_port":{http_port},"tcp_port":{},"version":"1.3.0"}}"#,
        addr.port()
    );
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let reply = reply.clone();
            std::thread::spawn(move || serve_v1(s, reply.as_bytes()));
        }
    });
    addr
}

fn serve_v1(s: TcpStream, identify_reply: &[u8]) {
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    let mut magic = [0u8; 4];
    if r.read_exact(&mut magic).is_err() {
        return;
    }
    loop {
        let mut line = Vec::new();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let reply = if line == b"IDENTIFY\n" {
            let mut len = [0u8; 4];
            if r.read_exact(&mut len).is_err() {
                return;
            }
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            identify_reply
        } else {
            b"OK"
        };
        if w.write_all(&sized(reply)).is_err() {
            return;
        }
    }
}

/// An HTTP port that accepts connections and never answers; also returns how many
/// requests reached it.
fn hanging_http() -> (u16, Arc<Mutex<Vec<TcpStream>>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let h2 = held.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            h2.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        }
    });
    (port, held)
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Waits until the broker logged that it knows the HTTP address of `n` lookupd peers
/// (IDENTIFY answered).
fn wait_identified(b: &Broker, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = b
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|l| l.contains("): peer info "))
            .count();
        if seen >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "broker did not IDENTIFY with lookupd: {:?}",
            b.log.lock().unwrap_or_else(|e| e.into_inner())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (topic depth, [(channel, depth)]) of `topic` in /stats, if it exists.
fn topic_stats(b: &Broker, topic: &str) -> Option<(u64, Vec<(String, u64)>)> {
    let st = b.stats();
    let t = st["topics"]
        .as_array()?
        .iter()
        .find(|t| t["topic_name"] == topic)?
        .clone();
    let chans = t["channels"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    (
                        c["channel_name"].as_str().unwrap_or("").to_string(),
                        c["depth"].as_u64().unwrap_or(u64::MAX),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Some((t["depth"].as_u64().unwrap_or(u64::MAX), chans))
}

fn publish(b: &Broker, topic: &str, body: &[u8]) -> Duration {
    let start = Instant::now();
    let (code, resp) = b.http("POST", &format!("/pub?topic={topic}"), body);
    assert_eq!(
        (code, resp.as_slice()),
        (200, &b"OK"[..]),
        "pub {topic}: {}",
        String::from_utf8_lossy(&resp)
    );
    start.elapsed()
}

fn two_channels(depth: u64) -> Vec<(String, u64)> {
    vec![("c1".to_string(), depth), ("c2".to_string(), depth)]
}

#[test]
fn channels_known_to_lookupd_get_the_first_message() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let l = Lookupd::start(&["--broadcast-address=127.0.0.1"]);
        let topics = topic_names("lq", 8);
        for t in &topics {
            for c in ["c1", "c2", "c3%23ephemeral"] {
                let (code, v) =
                    l.request("POST", &format!("/channel/create?topic={t}&channel={c}"));
                assert_eq!(code, 200, "lookupd /channel/create: {v}");
            }
        }
        let b = Broker::start(shards, &[&format!("--lookupd-tcp-address={}", l.tcp)]);
        wait_identified(&b, 1);
        for t in &topics {
            publish(&b, t, b"first");
        }
        for t in &topics {
            // The channels exist before the pump moves: each has the message, the topic
            // keeps nothing.
            let mut got = None;
            let ok = common::wait_until(Duration::from_secs(10), || {
                got = topic_stats(&b, t);
                got == Some((0, two_channels(1)))
            });
            assert!(ok, "shards={shards} topic {t}: {got:?}");
        }
        // The broker registered them with lookupd as its own channels.
        let (code, v) = l.request("GET", &format!("/lookup?topic={}", topics[0]));
        assert_eq!(code, 200, "{v}");
        let producers = v["producers"].as_array().cloned().unwrap_or_default();
        assert!(
            producers
                .iter()
                .any(|p| p["tcp_port"] == b.tcp.port() as u64),
            "shards={shards}: {v}"
        );
        // Later publishes go to both channels as usual.
        publish(&b, &topics[0], b"second");
        let ok = common::wait_until(Duration::from_secs(10), || {
            topic_stats(&b, &topics[0]) == Some((0, two_channels(2)))
        });
        assert!(ok, "shards={shards}: {:?}", topic_stats(&b, &topics[0]));
    });
}

#[test]
fn hanging_lookupd_delays_the_pump_not_the_publish() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let (http_port, held) = hanging_http();
        let fake = fake_lookupd_tcp(http_port);
        let b = Broker::start(
            shards,
            &[
                &format!("--lookupd-tcp-address={fake}"),
                "--http-client-request-timeout=4s",
            ],
        );
        wait_identified(&b, 1);
        let topics = topic_names("lqh", 4);
        for t in &topics {
            let took = publish(&b, t, b"m");
            assert!(took < Duration::from_millis(3000), "pub {t} took {took:?}");
        }
        // The query hangs: the message waits in the topic (nothing pumped, no channel).
        for t in &topics {
            assert_eq!(topic_stats(&b, t), Some((1, vec![])), "shards={shards}");
        }
        // The query goes out from another task once the topic exists: wait for it.
        wait_for("the broker to ask the hanging lookupd", || {
            !held.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
        });
        // A channel created meanwhile waits too: the pump starts only when the query ends.
        let (code, _) = b.http(
            "POST",
            &format!("/channel/create?topic={}&channel=early", topics[0]),
            b"",
        );
        assert_eq!(code, 200);
        assert_eq!(
            topic_stats(&b, &topics[0]),
            Some((1, vec![("early".to_string(), 0)])),
            "shards={shards}: held until the lookupd query ends"
        );
        // After the request timeout the topics start without channels; the first channel
        // then gets the backlog, as for any topic without channels.
        let ok = common::wait_until(Duration::from_secs(10), || {
            b.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|l| {
                    l.contains("failed to query nsqlookupd for channels to pre-create for topic")
                })
                .count()
                >= topics.len()
        });
        assert!(ok, "no timeout logged: {:?}", b.log.lock().unwrap());
        let ok = common::wait_until(Duration::from_secs(5), || {
            topic_stats(&b, &topics[0]) == Some((0, vec![("early".to_string(), 1)]))
        });
        assert!(ok, "shards={shards}: {:?}", topic_stats(&b, &topics[0]));
        for t in &topics[1..] {
            let (code, _) = b.http("POST", &format!("/channel/create?topic={t}&channel=x"), b"");
            assert_eq!(code, 200);
            let ok = common::wait_until(Duration::from_secs(5), || {
                topic_stats(&b, t) == Some((0, vec![("x".to_string(), 1)]))
            });
            assert!(ok, "shards={shards} {t}: {:?}", topic_stats(&b, t));
        }
    });
}

#[test]
fn lookupd_http_down_is_skipped() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let l = Lookupd::start(&["--broadcast-address=127.0.0.1"]);
        let t = "lq_down";
        for c in ["c1", "c2"] {
            let (code, v) = l.request("POST", &format!("/channel/create?topic={t}&channel={c}"));
            assert_eq!(code, 200, "{v}");
        }
        let dead = fake_lookupd_tcp(closed_port());
        let b = Broker::start(
            shards,
            &[
                &format!("--lookupd-tcp-address={dead}"),
                &format!("--lookupd-tcp-address={}", l.tcp),
            ],
        );
        wait_identified(&b, 2);
        let took = publish(&b, t, b"m");
        assert!(took < Duration::from_millis(3000), "pub took {took:?}");
        let ok = common::wait_until(Duration::from_secs(10), || {
            topic_stats(&b, t) == Some((0, two_channels(1)))
        });
        assert!(ok, "shards={shards}: {:?}", topic_stats(&b, t));
        // Only lookupd's HTTP API is down; with it alone the topic starts without
        // channels at once.
        let b2 = Broker::start(shards, &[&format!("--lookupd-tcp-address={dead}")]);
        wait_identified(&b2, 1);
        publish(&b2, t, b"m");
        let ok = common::wait_until(Duration::from_secs(10), || {
            b2.log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|l| l.contains("failed to query nsqlookupd for channels to pre-create"))
        });
        assert!(ok, "{:?}", b2.log.lock().unwrap());
        assert_eq!(topic_stats(&b2, t), Some((1, vec![])));
    });
}

#[test]
fn subscriber_creating_the_topic_and_lookupd_channels_share_the_first_message() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let l = Lookupd::start(&["--broadcast-address=127.0.0.1"]);
        let topics = topic_names("lqs", 4);
        for t in &topics {
            let (code, v) = l.request("POST", &format!("/channel/create?topic={t}&channel=c1"));
            assert_eq!(code, 200, "{v}");
        }
        let b = Broker::start(shards, &[&format!("--lookupd-tcp-address={}", l.tcp)]);
        wait_identified(&b, 1);
        for t in &topics {
            // SUB creates the topic (on its owner, maybe another shard): its own channel
            // and lookupd's c1 both get the message published right after.
            let mut s = b.subscribe(t, "mine");
            common::send(&mut s, b"RDY 1\n");
            publish(&b, t, b"hello");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let m = common::read_msg(&mut s);
            assert_eq!(m.body, b"hello", "shards={shards} {t}");
            let ok = common::wait_until(Duration::from_secs(10), || {
                topic_stats(&b, t).is_some_and(|(d, cs)| {
                    d == 0 && cs.contains(&("c1".to_string(), 1)) && cs.len() == 2
                })
            });
            assert!(ok, "shards={shards} {t}: {:?}", topic_stats(&b, t));
        }
    });
}

/// A lookupd HTTP API that answers every request (the broker's `/channels?topic=`) with
/// channels `pre1` and `pre2`.
fn channels_http() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || {
                let Ok(mut w) = s.try_clone() else { return };
                let mut r = BufReader::new(s);
                loop {
                    let mut line = String::new();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" => break,
                        Ok(_) => {}
                    }
                }
                let body = br#"{"channels":["pre1","pre2"]}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = w.write_all(head.as_bytes());
                let _ = w.write_all(body);
            });
        }
    });
    port
}

/// Topic directories (`t-*`) under the broker's data path.
fn topic_dirs(b: &Broker) -> Vec<String> {
    std::fs::read_dir(b.data_dir.join("topics"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| n.starts_with("t-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn deleted_topics_leave_nothing_behind_with_lookupd_channels() {
    // Each new topic's lookupd answer creates channels and asks for a metadata write in
    // the background, which a topic delete right after may overtake: that write must
    // neither make the deleted topic's directory again (a restart brought the topic
    // back, deleted channels and all) nor fail (/ping answered 500 "metadata write ...
    // No such file or directory").
    let fake = fake_lookupd_tcp(channels_http());
    let mut b = Broker::start(2, &[&format!("--lookupd-tcp-address={fake}")]);
    // The broker knows the lookupd's HTTP address once a new topic gets its channels.
    let ok = common::wait_until(Duration::from_secs(20), || {
        let (code, _) = b.http("POST", "/topic/create?topic=probe", b"");
        code == 200
            && topic_stats(&b, "probe").is_some_and(|(_, cs)| {
                cs.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>() == ["pre1", "pre2"]
            })
            && b.http("POST", "/topic/delete?topic=probe", b"").0 == 200
    });
    assert!(
        ok,
        "lookupd channels never created: {:?}",
        topic_stats(&b, "probe")
    );
    let mut bad = Vec::new();
    for i in 0..300 {
        let t = format!("del{i}");
        for (m, p) in [
            ("POST", format!("/topic/create?topic={t}")),
            ("POST", format!("/channel/create?topic={t}&channel=c")),
            ("POST", format!("/topic/delete?topic={t}")),
        ] {
            let (code, resp) = b.http(m, &p, b"");
            assert_eq!(code, 200, "{p}: {}", String::from_utf8_lossy(&resp));
        }
        let (code, resp) = b.http("GET", "/ping", b"");
        if code != 200 {
            bad.push(String::from_utf8_lossy(&resp).into_owned());
        }
    }
    assert!(
        bad.is_empty(),
        "{} /ping failures: {:?}",
        bad.len(),
        &bad[..1]
    );
    // Writes in flight end soon; none may leave a directory behind.
    std::thread::sleep(Duration::from_millis(500));
    let (code, resp) = b.http("GET", "/ping", b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&resp));
    assert_eq!(b.stats()["topics"].as_array().map(|t| t.len()), Some(0));
    assert_eq!(
        topic_dirs(&b),
        Vec::<String>::new(),
        "deleted topics on disk"
    );
    b.terminate();
    let b2 = Broker::start_in(&b.data_dir, 2, &[]);
    let st = b2.stats();
    assert_eq!(st["topics"].as_array().map(|t| t.len()), Some(0), "{st}");
}
