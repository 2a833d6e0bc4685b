//! A thread-per-core, shared-nothing drop-in replacement for nsqd.
//!
//! This crate holds the process and its edges: the command line and config file
//! ([`config`], [`config_file`]), the host checks before start-up ([`preflight`]), the
//! runtime that starts one glommio executor per shard (pinned to a CPU), connects the
//! shard mesh and handles signals ([`runtime`], [`mesh`]), the accept loops and per-shard server context
//! ([`server`]), protocol V2 connections ([`tcp`]: reader, commands, writer, hand-off
//! between shards, TLS and compression streams; the TLS configuration in [`tls`]), the
//! HTTP API and the live shard page ([`http`]), AUTH ([`auth`]; name lookups and other
//! blocking work off the shard threads in [`dns`] and [`offload`]), the registration
//! with nsqlookupd ([`lookupd_client`]), /stats, statsd and /metrics ([`stats`]), the
//! one-time import of an nsqd data path ([`import_nsqd`]), handing free heap back to the
//! OS ([`memory`]) and nsqd's log format ([`logger`]). The owner-side path every
//! publish and admin operation takes, local or forwarded from another shard, is
//! [`owner`]; dead-letter topics are [`dead_letter`]; replication across brokers
//! (the member connections, each topic's Raft group on its shard, the relay of a
//! follower's consumers) is [`cluster`], over the `nsq-replication` crate.
//!
//! The wire formats (the protocol V2 codec, IDENTIFY, compression, names, Go durations,
//! the lookupd V1 codec, HTTP/1.1 pieces) live in the runtime-free `nsq-wire` crate; the
//! broker core (topics, channels, in-flight and deferred heaps, clients, the mesh
//! messages, recovery and checkpoints) in `nsq-shards`; the segment store in
//! `nsq-storage`; the replicated log (raft-rs groups, entries, frames) in
//! `nsq-replication`; nsqlookupd in the `nsqlookupd` crate (lookupd/).

pub mod auth;
pub mod cluster;
pub mod config;
pub mod config_file;
pub mod dead_letter;
pub mod dns;
pub mod http;
pub mod import_nsqd;
pub mod logger;
pub mod lookupd_client;
pub mod memory;
pub mod mesh;
pub mod offload;
pub mod owner;
pub mod preflight;
pub mod runtime;
pub mod server;
pub mod stats;
pub mod tcp;
/// Go time formats, from the wire crate.
pub use nsq_wire::timefmt;

/// What `nsqd --version` prints after `nsqd ` and the start-up log line names: the nsqd
/// version this broker is compatible with, in nsqd's own form (`v1.3.0 (built w/go1.x)`
/// there), then this build: the nsqd-rs package version and the git commit it was built
/// from (`unknown` outside a git checkout; see build.rs).
pub const BUILD_VERSION: &str = concat!(
    "v1.3.0 (built w/rust; nsqd-rs ",
    env!("CARGO_PKG_VERSION"),
    ", commit ",
    env!("NSQD_RS_COMMIT"),
    ")"
);
pub mod tls;
