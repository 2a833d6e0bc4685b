//! A topic's segments (nsqd: the disk queue's files, one read and one write position;
//! here any number of segments, each with a sparse index by sequence): the list of
//! sealed segments and the one being written, the cached readers of their files, the
//! blocks read from them, and whether a partial index is being written.

use super::blocks::BlockCache;
use super::pending::RecordLen;
use super::segment_io::SegmentFile;
use super::{ReadPos, SegmentInfo, INDEX_EVERY};
use crate::index::SegmentIndex;
use crate::record::SEGMENT_HEADER_LEN;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;

/// One segment file as the store knows it.
pub(super) struct Segment {
    pub(super) path: PathBuf,
    /// The salt its records carry (from its header).
    pub(super) salt: u32,
    /// One past the last sequence written to it.
    pub(super) end_seq: u64,
    /// (sequence, byte offset) of records number 0, INDEX_EVERY, 2 * INDEX_EVERY, ...
    /// (by count, not by sequence: sequences may have gaps).
    pub(super) index: Vec<(u64, u64)>,
    /// Records in the segment.
    pub(super) count: u64,
    /// Records with sequence below this are flushed to the file and readable.
    pub(super) readable_seq: u64,
    /// Bytes below this offset are flushed (they hold the records below
    /// `readable_seq`); readers never decode past it, where the file holds a partly
    /// written stream buffer (or nothing yet). For a segment found on disk at start-up:
    /// where its records end (its side index's data end, or where recovery's scan found
    /// the last whole record).
    pub(super) readable_end: u64,
}

impl Segment {
    /// Adds a record at byte offset `off` to the count and sparse index.
    pub(super) fn note(&mut self, seq: u64, off: u64) {
        if self.count.is_multiple_of(INDEX_EVERY) {
            self.index.push((seq, off));
        }
        self.count += 1;
        self.end_seq = seq + 1;
    }

    /// The side index describing this segment once sealed; `None` when it is empty.
    pub(super) fn sealed_index(&self, base: u64, data_end: u64) -> Option<SegmentIndex> {
        let first = self.index.first()?.0;
        Some(SegmentIndex {
            base,
            salt: self.salt,
            file_len: 0,
            data_end,
            count: self.count,
            first_seq: first,
            last_seq: self.end_seq.checked_sub(1)?,
            entries: self.index.clone(),
        })
    }
}

/// Where a read starts: see [`Segments::locate`].
pub(super) struct Located {
    pub(super) base: u64,
    pub(super) path: PathBuf,
    /// Byte offset in the segment.
    pub(super) start: u64,
    /// The segment's records below this sequence are readable.
    pub(super) readable: u64,
    /// ... and lie below this byte offset (`Segment::readable_end`).
    pub(super) readable_end: u64,
    pub(super) salt: u32,
}

/// The segments of a topic by base sequence (the last one is the segment being
/// written), their open readers and their cached blocks.
pub(super) struct Segments {
    map: RefCell<BTreeMap<u64, Segment>>,
    /// Segment files open for reading, by base.
    readers: RefCell<HashMap<u64, Rc<SegmentFile>>>,
    /// Blocks of segment data read recently, shared by the channels' reads.
    blocks: BlockCache,
    /// A partial index of the open segment is being written.
    partial_busy: Cell<bool>,
    /// Sparse index entry (sequence) -> the message ID of the first record read there,
    /// as [`TopicStore::find_id`](super::TopicStore::find_id) probed them: readable
    /// records never change, so a lookup reads only the probes no earlier one did.
    probe_ids: RefCell<BTreeMap<u64, u64>>,
}

impl Segments {
    /// The store's segments, as recovered (or none).
    pub(super) fn new(map: BTreeMap<u64, Segment>) -> Segments {
        Segments {
            map: RefCell::new(map),
            readers: RefCell::new(HashMap::new()),
            blocks: BlockCache::default(),
            partial_busy: Cell::new(false),
            probe_ids: RefCell::new(BTreeMap::new()),
        }
    }

    /// The ID [`Segments::note_probe_id`] noted for the probe at `seq`.
    pub(super) fn probe_id(&self, seq: u64) -> Option<u64> {
        self.probe_ids.borrow().get(&seq).copied()
    }

