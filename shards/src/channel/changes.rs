//! The changes to a channel's delivery state since its replicated topic's leader last
//! sent that state to its replicas: what lets a channel holding millions of unfinished
//! messages be replicated by what changed rather than by all of them each round
//! (docs/replication.md, "Channel state").

use super::Channel;
use std::time::Instant;

/// The most changes a channel keeps between two rounds (24 MiB); beyond it the log is
/// dropped and the next round sends the whole state or the low watermark instead.
pub const CHANGES_MAX: usize = 1 << 20;

/// What happened to one message of the channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Finished (FIN, dead-lettered): never delivered again.
    Finished,
    /// Held unfinished with `attempts` deliveries: in flight or ready again (`due`
    /// `None`), or deferred until `due`.
    Pending { attempts: u16, due: Option<Instant> },
}

/// The changes recorded since the log was last taken, oldest first.
#[derive(Debug, Default)]
pub struct ChangeLog {
    changes: Vec<(u64, Change)>,
    /// More than [`CHANGES_MAX`] changes, or a change that touched every message
    /// (`/channel/empty`, a seek): the log no longer says everything.
    overflowed: bool,
}

impl ChangeLog {
    /// Each changed message once, by sequence, with its latest change; `None` when the
    /// log does not hold every change.
    pub fn latest(mut self) -> Option<Vec<(u64, Change)>> {
        if self.overflowed {
            return None;
        }
        // Stable: for equal sequences the latest change stays last.
        self.changes.sort_by_key(|&(seq, _)| seq);
        let mut out: Vec<(u64, Change)> = Vec::with_capacity(self.changes.len());
        for (seq, change) in self.changes {
            match out.last_mut() {
                Some(last) if last.0 == seq => last.1 = change,
                _ => out.push((seq, change)),
            }
        }
        Some(out)
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && !self.overflowed
    }
}

impl Channel {
    /// Starts (`true`, with an empty log) or stops recording changes to the delivery
    /// state (the leader of a replicated topic records them).
    pub fn track_changes(&mut self, on: bool) {
        self.changes = on.then(ChangeLog::default);
    }

    /// True while changes are recorded.
    pub fn tracks_changes(&self) -> bool {
        self.changes.is_some()
    }

    /// The changes since tracking started or this was last called; recording goes on
    /// with an empty log. `None` when changes are not recorded.
    pub fn take_changes(&mut self) -> Option<ChangeLog> {
        self.changes.as_mut().map(std::mem::take)
    }

    /// Records that message `seq` changed (no-op when not tracking).
    pub(super) fn record(&mut self, seq: u64, change: Change) {
        if let Some(log) = self.changes.as_mut() {
            if log.overflowed {
                return;
            }
            if log.changes.len() >= CHANGES_MAX {
                log.changes = Vec::new();
                log.overflowed = true;
                return;
            }
            log.changes.push((seq, change));
        }
    }

    /// Records a message made ready again (a REQ without delay, a timeout, a deferred
    /// one now due): unchanged for a replica when the channel `kept` it, finished when
    /// an `#ephemeral` channel dropped it. A due deferred message's state changes only
    /// here: a replica counts one whose due time passed as ready.
    pub(super) fn record_put_back(&mut self, seq: u64, kept: bool) {
        if kept {
            // Ready again: a replica already holds it unfinished with these attempts
            // (or due at a time now past), so only a dropped one is news.
            return;
        }
        self.record(seq, Change::Finished);
    }

    /// The changes last taken were lost on their way: the log can no longer say
    /// everything since the state the replicas hold.
    pub fn forget_changes(&mut self) {
        self.record_all();
    }

    /// Records that every message may have changed (the log can no longer say what).
    pub(super) fn record_all(&mut self) {
        if let Some(log) = self.changes.as_mut() {
            log.changes = Vec::new();
            log.overflowed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_keeps_each_messages_last_change_in_sequence_order() {
        let mut ch = Channel::new("c", 0);
        ch.record(5, Change::Finished);
        ch.track_changes(true);
        let pending = |attempts| Change::Pending {
            attempts,
            due: None,
        };
        ch.record(9, pending(1));
        ch.record(3, pending(1));
        ch.record(9, Change::Finished);
        ch.record(3, pending(2));
        let latest = ch.take_changes().and_then(ChangeLog::latest);
        assert_eq!(latest, Some(vec![(3, pending(2)), (9, Change::Finished)]));
        assert_eq!(ch.take_changes().map(|l| l.is_empty()), Some(true));
        ch.record_all();
        ch.record(1, Change::Finished);
        assert_eq!(ch.take_changes().and_then(ChangeLog::latest), None);
        ch.track_changes(false);
        ch.record(1, Change::Finished);
        assert!(ch.take_changes().is_none());
    }
}
