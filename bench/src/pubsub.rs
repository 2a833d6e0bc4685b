//! `pubsub` mode: publish and consume in one process. After the run window it drains
//! (waits until every channel has everything acknowledged), counts lost and duplicate
//! messages exactly from the (producer, seq) bitmaps, and, with a --rate-schedule of
//! several phases, measures when the backlog of the last phase drained.

use crate::consumer::Seen;
use crate::now_unix_ns;
use crate::publish::Producers;
use crate::report::ChannelResult;
use crate::subscribe::Consumers;
use crate::Shared;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Backlog-drain detection for a --rate-schedule of several phases: when, after its last
/// phase started, the channels' backlog (acknowledged x channels - received) fell to what
/// 100 ms of the last rate (at least 1000 messages) leaves in flight.
pub struct Burst {
    /// The last phase's start.
    pub from: Instant,
    /// The backlog, in messages, that counts as drained.
    limit: u64,
    /// When it drained (None: not yet).
    pub drained_at: Option<Instant>,
}

impl Burst {
    /// The detector for this run (None unless a pubsub run with a multi-phase schedule).
    pub fn new(shared: &Shared, t0: Instant) -> Option<Burst> {
        shared
            .args
            .rate_schedule
            .as_ref()
            .filter(|s| s.len() > 1 && shared.args.mode == crate::args::Mode::Pubsub)
            .map(|s| Burst {
                from: t0 + s.last_phase_start(),
                limit: (s.last_rate() * 0.1).max(1000.0) as u64,
                drained_at: None,
            })
    }

    /// Records the drain (once) if the backlog is small enough at `now`; consumers then
    /// also record the latency of later messages (`Shared::drained_ns`).
    pub fn check(
        &mut self,
        shared: &Shared,
        producers: &Producers,
        consumers: &Consumers,
        now: Instant,
    ) {
        if self.drained_at.is_some() {
            return;
        }
        let expected = producers.acked() * shared.channels.len() as u64;
        if now >= self.from && expected.saturating_sub(consumers.received()) <= self.limit {
            self.drained_at = Some(now);
            shared.drained_ns.store(now_unix_ns(), Ordering::SeqCst);
        }
    }
}

/// Waits until every channel has everything published to its topic, nothing arrived for
/// --idle-timeout (at least --deferred-ms + 1 s), --drain-timeout passed, or every
/// consumer finished.
pub fn drain(
    shared: &Shared,
    producers: &Producers,
    consumers: &Consumers,
    sent_per_topic: &[u64],
    burst: &mut Option<Burst>,
) {
    let a = &shared.args;
    let idle = a
        .idle_timeout
        .max(Duration::from_millis(a.deferred_ms) + Duration::from_secs(1));
    let drain_start = Instant::now();
    let mut last_total = consumers.received();
    let mut last_change = drain_start;
    loop {
        let complete = (0..shared.topics.len()).all(|t| {
            (0..shared.channels.len()).all(|c| consumers.received_on(t, c) >= sent_per_topic[t])
        });
        let now = Instant::now();
        if let Some(b) = burst.as_mut() {
            b.check(shared, producers, consumers, now);
        }
        let total = consumers.received();
        if total != last_total {
            last_total = total;
            last_change = now;
        }
        if complete
            || now - last_change >= idle
            || now - drain_start >= a.drain_timeout
            || consumers.all_done()
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pubsub channel's exact counts: unique and duplicate deliveries from `seen`, and
/// per producer the acknowledged sequence numbers (below its count for topic `t`) never
/// seen.
pub fn pubsub_channel_result(
    producers: &Producers,
    t: usize,
    seen: &Seen,
    mut cr: ChannelResult,
) -> ChannelResult {
    cr.unique = seen.total();
    cr.duplicates = seen.duplicates;
    cr.lost = producers
        .stats
        .iter()
        .enumerate()
        .map(|(p, s)| {
            let n = s.acked_per_topic[t].load(Ordering::SeqCst);
            n - seen.count_below(p, n).min(n)
        })
        .sum();
    cr
}
