//! A fuzz client's connection: a session mutated one of the ways of `KINDS`, delivered
//! whole, in pieces or dripped, and what the broker answers read and discarded.

use super::sessions::{pick, session};
use super::{Counters, KINDS};
use nsq_fuzz::mutate::{mutate, Rng};
use nsq_fuzz::net;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

const HUGE: &[u32] = &[
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x0100_0000,
    0x0010_0001,
    0x0500_0001,
];

const HUGE_CHUNK: &[&str] = &[
    "ffffffffffffffff",
    "10000000000",
    "7fffffff",
    "100001",
    "fffffffffffffffff",
];

const HUGE_CL: &[&str] = &[
    "99999999999999999999",
    "4294967296",
    "1048577",
    "5242881",
    "-1",
    "0x10",
    "18446744073709551615",
];

/// One fuzz connection: a seed session, mutated, delivered one of several ways.
pub(super) fn fuzz_session(rng: &mut Rng, tcp: SocketAddr, http: SocketAddr, counters: &Counters) {
    let s = session(rng);
    let mut bytes = s.bytes();
    let kind = rng.below(KINDS.len());
    match KINDS[kind] {
        "flip" => {
            for _ in 0..1 + rng.below(4) {
                if !bytes.is_empty() {
                    let i = rng.below(bytes.len());
                    bytes[i] ^= 1 << rng.below(8);
                }
            }
        }
        "mutate" => {
            let other = session(rng).bytes();
            mutate(&mut bytes, &other, rng, 256 * 1024);
        }
        "truncate" | "close-mid-frame" => {
            let n = rng.below(bytes.len() + 1);
            bytes.truncate(n);
        }
        "splice" => {
            let other = session(rng).bytes();
            let a = rng.below(bytes.len() + 1);
            let b = rng.below(other.len() + 1);
            bytes.truncate(a);
            bytes.extend_from_slice(&other[b..]);
        }
        "huge-size" => {
            if s.http {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let huge = HUGE_CL[rng.below(HUGE_CL.len())];
                let mut out = String::new();
                let mut rest = text.as_str();
                // A huge first chunk size (chunked), else replaces the first
                // Content-Length value (or adds one).
                let chunked = "Transfer-Encoding: chunked\r\n\r\n";
                if let Some(i) = rest.find(chunked).filter(|_| rng.below(2) == 0) {
                    let start = i + chunked.len();
                    let end = rest[start..].find("\r\n").map_or(start, |e| start + e);
                    let size = HUGE_CHUNK[rng.below(HUGE_CHUNK.len())];
                    bytes = format!("{}{size}{}", &rest[..start], &rest[end..]).into_bytes();
                } else if let Some(i) = rest.find("Content-Length: ") {
                    out.push_str(&rest[..i + 16]);
                    rest = &rest[i + 16..];
                    let end = rest.find("\r\n").unwrap_or(0);
                    out.push_str(huge);
                    out.push_str(&rest[end..]);
                    bytes = out.into_bytes();
                } else {
                    bytes = text
                        .replacen(
                            "\r\n\r\n",
                            &format!("\r\nContent-Length: {huge}\r\n\r\n"),
                            1,
                        )
                        .into_bytes();
                }
            } else {
                let sizes: Vec<usize> = {
                    let mut off = 0;
                    let mut v = Vec::new();
                    for (p, at) in &s.parts {
                        if let Some(a) = at {
                            v.push(off + a);
                        }
                        off += p.len();
                    }
                    v
                };
                if !sizes.is_empty() {
                    let at = sizes[rng.below(sizes.len())];
                    let h = HUGE[rng.below(HUGE.len())];
                    bytes[at..at + 4].copy_from_slice(&h.to_be_bytes());
                    // The broker must answer without waiting for (or allocating) it all.
                    bytes.truncate(at + 4 + rng.below(64));
                }
            }
        }
        _ => {}
    }
    let addr = if s.http { http } else { tcp };
    let mut conn = match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(c) => c,
        Err(_) => {
            counters.connect_errors.fetch_add(1, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(50));
            return;
        }
    };
    counters.sessions.fetch_add(1, Ordering::Relaxed);
    counters.kinds[kind].fetch_add(1, Ordering::Relaxed);
    let _ = conn.set_nodelay(true);
    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = conn.set_read_timeout(Some(Duration::from_millis(20)));
    let mut inbox = Vec::new();
    let sent = match KINDS[kind] {
        "drip" => {
            // One byte at a time with 1-10 ms pauses for up to ~1.5 s, then the rest.
            let t0 = Instant::now();
            let mut i = 0;
            let mut ok = true;
            while i < bytes.len() && t0.elapsed() < Duration::from_millis(1500) && ok {
                ok = conn.write_all(&bytes[i..i + 1]).is_ok();
                i += 1;
                thread::sleep(Duration::from_millis(1 + rng.below(10) as u64));
            }
            if ok {
                ok = conn.write_all(&bytes[i..]).is_ok();
            }
            if ok {
                bytes.len()
            } else {
                i
            }
        }
        "chunks" => {
            // Pieces of 1-64 bytes for up to ~1.5 s, then the rest at once.
            let t0 = Instant::now();
            let mut i = 0;
            while i < bytes.len() {
                if t0.elapsed() > Duration::from_millis(1500) {
                    if conn.write_all(&bytes[i..]).is_ok() {
                        i = bytes.len();
                    }
                    break;
                }
                let n = (1 + rng.below(64)).min(bytes.len() - i);
                if conn.write_all(&bytes[i..i + n]).is_err() {
                    break;
                }
                i += n;
                if rng.below(4) == 0 {
                    thread::sleep(Duration::from_millis(rng.below(3) as u64));
                }
                if rng.below(16) == 0 {
                    drain(&mut conn, &mut inbox);
                }
            }
            i
        }
        _ => {
            if conn.write_all(&bytes).is_ok() {
                bytes.len()
            } else {
                0
            }
        }
    };
    counters.bytes.fetch_add(sent as u64, Ordering::Relaxed);
    if KINDS[kind] == "close-mid-frame" {
        return; // dropped at once, with whatever the broker sent unread (RST).
    }
    // Read replies for a while; a V2 client answers the messages it gets.
    let until = Instant::now() + Duration::from_millis(100 + rng.below(300) as u64);
    while Instant::now() < until {
        let before = inbox.len();
        if !drain(&mut conn, &mut inbox) {
            break;
        }
        if !s.http && inbox.len() > before {
            let mut out = Vec::new();
            let mut at = 0;
            while inbox.len() - at >= 8 {
                let size = u32::from_be_bytes(inbox[at..at + 4].try_into().unwrap()) as usize;
                if size < 4 || inbox.len() - at < 4 + size {
                    break;
                }
                let ft = i32::from_be_bytes(inbox[at + 4..at + 8].try_into().unwrap());
                if ft == 2 {
                    if let Some((_, id, _)) = net::parse_message(&inbox[at + 8..at + 4 + size]) {
                        let verb = pick(rng, &["FIN ", "FIN ", "REQ ", "TOUCH "]);
                        out.extend_from_slice(verb.as_bytes());
                        out.extend_from_slice(&id);
                        out.extend_from_slice(if verb == "REQ " { b" 10\n" } else { b"\n" });
                        counters.msgs_answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
                at += 4 + size;
            }
            inbox.drain(..at);
            if !out.is_empty() && conn.write_all(&out).is_err() {
                break;
            }
        }
    }
    if rng.below(2) == 0 {
        let _ = conn.shutdown(Shutdown::Write);
        drain(&mut conn, &mut inbox);
    }
}

/// Reads what is there (20 ms read timeout); false once the connection is closed.
fn drain(conn: &mut TcpStream, inbox: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 16 * 1024];
    match conn.read(&mut buf) {
        Ok(0) => false,
        Ok(n) => {
            if inbox.len() < 1 << 20 {
                inbox.extend_from_slice(&buf[..n]);
            }
            true
        }
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}
