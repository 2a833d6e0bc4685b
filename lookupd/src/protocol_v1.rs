//! The server of nsqlookupd's TCP protocol V1, spoken by nsqd (nsqlookupd: tcp.go,
//! lookup_protocol_v1.go). One thread per connection; the bytes (magic, responses,
//! IDENTIFY bodies, command parameters) are `nsq_wire::lookupd_v1`'s.
//!
//! ```text
//! client: "  V1"                                  magic, once
//! client: PING\n                                  -> OK
//! client: IDENTIFY\n[int32 size][JSON]            -> JSON about this lookupd
//! client: REGISTER <topic> [<channel>]\n          -> OK
//! client: UNREGISTER <topic> [<channel>]\n        -> OK
//! server: [int32 size][data]                      every response; no frame type
//! ```
//!
//! Every error is fatal: `"<CODE> <desc>"` is sent and the connection closed. When the
//! connection ends, the peer is removed from every registration (the keys stay).

use super::registration_db::{now_nanos, PeerInfo, Producer, Registration};
use super::Context;
use nsq_wire::gobufio::GoBufReader;
use nsq_wire::json;
use nsq_wire::lookupd_v1::{self, decode_identify, get_topic_chan, trim_space, FatalClientErr};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// The longest command line read before the connection is dropped (Go has no limit; a
/// valid line is under 150 bytes).
const MAX_LINE: u64 = 1024 * 1024;

/// Writes `[int32 size][data]` (nsq internal/protocol SendResponse).
pub fn send_response(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 + data.len());
    lookupd_v1::write_response(&mut buf, data);
    w.write_all(&buf)
}

/// Serves one accepted TCP connection until it closes (nsqlookupd: tcpServer.Handle).
pub fn handle(ctx: Arc<Context>, stream: TcpStream) {
    let addr = match stream.peer_addr() {
        Ok(a) => a.to_string(),
        Err(_) => return,
    };
    let _ = stream.set_nodelay(true);
    log::info!("TCP: new client({addr})");
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            log::error!("client({addr}) - {e}");
            return;
        }
    };
    let unread = serve(ctx, addr, stream, &mut writer);
    // Input nsqlookupd would have left unread: its close is a reset (Go closes with
    // the data unread and the kernel resets), so this one is too (SO_LINGER 0).
    if let Some(u) = unread {
        let waiting = rustix::io::ioctl_fionread(&writer).unwrap_or(0) as usize;
        if u.buffered + waiting > u.go_ahead {
            let _ = rustix::net::sockopt::set_socket_linger(&writer, Some(Duration::ZERO));
            return;
        }
    }
    let _ = writer.shutdown(Shutdown::Both);
}

/// After a fatal error: bytes read past the failing command and not used (`buffered`),
/// and how many nsqlookupd would have taken from the socket past the same point
/// (`go_ahead`: its 4 KiB bufio, [`GoBufReader`]; 0 for a bad magic, which Go reads as
/// exactly 4 bytes).
pub struct UnreadAtClose {
    /// Bytes our reader holds past the failing command.
    pub buffered: usize,
    /// Bytes Go's reader would hold past it.
    pub go_ahead: usize,
}

/// The protocol on any byte stream: the magic, then commands until EOF, an I/O error or
/// a fatal client error (every reply written to `writer`); the caller closes the
/// connection afterwards, with what [`UnreadAtClose`] says after a bad magic or a fatal
/// error. `addr` is the peer as logged. [`handle`] runs it over TCP; the fuzz target
/// `lookupd_v1` over memory.
pub fn serve(
    ctx: Arc<Context>,
    addr: String,
    stream: impl Read,
    writer: &mut impl Write,
) -> Option<UnreadAtClose> {
    let mut reader = BufReader::new(stream);
    let mut magic = [0u8; 4];
    if let Err(e) = reader.read_exact(&mut magic) {
        log::error!("failed to read protocol version - {}", io_err_text(&e));
        return None;
    }
    let magic_str = String::from_utf8_lossy(&magic).into_owned();
    log::info!("CLIENT({addr}): desired protocol magic '{magic_str}'");
    if &magic != b"  V1" {
        let _ = send_response(writer, b"E_BAD_PROTOCOL");
        log::error!("client({addr}) bad protocol magic '{magic_str}'");
        return Some(UnreadAtClose {
            buffered: reader.buffer().len(),
            go_ahead: 0,
        });
    }
    let mut client = ClientV1 {
        ctx,
        addr: addr.clone(),
        peer: None,
        bufio: GoBufReader::new(GO_BUFIO_SIZE),
        fatal: false,
    };
    if let Err(e) = client.io_loop(&mut reader, writer) {
        log::error!("client({addr}) - {e}");
    }
    client.fatal.then(|| UnreadAtClose {
        buffered: reader.buffer().len(),
        go_ahead: client.bufio.ahead(),
    })
}

/// nsqlookupd reads a connection through bufio's default 4 KiB buffer.
const GO_BUFIO_SIZE: usize = 4096;

