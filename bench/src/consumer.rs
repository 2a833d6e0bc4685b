//! A consumer: one connection, one thread. Reads large chunks, decodes every complete
//! frame, records latencies and sequence numbers, and answers all the messages of a chunk
//! with one write of FIN lines.

use crate::{now_unix_ns, read_header, Shared};
use hdrhistogram::Histogram;
use nsq_wire::client::{self, Decoded, Frame};
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counters the main thread reads while the consumer runs.
pub struct ConsumerStats {
    /// Messages of this run (all messages in `sub` mode).
    pub received: AtomicU64,
    /// Messages from another run (pubsub mode) or not from nsq-bench.
    pub foreign: AtomicU64,
    /// Publish-to-delivery latency in µs of messages published after the warmup.
    pub hist: Mutex<Histogram<u64>>,
    /// Latency in µs of messages published after the backlog of a --rate-schedule
    /// drained.
    pub hist_after: Mutex<Histogram<u64>>,
    /// SUB was answered OK and RDY sent.
    pub subscribed: AtomicBool,
    /// The thread has finished (error or stop).
    pub done: AtomicBool,
}

impl ConsumerStats {
    pub fn new() -> ConsumerStats {
        ConsumerStats {
            received: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            hist: Mutex::new(crate::new_hist()),
            hist_after: Mutex::new(crate::new_hist()),
            subscribed: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }
}

/// Which sequence numbers arrived, per producer (pubsub mode only).
#[derive(Default)]
pub struct Seen {
    pub bits: Vec<Vec<u64>>,
    pub duplicates: u64,
}

impl Seen {
    fn set(&mut self, producer: usize, seq: u64) -> bool {
        if self.bits.len() <= producer {
            self.bits.resize_with(producer + 1, Vec::new);
        }
        let words = &mut self.bits[producer];
        let w = (seq / 64) as usize;
        if words.len() <= w {
            words.resize((w + 1).max(words.len() * 2), 0);
        }
        let mask = 1u64 << (seq % 64);
        let new = words[w] & mask == 0;
        words[w] |= mask;
        new
    }

    /// ORs `other` in; bits set in both count as duplicates.
    pub fn merge(&mut self, other: &Seen) {
        self.duplicates += other.duplicates;
        if self.bits.len() < other.bits.len() {
            self.bits.resize_with(other.bits.len(), Vec::new);
        }
        for (mine, theirs) in self.bits.iter_mut().zip(&other.bits) {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (a, b) in mine.iter_mut().zip(theirs) {
                self.duplicates += (*a & *b).count_ones() as u64;
                *a |= *b;
            }
        }
    }

    /// How many of producer `p`'s sequence numbers below `n` arrived.
    pub fn count_below(&self, p: usize, n: u64) -> u64 {
        let Some(words) = self.bits.get(p) else {
            return 0;
        };
        let full = (n / 64) as usize;
        let mut c: u64 = words.iter().take(full).map(|w| w.count_ones() as u64).sum();
        if !n.is_multiple_of(64) {
            if let Some(w) = words.get(full) {
                c += (w & ((1u64 << (n % 64)) - 1)).count_ones() as u64;
            }
        }
        c
    }

    /// All sequence numbers that arrived, acknowledged or not.
    pub fn total(&self) -> u64 {
        self.bits
            .iter()
            .flat_map(|w| w.iter())
            .map(|w| w.count_ones() as u64)
            .sum()
    }
}

pub struct Sub<'a> {
    pub addr: &'a str,
    pub topic: &'a str,
    pub channel: &'a str,
    pub name: String,
}

/// Runs one consumer until `shared.stop_consumers`. Returns the sequence numbers seen.
pub fn run(shared: Arc<Shared>, sub: Sub<'_>, stats: Arc<ConsumerStats>) -> Seen {
    let mut seen = Seen::default();
    if let Err(e) = consume(&shared, &sub, &stats, &mut seen) {
        if !shared.stop_consumers.load(Ordering::SeqCst) {
            shared.error(format!("{}: {e}", sub.name));
        }
    }
    stats.done.store(true, Ordering::SeqCst);
    seen
}

