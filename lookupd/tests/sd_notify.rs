//! systemd's notify protocol (`Type=notify`, sd_notify(3)) for nsqlookupd: it keeps no
//! data, so it sends READY=1 once both listeners accept, and STOPPING=1 on SIGTERM.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

#[path = "../../tests/it/common/daemon.rs"]
mod daemon;

use daemon::{free_port, loopback, Daemon};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

/// One HTTP/1.1 request with `Connection: close`; the raw response.
fn http_raw(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("http connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// Splits a raw HTTP response into (status, body).
fn split_http(raw: &[u8]) -> (u16, Vec<u8>) {
    let text = String::from_utf8_lossy(raw);
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let pos = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .unwrap_or(raw.len());
    (code, raw[pos..].to_vec())
}

#[test]
fn nsqlookupd_ready_and_stopping() {
    let dir = std::env::temp_dir().join(format!("nsqlookupd-sd-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // Ports picked before the start, as a unit file names them.
    let http = loopback(free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqlookupd"));
    cmd.arg(format!("--tcp-address={}", loopback(free_port())))
        .arg(format!("--http-address={http}"))
        .env("NOTIFY_SOCKET", &sock_path);
    let mut daemon = Daemon::spawn_cmd(cmd);
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("READY=1");
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "READY=1");
    // Both listeners were announced before READY=1, and the HTTP one answers.
    let announced = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !daemon.log_contains(what) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        daemon.log_contains(what)
    };
    assert!(
        announced(&format!("HTTP: listening on {http}")),
        "{}",
        daemon.log_text()
    );
    let (code, _) = split_http(&http_raw(http, "GET", "/ping", b""));
    assert_eq!(code, 200);
    daemon.signal(15);
    let n = sock.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "STOPPING=1");
    let status = daemon
        .wait_exit(Duration::from_secs(20))
        .expect("exit after SIGTERM");
    assert!(status.success(), "{status}: {}", daemon.log_text());
    let _ = std::fs::remove_dir_all(&dir);
}
