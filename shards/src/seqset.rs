//! A set of log sequences kept as disjoint ranges: a burst of consecutive sequences (a
//! million DPUBs in a row, each stepped over by a channel's cursor) costs one entry, not
//! one per sequence.

use std::collections::BTreeMap;

/// Sequences as disjoint, non-adjacent half-open ranges `[start, end)`, keyed by start.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SeqSet {
    ranges: BTreeMap<u64, u64>,
    len: u64,
}

impl SeqSet {
    pub fn new() -> SeqSet {
        SeqSet::default()
    }

    /// How many sequences the set holds.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The range holding `seq`, if any.
    fn range_of(&self, seq: u64) -> Option<(u64, u64)> {
        let (&s, &e) = self.ranges.range(..=seq).next_back()?;
        (seq < e).then_some((s, e))
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.range_of(seq).is_some()
    }

    /// Adds `seq`; returns false when it was there already.
    pub fn insert(&mut self, seq: u64) -> bool {
        // Sequences mostly come in order: one past the last range extends it.
        if let Some(mut last) = self.ranges.last_entry() {
            if *last.get() == seq {
                *last.get_mut() = seq + 1;
                self.len += 1;
                return true;
            }
        }
        if self.contains(seq) {
            return false;
        }
        let end = seq.saturating_add(1);
        // Joins the range ending at `seq` and the one starting at `seq + 1`.
        let before = self
            .ranges
            .range(..seq)
            .next_back()
            .filter(|&(_, &e)| e == seq)
            .map(|(&s, _)| s);
        let after = self.ranges.remove(&end);
        let start = before.unwrap_or(seq);
        self.ranges.insert(start, after.unwrap_or(end));
        self.len += 1;
        true
    }

    /// Removes `seq`; returns whether it was there.
    pub fn remove(&mut self, seq: u64) -> bool {
        let Some((s, e)) = self.range_of(seq) else {
            return false;
        };
        self.ranges.remove(&s);
        if s < seq {
            self.ranges.insert(s, seq);
        }
        if seq + 1 < e {
            self.ranges.insert(seq + 1, e);
        }
        self.len -= 1;
        true
    }

    /// Keeps only the sequences at or above `at`.
    pub fn retain_from(&mut self, at: u64) {
        let mut high = self.ranges.split_off(&at);
        if let Some((_, &e)) = self.ranges.iter().next_back() {
            if e > at {
                high.insert(at, e);
            }
        }
        self.ranges = high;
        self.len = self.ranges.iter().map(|(s, e)| e - s).sum();
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
        self.len = 0;
    }

    /// The lowest sequence in the set.
    pub fn first(&self) -> Option<u64> {
        self.ranges.first_key_value().map(|(&s, _)| s)
    }

    /// The first sequence at or above `from` that is not in the set.
    pub fn next_absent(&self, from: u64) -> u64 {
        self.range_of(from).map_or(from, |(_, e)| e)
    }

    /// The sequences at or above `from`, in order.
    pub fn iter_from(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        let first = self.range_of(from).map_or(from, |(s, _)| s);
        self.ranges
            .range(first..)
            .flat_map(move |(&s, &e)| s.max(from)..e)
    }
}

impl Extend<u64> for SeqSet {
    fn extend<I: IntoIterator<Item = u64>>(&mut self, iter: I) {
        for s in iter {
            self.insert(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn consecutive_sequences_share_one_range() {
        let mut s = SeqSet::new();
        for q in 10..1010 {
            assert!(s.insert(q));
        }
        assert!(!s.insert(500));
        assert_eq!((s.len(), s.ranges.len()), (1000, 1));
        assert!(s.remove(10) && !s.remove(10));
        assert_eq!((s.len(), s.ranges.len()), (999, 1));
        assert!(s.remove(500));
        assert_eq!((s.len(), s.ranges.len()), (998, 2));
        assert!(s.insert(500));
        assert_eq!((s.len(), s.ranges.len()), (999, 1), "joined again");
    }

    #[test]
    fn behaves_as_a_set_of_sequences() {
        // Random inserts, removes and cuts against a BTreeSet.
        let mut a = SeqSet::new();
        let mut b = BTreeSet::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let q = x % 300;
            match x % 7 {
                0..=3 => assert_eq!(a.insert(q), b.insert(q)),
                4..=5 => assert_eq!(a.remove(q), b.remove(&q)),
                _ if i % 50 == 0 => {
                    a.retain_from(q);
                    b = b.split_off(&q);
                }
                _ => assert_eq!(a.contains(q), b.contains(&q)),
            }
            assert_eq!(a.len(), b.len() as u64);
        }
        let from = 120;
        assert_eq!(
            a.iter_from(from).collect::<Vec<_>>(),
            b.range(from..).copied().collect::<Vec<_>>()
        );
    }
}
