//! The pending buffer (nsqd: the disk queue's writeChan, here a buffer of encoded
//! records): records appended and acknowledged but not yet written to a segment, double
//! buffered so publishers encode into one half while the writer writes the other, and
//! the publishers waiting for it to drain (backpressure).
//!
//! Nothing appended is dropped for room: a batch whose write failed goes back in front
//! ([`Pending::requeue_front`]), and the store refuses new publishes instead once
//! [`super::UNWRITTEN_MAX`] bytes wait ([`super::TopicStore::admit`]), so a refused
//! publish never takes room from an acknowledged one.

use super::{SPARE_KEEP, SPARE_MAX};
use crate::record::{self, StoredRecord};
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};

/// (sequence, encoded length in bytes) of a record in a batch.
pub(super) type RecordLen = (u64, u32);

/// Records appended and not yet written, and the next sequence to append.
pub(super) struct Pending {
    /// Encoded records, in sequence order.
    buf: RefCell<Vec<u8>>,
    /// (sequence, encoded length) of each record in `buf`.
    recs: RefCell<Vec<RecordLen>>,
    /// Bytes of the batch the writer task has taken and is writing (or about to put
    /// back after a failure): still unwritten, so counted by [`Pending::unwritten`].
    in_write: Cell<usize>,
    /// The other half of the double buffer (empty, with its capacity kept).
    spare: RefCell<Vec<u8>>,
    spare_recs: RefCell<Vec<RecordLen>>,
    /// Next sequence to append.
    next_seq: Cell<u64>,
    /// Publishers waiting for the buffer to drain (backpressure).
    drain_waiters: RefCell<Vec<oneshot::Sender<()>>>,
}

impl Pending {
    /// An empty buffer whose next record has sequence `next_seq` or later.
    pub(super) fn new(next_seq: u64) -> Pending {
        Pending {
            buf: RefCell::new(Vec::new()),
            recs: RefCell::new(Vec::new()),
            in_write: Cell::new(0),
            spare: RefCell::new(Vec::new()),
            spare_recs: RefCell::new(Vec::new()),
            next_seq: Cell::new(next_seq),
            drain_waiters: RefCell::new(Vec::new()),
        }
    }

    /// The next sequence to append.
    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq.get()
    }

    /// Encodes `rec` (with the writer's `salt`) at the end of the buffer.
    #[inline]
    pub(super) fn append(&self, rec: &StoredRecord, salt: u32) {
        debug_assert!(rec.seq >= self.next_seq.get());
        let len = record::encode(rec, salt, &mut self.buf.borrow_mut());
        self.recs.borrow_mut().push((rec.seq, len as u32));
        self.next_seq.set(rec.seq + 1);
    }

    /// The record whose message ID is `id` among those waiting in the buffer (not the
    /// batch being written), decoded from its bytes: a linear scan reading 8 bytes per
    /// record (`GET /message` for a record acknowledged and not yet written).
    pub(super) fn find_id(&self, id: u64, salt: u32) -> Option<StoredRecord> {
        let buf = self.buf.borrow();
        let mut at = 0usize;
        for &(_, len) in self.recs.borrow().iter() {
            let len = len as usize;
            // The ID sits after the length, CRC, kind, salt, sequence, timestamp and
            // due time (record::encode).
            let id_at = at + 8 + 29;
            let rec_id = buf
                .get(id_at..id_at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes);
            if rec_id == Some(id) {
                let bytes = bytes::Bytes::copy_from_slice(buf.get(at..at + len)?);
                return match record::decode(&bytes, 0, salt) {
                    record::Decoded::Record(r, _) => Some(r),
                    _ => None,
                };
            }
            at += len;
        }
        None
    }

    /// Moves the next sequence to at least `seq`; true when it moved.
    pub(super) fn advance_to(&self, seq: u64) -> bool {
        if seq > self.next_seq.get() {
            self.next_seq.set(seq);
            return true;
        }
        false
    }

    /// Bytes in the buffer (not counting the batch being written).
    pub(super) fn len(&self) -> usize {
        self.buf.borrow().len()
    }

    /// True when the buffer holds no record.
    pub(super) fn is_empty(&self) -> bool {
        self.buf.borrow().is_empty()
    }

    /// Bytes not yet written to a segment: the buffer and the batch being written.
    pub(super) fn unwritten(&self) -> usize {
        self.buf.borrow().len() + self.in_write.get()
    }

    /// Drops the records below `seq` from the buffer (the batch being written is left
    /// alone) and returns how many.
    pub(super) fn forget_below(&self, seq: u64) -> usize {
        let mut recs = self.recs.borrow_mut();
        let n = recs.partition_point(|&(s, _)| s < seq);
        if n == 0 {
            return 0;
        }
        let bytes: usize = recs[..n].iter().map(|&(_, len)| len as usize).sum();
        recs.drain(..n);
        self.buf.borrow_mut().drain(..bytes);
        n
    }

    /// Takes the whole buffer as the next batch, leaving the spare half (which keeps its
    /// capacity, so publishers encode without reallocation or page faults) in its place.
    pub(super) fn take_batch(&self) -> (Vec<u8>, Vec<RecordLen>) {
        let mut buf = std::mem::take(&mut *self.spare.borrow_mut());
        std::mem::swap(&mut buf, &mut *self.buf.borrow_mut());
        let mut recs = std::mem::take(&mut *self.spare_recs.borrow_mut());
        std::mem::swap(&mut recs, &mut *self.recs.borrow_mut());
        (buf, recs)
    }

    /// The writer is writing a batch of `bytes` (0: done with it).
    pub(super) fn set_in_write(&self, bytes: usize) {
        self.in_write.set(bytes);
    }

    /// Keeps a written batch's buffers as the spare half, emptied: unless it outgrew
    /// [`SPARE_MAX`], or grew past [`SPARE_KEEP`] for a burst that is over (the batch
    /// filled less than a quarter of it), which is freed and counted for the heap trim.
    pub(super) fn recycle(&self, mut buf: Vec<u8>, mut recs: Vec<RecordLen>) {
        let burst_over = buf.capacity() > SPARE_KEEP && buf.len() * 4 < buf.capacity();
        if burst_over {
            crate::buffer_freed(
                buf.capacity() + recs.capacity() * std::mem::size_of::<RecordLen>(),
            );
        } else if buf.capacity() <= SPARE_MAX {
            buf.clear();
            recs.clear();
            *self.spare.borrow_mut() = buf;
            *self.spare_recs.borrow_mut() = recs;
        }
    }

    /// Puts records that could not be written (`buf`, `recs`) back in front of the
    /// buffer, to go with the next batch.
    pub(super) fn requeue_front(&self, buf: &[u8], recs: &[RecordLen]) {
        let mut pending = self.buf.borrow_mut();
        let mut b = Vec::with_capacity(buf.len() + pending.len());
        b.extend_from_slice(buf);
        b.extend_from_slice(&pending);
        *pending = b;
        let mut pr = self.recs.borrow_mut();
        let mut r = Vec::with_capacity(recs.len() + pr.len());
        r.extend_from_slice(recs);
        r.extend_from_slice(&pr);
        *pr = r;
    }

    /// A receiver told when the writer next takes the buffer (or stops).
    pub(super) fn drain_waiter(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.drain_waiters.borrow_mut().push(tx);
        rx
    }

    /// Tells the publishers waiting for the buffer to drain.
    pub(super) fn release_drain_waiters(&self) {
        for w in self.drain_waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
    }
}
