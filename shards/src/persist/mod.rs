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

use crate::channel::Channel;
use crate::shard::{owner_of, Shard};
use crate::topic::{Record, Topic, STORE_DELAY};

/// How often the store task looks at records not yet handed to the store.
const STORE_TICK: std::time::Duration = std::time::Duration::from_millis(10);
use nsq_storage::journal::{self, MessageState};
use nsq_storage::meta::{self, ChannelMeta, PendingMessage, TopicMeta, META_VERSION};
use std::cmp::Reverse;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

/// No topic reaches this many messages (2^62: 146 years at 10^9 a second); a metadata
/// sequence beyond it is corrupt.
const SEQ_MAX: u64 = 1 << 62;

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
        if ch.ephemeral {
            continue;
        }
        let mut pending = Vec::new();
        for f in ch.in_flight.values() {
            pending.push(PendingMessage {
                seq: f.msg.seq,
                attempts: f.msg.attempts,
                due_unix_ns: 0,
            });
        }
        for m in &ch.requeued {
            pending.push(PendingMessage {
                seq: m.seq,
                attempts: m.attempts,
                due_unix_ns: 0,
            });
        }
        for (&seq, &attempts) in &ch.ready_unread {
            pending.push(PendingMessage {
                seq,
                attempts,
                due_unix_ns: 0,
            });
        }
        for Reverse(d) in ch.deferred.iter() {
            pending.push(PendingMessage {
                seq: d.seq,
                attempts: d.attempts,
                due_unix_ns: crate::message::unix_nanos_at(d.due, now_i, now_ns),
            });
        }
        pending.sort_unstable_by_key(|p| p.seq);
        // Records the cursor will step over: those of pending messages are listed above
        // (recovery steps over them again); the others were finished already. Both are
        // in sequence order: one walk.
        let mut pi = pending.partition_point(|p| p.seq < ch.cursor);
        let finished = ch
            .skip
            .iter_from(ch.cursor)
            .filter(|&s| {
                while pending.get(pi).is_some_and(|p| p.seq < s) {
                    pi += 1;
                }
                pending.get(pi).is_none_or(|p| p.seq != s)
            })
            .collect();
        channels.push(ChannelMeta {
            name: ch.name.clone(),
            paused: ch.paused,
            cursor: ch.cursor,
            pending,
            finished,
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
        journal_gen: 0,
        pending_file: None,
    }
}

/// Brings back a recovered channel's unfinished messages with attempts and due time,
/// without their bodies: those stay in the log and are read back when the message is
/// due for delivery (see `Channel::ready_unread`), so start-up reads no body whatever
/// the count of pending or deferred messages. One whose record turns out to be missing
/// (every channel finished it after the checkpoint and before it was due to be written)
/// is dropped then. Deferred ones are collected and heaped at once (O(n)).
struct RestoredPending {
    first: u64,
    /// Pending messages at or beyond this have no record in the store.
    stored_next: u64,
    head: u64,
    now_i: Instant,
    now_ns: i64,
    deferred: Vec<crate::channel::Deferred>,
    ready: Vec<(u64, u16)>,
}

impl RestoredPending {
    fn new(first: u64, stored_next: u64, head: u64) -> RestoredPending {
        RestoredPending {
            first,
            stored_next,
            head,
            now_i: Instant::now(),
            now_ns: crate::message::now_unix_nanos(),
            deferred: Vec::new(),
            ready: Vec::new(),
        }
    }

