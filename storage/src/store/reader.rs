//! Reads by sequence from flushed segment data (nsqd: diskqueue.go readOne, which reads
//! the next message at one read position; here any channel reads from any sequence
//! through the segments' sparse indexes).

use super::blocks::BLOCK;
use super::segment_io::SegmentFile;
use super::segments::Located;
use super::{io_err, ReadPos, TopicStore, INDEX_EVERY};
use crate::error::StoreError;
use crate::record::{self, StoredRecord};
use bytes::Bytes;
use std::path::Path;
use std::rc::Rc;

impl TopicStore {
    /// Reads up to `max` records with sequence >= `from`, only from data already flushed
    /// to disk, following sequence order across segments. Corrupt records are skipped.
    pub async fn read(&self, from: u64, max: usize) -> Result<Vec<StoredRecord>, StoreError> {
        self.read_at(from, max, usize::MAX, None)
            .await
            .map(|(recs, _)| recs)
    }

    /// Like [`read`](Self::read), stopping once `max_bytes` of bodies were read (at least
    /// one record), and starting at `hint` when it is the position a previous read
    /// ended at for `from` (a sequential reader then never re-reads from the sparse
    /// index). Returns the records and the position after the last one.
    pub async fn read_at(
        &self,
        from: u64,
        max: usize,
        max_bytes: usize,
        hint: Option<ReadPos>,
    ) -> Result<(Vec<StoredRecord>, Option<ReadPos>), StoreError> {
        let mut batch = Batch {
            out: Vec::new(),
            bytes: 0,
            end_pos: None,
            seq: from,
            max,
            max_bytes,
        };
        while !batch.full() {
            let hint = (batch.seq == from).then_some(hint).flatten();
            let Some(loc) = self.segments.locate(batch.seq, hint) else {
                break;
            };
            let file = self.reader(loc.base, &loc.path).await?;
            if !batch.read_segment(self, &file, loc).await? {
                // Nothing readable at `seq` in this segment: move to the next one.
                let seq = batch.seq;
                match self.segments.next_base_after(seq) {
                    Some(b) if b > seq => batch.seq = b,
                    _ => break,
                }
            }
        }
        Ok((batch.out, batch.end_pos))
    }

    /// The open reader of the segment at `base` (file `path`): the cached one, else the
    /// file opened through the directory descriptor and cached.
    ///
    /// Errors: `topic deleted`, or the open's error naming the file.
    pub(super) async fn reader(
        &self,
        base: u64,
        path: &Path,
    ) -> Result<Rc<SegmentFile>, StoreError> {
        if let Some(f) = self.segments.reader(base) {
            return Ok(f);
        }
        if self.dir.is_deleted() {
            return Err(StoreError::topic_deleted());
        }
        let fd_path = self.dir.fd_path(path)?;
        self.dir.begin_open();
        let f = match crate::faults::check(crate::faults::Op::Open).await {
            Ok(()) => SegmentFile::open(&fd_path, self.cfg.io)
                .await
                .map_err(|e| io_err(e).context(format_args!("open {}", path.display()))),
            Err(e) => Err(io_err(e)),
        };
        self.dir.end_open();
        let f = Rc::new(f?);
        self.segments.keep_reader(base, f.clone());
        Ok(f)
    }
}

/// The data of the segment at `base` from `off` to the end of its block (a
/// [`BLOCK`]-aligned unit, from the topic's [`BlockCache`](super::blocks::BlockCache)
/// when the block lies within the flushed data below `readable_end`), joined with the
/// next blocks while the first record does not fit, so at least one whole record is
/// there. Returns the data and the size asked for (the data is shorter at the end of
/// the file).
async fn read_window(
    store: &TopicStore,
    file: &SegmentFile,
    base: u64,
    off: u64,
    readable_end: u64,
) -> Result<(Bytes, usize), StoreError> {
    let mut block_off = off - off % BLOCK;
    let first = read_block(store, file, base, block_off, readable_end).await?;
    let start = (off - block_off) as usize;
    let mut want = (BLOCK - (off - block_off)) as usize;
    let mut data = if start < first.len() {
        first.slice(start..)
    } else {
        Bytes::new()
    };
    while data.len() == want {
        let whole = data.len() >= 8 && {
            let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
            len + 8 <= data.len() || len > record::MAX_BODY + 64
        };
        if whole {
            break;
        }
        block_off += BLOCK;
        let next = read_block(store, file, base, block_off, readable_end).await?;
        let mut joined = Vec::with_capacity(data.len() + next.len());
        joined.extend_from_slice(&data);
        joined.extend_from_slice(&next);
        data = Bytes::from(joined);
        want += BLOCK as usize;
    }
    Ok((data, want))
}

