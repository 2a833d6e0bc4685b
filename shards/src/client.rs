//! The shard-side handle of one TCP client connection (nsqd: client_v2.go).
//!
//! The connection's reader task (root crate) and the shard's delivery code both hold an
//! `Rc<Client>`; the connection's writer task drains its [`Outbox`] to the socket.
//! Everything is single-threaded: a client lives on exactly one shard at a time and
//! moves between shards only as a [`ClientSnapshot`] inside a connection hand-off.
//!
//! A `Client` is the consumer's and producer's state the core works with: RDY,
//! in-flight count, subscription, the IDENTIFY settings, AUTH and the stats counters.
//! Of the connection it keeps only the output buffer that delivery writes to
//! ([`Outbox`]) and what /stats and the auth server are told about the transport
//! (`Transport`); the socket, TLS session, compressors and deadlines are the root
//! crate's (src/tcp).

mod outbox;

pub use outbox::{Outbox, OutputTicker};

use crate::auth::AuthState;
use crate::message::Message;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, Ref, RefCell, RefMut};
use std::time::Instant;

/// Stream compression negotiated by IDENTIFY (nsqd: snappy framing or raw deflate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compression {
    None,
    Snappy,
    /// Raw DEFLATE at this level (1-9).
    Deflate(u32),
}

pub use nsq_wire::identify::ClientSettings;
pub use nsq_wire::v2::ClientState;

/// A TLS connection's parameters as nsqd's /stats and its auth request name them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsInfo {
    /// Go crypto/tls's version name: `TLS1.2`, `TLS1.3`.
    pub version: String,
    /// Go's cipher suite name, e.g. `TLS_AES_128_GCM_SHA256`.
    pub cipher_suite: String,
    /// The client certificate's subject common name (empty without a certificate).
    pub common_name: String,
}

/// The least pending output (bytes) at which delivery skips a client: see
/// [`Client::out_high_water`].
pub const OUT_HIGH_WATER_MIN: usize = 64 * 1024;

/// Everything about a client that moves with its connection when it is handed to another
/// shard (plain data, `Send`), one field per piece of that state, so it stays flat. The
/// socket, TLS session and compressor state travel beside it in the root crate's hand-off
/// message.
#[derive(Clone, Debug)]
pub struct ClientSnapshot {
    pub id: u64,
    pub remote_address: String,
    pub connect_ts: i64,
    pub settings: ClientSettings,
    pub state: ClientState,
    pub message_count: u64,
    pub finish_count: u64,
    pub requeue_count: u64,
    pub pub_counts: Vec<(String, u64)>,
    /// The compression the connection negotiated with IDENTIFY.
    pub compression: Compression,
    /// The output-buffer ticker and messagePump `flushed` state: the ticker keeps its
    /// phase (from IDENTIFY) on the new shard, as nsqd's would.
    pub output_ticker: OutputTicker,
    pub pump_flushed: bool,
    /// With TLS: what /stats and the auth server are told about it.
    pub tls: Option<TlsInfo>,
    /// The secret of the last AUTH (kept to query the auth server again on expiry).
    pub auth_secret: Option<Vec<u8>>,
    /// What the auth server granted (nsqd: clientV2.AuthState).
    pub auth: Option<AuthState>,
}

/// What /stats counts for a connection (nsqd: clientV2's MessageCount, FinishCount,
/// RequeueCount and PubCounts).
#[derive(Default)]
struct Counters {
    messages: Cell<u64>,
    finishes: Cell<u64>,
    requeues: Cell<u64>,
    /// Messages published per topic.
    published: RefCell<Vec<(String, u64)>>,
}

/// AUTH's state (nsqd: clientV2.AuthSecret and AuthState).
#[derive(Default)]
struct ClientAuth {
    /// The secret of the last AUTH (kept to query the auth server again on expiry).
    secret: RefCell<Option<Vec<u8>>>,
    /// What the auth server granted, None before AUTH.
    state: RefCell<Option<AuthState>>,
}

/// What the connection's transport negotiated, as /stats and the auth server see it
/// (the connection code in the root crate sets it when IDENTIFY upgrades the stream).
struct Transport {
    /// Stats `snappy` / `deflate`; the writer and reader build their codecs from it.
    compression: Cell<Compression>,
    /// Stats `tls`, `tls_version`, `tls_cipher_suite`; the auth request's `tls` and
    /// `common_name`.
    tls: RefCell<Option<TlsInfo>>,
}

