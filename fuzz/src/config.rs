//! Harnesses of configuration and auth parsing: Go durations, config files and
//! auth-server replies.

use super::scratch_dir;

/// Go durations (flags, the config file, IDENTIFY-free options): `parse_go_duration`
/// never panics; what it accepts formats (Go's `Duration.String`) and parses back to the
/// same nanoseconds; the flag parser agrees with it (refusing only negative values); and
/// any duration from the input's first 8 bytes formats and parses back.
pub fn go_duration(data: &[u8]) {
    use nsq_wire::duration::{go_duration_string, parse_duration, parse_go_duration};
    use std::time::Duration;
    let s = String::from_utf8_lossy(data);
    let got = parse_go_duration(&s);
    match (&got, parse_duration(&s)) {
        (Ok(ns), Ok(d)) => assert_eq!(u128::try_from(*ns).ok(), Some(d.as_nanos())),
        (Ok(ns), Err(_)) => assert!(*ns < 0, "{s:?}: {ns} refused by the flag parser"),
        (Err(a), Err(b)) => assert_eq!(a, &b),
        (Err(e), Ok(d)) => panic!("{s:?}: flag parser took {d:?}, Go's refused: {e}"),
    }
    let round_trip = |ns: u64| {
        let text = go_duration_string(Duration::from_nanos(ns));
        assert_eq!(parse_go_duration(&text), Ok(ns as i64), "{text}");
    };
    if let Ok(ns) = got {
        if let Ok(ns) = u64::try_from(ns) {
            round_trip(ns);
        }
    }
    if let Some(b) = data.get(..8) {
        let n = u64::from_le_bytes(b.try_into().unwrap()) >> (data.len() % 64);
        round_trip(n & (i64::MAX as u64));
    }
}

/// nsqd's `--config` file (TOML, go-options coercion, then the broker's own option
/// checks): never a panic; the same file gives the same options twice.
pub fn config_file(data: &[u8]) {
    let path = scratch_dir("config_file").join("nsqd.cfg");
    std::fs::write(&path, data).unwrap();
    // The command line is the same for every input of a thread (its scratch file):
    // parsed once (clap's parse was 90 % of the time), then each load reads the file as
    // `Cli::load` does.
    // (Leaked, one per thread, to be borrowed for the whole call.)
    thread_local! {
        static FLAGS: std::cell::OnceCell<&'static nsqd::config::Flags> =
            const { std::cell::OnceCell::new() };
    }
    let (base, matches) = FLAGS.with(|f| {
        *f.get_or_init(|| {
            Box::leak(Box::new(nsqd::config::Cli::parse_flags([
                "nsqd".to_string(),
                format!("--config={}", path.display()),
            ])))
        })
    });
    let load = || {
        let mut cli = base.clone();
        nsqd::config_file::apply(&mut cli, matches).map(|()| {
            let options = nsqd::config_file::resolved(&cli);
            let cfg = nsqd::config::Config::from_cli(cli).map(|_| ());
            (options, cfg)
        })
    };
    // Compared as text: a NaN option (TOML `nan`) is not equal to itself.
    let first = format!("{:?}", load());
    assert_eq!(
        first,
        format!("{:?}", load()),
        "the same config file loaded twice differs"
    );
}

/// The auth server's HTTP reply (`--auth-http-address`), as read to EOF: never a panic;
/// a reply taken has a body that parses as the auth JSON, a ttl > 0 and an expiry at or
/// after the query.
pub fn auth_reply(data: &[u8]) {
    let now = std::time::Instant::now();
    let Ok(body) = nsqd::auth::reply_body(data) else {
        return;
    };
    assert!(body.len() <= data.len());
    if let Ok(st) = nsqd::auth::parse_reply(&body, now) {
        assert!(st.expires >= now);
        let _ = st.is_allowed("t", "c");
    }
}
