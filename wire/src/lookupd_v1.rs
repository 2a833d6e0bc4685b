//! nsqlookupd's TCP protocol V1, both sides, pure (nsqlookupd: lookup_protocol_v1.go;
//! nsqd: lookup_peer.go, lookup.go). The server (lookupd/src/protocol_v1.rs) and nsqd's
//! client (src/lookupd_client.rs) do the I/O.
//!
//! ```text
//! client: "  V1"                                  magic, once
//! client: PING\n                                  -> OK
//! client: IDENTIFY\n[int32 size][JSON]            -> JSON about this lookupd
//! client: REGISTER <topic> [<channel>]\n          -> OK
//! client: UNREGISTER <topic> [<channel>]\n        -> OK
//! server: [int32 size][data]                      every response; no frame type
//! ```

use crate::errors::{E_BAD_CHANNEL, E_BAD_TOPIC, E_INVALID};
use crate::gojson;
use crate::names::{is_valid_channel_name, is_valid_topic_name};
use std::collections::BTreeMap;

/// The 4-byte magic a V1 client sends first.
pub const MAGIC_V1: &[u8; 4] = b"  V1";

/// The PING command line.
pub const PING: &[u8] = b"PING\n";

/// The largest response nsqd's client accepts, bytes.
pub const MAX_RESPONSE: usize = 5 * 1024 * 1024;

/// A fatal client error: `code` and `desc` go on the wire as `"<code> <desc>"`; `parent`
/// is only logged.
#[derive(Debug)]
pub struct FatalClientErr {
    /// The `E_*` code.
    pub code: &'static str,
    /// The description after the code (bytes: a name the client sent is echoed as sent,
    /// as Go's byte strings are).
    pub desc: Vec<u8>,
    /// The cause, for the log only.
    pub parent: Option<String>,
}

impl FatalClientErr {
    /// An error with no logged cause.
    pub fn new(code: &'static str, desc: impl Into<Vec<u8>>) -> FatalClientErr {
        FatalClientErr {
            code,
            desc: desc.into(),
            parent: None,
        }
    }

    /// Adds the cause that is only logged.
    pub fn with_parent(mut self, parent: impl Into<String>) -> FatalClientErr {
        self.parent = Some(parent.into());
        self
    }

    /// The response payload.
    pub fn wire(&self) -> Vec<u8> {
        [self.code.as_bytes(), b" ", &self.desc].concat()
    }

    /// The response payload as text, for logs.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.wire()).into_owned()
    }
}

/// Appends a response `[int32 size][data]` to `out` (nsq internal/protocol SendResponse).
pub fn write_response(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// A response header announced more than [`MAX_RESPONSE`] bytes (`response too big`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseTooBig;

impl std::fmt::Display for ResponseTooBig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("response too big")
    }
}

impl std::error::Error for ResponseTooBig {}

/// The size of a response from its 4-byte header; an error above [`MAX_RESPONSE`].
pub fn response_len(header: [u8; 4]) -> Result<usize, ResponseTooBig> {
    let n = u32::from_be_bytes(header) as usize;
    if n > MAX_RESPONSE {
        return Err(ResponseTooBig);
    }
    Ok(n)
}

