//! Client side of protocol V2, pure: encoders for the commands a client sends and a
//! decoder for the frames a server sends. No I/O, no allocation beyond the caller's
//! output buffer (the decoder borrows from its input).
//!
//! ```text
//! client -> server   "  V2", then <NAME>[ <param>]*\n with an optional [int32 len][body]
//! server -> client   [int32 size][int32 type][data], size = 4 + len(data)
//!                    type 0 response, 1 error, 2 message:
//!                    [int64 timestamp ns][uint16 attempts][16-byte id][body]
//! ```
//!
//! Used by the `nsq-bench` load generator and by tests. Every encoder appends to a
//! `Vec<u8>`, so a caller can batch many commands into one `write`.

use crate::frame::{FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2};

/// Appends the protocol magic `"  V2"`.
pub fn encode_magic(out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC_V2);
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_be_bytes());
}

fn put_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `IDENTIFY\n[len][json]`. `json` is the raw JSON object (e.g.
/// `{"heartbeat_interval":30000}`).
pub fn encode_identify(out: &mut Vec<u8>, json: &[u8]) {
    out.extend_from_slice(b"IDENTIFY\n");
    put_len(out, json.len());
    out.extend_from_slice(json);
}

/// `SUB <topic> <channel>\n`.
pub fn encode_sub(out: &mut Vec<u8>, topic: &str, channel: &str) {
    out.extend_from_slice(b"SUB ");
    out.extend_from_slice(topic.as_bytes());
    out.push(b' ');
    out.extend_from_slice(channel.as_bytes());
    out.push(b'\n');
}

/// `RDY <count>\n`.
pub fn encode_rdy(out: &mut Vec<u8>, count: u64) {
    out.extend_from_slice(b"RDY ");
    put_u64(out, count);
    out.push(b'\n');
}

/// `FIN <id>\n`.
pub fn encode_fin(out: &mut Vec<u8>, id: &[u8; 16]) {
    out.extend_from_slice(b"FIN ");
    out.extend_from_slice(id);
    out.push(b'\n');
}

/// `REQ <id> <timeout_ms>\n`.
pub fn encode_req(out: &mut Vec<u8>, id: &[u8; 16], timeout_ms: u64) {
    out.extend_from_slice(b"REQ ");
    out.extend_from_slice(id);
    out.push(b' ');
    put_u64(out, timeout_ms);
    out.push(b'\n');
}

/// `TOUCH <id>\n`.
pub fn encode_touch(out: &mut Vec<u8>, id: &[u8; 16]) {
    out.extend_from_slice(b"TOUCH ");
    out.extend_from_slice(id);
    out.push(b'\n');
}

/// `CLS\n`.
pub fn encode_cls(out: &mut Vec<u8>) {
    out.extend_from_slice(b"CLS\n");
}

/// `NOP\n` (the answer to a heartbeat).
pub fn encode_nop(out: &mut Vec<u8>) {
    out.extend_from_slice(b"NOP\n");
}

/// `PUB <topic>\n[len][body]`.
pub fn encode_pub(out: &mut Vec<u8>, topic: &str, body: &[u8]) {
    out.extend_from_slice(b"PUB ");
    out.extend_from_slice(topic.as_bytes());
    out.push(b'\n');
    put_len(out, body.len());
    out.extend_from_slice(body);
}

/// `DPUB <topic> <defer_ms>\n[len][body]`.
pub fn encode_dpub(out: &mut Vec<u8>, topic: &str, defer_ms: u64, body: &[u8]) {
    out.extend_from_slice(b"DPUB ");
    out.extend_from_slice(topic.as_bytes());
    out.push(b' ');
    put_u64(out, defer_ms);
    out.push(b'\n');
    put_len(out, body.len());
    out.extend_from_slice(body);
}

/// `MPUB <topic>\n[len][int32 n]([int32 size][body])*` from a list of bodies.
pub fn encode_mpub<B: AsRef<[u8]>>(out: &mut Vec<u8>, topic: &str, bodies: &[B]) {
    let mut m = MpubEncoder::begin(out, topic);
    for b in bodies {
        m.push(out, b.as_ref());
    }
    m.finish(out);
}

/// Builds an MPUB in place, so bodies can be written straight into the output buffer
/// (no per-message allocation):
///
/// ```
/// use nsq_wire::client::MpubEncoder;
/// let mut out = Vec::new();
/// let mut m = MpubEncoder::begin(&mut out, "t");
/// m.push(&mut out, b"a");
/// m.push_with(&mut out, 3, |body| body.copy_from_slice(b"xyz"));
/// m.finish(&mut out);
/// ```
#[derive(Debug)]
pub struct MpubEncoder {
    /// Offset of the outer `[int32 len]`.
    len_at: usize,
    count: u32,
}

impl MpubEncoder {
    /// Appends `MPUB <topic>\n` and placeholders for the body length and count.
    pub fn begin(out: &mut Vec<u8>, topic: &str) -> MpubEncoder {
        out.extend_from_slice(b"MPUB ");
        out.extend_from_slice(topic.as_bytes());
        out.push(b'\n');
        let len_at = out.len();
        out.extend_from_slice(&[0; 8]);
        MpubEncoder { len_at, count: 0 }
    }

    /// Appends one message body.
    pub fn push(&mut self, out: &mut Vec<u8>, body: &[u8]) {
        put_len(out, body.len());
        out.extend_from_slice(body);
        self.count += 1;
    }

    /// Appends one message body of `len` bytes, filled in by `fill`.
    pub fn push_with(&mut self, out: &mut Vec<u8>, len: usize, fill: impl FnOnce(&mut [u8])) {
        put_len(out, len);
        let start = out.len();
        out.resize(start + len, 0);
        fill(&mut out[start..]);
        self.count += 1;
    }

    /// Messages pushed so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Patches the body length and message count.
    pub fn finish(self, out: &mut [u8]) {
        let body_len = (out.len() - self.len_at - 4) as u32;
        out[self.len_at..self.len_at + 4].copy_from_slice(&body_len.to_be_bytes());
        out[self.len_at + 4..self.len_at + 8].copy_from_slice(&self.count.to_be_bytes());
    }
}

/// A message frame's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// Publish time, Unix nanoseconds (set by the server).
    pub timestamp_ns: i64,
    /// Delivery attempts, 1 on first delivery.
    pub attempts: u16,
    /// The 16-byte (hex ASCII) message id, as FIN/REQ/TOUCH take it.
    pub id: [u8; 16],
    /// The message body.
    pub body: &'a [u8],
}

