//! The test harness itself (tests/it/common/daemon.rs): a daemon is waited for on its ports,
//! a daemon that exits first fails the start with its log, and a port taken by someone
//! else between the pick and the bind is retried on fresh ports.

use crate::common;

use common::*;
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

/// `nsqd` on the given ports with its own data path `nsqd-harness-<name>-<pid>`.
fn nsqd(
    name: &str,
    tcp: std::net::SocketAddr,
    http: std::net::SocketAddr,
    extra: &[&str],
) -> Command {
    let dir = data_dir(name);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqd"));
    cmd.arg(format!("--tcp-address={tcp}"))
        .arg(format!("--http-address={http}"))
        .arg("--shards=1")
        .arg(format!("--data-path={}", dir.display()))
        .args(extra);
    cmd
}

fn data_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("nsqd-harness-{name}-{}", std::process::id()))
}

#[test]
fn ports_answer_when_start_returns() {
    let b = Broker::start(1, &[]);
    assert!(std::net::TcpStream::connect(b.tcp).is_ok());
    assert_eq!(b.http("GET", "/ping", b""), (200, b"OK".to_vec()));
}

#[test]
fn a_daemon_that_exits_first_fails_the_start_with_its_log() {
    let r = std::panic::catch_unwind(|| {
        Daemon::start_listening_with(|tcp, http| {
            nsqd(
                "exits",
                tcp,
                http,
                &[
                    "--tls-cert=/nonexistent/cert.pem",
                    "--tls-key=/nonexistent/key.pem",
                ],
            )
        })
    });
    let msg = match r {
        Ok(_) => panic!("a broker with missing certificate files started"),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(msg.contains("nsqd (pid "), "{msg}");
    assert!(
        msg.contains("exited (exit status: 1) before its ports answered"),
        "{msg}"
    );
    assert!(msg.contains("failed to build TLS config"), "{msg}");
    let _ = std::fs::remove_dir_all(data_dir("exits"));
}

/// A port taken (listening) by another process before the daemon binds it: the daemon
/// retries the bind for 2 s, during which a connect to that port is answered by the other
/// holder. The harness must not take that answer for the daemon's (it would hand the test
/// someone else's socket), whichever of the two ports it is.
#[test]
fn a_port_taken_before_the_bind_is_retried_on_fresh_ports() {
    for which in ["tcp", "http"] {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_port = taken.local_addr().unwrap().port();
        let mut picks = 0;
        let (mut d, tcp, http) = Daemon::start_listening_picking(
            || {
                picks += 1;
                match (picks, which) {
                    (1, "tcp") => (taken_port, free_port()),
                    (1, _) => (free_port(), taken_port),
                    _ => (free_port(), free_port()),
                }
            },
            |tcp, http| nsqd("retry", tcp, http, &[]),
        );
        assert_eq!(picks, 2, "{which}: one retry");
        assert_ne!(tcp.port(), taken_port, "{which}");
        assert_ne!(http.port(), taken_port, "{which}");
        assert_eq!(common::daemon::listens_on(d.pid(), tcp), Some(true));
        assert_eq!(common::daemon::listens_on(d.pid(), http), Some(true));
        let (code, body) = split_http(&http_raw(http, "GET", "/ping", b""));
        assert_eq!((code, body.as_slice()), (200, &b"OK"[..]));
        assert!(d
            .terminate(Duration::from_secs(10))
            .is_some_and(|s| s.success()));
        drop(taken);
        let _ = std::fs::remove_dir_all(data_dir("retry"));
    }
}
