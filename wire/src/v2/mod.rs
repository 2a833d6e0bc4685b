//! Protocol V2 server-side codec (nsqd: nsqd/protocol_v2.go), pure: bytes in, commands
//! or errors out. No I/O, no async, no broker state. The frames it answers with are
//! [`crate::frame`]'s (re-exported here).
//!
//! ```text
//! client -> server   "  V2" once, then commands:
//!                    <NAME>[ <param>]*\n                       (one trailing \r removed)
//!                    IDENTIFY\n[int32 len][JSON]   PUB <t>\n[int32 len][body]
//!                    MPUB <t>\n[int32 len][int32 n]([int32 len][body])*
//!                    DPUB <t> <ms>\n[int32 len][body]   AUTH\n[int32 len][secret]
//! server -> client   [int32 size][int32 type: 0 response | 1 error | 2 message][data]
//! ```
//!
//! `decode` checks things in nsqd's order: the state machine, parameter counts, names,
//! then body sizes before the body is read, so an error is answered as soon as nsqd would
//! answer it, without waiting for (or allocating) a body that will never be used.

use crate::errors::{E_BAD_BODY, E_BAD_CHANNEL, E_BAD_MESSAGE, E_BAD_TOPIC, E_INVALID};
use crate::names::{is_valid_channel_name, is_valid_topic_name};
use serde::{Deserialize, Serialize};
use std::ops::Range;

pub use crate::frame::{write_frame, FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, MAGIC_V2};

/// nsqd's client states (nsqd: protocol_v2.go stateInit / stateSubscribed /
/// stateClosing), as shown in /stats (`state`). V2 clients use 0, 3 and 4 only; the
/// codec checks commands against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientState {
    /// Connected, not subscribed (stateInit).
    Init = 0,
    /// After SUB (stateSubscribed).
    Subscribed = 3,
    /// After CLS (stateClosing).
    Closing = 4,
}

/// nsqd's bufio reader size: a command line must fit in it.
pub const MAX_LINE: usize = 16 * 1024;

/// Limits `decode` enforces (nsqd flags).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// --max-msg-size, bytes.
    pub max_msg_size: i64,
    /// --max-body-size, bytes.
    pub max_body_size: i64,
    /// --max-rdy-count.
    pub max_rdy_count: i64,
    /// --max-req-timeout in ms.
    pub max_req_timeout_ms: i64,
}

impl Limits {
    /// nsqd 1.3.0's defaults: `--max-msg-size` 1 MiB, `--max-body-size` 5 MiB,
    /// `--max-rdy-count` 2500, `--max-req-timeout` 1h.
    pub const NSQD_DEFAULTS: Limits = Limits {
        max_msg_size: 1024 * 1024,
        max_body_size: 5 * 1024 * 1024,
        max_rdy_count: 2500,
        max_req_timeout_ms: 3_600_000,
    };
}

impl Default for Limits {
    /// [`Limits::NSQD_DEFAULTS`].
    fn default() -> Self {
        Limits::NSQD_DEFAULTS
    }
}

/// What `decode` needs to know about the connection.
#[derive(Clone, Copy, Debug)]
pub struct Context {
    /// The connection's state (which commands are allowed).
    pub state: ClientState,
    /// Heartbeats are on (IDENTIFY heartbeat_interval != -1): RDY/FIN/... are checked
    /// against them as nsqd does.
    pub heartbeats_enabled: bool,
    /// The broker's size and count limits.
    pub limits: Limits,
    /// The peer closed its side: a body that cannot complete is a "failed to read" error.
    pub eof: bool,
}

