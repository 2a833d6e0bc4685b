//! What nsqd sends nsqlookupd (nsqd: lookup.go, lookup_peer.go), checked two ways:
//!
//! * a raw TCP listener plays lookupd and checks byte for byte the magic, IDENTIFY,
//!   REGISTER / UNREGISTER and PING, with 1, 2 and 4 shards (events of every shard
//!   reach lookupd through shard 0), the re-registration after a dropped connection and
//!   the redial backoff;
//! * the real `nsqlookupd` of this repository: topics and channels show up in /lookup
//!   and /channels, deleting a channel unregisters it, registration survives a lookupd
//!   restart, and `PUT /config/nsqlookupd_tcp_addresses` switches peers.
//!
//! The ping interval is shortened with the hidden `--lookupd-ping-interval` flag.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::{eventually, sized, Broker, Lookupd};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PING: &str = "--lookupd-ping-interval=300ms";

// ---------------------------------------------------------------------------------------
// A fake lookupd: records every unit nsqd sends, per connection, and answers like
// nsqlookupd (`[int32 size][data]`).
// ---------------------------------------------------------------------------------------

/// (connection number, raw bytes of one unit: the magic, a whole IDENTIFY with its body,
/// or one command line).
type Unit = (usize, Vec<u8>);

struct FakeLookupd {
    addr: SocketAddr,
    rx: Receiver<Unit>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

const IDENTIFY_REPLY: &[u8] = br#"{"broadcast_address":"fake","hostname":"fake","http_port":4161,"tcp_port":4160,"version":"1.3.0"}"#;

fn serve_fake(id: usize, s: TcpStream, tx: Sender<Unit>) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut magic = [0u8; 4];
    if r.read_exact(&mut magic).is_err() {
        return;
    }
    let _ = tx.send((id, magic.to_vec()));
    loop {
        let mut line = Vec::new();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line == b"IDENTIFY\n" {
            let mut len = [0u8; 4];
            if r.read_exact(&mut len).is_err() {
                return;
            }
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            line.extend_from_slice(&len);
            line.extend_from_slice(&body);
            let _ = tx.send((id, line));
            let _ = w.write_all(&sized(IDENTIFY_REPLY));
        } else {
            let _ = tx.send((id, line));
            let _ = w.write_all(&sized(b"OK"));
        }
    }
}

impl FakeLookupd {
    fn start() -> FakeLookupd {
        Self::on(TcpListener::bind("127.0.0.1:0").unwrap())
    }

    fn on(l: TcpListener) -> FakeLookupd {
        let addr = l.local_addr().unwrap();
        let (tx, rx) = channel();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let conns2 = conns.clone();
        std::thread::spawn(move || {
            for (id, s) in l.incoming().enumerate() {
                let Ok(s) = s else { return };
                conns2.lock().unwrap().push(s.try_clone().unwrap());
                let tx = tx.clone();
                std::thread::spawn(move || serve_fake(id, s, tx));
            }
        });
        FakeLookupd { addr, rx, conns }
    }

