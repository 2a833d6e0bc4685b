//! `--config FILE` as nsqd 1.3.0 reads it (apps/nsqd/main.go, go-options v1.0.0 Resolve):
//! nsqd's cfg names, a flag on the command line over the file over the default, unknown
//! keys ignored, go-options' coercions (integer durations are ms, an integer bool is
//! `n == 0`, a non-string for a string option is Go's `%s` of it, a non-list for a list is
//! a nil list) and its fatal messages for values it cannot coerce. The expected `/config`
//! bodies were taken from nsqd 1.3.0 given the same file.

use crate::common;

use common::{wait_until, Broker};
use std::path::PathBuf;
use std::time::Duration;

fn write_file(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("nsqd-cfg-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).expect("write config");
    p
}

fn get(b: &Broker, opt: &str) -> (u16, String) {
    let (code, body) = b.http("GET", &format!("/config/{opt}"), b"");
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// Sets every nsqd 1.3.0 option (TLS and AUTH to their "off" values: setting them is a
/// start-up error here, see `unsupported_features_fail_at_startup`).
const EVERY_OPTION: &str = r#"
id = 77
log_level = "debug"
log_prefix = "[x] "
tcp_address = "127.0.0.1:1"
http_address = "127.0.0.1:2"
https_address = "127.0.0.1:24162"
broadcast_address = "bhost"
broadcast_tcp_port = 1234
broadcast_http_port = 1235
nsqlookupd_tcp_addresses = ["127.0.0.1:1", "127.0.0.1:2"]
auth_http_addresses = []
auth_http_request_method = "post"
http_client_connect_timeout = "3s"
http_client_request_timeout = 7000
data_path = "/nonexistent/overridden/by/the/command/line"
mem_queue_size = 500
max_bytes_per_file = 4096000
sync_every = 100
sync_timeout = "1500ms"
queue_scan_selection_count = 30
queue_scan_worker_pool_max = 8
msg_timeout = "30s"
max_msg_timeout = "10m"
max_msg_size = 2000
max_body_size = 4000
max_req_timeout = "2h"
max_heartbeat_interval = "40s"
max_rdy_count = 200
max_output_buffer_size = 1000
max_output_buffer_timeout = "20s"
min_output_buffer_timeout = "20ms"
output_buffer_timeout = "200ms"
max_channel_consumers = 9
statsd_address = "127.0.0.1:9"
statsd_prefix = "pfx.%s"
statsd_interval = "30s"
statsd_mem_stats = false
statsd_udp_packet_size = 400
statsd_exclude_ephemeral = true
e2e_processing_latency_window_time = "5m"
e2e_processing_latency_percentiles = [0.99, 0.5]
tls_cert = ""
tls_key = ""
tls_client_auth_policy = ""
tls_root_ca_file = "ROOT_CA"
tls_required = false
tls_min_version = "tls1.2"
deflate = false
max_deflate_level = 3
snappy = false
shards = 3
unknown_key = "ignored, as nsqd does"
queue_scan_interval = "1s"
[some_table]
id = 5
"#;

#[test]
fn a_file_that_sets_every_option() {
    let ca = write_file(
        "ca",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let text = EVERY_OPTION.replace("ROOT_CA", &ca.display().to_string());
    let cfg = write_file("every", &text);
    // The harness puts --tcp-address, --http-address, --shards and --data-path on the
    // command line: they override the file.
    let b = Broker::start(1, &[&format!("--config={}", cfg.display())]);
    let expected: &[(&str, &str)] = &[
        ("id", "77"),
        ("log_level", "1"),
        ("log_prefix", "[x] "),
        ("https_address", "127.0.0.1:24162"),
        ("broadcast_address", "bhost"),
        ("broadcast_tcp_port", "1234"),
        ("broadcast_http_port", "1235"),
        (
            "nsqlookupd_tcp_addresses",
            r#"["127.0.0.1:1","127.0.0.1:2"]"#,
        ),
        // An empty TOML array is a nil slice after go-options' coercion.
        ("auth_http_addresses", "null"),
        ("auth_http_request_method", "post"),
        ("http_client_connect_timeout", "3000000000"),
        // An integer duration is milliseconds.
        ("http_client_request_timeout", "7000000000"),
        ("mem_queue_size", "500"),
        ("max_bytes_per_file", "4096000"),
        ("sync_every", "100"),
        ("sync_timeout", "1500000000"),
        ("queue_scan_selection_count", "30"),
        ("queue_scan_worker_pool_max", "8"),
        ("msg_timeout", "30000000000"),
        ("max_msg_timeout", "600000000000"),
        ("max_msg_size", "2000"),
        ("max_body_size", "4000"),
        ("max_req_timeout", "7200000000000"),
        ("max_heartbeat_interval", "40000000000"),
        ("max_rdy_count", "200"),
        ("max_output_buffer_size", "1000"),
        ("max_output_buffer_timeout", "20000000000"),
        ("min_output_buffer_timeout", "20000000"),
        ("output_buffer_timeout", "200000000"),
        ("max_channel_consumers", "9"),
        ("statsd_address", "127.0.0.1:9"),
        ("statsd_prefix", "pfx.bhost_1235."),
        ("statsd_interval", "30000000000"),
        ("statsd_mem_stats", "false"),
        ("statsd_udp_packet_size", "400"),
        ("statsd_exclude_ephemeral", "true"),
        ("e2e_processing_latency_window_time", "300000000000"),
        ("e2e_processing_latency_percentiles", "[0.99,0.5]"),
        ("tls_cert", ""),
        ("tls_key", ""),
        ("tls_client_auth_policy", ""),
        ("tls_root_ca_file", &ca.display().to_string()),
        ("tls_required", "0"),
        ("tls_min_version", "771"),
        ("deflate", "false"),
        ("max_deflate_level", "3"),
        ("snappy", "false"),
        // The command line's --shards=1 wins over the file's 3.
        ("shards", "1"),
    ];
    for (opt, want) in expected {
        assert_eq!(get(&b, opt), (200, want.to_string()), "/config/{opt}");
    }
    // The harness's ports (picked before the start) win over the file's addresses.
    assert_eq!(get(&b, "tcp_address"), (200, b.tcp.to_string()));
    assert_eq!(get(&b, "http_address"), (200, b.http.to_string()));
    assert_eq!(
        get(&b, "data_path"),
        (200, b.data_dir.display().to_string())
    );
    for unknown in ["unknown_key", "queue_scan_interval", "client_timeout"] {
        assert_eq!(
            get(&b, unknown),
            (400, r#"{"message":"INVALID_OPTION"}"#.to_string())
        );
    }
    // The values reach the broker, not only /config.
    let (code, body) = b.http("POST", "/pub?topic=t", &[b'x'; 2001]);
    assert_eq!(
        (code, String::from_utf8_lossy(&body).into_owned()),
        (413, r#"{"message":"MSG_TOO_BIG"}"#.to_string())
    );
    let info: serde_json::Value =
        serde_json::from_slice(&b.http("GET", "/info", b"").1).expect("info json");
    assert_eq!(info["max_heartbeat_interval"], 40_000_000_000u64);
    assert_eq!(info["max_deflate_level"], 3);
    wait_until(Duration::from_secs(10), || {
        b.log.lock().unwrap().iter().any(|l| l.starts_with("[x] "))
    });
    assert!(
        b.log.lock().unwrap().iter().any(|l| l.starts_with("[x] ")),
        "log_prefix from the file"
    );
    let _ = std::fs::remove_file(cfg);
    let _ = std::fs::remove_file(ca);
}

#[test]
fn command_line_overrides_the_file() {
    let cfg = write_file(
        "override",
        "mem_queue_size = 500\nmax_rdy_count = 200\nnsqlookupd_tcp_addresses = [\"127.0.0.1:1\"]\n\
         msg_timeout = 5000\n",
    );
    let b = Broker::start(
        2,
        &[
            &format!("-config={}", cfg.display()),
            "--mem-queue-size=7",
            "-lookupd-tcp-address=127.0.0.1:3",
            "--lookupd-tcp-address=127.0.0.1:4",
        ],
    );
    assert_eq!(get(&b, "mem_queue_size"), (200, "7".into()));
    assert_eq!(get(&b, "max_rdy_count"), (200, "200".into()));
    assert_eq!(
        get(&b, "nsqlookupd_tcp_addresses"),
        (200, r#"["127.0.0.1:3","127.0.0.1:4"]"#.into())
    );
    assert_eq!(get(&b, "msg_timeout"), (200, "5000000000".into()));
    // Untouched options keep nsqd's defaults.
    assert_eq!(get(&b, "max_output_buffer_size"), (200, "65536".into()));
    assert_eq!(
        get(&b, "e2e_processing_latency_percentiles"),
        (200, "[]".into())
    );
    let _ = std::fs::remove_file(cfg);
}

#[test]
fn go_options_coercions() {
    let cfg = write_file(
        "coerce",
        "deflate = 1\nsnappy = 0\nstatsd_mem_stats = \"f\"\nbroadcast_address = 5\n\
         statsd_prefix = [\"a\", 1]\nnsqlookupd_tcp_addresses = 5\nmax_rdy_count = \"-3\"\n\
         e2e_processing_latency_percentiles = \"0.5, 0.9\"\nstatsd_interval = \"1m30s\"\n",
    );
    let b = Broker::start(1, &[&format!("--config={}", cfg.display())]);
    // go-options v1.0.0 coerceBool: an integer is true when it is 0.
    assert_eq!(get(&b, "deflate"), (200, "false".into()));
    assert_eq!(get(&b, "snappy"), (200, "true".into()));
    assert_eq!(get(&b, "statsd_mem_stats"), (200, "false".into()));
    assert_eq!(get(&b, "broadcast_address"), (200, "%!s(int64=5)".into()));
    assert_eq!(get(&b, "nsqlookupd_tcp_addresses"), (200, "null".into()));
    assert_eq!(get(&b, "max_rdy_count"), (200, "-3".into()));
    assert_eq!(
        get(&b, "e2e_processing_latency_percentiles"),
        (200, "[0.5,0.9]".into())
    );
    assert_eq!(get(&b, "statsd_interval"), (200, "90000000000".into()));
    assert!(get(&b, "statsd_prefix").1.starts_with("[a %!s(int64=1)]"));
    let _ = std::fs::remove_file(cfg);
}

/// Runs nsqd with `args` and expects it to exit 1 at start-up; returns its first stderr
/// line without the timestamp.
fn startup_failure(args: &[&str]) -> String {
    let err = common::nsqd_startup_failure(args);
    let line = err.lines().next().unwrap_or("").to_string();
    // "[nsqd] 2026/11/30 07:55:37.318106 FATAL: ..." or "2026/11/30 07:55:30 ERROR: ...".
    let (prefix, rest) = match line.strip_prefix("[nsqd] ") {
        Some(r) => ("[nsqd] ", r),
        None => ("", line.as_str()),
    };
    let mut parts = rest.splitn(3, ' ');
    let date = parts.next().unwrap_or("");
    let time = parts.next().unwrap_or("");
    assert!(date.len() == 10 && date.as_bytes()[4] == b'/', "{line}");
    assert!(time.len() >= 8 && time.as_bytes()[2] == b':', "{line}");
    format!("{prefix}{}", parts.next().unwrap_or(""))
}

fn fails_with(name: &str, text: &str) -> String {
    let p = write_file(name, text);
    let out = startup_failure(&[&format!("--config={}", p.display())]);
    let _ = std::fs::remove_file(&p);
    out.replace(&format!("{}", p.display()), "FILE")
}

#[test]
fn bad_values_are_fatal_with_nsqds_messages() {
    let cases: &[(&str, &str)] = &[
        (
            "mem_queue_size = \"abc\"",
            "ERROR: Resolve failed to coerce value abc (10000) for field MemQueueSize - \
             strconv.ParseInt: parsing \"abc\": invalid syntax",
        ),
        (
            "mem_queue_size = 1.5",
            "ERROR: Resolve failed to coerce value 1.5 (10000) for field MemQueueSize - \
             invalid int64 value type float64",
        ),
        (
            "max_deflate_level = 1.0",
            "ERROR: Resolve failed to coerce value 1 (6) for field MaxDeflateLevel - \
             invalid int64 value type float64",
        ),
        (
            "deflate = \"yes\"",
            "ERROR: Resolve failed to coerce value yes (true) for field DeflateEnabled - \
             strconv.ParseBool: parsing \"yes\": invalid syntax",
        ),
        (
            "msg_timeout = \"60\"",
            "ERROR: Resolve failed to coerce value 60 (1m0s) for field MsgTimeout - \
             time: missing unit in duration \"60\"",
        ),
        (
            "msg_timeout = 1.5",
            "ERROR: Resolve failed to coerce value 1.5 (1m0s) for field MsgTimeout - \
             invalid time.Duration value type float64",
        ),
        (
            "log_level = \"bogus\"",
            "[nsqd] FATAL: failed parsing log_level bogus",
        ),
        ("log_level = 3", "[nsqd] FATAL: failed parsing log_level 3"),
        (
            "tls_required = \"maybe\"",
            "[nsqd] FATAL: failed parsing tls_required maybe",
        ),
        (
            "tls_min_version = \"tls9\"",
            "[nsqd] FATAL: failed parsing tls_min_version tls9",
        ),
        (
            "id = 5000",
            "[nsqd] FATAL: failed to instantiate nsqd - --node-id must be [0,1024)",
        ),
        (
            "e2e_processing_latency_percentiles = [1.5]",
            "[nsqd] FATAL: failed to instantiate nsqd - invalid E2E processing latency \
             percentile: 1.5",
        ),
        (
            "tls_required = true",
            "[nsqd] FATAL: failed to instantiate nsqd - cannot require TLS client \
             connections without TLS key and cert",
        ),
        (
            "this is not toml",
            "[nsqd] FATAL: failed to load config file FILE - toml: line 1: expected `.`, `=`",
        ),
        // nsqd panics on a list element of the wrong type; here it is a clear error.
        (
            "nsqlookupd_tcp_addresses = [1]",
            "[nsqd] FATAL: failed to load config file FILE - nsqlookupd_tcp_addresses: \
             interface conversion: interface {} is int64, not string",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        assert_eq!(&fails_with(&format!("bad{i}"), text), want, "{text}");
    }
    let missing = startup_failure(&["--config=/nonexistent/nsqd.toml"]);
    assert!(
        missing.starts_with("[nsqd] FATAL: failed to load config file /nonexistent/nsqd.toml - "),
        "{missing}"
    );
}

#[test]
fn unsupported_features_fail_at_startup() {
    // TLS is supported: a certificate that cannot be read fails as in nsqd.
    let tls = fails_with(
        "tls",
        "tls_cert = \"/nonexistent/cert.pem\"\ntls_key = \"/nonexistent/key.pem\"\n",
    );
    assert!(
        tls.starts_with(
            "[nsqd] FATAL: failed to instantiate nsqd - failed to build TLS config - open \
             /nonexistent/cert.pem: no such file or directory"
        ),
        "{tls}"
    );
}

/// A TOML error whose offset falls inside a multi-byte character (counting its line
/// must not cut the text at a non-boundary, which would panic at start-up) gets the
/// usual FATAL line.
#[test]
fn a_toml_error_inside_a_multibyte_character_is_a_fatal_line_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("nsqd-cfg-utf8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("nsqd.cfg");
    let mut text = b"log_level = \"\"\"\t21em_queue_= \"".to_vec();
    text.extend(std::iter::repeat_n(b'\\', 35));
    text.extend("\u{38c}\"\ntcp_address\t= B\\\\E1\nmax__\"\\\"\"\"\"".as_bytes());
    std::fs::write(&cfg, &text).unwrap();
    let err = common::nsqd_startup_failure(&[&format!("--config={}", cfg.display())]);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(&format!(
            "FATAL: failed to load config file {} - toml: line 1: invalid escape sequence",
            cfg.display()
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
