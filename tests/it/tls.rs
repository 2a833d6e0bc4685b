//! TLS (`--tls-cert`/`--tls-key`): IDENTIFY `tls_v1` upgrades the connection after the
//! plain JSON reply (nsqd: protocol_v2.go IDENTIFY, clientV2.UpgradeTLS), then an `OK`
//! over TLS, then snappy/deflate if negotiated; `--tls-required`; client certificate
//! policies; `--tls-min-version`; the HTTPS listener; a TLS connection handed over to
//! the shard that owns its topic. Certificates are made with rcgen, the client is rustls
//! over a blocking socket.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A test CA, a server certificate it signed (for localhost and 127.0.0.1) and a client
/// certificate it signed, written as PEM files in a fresh directory.
pub(crate) struct Pki {
    dir: PathBuf,
    ca: CertificateDer<'static>,
    pub(crate) client_cert: CertificateDer<'static>,
    pub(crate) client_key: Vec<u8>,
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Pki {
    pub(crate) fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "nsqd-tls-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "nsqd test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let srv_key = rcgen::KeyPair::generate().unwrap();
        let srv = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .unwrap()
            .signed_by(&srv_key, &ca, &ca_key)
            .unwrap();
        let cl_key = rcgen::KeyPair::generate().unwrap();
        let mut cl_params = rcgen::CertificateParams::new(vec!["client".into()]).unwrap();
        cl_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "client");
        let cl = cl_params.signed_by(&cl_key, &ca, &ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("cert.pem"), srv.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), srv_key.serialize_pem()).unwrap();
        Pki {
            dir,
            ca: ca.der().clone(),
            client_cert: cl.der().clone(),
            client_key: cl_key.serialize_der(),
        }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The flags that enable TLS (HTTPS on a kernel-chosen port).
    fn flags(&self) -> Vec<String> {
        vec![
            format!("--tls-cert={}", self.path("cert.pem")),
            format!("--tls-key={}", self.path("key.pem")),
        ]
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A broker with TLS and an HTTPS listener on a port picked before the start; returns
/// once the HTTPS port answers too.
fn start(shards: usize, pki: &Pki, extra: &[&str]) -> (Broker, std::net::SocketAddr) {
    let https = loopback(free_port());
    let mut flags = pki.flags();
    flags.push(format!("--https-address={https}"));
    flags.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let b = Broker::start(shards, &refs);
    wait_for_port(https, Duration::from_secs(60));
    (b, https)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration trusting the test CA, with the client certificate if asked,
/// limited to the given versions.
pub(crate) fn client_config(
    pki: &Pki,
    with_cert: Option<(CertificateDer<'static>, Vec<u8>)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).unwrap();
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match with_cert {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                vec![cert],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)),
            )
            .unwrap(),
    })
}

fn default_client(pki: &Pki) -> Arc<rustls::ClientConfig> {
    client_config(pki, None, rustls::ALL_VERSIONS)
}

fn read_frame_from(s: &mut impl Read) -> std::io::Result<(i32, Vec<u8>)> {
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr)?;
    let size = i32::from_be_bytes(hdr[0..4].try_into().unwrap());
    let ft = i32::from_be_bytes(hdr[4..8].try_into().unwrap());
    let mut data = vec![0u8; (size - 4) as usize];
    s.read_exact(&mut data)?;
    Ok((ft, data))
}

fn next_frame(s: &mut impl Read) -> (i32, Vec<u8>) {
    loop {
        let f = read_frame_from(s).expect("frame");
        if !(f.0 == 0 && f.1 == b"_heartbeat_") {
            return f;
        }
    }
}

fn expect_ok_on(s: &mut impl Read) {
    let (ft, data) = next_frame(s);
    assert_eq!((ft, show(&data)), (0, "OK".to_string()));
}

