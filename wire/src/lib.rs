//! NSQ's wire formats with no runtime: bytes in, values out, and back. No I/O, no async,
//! no executor, no broker state. The broker core `nsq-shards`, `nsqd`, `nsqlookupd`,
//! `nsq-bench` and the fuzz targets depend on this one, never the reverse (the segment
//! store `nsq-storage` needs neither).
//!
//! | module | what | nsq / go-nsq source |
//! |---|---|---|
//! | [`v2`] | protocol V2 server-side command codec | nsqd/protocol_v2.go |
//! | [`frame`] | response / error / message frames | internal/protocol, nsqd/message.go |
//! | [`client`] | protocol V2 client-side encoders and frame decoder | go-nsq/command.go, go-nsq/protocol.go |
//! | [`identify`] | IDENTIFY body, validation and reply | nsqd/protocol_v2.go, nsqd/client_v2.go |
//! | [`compress`] | snappy framing, raw DEFLATE | nsqd/protocol_v2.go upgradeSnappy/upgradeDeflate |
//! | [`names`] | topic and channel names | internal/protocol/names.go |
//! | [`duration`] | Go durations | Go time.ParseDuration, Duration.String |
//! | [`errors`] | broker errors to `E_*` codes | nsqd/protocol_v2.go |
//! | [`lookupd_v1`] | nsqlookupd's TCP protocol V1 | nsqlookupd/lookup_protocol_v1.go, nsqd/lookup_peer.go |
//! | [`json`] | JSON strings escaped as Go's encoding/json | Go encoding/json |
//! | [`timefmt`] | HTTP dates, RFC 3339, log stamps | Go time.Format |
//! | [`gobufio`] | where a Go server's read buffer stands (FIN or reset at a close) | Go bufio |
//! | [`gojson`] | JSON objects decoded into flat structs as Go's encoding/json | Go encoding/json |
//! | [`goflag`] | `-long-flag` command lines | Go flag |
//! | [`http1`] | HTTP/1.1 status lines, headers, queries, paths | internal/http_api |
//! | [`logger`] | the log line format nsqd and nsqlookupd share | internal/lg |

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod client;
pub mod compress;
pub mod duration;
pub mod errors;
pub mod frame;
pub mod gobufio;
pub mod goflag;
pub mod gojson;
pub mod http1;
pub mod identify;
pub mod json;
pub mod logger;
pub mod lookupd_v1;
pub mod names;
pub mod timefmt;
pub mod v2;
