//! The integration tests of the `nsqd` package, as one test binary (`cargo test -p nsqd
//! --test it`): one module per area, all sharing the harness in [`common`] (it starts the
//! real `nsqd` and `nsqlookupd` binaries as child processes). One binary links once
//! instead of once per file; a test runs by its module path, e.g. `cargo test -p nsqd
//! --test it -- durability::` or `-- --exact tls::tls_then_snappy`.
//!
//! The tests of every module run in one process, in parallel: a test must not change
//! process-wide state (environment, resource limits, signal dispositions, working
//! directory). One that needs to (a raised RLIMIT_NOFILE and nearly every descriptor of
//! the process) runs its body in a child process of its own ([`common::in_own_process`]);
//! limits for the broker are set in the broker's process (`pre_exec`, `prlimit`).

mod common;

mod auth;
mod channel_lag;
mod client_error_logs;
mod cluster;
mod config_file;
mod conformance_http_connection;
mod conformance_http_pub;
mod conformance_http_router;
mod conformance_http_stats;
mod conformance_identify;
mod conformance_protocol;
mod conformance_pub;
mod conformance_sub;
mod conformance_timeouts;
mod conformance_topics;
mod crash_attempts;
mod dead_letters;
mod descriptors;
mod disk_faults;
mod disk_full;
mod drain;
mod durability;
mod durable_changes;
mod e2e_latency;
mod exhaustion;
mod fast_start;
mod flags;
mod harness;
mod http_admin;
mod http_config;
mod http_page;
mod import_nsqd;
mod inspect_messages;
mod lookup_channels;
mod lookup_registration;
mod offline_damage;
mod preflight;
mod rate_limits;
mod replay_seek;
mod robustness_aborted_connections;
mod robustness_malformed;
mod robustness_sizes;
mod robustness_slow_clients;
mod robustness_truncated;
mod sd_notify;
mod shard_placement;
mod slow_disk;
mod startup;
mod stats_filters;
mod statsd_metrics;
mod timers_idle_channels;
mod tls;
mod tokio_nsq_client;
mod topology;