/// IDENTIFY with `tls_v1` (and `extra` JSON fields) on a plain connection, the JSON
/// reply read plain, then the TLS handshake. Returns the reply and the TLS stream.
fn identify_tls(
    b: &Broker,
    cfg: Arc<rustls::ClientConfig>,
    extra: &str,
) -> (serde_json::Value, std::io::Result<Tls>) {
    let mut s = b.connect_v2();
    send(
        &mut s,
        &identify_cmd(&format!(
            r#"{{"feature_negotiation":true,"tls_v1":true{extra}}}"#
        )),
    );
    let (ft, data) = read_frame(&mut s).expect("identify reply");
    assert_eq!(ft, 0, "{}", show(&data));
    let reply: serde_json::Value = serde_json::from_slice(&data).expect("json");
    let conn =
        rustls::ClientConnection::new(cfg, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, s);
    let r = (|| {
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        // TLS 1.3: a refused client certificate shows at the first read.
        let (ft, data) = read_frame_from(&mut tls)?;
        if (ft, data.as_slice()) != (0, b"OK".as_slice()) {
            return Err(std::io::Error::other(format!("got {ft} {}", show(&data))));
        }
        Ok(())
    })();
    (reply, r.map(|_| tls))
}

fn tls_conn(b: &Broker, pki: &Pki) -> Tls {
    let (reply, tls) = identify_tls(b, default_client(pki), "");
    assert_eq!(reply["tls_v1"], true);
    tls.expect("TLS handshake")
}

fn sub_rdy(s: &mut Tls, topic: &str, channel: &str) {
    s.write_all(format!("SUB {topic} {channel}\n").as_bytes())
        .unwrap();
    expect_ok_on(s);
    s.write_all(b"RDY 100\n").unwrap();
}

#[test]
fn identify_reply_offers_tls_only_with_a_certificate() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(
        &mut s,
        &identify_cmd(r#"{"feature_negotiation":true,"tls_v1":true}"#),
    );
    let (_, data) = read_frame(&mut s).unwrap();
    let reply: serde_json::Value = serde_json::from_slice(&data).unwrap();
    assert_eq!(reply["tls_v1"], false);
    // Still a plain connection.
    send(&mut s, b"NOP\n");
    send(&mut s, &pub_cmd("plain", b"x"));
    expect_ok(&mut s);
}

#[test]
fn pub_sub_over_tls_across_shards() {
    let pki = Pki::new();
    for_each_shards(&SHARD_COUNTS, |shards| {
        let (b, _) = start(shards, &pki, &[]);
        // Topics on every shard (picked by the broker's hash): with more than one shard
        // some are owned by a shard other than the one that accepted the connection, so
        // SUB (and the first PUB) hand the TLS session over mid-stream.
        let mut subs = Vec::new();
        for topic in topic_names(&format!("tls_{shards}"), 6) {
            let mut sub = tls_conn(&b, &pki);
            sub_rdy(&mut sub, &topic, "ch");
            let mut publ = tls_conn(&b, &pki);
            // 20 PUBs in 20 TLS records before reading any answer: the first PUB moves
            // the connection while the others wait as ciphertext, which moves with it.
            for i in 0..20 {
                publ.write_all(&pub_cmd(&topic, format!("m{i}").as_bytes()))
                    .unwrap();
            }
            for _ in 0..20 {
                expect_ok_on(&mut publ);
            }
            // A big one: several TLS records.
            let big = vec![b'z'; 200_000];
            publ.write_all(&pub_cmd(&topic, &big)).unwrap();
            expect_ok_on(&mut publ);
            for i in 0..21 {
                let (ft, data) = next_frame(&mut sub);
                assert_eq!(ft, 2, "{}", show(&data));
                let (_, _, id, body) = parse_message(&data);
                if i < 20 {
                    assert_eq!(body, format!("m{i}").as_bytes());
                } else {
                    assert_eq!(body, big);
                }
                sub.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
            }
            subs.push(sub);
        }
        if shards > 1 {
            // The TLS sessions did move between shards.
            let (_, text) = b.http("GET", "/stats", b"");
            let text = String::from_utf8_lossy(&text).to_string();
            let received: u64 = text
                .lines()
                .filter_map(|l| l.split("handoffs: ").nth(1))
                .filter_map(|h| h.trim().split('/').nth(1)?.parse::<u64>().ok())
                .sum();
            assert!(received > 0, "no hand-off: {text}");
        }
        let stats = b.stats();
        let clients: Vec<&serde_json::Value> = stats["topics"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["channels"].as_array().unwrap().iter())
            .flat_map(|c| c["clients"].as_array().unwrap().iter())
            .collect();
        assert!(!clients.is_empty());
        for c in clients {
            assert_eq!(c["tls"], true, "{c}");
            assert_eq!(c["tls_version"], "TLS1.3", "{c}");
            // The server's choice, as Go's: AES-128-GCM, though rustls' client lists
            // AES-256 first.
            assert_eq!(c["tls_cipher_suite"], "TLS_AES_128_GCM_SHA256", "{c}");
        }
    });
}

