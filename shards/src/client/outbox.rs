//! A connection's output buffer: where the shard's delivery code and the connection's
//! tasks (root crate, src/tcp) put frames, and where the writer task (src/tcp/writer.rs)
//! takes them from for the socket. Together with the writer it is nsqd's messagePump
//! and clientV2's bufio.Writer.
//!
//! It lives in the shards crate, not beside the socket, because delivery
//! (`Channel::dispatch`) frames each message straight into it: the buffer is the one
//! piece of connection state the core writes on its hot path, with no call through a
//! trait object. Everything else about the socket (TLS, the compressors, deadlines) is
//! the root crate's.

use crate::wake::Notify;
use std::cell::{Cell, Ref, RefCell, RefMut};
use std::time::{Duration, Instant};

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

/// One connection's output buffer and the writer's flush state (see the module doc).
/// Single-threaded: the reader task, the writer task and the shard's delivery code share
/// it through the connection's `Rc<Client>`.
pub struct Outbox {
    /// Frames waiting for the writer task.
    buf: RefCell<Vec<u8>>,
    /// Bytes the writer task took from `buf` and has not finished writing to the socket
    /// (nsqd: a messagePump blocked in its write).
    writing: Cell<usize>,
    /// Set when delivery skipped this client because its output was over the high-water
    /// mark; the writer asks for a delivery once it drains below (see
    /// [`crate::client::Client::resume_delivery`]).
    held_back: Cell<bool>,
    /// Set when `buf` must go out now (a response, an error, or the client stopped
    /// being ready).
    flush_now: Cell<bool>,
    /// Offset in `buf` from which the writer must compress: the bytes before it (the
    /// IDENTIFY reply) still go out plain.
    compress_from: Cell<Option<usize>>,
    /// The output-buffer ticker (nsqd: messagePump's outputBufferTicker).
    ticker: Cell<OutputTicker>,
    /// nsqd messagePump's `flushed`: false once a message frame was buffered, true again
    /// after a flush by the output-buffer ticker or for a client that is not ready. While
    /// it is false the writer takes the ticker's ticks.
    pump_flushed: Cell<bool>,
    /// Set once the connection is going away (read error, fatal error, kill).
    closed: Cell<bool>,
    /// Wakes the writer task.
    wake: Notify,
    /// Wakes a reader that stopped reading because `buf` was too full (the writer
    /// drained some).
    drained: Notify,
    /// Set while the writer must not write `buf` (it still writes it once the
    /// connection is going away): a cluster leader whose shard stalled holds its
    /// consumers' output until it knows whether it still leads
    /// ([`Outbox::hold_flushes`]).
    flushes_held: Cell<bool>,
}

// The accessors are `#[inline]`: the root crate's reader and writer tasks call them
// across the crate boundary for every flush.
impl Outbox {
    /// An empty buffer whose ticker starts with `ticker`, flushed (nothing buffered).
    pub(crate) fn new(ticker: OutputTicker) -> Outbox {
        Outbox {
            buf: RefCell::new(Vec::new()),
            writing: Cell::new(0),
            held_back: Cell::new(false),
            flush_now: Cell::new(false),
            compress_from: Cell::new(None),
            ticker: Cell::new(ticker),
            pump_flushed: Cell::new(true),
            closed: Cell::new(false),
            wake: Notify::default(),
            drained: Notify::default(),
            flushes_held: Cell::new(false),
        }
    }

    /// Holds (`true`) or releases the writer's flushes of the buffer. A cluster leader
    /// whose shard did not run for a while holds them for the consumers of the topics
    /// it leads: the messages buffered just before may have been delivered by another
    /// leader meanwhile. It releases them once its replicas confirm it still leads, or
    /// drops those messages ([`Outbox::drop_message_frames`]) when it no longer does.
    pub fn hold_flushes(&self, held: bool) {
        self.flushes_held.set(held);
        if !held {
            self.wake.notify();
        }
    }

    /// True while the writer must not flush ([`Outbox::hold_flushes`]).
    #[inline]
    pub fn flushes_held(&self) -> bool {
        self.flushes_held.get()
    }

    /// Removes the message frames waiting in the buffer, keeping every other frame in
    /// order (bytes the writer already took are not in it). Returns how many it
    /// removed. For the consumers of a leadership lost: those messages are delivered
    /// again by the new leader, and the consumer's FIN of this member's copy would be
    /// dropped.
    pub fn drop_message_frames(&self) -> usize {
        use nsq_wire::client::{decode_frame, Decoded, Frame};
        let mut buf = self.buf.borrow_mut();
        let mut kept = Vec::new();
        let mut dropped = 0;
        let mut at = 0;
        // Frames this broker wrote itself: the client-side decoder reads them whole.
        while let Ok(Decoded::Frame(frame, used)) = decode_frame(&buf[at..]) {
            if matches!(frame, Frame::Message(_)) {
                dropped += 1;
            } else {
                kept.extend_from_slice(&buf[at..at + used]);
            }
            at += used;
        }
        if dropped > 0 {
            // Whatever did not decode as whole frames stays as it was, after them.
            kept.extend_from_slice(&buf[at..]);
            *buf = kept;
        }
        dropped
    }