    fn add(&mut self, ch: &mut Channel, seq: u64, st: MessageState) {
        if seq >= self.head || seq < self.first {
            return;
        }
        match st {
            MessageState::Pending { .. } if seq >= self.stored_next => {
                log::debug!(
                    "CHANNEL({}): pending message {seq} has no record in the store; dropped",
                    ch.name
                );
            }
            MessageState::Pending {
                attempts,
                due_unix_ns,
            } => {
                // A pending message at or above the cursor was deferred at publish time
                // or journaled after the checkpoint: the cursor must step over its record.
                if seq >= ch.cursor {
                    ch.skip.insert(seq);
                }
                if due_unix_ns != 0 {
                    self.deferred.push(crate::channel::Deferred {
                        due: crate::message::instant_at(due_unix_ns, self.now_i, self.now_ns),
                        seq,
                        attempts,
                    });
                } else {
                    self.ready.push((seq, attempts));
                }
            }
            // Finished after the checkpoint: the cursor steps over it.
            MessageState::Finished if seq >= ch.cursor => {
                ch.skip.insert(seq);
            }
            MessageState::Finished => {}
        }
    }

    fn finish(self, ch: &mut Channel) {
        ch.deferred = self.deferred.into_iter().map(Reverse).collect();
        ch.ready_unread = self.ready.into_iter().collect();
    }
}

