//! One connection's life after its magic: the reader loop that decodes and executes
//! commands (nsqd: protocol_v2.go IOLoop), started next to the writer task (nsqd:
//! messagePump, see [`super::writer`]), and what happens when it ends: close, or move
//! to another shard (see [`super::handoff`]).

use super::commands::{exec, fatal, Fatal, Upgrade};
use super::compress::Decoder;
use super::handoff::{self, Moved};
use super::stream::SharedStream;
use super::writer::writer_loop;
use crate::server::Server;
use bytes::BytesMut;
use nsq_shards::client::{Client, Compression};
use nsq_wire::compress::CompressError;
use nsq_wire::gobufio::GoBufReader;
use nsq_wire::v2::{
    self as protocol, Command, Context, Limits, ProtocolError, FRAME_ERROR, FRAME_RESPONSE,
};
use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::time::Duration;

/// Output bytes above which the reader stops taking commands until the writer drains.
const OUT_HIGH_WATER: usize = 1 << 20;

/// Smallest read size.
const MIN_READ_CHUNK: usize = 2048;

/// Largest read size (bytes asked of the socket per read when busy).
const READ_CHUNK: usize = 64 * 1024;

/// How the reader loop ended.
pub(super) enum Outcome {
    Closed,
    /// The next command must run on shard `target`: the connection moves there with
    /// what was read but not executed yet (decompressed in `pending`, still compressed
    /// in `pending_raw`) and the inflate window (the writer adds its deflate window).
    /// (Boxed: the reader's results stay small on the common path.)
    HandOff {
        target: usize,
        moved: Box<Moved>,
    },
}

/// Runs a connection on this shard: the writer task and the reader loop, from
/// `start.pending` (read already, decompressed) and the compression state it arrived
/// with (a connection resumed after a hand-off), until it closes or moves on.
/// `start.read_ahead`: where a Go nsqd's read buffer would stand from the start of
/// `pending` (0 on a new connection, after its magic), if known.
pub(super) async fn run_connection(
    server: Rc<Server>,
    stream: SharedStream,
    client: Rc<Client>,
    start: Moved,
) {
    let Moved {
        pending: buf,
        pending_raw,
        inflate_history,
        deflate_history,
        read_ahead,
    } = start;
    server.shard.register_client(&client);
    apply_deadlines(&stream, &client);
    let handing_off = Rc::new(Cell::new(false));
    let writer = glommio::spawn_local(writer_loop(
        server.clone(),
        stream.clone(),
        client.clone(),
        handing_off.clone(),
        deflate_history,
    ));
    let decoder = match Decoder::new(client.compression(), pending_raw, inflate_history, true) {
        Ok(d) => d,
        Err(e) => {
            log::error!(
                "PROTOCOL(V2): [{}] cannot resume compression - {e}",
                client.remote_address()
            );
            stream.shutdown();
            return;
        }
    };
    let outcome = Reader::new(&server, buf, decoder, read_ahead)
        .run(&server, &stream, &client)
        .await;
    if let Outcome::HandOff { .. } = outcome {
        handing_off.set(true);
    }
    client.kill();
    let deflate_history = writer.await;
    server.shard.client_gone(&client);
    crate::cluster::relay::client_gone(&server, &client);
    match outcome {
        Outcome::Closed => {
            log::info!("PROTOCOL(V2): [{}] exiting ioloop", client.remote_address());
        }
        Outcome::HandOff { target, mut moved } => {
            moved.deflate_history = deflate_history;
            handoff::send(&server, stream, &client, target, *moved).await;
        }
    }
}

/// nsqd's deadlines: reads must arrive within 2 x heartbeat interval, each write within
/// one interval; no deadlines with heartbeats disabled.
pub(super) fn apply_deadlines(stream: &SharedStream, client: &Client) {
    let hb = client.settings().heartbeat_interval;
    stream.set_read_timeout(hb.map(|d| d * 2));
    stream.set_write_timeout(hb);
}

