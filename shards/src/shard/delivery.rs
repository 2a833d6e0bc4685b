//! Delivery: dispatching a topic's or a channel's messages to ready clients, FIN, REQ
//! and TOUCH, and the shard's timer queue (in-flight timeouts, deferred messages falling
//! due) with its periodic pass.

use super::{bump, memory_may_shrink, Shard};
use crate::channel::InFlightError;
use crate::client::Client;
use crate::message::MessageId;
use crate::timers::TimerQueue;
use crate::topic::Topic;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The shard's timer queue (nsqd: queueScanLoop's channel list): channels with an
/// in-flight timeout or a deferred message by their earliest due instant, and the
/// topics whose memory tail each timer pass trims.
#[derive(Default)]
pub struct Timers {
    /// Channels with an in-flight timeout or a deferred message, by the earliest due
    /// instant, as (topic, channel) (see crate::timers).
    queue: RefCell<TimerQueue<(String, String)>>,
    /// Wakes the shard's timer loop when a timer earlier than every registered one was
    /// registered (the loop may be sleeping until a later instant).
    wake: crate::wake::Notify,
    /// Durable topics whose memory tail may still shrink when their store makes more
    /// records readable from disk (see `Topic::trim`); each timer pass trims them.
    pub(super) trim_pending: RefCell<BTreeSet<String>>,
}

impl Timers {
    /// Notified when a timer earlier than every registered one was registered.
    pub fn wake(&self) -> &crate::wake::Notify {
        &self.wake
    }
}

impl Shard {
    pub(super) fn dispatch_topic(&self, t: &mut Topic) {
        self.mark(t);
        let now = Instant::now();
        let mut out = 0;
        let mut disk = false;
        for ch in t.channels.values_mut() {
            out += ch.dispatch(&t.log, now);
            disk |= ch.wants_read(t.log.base);
            self.schedule_timer(&t.name, ch);
        }
        bump(&self.counters.messages_out, out);
        t.trim(self.opts.mem_queue_size);
        if disk {
            self.schedule_disk_reads(t);
        }
    }

    pub(super) fn dispatch_channel(&self, topic: &str, channel: &str) {
        let mut topics = self.topics.borrow_mut();
        if let Some(t) = topics.get_mut(topic) {
            if let Some(ch) = t.channels.get_mut(channel) {
                let out = ch.dispatch(&t.log, Instant::now());
                let disk = ch.wants_read(t.log.base);
                self.schedule_timer(topic, ch);
                if out > 0 {
                    bump(&self.counters.messages_out, out);
                    t.trim(self.opts.mem_queue_size);
                    self.mark(t);
                }
                if disk {
                    self.schedule_disk_reads(t);
                }
            }
        }
    }

    fn with_channel<R>(
        &self,
        c: &Client,
        f: impl FnOnce(&mut crate::channel::Channel) -> Result<R, InFlightError>,
    ) -> Result<R, InFlightError> {
        let sub = c.subscription.borrow();
        let Some((t, chn)) = sub.as_ref() else {
            return Err(InFlightError::NotInFlight);
        };
        let r = {
            let mut topics = self.topics.borrow_mut();
            let topic = topics.get_mut(t).ok_or(InFlightError::NotInFlight)?;
            let ch = topic
                .channels
                .get_mut(chn)
                .ok_or(InFlightError::NotInFlight)?;
            let r = f(ch)?;
            self.mark(topic);
            r
        };
        self.dispatch_channel(t, chn);
        Ok(r)
    }

    pub fn finish(&self, c: &Client, id: MessageId) -> Result<(), InFlightError> {
        let opts = &self.opts;
        self.with_channel(c, |ch| {
            if opts.channel_lag && !ch.records_fin_latency() {
                ch.start_fin_latency(std::time::Instant::now());
            }
            if ch.e2e().is_none() && !opts.e2e_percentiles.is_empty() {
                ch.start_e2e(crate::quantile::Quantile::new(
                    opts.e2e_window,
                    &opts.e2e_percentiles,
                    crate::message::now_unix_nanos(),
                ));
            }
            ch.finish(c, id)
        })
    }

    pub fn requeue(&self, c: &Client, id: MessageId, delay: Duration) -> Result<(), InFlightError> {
        self.with_channel(c, |ch| ch.requeue(c, id, delay, Instant::now()))
    }

