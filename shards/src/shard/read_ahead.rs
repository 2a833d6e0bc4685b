//! Reads from a topic's store, each in a task of its own (nothing else waits for them):
//! the read-ahead for channels lagging behind the memory tail, and the bodies of messages
//! ready again below it (deferred messages that fell due, requeued ones after a restart),
//! with their retries after a failed read.

use super::{bump, Shard};
use crate::topic::Topic;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Returns `Pending` once (after asking to be polled again), so that what follows runs
/// after the code that spawned the task has returned.
pub(super) async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// How long a read for messages ready again waits before it is tried again when their
/// records are handed to the store but not written yet.
const UNREAD_WAIT: Duration = Duration::from_millis(10);

/// A read from the store for one lagging channel.
struct DiskRead {
    topic: String,
    channel: String,
    from: u64,
    /// Records to read at most (what the channel's clients can take, see
    /// [`crate::channel::Channel::disk_read_from`]).
    max: usize,
    hint: Option<nsq_storage::ReadPos>,
    epoch: u64,
}

impl Shard {
    /// Starts a read from the store for every channel of `t` whose cursor is below the
    /// memory tail and whose read-ahead buffer runs low (without stalling anything else).
    pub(super) fn schedule_disk_reads(&self, t: &mut Topic) {
        let Some(store) = t.store().cloned() else {
            return;
        };
        let base = t.log.base;
        for ch in t.channels.values_mut() {
            if let Some((from, max)) = ch.unread_read_from(base) {
                let me = self.me.borrow().upgrade();
                let Some(me) = me else { return };
                let epoch = ch.start_unread_read();
                let read = DiskRead {
                    topic: t.name.clone(),
                    channel: ch.name().to_string(),
                    from,
                    max,
                    hint: None,
                    epoch,
                };
                let store = store.clone();
                glommio::spawn_local(async move {
                    yield_once().await;
                    me.unread_read(store, read).await;
                })
                .detach();
            }
            let Some((from, max)) = ch.disk_read_from(base) else {
                continue;
            };
            let me = self.me.borrow().upgrade();
            let Some(me) = me else { return };
            let (hint, epoch) = ch.start_disk_read();
            let read = DiskRead {
                topic: t.name.clone(),
                channel: ch.name().to_string(),
                from,
                max,
                hint,
                epoch,
            };
            let store = store.clone();
            glommio::spawn_local(async move {
                // glommio polls a spawned task at once, while the caller still holds
                // the topics borrow: a read that completes without waiting (nothing
                // readable) must not borrow them before that returns.
                yield_once().await;
                me.disk_read(store, read).await;
            })
            .detach();
        }
    }

    /// The pause after a failed read is over: reads may start again.
    fn retry_disk_read(&self, topic: &str, channel: &str) {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        self.mark(t);
        if let Some(ch) = t.channels.get_mut(channel) {
            ch.disk_read_retry_due();
        }
        self.schedule_disk_reads(t);
        if let Some(ch) = t.channels.get_mut(channel) {
            if !ch.disk_read_pending() {
                // No read is wanted any more (the cursor moved past the disk: an empty,
                // a seek): the failing read is not retried, so it is no longer a fault.
                ch.clear_read_error();
            }
        }
    }

    /// Reads back the bodies of messages ready again below the memory tail (a deferred
    /// message that fell due, a requeued one recovered after a restart: see
    /// [`crate::channel::Channel::unread_read_from`]), then delivers. A failed read is
    /// retried after a pause that doubles, as the cursor's reads are.
    async fn unread_read(&self, store: Rc<nsq_storage::TopicStore>, r: DiskRead) {
        let (_, max_bytes) = crate::channel::DISK_READ_BATCH;
        let res = store.read_at(r.from, r.max.max(1), max_bytes, None).await;
        let readable = store.readable_seq();
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(&r.topic) else {
            return;
        };
        let base = t.log.base;
        let Some(ch) = t.channels.get_mut(&r.channel) else {
            return;
        };
        if ch.read_epoch() != r.epoch {
            // Emptied or sought meanwhile: what it was for is gone.
            ch.unread_read_done();
            self.schedule_disk_reads(t);
            return;
        }
        match res {
            Ok((recs, _)) => {
                ch.unread_read_done();
                ch.read_succeeded();
                let recs = recs
                    .into_iter()
                    .map(crate::topic::Record::from_stored)
                    .collect();
                let gone = ch.unread_arrived(r.from, base, readable, recs);
                if ch.unread_waits_for_store(base, readable) {
                    // Out of the memory tail and not written yet: read again shortly.
                    ch.start_unread_read();
                    self.retry_after(UNREAD_WAIT, &r, Shard::retry_unread_read);
                }
                if gone > 0 {
                    log::warn!(
                        "TOPIC({}) CHANNEL({}): {gone} messages ready again are missing on disk (finished before they were written, or lost); skipped",
                        r.topic,
                        r.channel
                    );
                }
            }
            Err(e) => {
                let delay = read_failed(ch, &r, &e);
                self.retry_after(delay, &r, Shard::retry_unread_read);
                return;
            }
        }
        self.mark(t);
        if let Some(ch) = t.channels.get_mut(&r.channel) {
            let out = ch.dispatch(&t.log, Instant::now());
            self.schedule_timer(&r.topic, ch);
            bump(&self.counters.messages_out, out);
        }
        self.schedule_disk_reads(t);
    }

