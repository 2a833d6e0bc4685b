//! Metadata checkpoints (every `--sync-timeout` and at shutdown: only the topics marked
//! changed are written) and segment retention, with the retained range measured for
//! `/stats`.

use super::{meta_digest, topic_meta};
use crate::shard::Shard;
use crate::topic::Topic;
use nsq_storage::meta::TopicMeta;
use std::rc::Rc;

/// A synced checkpoint with more topics than this to sync flushes them with one
/// `syncfs(2)` of the data path's filesystem instead of two fsyncs each (a file's and its
/// directory's): bulk topic and channel creation would otherwise be bound by the disk's
/// flush time, about 1 ms per fsync on many disks.
pub const SYNCFS_FROM: usize = 8;

impl Shard {
    /// Writes the metadata of every durable topic whose metadata changed since it was
    /// last written (an idle topic costs one comparison, no disk write) and applies
    /// segment retention. Runs every `--sync-timeout` and at shutdown.
    ///
    /// Retention: by default a segment is deleted once every channel has passed it (its
    /// records are all below the topic's low watermark). With `--retention-time` or
    /// `--retention-bytes` ([`crate::Options::retains`]) such a consumed segment is kept
    /// for replay, and goes (oldest first; the segment being written never does) once
    /// its newest record is older than `--retention-time`, or while the topic's sealed
    /// segment files add up to more than `--retention-bytes` (the segment being written
    /// is not counted). The retained range is then measured for `/stats`.
    ///
    /// Returns how many topics it looked at: those marked changed, or with retention
    /// every durable topic.
    pub async fn checkpoint(&self) -> usize {
        self.checkpoint_with(true).await
    }

