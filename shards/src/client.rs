//! The shard-side handle of one TCP client connection (nsqd: client_v2.go).
//!
//! The connection's reader task (root crate) and the shard's delivery code both hold an
//! `Rc<Client>`; the connection's writer task drains `out` to the socket. Everything is
//! single-threaded: a client lives on exactly one shard at a time and moves between
//! shards only as a [`ClientSnapshot`] inside a connection hand-off.

use crate::auth::AuthState;
use crate::message::Message;
use crate::wake::Notify;
use serde::{Deserialize, Serialize};
use std::cell::{Cell, Ref, RefCell, RefMut};
use std::time::{Duration, Instant};

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

/// The least pending output (bytes) at which delivery skips a client: see
/// [`Client::out_high_water`].
pub const OUT_HIGH_WATER_MIN: usize = 64 * 1024;

/// nsqd's output-buffer ticker (protocol_v2.go messagePump: `outputBufferTicker`, made
/// when the connection starts and again at each IDENTIFY): it ticks every
/// output_buffer_timeout from its origin, and the writer flushes a client's buffered
/// messages at a tick. Like Go's ticker channel it holds one tick that nobody took: a
/// client whose messagePump was `flushed` (nothing buffered, not taking ticks) when a
/// tick passed gets its next message flushed at once, so a lone message to an idle
/// consumer does not wait; during a stream, messages wait for the next tick (at most one
/// period) or for a full buffer. With a zero period there are no ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputTicker {
    origin: Instant,
    period: Duration,
    /// The tick taken last (the origin before the first).
    taken: Instant,
}

impl OutputTicker {
    /// A ticker started at `now` with `period` (output_buffer_timeout).
    pub fn new(now: Instant, period: Duration) -> OutputTicker {
        OutputTicker {
            origin: now,
            period,
            taken: now,
        }
    }

    /// The first tick after the one taken last (held until taken), or `None` without
    /// ticks.
    pub fn next_tick(&self) -> Option<Instant> {
        let p = self.period.as_nanos();
        if p == 0 {
            return None;
        }
        let k = (self.taken - self.origin).as_nanos() / p + 1;
        Some(self.origin + Duration::from_nanos((k * p).min(u64::MAX as u128) as u64))
    }

    /// True when a tick is waiting to be taken at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.next_tick().is_some_and(|t| t <= now)
    }

    /// Takes the waiting tick at `now`: the next one comes a whole period after the
    /// latest tick at or before `now` (ticks in between are dropped, as Go's are).
    pub fn take(&mut self, now: Instant) {
        let p = self.period.as_nanos();
        if p == 0 || now < self.origin {
            return;
        }
        let k = (now - self.origin).as_nanos() / p;
        self.taken = self.origin + Duration::from_nanos((k * p).min(u64::MAX as u128) as u64);
    }
}

/// Everything about a client that moves with its connection when it is handed to another
/// shard (plain data, `Send`). One field per piece of that state, so it stays flat.
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
    /// With deflate: the last 32 KiB the server sent (the peer's inflate window), to
    /// prime the compressor that continues the stream on the new shard.
    pub deflate_out_history: Vec<u8>,
    /// The output-buffer ticker and messagePump `flushed` state: the ticker keeps its
    /// phase (from IDENTIFY) on the new shard, as nsqd's would.
    pub output_ticker: OutputTicker,
    pub pump_flushed: bool,
    /// With TLS: (version, cipher suite) as nsqd's /stats names them, and the client
    /// certificate's common name (empty without one).
    pub tls: Option<(String, String, String)>,
    /// The secret of the last AUTH (kept to query the auth server again on expiry).
    pub auth_secret: Option<Vec<u8>>,
    /// What the auth server granted (nsqd: clientV2.AuthState).
    pub auth: Option<AuthState>,
}

