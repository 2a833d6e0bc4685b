//! Every nsqd 1.3.0 flag is accepted, so any nsqd command line starts this broker: the
//! list below is `nsqd --help` of 1.3.0 (apps/nsqd/options.go), plus
//! `--auth-http-request-method`, `--topology-region`, `--topology-zone` and
//! `--enable-experiment` from nsqd's master branch. Deprecated flags are accepted
//! and ignored silently, as nsqd 1.3.0 does (it prints no warning for them). This
//! broker's own flags are listed in `OWN_FLAGS` (and in docs/operations.md).

use crate::common;

use clap::CommandFactory;
use common::Broker;
use nsqd::config::Cli;

/// `nsqd --help` of nsqd v1.3.0, every flag, with a value it accepts.
const NSQD_1_3_0_FLAGS: &[(&str, Option<&str>)] = &[
    ("auth-http-address", Some("127.0.0.1:4181")),
    ("broadcast-address", Some("h")),
    ("broadcast-http-port", Some("1")),
    ("broadcast-tcp-port", Some("1")),
    ("config", Some("nsqd.toml")),
    ("data-path", Some("/tmp")),
    ("deflate", None),
    ("e2e-processing-latency-percentile", Some("0.99,0.5")),
    ("e2e-processing-latency-window-time", Some("5m")),
    ("http-address", Some("127.0.0.1:4151")),
    ("http-client-connect-timeout", Some("2s")),
    ("http-client-request-timeout", Some("5s")),
    ("https-address", Some("0.0.0.0:4152")),
    ("log-level", Some("debug")),
    ("log-prefix", Some("[x] ")),
    ("lookupd-tcp-address", Some("127.0.0.1:4160")),
    ("max-body-size", Some("100")),
    ("max-bytes-per-file", Some("4096")),
    ("max-channel-consumers", Some("1")),
    ("max-deflate-level", Some("1")),
    ("max-heartbeat-interval", Some("1s")),
    ("max-msg-size", Some("100")),
    ("max-msg-timeout", Some("1s")),
    ("max-output-buffer-size", Some("100")),
    ("max-output-buffer-timeout", Some("1s")),
    ("max-rdy-count", Some("1")),
    ("max-req-timeout", Some("1s")),
    ("mem-queue-size", Some("1")),
    ("min-output-buffer-timeout", Some("1ms")),
    ("msg-timeout", Some("1s")),
    ("node-id", Some("1")),
    ("output-buffer-timeout", Some("1ms")),
    ("queue-scan-selection-count", Some("20")),
    ("queue-scan-worker-pool-max", Some("4")),
    ("snappy", None),
    ("statsd-address", Some("127.0.0.1:8125")),
    ("statsd-exclude-ephemeral", None),
    ("statsd-interval", Some("1s")),
    ("statsd-mem-stats", None),
    ("statsd-prefix", Some("p")),
    ("statsd-udp-packet-size", Some("100")),
    ("sync-every", Some("1")),
    ("sync-timeout", Some("1s")),
    ("tcp-address", Some("127.0.0.1:4150")),
    ("tls-cert", Some("cert.pem")),
    ("tls-client-auth-policy", Some("require")),
    ("tls-key", Some("key.pem")),
    ("tls-min-version", Some("tls1.2")),
    ("tls-required", None),
    ("tls-root-ca-file", Some("ca.pem")),
    ("verbose", None),
    ("version", None),
    ("worker-id", None),
    // nsqd master.
    ("auth-http-request-method", Some("post")),
    ("topology-region", Some("r1")),
    ("topology-zone", Some("z1")),
    ("enable-experiment", Some("topology-aware-consumption")),
];

/// This broker's own flags (nsqd has none of these).
const OWN_FLAGS: &[&str] = &[
    "shards",
    "lookupd-ping-interval",
    "help",
    "retention-time",
    "retention-bytes",
    "max-attempts",
    "preflight",
    "sigterm",
    "channel-lag-stats",
    "cluster-address",
    "cluster-peer",
    "replication-factor",
    "replication-ack",
    "cluster-tls",
    "rebalance-leaders",
];

#[test]
fn every_nsqd_flag_exists() {
    let mut cmd = Cli::command();
    cmd.build(); // adds --help and --version
    let ours: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(String::from))
        .collect();
    for (flag, _) in NSQD_1_3_0_FLAGS {
        assert!(ours.iter().any(|f| f == flag), "--{flag} is missing");
    }
    for flag in &ours {
        assert!(
            NSQD_1_3_0_FLAGS.iter().any(|(f, _)| f == flag) || OWN_FLAGS.contains(&flag.as_str()),
            "--{flag} is not an nsqd flag: add it to OWN_FLAGS and to docs/operations.md"
        );
    }
}

