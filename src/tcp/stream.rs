//! The connection's socket, shared by its reader and writer tasks, plain or TLS (nsqd:
//! clientV2's net.Conn and its tls.Conn after UpgradeTLS).

use bytes::BytesMut;
use glommio::net::TcpStream;
use nsq_shards::client::TlsInfo;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

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
    /// The close is to be a reset ([`SharedStream::reset_on_close`]).
    reset: Cell<bool>,
    /// Decided at the close: a reset if this many bytes read plus those still in the
    /// socket run over the limit ([`SharedStream::reset_on_close_if_input_over`]).
    reset_over: Cell<Option<(usize, usize)>>,
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
            reset: Cell::new(false),
            reset_over: Cell::new(None),
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
    pub fn tls_info(&self) -> Option<TlsInfo> {
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
        Some(TlsInfo {
            version,
            cipher_suite: suite,
            common_name: cn,
        })
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

    /// Reads up to `max` bytes appended to `buf`, without zero-filling the space first.
    /// Returns the bytes read; 0 at end of stream.
    pub async fn read_append(&self, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
        read_into_spare(buf, max, async |area| self.read(area).await).await
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

    /// Shuts both directions so a blocked reader wakes up with EOF (only the read side
    /// after [`SharedStream::reset_on_close`]: no FIN goes out before the reset).
    pub fn shutdown(&self) {
        if let Some((read, limit)) = self.0.reset_over.take() {
            if read + self.unread_input() > limit {
                self.reset_on_close();
            }
        }
        let how = if self.0.reset.get() {
            std::net::Shutdown::Read
        } else {
            std::net::Shutdown::Both
        };
        let _ = self.with_socket(|s| s.shutdown(how));
    }

    /// Runs `f` on the socket (socket2's view of it, for options and shutdowns).
    fn with_socket<R>(&self, f: impl FnOnce(socket2::SockRef<'_>) -> R) -> R {
        // SAFETY: the fd is owned by the TcpStream inside self, alive for this call.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd()) };
        f(socket2::SockRef::from(&fd))
    }

    /// Makes the close abortive (an RST, `SO_LINGER` 0), as the close of a Go nsqd is
    /// when the client sent what it never read: the kernel then resets the connection
    /// (Linux tcp_close with unread data), where a close that read everything sends FIN.
    pub fn reset_on_close(&self) {
        let _ = self.with_socket(|s| s.set_linger(Some(Duration::ZERO)));
        self.0.reset.set(true);
    }

    /// Makes the close a reset if, at the close, `read` (bytes read but not used) plus
    /// what the socket still holds runs over `limit`: input a Go nsqd would have left
    /// unread. Decided at the close, not now, as the kernel decides nsqd's: the rest of
    /// a client's write may still be on its way when the failing command is read.
    pub fn reset_on_close_if_input_over(&self, read: usize, limit: usize) {
        self.0.reset_over.set(Some((read, limit)));
    }

    /// Closes now, as Go's plain close does: a reset when the socket still holds input
    /// nobody read (Linux tcp_close with unread data), else a FIN.
    pub fn close_now(&self) {
        if self.unread_input() > 0 {
            self.reset_on_close();
        }
        self.shutdown();
    }

    /// Bytes the socket has received and not given to a read yet (`FIONREAD`; 0 when
    /// the call fails).
    pub fn unread_input(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD stores one c_int through the pointer, which is valid for it.
        let r = unsafe { libc::ioctl(self.fd(), libc::FIONREAD, &mut n) };
        if r == 0 {
            n.max(0) as usize
        } else {
            0
        }
    }

    /// Ends the connection as Go's net/http does after answering a request whose input
    /// it left unread (server.go closeWriteAndWait: a head over the limit, a body over
    /// 256 KiB the handler did not read): FIN after the answer, then the socket stays
    /// open 500 ms (rstAvoidanceDelay) before both directions shut, so that a client
    /// still sending reads the answer before its unread input resets the connection.
    pub async fn close_write_and_wait(&self) {
        let _ = self.with_socket(|s| s.shutdown(std::net::Shutdown::Write));
        glommio::timer::sleep(Duration::from_millis(500)).await;
        self.shutdown();
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

/// Appends to `buf` what `read` writes into up to `room` bytes of its spare capacity
/// (reserved first), without zero-filling that space first: a memset of the whole read
/// area per read cost about as much as the copy of the data itself. `read` must only
/// write into the slice it is given (a socket read, a TLS session's decrypted bytes)
/// and return how many bytes it wrote. Returns that count; 0 at end of stream.
pub(crate) async fn read_into_spare(
    buf: &mut BytesMut,
    room: usize,
    read: impl AsyncFnOnce(&mut [u8]) -> io::Result<usize>,
) -> io::Result<usize> {
    buf.reserve(room);
    let spare = &mut buf.spare_capacity_mut()[..room];
    // SAFETY: the slice covers `room` bytes of `buf`'s allocated capacity. Its bytes
    // may be uninitialised; `read` only writes into it (glommio copies what recv
    // returned, the kernel writes it, or rustls copies decrypted bytes into it) and
    // never reads it, and only the `n` bytes it reports as written become part of
    // `buf` below.
    let area: &mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), room) };
    let n = read(area).await?.min(room);
    // SAFETY: the read initialised the first `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}