impl Shard {
    /// Loads every topic under `--data-path` that this shard owns (by name hash).
    pub async fn recover(self: &Rc<Self>) {
        let Some(dp) = self.opts.data_path.clone() else {
            return;
        };
        let root = dp.join("topics");
        let r2 = root.clone();
        let names: Vec<String> = glommio::executor()
            .spawn_blocking(move || {
                std::fs::read_dir(&r2)
                    .map(|rd| {
                        rd.filter_map(|e| e.ok())
                            .filter(|e| e.path().is_dir())
                            .filter_map(|e| e.file_name().to_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .await;
        for dir_name in names {
            if dir_name.starts_with(".deleted-") {
                if self.index == 0 {
                    let p = root.join(&dir_name);
                    let _ = glommio::executor()
                        .spawn_blocking(move || std::fs::remove_dir_all(p))
                        .await;
                }
                continue;
            }
            let Some(name) = dir_name.strip_prefix("t-") else {
                continue;
            };
            if !crate::names::is_valid_topic_name(name) || crate::names::is_ephemeral(name) {
                continue;
            }
            if owner_of(name, self.count) != self.index {
                continue;
            }
            let started = Instant::now();
            match self.recover_topic(name, root.join(&dir_name)).await {
                Ok((n, ch, (sealed, scanned, bytes))) => {
                    // What is still to be delivered (the records on disk include those
                    // every channel already finished, kept until their segment goes).
                    let left = self.topics.borrow().get(name).map_or(0, |t| {
                        t.depth()
                            + t.channels
                                .values()
                                .map(|c| c.depth(&t.log) + c.deferred_count() as u64)
                                .max()
                                .unwrap_or(0)
                    });
                    log::info!(
                        "TOPIC({name}): recovered in {:?}: {n} records on disk, {ch} channels, \
                         {left} messages left to deliver (the most of any channel) \
                         ({sealed} segments from their index, {scanned} scanned: {bytes} bytes)",
                        started.elapsed()
                    )
                }
                Err(e) => {
                    let e = format!("TOPIC({name}): recovery failed - {e}");
                    log::error!("{e}");
                    self.failed_recoveries
                        .borrow_mut()
                        .insert(name.to_string(), e);
                }
            }
        }
    }

    /// Recovers one topic: its store, `meta.json`, then the journal. Returns the messages
    /// on disk, the channels, and (segments taken from their index, segments scanned,
    /// bytes scanned).
    async fn recover_topic(
        &self,
        name: &str,
        dir: PathBuf,
    ) -> Result<(u64, usize, (usize, usize, u64)), String> {
        let keep = self.opts.mem_queue_size.max(1) as usize;
        let rec = nsq_storage::TopicStore::open(dir.clone(), self.store_config(), keep).await?;
        let d2 = dir.clone();
        let m = glommio::executor()
            .spawn_blocking(move || meta::read_blocking(&d2))
            .await
            .unwrap_or_else(|e| {
                log::error!(
                    "TOPIC({}): metadata unreadable - {e}; channels start at the oldest message",
                    dir.display()
                );
                None
            });
        let meta_gen = m.as_ref().map(|m| m.journal_gen).unwrap_or(0);
        let d3 = dir.clone();
        let events = glommio::executor()
            .spawn_blocking(move || journal::read_blocking(&d3, meta_gen))
            .await;
        let n_events = events.len();
        let mut folded = journal::fold(events);
        rec.store.journal_recovered(meta_gen);
        let segs = (rec.sealed_segments, rec.scanned_segments, rec.scanned_bytes);
        let mut t = Topic::new(name, self.opts.node_id);
        t.store_mode = self.store_mode();
        // The newest records may never have been written (finished first): continue
        // after the newest sequence the metadata knew, never reusing one.
        let stored_next = rec.next_seq;
        let mut meta_next = m.as_ref().map(|m| m.next_seq).unwrap_or(0);
        if meta_next > SEQ_MAX {
            log::error!(
                "TOPIC({name}): metadata next_seq {meta_next} is beyond any count of messages; using the store's ({stored_next})"
            );
            meta_next = 0;
        }
        let head = stored_next.max(meta_next);
        rec.store.advance_to(head);
        t.stored = head;
        if let Some(last) = rec.tail.back() {
            t.resume_ids_after(crate::message::MessageId(last.id));
        }
        let tail_base = rec.tail.front().map(|r| r.seq).unwrap_or(head);
        t.log.restore(
            tail_base,
            head,
            rec.tail.into_iter().map(Record::from_stored),
        );
        t.store = Some(rec.store.clone());
        t.reread_from = Some(0);
        let first = rec.first_seq;
        match &m {
            Some(m) => {
                t.paused = m.paused;
                t.log.pumped = m.pumped.clamp(first, head);
                // A hole reaches no further than the head: sequences from there on are
                // new messages (a damaged metadata file must not swallow them).
                t.log.holes = m
                    .holes
                    .iter()
                    .map(|&(from, to)| (from, to.min(head)))
                    .filter(|&(from, to)| from < to)
                    .collect();
                for c in &m.channels {
                    if !crate::names::is_valid_channel_name(&c.name) {
                        continue;
                    }
                    let fold = folded.remove(&c.name).unwrap_or_default();
                    let mut cursor = c.cursor;
                    if cursor > head {
                        // Impossible in metadata this broker wrote (a cursor never passes
                        // the end it wrote with it): damage. Clamped to the end, it
                        // would count every stored message as consumed (and delete it);
                        // delivered again from the oldest instead (at least once).
                        log::error!(
                            "TOPIC({name}) CHANNEL({}): metadata cursor {cursor} is past the topic's end ({head}); the channel starts at its oldest message ({first})",
                            c.name
                        );
                        cursor = first;
                    }
                    // The checkpoint's pending messages, then what the journal says
                    // happened to them and to others since (nsqd keeps neither across
                    // a crash). The checkpoint's list is in sequence order and the
                    // journal's few: one pass over the list, journaled states first.
                    let mut journaled = fold.states;
                    let listed: &[PendingMessage] = if fold.emptied_to.is_some() {
                        &[]
                    } else {
                        &c.pending
                    };
                    if let Some(to) = fold.emptied_to {
                        cursor = cursor.max(to);
                    }
                    let mut ch = Channel::new(&c.name, cursor.clamp(first, head));
                    ch.paused = c.paused;
                    ch.journal = t.store.clone();
                    ch.reread = t.reread_from.zip(t.store.clone());
                    ch.recovered_below = head;
                    // Finished at or above the cursor (a message published with a defer
                    // time, finished before the cursor reached it): stepped over.
                    let stepped_over = c.finished.iter().copied().filter(|&s| {
                        s >= ch.cursor
                            && s < head
                            && !journaled.contains_key(&s)
                            && listed.binary_search_by_key(&s, |p| p.seq).is_err()
                    });
                    ch.skip.extend(stepped_over.collect::<Vec<_>>());
                    // Records from `stored_next` on are not in the store (lost within the
                    // sync window of a crash, or finished before they were written):
                    // their pending messages are gone with them.
                    let mut restored = RestoredPending::new(first, stored_next.max(first), head);
                    for p in listed {
                        let st = journaled.remove(&p.seq).unwrap_or(MessageState::Pending {
                            attempts: p.attempts,
                            due_unix_ns: p.due_unix_ns,
                        });
                        restored.add(&mut ch, p.seq, st);
                    }
                    for (seq, st) in journaled {
                        restored.add(&mut ch, seq, st);
                    }
                    restored.finish(&mut ch);
                    t.channels.insert(c.name.clone(), ch);
                }
            }
            None => {
                t.log.pumped = first;
            }
        }
        // Sequences the metadata counted but the store never got (finished by every
        // channel before they were due to be written, or lost within the sync window after
        // a crash) are a hole: no depth counts them and cursors step over them.
        if stored_next < head {
            t.log.holes.push((stored_next.max(first), head));
        }
        if n_events > 0 {
            log::info!("TOPIC({name}): applied {n_events} journal events");
        }
        // Records written after the last checkpoint were pumped to the channels before
        // the restart if the topic had channels and was not paused: nsqd's pump would
        // have moved them, so they belong to the channels, not the topic.
        if !t.paused && !t.channels.is_empty() {
            t.log.pumped = head;
        }
        let count = stored_next.max(first) - first;
        let nch = t.channels.len();
        // Metadata that says exactly what is on disk, with no journal events over it,
        // need not be written again; otherwise the first checkpoint writes it. With a
        // long pending list the comparison would cost as much as that write, which runs
        // after start-up rather than before it: such a topic is simply written once.
        let listed: usize = m
            .as_ref()
            .map_or(0, |m| m.channels.iter().map(|c| c.pending.len()).sum());
        let mut unchanged = false;
        if let Some(mut m) = m.filter(|_| n_events == 0 && listed <= meta::INLINE_PENDING_MAX) {
            m.journal_gen = 0;
            let now_meta = topic_meta(&t);
            if m == now_meta {
                t.written_meta = Some(meta_digest(&now_meta));
                unchanged = true;
            }
        }
        if !unchanged {
            self.mark(&mut t);
        }
        self.notify_lookup(crate::shard::LookupEvent::Register(name.to_string(), None));
        for c in t.channels.keys() {
            self.notify_lookup(crate::shard::LookupEvent::Register(
                name.to_string(),
                Some(c.clone()),
            ));
        }
        for ch in t.channels.values_mut() {
            self.schedule_timer(name, ch);
        }
        self.topics.borrow_mut().insert(name.to_string(), t);
        Ok((count, nch, segs))
    }

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
        // Retention by time must run for idle topics too (then every durable topic is
        // visited: `--retention-time` / `--retention-bytes` only); otherwise only the
        // topics marked changed ([`Shard::mark_changed`]) are looked at.
        let retains = self.opts.retains();
        type Work = (
            Rc<nsq_storage::TopicStore>,
            String,
            Option<(TopicMeta, u128)>,
            u64,
        );
        let changed_names = self.take_changed();
        let work: Vec<Work> = {
            let mut topics = self.topics.borrow_mut();
            let visit = |t: &mut Topic, marked: bool| -> Option<Work> {
                let st = t.store.clone()?;
                // `journal_gen` is 0 here; a new journal event also counts as a change.
                let mut m = topic_meta(t);
                let written = meta_digest(&m);
                let changed =
                    marked && (t.written_meta != Some(written) || st.journal_has_events());
                if !changed && !retains {
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
        for (st, name, m, low) in work {
            let res = match m {
                // A topic deleted before or during the write: nothing is written for
                // it (never its directory made again) and no error is reported.
                Some((m, written)) => {
                    let gen = m.journal_gen;
                    // The list of pending messages and its JSON are let go after the
                    // write: large ones count toward the shard's next heap trim.
                    let listed: usize = m.channels.iter().map(|c| c.pending.len()).sum();
                    let res = st.write_meta(m).await;
                    crate::memory_freed(listed * 64);
                    res.map(|w| w.then_some((gen, written)))
                }
                None => Ok(None),
            };
            unwritten.1.remove(&name);
            match res {
                Ok(None) => {}
                Ok(Some((gen, written))) => {
                    st.journal_covered(gen).await;
                    let mut topics = self.topics.borrow_mut();
                    if let Some(t) = topics.get_mut(&name) {
                        if t.store.as_ref().is_some_and(|s| Rc::ptr_eq(s, &st)) {
                            t.written_meta = Some(written);
                            // What the channels finished since recovery is in this
                            // metadata or in journal events after it: from now on a
                            // crash redelivers only what was finished since (once).
                            for ch in t.channels.values_mut() {
                                ch.recovered_below = 0;
                            }
                        }
                    }
                }
                Err(e) => {
                    // Still changed: the next checkpoint tries it again.
                    self.mark_changed(&name);
                    let cause = e.to_string();
                    let e = format!(
                        "STORE: metadata write for {} failed - {e}",
                        st.dir().display()
                    );
                    let (log, last) = &self.meta_error_log;
                    let same = *last.borrow() == cause;
                    log.error(same, format_args!("{e}"));
                    *last.borrow_mut() = cause;
                    meta_error = Some(e);
                }
            }
            // A seek during the write may have moved a cursor back: never delete what a
            // channel now needs, nor what the metadata just written still points at.
            let now_low = {
                let topics = self.topics.borrow();
                match topics.get(&name) {
                    Some(t) if t.store.as_ref().is_some_and(|s| Rc::ptr_eq(s, &st)) => {
                        t.low_watermark()
                    }
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
        // A topic whose write failed is still changed, so each checkpoint retries it:
        // the error stands (`/ping`) until one succeeds.
        *self.meta_error.borrow_mut() = meta_error;
        visited
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
            t.segment_newest = t.segment_newest.split_off(&cut);
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
        let memo = |t: &Topic| t.segment_newest.get(&s.base).copied();
        if let Some(ts) = self.topics.borrow().get(topic).and_then(memo) {
            return Some(ts);
        }
        let ts = match st.read(s.end_seq.saturating_sub(1), 1).await {
            Ok(recs) => recs.first().map(|r| r.timestamp)?,
            Err(_) => return None,
        };
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            t.segment_newest.insert(s.base, ts);
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
            let known = (t.retained.oldest_seq == oldest && t.retained.oldest_timestamp != 0)
                .then_some(t.retained.oldest_timestamp);
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
            t.retained = crate::topic::Retained {
                oldest_seq: oldest,
                oldest_timestamp,
                messages: t.log.head.saturating_sub(oldest),
                bytes,
            };
        }
    }

    /// Hands due records of every topic to its store (see `Topic::store_pump`): those
    /// older than [`STORE_DELAY`], or all of them with `all`. Returns true while records
    /// are left for later.
    pub fn pump_stores(&self, all: bool) -> bool {
        let cutoff = crate::message::now_unix_nanos() - STORE_DELAY.as_nanos() as i64;
        let mq = self.opts.mem_queue_size;
        let mut left = false;
        for name in self.unstored_topics() {
            let mut topics = self.topics.borrow_mut();
            let more = match topics.get_mut(&name) {
                Some(t) if t.store.is_some() && t.stored < t.log.head => {
                    t.skip_finished();
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
            let wake = std::pin::pin!(self.store_wake.wait());
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
            .filter_map(|t| t.store.clone())
            .collect();
        for st in &stores {
            st.close().await;
        }
        self.run_checkpoint().await;
    }
}
