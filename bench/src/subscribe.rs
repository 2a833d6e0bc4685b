//! `sub` mode (and the consuming half of `pubsub`): --consumers consumer threads per
//! address, topic and channel; the rule that ends a `sub` run; per-channel counts.

use crate::consumer::{self, ConsumerStats, Seen, Sub};
use crate::report::ChannelResult;
use crate::{new_hist, Shared};
use hdrhistogram::Histogram;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One consumer thread.
pub struct ConsumerSlot {
    /// Index into `Shared::topics`.
    pub topic: usize,
    /// Index into `Shared::channels`.
    pub channel: usize,
    /// Its live counters.
    pub stats: Arc<ConsumerStats>,
    handle: std::thread::JoinHandle<Seen>,
}

/// The running consumers.
#[derive(Default)]
pub struct Consumers {
    /// Every consumer, in start order.
    pub slots: Vec<ConsumerSlot>,
}

impl Consumers {
    /// Starts every consumer; subscription happens in the threads (see
    /// [`Consumers::wait_subscribed`]).
    pub fn start(shared: &Arc<Shared>) -> Consumers {
        let a = &shared.args;
        let mut slots: Vec<ConsumerSlot> = Vec::new();
        for addr in &a.nsqd_tcp_address {
            for t in 0..shared.topics.len() {
                for c in 0..shared.channels.len() {
                    for k in 0..a.consumers {
                        let stats = Arc::new(ConsumerStats::new());
                        let name = format!("consumer-{}-{}-{}-{}", slots.len(), t, c, k);
                        let (sh, st, addr) = (shared.clone(), stats.clone(), addr.clone());
                        let handle = std::thread::Builder::new()
                            .name(format!("cons-{}", slots.len()))
                            .spawn(move || {
                                let sub = Sub {
                                    addr: &addr,
                                    topic: &sh.topics[t],
                                    channel: &sh.channels[c],
                                    name,
                                };
                                consumer::run(sh.clone(), sub, st)
                            })
                            .expect("spawn consumer");
                        slots.push(ConsumerSlot {
                            topic: t,
                            channel: c,
                            stats,
                            handle,
                        });
                    }
                }
            }
        }
        Consumers { slots }
    }

    /// Waits up to 10 s for every consumer to subscribe (or give up); true when all did.
    pub fn wait_subscribed(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = self.slots.iter().all(|c| {
                c.stats.subscribed.load(Ordering::SeqCst) || c.stats.done.load(Ordering::SeqCst)
            });
            if ready || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.slots
            .iter()
            .all(|c| c.stats.subscribed.load(Ordering::SeqCst))
    }

    /// Stops and joins every consumer without looking at what they saw.
    pub fn abandon(self, shared: &Shared) {
        shared.stop_consumers.store(true, Ordering::SeqCst);
        for c in self.slots {
            let _ = c.handle.join();
        }
    }

    /// Messages received so far, all consumers.
    pub fn received(&self) -> u64 {
        self.slots
            .iter()
            .map(|c| c.stats.received.load(Ordering::Relaxed))
            .sum()
    }

    /// Messages received so far on topic `t`, channel `c`.
    pub fn received_on(&self, t: usize, c: usize) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.topic == t && s.channel == c)
            .map(|s| s.stats.received.load(Ordering::Relaxed))
            .sum()
    }

    /// True once every consumer thread has finished.
    pub fn all_done(&self) -> bool {
        self.slots
            .iter()
            .all(|c| c.stats.done.load(Ordering::SeqCst))
    }

    /// The publish-to-receive histogram of every consumer.
    pub fn merged_hist(&self) -> Histogram<u64> {
        let mut h = new_hist();
        for c in &self.slots {
            let _ = h.add(
                &*c.stats
                    .hist
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
        h
    }

    /// The histogram of messages published after a burst drained (see pubsub).
    pub fn merged_hist_after(&self) -> Histogram<u64> {
        let mut after = new_hist();
        for c in &self.slots {
            let _ = after.add(
                &*c.stats
                    .hist_after
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
        after
    }

    /// Joins every consumer: (what each topic/channel saw, raw receive counts per
    /// topic/channel, messages of other runs), indexed `topic * channels + channel`.
    pub fn join(self, shared: &Shared) -> (Vec<Option<Seen>>, Vec<u64>, u64) {
        let n = shared.topics.len() * shared.channels.len();
        let mut seen_by: Vec<Option<Seen>> = (0..n).map(|_| None).collect();
        let mut foreign = 0;
        let mut raw_by: Vec<u64> = vec![0; n];
        for c in self.slots {
            let idx = c.topic * shared.channels.len() + c.channel;
            foreign += c.stats.foreign.load(Ordering::SeqCst);
            raw_by[idx] += c.stats.received.load(Ordering::SeqCst);
            if let Ok(s) = c.handle.join() {
                match &mut seen_by[idx] {
                    Some(m) => m.merge(&s),
                    slot @ None => *slot = Some(s),
                }
            }
        }
        (seen_by, raw_by, foreign)
    }
}

/// A `sub` run's end, checked each pass of the run loop: Some(window end) when every
/// topic/channel received --expect messages, when something arrived and then nothing for
/// --idle-timeout (a drained backlog; the window ends at the last arrival), or when every
/// consumer finished. `last_rx` is (time of the last change, received then).
pub fn sub_done(
    shared: &Shared,
    consumers: &Consumers,
    now: Instant,
    last_rx: &mut (Instant, u64),
) -> Option<Instant> {
    let a = &shared.args;
    let r = consumers.received();
    if let Some(expect) = a.expect {
        let all_in = (0..shared.topics.len())
            .all(|t| (0..shared.channels.len()).all(|c| consumers.received_on(t, c) >= expect));
        if all_in {
            return Some(now);
        }
    }
    if r != last_rx.1 {
        *last_rx = (now, r);
    } else if r > 0 && now - last_rx.0 >= a.idle_timeout {
        return Some(last_rx.0);
    }
    if consumers.all_done() {
        return Some(now);
    }
    None
}

/// A `sub` channel's counts: what arrived, and with --expect, what is missing of it.
pub fn sub_channel_result(shared: &Shared, mut cr: ChannelResult) -> ChannelResult {
    cr.unique = cr.received;
    if let Some(expect) = shared.args.expect {
        cr.sent = expect;
        cr.lost = expect.saturating_sub(cr.received);
    }
    cr
}
