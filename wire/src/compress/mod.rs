//! Stream compression negotiated by IDENTIFY (nsqd: nsqd/protocol_v2.go upgradeSnappy /
//! upgradeDeflate): the snappy framing format and raw DEFLATE, both incremental and pure.

pub mod deflate;
pub mod snappy;