/// The reader loop's state (nsqd: IOLoop's locals).
struct Reader {
    /// Read (and decompressed), not executed yet.
    buf: BytesMut,
    decoder: Option<Decoder>,
    eof: bool,
    /// The next read's size (bytes).
    chunk: usize,
    limits: Limits,
    auth_enabled: bool,
    /// True once the MPUB at the start of `buf` passed its auth check.
    mpub_checked: bool,
    /// Progress through an incomplete MPUB (buf only grows at its end until a command
    /// is consumed).
    resume: protocol::Resume,
    /// Where nsqd's read buffer would stand on this connection (plain TCP from its
    /// start only; `None` after TLS, compression or a hand-off).
    window: Option<NsqdWindow>,
    /// The compressed stream failed (corrupt, or ended) after decoding what `buf` now
    /// holds: reported once those commands have run, as Go's flate and snappy readers
    /// return the bytes they decoded before the error.
    failed: Option<CompressError>,
}

/// Decoded bytes one read of a compressed connection may add (a deflate stream expands
/// up to about 1,000 times: 64 KiB read could be 64 MiB of commands); past it the next
/// reads are smaller.
const DECODED_PER_READ: usize = 1 << 20;

/// Ends the reader loop with an outcome.
type Stop = Outcome;

impl Reader {
    /// `read_ahead`: see [`run_connection`]; unknown with compression.
    fn new(
        server: &Server,
        buf: BytesMut,
        decoder: Option<Decoder>,
        read_ahead: Option<usize>,
    ) -> Reader {
        let window = read_ahead
            .filter(|_| decoder.is_none())
            .map(NsqdWindow::new);
        Reader {
            window,
            buf,
            decoder,
            eof: false,
            chunk: MIN_READ_CHUNK,
            limits: Limits::from(&server.shard.opts),
            auth_enabled: server.cfg.auth.enabled(),
            mpub_checked: false,
            resume: protocol::Resume::default(),
            failed: None,
        }
    }

    /// Executes the commands read, reads more, until the connection closes or moves
    /// (nsqd: IOLoop).
    async fn run(
        mut self,
        server: &Rc<Server>,
        stream: &SharedStream,
        client: &Rc<Client>,
    ) -> Outcome {
        loop {
            if let Err(stop) = self.run_buffered(server, stream, client).await {
                return stop;
            }
            // Everything read was consumed: a buffer that grew for a large command (a
            // 1 MiB PUB, a 5 MiB MPUB) is let go, not kept for the connection's life (the
            // messages still referencing it keep only their share alive).
            if self.buf.is_empty() && self.buf.capacity() > 2 * READ_CHUNK {
                self.buf = BytesMut::new();
            }
            if self.eof {
                return Outcome::Closed;
            }
            if self.read_more(stream, client).await.is_err() {
                return Outcome::Closed;
            }
        }
    }

    /// Executes the complete commands in `buf`; Ok once it needs more input.
    async fn run_buffered(
        &mut self,
        server: &Rc<Server>,
        stream: &SharedStream,
        client: &Rc<Client>,
    ) -> Result<(), Stop> {
        let mut ran = 0u32;
        loop {
            if client.is_closed() {
                return Err(Outcome::Closed);
            }
            ran = ran.wrapping_add(1);
            if ran.is_multiple_of(32) {
                // A buffer of many small commands (a megabyte of NOPs) lets the shard's
                // other clients in between.
                glommio::yield_if_needed().await;
            }
            self.before_decode(server, stream, client).await?;
            let ctx = Context {
                state: client.state(),
                heartbeats_enabled: client.settings().heartbeat_interval.is_some(),
                limits: self.limits,
                eof: self.eof,
            };
            match protocol::decode_resume(&self.buf, &ctx, &mut self.resume) {
                Ok(None) => return Ok(()),
                Ok(Some((cmd, n))) => {
                    self.resume.clear();
                    self.run_command(server, stream, client, cmd, n).await?;
                }
                Err(e) => {
                    decode_failed(server, client, e).await;
                    self.reset_if_nsqd_leaves_input(stream, 0);
                    return Err(Outcome::Closed);
                }
            }
        }
    }

