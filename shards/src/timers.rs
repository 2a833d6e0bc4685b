//! The shard's timer queue: which channels have an in-flight timeout or a deferred
//! message coming due, keyed by the earliest due instant (nsqd: nsqd.go queueScanLoop,
//! which every 100 ms samples channels at random and scans their in-flight and deferred
//! priority queues).
//!
//! nsqd's scan costs time in proportion to the number of channels, idle or not. Here a
//! channel is in the queue only while it has a timer, and the shard's timer loop visits
//! only the channels whose earliest timer is due, so 10,000 idle channels cost nothing.
//!
//! The queue is lazy: a channel is pushed again whenever its earliest timer moves earlier
//! than the instant it is registered at ([`crate::channel::Channel::timer_to_schedule`]),
//! and the entries that became stale (the message was finished, the channel deleted)
//! are simply found to have nothing due when they pop. Visiting a channel early is
//! harmless: its own heaps say what is due.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// A min-heap of (due instant, key). `K` names a channel (the shard uses
/// `(topic, channel)`).
pub struct TimerQueue<K: Ord> {
    heap: BinaryHeap<Reverse<(Instant, K)>>,
}

impl<K: Ord> Default for TimerQueue<K> {
    fn default() -> Self {
        TimerQueue {
            heap: BinaryHeap::new(),
        }
    }
}

impl<K: Ord + Clone> TimerQueue<K> {
    /// Registers `key` as due at `due`. A key may be registered several times; each
    /// registration pops once.
    pub fn push(&mut self, due: Instant, key: K) {
        self.heap.push(Reverse((due, key)));
    }

    /// The earliest registered due instant, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((d, _))| *d)
    }

    /// Removes every registration due at or before `now` and returns their keys, earliest
    /// first, each key once.
    pub fn pop_due(&mut self, now: Instant) -> Vec<K> {
        let mut out: Vec<K> = Vec::new();
        while self.heap.peek().is_some_and(|Reverse((d, _))| *d <= now) {
            let Some(Reverse((_, k))) = self.heap.pop() else {
                break;
            };
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    /// Registrations held (stale ones included).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn pops_what_is_due_in_order_once_per_key() {
        let t0 = Instant::now();
        let mut q = TimerQueue::default();
        assert_eq!(q.next_due(), None);
        q.push(t0 + ms(30), "c");
        q.push(t0 + ms(10), "a");
        q.push(t0 + ms(20), "b");
        q.push(t0 + ms(25), "a");
        assert_eq!(q.next_due(), Some(t0 + ms(10)));
        assert!(q.pop_due(t0 + ms(9)).is_empty());
        assert_eq!(q.pop_due(t0 + ms(25)), vec!["a", "b"]);
        assert_eq!(q.next_due(), Some(t0 + ms(30)));
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop_due(t0 + ms(100)), vec!["c"]);
        assert!(q.is_empty());
        assert_eq!(q.next_due(), None);
    }
}