// A `String` error: CLI-only, printed once before the bench exits.
fn consume(
    shared: &Shared,
    sub: &Sub<'_>,
    stats: &ConsumerStats,
    seen: &mut Seen,
) -> Result<(), String> {
    let a = &shared.args;
    let mut identify = format!(
        r#"{{"client_id":"{}","hostname":"nsq-bench","user_agent":"nsq-bench/{}""#,
        sub.name,
        env!("CARGO_PKG_VERSION")
    );
    if let Some(t) = a.output_buffer_timeout {
        identify.push_str(&format!(r#","output_buffer_timeout":{t}"#));
    }
    if let Some(s) = a.output_buffer_size {
        identify.push_str(&format!(r#","output_buffer_size":{s}"#));
    }
    let mut stream = crate::connect_stream(shared, sub.addr, &identify)
        .map_err(|e| format!("connect {}: {e}", sub.addr))?;
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    identify.push('}');
    let mut out = Vec::with_capacity(64 * 1024);
    if !stream.is_tls() {
        client::encode_magic(&mut out);
        client::encode_identify(&mut out, identify.as_bytes());
    }
    client::encode_sub(&mut out, sub.topic, sub.channel);
    stream.write_all(&out).map_err(|e| format!("write: {e}"))?;
    out.clear();

    let mut buf = vec![0u8; 1024 * 1024];
    let (mut start, mut end) = (0usize, 0usize);
    // IDENTIFY and SUB answers.
    // With TLS the IDENTIFY was answered during the upgrade.
    let mut oks = if stream.is_tls() { 1 } else { 0 };
    let check_stop = || shared.stop_consumers.load(Ordering::SeqCst);
    let mut latencies: Vec<u64> = Vec::with_capacity(8192);
    let mut after: Vec<u64> = Vec::new();
    let mut measure_from_cached = shared.measure_from_ns.load(Ordering::SeqCst);
    loop {
        match stream.read(&mut buf[end..]) {
            Ok(0) => {
                if check_stop() {
                    return Ok(());
                }
                return Err("connection closed by the server".into());
            }
            Ok(n) => end += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if check_stop() {
                    let _ = stream.shutdown(Shutdown::Both);
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(format!("read: {e}")),
        }
        if measure_from_cached == 0 {
            measure_from_cached = shared.measure_from_ns.load(Ordering::Relaxed);
        }
        let drained_ns = shared.drained_ns.load(Ordering::Relaxed);
        let now_ns = now_unix_ns();
        let mut ours = 0u64;
        let mut foreign = 0u64;
        loop {
            match client::decode_frame(&buf[start..end]).map_err(|e| e.to_string())? {
                Decoded::Incomplete { need } => {
                    if need > buf.len() - start {
                        buf.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                        if need > buf.len() {
                            buf.resize(need, 0);
                        }
                    }
                    break;
                }
                Decoded::Frame(frame, used) => {
                    start += used;
                    match frame {
                        Frame::Message(m) => {
                            client::encode_fin(&mut out, &m.id);
                            let h = read_header(m.body);
                            let mine = match h {
                                Some(h) if shared.check_seq => {
                                    h.run_id == shared.run_id && (h.producer as usize) < a.producers
                                }
                                Some(_) => true,
                                None => !shared.check_seq,
                            };
                            if !mine {
                                foreign += 1;
                                continue;
                            }
                            ours += 1;
                            if let Some(h) = h {
                                if shared.check_seq && !seen.set(h.producer as usize, h.seq) {
                                    seen.duplicates += 1;
                                }
                                if measure_from_cached != 0 && h.ts_ns >= measure_from_cached {
                                    latencies.push(now_ns.saturating_sub(h.ts_ns) / 1000);
                                }
                                if drained_ns != 0 && h.ts_ns >= drained_ns {
                                    after.push(now_ns.saturating_sub(h.ts_ns) / 1000);
                                }
                            }
                        }
                        f if f.is_heartbeat() => client::encode_nop(&mut out),
                        Frame::Response(b"OK") if oks < 2 => {
                            oks += 1;
                            if oks == 2 {
                                client::encode_rdy(&mut out, a.rdy);
                                stats.subscribed.store(true, Ordering::SeqCst);
                            }
                        }
                        Frame::Response(r) => {
                            if oks < 2 && r.starts_with(b"{") {
                                // A JSON IDENTIFY answer (a server that negotiates anyway).
                                oks += 1;
                            } else if r != b"CLOSE_WAIT" {
                                shared.error(format!(
                                    "{}: unexpected response {:?}",
                                    sub.name,
                                    String::from_utf8_lossy(r)
                                ));
                            }
                        }
                        Frame::Error(e) => {
                            let text = String::from_utf8_lossy(e).into_owned();
                            if text.starts_with("E_FIN_FAILED")
                                || text.starts_with("E_REQ_FAILED")
                                || text.starts_with("E_TOUCH_FAILED")
                            {
                                shared
                                    .error(format!("{}: non-fatal error frame {text:?}", sub.name));
                            } else {
                                return Err(format!("error frame {text:?}"));
                            }
                        }
                    }
                }
            }
        }
        if start == end {
            start = 0;
            end = 0;
        }
        if !latencies.is_empty() {
            let mut h = stats
                .hist
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for &l in &latencies {
                h.saturating_record(l);
            }
            drop(h);
            latencies.clear();
        }
        if !after.is_empty() {
            let mut h = stats
                .hist_after
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for &l in &after {
                h.saturating_record(l);
            }
            drop(h);
            after.clear();
        }
        if ours > 0 {
            stats.received.fetch_add(ours, Ordering::Relaxed);
        }
        if foreign > 0 {
            stats.foreign.fetch_add(foreign, Ordering::Relaxed);
        }
        if !out.is_empty() {
            stream.write_all(&out).map_err(|e| format!("write: {e}"))?;
            out.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_counts_and_merges() {
        let mut a = Seen::default();
        assert!(a.set(0, 0));
        assert!(a.set(0, 63));
        assert!(a.set(0, 64));
        assert!(!a.set(0, 64));
        assert!(a.set(2, 1000));
        assert_eq!(a.count_below(0, 64), 2);
        assert_eq!(a.count_below(0, 65), 3);
        assert_eq!(a.count_below(0, 1 << 20), 3);
        assert_eq!(a.count_below(1, 10), 0);
        assert_eq!(a.count_below(2, 1000), 0);
        assert_eq!(a.count_below(2, 1001), 1);
        let mut b = Seen::default();
        b.set(0, 64);
        b.set(0, 5);
        b.set(3, 7);
        a.merge(&b);
        assert_eq!(a.duplicates, 1);
        assert_eq!(a.total(), 6);
        assert_eq!(a.count_below(3, 8), 1);
    }
}
