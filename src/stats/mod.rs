//! Stats of the whole node, gathered from every shard through the mesh
//! (`nsq_shards::stats`) and shown four ways:
//!
//! - [`render`]: `GET /stats` as JSON or text (nsqd: http.go doStats, printStats),
//! - [`statsd`]: pushes to statsd (nsqd: statsd.go),
//! - [`prometheus`]: `GET /metrics` in the Prometheus text format (beyond nsqd),
//! - [`process`]: the process's CPU, memory and file descriptors from /proc, read in
//!   one place for all three.

pub mod process;
pub mod prometheus;
pub mod render;
pub mod statsd;