    /// Notes the ID of the first record at or after the index entry `seq`; entries
    /// below `oldest` (segments deleted since) are dropped when the notes outnumber
    /// `probes` twice.
    pub(super) fn note_probe_id(&self, seq: u64, id: u64, oldest: u64, probes: usize) {
        let mut ids = self.probe_ids.borrow_mut();
        if ids.len() > 2 * probes + 64 {
            *ids = ids.split_off(&oldest);
        }
        ids.insert(seq, id);
    }

    /// Segments on disk.
    pub(super) fn len(&self) -> usize {
        self.map.borrow().len()
    }

    /// The base of the oldest segment.
    pub(super) fn first_base(&self) -> Option<u64> {
        self.map.borrow().keys().next().copied()
    }

    /// The readable sequence of the newest segment (records below it can be read back).
    pub(super) fn newest_readable_seq(&self) -> Option<u64> {
        self.map
            .borrow()
            .values()
            .next_back()
            .map(|s| s.readable_seq)
    }

    /// True when a segment starts at `base`.
    pub(super) fn contains(&self, base: u64) -> bool {
        self.map.borrow().contains_key(&base)
    }

    /// A new, empty segment at `base` in `path`, written with `salt` (any blocks cached
    /// for an earlier segment at that base are forgotten).
    pub(super) fn start(&self, base: u64, path: PathBuf, salt: u32) {
        self.blocks.forget(base);
        self.map.borrow_mut().insert(
            base,
            Segment {
                path,
                salt,
                end_seq: base,
                index: Vec::new(),
                count: 0,
                readable_seq: base,
                readable_end: SEGMENT_HEADER_LEN as u64,
            },
        );
    }

    /// Adds records about to be written at byte offset `pos` of the segment at `base` to
    /// its count and sparse index (sequences may have gaps: indexed by count, not by
    /// value).
    pub(super) fn note_records(&self, base: u64, pos: u64, recs: &[RecordLen]) {
        if let Some(seg) = self.map.borrow_mut().get_mut(&base) {
            let mut off = pos;
            for &(seq, len) in recs {
                seg.note(seq, off);
                off += len as u64;
            }
        }
    }

    /// Takes back from the segment's count and sparse index the `n` records from
    /// sequence `first` on, noted before a write that failed.
    pub(super) fn unnote_records(&self, base: u64, first: u64, n: u64) {
        if let Some(seg) = self.map.borrow_mut().get_mut(&base) {
            seg.count = seg.count.saturating_sub(n);
            seg.index.retain(|&(seq, _)| seq < first);
            seg.end_seq = first.max(base);
        }
    }

    /// The records of the segment at `base` below sequence `seq`, which lie below byte
    /// `end`, are flushed: readable.
    pub(super) fn mark_readable(&self, base: u64, seq: u64, end: u64) {
        if let Some(s) = self.map.borrow_mut().get_mut(&base) {
            s.readable_seq = s.readable_seq.max(seq);
            s.readable_end = s.readable_end.max(end);
        }
    }

    /// True when the segment at `base` holds no record (or is gone).
    pub(super) fn is_empty_at(&self, base: u64) -> bool {
        self.map.borrow().get(&base).is_none_or(|s| s.count == 0)
    }

    /// Removes the segment at `base` (and its cached blocks); returns its path.
    pub(super) fn remove(&self, base: u64) -> Option<PathBuf> {
        let seg = self.map.borrow_mut().remove(&base);
        self.blocks.forget(base);
        seg.map(|s| s.path)
    }

    /// The side index of the segment at `base` sealed at `data_end`; `None` when it is
    /// gone or empty.
    pub(super) fn sealed_index(&self, base: u64, data_end: u64) -> Option<SegmentIndex> {
        self.map
            .borrow()
            .get(&base)
            .and_then(|s| s.sealed_index(base, data_end))
    }

    /// The segment a read at `seq` starts in and the byte offset to start at: the
    /// segment holding `seq` if it is readable there, else the next one with readable
    /// records; the offset is `hint`'s when it is for `seq` in that segment, else the
    /// sparse index entry at or below `seq`.
    pub(super) fn locate(&self, seq: u64, hint: Option<ReadPos>) -> Option<Located> {
        let segs = self.map.borrow();
        segs.range(..=seq)
            .next_back()
            .filter(|(_, s)| seq < s.readable_seq)
            .or_else(|| {
                segs.range(seq..).next().filter(|(_, s)| {
                    s.readable_seq > *s.index.first().map(|(q, _)| q).unwrap_or(&u64::MAX)
                })
            })
            .map(|(b, s)| {
                let hinted = hint
                    .filter(|h| h.base == *b && h.seq == seq)
                    .map(|h| h.offset);
                let start = hinted.unwrap_or_else(|| {
                    s.index
                        .iter()
                        .rev()
                        .find(|(q, _)| *q <= seq)
                        .map(|(_, o)| *o)
                        .unwrap_or(SEGMENT_HEADER_LEN as u64)
                });
                Located {
                    base: *b,
                    path: s.path.clone(),
                    start,
                    readable: s.readable_seq,
                    readable_end: s.readable_end,
                    salt: s.salt,
                }
            })
    }

