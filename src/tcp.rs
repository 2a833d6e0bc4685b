//! The protocol V2 TCP server: accept, magic, the per-connection reader (decode and
//! execute commands) and writer (output buffering, heartbeats), and the hand-off of a
//! connection to the shard that owns its topic (nsqd: tcp.go, protocol_v2.go IOLoop and
//! messagePump).

use nsq_shards::client::Compression;
use nsq_wire::compress::deflate::{remember_output, DeflateDecoder, DeflateEncoder};
use nsq_wire::compress::snappy::{SnappyDecoder, SnappyEncoder};
use nsq_wire::identify::{apply_identify, default_settings, identify_response};

/// The inbound side of a compressed connection.
enum Decoder {
    Snappy(SnappyDecoder),
    Deflate(DeflateDecoder),
}

impl Decoder {
    /// The decoder for `c`, continuing a stream from its hand-off state if given.
    fn new(
        c: Compression,
        pending_raw: Vec<u8>,
        history: Vec<u8>,
    ) -> Result<Option<Decoder>, String> {
        Ok(match c {
            Compression::None => None,
            Compression::Snappy => Some(Decoder::Snappy(SnappyDecoder::with_pending(pending_raw))),
            Compression::Deflate(_) => Some(Decoder::Deflate(DeflateDecoder::new(history)?)),
        })
    }

    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            Decoder::Snappy(d) => d.feed(data, out),
            Decoder::Deflate(d) => d.feed(data, out),
        }
    }

    /// True when the stream can move to another shard now (deflate: at a flush point).
    fn can_hand_off(&self) -> bool {
        match self {
            Decoder::Snappy(_) => true,
            Decoder::Deflate(d) => d.at_flush_point(),
        }
    }

    /// (undecoded bytes, inflate window) to move with the connection.
    fn handoff_state(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            Decoder::Snappy(d) => (d.pending().to_vec(), Vec::new()),
            Decoder::Deflate(d) => (Vec::new(), d.history().to_vec()),
        }
    }
}

/// The outbound side of a compressed connection.
enum Encoder {
    Snappy(SnappyEncoder),
    Deflate(DeflateEncoder),
}

impl Encoder {
    /// The encoder for `c`; `continuing` for a connection moved from another shard
    /// (snappy: no second stream identifier; deflate: primed with `history`).
    fn new(c: Compression, continuing: bool, history: &[u8]) -> Result<Option<Encoder>, String> {
        Ok(match c {
            Compression::None => None,
            Compression::Snappy if continuing => Some(Encoder::Snappy(SnappyEncoder::continuing())),
            Compression::Snappy => Some(Encoder::Snappy(SnappyEncoder::default())),
            Compression::Deflate(level) => {
                Some(Encoder::Deflate(DeflateEncoder::new(level, history)?))
            }
        })
    }

    fn encode(&mut self, client: &Client, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            Encoder::Snappy(e) => {
                e.encode(data, out);
                Ok(())
            }
            Encoder::Deflate(e) => {
                remember_output(&mut client.deflate_out_history.borrow_mut(), data);
                e.encode(data, out)
            }
        }
    }
}
use crate::server::Server;
use bytes::{Bytes, BytesMut};
use futures::future::select;
use glommio::net::{TcpListener, TcpStream};
use nsq_shards::client::{Client, OutputTicker};
use nsq_shards::mesh::{HandOff, ShardMsg};
use nsq_shards::{owner_of, ClientState, MessageId};
use nsq_wire::v2::{
    self as protocol, Command, Context, Limits, FRAME_ERROR, FRAME_RESPONSE, MAGIC_V2,
};
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Output bytes above which the reader stops taking commands until the writer drains.
const OUT_HIGH_WATER: usize = 1 << 20;

/// Smallest read size.
const MIN_READ_CHUNK: usize = 2048;

/// Largest read size (bytes asked of the socket per read when busy).
const READ_CHUNK: usize = 64 * 1024;

/// A socket shared by the connection's reader and writer tasks. Each poll borrows it
/// only for the duration of the poll (never across an await); glommio keeps separate
/// read and write sources, so the two directions do not disturb each other.
///
/// With TLS (after IDENTIFY `tls_v1`, or on the HTTPS listener) it holds the rustls
/// session: `read` returns decrypted bytes and `write_all` encrypts, so the reader and
/// writer loops above it stay the same. Without TLS the plain path is what it was: one
/// `is_tls` check per call, no extra copy.
#[derive(Clone)]
pub struct SharedStream(Rc<StreamInner>);

struct StreamInner {
    tcp: RefCell<TcpStream>,
    is_tls: Cell<bool>,
    tls: RefCell<Option<Box<TlsSession>>>,
    /// Held by whoever writes to the socket: TLS records must reach the socket in the
    /// order rustls made them (the reader writes during a handshake, the writer always),
    /// and the IDENTIFY reply must be on the wire before the TLS handshake starts.
    write_lock: futures::lock::Mutex<()>,
    /// Scratch buffer for outgoing ciphertext (taken out while in use).
    wbuf: Cell<Vec<u8>>,
}

/// A connection's TLS state: the rustls session and the ciphertext read from the socket
/// but not given to rustls yet (rustls takes it a record at a time, as its 16 KiB
/// plaintext buffer drains). All of it moves with a connection handed to another shard.
pub struct TlsSession {
    conn: rustls::ServerConnection,
    pending: Vec<u8>,
    pos: usize,
    end: usize,
}

