//! What a replicated topic's group (docs/replication.md) reads from and does to the
//! topic this shard owns: the newest message ID applied, the channels' finished
//! positions the leader replicates, a follower's channel moved up to them, and the
//! consumers closed when this node stops leading the topic.

use super::{bump, Shard};
use crate::message::MessageId;
use crate::topic::{ReplicaRecord, ReplicaState, Restored, Topic};

/// A channel's state as [`Shard::channel_positions`] gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelPosition {
    pub channel: String,
    /// The next sequence the channel reads.
    pub cursor: u64,
    /// Every sequence below it is finished on the channel.
    pub low: u64,
    /// What the replicas are sent of the unfinished messages.
    pub state: PendingState,
}

/// An unfinished message as replicated: (sequence, attempts, due Unix ns or 0: ready).
pub type PendingTuple = (u64, u16, i64);

/// A channel's unfinished messages as a leader sends them ([`Shard::channel_positions`]);
/// a message is (sequence, attempts, due Unix ns or 0: ready).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingState {
    /// All of them, in sequence order.
    Whole(Vec<(u64, u16, i64)>),
    /// What changed since the previous round: the messages finished, and those whose
    /// state changed as they are now, each in sequence order.
    Changes {
        finished: Vec<u64>,
        pending: Vec<(u64, u16, i64)>,
    },
    /// Too many to send, and their changes were not all recorded: only `low` says
    /// anything.
    Watermark,
}

impl Shard {
    /// The newest message ID `topic` holds (`None`: no such topic or no message yet).
    pub fn topic_last_id(&self, topic: &str) -> Option<MessageId> {
        self.topics.borrow().get(topic).and_then(|t| t.last_id())
    }

    /// True when `topic` exists on this shard.
    pub fn topic_exists(&self, topic: &str) -> bool {
        self.topics.borrow().contains_key(topic)
    }

    /// True when `topic` exists on this shard and has `channel`.
    pub fn has_channel(&self, topic: &str, channel: &str) -> bool {
        self.topics
            .borrow()
            .get(topic)
            .is_some_and(|t| t.channels.contains_key(channel))
    }

    /// Each channel of `topic` (#ephemeral ones too: a consumer that fails over to the
    /// next leader continues where it was) with its low watermark: every log sequence
    /// below it is finished on that channel.
    pub fn channel_watermarks(&self, topic: &str) -> Vec<(String, u64)> {
        let topics = self.topics.borrow();
        let Some(t) = topics.get(topic) else {
            return Vec::new();
        };
        t.channels
            .iter()
            .map(|(name, c)| (name.clone(), c.low_watermark()))
            .collect()
    }

    /// [`Topic::changes`] of `topic`, if this shard has it: the channel positions
    /// ([`Shard::channel_positions`]) are the same while it is.
    pub fn topic_changes(&self, topic: &str) -> Option<u64> {
        self.topics.borrow().get(topic).map(Topic::changes)
    }

    /// The most unfinished messages (in flight, requeued, deferred, for the dead-letter
    /// topic) one channel of `topic` holds; 0 without the topic or channels.
    pub fn channel_pending_max(&self, topic: &str) -> usize {
        self.topics.borrow().get(topic).map_or(0, |t| {
            t.channels
                .values()
                .map(crate::channel::Channel::pending_count)
                .max()
                .unwrap_or(0)
        })
    }

