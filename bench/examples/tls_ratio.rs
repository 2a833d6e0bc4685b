//! Quick pub+sub throughput over plain TCP and over TLS against one broker, and their
//! ratio (BENCHMARKS.md, "TLS"). Not nsq-bench: nsq-bench's producers split each socket
//! between a writer and a reader thread, which a blocking rustls stream does not allow.
//!
//! usage: cargo run --release -p nsq-bench --example tls_ratio -- <tcp host:port> \
//!            <ca.pem> [messages] [size] [producers]
//!
//! The broker must run with `--tls-cert`/`--tls-key` (certificate for `localhost`,
//! trusted by ca.pem). Each run: one consumer (SUB, RDY 2500, one FIN write per read)
//! and `producers` producers, each sending MPUBs of 100 bodies with 8 in flight; the
//! time runs from the first publish to the last message received. Runs plain, TLS,
//! plain, TLS and reports the best of each.
#![allow(
    clippy::unwrap_used,
    reason = "an example: a failed unwrap ends it with the error"
)]

use nsq_wire::client::{self as proto, Decoded, Frame};
use rustls::pki_types::ServerName;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

fn read_frame_owned(s: &mut dyn Conn, buf: &mut Vec<u8>) -> (i32, Vec<u8>) {
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr).expect("read");
    let size = i32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
    let ft = i32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
    buf.resize(size - 4, 0);
    s.read_exact(buf).expect("read");
    (ft, buf.clone())
}

/// Connects, IDENTIFYs (with tls_v1 when `tls` is set) and returns the stream.
fn connect(addr: &str, tls: Option<&Arc<rustls::ClientConfig>>) -> Box<dyn Conn> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    let mut out = Vec::new();
    proto::encode_magic(&mut out);
    let json = format!(
        r#"{{"feature_negotiation":true,"tls_v1":{},"output_buffer_timeout":25}}"#,
        tls.is_some()
    );
    proto::encode_identify(&mut out, json.as_bytes());
    s.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut b: Box<dyn Conn> = Box::new(s.try_clone().unwrap());
    let (ft, reply) = read_frame_owned(&mut *b, &mut buf);
    assert_eq!(ft, 0, "{}", String::from_utf8_lossy(&reply));
    match tls {
        None => Box::new(s),
        Some(cfg) => {
            let conn = rustls::ClientConnection::new(
                cfg.clone(),
                ServerName::try_from("localhost").unwrap(),
            )
            .unwrap();
            let mut t: Box<dyn Conn> = Box::new(rustls::StreamOwned::new(conn, s));
            let (ft, ok) = read_frame_owned(&mut *t, &mut buf);
            assert_eq!((ft, ok.as_slice()), (0, b"OK".as_slice()));
            t
        }
    }
}

fn run(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    n: usize,
    size: usize,
    p: usize,
) -> f64 {
    let topic = format!(
        "tlsratio_{}_{}",
        tls.is_some(),
        Instant::now().elapsed().as_nanos() ^ std::process::id() as u128 ^ rand_ish()
    );
    let mut c = connect(addr, tls);
    let mut out = Vec::new();
    proto::encode_sub(&mut out, &topic, "ch");
    proto::encode_rdy(&mut out, 2500);
    c.write_all(&out).unwrap();
    let consumer = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let (mut start, mut end) = (0, 0);
        let mut got = 0usize;
        let mut fins = Vec::with_capacity(64 * 1024);
        let mut first: Option<Instant> = None;
        while got < n {
            let r = c.read(&mut buf[end..]).expect("consumer read");
            assert!(r > 0, "consumer: closed");
            end += r;
            loop {
                match proto::decode_frame(&buf[start..end]).expect("frame") {
                    Decoded::Incomplete { need } => {
                        buf.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                        if need > buf.len() {
                            buf.resize(need, 0);
                        }
                        break;
                    }
                    Decoded::Frame(f, used) => {
                        match f {
                            Frame::Message(m) => {
                                first.get_or_insert_with(Instant::now);
                                got += 1;
                                proto::encode_fin(&mut fins, &m.id);
                            }
                            Frame::Response(b"_heartbeat_") => fins.extend_from_slice(b"NOP\n"),
                            Frame::Response(_) => {}
                            Frame::Error(e) => panic!("{}", String::from_utf8_lossy(e)),
                        }
                        start += used;
                    }
                }
            }
            if !fins.is_empty() {
                c.write_all(&fins).expect("fin");
                fins.clear();
            }
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let per = n / p;
    let producers: Vec<_> = (0..p)
        .map(|_| {
            let mut s = connect(addr, tls);
            let topic = topic.clone();
            std::thread::spawn(move || {
                let body = vec![b'x'; size];
                let bodies: Vec<&[u8]> = vec![&body[..]; 100];
                let mut out = Vec::new();
                proto::encode_mpub(&mut out, &topic, &bodies);
                let mut rbuf = Vec::new();
                let batches = per / 100;
                let mut sent = 0;
                let mut acked = 0;
                while acked < batches {
                    while sent < batches && sent - acked < 8 {
                        s.write_all(&out).expect("mpub");
                        sent += 1;
                    }
                    let (ft, r) = read_frame_owned(&mut *s, &mut rbuf);
                    if ft == 0 && r == b"_heartbeat_" {
                        s.write_all(b"NOP\n").unwrap();
                        continue;
                    }
                    assert_eq!((ft, r.as_slice()), (0, b"OK".as_slice()));
                    acked += 1;
                }
            })
        })
        .collect();
    for h in producers {
        h.join().unwrap();
    }
    consumer.join().unwrap();
    (per / 100 * 100 * p) as f64 / t0.elapsed().as_secs_f64()
}

fn rand_ish() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 3 {
        eprintln!("usage: tls_ratio <tcp host:port> <ca.pem> [messages] [size] [producers]");
        std::process::exit(2);
    }
    let n: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let size: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(200);
    let p: usize = a.get(5).and_then(|s| s.parse().ok()).unwrap_or(2);
    let pem = std::fs::read(&a[2]).expect("ca file");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut &pem[..]) {
        roots.add(c.expect("pem")).expect("ca");
    }
    let cfg = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let (mut plain, mut tls) = (0f64, 0f64);
    // TLS_RATIO_ONLY=plain|tls runs only that mode once (to measure the broker's CPU
    // time per mode from outside).
    match std::env::var("TLS_RATIO_ONLY").as_deref() {
        Ok("plain") => {
            println!("plain: {:.0} msgs/s", run(&a[1], None, n, size, p));
            return;
        }
        Ok("tls") => {
            println!("TLS: {:.0} msgs/s", run(&a[1], Some(&cfg), n, size, p));
            return;
        }
        _ => {}
    }
    for round in 0..2 {
        let r = run(&a[1], None, n, size, p);
        println!("round {round} plain: {r:.0} msgs/s");
        plain = plain.max(r);
        let r = run(&a[1], Some(&cfg), n, size, p);
        println!("round {round} TLS:   {r:.0} msgs/s");
        tls = tls.max(r);
    }
    println!(
        "pub+sub {n} x {size} B, {p} producers: plain {plain:.0} msgs/s, TLS {tls:.0} msgs/s, ratio {:.2}",
        tls / plain
    );
}
