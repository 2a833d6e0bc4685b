//! Protocol V2 frames, server to client (nsqd: internal/protocol/protocol.go SendFramedResponse,
//! nsqd/message.go WriteTo).
//!
//! ```text
//! [int32 size][int32 type][data]          size = 4 + len(data), big-endian
//!   type 0 response, 1 error, 2 message
//! message data: [int64 timestamp ns][uint16 attempts][16-byte hex id][body]
//! ```

/// The 4-byte protocol magic a V2 client sends first.
pub const MAGIC_V2: &[u8; 4] = b"  V2";

/// Frame type of a response (`OK`, `_heartbeat_`, the IDENTIFY JSON).
pub const FRAME_RESPONSE: u32 = 0;
/// Frame type of an error (`E_INVALID ...`).
pub const FRAME_ERROR: u32 = 1;
/// Frame type of a message.
pub const FRAME_MESSAGE: u32 = 2;

/// Bytes a message frame adds on top of its body: size, type, timestamp, attempts, id.
pub const MESSAGE_FRAME_OVERHEAD: usize = 4 + 4 + 8 + 2 + 16;

/// Appends a frame of `frame_type` carrying `data` (size prefix included) to `out`.
pub fn write_frame(out: &mut Vec<u8>, frame_type: u32, data: &[u8]) {
    out.extend_from_slice(&((data.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(&frame_type.to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends a complete message frame (size prefix included) to `out`: `timestamp` is the
/// publish time in Unix ns, `attempts` the delivery count, `id` the 16 hex digits.
pub fn write_message_frame(
    out: &mut Vec<u8>,
    timestamp: i64,
    attempts: u16,
    id: &[u8; 16],
    body: &[u8],
) {
    let size = (MESSAGE_FRAME_OVERHEAD - 4 + body.len()) as u32;
    out.reserve(MESSAGE_FRAME_OVERHEAD + body.len());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&FRAME_MESSAGE.to_be_bytes());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&attempts.to_be_bytes());
    out.extend_from_slice(id);
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_frame() {
        let mut v = Vec::new();
        write_frame(&mut v, FRAME_RESPONSE, b"OK");
        assert_eq!(v, b"\0\0\0\x06\0\0\0\0OK");
    }

    #[test]
    fn message_frame_matches_capture() {
        // From a real nsqd 1.3.0 transcript: body "hello", attempts 1.
        let mut out = Vec::new();
        write_message_frame(
            &mut out,
            1795981184279709710,
            1,
            b"18ad4a3bed269000",
            b"hello",
        );
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "000000230000000218ec9b5f2047080e00013138616434613362656432363930303068656c6c6f"
        );
    }
}