/// One decoded command. Byte ranges index the buffer given to `decode`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `IDENTIFY\n[int32 len][JSON]`.
    Identify {
        /// The JSON body.
        body: Range<usize>,
    },
    /// `AUTH\n[int32 len][secret]`.
    Auth {
        /// The secret.
        body: Range<usize>,
    },
    /// `SUB <topic> <channel>\n`, names already validated.
    Sub {
        /// The topic name.
        topic: String,
        /// The channel name.
        channel: String,
    },
    /// RDY count, already range-checked.
    Rdy {
        /// 0..=--max-rdy-count.
        count: i64,
    },
    /// RDY while closing: nsqd ignores it.
    RdyIgnored,
    /// `FIN <id>\n`.
    Fin {
        /// The 16-byte hex message id.
        id: [u8; 16],
    },
    /// REQ with its timeout in ms as given (clamping is the caller's job, nsqd logs it).
    Req {
        /// The 16-byte hex message id.
        id: [u8; 16],
        /// Requeue delay, ms, as sent.
        timeout_ms: i64,
    },
    /// `TOUCH <id>\n`.
    Touch {
        /// The 16-byte hex message id.
        id: [u8; 16],
    },
    /// `CLS\n`: start closing.
    Cls,
    /// `NOP\n`.
    Nop,
    /// `PUB <topic>\n[int32 len][body]`.
    Pub {
        /// The topic name.
        topic: String,
        /// The message body.
        body: Range<usize>,
    },
    /// `MPUB <topic>\n[int32 len][int32 n]([int32 len][body])*`.
    Mpub {
        /// The topic name.
        topic: String,
        /// Each message body, in order.
        bodies: Vec<Range<usize>>,
    },
    /// `DPUB <topic> <ms>\n[int32 len][body]`.
    Dpub {
        /// The topic name.
        topic: String,
        /// Deferral, ms, within 0..=--max-req-timeout.
        defer_ms: i64,
        /// The message body.
        body: Range<usize>,
    },
}

/// A protocol error: the frame `"<code> <text>"`, always fatal here (the non-fatal
/// E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED come from the broker, not the codec).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError {
    /// The NSQ error code (`E_INVALID`, `E_BAD_TOPIC`, ...); empty when silent.
    pub code: &'static str,
    /// The text after the code.
    pub text: String,
    /// Close without an error frame (nsqd: a read failure such as an over-long line).
    pub silent: bool,
    /// MPUB creates its topic before reading the body; a body error still leaves the
    /// topic created.
    pub creates_topic: Option<String>,
    /// The text's exact bytes when they are not UTF-8 (nsqd echoes a client's bytes as
    /// sent, e.g. in `E_INVALID invalid command <name>`); `text` is then lossy.
    pub raw_text: Option<Vec<u8>>,
}

impl ProtocolError {
    /// An error frame `"<code> <text>"`.
    pub fn new(code: &'static str, text: impl Into<String>) -> ProtocolError {
        ProtocolError {
            code,
            text: text.into(),
            silent: false,
            creates_topic: None,
            raw_text: None,
        }
    }

    fn silent() -> ProtocolError {
        ProtocolError {
            code: "",
            text: String::new(),
            silent: true,
            creates_topic: None,
            raw_text: None,
        }
    }

    /// The error frame's data: `"<code> <text>"`, with the text's exact bytes.
    pub fn frame_data(&self) -> Vec<u8> {
        let mut out = format!("{} ", self.code).into_bytes();
        match &self.raw_text {
            Some(raw) => out.extend_from_slice(raw),
            None => out.extend_from_slice(self.text.as_bytes()),
        }
        out
    }
}

fn invalid(text: impl Into<String>) -> ProtocolError {
    ProtocolError::new(E_INVALID, text)
}

/// `Ok(Some((command, bytes consumed)))`, `Ok(None)` when more bytes are needed, or the
/// error nsqd sends.
pub type Decoded = Result<Option<(Command, usize)>, ProtocolError>;

/// Go's `%q` of a byte string, as nsqd's error texts quote names.
pub fn go_quote(b: &[u8]) -> String {
    let mut out = String::from("\"");
    let mut rest = b;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                quote_str(s, &mut out);
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                quote_str(std::str::from_utf8(good).unwrap_or(""), &mut out);
                out.push_str(&format!("\\x{:02x}", bad[0]));
                rest = &bad[1..];
            }
        }
    }
    out.push('"');
    out
}

fn quote_str(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if !go_printable(c) => {
                if (c as u32) <= 0xffff {
                    out.push_str(&format!("\\u{:04x}", c as u32))
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32))
                }
            }
            c => out.push(c),
        }
    }
}

