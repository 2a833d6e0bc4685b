//! How far behind a channel is, in time (beyond nsqd): the publish time of its oldest
//! unfinished message, and a histogram of the time from delivery to FIN.
//!
//! *Unfinished* means waiting (the next record at the cursor, or ready again after a
//! REQ or a timeout), in flight, or deferred. Publish timestamps grow with the log
//! sequence (one topic's messages are stamped on its one shard, in order), so the
//! oldest unfinished message is the one with the lowest sequence among: the first
//! record the cursor will deliver, the first message ready again whose body is in the
//! log, the first deferred one (by sequence), and the in-flight and requeued messages
//! that hold their bodies. None of these walks the backlog: the cursor and the sorted
//! sets give their first sequence at once, and the in-flight and requeued messages are
//! bounded by the consumers' RDY (each holds its timestamp). A record on disk only is
//! not read here: the shard reads it in the background for the next `/stats`.

use super::Channel;
use crate::topic::Log;
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

/// The delivery-to-FIN histogram keeps two windows of this length: the current one and
/// the one before, so the percentiles cover the last one to two windows.
pub const FIN_LATENCY_WINDOW: Duration = Duration::from_secs(60);

/// The largest latency recorded as itself, in microseconds (one hour); longer ones count
/// as one hour.
const MAX_US: u64 = 3_600_000_000;

/// Delivery-to-FIN latencies of one channel (microsecond resolution, two significant
/// digits, so a percentile is within 1% of the true value), in two windows of
/// [`FIN_LATENCY_WINDOW`]. Made on a channel's first FIN with `--channel-lag-stats`
/// (about 13 KB a window).
pub(super) struct FinLatency {
    current: Histogram<u32>,
    previous: Option<Histogram<u32>>,
    /// When `current` started.
    since: Instant,
}

fn histogram() -> Histogram<u32> {
    Histogram::new_with_bounds(1, MAX_US, 2).expect("constant bounds are valid")
}

impl FinLatency {
    pub(super) fn new(now: Instant) -> FinLatency {
        FinLatency {
            current: histogram(),
            previous: None,
            since: now,
        }
    }

    /// Starts a new window when the current one is over (two: none kept).
    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.since);
        if age < FIN_LATENCY_WINDOW {
            return;
        }
        if age < 2 * FIN_LATENCY_WINDOW {
            let mut fresh = self.previous.take().unwrap_or_else(histogram);
            fresh.reset();
            self.previous = Some(std::mem::replace(&mut self.current, fresh));
        } else {
            self.current.reset();
            self.previous = None;
        }
        self.since = now;
    }

    /// Records one FIN, `latency` after its delivery.
    pub(super) fn record(&mut self, latency: Duration, now: Instant) {
        self.rotate(now);
        let us = (latency.as_micros() as u64).clamp(1, MAX_US);
        self.current.saturating_record(us);
    }

    /// The percentiles over the windows not yet over at `now`.
    pub(super) fn summary(&self, now: Instant) -> crate::stats::FinLatency {
        let age = now.saturating_duration_since(self.since);
        let mut merged = histogram();
        if age < 2 * FIN_LATENCY_WINDOW {
            let _ = merged.add(&self.current);
        }
        if age < FIN_LATENCY_WINDOW {
            if let Some(p) = &self.previous {
                let _ = merged.add(p);
            }
        }
        let ns = |q: f64| merged.value_at_quantile(q).saturating_mul(1000);
        crate::stats::FinLatency {
            count: merged.len(),
            p50: if merged.is_empty() { 0 } else { ns(0.5) },
            p99: if merged.is_empty() { 0 } else { ns(0.99) },
            p999: if merged.is_empty() { 0 } else { ns(0.999) },
        }
    }
}

/// A channel's oldest unfinished message, as [`Channel::oldest_unfinished`] finds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OldestUnfinished {
    /// Its publish time (Unix ns); `None` when nothing is unfinished (or its time is
    /// not known yet).
    pub timestamp: Option<i64>,
    /// The sequence of a record on disk only whose publish time this needs: the shard
    /// reads it ([`Channel::note_disk_timestamp`]) for the next call.
    pub read_wanted: Option<u64>,
}

