//! What a client's errors and connections write to the log, as nsqd 1.3.0 writes them
//! (protocol_v2.go IOLoop, tcp.go Handle): a failed command at ERROR as
//! `[<addr>] - <error>`, with its cause after ` - ` for FIN/REQ/TOUCH; a bad protocol
//! magic at ERROR; a new connection, its magic and its end at INFO. Operators alert on
//! `ERROR:` lines and grep for `E_FIN_FAILED` (a consumer whose messages time out).
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

fn logged(b: &Broker, line: &str) -> bool {
    wait_until(Duration::from_secs(5), || {
        b.log.lock().unwrap().iter().any(|l| l.contains(line))
    })
}

#[test]
fn client_errors_are_logged_at_error_as_nsqd() {
    for_each_shards(&[1, 2], |shards| {
        let mut b = Broker::start(shards, &[]);
        // A fatal error: `[addr] - E_INVALID invalid command FOO`.
        let mut s = b.connect_v2();
        let a = s.local_addr().unwrap();
        s.write_all(b"FOO\n").unwrap();
        let _ = read_until_closed(&mut s, "invalid command");
        assert!(
            logged(&b, &format!("TCP: new client({a})")),
            "{shards}: new client"
        );
        assert!(logged(
            &b,
            &format!("INFO: CLIENT({a}): desired protocol magic '  V2'")
        ));
        assert!(
            logged(&b, &format!("ERROR: [{a}] - E_INVALID invalid command FOO")),
            "{shards}: {:?}",
            b.log.lock().unwrap()
        );
        assert!(logged(
            &b,
            &format!("INFO: PROTOCOL(V2): [{a}] exiting ioloop")
        ));

        // A bad magic.
        let mut s = TcpStream::connect(b.tcp).unwrap();
        let a = s.local_addr().unwrap();
        s.write_all(b"  V9").unwrap();
        let _ = read_until_closed(&mut s, "bad magic");
        assert!(logged(
            &b,
            &format!("ERROR: client({a}) bad protocol magic '  V9'")
        ));

        // A FIN that fails is not fatal, and is logged with its cause.
        let mut c = b.subscribe("logs", "c");
        let a = c.local_addr().unwrap();
        c.write_all(b"FIN 0000000000000000\n").unwrap();
        let (ft, d) = read_frame_skip_hb(&mut c).unwrap();
        assert_eq!(ft, 1, "{}", show(&d));
        assert!(logged(
            &b,
            &format!(
                "ERROR: [{a}] - E_FIN_FAILED FIN 0000000000000000 failed ID not in flight - ID not in flight"
            )
        ));
        b.terminate();
    });
}
