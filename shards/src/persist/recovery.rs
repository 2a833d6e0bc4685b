//! Recovery at start: every topic this shard owns under `--data-path` comes back from
//! its store, `meta.json` and journal, with its channels' cursors and their unfinished
//! messages (attempts and due time, without their bodies).

use super::{meta_digest, topic_meta};
use crate::channel::Channel;
use crate::shard::{owner_of, Shard};
use crate::topic::{Record, Topic};
use futures::StreamExt;
use nsq_storage::journal::{self, MessageState};
use nsq_storage::meta::{self, PendingMessage};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

/// No topic reaches this many messages (2^62: 146 years at 10^9 a second); a metadata
/// sequence beyond it is corrupt.
const SEQ_MAX: u64 = 1 << 62;

/// Brings back a recovered channel's unfinished messages with attempts and due time,
/// without their bodies: those stay in the log and are read back when the message is
/// due for delivery (see `Channel::ready_unread_count`), so start-up reads no body whatever
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
                    ch.name()
                );
            }
            MessageState::Pending {
                attempts,
                due_unix_ns,
            } => {
                // A pending message at or above the cursor was deferred at publish time
                // or journaled after the checkpoint: the cursor must step over its record.
                if seq >= ch.cursor() {
                    ch.step_over([seq]);
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
            MessageState::Finished if seq >= ch.cursor() => {
                ch.step_over([seq]);
            }
            MessageState::Finished => {}
        }
    }

    fn finish(self, ch: &mut Channel) {
        ch.restore_pending(self.deferred, self.ready);
    }
}

/// Why a topic's data could not be loaded at start-up. Its `Display` is the cause
/// alone; the shard logs and reports `TOPIC(<name>): recovery failed - <cause>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryError {
    /// Its segment store could not be opened (the store's error).
    Open(nsq_storage::StoreError),
}

/// Topics a shard recovers at once at start-up.
const RECOVER_AT_ONCE: usize = 8;

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryError::Open(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RecoveryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecoveryError::Open(e) => Some(e),
        }
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
        let mut mine = Vec::new();
        for dir_name in names {
            if dir_name.starts_with(".deleted-") {
                if self.index() == 0 {
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
            if owner_of(name, self.count()) != self.index() {
                continue;
            }
            mine.push((name.to_string(), root.join(&dir_name)));
        }
        // A few topics at a time: each waits for the blocking thread several times
        // (store, metadata, journal), and those waits overlap.
        futures::stream::iter(mine)
            .for_each_concurrent(RECOVER_AT_ONCE, |(name, dir)| async move {
                self.recover_one(&name, dir).await;
            })
            .await;
    }

    /// [`Shard::recover_topic`] with its log line, or its failure noted for `/ping`.
    async fn recover_one(&self, name: &str, dir: PathBuf) {
        let started = Instant::now();
        match self.recover_topic(name, dir).await {
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
                self.meta.recovery_failed(name, e);
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
    ) -> Result<(u64, usize, (usize, usize, u64)), RecoveryError> {
        let keep = self.opts.mem_queue_size.max(1) as usize;
        let rec = nsq_storage::TopicStore::open(dir.clone(), self.store_config(), keep)
            .await
            .map_err(RecoveryError::Open)?;
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
        t.set_store_mode(self.store_mode());
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
        // A replicated topic continues after its last record on disk instead: the
        // records a crash took (and those finished before they were written) come back
        // at the same sequences from the topic's leader, skipped by ID up to the last
        // record here (docs/replication.md, "One numbering").
        let replicated = self.opts.replicated;
        let head = if replicated {
            stored_next
        } else {
            stored_next.max(meta_next)
        };
        rec.store.advance_to(head);
        t.set_stored(head);
        if let Some(last) = rec.tail.back() {
            t.resume_ids_after(crate::message::MessageId(last.id));
        }
        // The metadata's newest ID goes with its next_seq: records finished before they
        // were written keep their IDs taken too (a replicated topic's replay skips them).
        if let Some(id) = m.as_ref().map(|m| m.last_id).filter(|&id| id != 0) {
            if meta_next >= stored_next && !replicated {
                t.resume_ids_after(crate::message::MessageId(id));
            }
        }
        let tail_base = rec.tail.front().map(|r| r.seq).unwrap_or(head);
        t.log.restore(
            tail_base,
            head,
            rec.tail.into_iter().map(Record::from_stored),
        );
        t.attach_store(rec.store.clone(), 0);
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
                    if cursor > head && replicated {
                        // Past the last record on disk: it reads what the leader sends
                        // again (delivered again unless finished; at least once).
                        cursor = head;
                    } else if cursor > head {
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
                    ch.set_paused(c.paused);
                    ch.set_max_attempts_flag(name, self.opts.max_attempts);
                    ch.set_own_max_attempts(c.limits.max_attempts);
                    ch.set_rate_limit(c.limits.rate_limit.unwrap_or(0));
                    ch.set_journal(t.store().cloned());
                    ch.set_reread(t.reread());
                    ch.set_recovered_below(head);
                    // Finished at or above the cursor (a message published with a defer
                    // time, finished before the cursor reached it): stepped over.
                    let stepped_over = c.finished.iter().copied().filter(|&s| {
                        s >= ch.cursor()
                            && s < head
                            && !journaled.contains_key(&s)
                            && listed.binary_search_by_key(&s, |p| p.seq).is_err()
                    });
                    let stepped_over: Vec<u64> = stepped_over.collect();
                    ch.step_over(stepped_over);
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
                t.set_written_digest(meta_digest(&now_meta), true);
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
}