#[test]
fn tls_then_snappy() {
    let pki = Pki::new();
    for_each_shards(&[1, 2], |shards| {
        let (b, _) = start(shards, &pki, &[]);
        let (reply, tls) = identify_tls(&b, default_client(&pki), r#","snappy":true"#);
        assert_eq!(
            (reply["tls_v1"].clone(), reply["snappy"].clone()),
            (true.into(), true.into())
        );
        let tls = tls.expect("handshake");
        // The OK after the TLS OK comes snappy-framed over TLS.
        let mut r = snap::read::FrameDecoder::new(tls);
        expect_ok_on(&mut r);
        // SUB, then a PUB on another connection, the message back: across a hand-off
        // with more than one shard, snappy inside TLS.
        let mut w = snap::write::FrameEncoder::new(Vec::new());
        w.write_all(b"SUB snappy_tls ch\nRDY 1\n").unwrap();
        w.flush().unwrap();
        r.get_mut().write_all(&w.into_inner().unwrap()).unwrap();
        expect_ok_on(&mut r);
        let mut p = tls_conn(&b, &pki);
        p.write_all(&pub_cmd("snappy_tls", b"hello")).unwrap();
        expect_ok_on(&mut p);
        let (ft, data) = next_frame(&mut r);
        assert_eq!(ft, 2);
        assert_eq!(parse_message(&data).3, b"hello");
    });
}

#[test]
fn tls_then_deflate() {
    use flate2::read::DeflateDecoder;
    use flate2::write::DeflateEncoder;
    let pki = Pki::new();
    for_each_shards(&[1, 2, 4], |shards| {
        let (b, _) = start(shards, &pki, &[]);
        let (reply, tls) = identify_tls(&b, default_client(&pki), r#","deflate":true"#);
        assert_eq!(reply["deflate"], true);
        let tls = tls.expect("handshake");
        // The OK after the TLS OK comes deflated over TLS.
        let mut r = DeflateDecoder::new(tls);
        expect_ok_on(&mut r);
        // SUB (a hand-off at a client flush point with more than one shard), then a
        // message published on another connection, all deflated inside TLS.
        let topic = format!("deflate_tls_{shards}");
        let mut w = DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
        w.write_all(format!("SUB {topic} ch\nRDY 5\n").as_bytes())
            .unwrap();
        w.flush().unwrap();
        r.get_mut().write_all(w.get_ref()).unwrap();
        expect_ok_on(&mut r);
        let mut p = tls_conn(&b, &pki);
        for i in 0..3 {
            p.write_all(&pub_cmd(&topic, format!("hello {i}").as_bytes()))
                .unwrap();
            expect_ok_on(&mut p);
        }
        for i in 0..3 {
            let (ft, data) = next_frame(&mut r);
            assert_eq!(ft, 2, "{}", show(&data));
            assert_eq!(parse_message(&data).3, format!("hello {i}").as_bytes());
        }
    });
}

#[test]
fn tls_required_refuses_plain_commands() {
    let pki = Pki::new();
    let (b, https) = start(2, &pki, &["--tls-required"]);
    for (cmd, word) in [
        (b"SUB t c\n".to_vec(), "SUB"),
        (pub_cmd("t", b"x"), "PUB"),
        (b"NOP\n".to_vec(), "NOP"),
        (b"FOO bar\n".to_vec(), "FOO"),
    ] {
        let mut s = b.connect_v2();
        send(&mut s, &cmd);
        let (ft, data) = read_frame(&mut s).unwrap();
        assert_eq!(
            (ft, show(&data)),
            (
                1,
                format!("E_INVALID cannot {word} in current state (TLS required)")
            )
        );
        assert_closed(&mut s);
    }
    // IDENTIFY is allowed plain; after a TLS upgrade everything is.
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd("{}"));
    expect_ok(&mut s);
    let mut t = tls_conn(&b, &pki);
    t.write_all(&pub_cmd("t", b"x")).unwrap();
    expect_ok_on(&mut t);
    // Plain HTTP: nsqd's 403 with the HTTPS port; HTTPS serves.
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!(code, 403);
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!(
            r#"{{"message": "TLS_REQUIRED", "https_port": {}}}"#,
            https.port()
        )
    );
    let (code, body) = https_get(&pki, https, "/ping");
    assert_eq!((code, body.as_str()), (200, "OK"));
}

