//! The connection's writer task: the half of nsqd's messagePump that writes (nsqd:
//! protocol_v2.go messagePump's flush and heartbeat cases, and Send/Flush). Messages are
//! chosen and framed into the client's output buffer by `Channel::dispatch` in the
//! shards crate (the half of messagePump that reads the channel's memoryMsgChan); this
//! task moves that buffer to the socket, compressing it if IDENTIFY asked for it.
//! Together they are nsqd's messagePump.

use super::compress::Encoder;
use super::stream::SharedStream;
use crate::server::Server;
use futures::future::select;
use nsq_shards::client::{Client, OutputTicker};
use nsq_wire::v2::FRAME_RESPONSE;
use std::cell::Cell;
use std::io;
use std::pin::pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Output buffer capacity a connection keeps however little it sends (bytes).
const SPARE_KEEP: usize = 1 << 20;

/// How soon a writer held by a closed delivery gate looks again.
const GATE_RECHECK: std::time::Duration = std::time::Duration::from_millis(5);

/// Drains the client's output buffer to the socket with nsqd's flush rules (nsqd:
/// protocol_v2.go messagePump and Send): responses and errors at once; message frames
/// when the buffer holds output_buffer_size bytes, when the client is not ready, and at
/// a tick of the client's output-buffer ticker (every output_buffer_timeout, see
/// [`nsq_shards::client::OutputTicker`]). As in nsqd, the ticker holds one tick that
/// passed while nothing was buffered, so a message to a consumer that was idle for a
/// period goes out at once; in a stream a message waits at most one period (250 ms by
/// default) for a tick, or less for a full buffer. With output_buffer_timeout 0 a
/// delivery round is flushed as soon as the writer runs. Also sends `_heartbeat_` every
/// heartbeat interval. After a flush it asks for a delivery to a client that delivery
/// skipped for a full output (nsqd: messagePump takes the next message once its write
/// returns).
///
/// `deflate_history`: on a deflate stream resumed after a hand-off, the last 32 KiB the
/// previous shard sent. Returns the window to hand on (empty without deflate).
pub(super) async fn writer_loop(
    server: Rc<Server>,
    stream: SharedStream,
    client: Rc<Client>,
    handing_off: Rc<Cell<bool>>,
    deflate_history: Vec<u8>,
) -> Vec<u8> {
    let mut out = Output::new(&client, &deflate_history);
    // The encoder keeps its own copy: not held for the connection's life.
    drop(deflate_history);
    let pump = client.outbox();
    // Heartbeats and the output-buffer timer run on what nsqd's messagePump took from
    // the first IDENTIFY (ClientSettings::pump); the buffer's size follows every one.
    let mut heartbeat = Heartbeat::new(client.settings().pump.heartbeat_interval);
    let mut pump_flushes_too = false;
    loop {
        let now = Instant::now();
        let (obs, obt, hb) = {
            let s = client.settings();
            (
                s.output_buffer_size,
                s.pump.output_buffer_timeout,
                s.pump.heartbeat_interval,
            )
        };
        heartbeat.follow(hb, now);
        let closed = pump.is_closed();
        let len = pump.buf().len();
        if !client.is_ready() {
            // nsqd flushes a client that is not ready (buffer_message and RDY ask for it
            // with flush_now) and counts its messagePump as flushed.
            pump.set_pump_flushed(true);
        }
        // On a cluster member whose shard has just run again after a stall, nothing
        // goes out before its clock has run (nsq_shards::delivery_gate), and the
        // consumers of the topics whose leadership it then confirms wait for the answer
        // (Outbox::hold_flushes); a closing connection is written all the same.
        let gate_closed = !nsq_shards::delivery_gate::is_open(now);
        let held = !closed && (gate_closed || pump.flushes_held());
        let (tick, ticker) = if held {
            (false, pump.ticker())
        } else {
            take_tick(&client, now)
        };
        let due =
            len > 0 && !held && (closed || pump.flush_now() || obt.is_zero() || len >= obs || tick);
        if due {
            let twice = std::mem::take(&mut pump_flushes_too);
            if out.flush(&server, &stream, &client, twice).await.is_err() {
                pump.set_closed(true);
                break;
            }
            if client.resume_delivery() {
                // Delivery skipped this client while its output was over the
                // high-water mark: the socket took it, so messages may flow again.
                server.shard.client_ready_changed(&client);
            }
            continue;
        }
        if closed {
            break;
        }
        if heartbeat.send_if_due(&client, now) {
            // nsqd's messagePump flushes again on its next turn while the client is
            // not ready for messages (a second sync marker on a deflate stream).
            pump_flushes_too = !client.is_ready();
            continue;
        }
        let mut wake_at = heartbeat.next;
        if gate_closed && len > 0 {
            // The clock runs within a few ms; looked at again then.
            let soon = now + GATE_RECHECK;
            wake_at = Some(wake_at.map_or(soon, |t| t.min(soon)));
        }
        // While held the ticker's ticks wait: a release wakes the writer.
        if !pump.pump_flushed() && !held {
            wake_at = match (wake_at, ticker.next_tick()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        wait(&client, wake_at, now).await;
    }
    pump.set_closed(true);
    pump.drained().notify();
    if !handing_off.get() {
        stream.shutdown();
    }
    out.encoder.map(Encoder::into_history).unwrap_or_default()
}

/// Takes a due tick of the client's output-buffer ticker: while messages went out since
/// the last flush, the pump takes the ticks (nsqd: messagePump's outputBufferTicker
/// case). Returns whether one was taken, and the ticker.
fn take_tick(client: &Client, now: Instant) -> (bool, OutputTicker) {
    let pump = client.outbox();
    let mut ticker = pump.ticker();
    let tick = !pump.pump_flushed() && ticker.due(now);
    if tick {
        ticker.take(now);
        pump.set_ticker(ticker);
        pump.set_pump_flushed(true);
    }
    (tick, ticker)
}

/// Sleeps until the client's wake-up (new output, RDY, close) or `wake_at`.
async fn wait(client: &Client, wake_at: Option<Instant>, now: Instant) {
    let woken = pin!(client.outbox().wake().wait());
    match wake_at {
        Some(t) => {
            let sleep = pin!(glommio::timer::sleep(t.saturating_duration_since(now)));
            select(woken, sleep).await;
        }
        None => woken.await,
    }
}

/// nsqd's heartbeatTicker: `_heartbeat_` every heartbeat interval (none when disabled).
struct Heartbeat {
    interval: Option<Duration>,
    next: Option<Instant>,
}

impl Heartbeat {
    fn new(interval: Option<Duration>) -> Heartbeat {
        Heartbeat {
            interval,
            next: interval.map(|d| Instant::now() + d),
        }
    }

    /// Restarts the ticker when IDENTIFY changed the interval.
    fn follow(&mut self, interval: Option<Duration>, now: Instant) {
        if interval != self.interval {
            self.interval = interval;
            self.next = interval.map(|d| now + d);
        }
    }

    /// Queues a heartbeat if one is due; true if it did.
    fn send_if_due(&mut self, client: &Client, now: Instant) -> bool {
        match self.next {
            Some(t) if t <= now => {
                client.send_frame(FRAME_RESPONSE, b"_heartbeat_");
                self.next = self.interval.map(|d| t.max(now - d) + d);
                true
            }
            _ => false,
        }
    }
}

/// The writer's side of the output buffer: the spare buffer swapped with the client's
/// on each flush, and the compressor if the stream is compressed.
struct Output {
    spare: Vec<u8>,
    encoder: Option<Encoder>,
}

impl Output {
    /// `deflate_history`: see [`writer_loop`].
    fn new(client: &Client, deflate_history: &[u8]) -> Output {
        // A connection handed over from another shard may already be compressed.
        let encoder = Encoder::new(client.compression(), true, deflate_history)
            .ok()
            .flatten();
        Output {
            // Grown on first use: an idle connection never needs it.
            spare: Vec::new(),
            encoder,
        }
    }

    /// Writes out everything the client's output buffer holds (nsqd: Flush) and wakes a
    /// reader waiting for the buffer to drain.
    /// `twice`: nsqd flushes these bytes twice (its messagePump flushes too).
    async fn flush(
        &mut self,
        server: &Server,
        stream: &SharedStream,
        client: &Client,
        twice: bool,
    ) -> io::Result<()> {
        let pump = client.outbox();
        std::mem::swap(&mut *pump.buf_mut(), &mut self.spare);
        pump.set_flush_now(false);
        // Counted as pending output until written, so that delivery stops at the
        // high-water mark while the socket is full (Client::output_full).
        pump.set_writing(self.spare.len());
        let res = self.write(stream, client, twice).await;
        pump.set_writing(0);
        pump.drained().notify();
        server.shard.count_bytes_out(self.spare.len() as u64);
        // Keep the buffer's capacity while it is in use (a consumer with a large RDY
        // window gets RDY messages at once: regrowing from 16 KiB each time cost a
        // copy of everything on every doubling); give it back once traffic drops.
        if self.spare.capacity() > SPARE_KEEP && self.spare.len() < self.spare.capacity() / 8 {
            self.spare = Vec::with_capacity(16 * 1024);
        }
        self.spare.clear();
        res
    }

    /// Writes `spare` to the socket, compressed from where IDENTIFY switched it on.
    async fn write(
        &mut self,
        stream: &SharedStream,
        client: &Client,
        twice: bool,
    ) -> io::Result<()> {
        let spare = &self.spare;
        match (client.outbox().take_compress_from(), self.encoder.as_mut()) {
            (Some(off), _) => {
                // The IDENTIFY reply (before `off`) goes out plain, the rest compressed.
                let off = off.min(spare.len());
                let mut framed = spare[..off].to_vec();
                match Encoder::new(client.compression(), false, &[]) {
                    Ok(Some(mut enc)) => {
                        // The upgrade's OK: nsqd's IDENTIFY and its messagePump both
                        // flush it.
                        let r = enc.encode(&spare[off..], &mut framed);
                        enc.flush_again(&mut framed);
                        self.encoder = Some(enc);
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
                let r = enc.encode(spare, &mut framed);
                if twice {
                    enc.flush_again(&mut framed);
                }
                match r {
                    Ok(()) => stream.write_all(&framed).await,
                    Err(e) => Err(io::Error::other(e)),
                }
            }
            (None, None) => stream.write_all(spare).await,
        }
    }
}
