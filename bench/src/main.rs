//! nsq-bench: a load generator for nsqd-compatible brokers, speaking TCP protocol V2.
//!
//! Plain OS threads with blocking sockets: each producer is a writer thread (MPUB batches
//! built in one reused buffer, up to --pipeline writes in flight) plus a reader thread
//! matching OKs; each consumer is one thread reading 1 MiB at a time and FINishing all
//! the messages of a read with one write. Nothing is allocated per message.
//!
//! Every body starts with a 24-byte header `[u64 publish unix ns][u64 seq][u32 producer]
//! [u32 run id]` (big-endian). In pubsub mode consumers mark (producer, seq) in a bitmap
//! per channel, so the end report gives exact lost and duplicate counts.

#![forbid(unsafe_code)]

mod args;
mod body;
mod conn;
mod consumer;
mod producer;
mod publish;
mod pubsub;
mod report;
mod run;
mod schedule;
mod subscribe;
mod tls;

use args::Args;
pub use body::{new_hist, now_unix_ns, read_header, write_header, HEADER};
use clap::Parser;
pub use conn::{connect_stream, Shared};

fn main() {
    let mut args = Args::parse();
    args.normalize();
    if let Err(e) = args.validate() {
        eprintln!("nsq-bench: {e}");
        std::process::exit(2);
    }
    std::process::exit(run::run(args));
}