    /// [`Shard::checkpoint`], with the metadata writes fsynced (`sync`) or only written
    /// (see [`nsq_storage::meta::write_to`]). A topic written without a sync stays marked
    /// changed, so the next synced checkpoint syncs it; one with more than
    /// [`SYNCFS_FROM`] topics to sync writes them all unsynced, then flushes them with
    /// one `syncfs` of the data path's filesystem.
    pub(crate) async fn checkpoint_with(&self, sync: bool) -> usize {
        // Retention by time must run for idle topics too (then every durable topic is
        // visited: `--retention-time` / `--retention-bytes` only); otherwise only the
        // topics marked changed ([`Shard::mark_changed`]) are looked at.
        let retains = self.opts.retains();
        // (store, topic, metadata to write and its digest, low watermark, sync only: the
        // metadata on disk is current but was written without a sync).
        type Work = (
            Rc<nsq_storage::TopicStore>,
            String,
            Option<(TopicMeta, u128)>,
            u64,
            bool,
        );
        let changed_names = self.take_changed();
        let work: Vec<Work> = {
            let mut topics = self.topics.borrow_mut();
            let visit = |t: &mut Topic, marked: bool| -> Option<Work> {
                let st = t.store().cloned()?;
                // `journal_gen` is 0 here; a new journal event also counts as a change.
                let mut m = topic_meta(t);
                let written = meta_digest(&m);
                let changed =
                    marked && (t.written_digest() != Some(written) || st.journal_has_events());
                let sync_only = marked && !changed && !t.meta_synced();
                if sync_only && !sync {
                    // Written, not yet synced: kept for the next synced checkpoint.
                    self.mark(t);
                }
                let sync_only = sync_only && sync;
                if !changed && !sync_only && !retains {
                    return None;
                }
                // Same synchronous step: the snapshot includes every event journaled
                // so far, and later events go to the next generation.
                m.journal_gen = st.journal_snapshot();
                Some((
                    st,
                    t.name.clone(),
                    changed.then_some((m, written)),
                    t.low_watermark(),
                    sync_only,
                ))
            };
            if retains {
                topics
                    .values_mut()
                    .filter_map(|t| {
                        let marked = changed_names.contains(&t.name);
                        visit(t, marked)
                    })
                    .collect()
            } else {
                changed_names
                    .iter()
                    .filter_map(|name| topics.get_mut(name).and_then(|t| visit(t, true)))
                    .collect()
            }
        };
        // The topics taken whose metadata is not written yet: marked changed again if
        // this future is dropped mid-write (a connection's task that ran it went away).
        struct Unwritten<'a>(&'a Shard, std::collections::HashSet<String>);
        impl Drop for Unwritten<'_> {
            fn drop(&mut self) {
                for name in &self.1 {
                    self.0.mark_changed(name);
                }
            }
        }
        let visited = if retains {
            self.topics.borrow().len()
        } else {
            changed_names.len()
        };
        let mut unwritten = Unwritten(
            self,
            work.iter()
                .filter(|w| w.2.is_some())
                .map(|w| w.1.clone())
                .collect(),
        );
        let mut meta_error = None;
        let to_sync = work.iter().filter(|w| w.2.is_some() || w.4).count();
        let batch = sync && to_sync > SYNCFS_FROM;
        // Written (or found written) and waiting for the batch's syncfs: store, topic,
        // the journal generation the metadata covers.
        let mut batched: Vec<(Rc<nsq_storage::TopicStore>, String, Option<u64>)> = Vec::new();
        for (st, name, m, low, sync_only) in work {
            let res = match m {
                // A topic deleted before or during the write: nothing is written for
                // it (never its directory made again) and no error is reported.
                Some((m, written)) => {
                    let gen = m.journal_gen;
                    // The list of pending messages and its JSON are let go after the
                    // write: large ones count toward the shard's next heap trim.
                    let listed: usize = m.channels.iter().map(|c| c.pending.len()).sum();
                    let res = st.write_meta(m, sync && !batch).await;
                    crate::memory_freed(listed * 64);
                    res.map(|w| w.then_some((gen, written)))
                }
                None if sync_only && batch => {
                    batched.push((st.clone(), name.clone(), None));
                    Ok(None)
                }
                None if sync_only => st.sync_meta().await.map(|_| {
                    self.meta_synced(&name, &st);
                    None
                }),
                None => Ok(None),
            };
            unwritten.1.remove(&name);
            match res {
                Ok(None) => {}
                Ok(Some((gen, written))) => {
                    if batch {
                        // Covered once the syncfs below has made the metadata durable.
                        batched.push((st.clone(), name.clone(), Some(gen)));
                    } else {
                        st.journal_covered(gen).await;
                    }
                    let mut topics = self.topics.borrow_mut();
                    if let Some(t) = topics.get_mut(&name) {
                        if t.store().is_some_and(|s| Rc::ptr_eq(s, &st)) {
                            t.set_written_digest(written, sync && !batch);
                            if !sync {
                                self.mark(t);
                            }
                            // What the channels finished since recovery is in this
                            // metadata or in journal events after it: from now on a
                            // crash redelivers only what was finished since (once).
                            for ch in t.channels.values_mut() {
                                ch.recovery_checkpointed();
                            }
                        }
                    }
                }
                Err(e) => {
                    // Still changed: the next checkpoint tries it again.
                    self.mark_changed(&name);
                    meta_error = Some(self.meta_write_failed(&st.dir().display(), &e));
                }
            }
            // A seek during the write may have moved a cursor back: never delete what a
            // channel now needs, nor what the metadata just written still points at.
            let now_low = {
                let topics = self.topics.borrow();
                match topics.get(&name) {
                    Some(t) if t.store().is_some_and(|s| Rc::ptr_eq(s, &st)) => t.low_watermark(),
                    _ => continue,
                }
            };
            let low = low.min(now_low);
            if self.opts.retains() {
                let segs = st.segment_list().await;
                let cut = self.retention_cut(&name, &st, &segs, low).await;
                st.delete_before(cut).await;
                // What delete_before leaves: segments reaching past the cut, and the last.
                let left: u64 = segs
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| s.end_seq > cut || i + 1 == segs.len())
                    .map(|(_, s)| s.bytes)
                    .sum();
                self.measure_retained(&name, &st, left).await;
            } else {
                // Held back by a failing disk and finished by every channel since: not
                // written at all (a drained backlog must not need the space it freed).
                let dropped = st.forget_unwritten_below(low);
                if dropped > 0 {
                    log::info!(
                        "STORE: {}: {dropped} unwritten messages every channel finished are not written",
                        st.dir().display()
                    );
                }
                st.delete_before(low).await;
            }
        }
        if !batched.is_empty() {
            match self.syncfs().await {
                Ok(()) => {
                    for (st, name, gen) in batched {
                        if let Some(gen) = gen {
                            st.journal_covered(gen).await;
                        }
                        self.meta_synced(&name, &st);
                    }
                }
                Err(e) => {
                    for (_, name, _) in &batched {
                        self.mark_changed(name);
                    }
                    let dp = self.opts.data_path.clone().unwrap_or_default();
                    meta_error = Some(self.meta_write_failed(&dp.display(), &e));
                }
            }
        }
        // A topic whose write failed is still changed, so each checkpoint retries it:
        // the error stands (`/ping`) until one succeeds.
        self.meta.set_error(meta_error);
        visited
    }

    /// `name`'s metadata, as last written through `st`, is on disk.
    fn meta_synced(&self, name: &str, st: &Rc<nsq_storage::TopicStore>) {
        if let Some(t) = self.topics.borrow_mut().get_mut(name) {
            if t.store().is_some_and(|s| Rc::ptr_eq(s, st)) {
                t.set_meta_synced();
            }
        }
    }

    /// Logs a failed metadata write or sync of `what` (once a second per cause, with a
    /// count) and returns the error `/ping` reports.
    fn meta_write_failed(&self, what: &dyn std::fmt::Display, e: &std::io::Error) -> String {
        let cause = e.to_string();
        let e = format!("STORE: metadata write for {what} failed - {e}");
        self.meta.log_error(cause, &e);
        e
    }

    /// `syncfs(2)` of the data path's filesystem (on a blocking thread): one flush for
    /// every metadata file written since, instead of two fsyncs each.
    async fn syncfs(&self) -> std::io::Result<()> {
        let Some(dp) = self.opts.data_path.clone() else {
            return Ok(());
        };
        glommio::executor()
            .spawn_blocking(move || nsq_storage::meta::sync_filesystem(&dp))
            .await
    }

    /// Under `--retention-time` / `--retention-bytes`: the sequence below which the
    /// store's segments may be deleted (see [`Shard::checkpoint`]). Only segments wholly
    /// below `low` (consumed by every channel) qualify. A segment's age is its last
    /// record's publish time; when that record cannot be read, the next readable one's
    /// (newer) is used; with none readable, or on a read error, the segment is kept (for
    /// the time rule).
    async fn retention_cut(
        &self,
        topic: &str,
        st: &nsq_storage::TopicStore,
        segs: &[nsq_storage::SegmentInfo],
        low: u64,
    ) -> u64 {
        let max_bytes = self.opts.retention_bytes;
        let max_age = self.opts.retention_time.as_nanos().min(i64::MAX as u128) as i64;
        let cutoff = crate::message::now_unix_nanos().saturating_sub(max_age);
        // The segment being written is never deleted and not counted (its file is
        // preallocated ahead of what it holds).
        let sealed = &segs[..segs.len().saturating_sub(1)];
        let mut total: u64 = sealed.iter().map(|s| s.bytes).sum();
        let mut cut = 0;
        for s in sealed {
            if s.end_seq > low {
                break;
            }
            let over_size = max_bytes > 0 && total > max_bytes;
            let expired = !over_size
                && max_age > 0
                && self
                    .segment_newest(topic, st, s)
                    .await
                    .is_some_and(|ts| ts < cutoff);
            if !(over_size || expired) {
                break;
            }
            cut = s.end_seq;
            total = total.saturating_sub(s.bytes);
        }
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            // Forget deleted segments.
            t.forget_segments_below(cut);
        }
        cut
    }

    /// The newest publish time (Unix ns) in sealed segment `s`, read once and then
    /// remembered in the topic; `None` when nothing is readable there or the read failed.
    async fn segment_newest(
        &self,
        topic: &str,
        st: &nsq_storage::TopicStore,
        s: &nsq_storage::SegmentInfo,
    ) -> Option<i64> {
        let memo = |t: &Topic| t.segment_newest(s.base);
        if let Some(ts) = self.topics.borrow().get(topic).and_then(memo) {
            return Some(ts);
        }
        let ts = match st.read(s.end_seq.saturating_sub(1), 1).await {
            Ok(recs) => recs.first().map(|r| r.timestamp)?,
            Err(_) => return None,
        };
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            t.remember_segment_newest(s.base, ts);
        }
        Some(ts)
    }

    /// Measures what `topic` retains for replay into [`crate::topic::Retained`];
    /// `bytes` is what its segment files hold.
    async fn measure_retained(&self, topic: &str, st: &nsq_storage::TopicStore, bytes: u64) {
        let (oldest, head, known_ts) = {
            let topics = self.topics.borrow();
            let Some(t) = topics.get(topic) else { return };
            let oldest = t.oldest_retained();
            let known = (t.retained().oldest_seq == oldest && t.retained().oldest_timestamp != 0)
                .then_some(t.retained().oldest_timestamp);
            let ts = known.or_else(|| t.log.get(oldest).map(|r| r.timestamp));
            (oldest, t.log.head, ts)
        };
        let oldest_timestamp = match known_ts {
            _ if oldest >= head => 0,
            Some(ts) => ts,
            None => st
                .read(oldest, 1)
                .await
                .ok()
                .and_then(|r| r.first().map(|r| r.timestamp))
                .unwrap_or(0),
        };
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            t.set_retained(crate::topic::Retained {
                oldest_seq: oldest,
                oldest_timestamp,
                messages: t.log.head.saturating_sub(oldest),
                bytes,
            });
        }
    }
}
