//! nsqd's log line format on stderr (`[nsqd] 2026/11/29 19:39:41.709417 INFO: message`):
//! the one logger nsqd and nsqlookupd share, in the wire crate.

pub use nsq_wire::logger::{init, parse_level};