#[test]
fn every_nsqd_flag_parses_in_both_spellings() {
    use clap::Parser;
    for (flag, value) in NSQD_1_3_0_FLAGS {
        if *flag == "version" {
            continue; // prints and exits
        }
        for dashes in ["--", "-"] {
            let arg = match value {
                Some(v) => format!("{dashes}{flag}={v}"),
                None => format!("{dashes}{flag}"),
            };
            let args = nsqd::config::normalize_args(["nsqd".to_string(), arg.clone()]);
            if let Err(e) = Cli::try_parse_from(&args) {
                panic!("{arg}: {e}");
            }
            if let Some(v) = value {
                // The value as a separate argument too (Go's flag package takes both).
                let args = nsqd::config::normalize_args([
                    "nsqd".to_string(),
                    format!("{dashes}{flag}"),
                    v.to_string(),
                ]);
                if let Err(e) = Cli::try_parse_from(&args) {
                    panic!("{dashes}{flag} {v}: {e}");
                }
            }
        }
    }
    // Go bool flags take `=false`; --tls-required also `=tcp-https`.
    for arg in [
        "--verbose=false",
        "--worker-id=true",
        "--tls-required=tcp-https",
        "--tls-required=false",
        "-snappy=false",
    ] {
        let args = nsqd::config::normalize_args(["nsqd", arg].map(String::from));
        assert!(Cli::try_parse_from(&args).is_ok(), "{arg}");
    }
    // Percentiles: repeatable and comma separated, kept largest first as nsqd does.
    let cli = Cli::load(
        [
            "nsqd",
            "--e2e-processing-latency-percentile=0.5,0.99",
            "-e2e-processing-latency-percentile=0.95",
        ]
        .map(String::from),
    )
    .expect("load");
    assert_eq!(cli.e2e_processing_latency_percentile, [0.99, 0.95, 0.5]);
    assert!(Cli::try_parse_from(["nsqd", "--tls-min-version=tls1.5"]).is_err());
    assert!(Cli::try_parse_from(["nsqd", "--tls-required=maybe"]).is_err());
    assert!(Cli::try_parse_from(["nsqd", "--queue-scan-interval=1s"]).is_err());
}

/// Go's flag package lets a flag given twice take its last value (a launch script's
/// overrides after its defaults), as nsqd 1.3.0 does; repeatable flags keep every value
/// (nsqlookupd: its config unit tests).
#[test]
fn a_flag_given_twice_takes_its_last_value() {
    let cli = Cli::load(
        [
            "nsqd",
            "--mem-queue-size=7",
            "-mem-queue-size",
            "8",
            "--snappy=false",
            "--snappy",
            "--lookupd-tcp-address=127.0.0.1:1",
            "--lookupd-tcp-address=127.0.0.1:2",
        ]
        .map(String::from),
    )
    .expect("a repeated flag is accepted");
    assert_eq!(cli.mem_queue_size, 8);
    assert!(cli.snappy);
    assert_eq!(cli.lookupd_tcp_address, ["127.0.0.1:1", "127.0.0.1:2"]);
}