impl Channel {
    /// The publish time of this channel's oldest unfinished message (see the module
    /// docs). When that message's record is on disk only (a lagging channel with
    /// nothing read ahead) its time comes from the last read of it for `/stats`:
    /// exact when it was read at the same sequence, else the time of an older record
    /// read before (the age is then an upper bound until the next read), else, before
    /// any read, the oldest record in memory stands in (a lower bound); `read_wanted`
    /// then asks for that read.
    pub fn oldest_unfinished(&self, log: &Log) -> OldestUnfinished {
        let mut oldest: Option<i64> = None;
        let mut take = |ts: i64| oldest = Some(oldest.map_or(ts, |o| o.min(ts)));
        for f in self.in_flight.values() {
            take(f.msg.timestamp);
        }
        for m in &self.ready.requeued {
            take(m.timestamp);
        }
        let mut seqs = Vec::with_capacity(3);
        if let Some((&seq, _)) = self.ready.unread.first_key_value() {
            seqs.push(seq);
        }
        if let Some(seq) = self.deferred.first_seq() {
            match self.deferred.body(seq) {
                Some(m) => take(m.timestamp),
                None => seqs.push(seq),
            }
        }
        if let Some(seq) = self.next_waiting(log) {
            seqs.push(seq);
        }
        let mut read_wanted: Option<u64> = None;
        for seq in seqs {
            let (ts, read) = self.timestamp_of(log, seq);
            if let Some(ts) = ts {
                take(ts);
            }
            if let Some(r) = read {
                read_wanted = Some(read_wanted.map_or(r, |w| w.min(r)));
            }
        }
        OldestUnfinished {
            timestamp: oldest,
            read_wanted,
        }
    }

    /// [`Channel::oldest_unfinished`]'s publish time alone.
    pub fn oldest_unfinished_timestamp(&self, log: &Log) -> Option<i64> {
        self.oldest_unfinished(log).timestamp
    }

    /// The record at `seq`, only on disk, was published at `timestamp` (read for
    /// [`Channel::oldest_unfinished`]).
    pub fn note_disk_timestamp(&mut self, seq: u64, timestamp: i64) {
        self.counters.disk_oldest = Some((seq, timestamp));
    }

    /// The sequence of the first record the cursor will deliver, if any is pumped to
    /// this channel and not stepped over.
    pub(super) fn next_waiting(&self, log: &Log) -> Option<u64> {
        let mut seq = self.cursor;
        // Holes and stepped-over ranges alternate at most a few times in practice; the
        // bound keeps a pathological layout from costing more than a few steps.
        for _ in 0..64 {
            let next = self.skip.next_absent(log.skip_hole(seq));
            if next == seq {
                break;
            }
            seq = next;
        }
        (seq < log.pumped).then_some(seq)
    }

    /// The publish time of the record at `seq` (see [`Channel::oldest_unfinished`]),
    /// and the sequence to read from disk when it is not known exactly.
    fn timestamp_of(&self, log: &Log, seq: u64) -> (Option<i64>, Option<u64>) {
        if let Some(r) = log.get(seq) {
            return (Some(r.timestamp), None);
        }
        if let Some(r) = self.read_ahead.find(seq) {
            return (Some(r.timestamp), None);
        }
        if seq >= log.base {
            // A record lost in memory (corrupt): nothing to read.
            return (None, None);
        }
        match self.counters.disk_oldest {
            Some((s, ts)) if s == seq => (Some(ts), None),
            Some((s, ts)) if s < seq => (Some(ts), Some(seq)),
            _ => {
                let in_memory = (log.base..log.head)
                    .take(64)
                    .find_map(|s| log.get(s))
                    .map(|r| r.timestamp);
                (in_memory, Some(seq))
            }
        }
    }

    /// Starts recording delivery-to-FIN latencies (`--channel-lag-stats`); no-op when
    /// recording already.
    pub fn start_fin_latency(&mut self, now: Instant) {
        if self.counters.fin_latency.is_none() {
            self.counters.fin_latency = Some(Box::new(FinLatency::new(now)));
        }
    }

    /// True once [`Channel::start_fin_latency`] was called.
    pub fn records_fin_latency(&self) -> bool {
        self.counters.fin_latency.is_some()
    }

    /// Delivery-to-FIN latency percentiles at `now` (zeros before the first FIN).
    pub fn fin_latency(&self, now: Instant) -> crate::stats::FinLatency {
        self.counters
            .fin_latency
            .as_ref()
            .map(|h| h.summary(now))
            .unwrap_or_default()
    }
}