/// The shard-side view of one connection (see the module doc). The consumer fields are
/// the crate's; the connection's reader and writer tasks (root crate) use methods.
pub struct Client {
    pub(crate) id: u64,
    pub(crate) remote_address: String,
    /// Unix seconds when the TCP connection was accepted.
    pub(crate) connect_ts: i64,
    pub(crate) settings: RefCell<ClientSettings>,
    pub(crate) state: Cell<ClientState>,
    /// RDY: the most messages this client may have in flight (a window, not used up).
    pub(crate) ready_count: Cell<i64>,
    pub(crate) in_flight: Cell<i64>,
    /// (topic, channel) after SUB.
    pub(crate) subscription: RefCell<Option<(String, String)>>,
    counters: Counters,
    auth: ClientAuth,
    transport: Transport,
    /// Frames waiting for the writer task, and its flush state.
    out: Outbox,
}

impl Client {
    pub fn new(id: u64, remote_address: String, settings: ClientSettings) -> Client {
        let ticker = OutputTicker::new(Instant::now(), settings.pump.output_buffer_timeout);
        Client {
            id,
            remote_address,
            connect_ts: (crate::message::now_unix_nanos() / 1_000_000_000),
            settings: RefCell::new(settings),
            state: Cell::new(ClientState::Init),
            ready_count: Cell::new(0),
            in_flight: Cell::new(0),
            subscription: RefCell::new(None),
            counters: Counters::default(),
            auth: ClientAuth::default(),
            transport: Transport {
                compression: Cell::new(Compression::None),
                tls: RefCell::new(None),
            },
            out: Outbox::new(ticker),
        }
    }

    /// Rebuilds a client from a hand-off snapshot on its new shard.
    pub fn from_snapshot(s: ClientSnapshot) -> Client {
        let c = Client::new(s.id, s.remote_address, s.settings);
        c.state.set(s.state);
        c.counters.messages.set(s.message_count);
        c.counters.finishes.set(s.finish_count);
        c.counters.requeues.set(s.requeue_count);
        *c.counters.published.borrow_mut() = s.pub_counts;
        c.transport.compression.set(s.compression);
        *c.transport.tls.borrow_mut() = s.tls;
        c.out.set_ticker(s.output_ticker);
        c.out.set_pump_flushed(s.pump_flushed);
        *c.auth.secret.borrow_mut() = s.auth_secret;
        *c.auth.state.borrow_mut() = s.auth;
        Client {
            connect_ts: s.connect_ts,
            ..c
        }
    }

    pub fn snapshot(&self) -> ClientSnapshot {
        ClientSnapshot {
            id: self.id,
            remote_address: self.remote_address.clone(),
            connect_ts: self.connect_ts,
            settings: self.settings.borrow().clone(),
            state: self.state.get(),
            message_count: self.counters.messages.get(),
            finish_count: self.counters.finishes.get(),
            requeue_count: self.counters.requeues.get(),
            pub_counts: self.counters.published.borrow().clone(),
            compression: self.transport.compression.get(),
            output_ticker: self.out.ticker(),
            pump_flushed: self.out.pump_flushed(),
            tls: self.transport.tls.borrow().clone(),
            auth_secret: self.auth.secret.borrow().clone(),
            auth: self.auth.state.borrow().clone(),
        }
    }

    /// The process-unique client id (the shard index in the top bits).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The peer's `ip:port` as nsqd logs and shows it.
    pub fn remote_address(&self) -> &str {
        &self.remote_address
    }

    /// Unix seconds when the TCP connection was accepted.
    pub fn connect_ts(&self) -> i64 {
        self.connect_ts
    }

    /// The connection's state (stats `state`).
    pub fn state(&self) -> ClientState {
        self.state.get()
    }

    pub fn set_state(&self, state: ClientState) {
        self.state.set(state);
    }

    /// RDY: the most messages this client may have in flight at once.
    pub fn ready_count(&self) -> i64 {
        self.ready_count.get()
    }

    /// RDY `count` (already range-checked against `--max-rdy-count` by the codec). A
    /// window, not a budget: it is not used up by deliveries (nsqd: SetReadyCount).
    pub fn set_ready_count(&self, count: i64) {
        self.ready_count.set(count);
    }