/// Go's strconv.IsPrint (what `%q` writes as itself): letters, marks, numbers,
/// punctuation, symbols and the ASCII space; not other spaces, line and paragraph
/// separators, controls, format characters, private use or unassigned code points
/// (by Unicode 16's tables, where Go 1.19 has Unicode 13's: characters assigned since
/// print as themselves here).
fn go_printable(c: char) -> bool {
    use unicode_general_category::{get_general_category, GeneralCategory as G};
    c == ' '
        || !matches!(
            get_general_category(c),
            G::Control
                | G::Format
                | G::Surrogate
                | G::PrivateUse
                | G::Unassigned
                | G::SpaceSeparator
                | G::LineSeparator
                | G::ParagraphSeparator
        )
}

/// nsqd's `protocol.ByteToBase10`: ASCII digits only (an empty string is 0), wrapping on
/// overflow like Go's uint64 arithmetic.
pub fn byte_to_base10(b: &[u8]) -> Option<u64> {
    let mut n: u64 = 0;
    for &d in b {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.wrapping_mul(10).wrapping_add((d - b'0') as u64);
    }
    Some(n)
}

/// nsqd's `time.Duration(ms) * time.Millisecond` for a parsed (unsigned) count of
/// milliseconds, in ns: Go converts to int64 and multiplies with wrap-around, so a huge
/// count can come out negative, or small (18446744073710 ms is about 448 ms).
pub fn go_ms_duration(ms: u64) -> i64 {
    (ms as i64).wrapping_mul(1_000_000)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Reads a big-endian int32 at `pos`, or says why not.
fn read_i32(buf: &[u8], pos: usize) -> Option<i32> {
    buf.get(pos..pos + 4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Needs `n` more bytes at `pos`: `Ok(None)` (wait) or, at EOF, the given error.
fn need(
    buf: &[u8],
    pos: usize,
    n: usize,
    ctx: &Context,
    err: impl FnOnce() -> ProtocolError,
) -> Result<bool, ProtocolError> {
    if buf.len() >= pos + n {
        Ok(true)
    } else if ctx.eof {
        Err(err())
    } else {
        Ok(false)
    }
}

macro_rules! need {
    ($buf:expr, $pos:expr, $n:expr, $ctx:expr, $err:expr) => {
        if !need($buf, $pos, $n, $ctx, $err)? {
            return Ok(None);
        }
    };
}

/// A sized body after the line: `[int32 len][bytes]` with nsqd's size checks.
/// `prefix` is the command name used in the error texts, `code` the error code for the
/// body-size errors, `max` the limit.
struct BodySpec {
    code: &'static str,
    read_size: &'static str,
    invalid: &'static str,
    too_big: &'static str,
    read_body: &'static str,
    max: i64,
    /// IDENTIFY/AUTH/MPUB check "too big" before "invalid"; PUB/DPUB the other way.
    too_big_first: bool,
}

fn sized_body(
    buf: &[u8],
    pos: usize,
    ctx: &Context,
    s: &BodySpec,
) -> Result<Option<Range<usize>>, ProtocolError> {
    need!(buf, pos, 4, ctx, || ProtocolError::new(s.code, s.read_size));
    let n = read_i32(buf, pos).unwrap_or(0) as i64;
    let too_big = n > s.max;
    let invalid = n <= 0;
    if s.too_big_first && too_big {
        return Err(ProtocolError::new(
            s.code,
            format!("{} {} > {}", s.too_big, n, s.max),
        ));
    }
    if invalid {
        return Err(ProtocolError::new(s.code, format!("{} {}", s.invalid, n)));
    }
    if too_big {
        return Err(ProtocolError::new(
            s.code,
            format!("{} {} > {}", s.too_big, n, s.max),
        ));
    }
    let start = pos + 4;
    need!(buf, start, n as usize, ctx, || ProtocolError::new(
        s.code,
        s.read_body
    ));
    Ok(Some(start..start + n as usize))
}

fn message_id(p: &[u8]) -> Result<[u8; 16], ProtocolError> {
    p.try_into().map_err(|_| invalid("invalid message ID"))
}

/// Where the decoding of an incomplete MPUB stopped, so that the next call (with the
/// same buffer, grown at its end) goes on from there instead of walking every message
/// again: without it an MPUB of many small messages arriving in small reads costs
/// reads x messages (a 5 MB MPUB of 1-byte messages in 2 KiB reads: about 4 s of CPU).
#[derive(Debug, Default, Clone)]
pub struct Resume {
    /// (next message index, its offset in the buffer, the bodies so far).
    mpub: Option<(i64, usize, Vec<Range<usize>>)>,
}

impl Resume {
    /// Forgets the progress (call it when the buffer's start changes: a command was
    /// consumed).
    pub fn clear(&mut self) {
        self.mpub = None;
    }
}

/// Decodes the next command of `buf` (the bytes after the magic).
pub fn decode(buf: &[u8], ctx: &Context) -> Decoded {
    decode_resume(buf, ctx, &mut Resume::default())
}

/// [`decode`] that keeps its progress through an incomplete MPUB in `resume`. The caller
/// passes the same `resume` while `buf` only grows at its end, and clears it once a
/// command is consumed. The result is the same as [`decode`]'s.
pub fn decode_resume(buf: &[u8], ctx: &Context, resume: &mut Resume) -> Decoded {
    let scan = &buf[..buf.len().min(MAX_LINE)];
    let Some(nl) = memchr(b'\n', scan) else {
        if buf.len() >= MAX_LINE {
            return Err(ProtocolError::silent());
        }
        return Ok(None);
    };
    let mut line = &buf[..nl];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    let pos = nl + 1;
    let params: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let name = params[0];
    let state = ctx.state;
    let l = &ctx.limits;
    let one = |c: Command| Ok(Some((c, pos)));
    match name {
        b"IDENTIFY" => {
            if state != ClientState::Init {
                return Err(invalid("cannot IDENTIFY in current state"));
            }
            let spec = BodySpec {
                code: E_BAD_BODY,
                read_size: "IDENTIFY failed to read body size",
                invalid: "IDENTIFY invalid body size",
                too_big: "IDENTIFY body too big",
                read_body: "IDENTIFY failed to read body",
                max: l.max_body_size,
                too_big_first: true,
            };
            Ok(sized_body(buf, pos, ctx, &spec)?.map(|r| {
                let end = r.end;
                (Command::Identify { body: r }, end)
            }))
        }
        b"AUTH" => {
            if state != ClientState::Init {
                return Err(invalid("cannot AUTH in current state"));
            }
            if params.len() != 1 {
                return Err(invalid("AUTH invalid number of parameters"));
            }
            let spec = BodySpec {
                code: E_BAD_BODY,
                read_size: "AUTH failed to read body size",
                invalid: "AUTH invalid body size",
                too_big: "AUTH body too big",
                read_body: "AUTH failed to read body",
                max: l.max_body_size,
                too_big_first: true,
            };
            Ok(sized_body(buf, pos, ctx, &spec)?.map(|r| {
                let end = r.end;
                (Command::Auth { body: r }, end)
            }))
        }
        b"SUB" => {
            if state != ClientState::Init {
                return Err(invalid("cannot SUB in current state"));
            }
            if !ctx.heartbeats_enabled {
                return Err(invalid("cannot SUB with heartbeats disabled"));
            }
            if params.len() < 3 {
                return Err(invalid("SUB insufficient number of parameters"));
            }
            let topic = valid_topic(params[1], E_BAD_TOPIC, "SUB")?;
            let channel = std::str::from_utf8(params[2])
                .ok()
                .filter(|c| is_valid_channel_name(c))
                .ok_or_else(|| {
                    ProtocolError::new(
                        E_BAD_CHANNEL,
                        format!("SUB channel name {} is not valid", go_quote(params[2])),
                    )
                })?;
            one(Command::Sub {
                topic,
                channel: channel.to_string(),
            })
        }
        b"RDY" => {
            if state == ClientState::Closing {
                return one(Command::RdyIgnored);
            }
            if state != ClientState::Subscribed {
                return Err(invalid("cannot RDY in current state"));
            }
            let count = match params.get(1) {
                None => 1,
                Some(p) => byte_to_base10(p)
                    .ok_or_else(|| invalid(format!("RDY could not parse count {}", lossy(p))))?
                    as i64,
            };
            if count < 0 || count > l.max_rdy_count {
                return Err(invalid(format!(
                    "RDY count {} out of range 0-{}",
                    count, l.max_rdy_count
                )));
            }
            one(Command::Rdy { count })
        }
        b"FIN" | b"TOUCH" => {
            let cmd = if name == b"FIN" { "FIN" } else { "TOUCH" };
            if state != ClientState::Subscribed && state != ClientState::Closing {
                return Err(invalid(format!("cannot {cmd} in current state")));
            }
            if params.len() < 2 {
                return Err(invalid(format!("{cmd} insufficient number of params")));
            }
            let id = message_id(params[1])?;
            one(if cmd == "FIN" {
                Command::Fin { id }
            } else {
                Command::Touch { id }
            })
        }
        b"REQ" => {
            if state != ClientState::Subscribed && state != ClientState::Closing {
                return Err(invalid("cannot REQ in current state"));
            }
            if params.len() < 3 {
                return Err(invalid("REQ insufficient number of params"));
            }
            let id = message_id(params[1])?;
            let ms = byte_to_base10(params[2]).ok_or_else(|| {
                invalid(format!("REQ could not parse timeout {}", lossy(params[2])))
            })?;
            // nsqd clamps the wrapped duration (a negative one to 0).
            let ns = go_ms_duration(ms);
            let timeout_ms = if ns < 0 { -1 } else { ns / 1_000_000 };
            one(Command::Req { id, timeout_ms })
        }
        b"CLS" => {
            if state != ClientState::Subscribed {
                return Err(invalid("cannot CLS in current state"));
            }
            one(Command::Cls)
        }
        b"NOP" => one(Command::Nop),
        b"PUB" => {
            if params.len() < 2 {
                return Err(invalid("PUB insufficient number of parameters"));
            }
            let topic = valid_topic(params[1], E_BAD_TOPIC, "PUB")?;
            let spec = BodySpec {
                code: E_BAD_MESSAGE,
                read_size: "PUB failed to read message body size",
                invalid: "PUB invalid message body size",
                too_big: "PUB message too big",
                read_body: "PUB failed to read message body",
                max: l.max_msg_size,
                too_big_first: false,
            };
            Ok(sized_body(buf, pos, ctx, &spec)?.map(|r| {
                let end = r.end;
                (Command::Pub { topic, body: r }, end)
            }))
        }
        b"DPUB" => {
            if params.len() < 3 {
                return Err(invalid("DPUB insufficient number of parameters"));
            }
            let topic = valid_topic(params[1], E_BAD_TOPIC, "DPUB")?;
            let ms = byte_to_base10(params[2]).ok_or_else(|| {
                invalid(format!("DPUB could not parse timeout {}", lossy(params[2])))
            })?;
            let ns = go_ms_duration(ms);
            if ns < 0 || ns > l.max_req_timeout_ms.saturating_mul(1_000_000) {
                return Err(invalid(format!(
                    "DPUB timeout {} out of range 0-{}",
                    ms, l.max_req_timeout_ms
                )));
            }
            let defer_ms = ns / 1_000_000;
            let spec = BodySpec {
                code: E_BAD_MESSAGE,
                read_size: "DPUB failed to read message body size",
                invalid: "DPUB invalid message body size",
                too_big: "DPUB message too big",
                read_body: "DPUB failed to read message body",
                max: l.max_msg_size,
                too_big_first: false,
            };
            Ok(sized_body(buf, pos, ctx, &spec)?.map(|r| {
                let end = r.end;
                (
                    Command::Dpub {
                        topic,
                        defer_ms,
                        body: r,
                    },
                    end,
                )
            }))
        }
        b"MPUB" => {
            if params.len() < 2 {
                return Err(invalid("MPUB insufficient number of parameters"));
            }
            let topic = valid_topic(params[1], E_BAD_TOPIC, "E_BAD_TOPIC MPUB")?;
            decode_mpub_body(buf, pos, ctx, topic.clone(), resume).map_err(|mut e| {
                e.creates_topic = Some(topic);
                e
            })
        }
        _ => {
            let mut e = invalid(format!("invalid command {}", lossy(name)));
            if std::str::from_utf8(name).is_err() {
                let mut raw = b"invalid command ".to_vec();
                raw.extend_from_slice(name);
                e.raw_text = Some(raw);
            }
            Err(e)
        }
    }
}

/// The length of the sized command (PUB, DPUB, MPUB, IDENTIFY, AUTH) at the start of
/// `buf` once its line and 4-byte size are in, line and size included; `None` for
/// other commands or before then. A reader whose [`decode`] waits for more bytes can
/// make room for the whole command at once instead of growing its buffer read by read.
/// The size is as the peer sent it: [`decode`] checks it against the limits (a caller
/// that asks only after `decode` answered `Ok(None)` gets a checked one).
#[must_use]
pub fn command_len(buf: &[u8]) -> Option<usize> {
    let scan = &buf[..buf.len().min(MAX_LINE)];
    let nl = memchr(b'\n', scan)?;
    let word = scan[..nl].split(|&b| b == b' ' || b == b'\r').next()?;
    if !matches!(word, b"PUB" | b"DPUB" | b"MPUB" | b"IDENTIFY" | b"AUTH") {
        return None;
    }
    let size = usize::try_from(read_i32(buf, nl + 1)?).ok()?;
    (nl + 5).checked_add(size)
}

/// The topic of an `MPUB <topic>\n` line at the start of `buf` once the line is complete
/// and the topic valid, else None (the line's own errors come from [`decode`]). nsqd
/// checks AUTH for MPUB right after the topic name, before it reads the body: the caller
/// runs that check with this topic before it decodes the body.
pub fn mpub_line_topic(buf: &[u8]) -> Option<String> {
    if !buf.starts_with(b"MPUB ") {
        return None;
    }
    let scan = &buf[..buf.len().min(MAX_LINE)];
    let nl = memchr(b'\n', scan)?;
    let mut line = &buf[..nl];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    let topic = line.split(|&b| b == b' ').nth(1)?;
    std::str::from_utf8(topic)
        .ok()
        .filter(|t| is_valid_topic_name(t))
        .map(str::to_string)
}

fn valid_topic(p: &[u8], code: &'static str, prefix: &str) -> Result<String, ProtocolError> {
    std::str::from_utf8(p)
        .ok()
        .filter(|t| is_valid_topic_name(t))
        .map(str::to_string)
        .ok_or_else(|| {
            ProtocolError::new(
                code,
                format!("{prefix} topic name {} is not valid", go_quote(p)),
            )
        })
}

fn decode_mpub_body(
    buf: &[u8],
    pos: usize,
    ctx: &Context,
    topic: String,
    resume: &mut Resume,
) -> Decoded {
    let l = &ctx.limits;
    let bad_body = |t: String| ProtocolError::new(E_BAD_BODY, t);
    let bad_msg = |t: String| ProtocolError::new(E_BAD_MESSAGE, t);
    need!(buf, pos, 4, ctx, || bad_body(
        "MPUB failed to read body size".into()
    ));
    let body_len = read_i32(buf, pos).unwrap_or(0) as i64;
    if body_len <= 0 {
        return Err(bad_body(format!("MPUB invalid body size {body_len}")));
    }
    if body_len > l.max_body_size {
        return Err(bad_body(format!(
            "MPUB body too big {} > {}",
            body_len, l.max_body_size
        )));
    }
    let mut p = pos + 4;
    need!(buf, p, 4, ctx, || bad_body(
        "MPUB failed to read message count".into()
    ));
    let count = read_i32(buf, p).unwrap_or(0) as i64;
    let max_messages = (l.max_body_size - 4) / 5;
    if count <= 0 || count > max_messages {
        return Err(bad_body(format!("MPUB invalid message count {count}")));
    }
    p += 4;
    let (first, mut bodies) = match resume.mpub.take() {
        Some((i, at, bodies)) if at <= buf.len() => {
            p = at;
            (i, bodies)
        }
        _ => (0, Vec::with_capacity(count.min(1024) as usize)),
    };
    for i in first..count {
        if !need(buf, p, 4, ctx, || {
            bad_msg(format!("MPUB failed to read message({i}) body size"))
        })? {
            resume.mpub = Some((i, p, bodies));
            return Ok(None);
        }
        let size = read_i32(buf, p).unwrap_or(0) as i64;
        if size <= 0 {
            return Err(bad_msg(format!(
                "MPUB invalid message({i}) body size {size}"
            )));
        }
        if size > l.max_msg_size {
            return Err(bad_msg(format!(
                "MPUB message too big {} > {}",
                size, l.max_msg_size
            )));
        }
        if !need(buf, p + 4, size as usize, ctx, || {
            bad_msg("MPUB failed to read message body".into())
        })? {
            resume.mpub = Some((i, p, bodies));
            return Ok(None);
        }
        p += 4;
        bodies.push(p..p + size as usize);
        p += size as usize;
    }
    Ok(Some((Command::Mpub { topic, bodies }, p)))
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

#[cfg(test)]
mod tests;
