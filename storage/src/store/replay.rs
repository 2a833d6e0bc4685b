//! Replay support (beyond nsqd): listing a topic's segments with their sizes (retention
//! by size and the retained range in `/stats`) and finding the first record published at
//! or after a time (`POST /channel/seek`). Only reads; kept apart from the write path.

use super::TopicStore;
use crate::error::StoreError;
use crate::record::StoredRecord;

/// One segment file as [`TopicStore::segment_list`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Sequence of its first record (also in its file name).
    pub base: u64,
    /// One past the last sequence written to it.
    pub end_seq: u64,
    /// Records below this sequence are flushed and readable.
    pub readable_seq: u64,
    /// Size of the file in bytes (0 when it cannot be stat'ed).
    pub bytes: u64,
}

/// Records read per step while scanning for a timestamp.
const SEEK_BATCH: usize = 512;

impl TopicStore {
    /// Every segment, oldest first; the last one is the segment being written. Sizes come
    /// from one `stat` per file (run off the executor thread).
    pub async fn segment_list(&self) -> Vec<SegmentInfo> {
        let segs: Vec<(SegmentInfo, Option<super::descriptors::FdPath>)> = self
            .segments
            .each(|info, path| (info, self.dir.fd_path(path).ok()));
        glommio::executor()
            .spawn_blocking(move || {
                segs.into_iter()
                    .map(|(mut info, p)| {
                        info.bytes = p
                            .and_then(|p| std::fs::metadata(&p).ok())
                            .map_or(0, |m| m.len());
                        info
                    })
                    .collect()
            })
            .await
    }

    /// The sequence of the oldest record on disk (the first segment's base), if any.
    pub fn first_seq(&self) -> Option<u64> {
        self.segments.first_base()
    }

    /// The sequence of the first readable record whose timestamp (Unix ns, the publish
    /// time) is at or after `ts_ns`; `None` when every readable record is older (or none
    /// is readable). Records are in publish order, so timestamps only grow with the
    /// sequence (barring a wall clock stepped back): a binary search over the sparse
    /// index entries of every segment (one small read per probe) finds the last entry
    /// published before `ts_ns`, then at most about [`super::INDEX_EVERY`] records are
    /// scanned. Corrupt records are skipped as by [`TopicStore::read`]; errors are I/O
    /// errors of the read.
    pub async fn seek_timestamp(&self, ts_ns: i64) -> Result<Option<u64>, StoreError> {
        let probes = self.segments.readable_index_seqs();
        if probes.is_empty() {
            return Ok(None);
        }
        let lo = probes_before(&probes, async |p| {
            let first = self.read(p, 1).await?;
            Ok(first.first().is_some_and(|r| r.timestamp < ts_ns))
        })
        .await?;
        // Scan from the last probe that starts older (or from the first probe).
        let mut from = probes[lo.saturating_sub(1)];
        loop {
            let recs = self.read(from, SEEK_BATCH).await?;
            let Some(last) = recs.last() else {
                return Ok(None);
            };
            if let Some(r) = recs.iter().find(|r| r.timestamp >= ts_ns) {
                return Ok(Some(r.seq));
            }
            from = last.seq + 1;
        }
    }
}

impl TopicStore {
    /// The readable record whose message ID is `id`, if any (`GET /message`, beyond
    /// nsqd). A topic's IDs grow with its sequence (the broker's ID generator never goes
    /// back, also across restarts), so this is a binary search over the sparse index
    /// entries of every segment by the ID of the record each starts at (one read per
    /// probe, each probe's ID kept for later lookups), then a scan of at most about
    /// [`super::INDEX_EVERY`] records.
    /// Records acknowledged and still waiting in the pending buffer are searched first.
    /// `Ok(None)`: no readable record has that ID (never written, deleted by retention
    /// or by consumption, or in the batch being written at that moment). Errors: I/O errors of the reads.
    pub async fn find_id(&self, id: u64) -> Result<Option<StoredRecord>, StoreError> {
        if let Some(r) = self.pending.find_id(id, self.salt) {
            return Ok(Some(r));
        }
        let probes = self.segments.readable_index_seqs();
        if probes.is_empty() {
            return Ok(None);
        }
        let (first_probe, probe_count) = (probes[0], probes.len());
        let lo = probes_before(&probes, async |p| {
            let probe_id = match self.segments.probe_id(p) {
                Some(pid) => Some(pid),
                None => {
                    let first = self.read(p, 1).await?.first().map(|r| r.id);
                    if let Some(pid) = first {
                        self.segments
                            .note_probe_id(p, pid, first_probe, probe_count);
                    }
                    first
                }
            };
            Ok(probe_id.is_some_and(|pid| pid <= id))
        })
        .await?;
        if lo == 0 {
            return Ok(None);
        }
        // Scan from the last probe whose first ID is at most `id`, up to the next one.
        let end = probes.get(lo).copied().unwrap_or(u64::MAX);
        let mut from = probes[lo - 1];
        while from < end {
            let recs = self.read(from, SEEK_BATCH).await?;
            let Some(last) = recs.last() else {
                return Ok(None);
            };
            for r in recs.iter().take_while(|r| r.seq < end) {
                if r.id == id {
                    return Ok(Some(r.clone()));
                }
                if r.id > id {
                    return Ok(None);
                }
            }
            from = last.seq + 1;
        }
        Ok(None)
    }
}

/// How many of `probes` (sequences where sparse index entries start, ascending) come
/// before the first one for which `before` is false, by binary search: `before` must
/// hold for a prefix of them (a key of their first records that grows with the
/// sequence: the publish time, the message ID), one call per probe looked at.
async fn probes_before(
    probes: &[u64],
    mut before: impl AsyncFnMut(u64) -> Result<bool, StoreError>,
) -> Result<usize, StoreError> {
    let (mut lo, mut hi) = (0usize, probes.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(probes[mid]).await? {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}
