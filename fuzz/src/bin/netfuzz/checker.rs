//! The exactly-once checker and the janitor: unique bodies published on their own
//! connection and consumed on every checker channel, and the deletion of the topics the
//! fuzz clients create.

use super::{Received, CHECK_TOPIC};
use nsq_fuzz::net::{self, Stop};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

fn body_of(k: u64) -> Vec<u8> {
    format!("nfc-{k:010}").into_bytes()
}

fn parse_body(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b.strip_prefix(b"nfc-")?)
        .ok()?
        .parse()
        .ok()
}

/// PUBs (and every fourth time an MPUB of 5) numbered bodies, each acknowledged before the
/// next; `published` counts the acknowledged ones (numbers 0..published).
// A `String` error: CLI-only, printed once before the fuzzer exits.
pub(super) fn publish(
    tcp: SocketAddr,
    rate: u64,
    published: &AtomicU64,
    stop: &Stop,
) -> Result<(), String> {
    let mut s = net::v2(tcp, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut k = 0u64;
    let mut round = 0u64;
    while !stop.is_set() {
        let (cmd, count) = if round % 4 == 3 {
            let bodies: Vec<Vec<u8>> = (k..k + 5).map(body_of).collect();
            (net::mpub_cmd(CHECK_TOPIC, &bodies), 5)
        } else {
            (net::pub_cmd(CHECK_TOPIC, &body_of(k)), 1)
        };
        round += 1;
        s.write_all(&cmd)
            .map_err(|e| format!("write after {k}: {e}"))?;
        match net::expect_response(&mut s, |_| {}) {
            Ok((0, d)) if d == b"OK" => {}
            Ok((ft, d)) => {
                return Err(format!(
                    "PUB {k}: frame {ft} {:?}",
                    String::from_utf8_lossy(&d)
                ))
            }
            Err(e) => return Err(format!("PUB {k}: no reply within 10 s: {e}")),
        }
        k += count;
        published.store(k, Ordering::SeqCst);
        // Pace to `rate` messages a second.
        let due = t0 + Duration::from_secs_f64(k as f64 / rate as f64);
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
    }
    Ok(())
}

// A `String` error: CLI-only, printed once before the fuzzer exits.
pub(super) fn consume(
    tcp: SocketAddr,
    ch: &str,
    ci: usize,
    received: &Received,
    stop: &Stop,
) -> Result<(), String> {
    let mut s = net::v2(tcp, Duration::from_millis(500)).map_err(|e| e.to_string())?;
    s.write_all(format!("SUB {CHECK_TOPIC} {ch}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    match net::expect_response(&mut s, |_| {}) {
        Ok((0, d)) if d == b"OK" => {}
        other => return Err(format!("SUB: {other:?}")),
    }
    s.set_read_timeout(Some(Duration::from_millis(500))).ok();
    s.write_all(b"RDY 100\n").map_err(|e| e.to_string())?;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.is_set() {
        let n = match s.read(&mut buf) {
            Ok(0) => return Err("connection closed by the broker".into()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(format!("read: {e}")),
        };
        pending.extend_from_slice(&buf[..n]);
        let mut out = Vec::new();
        let mut at = 0;
        while pending.len() - at >= 8 {
            let size = u32::from_be_bytes(pending[at..at + 4].try_into().unwrap()) as usize;
            if !(4..=16 << 20).contains(&size) {
                return Err(format!("bad frame size {size}"));
            }
            if pending.len() - at < 4 + size {
                break;
            }
            let ft = i32::from_be_bytes(pending[at + 4..at + 8].try_into().unwrap());
            let d = &pending[at + 8..at + 4 + size];
            match ft {
                0 if d == b"_heartbeat_" => out.extend_from_slice(b"NOP\n"),
                2 => {
                    let (_, id, body) = net::parse_message(d).ok_or("short message frame")?;
                    let k = parse_body(body).ok_or_else(|| {
                        format!("foreign body {:?}", String::from_utf8_lossy(body))
                    })?;
                    *received.lock().unwrap()[ci].entry(k).or_insert(0) += 1;
                    out.extend_from_slice(b"FIN ");
                    out.extend_from_slice(&id);
                    out.push(b'\n');
                }
                _ => return Err(format!("frame {ft}: {:?}", String::from_utf8_lossy(d))),
            }
            at += 4 + size;
        }
        pending.drain(..at);
        if !out.is_empty() {
            s.write_all(&out).map_err(|e| format!("FIN: {e}"))?;
        }
    }
    let _ = s.write_all(b"CLS\n");
    Ok(())
}

/// The broker's topic names (empty if /stats fails).
pub(super) fn topic_names(http: SocketAddr) -> std::collections::HashSet<String> {
    let Ok((200, body)) = net::http(http, "GET", "/stats?format=json&include_clients=false", b"")
    else {
        return Default::default();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return Default::default();
    };
    v["topics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["topic_name"].as_str().map(String::from))
        .collect()
}

/// Deletes every topic but the checker's and those in `keep`; returns how many.
pub(super) fn clean_topics(http: SocketAddr, keep: &std::collections::HashSet<String>) -> u64 {
    let mut n = 0;
    for name in topic_names(http) {
        let name = name.as_str();
        if name == CHECK_TOPIC || keep.contains(name) {
            continue;
        }
        let q: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        if let Ok((200, _)) = net::http(http, "POST", &format!("/topic/delete?topic={q}"), b"") {
            n += 1;
        }
    }
    n
}