/// Go prints io.EOF as `EOF`.
/// Why a connection's command loop ended; `Display` is what Go logs as
/// `client(addr) - <err>`.
#[derive(Debug)]
enum LoopError {
    /// The read failed (`EOF` for an unexpected end, else the system's text).
    Read(std::io::Error),
    /// `EOF`: the peer closed the connection.
    Eof,
    /// `command line too long`.
    LineTooLong,
    /// Writing a response failed.
    Write(std::io::Error),
    /// A fatal client error, after its error response was sent (`E_... text`).
    Fatal(String),
}

impl std::fmt::Display for LoopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoopError::Read(e) => f.write_str(&io_err_text(e)),
            LoopError::Eof => f.write_str("EOF"),
            LoopError::LineTooLong => f.write_str("command line too long"),
            LoopError::Write(e) => e.fmt(f),
            LoopError::Fatal(text) => f.write_str(text),
        }
    }
}

fn io_err_text(e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        "EOF".into()
    } else {
        e.to_string()
    }
}

struct ClientV1 {
    ctx: Arc<Context>,
    addr: String,
    peer: Option<Arc<PeerInfo>>,
    /// Where nsqlookupd's read buffer would stand.
    bufio: GoBufReader,
    /// The loop ended on a fatal client error.
    fatal: bool,
}

impl ClientV1 {
    /// Runs commands until EOF, an I/O error or a fatal client error; then removes the peer
    /// from every registration. The error returned is what Go logs as `client(addr) - err`.
    fn io_loop(
        &mut self,
        reader: &mut BufReader<impl Read>,
        writer: &mut impl Write,
    ) -> Result<(), LoopError> {
        let result = self.run(reader, writer);
        log::info!("PROTOCOL(V1): [{}] exiting ioloop", self.addr);
        if let Some(peer) = &self.peer {
            let db = &self.ctx.db;
            for r in db.lookup_registrations(&peer.id) {
                if db.remove_producer(&r, &peer.id).0 {
                    log::info!(
                        "DB: client({}) UNREGISTER category:{} key:{} subkey:{}",
                        self.addr,
                        r.category,
                        r.key,
                        r.sub_key
                    );
                }
            }
        }
        result
    }

