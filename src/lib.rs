//! A thread-per-core, shared-nothing drop-in replacement for nsqd.
//!
//! This crate holds the edges: the command line ([`config`]), the protocol V2 codec
//! ([`protocol`]), the TCP and HTTP servers ([`tcp`], [`http`]), /stats rendering and the
//! runtime that starts one pinned glommio executor per shard ([`runtime`]). The broker
//! core (topics, channels, in-flight and deferred heaps, the mesh messages) lives in the
//! `nsq-shards` crate.

pub mod auth;
pub mod config;
pub mod config_file;
pub mod http;
pub mod import_nsqd;
pub mod logger;
pub mod lookupd_client;
pub mod metrics;
pub mod preflight;
pub mod runtime;
pub mod server;
pub mod stats_render;
pub mod statsd;
pub mod tcp;
/// Go time formats, from the wire crate.
pub use nsq_wire::timefmt;
pub mod tls;