    /// Messages delivered to this client and not yet finished, requeued or timed out.
    pub fn in_flight_count(&self) -> i64 {
        self.in_flight.get()
    }

    /// Sets the messages counted in flight to this client by a relay, which passes on
    /// another member's deliveries (a replicated topic's leader): counted as a delivery
    /// here is, so that its output is flushed once it holds as many as its RDY allows
    /// ([`Client::is_ready`]), not only at its output buffer timeout.
    pub fn set_relayed_in_flight(&self, n: i64) {
        self.in_flight.set(n.max(0));
    }

    /// Messages delivered to this client (stats `message_count`).
    pub fn message_count(&self) -> u64 {
        self.counters.messages.get()
    }

    /// FINs (stats `finish_count`).
    pub fn finish_count(&self) -> u64 {
        self.counters.finishes.get()
    }

    /// REQs (stats `requeue_count`).
    pub fn requeue_count(&self) -> u64 {
        self.counters.requeues.get()
    }

    /// Counts a delivery (stats `message_count`).
    pub(crate) fn count_delivery(&self) {
        bump(&self.counters.messages);
    }

    /// Counts a FIN (stats `finish_count`).
    pub(crate) fn count_finish(&self) {
        bump(&self.counters.finishes);
    }

    /// Counts a REQ (stats `requeue_count`).
    pub(crate) fn count_requeue(&self) {
        bump(&self.counters.requeues);
    }