    pub fn touch(&self, c: &Client, id: MessageId) -> Result<(), InFlightError> {
        let max = self.opts.identify.max_msg_timeout;
        self.with_channel(c, |ch| ch.touch(c, id, Instant::now(), max))
    }

    /// Registers `ch` (of `topic`) in the shard's timer queue if its earliest in-flight
    /// deadline or deferred due time moved earlier than where it is registered. Called
    /// after every change to a channel's timers; wakes the timer loop when the new
    /// instant is the earliest of the shard.
    pub fn schedule_timer(&self, topic: &str, ch: &mut crate::channel::Channel) {
        let Some(due) = ch.timer_to_schedule() else {
            return;
        };
        let mut queue = self.timers.queue.borrow_mut();
        let earliest = queue.next_due().is_none_or(|d| due < d);
        queue.push(due, (topic.to_string(), ch.name().to_string()));
        drop(queue);
        if earliest {
            self.timers.wake.notify();
        }
    }

    /// Registers the timers of every channel (after recovery, and every
    /// [`TIMER_REFRESH`](super::TIMER_REFRESH) as a safety net; nsqd's queueScanLoop
    /// likewise refreshes its channel list every 5 s). Costs one look at each channel.
    pub fn schedule_all_timers(&self) {
        let mut topics = self.topics.borrow_mut();
        for t in topics.values_mut() {
            for ch in t.channels.values_mut() {
                self.schedule_timer(&t.name, ch);
            }
        }
    }

    /// When the next timer of this shard is due (an in-flight timeout or a deferred
    /// message of some channel), if any.
    pub fn next_timer_due(&self) -> Option<Instant> {
        self.timers.queue.borrow().next_due()
    }

    /// One pass of the shard's timer at `now`: this is nsqd's queueScanLoop (nsqd.go),
    /// run by each shard's timer loop (`src/runtime/shard.rs` timer_loop) for the channels it
    /// owns. The channels whose earliest timer is due move expired in-flight messages and
    /// due deferred messages back to their queue and deliver them again; the other
    /// channels are not visited. How it differs: nsqd wakes every 100 ms, samples 20
    /// random channels (queueScanSelectionCount) and rescans at once while more than 25 %
    /// of them were dirty, with a pool of workers; here the shard keeps its channels by
    /// earliest due time (`timers`), so it visits exactly the due ones, at most `TICK`
    /// (10 ms) after they are due, with no pool (each shard scans its own).
    /// Also trims the memory tail of topics whose store made more records readable, and
    /// delivers to every ready consumer of this shard whose channel has messages (a
    /// safety net: every change that makes a client ready delivers at once). Returns how
    /// many channels were visited for timers.
    pub fn process_timers(&self, now: Instant) -> usize {
        let due = self.timers.queue.borrow_mut().pop_due(now);
        let visited = due.len();
        let mut out = 0;
        let mut topics = self.topics.borrow_mut();
        for (tn, cn) in due {
            let Some(t) = topics.get_mut(&tn) else {
                continue;
            };
            let Some(ch) = t.channels.get_mut(&cn) else {
                continue;
            };
            ch.timer_fired(now);
            let mut disk = false;
            let moved = ch.process_timers(now) > 0;
            if moved {
                out += ch.dispatch(&t.log, now);
                disk = ch.wants_disk() || ch.wants_read(t.log.base);
            }
            self.schedule_timer(&tn, ch);
            if moved {
                self.mark(t);
            }
            if disk {
                self.schedule_disk_reads(t);
            }
        }
        // Memory is also freed as the store makes records readable from disk.
        let pending: Vec<String> = self.timers.trim_pending.borrow().iter().cloned().collect();
        for name in pending {
            let done = match topics.get_mut(&name) {
                Some(t) => {
                    t.trim(self.opts.mem_queue_size);
                    !memory_may_shrink(t)
                }
                None => true,
            };
            if done {
                self.timers.trim_pending.borrow_mut().remove(&name);
            }
        }
        drop(topics);
        bump(&self.counters.messages_out, out);
        let ready: Vec<(String, String)> = self
            .clients
            .map
            .borrow()
            .values()
            .filter_map(|w| w.upgrade())
            .filter(|c| c.is_ready() && !c.output_full())
            .filter_map(|c| c.subscription.borrow().clone())
            .collect();
        for (t, ch) in ready {
            self.dispatch_channel(&t, &ch);
        }
        visited
    }
}
