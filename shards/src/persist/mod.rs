//! Durability glue between the shard and its topics' stores: recovery at start,
//! periodic checkpoints of metadata (channel positions, paused flags), segment retention,
//! and the final flush at shutdown.
//!
//! Channel state survives a restart as its cursor plus the list of messages below the
//! cursor that were not finished (in flight, requeued or deferred, with attempts and due
//! time), and the messages at or above the cursor that were finished already (published
//! with a defer time, they reach the channel before its cursor does). A clean shutdown
//! writes it exactly, so nothing finished is delivered again; after a crash the last
//! checkpoint (at most one `--sync-timeout` old) is used, so messages finished since then
//! are delivered again (at least once).
//!
//! Recovery is in `recovery.rs`, checkpoints and retention in `checkpoint.rs`; this file
//! holds the metadata of a topic as it stands ([`topic_meta`], [`meta_digest`]) and the
//! hand-over of records to the stores (the store task, and the final flush).

use crate::shard::Shard;
use crate::topic::Topic;
use nsq_storage::meta::{ChannelMeta, PendingMessage, TopicMeta, META_VERSION};
use std::rc::Rc;
use std::time::Instant;

mod checkpoint;
pub use checkpoint::SYNCFS_FROM;
mod recovery;

/// How often the store task looks at records not yet handed to the store.
const STORE_TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// A 128-bit digest of `m` (two SipHash passes with different inputs): a topic keeps
/// this rather than a copy of the metadata it last wrote, which lists every pending
/// message (a million deferred ones would cost 24 MB to keep and compare).
pub fn meta_digest(m: &TopicMeta) -> u128 {
    use std::hash::{Hash, Hasher};
    /// Two independent multiply-xorshift lanes over the fields' integers: several GB/s
    /// (ten million pending messages in about 0.1 s), and for change detection of
    /// the broker's own state a collision is as good as impossible.
    struct Digest(u64, u64);
    impl Hasher for Digest {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for c in bytes.chunks(8) {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                self.write_u64(u64::from_le_bytes(w) ^ ((c.len() as u64) << 59));
            }
        }
        fn write_u8(&mut self, v: u8) {
            self.write_u64(u64::from(v) | 0x100);
        }
        fn write_u16(&mut self, v: u16) {
            self.write_u64(u64::from(v) | 0x1_0000);
        }
        fn write_u32(&mut self, v: u32) {
            self.write_u64(u64::from(v) | 0x1_0000_0000);
        }
        fn write_u64(&mut self, v: u64) {
            self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            self.0 ^= self.0 >> 29;
            self.1 = (self.1.rotate_left(23) ^ v).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
            self.1 ^= self.1 >> 32;
        }
        fn write_usize(&mut self, v: usize) {
            self.write_u64(v as u64);
        }
        fn write_i64(&mut self, v: i64) {
            self.write_u64(v as u64);
        }
    }
    let mut d = Digest(0x243F_6A88_85A3_08D3, 0x1319_8A2E_0370_7344);
    m.hash(&mut d);
    (u128::from(d.0) << 64) | u128::from(d.1)
}

/// The metadata of a topic as it stands.
pub fn topic_meta(t: &Topic) -> TopicMeta {
    let (now_i, now_ns) = (Instant::now(), crate::message::now_unix_nanos());
    let mut channels = Vec::new();
    for ch in t.channels.values() {
        if ch.is_ephemeral() {
            continue;
        }
        let mut pending = Vec::new();
        ch.for_each_pending(|seq, attempts, due| {
            pending.push(PendingMessage {
                seq,
                attempts,
                due_unix_ns: due.map_or(0, |d| crate::message::unix_nanos_at(d, now_i, now_ns)),
            });
        });
        pending.sort_unstable_by_key(|p| p.seq);
        // Records the cursor will step over: those of pending messages are listed above
        // (recovery steps over them again); the others were finished already. Both are
        // in sequence order: one walk.
        let mut pi = pending.partition_point(|p| p.seq < ch.cursor());
        let finished = ch
            .stepped_over_from(ch.cursor())
            .filter(|&s| {
                while pending.get(pi).is_some_and(|p| p.seq < s) {
                    pi += 1;
                }
                pending.get(pi).is_none_or(|p| p.seq != s)
            })
            .collect();
        channels.push(ChannelMeta {
            name: ch.name().to_string(),
            paused: ch.is_paused(),
            cursor: ch.cursor(),
            pending,
            finished,
            limits: nsq_storage::meta::ChannelLimits {
                max_attempts: ch.own_max_attempts(),
                rate_limit: ch.rate_limit(),
            },
        });
    }
    TopicMeta {
        version: META_VERSION,
        name: t.name.clone(),
        paused: t.paused,
        pumped: t.log.pumped,
        holes: t.log.holes.clone(),
        channels,
        next_seq: t.log.head,
        last_id: t.last_id().map_or(0, |i| i.0),
        journal_gen: 0,
        pending_file: None,
    }
}

impl Shard {
    /// Hands due records of every topic to its store (see `Topic::store_pump`): those
    /// older than the topic's store delay ([`crate::topic::STORE_DELAY`] unless it was
    /// set longer), or all of them with `all`. Returns true while records are left for
    /// later.
    pub fn pump_stores(&self, all: bool) -> bool {
        let mq = self.opts.mem_queue_size;
        let mut left = false;
        for name in self.unstored_topics() {
            let mut topics = self.topics.borrow_mut();
            let more = match topics.get_mut(&name) {
                Some(t) if t.store().is_some() && t.stored() < t.log.head => {
                    t.skip_finished();
                    let cutoff = t.store_cutoff();
                    let more = t.store_pump(cutoff, mq, all);
                    t.trim(mq);
                    more
                }
                _ => false,
            };
            if more {
                left = true;
            } else {
                self.stored_all(&name);
            }
        }
        left
    }

    /// Runs until shutdown: while some topic holds records not yet handed to its store,
    /// every `STORE_TICK` lets go of the finished ones (never written) and hands the
    /// due ones over.
    pub async fn store_loop(self: Rc<Self>) {
        use futures::future::{select, Either};
        loop {
            let wake = std::pin::pin!(self.stores.wake().wait());
            let stop = std::pin::pin!(self.shutdown.wait());
            if let Either::Right(_) = select(wake, stop).await {
                return;
            }
            loop {
                glommio::timer::sleep(STORE_TICK).await;
                if self.shutdown.is_set() || !self.pump_stores(false) {
                    break;
                }
            }
        }
    }

    /// Shutdown: flush and sync every store, then write the exact channel state (every
    /// durable topic is looked at once more).
    pub async fn close_stores(&self) {
        let names: Vec<String> = self.topics.borrow().keys().cloned().collect();
        for name in &names {
            self.mark_changed(name);
        }
        self.pump_stores(true);
        let stores: Vec<_> = self
            .topics
            .borrow()
            .values()
            .filter_map(|t| t.store().cloned())
            .collect();
        for st in &stores {
            st.close().await;
        }
        self.run_checkpoint().await;
    }
}