    /// The pause after a failed read for messages ready again is over.
    fn retry_unread_read(&self, topic: &str, channel: &str) {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        if let Some(ch) = t.channels.get_mut(channel) {
            ch.unread_read_done();
        }
        self.schedule_disk_reads(t);
        if let Some(ch) = t.channels.get_mut(channel) {
            if !ch.unread_read_pending() && !ch.disk_read_pending() {
                ch.clear_read_error();
            }
        }
    }

    async fn disk_read(&self, store: Rc<nsq_storage::TopicStore>, r: DiskRead) {
        let (max, max_bytes) = crate::channel::DISK_READ_BATCH;
        let res = store
            .read_at(r.from, r.max.clamp(1, max), max_bytes, r.hint)
            .await;
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(&r.topic) else {
            return;
        };
        self.mark(t);
        let base = t.log.base;
        let Some(ch) = t.channels.get_mut(&r.channel) else {
            return;
        };
        if ch.read_epoch() != r.epoch {
            // The cursor jumped meanwhile (empty, seek): this read is stale.
            ch.disk_read_done();
            self.schedule_disk_reads(t);
            return;
        }
        ch.disk_read_done();
        if res.is_ok() {
            ch.read_succeeded();
        }
        match res {
            Ok((recs, pos)) if !recs.is_empty() => {
                // Each body is copied out of the read's 1 MiB window: a slice would keep
                // the whole window alive as long as the message is held (in flight to a
                // consumer that does not read, requeued), a window per message.
                ch.disk_read_arrived(
                    pos,
                    recs.into_iter().map(|r| {
                        let mut r = crate::topic::Record::from_stored(r);
                        r.body = bytes::Bytes::copy_from_slice(&r.body);
                        r
                    }),
                );
            }
            Ok(_) => {
                // Nothing on disk at or after `from` below the memory tail: those
                // records are gone (corrupt or deleted); continue from memory.
                if ch.disk_read_found_nothing(r.from, base) {
                    log::error!(
                        "TOPIC({}) CHANNEL({}): records {}..{base} missing on disk; skipped",
                        r.topic,
                        r.channel,
                        r.from
                    );
                }
            }
            Err(e) => {
                let delay = read_failed(ch, &r, &e);
                ch.disk_read_waits_for_retry();
                self.retry_after(delay, &r, Shard::retry_disk_read);
            }
        }
        let out = ch.dispatch(&t.log, Instant::now());
        self.schedule_timer(&r.topic, ch);
        bump(&self.counters.messages_out, out);
        self.schedule_disk_reads(t);
    }
}

/// A read from the store for `r` failed: the channel reports it on `/ping` until a read
/// succeeds, and the error is logged. Returns the pause before the read is tried again,
/// which doubles from 100 ms up to 5 s: a disk that keeps failing must not turn into a
/// loop of reads and error lines.
fn read_failed(
    ch: &mut crate::channel::Channel,
    r: &DiskRead,
    e: &dyn std::fmt::Display,
) -> Duration {
    let delay = ch.read_failed(format!(
        "TOPIC({}) CHANNEL({}): disk read failed - {e}",
        r.topic, r.channel
    ));
    log::error!(
        "TOPIC({}) CHANNEL({}): disk read failed - {e}; retrying in {}",
        r.topic,
        r.channel,
        nsq_wire::duration::go_duration_string(delay)
    );
    delay
}

impl Shard {
    /// Runs `retry` for the topic and channel of `r` after `delay`, on this shard.
    fn retry_after(&self, delay: Duration, r: &DiskRead, retry: fn(&Shard, &str, &str)) {
        if let Some(me) = self.me.borrow().upgrade() {
            let (topic, channel) = (r.topic.clone(), r.channel.clone());
            glommio::spawn_local(async move {
                glommio::timer::sleep(delay).await;
                retry(&me, &topic, &channel);
            })
            .detach();
        }
    }
}