/// Ciphertext asked of the socket per read with TLS (as READ_CHUNK for plain reads).
const TLS_READ_CHUNK: usize = 64 * 1024;

impl SharedStream {
    pub fn new(s: TcpStream) -> SharedStream {
        SharedStream(Rc::new(StreamInner {
            tcp: RefCell::new(s),
            is_tls: Cell::new(false),
            tls: RefCell::new(None),
            write_lock: futures::lock::Mutex::new(()),
            wbuf: Cell::new(Vec::new()),
        }))
    }

    /// A stream resumed with its TLS session (a connection handed over by another shard).
    pub fn with_tls(s: TcpStream, session: Box<TlsSession>) -> SharedStream {
        let st = SharedStream::new(s);
        *st.0.tls.borrow_mut() = Some(session);
        st.0.is_tls.set(true);
        st
    }

    /// (version, cipher suite) of the TLS session, named as Go's crypto/tls names them,
    /// and the common name of the client's certificate (empty without one).
    pub fn tls_info(&self) -> Option<(String, String, String)> {
        let g = self.0.tls.borrow();
        let c = &g.as_ref()?.conn;
        let version = match c.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLS1.3".to_string(),
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLS1.2".to_string(),
            Some(v) => format!("{v:?}"),
            None => String::new(),
        };
        // Go names the TLS 1.3 suites TLS_AES_128_GCM_SHA256 (rustls: TLS13_...).
        let suite = c
            .negotiated_cipher_suite()
            .and_then(|s| s.suite().as_str())
            .unwrap_or_default()
            .replacen("TLS13_", "TLS_", 1);
        let cn = c
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| crate::tls::subject_common_name(cert))
            .unwrap_or_default();
        Some((version, suite, cn))
    }

    pub fn is_tls(&self) -> bool {
        self.0.is_tls.get()
    }

    /// Takes the TLS session out (to move it with the connection to another shard).
    pub fn take_tls(&self) -> Option<Box<TlsSession>> {
        self.0.is_tls.set(false);
        self.0.tls.borrow_mut().take()
    }

    async fn raw_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        use futures::io::AsyncRead;
        futures::future::poll_fn(|cx| Pin::new(&mut *self.0.tcp.borrow_mut()).poll_read(cx, buf))
            .await
    }

    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.is_tls() {
            return self.raw_read(buf).await;
        }
        self.tls_read(buf).await
    }

    /// Reads decrypted bytes: as many as the session and the ciphertext read already
    /// give (up to `buf.len()`), else waits for the socket. 0 at end of stream
    /// (close_notify, or EOF without it).
    async fn tls_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        let mut filled = 0;
        loop {
            let fed = {
                let mut g = self.0.tls.borrow_mut();
                let s = g
                    .as_mut()
                    .ok_or_else(|| io::Error::other("no TLS session"))?;
                loop {
                    match s.conn.reader().read(&mut buf[filled..]) {
                        Ok(0) => return Ok(filled),
                        Ok(n) => {
                            filled += n;
                            if filled == buf.len() {
                                return Ok(filled);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        // EOF without close_notify: the peer went away.
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(filled),
                        Err(e) if filled > 0 => {
                            log::debug!("TLS read: {e}");
                            return Ok(filled);
                        }
                        Err(e) => return Err(e),
                    }
                }
                if s.pos < s.end {
                    Some(feed_one(s))
                } else {
                    None
                }
            };
            match fed {
                Some(r) => self.after_feed(r).await?,
                None if filled > 0 => return Ok(filled),
                None => {
                    if !self.read_socket().await? {
                        return Ok(filled);
                    }
                }
            }
        }
    }

    /// Writes what processing received records made the session want to send (a
    /// handshake flight, an alert); returns a processing error after sending its alert.
    async fn after_feed(&self, r: io::Result<()>) -> io::Result<()> {
        let wants = self
            .0
            .tls
            .borrow()
            .as_ref()
            .is_some_and(|s| s.conn.wants_write());
        if wants {
            let flushed = self.flush_tls().await;
            r?;
            return flushed;
        }
        r
    }

    /// Reads ciphertext from the socket into the session's pending buffer (which must be
    /// used up). False at end of stream, which the session is told.
    async fn read_socket(&self) -> io::Result<bool> {
        let mut raw = match self.0.tls.borrow_mut().as_mut() {
            Some(s) => std::mem::take(&mut s.pending),
            None => return Err(io::Error::other("no TLS session")),
        };
        if raw.len() < TLS_READ_CHUNK {
            raw.resize(TLS_READ_CHUNK, 0);
        }
        let r = self.raw_read(&mut raw).await;
        let mut g = self.0.tls.borrow_mut();
        let s = g
            .as_mut()
            .ok_or_else(|| io::Error::other("no TLS session"))?;
        s.pending = raw;
        s.pos = 0;
        s.end = 0;
        match r? {
            0 => {
                // rustls learns of the EOF from an empty read.
                let _ = s.conn.read_tls(&mut &[][..]);
                Ok(false)
            }
            n => {
                s.end = n.min(s.pending.len());
                Ok(true)
            }
        }
    }

    /// Advances the handshake: processes pending ciphertext or reads more. False at EOF.
    async fn handshake_step(&self) -> io::Result<bool> {
        let fed = {
            let mut g = self.0.tls.borrow_mut();
            let s = g
                .as_mut()
                .ok_or_else(|| io::Error::other("no TLS session"))?;
            (s.pos < s.end).then(|| feed_one(s))
        };
        match fed {
            Some(r) => self.after_feed(r).await.map(|_| true),
            None => self.read_socket().await,
        }
    }

    /// Writes what the session has to send (handshake messages, alerts, records).
    async fn flush_tls(&self) -> io::Result<()> {
        let _g = self.0.write_lock.lock().await;
        self.flush_tls_locked().await
    }

    async fn flush_tls_locked(&self) -> io::Result<()> {
        let mut out = self.0.wbuf.take();
        out.clear();
        {
            let mut g = self.0.tls.borrow_mut();
            if let Some(s) = g.as_mut() {
                while s.conn.wants_write() {
                    s.conn.write_tls(&mut out)?;
                }
            }
        }
        let r = self.raw_write_all(&out).await;
        if out.capacity() > 1 << 20 {
            out = Vec::new();
        }
        self.0.wbuf.set(out);
        r
    }

    /// Server side of the TLS handshake on this connection, started after the IDENTIFY
    /// reply went out plain (nsqd: clientV2.UpgradeTLS). `early` is what was read past
    /// the IDENTIFY already: the start of the client's handshake.
    pub async fn accept_tls(
        &self,
        config: std::sync::Arc<rustls::ServerConfig>,
        early: &[u8],
    ) -> io::Result<()> {
        let mut conn = rustls::ServerConnection::new(config).map_err(io::Error::other)?;
        // Output is bounded by the client's output buffer already.
        conn.set_buffer_limit(None);
        let mut pending = early.to_vec();
        pending.resize(TLS_READ_CHUNK.max(early.len()), 0);
        let session = TlsSession {
            conn,
            pending,
            pos: 0,
            end: early.len(),
        };
        {
            // Everything queued before this point has been written plain.
            let _g = self.0.write_lock.lock().await;
            *self.0.tls.borrow_mut() = Some(Box::new(session));
            self.0.is_tls.set(true);
        }
        loop {
            let handshaking = self
                .0
                .tls
                .borrow()
                .as_ref()
                .is_some_and(|s| s.conn.is_handshaking());
            if !handshaking {
                return Ok(());
            }
            if !self.handshake_step().await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Reads up to `max` bytes appended to `buf` without zero-filling the space first
    /// (a memset of the whole read area per read cost about as much as the copy of the
    /// data itself). Returns the bytes read; 0 at end of stream.
    pub async fn read_append(&self, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
        buf.reserve(max);
        let spare = &mut buf.spare_capacity_mut()[..max];
        // SAFETY: the slice covers `max` bytes of `buf`'s allocated capacity. Its bytes
        // may be uninitialised; the read only ever writes into it (glommio copies what
        // recv returned, the kernel writes it, or rustls copies decrypted bytes into it)
        // and never reads it, and only the `n` bytes it reports as written become part
        // of `buf` below.
        let area: &mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), max) };
        let n = self.read(area).await?;
        let n = n.min(max);
        // SAFETY: the read initialised the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    async fn raw_write_all(&self, mut data: &[u8]) -> io::Result<()> {
        use futures::io::AsyncWrite;
        while !data.is_empty() {
            let n = futures::future::poll_fn(|cx| {
                Pin::new(&mut *self.0.tcp.borrow_mut()).poll_write(cx, data)
            })
            .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            data = &data[n..];
        }
        Ok(())
    }

    pub async fn write_all(&self, data: &[u8]) -> io::Result<()> {
        let _g = self.0.write_lock.lock().await;
        if !self.is_tls() {
            return self.raw_write_all(data).await;
        }
        {
            use std::io::Write;
            let mut g = self.0.tls.borrow_mut();
            let s = g
                .as_mut()
                .ok_or_else(|| io::Error::other("no TLS session"))?;
            s.conn.writer().write_all(data)?;
        }
        self.flush_tls_locked().await
    }

    /// Waits until no write is in progress (what was handed to `write_all` is on the
    /// socket).
    pub async fn writes_done(&self) {
        let _g = self.0.write_lock.lock().await;
    }

    pub fn fd(&self) -> i32 {
        self.0.tcp.borrow().as_raw_fd()
    }

    /// Shuts both directions so a blocked reader wakes up with EOF.
    pub fn shutdown(&self) {
        // SAFETY: the fd is owned by the TcpStream inside self, alive for this call.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd()) };
        let _ = socket2::SockRef::from(&fd).shutdown(std::net::Shutdown::Both);
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) {
        let _ = self.0.tcp.borrow().set_read_timeout(d);
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) {
        let _ = self.0.tcp.borrow().set_write_timeout(d);
    }
}