    /// The base of the first segment after sequence `seq`.
    pub(super) fn next_base_after(&self, seq: u64) -> Option<u64> {
        self.map.borrow().range(seq + 1..).next().map(|(b, _)| *b)
    }

    /// Takes out every segment but the newest whose records all lie below `seq`
    /// (retention), with its reader and cached blocks; returns their bases and paths,
    /// for the files to be deleted.
    pub(super) fn take_passed(&self, seq: u64) -> Vec<(u64, PathBuf)> {
        let victims: Vec<(u64, PathBuf)> = {
            let segs = self.map.borrow();
            let last = segs.keys().next_back().copied();
            segs.iter()
                .filter(|(b, s)| Some(**b) != last && s.end_seq <= seq)
                .map(|(b, s)| (*b, s.path.clone()))
                .collect()
        };
        for (b, _) in &victims {
            self.map.borrow_mut().remove(b);
            self.readers.borrow_mut().remove(b);
            self.blocks.forget(*b);
        }
        victims
    }

    /// Forgets every segment and reader (the topic is deleted).
    pub(super) fn clear(&self) {
        self.readers.borrow_mut().clear();
        self.map.borrow_mut().clear();
    }

    /// `f` of each segment (base, its report without a size, its path), oldest first.
    pub(super) fn each<T>(&self, mut f: impl FnMut(SegmentInfo, &std::path::Path) -> T) -> Vec<T> {
        self.map
            .borrow()
            .iter()
            .map(|(b, s)| {
                let info = SegmentInfo {
                    base: *b,
                    end_seq: s.end_seq,
                    readable_seq: s.readable_seq,
                    bytes: 0,
                };
                f(info, &s.path)
            })
            .collect()
    }

    /// The sequences of the sparse index entries of every segment that are readable,
    /// in order (where a timestamp seek probes).
    pub(super) fn readable_index_seqs(&self) -> Vec<u64> {
        self.map
            .borrow()
            .values()
            .flat_map(|s| {
                let readable = s.readable_seq;
                s.index
                    .iter()
                    .map(|(q, _)| *q)
                    .filter(move |q| *q < readable)
            })
            .collect()
    }

    /// The open reader of the segment at `base`, if cached.
    pub(super) fn reader(&self, base: u64) -> Option<Rc<SegmentFile>> {
        self.readers.borrow().get(&base).cloned()
    }

    /// Caches the open reader of the segment at `base`.
    pub(super) fn keep_reader(&self, base: u64, f: Rc<SegmentFile>) {
        self.readers.borrow_mut().insert(base, f);
    }

    /// True when readers are cached (descriptors held).
    pub(super) fn holds_readers(&self) -> bool {
        !self.readers.borrow().is_empty()
    }

    /// Drops the cached readers and blocks (an idle store gives its descriptors and
    /// memory back).
    pub(super) fn release_readers(&self) {
        self.readers.borrow_mut().clear();
        self.blocks.clear();
    }

    /// The blocks read recently, shared by the channels' reads.
    pub(super) fn blocks(&self) -> &BlockCache {
        &self.blocks
    }

    /// True while a partial index of the open segment is being written.
    pub(super) fn partial_busy(&self) -> bool {
        self.partial_busy.get()
    }

    /// A partial index is being written (`true`) or is done (`false`).
    pub(super) fn set_partial_busy(&self, busy: bool) {
        self.partial_busy.set(busy);
    }

    /// The path and readable end of the segment at `base` (tests).
    #[cfg(test)]
    pub(super) fn path_and_readable_end(&self, base: u64) -> Option<(PathBuf, u64)> {
        self.map
            .borrow()
            .get(&base)
            .map(|s| (s.path.clone(), s.readable_end))
    }
}