/// The block at `block_off` of the segment at `base`: shared through the topic's block
/// cache when it lies wholly below `readable_end` (flushed, so it never changes), else
/// read for this call alone.
async fn read_block(
    store: &TopicStore,
    file: &SegmentFile,
    base: u64,
    block_off: u64,
    readable_end: u64,
) -> Result<Bytes, StoreError> {
    let read = || async {
        crate::faults::check(crate::faults::Op::Read).await?;
        file.read_at(block_off, BLOCK as usize).await
    };
    if block_off + BLOCK <= readable_end {
        store
            .segments
            .blocks()
            .block((base, block_off), read)
            .await
            .map_err(io_err)
    } else {
        read().await.map_err(io_err)
    }
}

impl TopicStore {
    /// (blocks read from the disk, blocks served from memory) by this topic's reads so
    /// far: the second count is what channels reading the same region shared.
    pub fn block_reads(&self) -> (u64, u64) {
        self.segments.blocks().counts()
    }
}

/// A read in progress: what it collected and where it stands.
struct Batch {
    out: Vec<StoredRecord>,
    /// Bytes of the bodies in `out`.
    bytes: usize,
    /// The position after the last record in `out`.
    end_pos: Option<ReadPos>,
    /// The next sequence wanted.
    seq: u64,
    max: usize,
    max_bytes: usize,
}

impl Batch {
    /// True once it holds `max` records or `max_bytes` of bodies.
    fn full(&self) -> bool {
        self.out.len() >= self.max || self.bytes >= self.max_bytes
    }

    /// Reads records from `seq` on in the segment at `loc`, window by window, until the
    /// batch is full or the segment's readable records end. False when it found no
    /// record at or after `seq` there.
    async fn read_segment(
        &mut self,
        store: &TopicStore,
        file: &SegmentFile,
        loc: Located,
    ) -> Result<bool, StoreError> {
        let Located {
            base,
            path,
            start: mut off,
            readable,
            readable_end,
            salt,
        } = loc;
        let mut last: Option<u64> = None;
        let mut progressed = false;
        'window: loop {
            let (mut data, want) = read_window(store, file, base, off, readable_end).await?;
            // Past the flushed bytes of the segment being written the file holds a
            // partly written buffer: decoding it would report torn records that are
            // not (they are whole in the writer's memory). Cut there; the shorter
            // window then ends this read as the end of the file would.
            let flushed = readable_end.saturating_sub(off);
            if (data.len() as u64) > flushed {
                data.truncate(flushed as usize);
            }
            if data.is_empty() {
                break;
            }
            // Decode only about what is asked for (plus the records below `seq` a
            // window started from the sparse index holds); what is left of the
            // window is read again by the next call, at the position returned.
            let limit = (self.max - self.out.len()).saturating_add(INDEX_EVERY as usize);
            let (recs, skipped, stop) = record::scan_up_to(&data, 0, salt, last, limit);
            if let Some((r, _)) = recs.last() {
                last = Some(r.seq);
            }
            for s in skipped {
                log::error!(
                    "STORE: {} offset {}: {}; record skipped",
                    path.display(),
                    off + s.offset as u64,
                    s.reason
                );
            }
            for (r, at) in recs {
                if r.seq >= readable {
                    break 'window;
                }
                if r.seq < self.seq {
                    continue;
                }
                self.seq = r.seq + 1;
                progressed = true;
                self.bytes += r.body.len();
                self.end_pos = Some(ReadPos {
                    base,
                    offset: off + (at + record::RECORD_OVERHEAD + r.body.len()) as u64,
                    seq: self.seq,
                });
                self.out.push(r);
                if self.full() {
                    break 'window;
                }
            }
            if stop == 0 || stop < data.len() && data.len() < want {
                break;
            }
            off += stop as u64;
            if self.seq >= readable {
                break;
            }
        }
        Ok(progressed)
    }
}
