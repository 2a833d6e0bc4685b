//! Harnesses of nsqlookupd's V1 protocol and its IDENTIFY.

// ---------------------------------------------------------------- nsqlookupd V1

/// A fresh nsqlookupd context per input: registration keys stay in the database after
/// their producers leave (as nsqlookupd's), so one shared database grew with every
/// input and slowed the target down to a tenth of its speed.
fn lookupd_context() -> std::sync::Arc<nsqlookupd::Context> {
    let addr: std::net::SocketAddr = "127.0.0.1:4160".parse().unwrap();
    std::sync::Arc::new(nsqlookupd::Context {
        opts: nsqlookupd::Options {
            tcp_address: "127.0.0.1:4160".into(),
            http_address: "127.0.0.1:4161".into(),
            broadcast_address: "fuzz".into(),
            inactive_producer_timeout: std::time::Duration::from_secs(300),
            tombstone_lifetime: std::time::Duration::from_secs(45),
        },
        db: nsqlookupd::registration_db::RegistrationDb::new(),
        tcp_addr: addr,
        http_addr: addr,
        hostname: "fuzz".into(),
    })
}

/// The nsqlookupd V1 connection handler (`protocol_v1::serve`, what `handle` runs over
/// TCP) over memory: the input is what the client sends (then it closes); every reply is
/// a well-formed `[u32 size][data]` frame, and the handler returns.
pub fn lookupd_v1(data: &[u8]) {
    let mut out = Vec::new();
    let ctx = lookupd_context();
    nsqlookupd::protocol_v1::serve(ctx.clone(), "127.0.0.1:4150".into(), data, &mut out);
    let mut rest = &out[..];
    while !rest.is_empty() {
        assert!(rest.len() >= 4, "torn reply frame");
        let n = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        assert!(rest.len() >= 4 + n, "reply frame size {n} beyond the reply");
        rest = &rest[4 + n..];
    }
    // The connection's end removed the peer from every registration.
    let db = &ctx.db;
    assert!(
        db.lookup_registrations("127.0.0.1:4150").is_empty(),
        "registrations left after the connection closed"
    );
}

/// nsqlookupd's IDENTIFY JSON decoding: no panic; an accepted body's fields survive a
/// JSON round trip.
pub fn lookupd_identify(data: &[u8]) {
    use nsq_wire::lookupd_v1::decode_identify;
    if let Ok(f) = decode_identify(data) {
        let v = serde_json::json!({
            "hostname": f.hostname,
            "broadcast_address": f.broadcast_address,
            "tcp_port": f.tcp_port,
            "http_port": f.http_port,
            "version": f.version,
        });
        let again = decode_identify(v.to_string().as_bytes()).expect("own IDENTIFY refused");
        assert_eq!(again, f);
    }
}