    /// Each channel of `topic` (#ephemeral ones too) with its cursor and its unfinished
    /// messages: all of them for a channel holding at most `max` (or, for a channel in
    /// `whole`, at most `whole_max`), else what changed since the previous call (the
    /// channel's recorded changes, taken here), else its low watermark only. What a
    /// replicated topic's leader sends its replicas each round (docs/replication.md,
    /// "Channel state"); from here on each channel records its changes for the next
    /// call.
    pub fn channel_positions(
        &self,
        topic: &str,
        max: usize,
        whole: &std::collections::HashSet<String>,
        whole_max: usize,
    ) -> Vec<ChannelPosition> {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return Vec::new();
        };
        let (now_i, now_ns) = (std::time::Instant::now(), crate::message::now_unix_nanos());
        let due_ns = |due: Option<std::time::Instant>| {
            due.map_or(0, |d| {
                crate::message::unix_nanos_at(d, now_i, now_ns).max(1)
            })
        };
        t.channels
            .iter_mut()
            .map(|(name, c)| {
                let changes = c.take_changes();
                if !c.tracks_changes() {
                    c.track_changes(true);
                }
                let limit = if whole.contains(name) { whole_max } else { max };
                let state = if c.pending_count() <= limit {
                    let mut v = Vec::with_capacity(c.pending_count());
                    c.pending_states(|seq, attempts, due| v.push((seq, attempts, due_ns(due))));
                    v.sort_unstable();
                    PendingState::Whole(v)
                } else {
                    match changes.and_then(crate::channel::ChangeLog::latest) {
                        Some(latest) => {
                            let mut finished = Vec::new();
                            let mut pending = Vec::new();
                            for (seq, change) in latest {
                                match change {
                                    crate::channel::Change::Finished => finished.push(seq),
                                    crate::channel::Change::Pending { attempts, due } => {
                                        pending.push((seq, attempts, due_ns(due)));
                                    }
                                }
                            }
                            PendingState::Changes { finished, pending }
                        }
                        None => PendingState::Watermark,
                    }
                };
                ChannelPosition {
                    channel: name.clone(),
                    cursor: c.cursor(),
                    low: c.low_watermark(),
                    state,
                }
            })
            .collect()
    }

    /// The changes of `channel` of `topic` taken by [`Shard::channel_positions`] did not
    /// reach the replicas (the proposal was refused): its next round cannot send
    /// changes.
    pub fn channel_changes_lost(&self, topic: &str, channel: &str) {
        if let Some(c) = self
            .topics
            .borrow_mut()
            .get_mut(topic)
            .and_then(|t| t.channels.get_mut(channel))
        {
            c.forget_changes();
        }
    }

    /// Stops every channel of `topic` recording its changes (this member no longer
    /// leads it).
    pub fn stop_tracking_changes(&self, topic: &str) {
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            t.tracks_changes = false;
            for c in t.channels.values_mut() {
                c.track_changes(false);
            }
        }
    }

    /// Every channel of `topic` starts recording its changes from its state now (a
    /// member that takes over a topic's leadership).
    pub fn start_tracking_changes(&self, topic: &str) {
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            t.tracks_changes = true;
            for c in t.channels.values_mut() {
                c.track_changes(true);
            }
        }
    }

    /// The cursor and unfinished messages (sequence, attempts, due Unix ns or 0) of
    /// `channel` of `topic`, in sequence order; `None` without the channel.
    pub fn channel_state(&self, topic: &str, channel: &str) -> Option<(u64, Vec<PendingTuple>)> {
        let topics = self.topics.borrow();
        let c = topics.get(topic)?.channels.get(channel)?;
        let (now_i, now_ns) = (std::time::Instant::now(), crate::message::now_unix_nanos());
        let mut v = Vec::with_capacity(c.pending_count());
        c.pending_states(|seq, attempts, due| {
            let due_ns = due.map_or(0, |d| {
                crate::message::unix_nanos_at(d, now_i, now_ns).max(1)
            });
            v.push((seq, attempts, due_ns));
        });
        v.sort_unstable();
        Some((c.cursor(), v))
    }

    /// A replica takes its leader's state of `channel` of `topic`
    /// ([`Shard::channel_positions`]): its cursor (capped at the log head) and
    /// unfinished messages. Returns false when there is no such channel.
    pub fn set_channel_position(
        &self,
        topic: &str,
        channel: &str,
        cursor: u64,
        pending: &[(u64, u16, i64)],
    ) -> bool {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return false;
        };
        let head = t.log.head;
        let Some(ch) = t.channels.get_mut(channel) else {
            return false;
        };
        let (now_i, now_ns) = (std::time::Instant::now(), crate::message::now_unix_nanos());
        let pending = pending
            .iter()
            .filter(|&&(seq, _, _)| seq < head)
            .map(|&(seq, attempts, due_ns)| {
                let due = (due_ns != 0).then(|| crate::message::instant_at(due_ns, now_i, now_ns));
                (seq, attempts, due)
            })
            .collect();
        ch.set_position(cursor.min(head), pending);
        self.mark(t);
        self.dispatch_topic(t);
        true
    }

    /// Moves `channel` of `topic` forward to `seq` (capped at the log head) when its own
    /// low watermark is below: a follower learning what the leader's consumers finished.
    /// Messages the channel holds in flight stay (see `Channel::seek`); a channel at or
    /// past `seq` is left alone. Returns true when it moved.
    pub fn advance_channel(&self, topic: &str, channel: &str, seq: u64) -> bool {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return false;
        };
        let head = t.log.head;
        let Some(ch) = t.channels.get_mut(channel) else {
            return false;
        };
        let seq = seq.min(head);
        if ch.low_watermark() >= seq {
            return false;
        }
        ch.seek(seq);
        self.mark(t);
        self.dispatch_topic(t);
        true
    }

    /// `topic` as a replica restoring a snapshot needs it ([`ReplicaState`]): with its
    /// unfinished records (from memory, and from the store below the memory tail)
    /// unless they span more than `max_span` sequences or hold more than `max_bytes`
    /// of bodies, or the store cannot give them all back yet. `None`: no such topic.
    pub async fn replica_state(
        &self,
        topic: &str,
        max_span: u64,
        max_bytes: usize,
    ) -> Option<ReplicaState> {
        // Records below the memory tail that were handed to the store and are not
        // flushed yet are not waited for: the caller is the leader's Raft loop, which
        // would hold the topic's publishes meanwhile (the store writes unfinished
        // records after its delay). The snapshot then carries no records, and the
        // replica fetches them in pages (`replica_page`, which waits for them).
        let (mut state, base, store) = {
            let topics = self.topics.borrow();
            let t = topics.get(topic)?;
            (t.replica_state(max_span), t.log.base, t.store().cloned())
        };
        let Some(memory) = state.records.take() else {
            return Some(state);
        };
        let mut bytes: usize = memory.iter().map(|r| r.body.len()).sum();
        let mut records = Vec::new();
        let mut from = state.low;
        if from < base {
            let Some(store) = store else {
                return Some(state);
            };
            if store.readable_seq() < base {
                // Records handed to the store and not flushed yet: not sent this time.
                return Some(state);
            }
            let mut hint = None;
            while from < base {
                let Ok((batch, end)) = store
                    .read_at(from, 4096, max_bytes.saturating_sub(bytes).max(1), hint)
                    .await
                else {
                    return Some(state);
                };
                let Some(last) = batch.last().map(|r| r.seq) else {
                    break;
                };
                for r in batch.into_iter().filter(|r| r.seq < base) {
                    bytes += r.body.len();
                    records.push(replica_record(r));
                }
                if bytes > max_bytes {
                    return Some(state);
                }
                from = last + 1;
                hint = end;
            }
        }
        if bytes > max_bytes {
            return Some(state);
        }
        records.extend(memory);
        state.records = Some(records);
        Some(state)
    }

    /// A page of `topic`'s records for a replica catching up on a backlog larger than
    /// a snapshot carries: the records from sequence `from` (or from the topic's low
    /// watermark when higher: everything below it is finished on every channel) in
    /// sequence order, about `max_bytes` of bodies (at least one record), and the
    /// sequence the next page starts at (the log head once a page reaches it). A page
    /// comes from the store or from memory, not both. Records handed to the store and
    /// not flushed yet are waited for up to a second (then the page is empty and the
    /// next starts at `from` again); sequences below the memory tail never handed to
    /// the store (finished in memory) are stepped over. `None`: no such topic, or the
    /// store failed.
    pub async fn replica_page(
        &self,
        topic: &str,
        from: u64,
        max_bytes: usize,
    ) -> Option<(Vec<ReplicaRecord>, u64)> {
        let mut tries = 0;
        loop {
            let (from, base, store) = {
                let topics = self.topics.borrow();
                let t = topics.get(topic)?;
                let from = from.max(t.low_watermark().min(t.log.head));
                if from >= t.log.base {
                    return Some(t.records_from(from, max_bytes));
                }
                (from, t.log.base, t.store().cloned()?)
            };
            let readable = store.readable_seq();
            if readable > from {
                let (batch, _) = store
                    .read_at(from, crate::topic::PAGE_RECORDS, max_bytes, None)
                    .await
                    .ok()?;
                let first = batch.first().map(|r| r.seq);
                let records: Vec<ReplicaRecord> = batch
                    .into_iter()
                    .filter(|r| r.seq < base)
                    .map(replica_record)
                    .collect();
                // Nothing stored from `from` below the memory tail: those sequences
                // hold nothing (finished and removed); the next page starts further.
                let next = match records.last() {
                    Some(r) => r.seq + 1,
                    None => first.unwrap_or(base).min(base).min(readable).max(from + 1),
                };
                return Some((records, next));
            }
            if store.next_seq() <= from {
                // Nothing from `from` on was handed to the store (what was finished
                // while in memory never is), and the memory tail starts above it: those
                // sequences hold nothing anywhere, and the page starts at the memory
                // tail. Waiting for them would stall the replica for good.
                let topics = self.topics.borrow();
                let t = topics.get(topic)?;
                return Some(t.records_from(from, max_bytes));
            }
            if tries == 100 {
                return Some((Vec::new(), from));
            }
            tries += 1;
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Sets how long `topic`'s unfinished records wait before they are handed to its
    /// store ([`crate::topic::Topic::set_store_delay`]); nothing when the topic does
    /// not exist.
    pub fn set_store_delay(&self, topic: &str, delay: std::time::Duration) {
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            t.set_store_delay(delay);
        }
    }

    /// Makes `topic` (created if needed) hold what its leader's `state` says
    /// ([`crate::topic::Topic::restore_replica`]): a replica restoring a snapshot.
    pub fn restore_replica(&self, topic: &str, state: ReplicaState) -> Restored {
        let mut topics = self.topics.borrow_mut();
        let t = self.get_or_create_topic(&mut topics, topic);
        let out = t.restore_replica(state, self.opts.mem_queue_size);
        // Handed to the store as a publish's records are (a restored backlog would
        // otherwise stay in memory only until the next publish).
        if t.stored() < t.log.head {
            let cutoff = t.store_cutoff();
            if t.store_pump(cutoff, self.opts.mem_queue_size, false) {
                self.mark_unstored(topic);
            }
        }
        self.mark(t);
        self.dispatch_topic(t);
        out
    }

    /// What to wait on until every record `topic`'s store holds now is synced (`None`:
    /// no such topic, or it has no store).
    pub fn topic_durable_wait(&self, topic: &str) -> Option<super::DurableWait> {
        let topics = self.topics.borrow();
        let st = topics.get(topic)?.store()?;
        Some(super::DurableWait {
            store: st.clone(),
            durable: Some(st.next_seq()),
        })
    }

    /// The sequence `topic`'s next message gets (0: no such topic).
    pub fn topic_head(&self, topic: &str) -> u64 {
        self.topics.borrow().get(topic).map_or(0, |t| t.log.head)
    }

    /// Delivers on every channel of every topic whose delivery is not held: what a
    /// closed [`crate::delivery_gate`] refused meanwhile goes out once it is open again.
    pub fn dispatch_every_topic(&self) {
        let open: Vec<String> = self
            .topics
            .borrow()
            .iter()
            .filter(|(_, t)| !t.deliveries_held)
            .map(|(name, _)| name.clone())
            .collect();
        for topic in open {
            self.hold_topic_deliveries(&topic, false);
        }
    }

    /// Holds (`held`) or releases delivery on every channel of `topic` while this member
    /// hands the topic's leadership over ([`crate::channel::Channel::set_held`]); a
    /// channel made meanwhile starts held, and a release delivers again at once.
    /// Returns the messages the topic's channels hold in flight to their consumers (0:
    /// no such topic).
    pub fn hold_topic_deliveries(&self, topic: &str, held: bool) -> usize {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return 0;
        };
        let now = std::time::Instant::now();
        let mut in_flight = 0;
        let mut out = 0;
        t.deliveries_held = held;
        for ch in t.channels.values_mut() {
            ch.set_held(held);
            if !held {
                out += ch.dispatch(&t.log, now);
                self.schedule_timer(topic, ch);
            }
            in_flight += ch.in_flight_to_consumers();
        }
        if !held {
            self.schedule_disk_reads(t);
        }
        bump(&self.counters.messages_out, out);
        in_flight
    }

    /// The messages the channels of `topic` hold in flight to their consumers (0: no
    /// such topic). Those of a consumer that left wait for their timeout
    /// ([`crate::channel::Channel::in_flight_to_consumers`]), and are not counted.
    pub fn topic_in_flight_to_consumers(&self, topic: &str) -> usize {
        self.topics.borrow().get(topic).map_or(0, |t| {
            t.channels
                .values()
                .map(|c| c.in_flight_to_consumers())
                .sum()
        })
    }

    /// Who holds `topic`'s in-flight messages, for the log: one `channel:address
    /// (user agent) count` per holding client, `gone` after a client that is no longer
    /// one of its channel's consumers.
    pub fn topic_in_flight_holders(&self, topic: &str) -> Vec<String> {
        let topics = self.topics.borrow();
        let Some(t) = topics.get(topic) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, ch) in &t.channels {
            for (client, n, subscribed) in ch.in_flight_holders() {
                out.push(format!(
                    "{name}:{} ({}) {n}{}",
                    client.remote_address(),
                    client.settings().user_agent,
                    if subscribed { "" } else { " gone" }
                ));
            }
        }
        out
    }

    /// Takes every consumer of `topic` out of its channel without closing its
    /// connection (this node no longer leads the topic: the caller serves each one
    /// through the new leader on the same connection), with the channel's name and the
    /// IDs of the messages the consumer held in flight, which are ready again here
    /// ([`crate::channel::Channel::detach_clients`]).
    pub fn detach_topic_consumers(&self, topic: &str) -> Vec<DetachedConsumer> {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, ch) in t.channels.iter_mut() {
            for (client, in_flight) in ch.detach_clients() {
                out.push(DetachedConsumer {
                    client,
                    channel: name.clone(),
                    in_flight,
                });
            }
        }
        out
    }

    /// The consumers subscribed to `topic`'s channels (empty when there is no such
    /// topic).
    pub fn topic_consumers(&self, topic: &str) -> Vec<std::rc::Rc<crate::client::Client>> {
        self.topics.borrow().get(topic).map_or_else(Vec::new, |t| {
            t.channels
                .values()
                .flat_map(|ch| ch.clients().iter().cloned())
                .collect()
        })
    }

    /// The topics this shard owns.
    pub fn topic_names(&self) -> Vec<String> {
        self.topics.borrow().keys().cloned().collect()
    }

    /// The channels of `topic` (empty when there is no such topic).
    pub fn channel_names(&self, topic: &str) -> Vec<String> {
        self.topics
            .borrow()
            .get(topic)
            .map(|t| t.channels.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// A consumer taken out of its channel by [`Shard::detach_topic_consumers`].
pub struct DetachedConsumer {
    /// Its connection's client, subscribed as far as the connection knows.
    pub client: std::rc::Rc<crate::client::Client>,
    /// The channel it had subscribed to.
    pub channel: String,
    /// The messages it held in flight (ready again in the channel).
    pub in_flight: Vec<MessageId>,
}

/// A record read back from a topic's store as a replica restoring a snapshot takes it
/// (the store keeps a DPUB's due time in Unix ns, as the snapshot does).
fn replica_record(r: nsq_storage::StoredRecord) -> ReplicaRecord {
    ReplicaRecord {
        seq: r.seq,
        id: MessageId(r.id),
        timestamp: r.timestamp,
        defer_until_ns: r.defer_until,
        body: r.body,
    }
}