    /// Frames waiting for the writer task.
    #[inline]
    pub fn buf(&self) -> Ref<'_, Vec<u8>> {
        self.buf.borrow()
    }

    #[inline]
    pub fn buf_mut(&self) -> RefMut<'_, Vec<u8>> {
        self.buf.borrow_mut()
    }

    /// The writer task took `bytes` from the buffer and is writing them to the socket (0
    /// once written).
    #[inline]
    pub fn set_writing(&self, bytes: usize) {
        self.writing.set(bytes);
    }

    /// Output not yet written to the socket (bytes): buffered plus what the writer task
    /// is writing.
    #[inline]
    pub fn pending(&self) -> usize {
        self.buf.borrow().len() + self.writing.get()
    }

    #[inline]
    pub(crate) fn set_held_back(&self, held: bool) {
        self.held_back.set(held);
    }

    #[inline]
    pub(crate) fn held_back(&self) -> bool {
        self.held_back.get()
    }

    /// True when the buffer must go out now.
    #[inline]
    pub fn flush_now(&self) -> bool {
        self.flush_now.get()
    }

    #[inline]
    pub fn set_flush_now(&self, now: bool) {
        self.flush_now.set(now);
    }

    /// Asks the writer to write the buffer now, and wakes it.
    #[inline]
    pub fn request_flush(&self) {
        self.flush_now.set(true);
        self.wake.notify();
    }

    /// Sets the offset in the buffer from which the writer must compress.
    #[inline]
    pub fn set_compress_from(&self, from: Option<usize>) {
        self.compress_from.set(from);
    }

    /// Takes the offset in the buffer from which the writer must compress, if one is
    /// set.
    #[inline]
    pub fn take_compress_from(&self) -> Option<usize> {
        self.compress_from.take()
    }

    /// The output-buffer ticker (nsqd: messagePump's outputBufferTicker).
    #[inline]
    pub fn ticker(&self) -> OutputTicker {
        self.ticker.get()
    }

    #[inline]
    pub fn set_ticker(&self, ticker: OutputTicker) {
        self.ticker.set(ticker);
    }

    /// nsqd messagePump's `flushed` (see the field).
    #[inline]
    pub fn pump_flushed(&self) -> bool {
        self.pump_flushed.get()
    }

    #[inline]
    pub fn set_pump_flushed(&self, flushed: bool) {
        self.pump_flushed.set(flushed);
    }

    /// Sets messagePump's `flushed` to false and returns what it was.
    #[inline]
    pub(crate) fn unflush(&self) -> bool {
        self.pump_flushed.replace(false)
    }

    /// True once the connection is going away.
    #[inline]
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    #[inline]
    pub fn set_closed(&self, closed: bool) {
        self.closed.set(closed);
    }

    /// Wakes the writer task.
    #[inline]
    pub fn wake(&self) -> &Notify {
        &self.wake
    }

    /// Wakes a reader that waits for the writer to drain the buffer.
    #[inline]
    pub fn drained(&self) -> &Notify {
        &self.drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn frame(kind: u32, data: &[u8]) -> Vec<u8> {
        let mut f = ((data.len() + 4) as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&kind.to_be_bytes());
        f.extend_from_slice(data);
        f
    }

    #[test]
    fn dropping_message_frames_keeps_the_others_in_order() {
        let o = Outbox::new(OutputTicker::new(Instant::now(), ms(250)));
        let (resp, msg, err) = (
            nsq_wire::v2::FRAME_RESPONSE,
            nsq_wire::v2::FRAME_MESSAGE,
            nsq_wire::v2::FRAME_ERROR,
        );
        let mut want = Vec::new();
        {
            let mut b = o.buf_mut();
            b.extend(frame(resp, b"_heartbeat_"));
            want.extend(frame(resp, b"_heartbeat_"));
            b.extend(frame(msg, b"0123456789abcdefghijklmnopqrstuvwxyz-one"));
            b.extend(frame(err, b"E_FIN_FAILED x"));
            want.extend(frame(err, b"E_FIN_FAILED x"));
            b.extend(frame(msg, b"0123456789abcdefghijklmnopqrstuvwxyz-two"));
        }
        assert_eq!(o.drop_message_frames(), 2);
        assert_eq!(*o.buf(), want);
        assert_eq!(o.drop_message_frames(), 0);
        assert_eq!(*o.buf(), want);
        // A tail that is not a whole frame stays where it was.
        o.buf_mut()
            .extend(frame(msg, b"0123456789abcdefghijklmnopqrstuvwxyz-three"));
        o.buf_mut().extend_from_slice(&[0, 0, 0, 9, 0]);
        assert_eq!(o.drop_message_frames(), 1);
        want.extend_from_slice(&[0, 0, 0, 9, 0]);
        assert_eq!(*o.buf(), want);
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