    /// The next unit that is not a PING (PINGs are counted).
    fn next(&self, pings: &mut usize) -> Unit {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let u = self
                .rx
                .recv_timeout(left)
                .expect("nothing more from nsqd within 10 s");
            if u.1 == b"PING\n" {
                *pings += 1;
                continue;
            }
            return u;
        }
    }

    /// Asserts the next non-PING unit is exactly `want`; returns its connection.
    fn expect(&self, pings: &mut usize, want: &[u8]) -> usize {
        let (id, got) = self.next(pings);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want),
            "unit from nsqd differs"
        );
        id
    }

    /// Closes every connection (lookupd going away).
    fn drop_connections(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The exact IDENTIFY nsqd sends: Go marshals a map, so the keys are sorted.
fn identify_bytes(b: &Broker, broadcast: &str) -> Vec<u8> {
    let (_, info) = b.http("GET", "/info", b"");
    let info: serde_json::Value = serde_json::from_slice(&info).unwrap();
    let body = format!(
        r#"{{"broadcast_address":"{broadcast}","hostname":"{}","http_port":{},"tcp_port":{},"version":"1.3.0"}}"#,
        info["hostname"].as_str().unwrap(),
        b.http.port(),
        b.tcp.port()
    );
    let mut v = b"IDENTIFY\n".to_vec();
    v.extend(sized(body.as_bytes()));
    v
}

fn fake_lookupd_sees_exact_bytes(shards: usize) {
    let fake = FakeLookupd::start();
    let b = Broker::start(
        shards,
        &[
            &format!("--lookupd-tcp-address={}", fake.addr),
            "--broadcast-address=bcast.example",
            PING,
        ],
    );
    let mut pings = 0;
    let conn = fake.expect(&mut pings, b"  V1");
    assert_eq!(
        fake.expect(&mut pings, &identify_bytes(&b, "bcast.example")),
        conn
    );
    // Topics spread over every shard; each event is awaited before the next request,
    // since events of different shards may reach shard 0 in any order.
    for i in 0..8 {
        let t = format!("reg-{i}");
        b.post_ok(&format!("/topic/create?topic={t}"));
        fake.expect(&mut pings, format!("REGISTER {t}\n").as_bytes());
        b.post_ok(&format!("/channel/create?topic={t}&channel=ch"));
        fake.expect(&mut pings, format!("REGISTER {t} ch\n").as_bytes());
        b.post_ok(&format!("/channel/create?topic={t}&channel=e%23ephemeral"));
        fake.expect(&mut pings, format!("REGISTER {t} e#ephemeral\n").as_bytes());
        b.post_ok(&format!("/channel/delete?topic={t}&channel=ch"));
        fake.expect(&mut pings, format!("UNREGISTER {t} ch\n").as_bytes());
        if i % 2 == 0 {
            // Deleting a topic unregisters it and each of its channels (nsqd sends
            // these from separate goroutines, so their order is not fixed).
            b.post_ok(&format!("/topic/delete?topic={t}"));
            let got: BTreeSet<Vec<u8>> = (0..2).map(|_| fake.next(&mut pings).1).collect();
            let want: BTreeSet<Vec<u8>> = [
                format!("UNREGISTER {t}\n").into_bytes(),
                format!("UNREGISTER {t} e#ephemeral\n").into_bytes(),
            ]
            .into();
            assert_eq!(got, want);
        }
    }
    // Publishing creates a topic too.
    let (code, _) = b.http("POST", "/pub?topic=by-pub", b"x");
    assert_eq!(code, 200);
    fake.expect(&mut pings, b"REGISTER by-pub\n");
    // PINGs keep coming (every 300 ms here, 15 s by default).
    let deadline = Instant::now() + Duration::from_secs(5);
    while pings < 2 && Instant::now() < deadline {
        if let Ok(u) = fake.rx.recv_timeout(Duration::from_millis(100)) {
            assert_eq!(
                u.1,
                b"PING\n",
                "unexpected {}",
                String::from_utf8_lossy(&u.1)
            );
            pings += 1;
        }
    }
    assert!(pings >= 2, "no PINGs");
    assert!(
        fake.conns.lock().unwrap().len() == 1,
        "nsqd reconnected needlessly"
    );
}

#[test]
fn registration_bytes_1_shard() {
    fake_lookupd_sees_exact_bytes(1);
}

#[test]
fn registration_bytes_2_shards() {
    fake_lookupd_sees_exact_bytes(2);
}

#[test]
fn registration_bytes_4_shards() {
    fake_lookupd_sees_exact_bytes(4);
}

/// A dropped lookupd connection is noticed at the next PING; nsqd reconnects at once and
/// sends the magic, IDENTIFY and a REGISTER for everything it holds (`REGISTER t` for a
/// topic without channels, `REGISTER t c` per channel otherwise).
#[test]
fn reregisters_everything_after_reconnect() {
    let fake = FakeLookupd::start();
    let b = Broker::start(
        2,
        &[
            &format!("--lookupd-tcp-address={}", fake.addr),
            "--broadcast-address=bcast.example",
            PING,
        ],
    );
    let identify = identify_bytes(&b, "bcast.example");
    let mut pings = 0;
    fake.expect(&mut pings, b"  V1");
    fake.expect(&mut pings, &identify);
    b.post_ok("/topic/create?topic=solo");
    fake.expect(&mut pings, b"REGISTER solo\n");
    b.post_ok("/topic/create?topic=multi");
    fake.expect(&mut pings, b"REGISTER multi\n");
    for c in ["c1", "c2"] {
        b.post_ok(&format!("/channel/create?topic=multi&channel={c}"));
        fake.expect(&mut pings, format!("REGISTER multi {c}\n").as_bytes());
    }
    fake.drop_connections();
    let conn = fake.expect(&mut pings, b"  V1");
    assert_eq!(conn, 1, "a new connection");
    fake.expect(&mut pings, &identify);
    let got: BTreeSet<Vec<u8>> = (0..3).map(|_| fake.next(&mut pings).1).collect();
    let want: BTreeSet<Vec<u8>> = [
        b"REGISTER solo\n".to_vec(),
        b"REGISTER multi c1\n".to_vec(),
        b"REGISTER multi c2\n".to_vec(),
    ]
    .into();
    assert_eq!(got, want);
    // Nothing else but PINGs follows.
    let until = Instant::now() + Duration::from_millis(700);
    while let Ok(u) = fake
        .rx
        .recv_timeout(until.saturating_duration_since(Instant::now()))
    {
        assert_eq!(
            u.1,
            b"PING\n",
            "unexpected {}",
            String::from_utf8_lossy(&u.1)
        );
    }
}

/// An unreachable lookupd is redialled with a backoff (1 s, 2 s, ...), not on every
/// PING; once it is up, nsqd connects and registers what was created meanwhile.
#[test]
fn unreachable_lookupd_is_redialled_with_backoff() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let b = Broker::start(
        1,
        &[
            &format!("--lookupd-tcp-address={addr}"),
            "--broadcast-address=bcast.example",
            "--lookupd-ping-interval=100ms",
        ],
    );
    let dials = || {
        b.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("LOOKUP connecting to"))
            .count()
    };
    b.post_ok("/topic/create?topic=while-down");
    let before = dials();
    // 15 PING intervals of 100 ms.
    std::thread::sleep(Duration::from_millis(1500));
    let n = dials() - before;
    // Without a backoff there would be ~15 dials (one per PING); with it at most 2.
    assert!(
        dials() >= 1 && n <= 2,
        "{n} dials in 1.5 s with a 100 ms ping interval: no backoff?"
    );
    let fake = FakeLookupd::on(TcpListener::bind(addr).expect("rebind the lookupd port"));
    let mut pings = 0;
    fake.expect(&mut pings, b"  V1");
    fake.expect(&mut pings, &identify_bytes(&b, "bcast.example"));
    fake.expect(&mut pings, b"REGISTER while-down\n");
}