    /// What nsqd checks before a command is decoded: backpressure, the TLS policy and
    /// MPUB's auth.
    async fn before_decode(
        &mut self,
        server: &Server,
        stream: &SharedStream,
        client: &Client,
    ) -> Result<(), Stop> {
        // Backpressure: a client that does not read its replies stops being read
        // (nsqd blocks on its write the same way) instead of growing the buffer.
        let out = client.outbox();
        while out.buf().len() > OUT_HIGH_WATER && !out.is_closed() {
            out.request_flush();
            out.drained().wait().await;
        }
        if server.cfg.tls_required != crate::config::TLS_NOT_REQUIRED && !stream.is_tls() {
            // nsqd: enforceTLSPolicy, as soon as a command's line is read.
            if let Some(word) = command_word(&self.buf) {
                if word != b"IDENTIFY" {
                    let _ = fatal::<()>(
                        client,
                        format!(
                            "E_INVALID cannot {} in current state (TLS required)",
                            String::from_utf8_lossy(word)
                        ),
                    );
                    self.reset_if_nsqd_leaves_input(stream, 0);
                    return Err(Outcome::Closed);
                }
            }
        }
        // nsqd checks AUTH for MPUB before it reads the body (so a denied MPUB
        // answers at once and its body errors come after the auth errors).
        if self.auth_enabled && !self.mpub_checked {
            if let Some(topic) = protocol::mpub_line_topic(&self.buf) {
                let auth = &server.cfg.auth;
                if let Err(e) = crate::auth::check(auth, client, "MPUB", &topic, "").await {
                    let _ = fatal::<()>(client, e.to_string());
                    self.reset_if_nsqd_leaves_input(stream, 0);
                    return Err(Outcome::Closed);
                }
                self.mpub_checked = true;
            }
        }
        Ok(())
    }

    /// Runs `cmd`, the first `n` bytes of `buf`, here or moves the connection to the
    /// shard it must run on (the command then runs there).
    async fn run_command(
        &mut self,
        server: &Rc<Server>,
        stream: &SharedStream,
        client: &Rc<Client>,
        cmd: Command,
        n: usize,
    ) -> Result<(), Stop> {
        let target = handoff::target(server, client, &cmd);
        if let (Some(_), Some(e)) = (target, &self.failed) {
            // The stream broke or ended after this command: no flush point will come
            // to move it at. A publish runs here (forwarded to its topic's shard); a SUB,
            // which must run there, ends the connection with the stream's error.
            if matches!(cmd, Command::Sub { .. }) {
                self.decode_failed(stream, client, e);
                return Err(Outcome::Closed);
            }
        } else if let Some(target) = target {
            let (pending_raw, inflate_history) =
                handoff::wait_flush_point(stream, &mut self.decoder, &mut self.buf).await?;
            let moved = Moved {
                pending: std::mem::take(&mut self.buf),
                pending_raw,
                inflate_history,
                deflate_history: Vec::new(),
                read_ahead: self.window.map(|w| w.ahead()),
            };
            return Err(Outcome::HandOff {
                target,
                moved: Box::new(moved),
            });
        }
        let frame = self.buf.split_to(n).freeze();
        log_command(client, &frame);
        self.mpub_checked = false;
        if let Some(w) = &mut self.window {
            w.consume(&frame);
        }
        match exec(server, stream, client, cmd, &frame).await {
            Err(Fatal) => {
                // nsqd had read the whole command (its body too) when it failed.
                self.reset_if_nsqd_leaves_input(stream, n);
                Err(Outcome::Closed)
            }
            Ok(Upgrade::None) => Ok(()),
            Ok(Upgrade::Tls(want)) => self.start_tls(server, stream, client, want).await,
            Ok(Upgrade::Compression) => self.start_compression(client, stream),
        }
    }

    /// IDENTIFY granted TLS: what follows it is the client's TLS handshake; then the
    /// compression it asked for, if any.
    async fn start_tls(
        &mut self,
        server: &Server,
        stream: &SharedStream,
        client: &Client,
        want: Compression,
    ) -> Result<(), Stop> {
        let early = self.buf.split();
        // Boxed: the handshake's state is 10 KB, which would otherwise sit in every
        // connection's task, TLS or not, for its whole life.
        if let Err(e) = Box::pin(upgrade_tls(server, stream, client, &early)).await {
            log::error!(
                "[{}] - E_IDENTIFY_FAILED IDENTIFY failed {e} - {e}",
                client.remote_address()
            );
            return Err(Outcome::Closed);
        }
        client.send_frame(FRAME_RESPONSE, b"OK");
        if want != Compression::None {
            client.set_compression(want);
            let out = client.outbox();
            out.set_compress_from(Some(out.buf().len()));
            client.send_frame(FRAME_RESPONSE, b"OK");
            let Ok(d) = Decoder::new(want, Vec::new(), Vec::new(), false) else {
                return Err(Outcome::Closed);
            };
            self.decoder = d;
            self.window = None;
        }
        Ok(())
    }