#[test]
fn tls_required_tcp_https_keeps_plain_http() {
    let pki = Pki::new();
    let (b, _) = start(1, &pki, &["--tls-required=tcp-https"]);
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!((code, body.as_slice()), (200, b"OK".as_slice()));
    let mut s = b.connect_v2();
    send(&mut s, b"NOP\n");
    expect_fatal(
        &mut s,
        "E_INVALID cannot NOP in current state (TLS required)",
    );
}

fn https_get(pki: &Pki, addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let conn = rustls::ClientConnection::new(
        default_client(pki),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut s = rustls::StreamOwned::new(conn, sock);
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let (code, body) = split_http(&out);
    (code, String::from_utf8_lossy(&body).to_string())
}

#[test]
fn https_serves_the_api() {
    let pki = Pki::new();
    let (b, https) = start(2, &pki, &[]);
    assert_eq!(https_get(&pki, https, "/ping"), (200, "OK".to_string()));
    let (code, body) = https_get(&pki, https, "/info");
    assert_eq!(code, 200);
    assert!(body.contains("\"version\":\"1.3.0\""), "{body}");
    // Plain HTTP still serves without --tls-required.
    assert_eq!(b.http("GET", "/ping", b"").0, 200);
}

#[test]
fn client_auth_require() {
    let pki = Pki::new();
    let (b, _) = start(1, &pki, &["--tls-client-auth-policy=require"]);
    // No certificate: refused.
    let (_, r) = identify_tls(&b, default_client(&pki), "");
    assert!(r.is_err());
    // Any certificate (not verified): accepted.
    let other = rcgen::generate_simple_self_signed(vec!["x".to_string()]).unwrap();
    let cfg = client_config(
        &pki,
        Some((other.cert.der().clone(), other.key_pair.serialize_der())),
        rustls::ALL_VERSIONS,
    );
    let (_, r) = identify_tls(&b, cfg, "");
    let mut t = r.expect("self-signed client certificate accepted");
    t.write_all(&pub_cmd("t", b"x")).unwrap();
    expect_ok_on(&mut t);
    // The policy implies --tls-required.
    let mut s = b.connect_v2();
    send(&mut s, b"NOP\n");
    expect_fatal(
        &mut s,
        "E_INVALID cannot NOP in current state (TLS required)",
    );
}

#[test]
fn client_auth_require_verify() {
    let pki = Pki::new();
    let ca = format!("--tls-root-ca-file={}", pki.path("ca.pem"));
    let (b, _) = start(1, &pki, &["--tls-client-auth-policy=require-verify", &ca]);
    let (_, r) = identify_tls(&b, default_client(&pki), "");
    assert!(r.is_err(), "no certificate must be refused");
    let other = rcgen::generate_simple_self_signed(vec!["x".to_string()]).unwrap();
    let cfg = client_config(
        &pki,
        Some((other.cert.der().clone(), other.key_pair.serialize_der())),
        rustls::ALL_VERSIONS,
    );
    let (_, r) = identify_tls(&b, cfg, "");
    assert!(r.is_err(), "a certificate from another CA must be refused");
    let cfg = client_config(
        &pki,
        Some((pki.client_cert.clone(), pki.client_key.clone())),
        rustls::ALL_VERSIONS,
    );
    let (_, r) = identify_tls(&b, cfg, "");
    let mut t = r.expect("CA-signed client certificate accepted");
    t.write_all(&pub_cmd("t", b"x")).unwrap();
    expect_ok_on(&mut t);
}

#[test]
fn min_version() {
    let pki = Pki::new();
    let (b, _) = start(1, &pki, &["--tls-min-version=tls1.3"]);
    let (_, r) = identify_tls(
        &b,
        client_config(&pki, None, &[&rustls::version::TLS12]),
        "",
    );
    assert!(r.is_err(), "TLS 1.2 must be refused");
    let (_, r) = identify_tls(
        &b,
        client_config(&pki, None, &[&rustls::version::TLS13]),
        "",
    );
    assert!(r.is_ok());
    // The default allows TLS 1.2.
    let (b, _) = start(1, &pki, &[]);
    let (_, r) = identify_tls(
        &b,
        client_config(&pki, None, &[&rustls::version::TLS12]),
        "",
    );
    assert!(r.is_ok());
}

#[test]
fn bad_certificate_files_fail_start_up() {
    let mut d = Daemon::spawn(
        env!("CARGO_BIN_EXE_nsqd"),
        &[
            "--tls-cert=/nonexistent/cert.pem",
            "--tls-key=/nonexistent/key.pem",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
        ],
    );
    let status = d
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("nsqd kept running: {}", d.log_text()));
    assert!(!status.success());
    let err = d.stderr_text();
    assert!(
        err.contains(
            "failed to build TLS config - open /nonexistent/cert.pem: no such file or directory"
        ),
        "{err}"
    );
}