/// The shard-side view of one connection. Its fields are the crate's: the connection's
/// reader and writer tasks (root crate) read and set them through methods.
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
    pub(crate) message_count: Cell<u64>,
    pub(crate) finish_count: Cell<u64>,
    pub(crate) requeue_count: Cell<u64>,
    /// Messages published per topic by this connection (stats `pub_counts`).
    pub(crate) pub_counts: RefCell<Vec<(String, u64)>>,
    /// (topic, channel) after SUB.
    pub(crate) subscription: RefCell<Option<(String, String)>>,
    /// Frames waiting for the writer task.
    pub(crate) out: RefCell<Vec<u8>>,
    /// Bytes the writer task took from `out` and has not finished writing to the socket
    /// (nsqd: a messagePump blocked in its write).
    pub(crate) writing: Cell<usize>,
    /// Set when delivery skipped this client because its output was over the high-water
    /// mark; the writer asks for a delivery once it drains below (see
    /// [`Client::resume_delivery`]).
    pub(crate) held_back: Cell<bool>,
    /// The output-buffer ticker (nsqd: messagePump's outputBufferTicker).
    pub(crate) output_ticker: Cell<OutputTicker>,
    /// nsqd messagePump's `flushed`: false once a message frame was buffered, true again
    /// after a flush by the output-buffer ticker or for a client that is not ready. While
    /// it is false the writer takes the ticker's ticks.
    pub(crate) pump_flushed: Cell<bool>,
    /// With TLS: (version, cipher suite) as nsqd's /stats names them, and the client
    /// certificate's common name (empty without one).
    pub(crate) tls: RefCell<Option<(String, String, String)>>,
    /// Set when `out` must go out now (a response, an error, or the client stopped
    /// being ready).
    pub(crate) flush_now: Cell<bool>,
    /// Wakes the writer task.
    pub(crate) wake: Notify,
    /// Set once the connection is going away (read error, fatal error, kill).
    pub(crate) closed: Cell<bool>,
    /// Wakes a reader that stopped reading because `out` was too full (the writer
    /// drained some).
    pub(crate) drained: Notify,
    /// Compression negotiated (stats `snappy` / `deflate`).
    pub(crate) compression: Cell<Compression>,
    /// With deflate: the last 32 KiB sent (kept by the writer for a hand-off).
    pub(crate) deflate_out_history: RefCell<Vec<u8>>,
    /// Offset in `out` from which the writer must compress: the bytes before it (the
    /// IDENTIFY reply) still go out plain.
    pub(crate) compress_from: Cell<Option<usize>>,
    /// The secret of the last AUTH (nsqd: clientV2.AuthSecret).
    pub(crate) auth_secret: RefCell<Option<Vec<u8>>>,
    /// What the auth server granted, None before AUTH (nsqd: clientV2.AuthState).
    pub(crate) auth: RefCell<Option<AuthState>>,
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
            message_count: Cell::new(0),
            finish_count: Cell::new(0),
            requeue_count: Cell::new(0),
            pub_counts: RefCell::new(Vec::new()),
            subscription: RefCell::new(None),
            out: RefCell::new(Vec::new()),
            writing: Cell::new(0),
            held_back: Cell::new(false),
            output_ticker: Cell::new(ticker),
            pump_flushed: Cell::new(true),
            tls: RefCell::new(None),
            flush_now: Cell::new(false),
            wake: Notify::default(),
            closed: Cell::new(false),
            drained: Notify::default(),
            compression: Cell::new(Compression::None),
            deflate_out_history: RefCell::new(Vec::new()),
            compress_from: Cell::new(None),
            auth_secret: RefCell::new(None),
            auth: RefCell::new(None),
        }
    }

    /// Rebuilds a client from a hand-off snapshot on its new shard.
    pub fn from_snapshot(s: ClientSnapshot) -> Client {
        let c = Client::new(s.id, s.remote_address, s.settings);
        c.state.set(s.state);
        c.message_count.set(s.message_count);
        c.finish_count.set(s.finish_count);
        c.requeue_count.set(s.requeue_count);
        *c.pub_counts.borrow_mut() = s.pub_counts;
        c.compression.set(s.compression);
        c.output_ticker.set(s.output_ticker);
        c.pump_flushed.set(s.pump_flushed);
        *c.tls.borrow_mut() = s.tls;
        *c.deflate_out_history.borrow_mut() = s.deflate_out_history;
        *c.auth_secret.borrow_mut() = s.auth_secret;
        *c.auth.borrow_mut() = s.auth;
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
            message_count: self.message_count.get(),
            finish_count: self.finish_count.get(),
            requeue_count: self.requeue_count.get(),
            pub_counts: self.pub_counts.borrow().clone(),
            compression: self.compression.get(),
            deflate_out_history: self.deflate_out_history.borrow().clone(),
            output_ticker: self.output_ticker.get(),
            pump_flushed: self.pump_flushed.get(),
            tls: self.tls.borrow().clone(),
            auth_secret: self.auth_secret.borrow().clone(),
            auth: self.auth.borrow().clone(),
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

    /// Messages delivered to this client (stats `message_count`).
    pub fn message_count(&self) -> u64 {
        self.message_count.get()
    }

    /// FINs (stats `finish_count`).
    pub fn finish_count(&self) -> u64 {
        self.finish_count.get()
    }

    /// REQs (stats `requeue_count`).
    pub fn requeue_count(&self) -> u64 {
        self.requeue_count.get()
    }

    /// Messages published per topic by this connection (stats `pub_counts`).
    pub fn pub_counts(&self) -> std::cell::Ref<'_, Vec<(String, u64)>> {
        self.pub_counts.borrow()
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

    /// Frames waiting for the writer task.
    pub fn out(&self) -> Ref<'_, Vec<u8>> {
        self.out.borrow()
    }

    pub fn out_mut(&self) -> RefMut<'_, Vec<u8>> {
        self.out.borrow_mut()
    }

    /// The writer task took `bytes` from `out` and is writing them to the socket (0 once
    /// written).
    pub fn set_writing(&self, bytes: usize) {
        self.writing.set(bytes);
    }

    /// Output not yet written to the socket (bytes): buffered in `out` plus what the
    /// writer task is writing.
    pub fn pending_out(&self) -> usize {
        self.out.borrow().len() + self.writing.get()
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
        self.held_back.set(true);
    }

    /// True, once, when delivery skipped this client for a full output and the writer
    /// has drained it below the mark since: the caller must deliver to it again.
    pub fn resume_delivery(&self) -> bool {
        if self.held_back.get() && !self.output_full() {
            self.held_back.set(false);
            return true;
        }
        false
    }

    /// The output-buffer ticker (nsqd: messagePump's outputBufferTicker).
    pub fn output_ticker(&self) -> OutputTicker {
        self.output_ticker.get()
    }

    pub fn set_output_ticker(&self, ticker: OutputTicker) {
        self.output_ticker.set(ticker);
    }

    /// nsqd messagePump's `flushed` (see the field).
    pub fn pump_flushed(&self) -> bool {
        self.pump_flushed.get()
    }

    pub fn set_pump_flushed(&self, flushed: bool) {
        self.pump_flushed.set(flushed);
    }

    /// With TLS: (version, cipher suite, client certificate common name).
    pub fn tls(&self) -> Ref<'_, Option<(String, String, String)>> {
        self.tls.borrow()
    }

    pub fn set_tls(&self, tls: Option<(String, String, String)>) {
        *self.tls.borrow_mut() = tls;
    }

    /// True when `out` must go out now.
    pub fn flush_now(&self) -> bool {
        self.flush_now.get()
    }

    pub fn set_flush_now(&self, now: bool) {
        self.flush_now.set(now);
    }

    /// Wakes the writer task.
    pub fn wake(&self) -> &Notify {
        &self.wake
    }

    /// True once the connection is going away.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    pub fn set_closed(&self, closed: bool) {
        self.closed.set(closed);
    }

    /// Wakes a reader that waits for the writer to drain `out`.
    pub fn drained(&self) -> &Notify {
        &self.drained
    }

    /// The compression IDENTIFY negotiated.
    pub fn compression(&self) -> Compression {
        self.compression.get()
    }

    pub fn set_compression(&self, c: Compression) {
        self.compression.set(c);
    }

    /// With deflate: the last 32 KiB sent (the peer's inflate window).
    pub fn deflate_out_history(&self) -> Ref<'_, Vec<u8>> {
        self.deflate_out_history.borrow()
    }

    pub fn deflate_out_history_mut(&self) -> RefMut<'_, Vec<u8>> {
        self.deflate_out_history.borrow_mut()
    }

    /// Sets the offset in `out` from which the writer must compress.
    pub fn set_compress_from(&self, from: Option<usize>) {
        self.compress_from.set(from);
    }

    /// Takes the offset in `out` from which the writer must compress, if one is set.
    pub fn take_compress_from(&self) -> Option<usize> {
        self.compress_from.take()
    }

    /// The secret of the last AUTH.
    pub fn auth_secret(&self) -> Option<Vec<u8>> {
        self.auth_secret.borrow().clone()
    }

    pub fn set_auth_secret(&self, secret: Option<Vec<u8>>) {
        *self.auth_secret.borrow_mut() = secret;
    }

    /// What the auth server granted, None before AUTH.
    pub fn auth(&self) -> Ref<'_, Option<AuthState>> {
        self.auth.borrow()
    }

    pub fn set_auth(&self, state: Option<AuthState>) {
        *self.auth.borrow_mut() = state;
    }

    /// nsqd `HasAuthorizations`: AUTH succeeded with at least one authorization.
    pub fn has_authorizations(&self) -> bool {
        self.auth
            .borrow()
            .as_ref()
            .is_some_and(|a| !a.authorizations.is_empty())
    }

    /// nsqd `IsReadyForMessages`: subscribed, RDY > 0 and in-flight below RDY.
    pub fn is_ready(&self) -> bool {
        !self.closed.get()
            && self.state.get() == ClientState::Subscribed
            && self.ready_count.get() > 0
            && self.in_flight.get() < self.ready_count.get()
    }

    /// Queues a response (type 0) or error (type 1) frame and flushes at once, as nsqd
    /// does for every response.
    pub fn send_frame(&self, frame_type: u32, data: &[u8]) {
        {
            let mut out = self.out.borrow_mut();
            out.extend_from_slice(&((data.len() + 4) as u32).to_be_bytes());
            out.extend_from_slice(&frame_type.to_be_bytes());
            out.extend_from_slice(data);
        }
        self.flush_now.set(true);
        self.wake.notify();
    }

    /// Buffers one message frame (nsqd: SendMessage). A full buffer or a client that
    /// stops being ready flushes now; otherwise the writer waits for the output-buffer
    /// ticker (see [`OutputTicker`]).
    pub fn buffer_message(&self, msg: &Message) {
        let len = {
            let mut out = self.out.borrow_mut();
            msg.write_frame(&mut out);
            out.len()
        };
        let was_flushed = self.pump_flushed.replace(false);
        let (full, untimed) = {
            let s = self.settings.borrow();
            (
                len >= s.output_buffer_size,
                s.pump.output_buffer_timeout.is_zero(),
            )
        };
        if full || !self.is_ready() {
            self.flush_now.set(true);
            self.wake.notify();
        } else if was_flushed || untimed {
            // The writer may be waiting without a timer: it must start taking ticks, or
            // (output_buffer_timeout 0) flush this delivery round.
            self.wake.notify();
        }
    }

    /// Counts a publish to `topic` for stats `pub_counts`.
    pub fn count_publish(&self, topic: &str, n: u64) {
        let mut pc = self.pub_counts.borrow_mut();
        match pc.iter_mut().find(|(t, _)| t == topic) {
            Some((_, c)) => *c += n,
            None => pc.push((topic.to_string(), n)),
        }
    }

    /// Asks the connection to close: the writer flushes what it has and shuts the socket,
    /// which ends the reader.
    pub fn kill(&self) {
        self.closed.set(true);
        self.wake.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn ticker_ticks_every_period_from_its_origin() {
        let t0 = Instant::now();
        let mut t = OutputTicker::new(t0, ms(250));
        assert_eq!(t.next_tick(), Some(t0 + ms(250)));
        assert!(!t.due(t0 + ms(249)));
        assert!(t.due(t0 + ms(250)));
        t.take(t0 + ms(260));
        assert_eq!(t.next_tick(), Some(t0 + ms(500)));
        assert!(!t.due(t0 + ms(499)));
    }

    #[test]
    fn a_tick_nobody_took_is_held_and_later_ones_dropped() {
        let t0 = Instant::now();
        let mut t = OutputTicker::new(t0, ms(250));
        // Idle for 3.5 periods: one tick is held, so a message now is flushed at once.
        assert!(t.due(t0 + ms(875)));
        t.take(t0 + ms(875));
        // The next tick is the regular one after the latest passed (750 ms).
        assert_eq!(t.next_tick(), Some(t0 + ms(1000)));
    }

    #[test]
    fn zero_period_never_ticks() {
        let t0 = Instant::now();
        let mut t = OutputTicker::new(t0, Duration::ZERO);
        assert_eq!(t.next_tick(), None);
        assert!(!t.due(t0 + ms(10_000)));
        t.take(t0 + ms(10_000));
        assert_eq!(t.next_tick(), None);
    }
}