    /// IDENTIFY switched the stream to snappy or deflate: what follows it, read already
    /// or not, is compressed.
    fn start_compression(&mut self, client: &Client, stream: &SharedStream) -> Result<(), Stop> {
        match client.compression() {
            Compression::Snappy => log::info!(
                "PROTOCOL(V2): [{}] upgrading connection to snappy",
                client.remote_address()
            ),
            Compression::Deflate(level) => log::info!(
                "PROTOCOL(V2): [{}] upgrading connection to deflate (level {level})",
                client.remote_address()
            ),
            Compression::None => {}
        }
        let rest = self.buf.split();
        let Ok(Some(mut d)) = Decoder::new(client.compression(), Vec::new(), Vec::new(), false)
        else {
            return Err(Outcome::Closed);
        };
        let mut out = Vec::new();
        if let Err(e) = d.feed(&rest, &mut out) {
            if out.is_empty() {
                stream.reset_on_close_if_input_over(d.unread_after_error(), 0);
                return Err(Outcome::Closed);
            }
            self.failed = Some(e);
        }
        self.buf.extend_from_slice(&out);
        self.decoder = Some(d);
        self.window = None;
        Ok(())
    }

    /// Reads from the socket onto `buf`, decompressing; sets `eof` at end of stream.
    /// Err: the connection is done (a read error or a corrupt compressed stream).
    async fn read_more(&mut self, stream: &SharedStream, client: &Client) -> Result<(), ()> {
        if let Some(e) = self.failed.take() {
            self.decode_failed(stream, client, &e);
            return Err(());
        }
        // A client whose input never runs dry (a flood of commands, a small deflate
        // stream that expands to a large one) must not keep the shard from its others.
        glommio::yield_if_needed().await;
        let old = self.buf.len();
        // The read size follows the traffic: small for a trickle of commands (a buffer
        // whose frames are still referenced cannot be reused, so each read may allocate),
        // READ_CHUNK for a busy producer. A PUB or MPUB whose size is in gets room for
        // all of it at once: grown READ_CHUNK by READ_CHUNK, its buffer would be copied
        // again at each reallocation.
        let rest = match self.decoder {
            None => nsq_wire::v2::command_len(&self.buf).map_or(0, |len| {
                let limit = self.limits.max_body_size.max(self.limits.max_msg_size);
                len.saturating_sub(old).min(
                    usize::try_from(limit)
                        .unwrap_or(0)
                        .saturating_add(READ_CHUNK),
                )
            }),
            Some(_) => 0,
        };
        let n = stream
            .read_append(&mut self.buf, self.chunk.max(rest))
            .await
            .map_err(|_| ())?;
        if n == 0 {
            self.eof = true;
            return Ok(());
        }
        if let Some(d) = self.decoder.as_mut() {
            let raw = self.buf.split_off(old);
            let mut out = Vec::new();
            let fed = d.feed(&raw, &mut out);
            let decoded = out.len();
            self.buf.extend_from_slice(&out);
            if let Err(e) = fed {
                if decoded == 0 {
                    self.decode_failed(stream, client, &e);
                    return Err(());
                }
                self.failed = Some(e);
            }
            if decoded > DECODED_PER_READ {
                // Highly compressed input: smaller reads keep what one read decodes
                // (and the memory it takes) near DECODED_PER_READ.
                self.chunk = (n * DECODED_PER_READ / decoded).max(MIN_READ_CHUNK / 4);
                return Ok(());
            }
        }
        let chunk = self.chunk;
        self.chunk = if n == chunk {
            (chunk * 2).min(READ_CHUNK)
        } else if n < chunk / 4 {
            (chunk / 2).max(MIN_READ_CHUNK)
        } else {
            chunk
        };
        Ok(())
    }
}

impl Reader {
    /// The compressed stream failed (`e`): logged as nsqd's IOLoop logs a failed read
    /// (tcp.go's Handle), the close a reset when nsqd would leave input unread.
    fn decode_failed(&self, stream: &SharedStream, client: &Client, e: &CompressError) {
        log::error!(
            "client({}) - failed to read command - {e}",
            client.remote_address()
        );
        if let Some(d) = &self.decoder {
            stream.reset_on_close_if_input_over(d.unread_after_error(), 0);
        }
    }