/// One server frame, borrowing from the decoder's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Type 0: `OK`, `CLOSE_WAIT`, `_heartbeat_` or JSON.
    Response(&'a [u8]),
    /// Type 1: `"<CODE> <text>"`.
    Error(&'a [u8]),
    /// Type 2.
    Message(Message<'a>),
}

impl Frame<'_> {
    /// A `_heartbeat_` response (answer it with NOP).
    pub fn is_heartbeat(&self) -> bool {
        matches!(self, Frame::Response(b"_heartbeat_"))
    }
}

/// The result of [`decode_frame`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// More bytes are needed; `need` is the total the buffer must hold when known
    /// (the header has arrived), else 8.
    Incomplete {
        /// Bytes the buffer must hold in all.
        need: usize,
    },
    /// A frame and the number of bytes it used.
    Frame(Frame<'a>, usize),
}

/// A malformed frame: the stream cannot be trusted after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// size < 4 (no room for the type).
    BadSize(i32),
    /// size above the caller's limit.
    TooBig(usize),
    /// A type other than 0, 1, 2.
    BadType(u32),
    /// A message frame shorter than its 26-byte header.
    ShortMessage(usize),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadSize(n) => write!(f, "bad frame size {n}"),
            FrameError::TooBig(n) => write!(f, "frame too big ({n} bytes)"),
            FrameError::BadType(t) => write!(f, "bad frame type {t}"),
            FrameError::ShortMessage(n) => write!(f, "message frame too short ({n} bytes)"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Message frame header: timestamp (8) + attempts (2) + id (16).
pub const MESSAGE_HEADER: usize = 26;

/// Default frame size limit for [`decode_frame`]: max-body-size-ish plus headers.
pub const DEFAULT_MAX_FRAME: usize = 64 * 1024 * 1024;

/// Decodes the first frame of `buf` (frames larger than [`DEFAULT_MAX_FRAME`] are
/// refused).
pub fn decode_frame(buf: &[u8]) -> Result<Decoded<'_>, FrameError> {
    decode_frame_limited(buf, DEFAULT_MAX_FRAME)
}

/// Decodes the first frame of `buf`; a frame whose size field exceeds `max` is an error.
pub fn decode_frame_limited(buf: &[u8], max: usize) -> Result<Decoded<'_>, FrameError> {
    if buf.len() < 4 {
        return Ok(Decoded::Incomplete { need: 8 });
    }
    let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if size < 4 {
        return Err(FrameError::BadSize(size));
    }
    let size = size as usize;
    if size > max {
        return Err(FrameError::TooBig(size));
    }
    let total = 4 + size;
    if buf.len() < total {
        return Ok(Decoded::Incomplete { need: total });
    }
    let ftype = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let data = &buf[8..total];
    let frame = match ftype {
        FRAME_RESPONSE => Frame::Response(data),
        FRAME_ERROR => Frame::Error(data),
        FRAME_MESSAGE => {
            if data.len() < MESSAGE_HEADER {
                return Err(FrameError::ShortMessage(data.len()));
            }
            let mut ts = [0u8; 8];
            ts.copy_from_slice(&data[..8]);
            let mut id = [0u8; 16];
            id.copy_from_slice(&data[10..26]);
            Frame::Message(Message {
                timestamp_ns: i64::from_be_bytes(ts),
                attempts: u16::from_be_bytes([data[8], data[9]]),
                id,
                body: &data[MESSAGE_HEADER..],
            })
        }
        t => return Err(FrameError::BadType(t)),
    };
    Ok(Decoded::Frame(frame, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v2::{decode, ClientState, Command, Context, Limits};

    fn ctx(state: ClientState) -> Context {
        Context {
            state,
            heartbeats_enabled: true,
            limits: Limits::NSQD_DEFAULTS,
            eof: false,
        }
    }

    /// Every encoder's output is what the server-side decoder expects.
    fn server_decodes(buf: &[u8], state: ClientState) -> Command {
        let (cmd, used) = decode(buf, &ctx(state)).unwrap().unwrap();
        assert_eq!(used, buf.len(), "decoder consumed the whole command");
        cmd
    }

    #[test]
    fn magic() {
        let mut out = Vec::new();
        encode_magic(&mut out);
        assert_eq!(out, b"  V2");
    }

    #[test]
    fn identify() {
        let mut out = Vec::new();
        encode_identify(&mut out, br#"{"a":1}"#);
        assert_eq!(out, b"IDENTIFY\n\x00\x00\x00\x07{\"a\":1}");
        match server_decodes(&out, ClientState::Init) {
            Command::Identify { body } => assert_eq!(&out[body], br#"{"a":1}"#),
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn sub_rdy_fin_req_touch_cls_nop() {
        let mut out = Vec::new();
        encode_sub(&mut out, "t", "c#ephemeral");
        assert_eq!(out, b"SUB t c#ephemeral\n");
        assert_eq!(
            server_decodes(&out, ClientState::Init),
            Command::Sub {
                topic: "t".into(),
                channel: "c#ephemeral".into()
            }
        );
        for n in [0u64, 1, 9, 10, 2500] {
            out.clear();
            encode_rdy(&mut out, n);
            assert_eq!(out, format!("RDY {n}\n").as_bytes());
            assert_eq!(
                server_decodes(&out, ClientState::Subscribed),
                Command::Rdy { count: n as i64 }
            );
        }
        out.clear();
        encode_rdy(&mut out, u64::MAX);
        assert_eq!(out, format!("RDY {}\n", u64::MAX).as_bytes());
        let id = *b"0123456789abcdef";
        out.clear();
        encode_fin(&mut out, &id);
        assert_eq!(out, b"FIN 0123456789abcdef\n");
        assert_eq!(
            server_decodes(&out, ClientState::Subscribed),
            Command::Fin { id }
        );
        out.clear();
        encode_req(&mut out, &id, 1500);
        assert_eq!(
            server_decodes(&out, ClientState::Subscribed),
            Command::Req {
                id,
                timeout_ms: 1500
            }
        );
        out.clear();
        encode_touch(&mut out, &id);
        assert_eq!(
            server_decodes(&out, ClientState::Subscribed),
            Command::Touch { id }
        );
        out.clear();
        encode_cls(&mut out);
        assert_eq!(server_decodes(&out, ClientState::Subscribed), Command::Cls);
        out.clear();
        encode_nop(&mut out);
        assert_eq!(out, b"NOP\n");
        assert_eq!(server_decodes(&out, ClientState::Init), Command::Nop);
    }

    #[test]
    fn fins_batch_in_one_buffer() {
        let mut out = Vec::new();
        let ids = [*b"000000000000000a", *b"000000000000000b"];
        for id in &ids {
            encode_fin(&mut out, id);
        }
        let (c1, n1) = decode(&out, &ctx(ClientState::Subscribed))
            .unwrap()
            .unwrap();
        let (c2, n2) = decode(&out[n1..], &ctx(ClientState::Subscribed))
            .unwrap()
            .unwrap();
        assert_eq!(c1, Command::Fin { id: ids[0] });
        assert_eq!(c2, Command::Fin { id: ids[1] });
        assert_eq!(n1 + n2, out.len());
    }

    #[test]
    fn publish_commands() {
        let mut out = Vec::new();
        encode_pub(&mut out, "top", b"hello");
        assert_eq!(out, b"PUB top\n\x00\x00\x00\x05hello");
        match server_decodes(&out, ClientState::Init) {
            Command::Pub { topic, body } => {
                assert_eq!(topic, "top");
                assert_eq!(&out[body], b"hello");
            }
            c => panic!("{c:?}"),
        }
        out.clear();
        encode_dpub(&mut out, "top", 2500, b"x");
        assert_eq!(out, b"DPUB top 2500\n\x00\x00\x00\x01x");
        match server_decodes(&out, ClientState::Init) {
            Command::Dpub {
                topic,
                defer_ms,
                body,
            } => {
                assert_eq!((topic.as_str(), defer_ms), ("top", 2500));
                assert_eq!(&out[body], b"x");
            }
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn mpub() {
        let mut out = Vec::new();
        encode_mpub(&mut out, "t", &[&b"ab"[..], b"c"]);
        let expected: &[u8] =
            b"MPUB t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x02ab\x00\x00\x00\x01c";
        assert_eq!(out, expected);
        match server_decodes(&out, ClientState::Init) {
            Command::Mpub { topic, bodies } => {
                assert_eq!(topic, "t");
                let got: Vec<&[u8]> = bodies.into_iter().map(|r| &out[r]).collect();
                assert_eq!(got, vec![&b"ab"[..], b"c"]);
            }
            c => panic!("{c:?}"),
        }
        // The in-place builder gives the same bytes, after existing data.
        let mut out2 = b"NOP\n".to_vec();
        let mut m = MpubEncoder::begin(&mut out2, "t");
        m.push_with(&mut out2, 2, |b| b.copy_from_slice(b"ab"));
        m.push(&mut out2, b"c");
        assert_eq!(m.count(), 2);
        m.finish(&mut out2);
        assert_eq!(&out2[4..], expected);
    }

    fn frame(ftype: u32, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        crate::frame::write_frame(&mut v, ftype, data);
        v
    }

    #[test]
    fn decode_response_and_error() {
        let f = frame(FRAME_RESPONSE, b"OK");
        assert_eq!(
            decode_frame(&f),
            Ok(Decoded::Frame(Frame::Response(b"OK"), 10))
        );
        let f = frame(FRAME_RESPONSE, b"_heartbeat_");
        match decode_frame(&f).unwrap() {
            Decoded::Frame(fr, _) => assert!(fr.is_heartbeat()),
            d => panic!("{d:?}"),
        }
        let f = frame(FRAME_ERROR, b"E_INVALID x");
        assert_eq!(
            decode_frame(&f),
            Ok(Decoded::Frame(Frame::Error(b"E_INVALID x"), f.len()))
        );
        // Empty data is a valid frame.
        let f = frame(FRAME_RESPONSE, b"");
        assert_eq!(
            decode_frame(&f),
            Ok(Decoded::Frame(Frame::Response(b""), 8))
        );
    }

    #[test]
    fn decode_message() {
        let mut data = Vec::new();
        data.extend_from_slice(&1_700_000_000_123_456_789i64.to_be_bytes());
        data.extend_from_slice(&3u16.to_be_bytes());
        data.extend_from_slice(b"18ad4a3bed269000");
        data.extend_from_slice(b"body!");
        let f = frame(FRAME_MESSAGE, &data);
        assert_eq!(f.len(), 8 + 26 + 5);
        let Decoded::Frame(Frame::Message(m), used) = decode_frame(&f).unwrap() else {
            panic!()
        };
        assert_eq!(used, f.len());
        assert_eq!(m.timestamp_ns, 1_700_000_000_123_456_789);
        assert_eq!(m.attempts, 3);
        assert_eq!(&m.id, b"18ad4a3bed269000");
        assert_eq!(m.body, b"body!");
    }

    #[test]
    fn decode_incomplete_at_every_split() {
        let mut stream = frame(FRAME_RESPONSE, b"OK");
        let mut data = vec![0u8; 26];
        data.extend_from_slice(b"xyz");
        stream.extend(frame(FRAME_MESSAGE, &data));
        let first = 10;
        for cut in 0..first {
            match decode_frame(&stream[..cut]).unwrap() {
                Decoded::Incomplete { need } => assert!(need > cut),
                d => panic!("cut {cut}: {d:?}"),
            }
        }
        assert_eq!(
            decode_frame(&stream[..4]),
            Ok(Decoded::Incomplete { need: 10 })
        );
        // Two frames back to back.
        let Decoded::Frame(_, n) = decode_frame(&stream).unwrap() else {
            panic!()
        };
        assert_eq!(n, first);
        for cut in n..stream.len() {
            assert!(matches!(
                decode_frame(&stream[n..cut]).unwrap(),
                Decoded::Incomplete { .. }
            ));
        }
        let Decoded::Frame(Frame::Message(m), n2) = decode_frame(&stream[n..]).unwrap() else {
            panic!()
        };
        assert_eq!(n + n2, stream.len());
        assert_eq!(m.body, b"xyz");
    }

    #[test]
    fn decode_errors() {
        assert_eq!(
            decode_frame(&[0, 0, 0, 3, 0, 0, 0, 0]),
            Err(FrameError::BadSize(3))
        );
        assert_eq!(
            decode_frame(&[0xff, 0xff, 0xff, 0xff]),
            Err(FrameError::BadSize(-1))
        );
        assert_eq!(decode_frame(&frame(7, b"x")), Err(FrameError::BadType(7)));
        assert_eq!(
            decode_frame(&frame(FRAME_MESSAGE, &[0; 25])),
            Err(FrameError::ShortMessage(25))
        );
        assert_eq!(
            decode_frame_limited(&[0, 0, 1, 0], 255),
            Err(FrameError::TooBig(256))
        );
    }
}