/// Gives rustls the next piece of pending ciphertext (it takes up to a record's worth)
/// and processes it. A TLS error queues an alert and is returned.
fn feed_one(s: &mut TlsSession) -> io::Result<()> {
    let mut rd = &s.pending[s.pos..s.end];
    let before = rd.len();
    let r = s.conn.read_tls(&mut rd);
    s.pos += before - rd.len();
    if r? == 0 && before > 0 {
        // Never spin on input rustls does not take.
        return Err(io::Error::other("TLS: received data not accepted"));
    }
    s.conn
        .process_new_packets()
        .map(|_| ())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Accepts connections on this shard's listener until shutdown.
pub async fn accept_loop(server: Rc<Server>, listener: TcpListener) {
    crate::server::accept_until_shutdown(server, listener, "TCP", new_connection).await
}

async fn new_connection(server: Rc<Server>, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown".into());
    let _ = stream.set_nodelay(true);
    log::debug!("TCP: new client({peer})");
    let stream = SharedStream::new(stream);
    stream.set_read_timeout(Some(server.shard.opts.client_timeout));
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    while buf.len() < 4 {
        let old = buf.len();
        buf.resize(old + 64, 0);
        match stream.read(&mut buf[old..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.truncate(old + n),
        }
    }
    if &buf[..4] != MAGIC_V2 {
        log::info!(
            "client({peer}) bad protocol magic '{}'",
            String::from_utf8_lossy(&buf[..4])
        );
        let mut out = Vec::new();
        protocol::write_frame(&mut out, FRAME_ERROR, b"E_BAD_PROTOCOL");
        let _ = stream.write_all(&out).await;
        stream.shutdown();
        return;
    }
    let _ = buf.split_to(4);
    let ip = peer.rsplit_once(':').map(|(h, _)| h).unwrap_or(&peer);
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    let settings = default_settings(ip, &server.shard.opts);
    let client = Rc::new(Client::new(
        server.shard.new_client_id(),
        peer.clone(),
        settings,
    ));
    run_connection(server, stream, client, buf, Vec::new(), Vec::new()).await;
}

/// Resumes a connection handed over by another shard.
pub async fn resume(server: Rc<Server>, h: HandOff) {
    server.shard.count_handoff_received();
    // SAFETY: the fd came out of an OwnedFd, so it is open and owned by nobody else.
    let stream = unsafe { TcpStream::from_raw_fd(h.fd.into_raw_fd()) };
    let client = Rc::new(Client::from_snapshot(h.client));
    let buf = BytesMut::from(&h.pending[..]);
    let stream = match h.tls.map(|t| t.downcast::<TlsSession>()) {
        None => SharedStream::new(stream),
        Some(Ok(conn)) => SharedStream::with_tls(stream, conn),
        Some(Err(_)) => {
            log::error!(
                "hand-off of {} failed: not a TLS session",
                client.remote_address
            );
            return;
        }
    };
    run_connection(
        server,
        stream,
        client,
        buf,
        h.pending_raw,
        h.inflate_history,
    )
    .await;
}

enum Outcome {
    Closed,
    HandOff {
        target: usize,
        pending: BytesMut,
        pending_raw: Vec<u8>,
        inflate_history: Vec<u8>,
    },
}

async fn run_connection(
    server: Rc<Server>,
    stream: SharedStream,
    client: Rc<Client>,
    buf: BytesMut,
    pending_raw: Vec<u8>,
    inflate_history: Vec<u8>,
) {
    server.shard.register_client(&client);
    apply_deadlines(&stream, &client);
    let handing_off = Rc::new(Cell::new(false));
    let writer = glommio::spawn_local(writer_loop(
        server.clone(),
        stream.clone(),
        client.clone(),
        handing_off.clone(),
    ));
    let decoder = match Decoder::new(client.compression.get(), pending_raw, inflate_history) {
        Ok(d) => d,
        Err(e) => {
            log::error!(
                "PROTOCOL(V2): [{}] cannot resume compression - {e}",
                client.remote_address
            );
            stream.shutdown();
            return;
        }
    };
    let outcome = reader_loop(&server, &stream, &client, buf, decoder).await;
    if let Outcome::HandOff { .. } = outcome {
        handing_off.set(true);
    }
    client.kill();
    writer.await;
    server.shard.client_gone(&client);
    match outcome {
        Outcome::Closed => {
            log::debug!("PROTOCOL(V2): [{}] exiting ioloop", client.remote_address);
        }
        Outcome::HandOff {
            target,
            pending,
            pending_raw,
            inflate_history,
        } => {
            // SAFETY: the stream is alive (we hold `stream`), so its fd is valid here.
            let dup = unsafe { BorrowedFd::borrow_raw(stream.fd()) }.try_clone_to_owned();
            // The writer has finished (awaited above): the session has nothing left to
            // send, and what it received but was not read yet moves with it.
            let tls = stream
                .take_tls()
                .map(|t| t as Box<dyn std::any::Any + Send>);
            drop(stream);
            let Ok(fd) = dup else {
                log::error!(
                    "hand-off of {} failed: cannot dup the socket",
                    client.remote_address
                );
                return;
            };
            client.closed.set(false);
            let h = HandOff {
                fd,
                client: client.snapshot(),
                pending: pending.to_vec(),
                pending_raw,
                inflate_history,
                tls,
            };
            server.shard.count_handoff_sent();
            if let Some(mesh) = server.mesh() {
                if mesh
                    .send_to(target, ShardMsg::HandOff(Box::new(h)))
                    .await
                    .is_err()
                {
                    log::error!("hand-off to shard {target} failed: mesh closed");
                }
            }
        }
    }
}

/// nsqd's deadlines: reads must arrive within 2 x heartbeat interval, each write within
/// one interval; no deadlines with heartbeats disabled.
fn apply_deadlines(stream: &SharedStream, client: &Client) {
    let hb = client.settings.borrow().heartbeat_interval;
    stream.set_read_timeout(hb.map(|d| d * 2));
    stream.set_write_timeout(hb);
}

fn limits(server: &Server) -> Limits {
    let o = &server.shard.opts;
    Limits {
        max_msg_size: o.max_msg_size,
        max_body_size: o.max_body_size,
        max_rdy_count: o.max_rdy_count,
        max_req_timeout_ms: o.max_req_timeout.as_millis() as i64,
    }
}

async fn reader_loop(
    server: &Rc<Server>,
    stream: &SharedStream,
    client: &Rc<Client>,
    mut buf: BytesMut,
    mut decoder: Option<Decoder>,
) -> Outcome {
    let limits = limits(server);
    let mut eof = false;
    let mut chunk = MIN_READ_CHUNK;
    let auth_enabled = server.cfg.auth.enabled();
    // True once the MPUB at the start of `buf` passed its auth check.
    let mut mpub_checked = false;
    // Progress through an incomplete MPUB (buf only grows at its end until a command
    // is consumed).
    let mut resume = protocol::Resume::default();
    loop {
        loop {
            if client.closed.get() {
                return Outcome::Closed;
            }
            // Backpressure: a client that does not read its replies stops being read
            // (nsqd blocks on its write the same way) instead of growing the buffer.
            while client.out.borrow().len() > OUT_HIGH_WATER && !client.closed.get() {
                client.flush_now.set(true);
                client.wake.notify();
                client.drained.wait().await;
            }
            if server.cfg.tls_required != crate::config::TLS_NOT_REQUIRED && !stream.is_tls() {
                // nsqd: enforceTLSPolicy, as soon as a command's line is read.
                if let Some(word) = command_word(&buf) {
                    if word != b"IDENTIFY" {
                        let _ = fatal::<()>(
                            client,
                            format!(
                                "E_INVALID cannot {} in current state (TLS required)",
                                String::from_utf8_lossy(word)
                            ),
                        );
                        return Outcome::Closed;
                    }
                }
            }
            // nsqd checks AUTH for MPUB before it reads the body (so a denied MPUB
            // answers at once and its body errors come after the auth errors).
            if auth_enabled && !mpub_checked {
                if let Some(topic) = protocol::mpub_line_topic(&buf) {
                    let auth = &server.cfg.auth;
                    if let Err(text) = crate::auth::check(auth, client, "MPUB", &topic, "").await {
                        let _ = fatal::<()>(client, text);
                        return Outcome::Closed;
                    }
                    mpub_checked = true;
                }
            }
            let ctx = Context {
                state: client.state.get(),
                heartbeats_enabled: client.settings.borrow().heartbeat_interval.is_some(),
                limits,
                eof,
            };
            match protocol::decode_resume(&buf, &ctx, &mut resume) {
                Ok(None) => break,
                Ok(Some((cmd, n))) => {
                    resume.clear();
                    if let Some(target) = hand_off_target(server, client, &cmd) {
                        // A deflate stream moves only at a client flush point: read on
                        // (the client flushes each command) until it is at one.
                        while let Some(d) = decoder.as_mut().filter(|d| !d.can_hand_off()) {
                            let mut raw = vec![0u8; 16 * 1024];
                            match stream.read(&mut raw).await {
                                Ok(n) if n > 0 => {
                                    let mut out = Vec::new();
                                    if d.feed(&raw[..n], &mut out).is_err() {
                                        return Outcome::Closed;
                                    }
                                    buf.extend_from_slice(&out);
                                }
                                _ => return Outcome::Closed,
                            }
                        }
                        let (pending_raw, inflate_history) =
                            decoder.map(|d| d.handoff_state()).unwrap_or_default();
                        return Outcome::HandOff {
                            target,
                            pending: buf,
                            pending_raw,
                            inflate_history,
                        };
                    }
                    let frame = buf.split_to(n).freeze();
                    mpub_checked = false;
                    match exec(server, stream, client, cmd, &frame).await {
                        Err(Fatal) => return Outcome::Closed,
                        Ok(Upgrade::None) => {}
                        Ok(Upgrade::Tls(want)) => {
                            // What follows the IDENTIFY is the client's TLS handshake.
                            let early = buf.split();
                            if let Err(e) = upgrade_tls(server, stream, client, &early).await {
                                log::info!(
                                    "PROTOCOL(V2): [{}] E_IDENTIFY_FAILED IDENTIFY failed {e}",
                                    client.remote_address
                                );
                                return Outcome::Closed;
                            }
                            client.send_frame(FRAME_RESPONSE, b"OK");
                            if want != Compression::None {
                                client.compression.set(want);
                                client.compress_from.set(Some(client.out.borrow().len()));
                                client.send_frame(FRAME_RESPONSE, b"OK");
                                let Ok(d) = Decoder::new(want, Vec::new(), Vec::new()) else {
                                    return Outcome::Closed;
                                };
                                decoder = d;
                            }
                        }
                        Ok(Upgrade::Compression) => {
                            // IDENTIFY switched the stream to snappy or deflate: what
                            // follows it, read already or not, is compressed.
                            let rest = buf.split();
                            let Ok(Some(mut d)) =
                                Decoder::new(client.compression.get(), Vec::new(), Vec::new())
                            else {
                                return Outcome::Closed;
                            };
                            let mut out = Vec::new();
                            if d.feed(&rest, &mut out).is_err() {
                                return Outcome::Closed;
                            }
                            buf.extend_from_slice(&out);
                            decoder = Some(d);
                        }
                    }
                }
                Err(e) => {
                    if let Some(t) = &e.creates_topic {
                        server.create_topic(t).await;
                    }
                    if !e.silent {
                        log::info!(
                            "PROTOCOL(V2): [{}] {} {}",
                            client.remote_address,
                            e.code,
                            e.text
                        );
                        client.send_frame(FRAME_ERROR, &e.frame_data());
                    }
                    return Outcome::Closed;
                }
            }
        }
        if eof {
            return Outcome::Closed;
        }
        let old = buf.len();
        // The read size follows the traffic: small for a trickle of commands (a buffer
        // whose frames are still referenced cannot be reused, so each read may allocate),
        // READ_CHUNK for a busy producer.
        match stream.read_append(&mut buf, chunk).await {
            Ok(0) => {
                eof = true;
            }
            Ok(n) => {
                if let Some(d) = decoder.as_mut() {
                    let raw = buf.split_off(old);
                    let mut out = Vec::new();
                    if let Err(e) = d.feed(&raw, &mut out) {
                        log::info!(
                            "PROTOCOL(V2): [{}] compressed stream error - {e}",
                            client.remote_address
                        );
                        return Outcome::Closed;
                    }
                    buf.extend_from_slice(&out);
                }
                chunk = if n == chunk {
                    (chunk * 2).min(READ_CHUNK)
                } else if n < chunk / 4 {
                    (chunk / 2).max(MIN_READ_CHUNK)
                } else {
                    chunk
                };
            }
            Err(_) => return Outcome::Closed,
        }
    }
}

/// The shard a connection must move to before `cmd` runs: a SUB always runs on the
/// topic's owner; a connection's first publish moves it to that topic's owner, so a
/// producer of one topic publishes without crossing shards.
fn hand_off_target(server: &Server, client: &Client, cmd: &Command) -> Option<usize> {
    let shard = &server.shard;
    if shard.count == 1 {
        return None;
    }
    let topic = match cmd {
        Command::Sub { topic, .. } => topic,
        Command::Pub { topic, .. } | Command::Mpub { topic, .. } | Command::Dpub { topic, .. }
            if client.state.get() == ClientState::Init && client.pub_counts.borrow().is_empty() =>
        {
            topic
        }
        _ => return None,
    };
    let owner = owner_of(topic, shard.count);
    (owner != shard.index).then_some(owner)
}

/// The first word of the command line in `buf` (nsqd's params[0]), once the line is
/// complete.
fn command_word(buf: &[u8]) -> Option<&[u8]> {
    let end = buf.iter().position(|&b| b == b'\n')?;
    let mut line = &buf[..end];
    if let Some(l) = line.strip_suffix(b"\r") {
        line = l;
    }
    Some(line.split(|&b| b == b' ').next().unwrap_or(line))
}

/// The IDENTIFY reply is queued: gets it onto the wire plain, then runs the server side
/// of the TLS handshake (nsqd: IDENTIFY, clientV2.UpgradeTLS, with its 5 s deadline).
async fn upgrade_tls(
    server: &Server,
    stream: &SharedStream,
    client: &Client,
    early: &[u8],
) -> io::Result<()> {
    let Some(cfg) = server.cfg.tls.clone() else {
        return Err(io::Error::other("TLS is not configured"));
    };
    while !client.out.borrow().is_empty() && !client.closed.get() {
        client.flush_now.set(true);
        client.wake.notify();
        client.drained.wait().await;
    }
    log::info!(
        "PROTOCOL(V2): [{}] upgrading connection to TLS",
        client.remote_address
    );
    let hs = stream.accept_tls(cfg, early);
    let r = glommio::timer::timeout(Duration::from_secs(5), async {
        hs.await.map_err(glommio::GlommioError::IoError)
    })
    .await;
    match r {
        Ok(()) => {
            *client.tls.borrow_mut() = stream.tls_info();
            Ok(())
        }
        Err(glommio::GlommioError::IoError(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "TLS handshake timed out",
        )),
    }
}

/// What a command asks of the connection once its reply is queued.
enum Upgrade {
    None,
    /// IDENTIFY switched the stream to snappy or deflate.
    Compression,
    /// IDENTIFY granted `tls_v1`: the TLS handshake follows the reply, then the given
    /// compression if any.
    Tls(Compression),
}

/// Marker: the command failed fatally; its error frame is queued.
struct Fatal;

fn fatal<T>(client: &Client, text: String) -> Result<T, Fatal> {
    log::info!("PROTOCOL(V2): [{}] {}", client.remote_address, text);
    client.send_frame(FRAME_ERROR, text.as_bytes());
    Err(Fatal)
}

async fn exec(
    server: &Rc<Server>,
    stream: &SharedStream,
    client: &Rc<Client>,
    cmd: Command,
    frame: &Bytes,
) -> Result<Upgrade, Fatal> {
    let shard = &server.shard;
    match cmd {
        Command::Nop | Command::RdyIgnored => {}
        Command::Identify { body } => {
            let negotiated = {
                let mut s = client.settings.borrow_mut();
                match apply_identify(&frame[body], &mut s, &shard.opts) {
                    Ok(n) => n,
                    Err(e) => {
                        drop(s);
                        return fatal(client, format!("{} {}", e.code, e.text));
                    }
                }
            };
            apply_deadlines(stream, client);
            // nsqd's messagePump makes a new output-buffer ticker at IDENTIFY.
            let obt = client.settings.borrow().output_buffer_timeout;
            client
                .output_ticker
                .set(OutputTicker::new(Instant::now(), obt));
            if !negotiated.negotiate {
                client.send_frame(FRAME_RESPONSE, b"OK");
                return Ok(Upgrade::None);
            }
            if negotiated.snappy && negotiated.deflate {
                return fatal(
                    client,
                    "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression".into(),
                );
            }
            let current = client.compression.get();
            let mut shown = negotiated;
            // A TLS connection is not upgraded twice (a repeated IDENTIFY).
            let tls = negotiated.tls_v1 && server.cfg.tls.is_some() && !stream.is_tls();
            shown.tls_v1 = tls;
            if current != Compression::None {
                // Already compressed (a repeated IDENTIFY): no second upgrade.
                shown.snappy = current == Compression::Snappy;
                shown.deflate = matches!(current, Compression::Deflate(_));
            }
            let resp = identify_response(
                &client.settings.borrow(),
                &shard.opts,
                &shown,
                server.cfg.auth.enabled(),
            );
            client.send_frame(FRAME_RESPONSE, &resp);
            let want = if negotiated.snappy {
                Compression::Snappy
            } else if negotiated.deflate {
                Compression::Deflate(negotiated.deflate_level.clamp(1, 9) as u32)
            } else {
                Compression::None
            };
            let want = if current == Compression::None {
                want
            } else {
                Compression::None
            };
            if tls {
                return Ok(Upgrade::Tls(want));
            }
            if want != Compression::None {
                // nsqd: the JSON reply goes out plain, then an OK over the new transport.
                client.compression.set(want);
                client.compress_from.set(Some(client.out.borrow().len()));
                client.send_frame(FRAME_RESPONSE, b"OK");
                return Ok(Upgrade::Compression);
            }
        }
        Command::Auth { body } => {
            match crate::auth::auth(&server.cfg.auth, client, &frame[body]).await {
                Ok(resp) => client.send_frame(FRAME_RESPONSE, &resp),
                Err(text) => return fatal(client, text),
            }
        }
        Command::Sub { topic, channel } => {
            if let Err(text) =
                crate::auth::check(&server.cfg.auth, client, "SUB", &topic, &channel).await
            {
                return fatal(client, text);
            }
            if let Err(e) = shard.subscribe(client, &topic, &channel) {
                return fatal(client, format!("E_SUB_FAILED SUB failed {e}"));
            }
            client.send_frame(FRAME_RESPONSE, b"OK");
        }
        Command::Rdy { count } => {
            client.ready_count.set(count);
            if !client.is_ready() && !client.out.borrow().is_empty() {
                client.flush_now.set(true);
                client.wake.notify();
            }
            shard.client_ready_changed(client);
        }
        Command::Fin { id } => {
            let r = match MessageId::from_hex(&id) {
                Some(mid) => shard.finish(client, mid),
                None => Err(nsq_shards::channel::InFlightError::NotInFlight),
            };
            if let Err(e) = r {
                let text = format!(
                    "E_FIN_FAILED FIN {} failed {}",
                    String::from_utf8_lossy(&id),
                    e.text()
                );
                client.send_frame(FRAME_ERROR, text.as_bytes());
            }
        }
        Command::Req { id, timeout_ms } => {
            let max = shard.opts.max_req_timeout;
            let mut delay = Duration::from_millis(timeout_ms.max(0) as u64);
            if delay > max {
                log::info!(
                    "PROTOCOL(V2): [{}] REQ timeout {} out of range 0-{}. Setting to max.",
                    client.remote_address,
                    timeout_ms,
                    max.as_millis()
                );
                delay = max;
            }
            let r = match MessageId::from_hex(&id) {
                Some(mid) => shard.requeue(client, mid, delay),
                None => Err(nsq_shards::channel::InFlightError::NotInFlight),
            };
            if let Err(e) = r {
                let text = format!(
                    "E_REQ_FAILED REQ {} failed {}",
                    String::from_utf8_lossy(&id),
                    e.text()
                );
                client.send_frame(FRAME_ERROR, text.as_bytes());
            }
        }
        Command::Touch { id } => {
            let r = match MessageId::from_hex(&id) {
                Some(mid) => shard.touch(client, mid),
                None => Err(nsq_shards::channel::InFlightError::NotInFlight),
            };
            if let Err(e) = r {
                let text = format!(
                    "E_TOUCH_FAILED TOUCH {} failed {}",
                    String::from_utf8_lossy(&id),
                    e.text()
                );
                client.send_frame(FRAME_ERROR, text.as_bytes());
            }
        }
        Command::Cls => {
            client.ready_count.set(0);
            client.state.set(ClientState::Closing);
            client.send_frame(FRAME_RESPONSE, b"CLOSE_WAIT");
        }
        Command::Pub { topic, body } => {
            if let Err(text) = crate::auth::check(&server.cfg.auth, client, "PUB", &topic, "").await
            {
                return fatal(client, text);
            }
            let bodies = vec![frame.slice(body)];
            publish(server, client, &topic, bodies, None, "E_PUB_FAILED PUB").await?;
        }
        Command::Dpub {
            topic,
            defer_ms,
            body,
        } => {
            if let Err(text) =
                crate::auth::check(&server.cfg.auth, client, "DPUB", &topic, "").await
            {
                return fatal(client, text);
            }
            let bodies = vec![frame.slice(body)];
            let defer =
                (defer_ms > 0).then(|| Instant::now() + Duration::from_millis(defer_ms as u64));
            publish(server, client, &topic, bodies, defer, "E_DPUB_FAILED DPUB").await?;
        }
        // MPUB's auth check ran before its body was decoded (see `reader_loop`).
        Command::Mpub { topic, bodies } => {
            let bodies = bodies.into_iter().map(|r| frame.slice(r)).collect();
            publish(server, client, &topic, bodies, None, "E_MPUB_FAILED MPUB").await?;
        }
    }
    Ok(Upgrade::None)
}

async fn publish(
    server: &Rc<Server>,
    client: &Client,
    topic: &str,
    bodies: Vec<Bytes>,
    defer: Option<Instant>,
    err_prefix: &str,
) -> Result<(), Fatal> {
    let n = bodies.len() as u64;
    match server.publish(topic, bodies, defer).await {
        Ok(()) => {
            client.count_publish(topic, n);
            client.send_frame(FRAME_RESPONSE, b"OK");
            Ok(())
        }
        Err(e) => fatal(client, format!("{err_prefix} failed {}", e.text())),
    }
}

/// Output buffer capacity a connection keeps however little it sends (bytes).
const SPARE_KEEP: usize = 1 << 20;

/// Drains the client's output buffer to the socket with nsqd's flush rules (nsqd:
/// protocol_v2.go messagePump and Send): responses and errors at once; message frames
/// when the buffer holds output_buffer_size bytes, when the client is not ready, and at
/// a tick of the client's output-buffer ticker (every output_buffer_timeout, see
/// [`nsq_shards::client::OutputTicker`]). As in nsqd, the ticker holds one tick that
/// passed while nothing was buffered, so a message to a consumer that was idle for a
/// period goes out at once; in a stream a message waits at most one period (250 ms by
/// default) for a tick, or less for a full buffer. With output_buffer_timeout 0 a
/// delivery round is flushed as soon as the writer runs. Also sends `_heartbeat_` every
/// heartbeat interval.
async fn writer_loop(
    server: Rc<Server>,
    stream: SharedStream,
    client: Rc<Client>,
    handing_off: Rc<Cell<bool>>,
) {
    let mut spare: Vec<u8> = Vec::with_capacity(16 * 1024);
    // A connection handed over from another shard may already be compressed.
    let mut encoder = {
        let hist = client.deflate_out_history.borrow().clone();
        Encoder::new(client.compression.get(), true, &hist)
            .ok()
            .flatten()
    };
    let mut hb_interval = client.settings.borrow().heartbeat_interval;
    let mut next_hb = hb_interval.map(|d| Instant::now() + d);
    loop {
        let now = Instant::now();
        let (obs, obt, hb) = {
            let s = client.settings.borrow();
            (
                s.output_buffer_size,
                s.output_buffer_timeout,
                s.heartbeat_interval,
            )
        };
        if hb != hb_interval {
            hb_interval = hb;
            next_hb = hb.map(|d| now + d);
        }
        let closed = client.closed.get();
        let len = client.out.borrow().len();
        if !client.is_ready() {
            // nsqd flushes a client that is not ready (buffer_message and RDY ask for it
            // with flush_now) and counts its messagePump as flushed.
            client.pump_flushed.set(true);
        }
        // While messages went out since the last flush, the pump takes the ticks.
        let mut ticker = client.output_ticker.get();
        let tick = !client.pump_flushed.get() && ticker.due(now);
        if tick {
            ticker.take(now);
            client.output_ticker.set(ticker);
            client.pump_flushed.set(true);
        }
        let due =
            len > 0 && (closed || client.flush_now.get() || obt.is_zero() || len >= obs || tick);
        if due {
            std::mem::swap(&mut *client.out.borrow_mut(), &mut spare);
            client.flush_now.set(false);
            let res = match (client.compress_from.take(), encoder.as_mut()) {
                (Some(off), _) => {
                    // The IDENTIFY reply (before `off`) goes out plain, the rest compressed.
                    let off = off.min(spare.len());
                    let mut framed = spare[..off].to_vec();
                    match Encoder::new(client.compression.get(), false, &[]) {
                        Ok(Some(mut enc)) => {
                            let r = enc.encode(&client, &spare[off..], &mut framed);
                            encoder = Some(enc);
                            match r {
                                Ok(()) => stream.write_all(&framed).await,
                                Err(e) => Err(io::Error::other(e)),
                            }
                        }
                        _ => Err(io::Error::other("no encoder")),
                    }
                }
                (None, Some(enc)) => {
                    let mut framed = Vec::with_capacity(spare.len() / 2 + 64);
                    match enc.encode(&client, &spare, &mut framed) {
                        Ok(()) => stream.write_all(&framed).await,
                        Err(e) => Err(io::Error::other(e)),
                    }
                }
                (None, None) => stream.write_all(&spare).await,
            };
            client.drained.notify();
            server.shard.count_bytes_out(spare.len() as u64);
            // Keep the buffer's capacity while it is in use (a consumer with a large RDY
            // window gets RDY messages at once: regrowing from 16 KiB each time cost a
            // copy of everything on every doubling); give it back once traffic drops.
            if spare.capacity() > SPARE_KEEP && spare.len() < spare.capacity() / 8 {
                spare = Vec::with_capacity(16 * 1024);
            }
            spare.clear();
            if res.is_err() {
                client.closed.set(true);
                break;
            }
            continue;
        }
        if closed {
            break;
        }
        if let Some(t) = next_hb {
            if t <= now {
                client.send_frame(FRAME_RESPONSE, b"_heartbeat_");
                next_hb = hb_interval.map(|d| t.max(now - d) + d);
                continue;
            }
        }
        let mut wake_at = next_hb;
        if !client.pump_flushed.get() {
            wake_at = match (wake_at, ticker.next_tick()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        let wait = pin!(client.wake.wait());
        match wake_at {
            Some(t) => {
                let sleep = pin!(glommio::timer::sleep(t.saturating_duration_since(now)));
                select(wait, sleep).await;
            }
            None => wait.await,
        }
    }
    client.closed.set(true);
    client.drained.notify();
    if !handing_off.get() {
        stream.shutdown();
    }
}