/// A one-shot-per-connection auth server: records each request line, grants everything.
fn auth_server() -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let mut req = Vec::new();
            let mut b = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&b[..n]),
                }
            }
            let line = String::from_utf8_lossy(&req)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string();
            seen2.lock().unwrap().push(line);
            let body = r#"{"ttl":3600,"identity":"i","identity_url":"","authorizations":[{"topic":".*","channels":[".*"],"permissions":["subscribe","publish"]}]}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, seen)
}

#[test]
fn auth_over_tls_sends_the_client_certificate_common_name() {
    let pki = Pki::new();
    let (auth, seen) = auth_server();
    let a = format!("--auth-http-address={auth}");
    let (b, _) = start(1, &pki, &[&a, "--tls-client-auth-policy=require"]);
    let cfg = client_config(
        &pki,
        Some((pki.client_cert.clone(), pki.client_key.clone())),
        rustls::ALL_VERSIONS,
    );
    let (_, t) = identify_tls(&b, cfg, "");
    let mut t = t.expect("handshake");
    let mut cmd = b"AUTH\n".to_vec();
    cmd.extend(sized(b"k"));
    t.write_all(&cmd).unwrap();
    let (ft, data) = next_frame(&mut t);
    assert_eq!(ft, 0, "{}", show(&data));
    let lines = seen.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("common_name=client&") && l.contains("tls=true")),
        "{lines:?}"
    );
}

#[test]
fn auth_over_tls_tells_the_auth_server() {
    let pki = Pki::new();
    let (auth, seen) = auth_server();
    let a = format!("--auth-http-address={auth}");
    let (b, _) = start(2, &pki, &[&a]);
    let (reply, t) = identify_tls(&b, default_client(&pki), "");
    assert_eq!(reply["auth_required"], true);
    let mut t = t.expect("handshake");
    let mut cmd = b"AUTH\n".to_vec();
    cmd.extend(sized(b"s3cret"));
    t.write_all(&cmd).unwrap();
    let (ft, data) = next_frame(&mut t);
    assert_eq!(ft, 0, "{}", show(&data));
    t.write_all(&pub_cmd("authed_tls", b"x")).unwrap();
    expect_ok_on(&mut t);
    let lines = seen.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("secret=s3cret") && l.contains("tls=true")),
        "{lines:?}"
    );
}