// ---------------------------------------------------------------------------------------
// The real nsqlookupd.
// ---------------------------------------------------------------------------------------

/// Whether lookupd lists this broker as a producer of `topic`.
fn lists_broker(l: &Lookupd, b: &Broker, topic: &str) -> bool {
    let (code, v) = l.get(&format!("/lookup?topic={topic}"));
    code == 200
        && v["producers"].as_array().is_some_and(|ps| {
            ps.iter().any(|p| {
                p["tcp_port"] == b.tcp.port() as u64
                    && p["http_port"] == b.http.port() as u64
                    && p["broadcast_address"] == "bcast.example"
                    && p["version"] == "1.3.0"
            })
        })
}

fn channels(l: &Lookupd, topic: &str) -> Vec<String> {
    let (_, v) = l.get(&format!("/channels?topic={topic}"));
    serde_json::from_value(v["channels"].clone()).unwrap_or_default()
}

#[test]
fn real_lookupd_registration_restart_and_peer_switch() {
    let mut a = Lookupd::start(&[]);
    let b = Broker::start(
        2,
        &[
            &format!("--lookupd-tcp-address={}", a.tcp),
            "--broadcast-address=bcast.example",
            PING,
        ],
    );
    // Topic and channels created over HTTP (on whichever shard) reach lookupd.
    for t in ["lk-a", "lk-b", "lk-c"] {
        b.post_ok(&format!("/topic/create?topic={t}"));
        b.post_ok(&format!("/channel/create?topic={t}&channel=c1"));
        b.post_ok(&format!("/channel/create?topic={t}&channel=e%23ephemeral"));
    }
    for t in ["lk-a", "lk-b", "lk-c"] {
        eventually(&format!("{t} in /lookup"), || lists_broker(&a, &b, t));
        eventually(&format!("{t} channels"), || {
            channels(&a, t) == ["c1", "e#ephemeral"]
        });
    }
    let (_, topics) = a.get("/topics");
    assert_eq!(
        topics["topics"],
        serde_json::json!(["lk-a", "lk-b", "lk-c"])
    );

    // Deleting channels unregisters them: the ephemeral one disappears, the other keeps
    // its (non-ephemeral) registration without producers.
    b.post_ok("/channel/delete?topic=lk-a&channel=e%23ephemeral");
    b.post_ok("/channel/delete?topic=lk-a&channel=c1");
    eventually("lk-a e#ephemeral gone", || channels(&a, "lk-a") == ["c1"]);
    eventually("lk-a c1 without producers", || {
        let (_, d) = a.get("/debug");
        // /debug lists only registrations that have producers.
        d["channel:lk-a:c1"].as_array().is_none_or(|v| v.is_empty())
            && d["topic:lk-a:"].as_array().is_some_and(|v| v.len() == 1)
    });
    // Deleting a topic unregisters it.
    b.post_ok("/topic/delete?topic=lk-c");
    eventually("lk-c without producers", || !lists_broker(&a, &b, "lk-c"));

    // lookupd restarts on the same ports: nsqd notices at its next PING and registers
    // everything again (and only what still exists).
    let (tcp, http) = (a.tcp, a.http);
    a.kill();
    let a2 = Lookupd::start_on(tcp, http, &[]);
    for t in ["lk-a", "lk-b"] {
        eventually(&format!("{t} re-registered"), || lists_broker(&a2, &b, t));
    }
    eventually("lk-b channels re-registered", || {
        channels(&a2, "lk-b") == ["c1", "e#ephemeral"]
    });
    assert!(channels(&a2, "lk-a").is_empty());
    assert_eq!(a2.get("/lookup?topic=lk-c").0, 404);

    // PUT /config/nsqlookupd_tcp_addresses switches peers: the new one gets IDENTIFY and
    // every registration; the old one is closed (and drops this producer).
    let other = Lookupd::start(&[]);
    let body = format!(r#"["{}"]"#, other.tcp);
    let (code, resp) = b.http("PUT", "/config/nsqlookupd_tcp_addresses", body.as_bytes());
    assert_eq!(
        (code, String::from_utf8_lossy(&resp).to_string()),
        (200, body.clone())
    );
    for _ in 0..4 {
        // any shard answers with the new value
        let (code, resp) = b.http("GET", "/config/nsqlookupd_tcp_addresses", b"");
        assert_eq!(
            (code, String::from_utf8_lossy(&resp).to_string()),
            (200, body.clone())
        );
    }
    for t in ["lk-a", "lk-b"] {
        eventually(&format!("{t} on the new lookupd"), || {
            lists_broker(&other, &b, t)
        });
        eventually(&format!("{t} gone from the old lookupd"), || {
            !lists_broker(&a2, &b, t)
        });
    }
    // Both at once; the old one gets everything again.
    let both = format!(r#"["{}","{}"]"#, other.tcp, a2.tcp);
    let (code, _) = b.http("PUT", "/config/nsqlookupd_tcp_addresses", both.as_bytes());
    assert_eq!(code, 200);
    eventually("back on the old lookupd", || lists_broker(&a2, &b, "lk-b"));
    assert!(lists_broker(&other, &b, "lk-b"));
    // New registrations go to both.
    b.post_ok("/topic/create?topic=lk-new");
    eventually("lk-new on both", || {
        lists_broker(&a2, &b, "lk-new") && lists_broker(&other, &b, "lk-new")
    });
    // An empty list disconnects every peer.
    let (code, resp) = b.http("PUT", "/config/nsqlookupd_tcp_addresses", b"[]");
    assert_eq!((code, resp), (200, b"[]".to_vec()));
    eventually("no lookupd lists the broker", || {
        !lists_broker(&a2, &b, "lk-b") && !lists_broker(&other, &b, "lk-b")
    });
}