    /// Messages published per topic by this connection (stats `pub_counts`).
    pub fn pub_counts(&self) -> Ref<'_, Vec<(String, u64)>> {
        self.counters.published.borrow()
    }

    /// Counts a publish of `n` messages to `topic` for stats `pub_counts`.
    pub fn count_publish(&self, topic: &str, n: u64) {
        let mut pc = self.counters.published.borrow_mut();
        match pc.iter_mut().find(|(t, _)| t == topic) {
            Some((_, c)) => *c += n,
            None => pc.push((topic.to_string(), n)),
        }
    }

    /// (topic, channel) after SUB.
    pub fn subscription(&self) -> Option<(String, String)> {
        self.subscription.borrow().clone()
    }

    /// The settings IDENTIFY negotiated.
    pub fn settings(&self) -> Ref<'_, ClientSettings> {
        self.settings.borrow()
    }

    pub fn settings_mut(&self) -> RefMut<'_, ClientSettings> {
        self.settings.borrow_mut()
    }

    /// The output buffer and the writer's flush state.
    #[inline]
    pub fn outbox(&self) -> &Outbox {
        &self.out
    }

    /// Output not yet written to the socket (bytes): buffered plus what the writer task
    /// is writing.
    pub fn pending_out(&self) -> usize {
        self.out.pending()
    }

    /// Pending output (bytes) at or above which delivery skips this client:
    /// max(output_buffer_size, [`OUT_HIGH_WATER_MIN`]). nsqd's messagePump takes no
    /// message from the channel while its write to the client blocks, so a client that
    /// does not read holds at most its bufio buffer (output_buffer_size) and the
    /// message being written, whatever its RDY; here the writer writes everything it
    /// took at once, so the pending output is the measure. The floor keeps a consumer
    /// with output buffering off (`output_buffer_size` -1, 1 byte) or tiny batching
    /// several messages per write instead of one delivery round per message; 64 KiB is
    /// nsqd's default `--max-output-buffer-size`. A message is still delivered below
    /// the mark whatever its size, so a client with nothing pending always gets one.
    pub fn out_high_water(&self) -> usize {
        self.settings
            .borrow()
            .output_buffer_size
            .max(OUT_HIGH_WATER_MIN)
    }

    /// True while the pending output is at or above [`Client::out_high_water`]: the
    /// socket is not taking what was sent, and delivery skips the client.
    pub fn output_full(&self) -> bool {
        self.pending_out() >= self.out_high_water()
    }

    /// Delivery skipped this client for a full output (see [`Client::output_full`]).
    pub fn hold_back(&self) {
        self.out.set_held_back(true);
    }

    /// True, once, when delivery skipped this client for a full output and the writer
    /// has drained it below the mark since: the caller must deliver to it again.
    pub fn resume_delivery(&self) -> bool {
        if self.out.held_back() && !self.output_full() {
            self.out.set_held_back(false);
            return true;
        }
        false
    }

    /// With TLS: what /stats and the auth server are told about it.
    pub fn tls(&self) -> Ref<'_, Option<TlsInfo>> {
        self.transport.tls.borrow()
    }

    pub fn set_tls(&self, tls: Option<TlsInfo>) {
        *self.transport.tls.borrow_mut() = tls;
    }

    /// The compression IDENTIFY negotiated.
    pub fn compression(&self) -> Compression {
        self.transport.compression.get()
    }

    pub fn set_compression(&self, c: Compression) {
        self.transport.compression.set(c);
    }

    /// True once the connection is going away.
    pub fn is_closed(&self) -> bool {
        self.out.is_closed()
    }

    /// The secret of the last AUTH.
    pub fn auth_secret(&self) -> Option<Vec<u8>> {
        self.auth.secret.borrow().clone()
    }

    pub fn set_auth_secret(&self, secret: Option<Vec<u8>>) {
        *self.auth.secret.borrow_mut() = secret;
    }

    /// What the auth server granted, None before AUTH.
    pub fn auth(&self) -> Ref<'_, Option<AuthState>> {
        self.auth.state.borrow()
    }

    pub fn set_auth(&self, state: Option<AuthState>) {
        *self.auth.state.borrow_mut() = state;
    }

    /// nsqd `HasAuthorizations`: AUTH succeeded with at least one authorization.
    pub fn has_authorizations(&self) -> bool {
        self.auth
            .state
            .borrow()
            .as_ref()
            .is_some_and(|a| !a.authorizations.is_empty())
    }

    /// nsqd `IsReadyForMessages`: subscribed, RDY > 0 and in-flight below RDY.
    pub fn is_ready(&self) -> bool {
        !self.out.is_closed()
            && self.state.get() == ClientState::Subscribed
            && self.ready_count.get() > 0
            && self.in_flight.get() < self.ready_count.get()
    }

    /// Queues a response (type 0) or error (type 1) frame and flushes at once, as nsqd
    /// does for every response.
    pub fn send_frame(&self, frame_type: u32, data: &[u8]) {
        {
            let mut out = self.out.buf_mut();
            out.extend_from_slice(&((data.len() + 4) as u32).to_be_bytes());
            out.extend_from_slice(&frame_type.to_be_bytes());
            out.extend_from_slice(data);
        }
        self.out.request_flush();
    }

    /// Buffers one message frame (nsqd: SendMessage). A full buffer or a client that
    /// stops being ready flushes now; otherwise the writer waits for the output-buffer
    /// ticker (see [`OutputTicker`]).
    pub fn buffer_message(&self, msg: &Message) {
        self.buffer_with(|out| msg.write_frame(out));
    }

    /// [`Client::buffer_message`] for a message frame's data as another nsqd sent it (a
    /// consumer relayed from a follower to the topic's leader).
    pub fn buffer_message_frame(&self, data: &[u8]) {
        self.buffer_with(|out| {
            out.extend_from_slice(&((data.len() + 4) as u32).to_be_bytes());
            out.extend_from_slice(&nsq_wire::v2::FRAME_MESSAGE.to_be_bytes());
            out.extend_from_slice(data);
        });
    }

    fn buffer_with(&self, write: impl FnOnce(&mut Vec<u8>)) {
        let len = {
            let mut out = self.out.buf_mut();
            write(&mut out);
            out.len()
        };
        let was_flushed = self.out.unflush();
        let (full, untimed) = {
            let s = self.settings.borrow();
            (
                len >= s.output_buffer_size,
                s.pump.output_buffer_timeout.is_zero(),
            )
        };
        if full || !self.is_ready() {
            self.out.request_flush();
        } else if was_flushed || untimed {
            // The writer may be waiting without a timer: it must start taking ticks, or
            // (output_buffer_timeout 0) flush this delivery round.
            self.out.wake().notify();
        }
    }

    /// Asks the connection to close: the writer flushes what it has and shuts the socket,
    /// which ends the reader.
    pub fn kill(&self) {
        self.out.set_closed(true);
        self.out.wake().notify();
    }
}

fn bump(c: &Cell<u64>) {
    c.set(c.get() + 1);
}