#[test]
fn accepted_flags_start_the_broker() {
    let mut b = Broker::start(
        2,
        &[
            "--verbose",
            "-worker-id",
            "--queue-scan-worker-pool-max=8",
            "-queue-scan-selection-count=30",
            "--http-client-connect-timeout=3s",
            "--http-client-request-timeout=6s",
            "--https-address=127.0.0.1:0",
            "--tls-min-version=tls1.2",
            "--tls-required=false",
            "--auth-http-request-method=post",
            "--auth-http-address=127.0.0.1:4181",
            "-auth-http-address=http://127.0.0.1:4182/a",
            "--e2e-processing-latency-percentile=0.99",
            "--e2e-processing-latency-window-time=5m",
        ],
    );
    let get = |opt: &str| {
        let (code, body) = b.http("GET", &format!("/config/{opt}"), b"");
        (code, String::from_utf8_lossy(&body).into_owned())
    };
    assert_eq!(get("queue_scan_worker_pool_max"), (200, "8".into()));
    assert_eq!(get("queue_scan_selection_count"), (200, "30".into()));
    assert_eq!(
        get("http_client_connect_timeout"),
        (200, "3000000000".into())
    );
    assert_eq!(
        get("http_client_request_timeout"),
        (200, "6000000000".into())
    );
    assert_eq!(get("https_address"), (200, "127.0.0.1:0".into()));
    assert_eq!(get("tls_min_version"), (200, "771".into()));
    assert_eq!(get("tls_required"), (200, "0".into()));
    assert_eq!(get("auth_http_request_method"), (200, "post".into()));
    assert_eq!(
        get("auth_http_addresses"),
        (
            200,
            r#"["127.0.0.1:4181","http://127.0.0.1:4182/a"]"#.into()
        )
    );
    assert_eq!(
        get("e2e_processing_latency_percentiles"),
        (200, "[0.99]".into())
    );
    assert_eq!(
        get("e2e_processing_latency_window_time"),
        (200, "300000000000".into())
    );
    b.terminate();
    let log = b.log.lock().unwrap().join("\n");
    // nsqd 1.3.0 prints nothing for its deprecated flags.
    assert!(!log.contains("deprecated"), "{log}");
    // The access log names the client as nsqd does: `(127.0.0.1:35994)`.
    assert!(
        log.lines()
            .any(|l| l.contains("200 GET /config/tls_required (127.0.0.1:")),
        "{log}"
    );
}

/// Runs nsqd with `args`; expects exit status 1 and returns stderr.
fn fails(args: &[&str]) -> String {
    common::nsqd_startup_failure(args)
}

#[test]
fn tls_files_are_checked() {
    // nsqd's messages (tls.LoadX509KeyPair opens the certificate, then the key).
    for (args, file) in [
        (
            &["--tls-cert=cert.pem", "--tls-key=key.pem"][..],
            "cert.pem",
        ),
        (&["--tls-cert=cert.pem"][..], "cert.pem"),
        (&["-tls-key=key.pem"][..], ""),
    ] {
        let err = fails(args);
        assert!(
            err.contains(&format!(
                "FATAL: failed to instantiate nsqd - failed to build TLS config - open {file}: \
                 no such file or directory"
            )),
            "{args:?}: {err}"
        );
    }
    // nsqd's own checks come first, with its messages.
    for (args, msg) in [
        (
            &["--tls-required"][..],
            "cannot require TLS client connections without TLS key and cert",
        ),
        (
            &["--tls-required=tcp-https"][..],
            "cannot require TLS client connections without TLS key and cert",
        ),
        (
            &["--tls-client-auth-policy=require-verify"][..],
            "cannot require TLS client connections without TLS key and cert",
        ),
        (
            &["--auth-http-request-method=put"][..],
            "--auth-http-request-method must be post or get",
        ),
        (
            &["--e2e-processing-latency-percentile=1.5"][..],
            "invalid E2E processing latency percentile: 1.5",
        ),
        (
            &["--tls-root-ca-file=/nonexistent/ca.pem"][..],
            "failed to build client TLS config - open /nonexistent/ca.pem: no such file or directory",
        ),
    ] {
        let err = fails(args);
        assert!(
            err.starts_with("[nsqd] ") && err.contains(&format!("FATAL: failed to instantiate nsqd - {msg}\n")),
            "{args:?}: {err}"
        );
    }
}

/// A duration flag out of Go's range (over 2^63-1 ns) is refused as Go's
/// time.ParseDuration refuses it; it panicked (the float seconds overflowed a Duration).
/// The config file takes the same parser, with its Go error text.
#[test]
fn out_of_range_durations_are_refused_not_a_panic() {
    for v in [
        "99999999999999999999999h",
        "2562048h",
        "9223372036854775808ns",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nsqd"))
            .arg(format!("--msg-timeout={v}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{v}: {err}");
        assert!(
            err.contains(&format!("time: invalid duration \"{v}\"")) && !err.contains("panicked"),
            "{v}: {err}"
        );
    }
    let cfg = std::env::temp_dir().join(format!("nsqd-dur-{}.cfg", std::process::id()));
    std::fs::write(&cfg, "msg_timeout = \"2562048h\"\n").unwrap();
    let err = fails(&[&format!("--config={}", cfg.display())]);
    let _ = std::fs::remove_file(&cfg);
    assert!(
        err.contains(
            "ERROR: Resolve failed to coerce value 2562048h (1m0s) for field MsgTimeout - \
             time: invalid duration \"2562048h\""
        ),
        "{err}"
    );
}