    fn run(
        &mut self,
        reader: &mut BufReader<impl Read>,
        writer: &mut impl Write,
    ) -> Result<(), LoopError> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .by_ref()
                .take(MAX_LINE)
                .read_until(b'\n', &mut line)
                .map_err(LoopError::Read)?;
            if n == 0 || line.last() != Some(&b'\n') {
                if n as u64 >= MAX_LINE {
                    return Err(LoopError::LineTooLong);
                }
                return Err(LoopError::Eof);
            }
            self.bufio.read_line(n);
            let trimmed = trim_space(&line);
            let params: Vec<&[u8]> = trimmed.split(|&b| b == b' ').collect();
            match self.exec(reader, &params) {
                Ok(resp) => send_response(writer, &resp).map_err(LoopError::Write)?,
                Err(e) => {
                    let ctx = e
                        .parent
                        .as_ref()
                        .map(|p| format!(" - {p}"))
                        .unwrap_or_default();
                    self.fatal = true;
                    log::error!("[{}] - {}{}", self.addr, e.text(), ctx);
                    if let Err(se) = send_response(writer, &e.wire()) {
                        log::error!("[{}] - {}{}", self.addr, se, ctx);
                    }
                    return Err(LoopError::Fatal(e.text()));
                }
            }
        }
    }

    fn exec(
        &mut self,
        reader: &mut BufReader<impl Read>,
        params: &[&[u8]],
    ) -> Result<Vec<u8>, FatalClientErr> {
        match params[0] {
            b"PING" => Ok(self.ping()),
            b"IDENTIFY" => self.identify(reader),
            b"REGISTER" => self.register(&params[1..]),
            b"UNREGISTER" => self.unregister(&params[1..]),
            // The command is echoed as sent.
            other => Err(FatalClientErr::new(
                "E_INVALID",
                [&b"invalid command "[..], other].concat(),
            )),
        }
    }

    /// PING refreshes lastUpdate once identified.
    fn ping(&mut self) -> Vec<u8> {
        if let Some(peer) = &self.peer {
            let now = now_nanos();
            let last = peer.last_update();
            log::info!(
                "CLIENT({}): pinged (last ping {})",
                peer.id,
                nsq_wire::duration::go_duration_string(std::time::Duration::from_nanos(
                    (now - last).max(0) as u64
                ))
            );
            peer.touch(now);
        }
        b"OK".to_vec()
    }

    fn identify(&mut self, reader: &mut BufReader<impl Read>) -> Result<Vec<u8>, FatalClientErr> {
        if self.peer.is_some() {
            return Err(FatalClientErr::new("E_INVALID", "cannot IDENTIFY again"));
        }
        let mut size = [0u8; 4];
        reader.read_exact(&mut size).map_err(|e| {
            FatalClientErr::new("E_BAD_BODY", "IDENTIFY failed to read body size")
                .with_parent(io_err_text(&e))
        })?;
        self.bufio.read_full(4);
        let size = i32::from_be_bytes(size);
        let body_err = |parent: String| {
            FatalClientErr::new("E_BAD_BODY", "IDENTIFY failed to read body").with_parent(parent)
        };
        if size < 0 {
            // Go panics on make([]byte, negative); answering is kinder.
            return Err(body_err(format!("negative body size {size}")));
        }
        let mut body = Vec::new();
        let n = reader
            .by_ref()
            .take(size as u64)
            .read_to_end(&mut body)
            .map_err(|e| body_err(io_err_text(&e)))?;
        if n < size as usize {
            return Err(body_err(if n == 0 {
                "EOF".into()
            } else {
                "unexpected EOF".into()
            }));
        }
        self.bufio.read_full(n);
        let fields = decode_identify(&body).map_err(|e| {
            FatalClientErr::new("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
                .with_parent(e.to_string())
        })?;
        if fields.broadcast_address.is_empty()
            || fields.tcp_port == 0
            || fields.http_port == 0
            || fields.version.is_empty()
        {
            return Err(FatalClientErr::new("E_BAD_BODY", "IDENTIFY missing fields"));
        }
        log::info!(
            "CLIENT({}): IDENTIFY Address:{} TCP:{} HTTP:{} Version:{}",
            self.addr,
            fields.broadcast_address,
            fields.tcp_port,
            fields.http_port,
            fields.version
        );
        let peer = Arc::new(PeerInfo::new(
            self.addr.clone(),
            fields.hostname,
            fields.broadcast_address,
            fields.tcp_port,
            fields.http_port,
            fields.version,
        ));
        self.peer = Some(peer.clone());
        if self
            .ctx
            .db
            .add_producer(Registration::new("client", "", ""), Producer::new(peer))
        {
            log::info!(
                "DB: client({}) REGISTER category:client key: subkey:",
                self.addr
            );
        }
        Ok(self.ctx.identify_response().into_bytes())
    }

    fn register(&mut self, params: &[&[u8]]) -> Result<Vec<u8>, FatalClientErr> {
        let Some(peer) = self.peer.clone() else {
            return Err(FatalClientErr::new("E_INVALID", "client must IDENTIFY"));
        };
        let (topic, channel) = get_topic_chan("REGISTER", params)?;
        let db = &self.ctx.db;
        if !channel.is_empty()
            && db.add_producer(
                Registration::new("channel", &topic, &channel),
                Producer::new(peer.clone()),
            )
        {
            log::info!(
                "DB: client({}) REGISTER category:channel key:{topic} subkey:{channel}",
                self.addr
            );
        }
        if db.add_producer(Registration::new("topic", &topic, ""), Producer::new(peer)) {
            log::info!(
                "DB: client({}) REGISTER category:topic key:{topic} subkey:",
                self.addr
            );
        }
        Ok(b"OK".to_vec())
    }

    fn unregister(&mut self, params: &[&[u8]]) -> Result<Vec<u8>, FatalClientErr> {
        let Some(peer) = self.peer.clone() else {
            return Err(FatalClientErr::new("E_INVALID", "client must IDENTIFY"));
        };
        let (topic, channel) = get_topic_chan("UNREGISTER", params)?;
        let db = &self.ctx.db;
        if !channel.is_empty() {
            let key = Registration::new("channel", &topic, &channel);
            let (removed, left) = db.remove_producer(&key, &peer.id);
            if removed {
                log::info!(
                    "DB: client({}) UNREGISTER category:channel key:{topic} subkey:{channel}",
                    self.addr
                );
            }
            if left == 0 && channel.ends_with("#ephemeral") {
                db.remove_registration(&key);
            }
        } else {
            // A topic UNREGISTER also drops the peer from the topic's channels; nsqd
            // unregisters channels first, so anything removed here is unexpected.
            for r in db.find_registrations("channel", &topic, "*") {
                if db.remove_producer(&r, &peer.id).0 {
                    log::warn!(
                        "client({}) unexpected UNREGISTER category:channel key:{topic} subkey:{}",
                        self.addr,
                        r.sub_key
                    );
                }
            }
            let key = Registration::new("topic", &topic, "");
            let (removed, left) = db.remove_producer(&key, &peer.id);
            if removed {
                log::info!(
                    "DB: client({}) UNREGISTER category:topic key:{topic} subkey:",
                    self.addr
                );
            }
            if left == 0 && topic.ends_with("#ephemeral") {
                db.remove_registration(&key);
            }
        }
        Ok(b"OK".to_vec())
    }
}

impl Context {
    /// The IDENTIFY reply: this lookupd's ports, version, broadcast address and hostname
    /// (a Go map, so the keys are sorted).
    pub fn identify_response(&self) -> String {
        let mut s = String::from("{");
        json::push_key(&mut s, "broadcast_address");
        json::push_str(&mut s, &self.opts.broadcast_address);
        s.push(',');
        json::push_key(&mut s, "hostname");
        json::push_str(&mut s, &self.hostname);
        s.push_str(&format!(
            ",\"http_port\":{},\"tcp_port\":{},",
            self.http_addr.port(),
            self.tcp_addr.port()
        ));
        json::push_key(&mut s, "version");
        json::push_str(&mut s, super::VERSION);
        s.push('}');
        s
    }
}