/// Appends `IDENTIFY\n[int32 size][body]` to `out` (the client's first command after the
/// magic).
pub fn write_identify(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(b"IDENTIFY\n");
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

/// The command line `REGISTER <topic>[ <channel>]\n`.
pub fn register_line(topic: &str, channel: Option<&str>) -> String {
    match channel {
        None => format!("REGISTER {topic}\n"),
        Some(c) => format!("REGISTER {topic} {c}\n"),
    }
}

/// The command line `UNREGISTER <topic>[ <channel>]\n`.
pub fn unregister_line(topic: &str, channel: Option<&str>) -> String {
    match channel {
        None => format!("UNREGISTER {topic}\n"),
        Some(c) => format!("UNREGISTER {topic} {c}\n"),
    }
}

/// The IDENTIFY body nsqd sends (nsqd: lookup.go; Go marshals a map, so keys are sorted).
pub fn identify_body(
    broadcast_address: &str,
    hostname: &str,
    http_port: u16,
    tcp_port: u16,
    version: &str,
) -> Vec<u8> {
    let mut m = BTreeMap::new();
    m.insert(
        "broadcast_address",
        serde_json::Value::from(broadcast_address),
    );
    m.insert("hostname", hostname.into());
    m.insert("http_port", http_port.into());
    m.insert("tcp_port", tcp_port.into());
    m.insert("version", version.into());
    crate::json::to_vec_go(&m)
}

/// Go's strings.TrimSpace: Unicode white space (ASCII's, U+0085, U+00A0, U+1680,
/// U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) off both ends of a UTF-8
/// line; bytes that are not UTF-8 stop it.
pub fn trim_space(b: &[u8]) -> &[u8] {
    // The first and last UTF-8 characters of `b`, with their lengths (`None`: the
    // bytes there are not UTF-8, which Go takes as U+FFFD: not a space).
    let first = |b: &[u8]| {
        (1..=b.len().min(4)).find_map(|k| {
            let c = std::str::from_utf8(&b[..k]).ok()?.chars().next()?;
            Some((c, k))
        })
    };
    let last = |b: &[u8]| {
        (1..=b.len().min(4)).find_map(|k| {
            let c = std::str::from_utf8(&b[b.len() - k..])
                .ok()?
                .chars()
                .next()?;
            Some((c, k))
        })
    };
    let mut s = b;
    while let Some((_, k)) = first(s).filter(|(c, _)| c.is_whitespace()) {
        s = &s[k..];
    }
    while let Some((_, k)) = last(s).filter(|(c, _)| c.is_whitespace()) {
        s = &s[..s.len() - k];
    }
    s
}

/// Topic and optional channel of REGISTER/UNREGISTER (nsqlookupd: getTopicChan).
pub fn get_topic_chan(command: &str, params: &[&[u8]]) -> Result<(String, String), FatalClientErr> {
    if params.is_empty() {
        return Err(FatalClientErr::new(
            E_INVALID,
            format!("{command} insufficient number of params"),
        ));
    }
    let topic = String::from_utf8_lossy(params[0]).into_owned();
    let channel = params
        .get(1)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .unwrap_or_default();
    // The name is echoed as sent, bytes that are not UTF-8 included.
    let refuse = |code, what: &str, name: &[u8]| {
        let desc = [
            format!("{command} {what} name '").as_bytes(),
            name,
            b"' is not valid",
        ]
        .concat();
        Err(FatalClientErr::new(code, desc))
    };
    if !is_valid_topic_name(&topic) {
        return refuse(E_BAD_TOPIC, "topic", params[0]);
    }
    if !channel.is_empty() && !is_valid_channel_name(&channel) {
        return refuse(E_BAD_CHANNEL, "channel", params[1]);
    }
    Ok((topic, channel))
}

/// The IDENTIFY fields nsqlookupd keeps.
#[derive(Debug, Default, PartialEq)]
pub struct IdentifyFields {
    /// The peer's hostname.
    pub hostname: String,
    /// The address consumers should use to reach the peer.
    pub broadcast_address: String,
    /// The peer's TCP port.
    pub tcp_port: i64,
    /// The peer's HTTP port.
    pub http_port: i64,
    /// The peer's version.
    pub version: String,
}

/// Decodes an IDENTIFY body like Go's json.Unmarshal into PeerInfo ([`crate::gojson`]):
/// keys match case-insensitively, the last of repeated keys wins, unknown keys and nulls
/// are ignored, a wrong type (a string port, a fractional number) or a non-object is an
/// error (Go's text, for the log).
pub fn decode_identify(body: &[u8]) -> Result<IdentifyFields, gojson::DecodeError> {
    use crate::gojson::{field_for, int_field, string_field};
    // PeerInfo's JSON fields in declaration order.
    const FIELDS: [&str; 6] = [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
    ];
    let mut f = IdentifyFields::default();
    let members = match gojson::object_members(body) {
        Ok(m) => m.unwrap_or_default(),
        Err(gojson::DecodeError::NotObject(kind)) => {
            return Err(gojson::DecodeError::NotObjectOf {
                kind,
                go_type: "nsqlookupd.PeerInfo",
            })
        }
        Err(e) => return Err(e),
    };
    // Go decodes every member and reports the first type error at the end.
    let mut first_err = None;
    for (key, v) in &members {
        let Some(field) = field_for(&FIELDS, key) else {
            continue;
        };
        let r = match field {
            "tcp_port" => int_field(field, v, 64).map(|n| f.tcp_port = n.unwrap_or(f.tcp_port)),
            "http_port" => int_field(field, v, 64).map(|n| f.http_port = n.unwrap_or(f.http_port)),
            _ => string_field(field, v).map(|s| match (field, s) {
                ("hostname", Some(s)) => f.hostname = s,
                ("broadcast_address", Some(s)) => f.broadcast_address = s,
                ("version", Some(s)) => f.version = s,
                _ => {}
            }),
        };
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_decoding() {
        let f = decode_identify(
            br#"{"broadcast_address":"a","TCP_PORT":1,"http_port":2,"version":"v","x":[1]}"#,
        )
        .unwrap();
        assert_eq!(
            (
                f.broadcast_address.as_str(),
                f.tcp_port,
                f.http_port,
                f.version.as_str()
            ),
            ("a", 1, 2, "v")
        );
        assert!(decode_identify(br#"{"tcp_port":"1"}"#).is_err());
        assert!(decode_identify(br#"{"tcp_port":1.5}"#).is_err());
        assert!(decode_identify(b"[]").is_err());
        assert!(decode_identify(b"{").is_err());
        assert_eq!(decode_identify(b"null").unwrap(), IdentifyFields::default());
        // As Go's encoding/json: the last of repeated keys wins (case folded), a null
        // leaves the field, -0 is 0, unpaired surrogates become U+FFFD.
        let f = decode_identify(
            br#"{"tcp_port":1,"TCP_PORT":7,"hostname":"h","hostname":null,"http_port":-0,"version":"\ud800"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                f.tcp_port,
                f.hostname.as_str(),
                f.http_port,
                f.version.as_str()
            ),
            (7, "h", 0, "\u{fffd}")
        );
    }

    #[test]
    fn client_side_bytes() {
        let mut v = MAGIC_V1.to_vec();
        write_identify(&mut v, b"{}");
        v.extend_from_slice(register_line("t", Some("c")).as_bytes());
        v.extend_from_slice(unregister_line("t", None).as_bytes());
        assert_eq!(v, b"  V1IDENTIFY\n\0\0\0\x02{}REGISTER t c\nUNREGISTER t\n");
        let mut r = Vec::new();
        write_response(&mut r, b"OK");
        assert_eq!(r, b"\0\0\0\x02OK");
        assert_eq!(response_len([0, 0, 0, 2]), Ok(2));
        assert!(response_len([0xff, 0, 0, 0]).is_err());
        assert_eq!(
            identify_body("b", "h", 2, 1, "1.3.0"),
            br#"{"broadcast_address":"b","hostname":"h","http_port":2,"tcp_port":1,"version":"1.3.0"}"#
        );
    }

    #[test]
    fn trims() {
        assert_eq!(trim_space(b" \tPING \r\n"), b"PING");
        assert_eq!(trim_space(b"\n"), b"");
        // Unicode white space as Go's unicode.IsSpace (NBSP, LINE SEPARATOR, NEL).
        assert_eq!(trim_space("\u{a0}PING\u{2028}\u{85}\n".as_bytes()), b"PING");
        // Bytes that are not UTF-8 are not space.
        assert_eq!(trim_space(b"\xa0PING\xff \n"), b"\xa0PING\xff");
        assert_eq!(trim_space("\u{3000}".as_bytes()), b"");
    }
}
