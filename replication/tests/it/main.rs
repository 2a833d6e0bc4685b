//! nsq-replication's tests: the codecs, and replication groups on a simulated network
//! (sim.rs), driven by ticks with seeded faults.
#![allow(clippy::unwrap_used)]

mod codec;
mod groups;
mod property;
mod sim;