    /// nsqd reads a connection through a 16 KiB buffer (bufio, defaultBufferSize): after
    /// a fatal error it closes with what the client sent beyond its buffer unread, and
    /// the kernel resets the connection instead of closing it (a size over the limit
    /// followed by its long body, an over-long line, commands pipelined past a bad one).
    /// The same here: a reset when the input from the failing command's start (`done`
    /// bytes of it consumed, what `buf` holds, what the socket still holds) runs past
    /// nsqd's buffer ([`NsqdWindow`]; where that is unknown, 16 KiB from the failing
    /// command, the window of a command that starts a read).
    fn reset_if_nsqd_leaves_input(&self, stream: &SharedStream, done: usize) {
        let ahead = match self.window {
            Some(w) if done > 0 => w.ahead() + done,
            Some(w) => w.after_line(&self.buf),
            None => protocol::MAX_LINE,
        };
        stream.reset_on_close_if_input_over(done + self.buf.len(), ahead);
    }
}

/// nsqd's read buffer (bufio, 16 KiB) over a plain connection: nsqd reads the 4-byte
/// magic straight from the socket, then each command's line with ReadSlice and each size
/// and body with io.ReadFull.
#[derive(Clone, Copy)]
struct NsqdWindow(GoBufReader);

impl NsqdWindow {
    fn new(ahead: usize) -> NsqdWindow {
        NsqdWindow(GoBufReader::with_ahead(protocol::MAX_LINE, ahead))
    }

    fn ahead(&self) -> usize {
        self.0.ahead()
    }

    /// Accounts for a command nsqd read whole: its line, and for the commands with a
    /// body (PUB, DPUB, MPUB, IDENTIFY, AUTH: any frame longer than its line) the 4-byte
    /// size and the body.
    fn consume(&mut self, frame: &[u8]) {
        let n = frame.len();
        let line = frame.iter().position(|&b| b == b'\n').map_or(n, |p| p + 1);
        self.0.read_line(line);
        if n > line {
            let size = (n - line).min(4);
            self.0.read_full(size);
            self.0.read_full(n - line - size);
        }
    }

    /// Where the buffer ends once nsqd read the line of the command at the start of
    /// `buf` (the line it failed on; up to 16 KiB when the line has no end).
    fn after_line(&self, buf: &[u8]) -> usize {
        let size = protocol::MAX_LINE;
        let line = buf
            .iter()
            .take(size)
            .position(|&b| b == b'\n')
            .map_or(size, |p| p + 1);
        self.0.after_line(line)
    }
}

/// A command that cannot be decoded ends the connection, with its error frame unless
/// silent (nsqd: IOLoop sends the error of a failed Exec, then closes on a fatal one).
async fn decode_failed(server: &Server, client: &Client, e: ProtocolError) {
    if let Some(t) = &e.creates_topic {
        server.create_topic(t).await;
    }
    if !e.silent {
        log::error!("[{}] - {} {}", client.remote_address(), e.code, e.text);
        client.send_frame(FRAME_ERROR, &e.frame_data());
    }
}

/// Logs a command's line at debug, as nsqd's IOLoop does (`PROTOCOL(V2): [addr] [PUB t]`:
/// Go's `%s` of the line split on spaces).
fn log_command(client: &Client, frame: &[u8]) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    let end = frame
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(frame.len());
    let line = frame[..end].strip_suffix(b"\r").unwrap_or(&frame[..end]);
    log::debug!(
        "PROTOCOL(V2): [{}] [{}]",
        client.remote_address(),
        String::from_utf8_lossy(line)
    );
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
    let out = client.outbox();
    while !out.buf().is_empty() && !out.is_closed() {
        out.request_flush();
        out.drained().wait().await;
    }
    log::info!(
        "PROTOCOL(V2): [{}] upgrading connection to TLS",
        client.remote_address()
    );
    let hs = stream.accept_tls(cfg, early);
    let r = glommio::timer::timeout(Duration::from_secs(5), async {
        hs.await.map_err(glommio::GlommioError::IoError)
    })
    .await;
    match r {
        Ok(()) => {
            client.set_tls(stream.tls_info());
            Ok(())
        }
        Err(glommio::GlommioError::IoError(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "TLS handshake timed out",
        )),
    }
}
