//! The store's writer task (nsqd: diskqueue.go ioLoop's write side, writeOne and
//! sync): takes the pending buffer of appended records in batches (group commit),
//! writes them through a `DmaStreamWriter` (or, on FUSE and network filesystems, on the
//! shard's blocking thread: [`super::segment_io`]), rotates segments at `max_bytes_per_file`
//! and syncs by `--sync-every` / `--sync-timeout` or when a publisher waits.

use super::checkpoint::{seal_closed, write_partial};
use super::descriptors::{pressed, pressure_changed, writer_slot, IDLE_RELEASE, PRESSED_RELEASE};
use super::durability::Unsynced;
use super::pending::RecordLen;
use super::retention::delete_covered_journals;
use super::segment_io::{SegmentIo, SegmentWriter};
use super::{io_err, seg_path, TopicStore, PARTIAL_EVERY, WRITE_BUFFER};
use crate::error::StoreError;
use crate::faults;
use crate::record::{self, SEGMENT_HEADER_LEN};
use glommio::io::{DmaFile, DmaStreamWriterBuilder};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The pause before a batch whose write failed is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How often a store that is unhealthy with nothing left to write tries the disk
/// ([`probe_blocking`]).
const PROBE_EVERY: Duration = Duration::from_secs(1);

pub(super) struct Active {
    /// This thread's permit to hold a segment open ([`writer_slot`]), given back with it.
    _slot: Option<glommio::sync::StaticPermit>,
    writer: SegmentWriter,
    /// The segment file opened a second time (read-only), to check its length; only for
    /// the io_uring writer, whose flushed position can run past what the file holds
    /// (see [`mark_readable`]): a thread writer counts what `pwrite` wrote.
    file: Option<std::fs::File>,
    base: u64,
    /// Logical write position (header included).
    pos: u64,
    /// Each written batch not yet known flushed, with a copy of its bytes: if the
    /// stream writer itself fails, what it had not flushed is lost with it and is
    /// written again from this copy (bounded by the writer's buffers, about 1.25 MiB).
    unflushed: VecDeque<Unflushed>,
    /// One past the last sequence written into this segment (0 = none yet).
    written: u64,
    /// True once a sync of this segment succeeded.
    synced: bool,
}

/// A batch handed to the stream writer and not yet known flushed.
pub(super) struct Unflushed {
    /// End offset in the segment.
    end: u64,
    /// One past its last sequence.
    upto: u64,
    bytes: Vec<u8>,
    recs: Vec<RecordLen>,
}

pub(super) async fn open_segment(store: &TopicStore, base: u64) -> Result<Active, StoreError> {
    let slot = writer_slot(store).await;
    if store.dir.is_deleted() {
        return Err(StoreError::topic_deleted());
    }
    let path = seg_path(store.dir.path(), base);
    let fd_path = store.dir.fd_path(&path)?;
    store.dir.begin_open();
    let opened = match faults::check(faults::Op::Open).await {
        Err(e) => Err(io_err(e)),
        Ok(()) => match store.cfg.io {
            SegmentIo::Ring => match DmaFile::create(&*fd_path).await {
                // (An open of the file just created: its directory entry is in memory.)
                Ok(file) => std::fs::File::open(&*fd_path)
                    .map(|check| {
                        let w = DmaStreamWriterBuilder::new(file)
                            .with_buffer_size(WRITE_BUFFER)
                            .with_write_behind(4)
                            .build();
                        (SegmentWriter::Ring(w), Some(check))
                    })
                    .map_err(io_err),
                Err(e) => Err(io_err(e)),
            },
            SegmentIo::Threads => SegmentWriter::create_threaded(fd_path.to_path_buf())
                .await
                .map(|w| (w, None))
                .map_err(io_err),
        },
    };
    store.dir.end_open();
    let (mut writer, check) = opened?;
    writer
        .write_all(&record::segment_header(base, store.salt))
        .await
        .map_err(io_err)?;
    store.segments.start(base, path, store.salt);
    Ok(Active {
        _slot: slot,
        writer,
        file: check,
        base,
        pos: SEGMENT_HEADER_LEN as u64,
        unflushed: VecDeque::new(),
        written: 0,
        synced: false,
    })
}

/// Marks readable the batches of `a` that end at or below `flushed` (what its stream
/// writer reports flushed) and that the file really holds. glommio's stream writer takes
/// a short count from the kernel (a write cut at the file size limit, or at a full disk)
/// for a complete write, so the file is checked too: its data must run without a hole
/// from the first batch newly marked to the end of the last ([`data_end`]: one
/// `lseek(SEEK_HOLE)` per call that marks something). That finds a file that ends short,
/// and also a short write followed by a complete one at a higher offset (buffers written
/// concurrently at a full disk), which leaves a hole inside the file's length. `Err` (a
/// short write) when the data stops short of what the writer reports flushed: what lies
/// beyond stays unflushed, for [`abandon`] to write again elsewhere.
pub(super) fn mark_readable(
    store: &TopicStore,
    a: &mut Active,
    flushed: u64,
) -> Result<(), StoreError> {
    let flushed = flushed.min(a.writer.current_flushed_pos());
    let mut short = None;
    if let (Some(u), Some(file)) = (
        a.unflushed.front().filter(|u| u.end <= flushed),
        a.file.as_ref(),
    ) {
        let end = data_end(file, u.end - u.bytes.len() as u64).map_err(io_err)?;
        if end < flushed.min(a.pos) {
            short = Some(end);
        }
    }
    let flushed = short.unwrap_or(flushed);
    let mut upto = None;
    while let Some(u) = a.unflushed.front() {
        if u.end > flushed {
            break;
        }
        upto = Some((u.upto, u.end));
        a.unflushed.pop_front();
    }
    if let Some((seq, end)) = upto {
        store.segments.mark_readable(a.base, seq, end);
    }
    match short {
        None => Ok(()),
        Some(end) => Err(io_err(std::io::Error::other(format!(
            "short write: the file's data stops at byte {end} of {} written",
            a.writer.current_flushed_pos()
        )))),
    }
}

/// Where the data of `file` that runs on from byte `from` ends: its first hole at or
/// after `from` (`lseek(SEEK_HOLE)`; the file's length when it has none there, also on
/// a filesystem that does not track holes), or `from` when the file ends at or before it.
fn data_end(file: &std::fs::File, from: u64) -> std::io::Result<u64> {
    match rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(from)) {
        Ok(end) => Ok(end),
        Err(rustix::io::Errno::NXIO) => Ok(from),
        Err(e) => Err(e.into()),
    }
}

/// Gives up a segment after a write or sync error. One with no record written (or never
/// synced, when its writer itself failed) is removed, so repeated failures (a full disk)
/// do not leave empty files behind. When the writer is `sound` (the fault was injected
/// around it), a segment with records keeps them: it is closed (writing out what the
/// stream writer buffers, which a plain drop would discard) and sealed at the end of its
/// last whole batch, so that neither reads nor recovery go past it into a torn write.
pub(super) async fn abandon(store: &TopicStore, a: Option<Active>, sound: bool) {
    let Some(mut a) = a else { return };
    if !sound {
        // What the failed writer had not flushed is lost with it: those records are
        // taken out of the segment and written again (in front of the pending ones).
        // (A short write found here leaves its batches unflushed: written again too.)
        let _ = mark_readable(store, &mut a, u64::MAX);
        let data_end = a
            .unflushed
            .front()
            .map_or(a.pos, |u| u.end - u.bytes.len() as u64);
        let mut bytes = Vec::new();
        let mut recs = Vec::new();
        for u in a.unflushed.drain(..) {
            bytes.extend_from_slice(&u.bytes);
            recs.extend_from_slice(&u.recs);
        }
        if let Some(&(first, _)) = recs.first() {
            store
                .segments
                .unnote_records(a.base, first, recs.len() as u64);
        }
        requeue(store, &bytes, &recs);
        a.pos = data_end;
    }
    let empty = store.segments.is_empty_at(a.base);
    if !a.synced && (a.written == 0 || empty) {
        let path = store.segments.remove(a.base);
        drop(a);
        if let Some(p) = path.and_then(|path| store.dir.fd_path(&path).ok()) {
            let _ = glommio::executor()
                .spawn_blocking(move || std::fs::remove_file(p))
                .await;
        }
        return;
    }
    if sound {
        if a.writer.close().await.is_err() {
            return;
        }
        if let Err(e) = mark_readable(store, &mut a, u64::MAX) {
            log::error!("STORE: {}: {e}", store.dir.display());
        }
    } else {
        // Dropped, not closed (see `write_chunk`): what it had flushed stays.
        drop(a.writer);
    }
    if let Some(ix) = store.segments.sealed_index(a.base, a.pos) {
        store.seal(ix, true).await;
    }
}

/// Puts the records of a batch that could not be written (`buf`, `recs`) back in front
/// of the pending buffer: they are written with the next batch, so a write error loses
/// nothing the broker holds (their publishers waiting for durability were told of the
/// error). Never dropped for room: the shard refuses new publishes instead once
/// [`super::UNWRITTEN_MAX`] bytes wait ([`TopicStore::admit`]). Only when the store is
/// closing (the last try at shutdown failed) or deleted do they go.
fn requeue(store: &TopicStore, buf: &[u8], recs: &[RecordLen]) {
    if store.dir.is_deleted() || recs.is_empty() {
        return;
    }
    if store.life.closing() {
        // The last try at shutdown failed: nothing retries them.
        log::error!(
            "STORE: {}: {} messages were never written (the disk kept failing until shutdown); they are lost",
            store.dir.display(),
            recs.len()
        );
        return;
    }
    store.pending.requeue_front(buf, recs);
}

/// The store's writer task, until the store closes or its topic is deleted (nsqd:
/// diskqueue.go ioLoop): waits for appended records, journal events or publishers
/// waiting for durability; writes the batch; syncs when due; releases the waiters.
pub(super) async fn writer_task(store: Rc<TopicStore>) {
    let mut w = Writer {
        store: store.clone(),
        active: None,
        unsynced: Unsynced::new(),
        last_partial: (Instant::now(), 0, 0),
        stalled_noted: false,
    };
    loop {
        w.wait_for_work().await;
        let durable_before = store.durability.durable_seq();
        // Double buffering: publishers encode into the spare pair (which keeps its
        // capacity, so no reallocation or page faults) while this batch is written.
        let (buf, recs) = store.pending.take_batch();
        let recs_empty = recs.is_empty();
        store.pending.release_drain_waiters();
        if store.dir.is_deleted() {
            // Topic deleted: nothing more goes to disk.
            store.durability.fail_waiters(&StoreError::exiting());
            if let Some(mut a) = w.active.take() {
                let _ = a.writer.close().await;
            }
            store.journal.drop_file();
            break;
        }
        store.pending.set_in_write(buf.len());
        let failed = !w.write_batch(&buf, &recs).await;
        store.pending.set_in_write(0);
        store.pending.recycle(buf, recs);
        // Journal events share the records' sync policy and group commit; any still
        // pending are written first, so the sync below covers every event so far.
        let journaled = store
            .journal
            .flush_io(store.cfg.io, &store.dir, &store.life)
            .await;
        let events = journaled + store.durability.take_journal_written();
        w.unsynced.add(events);
        delete_covered_journals(&store).await;
        let waiting = store.durability.has_waiters();
        let due = w.unsynced.due(store.cfg.sync_every, store.cfg.sync_timeout)
            || (waiting && !failed)
            || store.life.closing();
        if due && !failed {
            w.sync().await;
        }
        if failed && !store.life.closing() {
            // The records were put back: retry after a pause, not in a loop of errors.
            glommio::timer::sleep(RETRY_PAUSE).await;
        } else if recs_empty && store.health.error().is_some() && !store.life.closing() {
            // Nothing was written that could clear the error: a write of its own says
            // whether the disk works again (nsqd's health turns OK with its next
            // successful write; here it also does without one).
            if let Ok(true) = store.in_dir(probe_blocking).await {
                store.health.clear();
            }
        }
        if store.life.closing() && store.pending.is_empty() && !store.journal.has_pending() {
            w.close().await;
            break;
        }
        let progressed =
            !recs_empty || events > 0 || store.durability.durable_seq() != durable_before;
        if !progressed && !failed && store.durability.has_waiters() && !store.life.closing() {
            // A publisher waits for records this store has not been handed yet (the
            // shard's other tasks hand them over): syncs that release nothing, one after
            // another, would never let those tasks run. Wait for the next append.
            w.note_stalled_waiters();
            let wake = std::pin::pin!(store.life.woken());
            let sleep = std::pin::pin!(glommio::timer::sleep(RETRY_PAUSE));
            futures::future::select(wake, sleep).await;
        }
    }
    store.life.finish();
    store.journal.wake();
    store.pending.release_drain_waiters();
    store.life.notify_done();
}

/// The writer task's state between batches.
struct Writer {
    store: Rc<TopicStore>,
    /// The segment being written.
    active: Option<Active>,
    /// Records and journal events written since the last sync, and when that was.
    unsynced: Unsynced,
    /// (when, segment base, data end) of the last partial index written.
    last_partial: (Instant, u64, u64),
    /// A round found publishers waiting for records the store did not have (logged
    /// once per store).
    stalled_noted: bool,
}

impl Writer {
    /// Logs (once per store) a round that wrote and synced nothing while publishers
    /// waited: their records were not handed to the store.
    fn note_stalled_waiters(&mut self) {
        if std::mem::replace(&mut self.stalled_noted, true) {
            return;
        }
        let store = &self.store;
        log::warn!(
            "STORE: {} - publishers wait for sequence {} to be synced; the store holds up to {} (next {}), synced to {}: waiting for it to be handed over",
            store.dir.display(),
            store.durability.lowest_waiting().unwrap_or(0),
            self.active.as_ref().map_or(0, |a| a.written),
            store.pending.next_seq(),
            store.durability.durable_seq(),
        );
    }

    /// Sleeps until there is something to do, or `--sync-timeout` after unsynced writes;
    /// gives the store's descriptors back when idle meanwhile ([`Writer::wait_idle`]).
    async fn wait_for_work(&mut self) {
        let store = self.store.clone();
        let has_pending = !store.pending.is_empty();
        let has_journal = store.durability.has_journal_written();
        let has_waiters = store.durability.has_waiters();
        let closing = store.life.closing();
        if has_pending || has_waiters || closing || has_journal {
            return;
        }
        let wake = std::pin::pin!(store.life.woken());
        if store.health.error().is_some() {
            // Unhealthy with nothing to write (what the failed writes held was finished
            // by every channel and dropped): the loop tries the disk every PROBE_EVERY.
            let sleep = std::pin::pin!(glommio::timer::sleep(PROBE_EVERY));
            futures::future::select(wake, sleep).await;
        } else if store.cfg.io == SegmentIo::Ring
            && (self.active.is_some() || store.holds_releasable())
        {
            self.wait_idle(wake).await;
        } else if self.unsynced.any() {
            let sleep = std::pin::pin!(glommio::timer::sleep(self.sync_left()));
            futures::future::select(wake, sleep).await;
        } else {
            wake.await;
        }
    }

    /// Time left until unsynced writes are due for their sync (`--sync-timeout`).
    fn sync_left(&self) -> Duration {
        self.unsynced.time_left(self.store.cfg.sync_timeout)
    }

    /// Waits for `wake` (or for a sync to fall due) while the store holds descriptors;
    /// once idle for [`IDLE_RELEASE`] ([`PRESSED_RELEASE`] while too many stores hold
    /// some, re-checked whenever a store of this thread takes descriptors), syncs what
    /// is unsynced (early, under pressure), closes and seals the segment being written
    /// (the next write starts a new one) and gives the rest back
    /// ([`TopicStore::release_descriptors`]).
    async fn wait_idle(
        &mut self,
        mut wake: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) {
        use futures::future::{select, Either};
        let since = Instant::now();
        let key = Rc::as_ptr(&self.store) as usize;
        loop {
            let idle = if pressed() {
                PRESSED_RELEASE
            } else {
                IDLE_RELEASE
            };
            let idle_left = idle.saturating_sub(since.elapsed());
            if idle_left.is_zero() {
                break;
            }
            let mut left = idle_left;
            if self.unsynced.any() {
                let sync_left = self.sync_left();
                if sync_left.is_zero() {
                    return;
                }
                left = left.min(sync_left);
            }
            let sleep = std::pin::pin!(glommio::timer::sleep(left));
            let pressure = std::pin::pin!(pressure_changed(key));
            if let Either::Left(_) = select(wake.as_mut(), select(sleep, pressure)).await {
                return;
            }
        }
        let store = self.store.clone();
        if self.unsynced.any() {
            self.sync().await;
        }
        if self.active.is_some() {
            if let Err(failed) = self.rotate().await {
                abandon(&store, Some(failed), false).await;
                return;
            }
        }
        store.release_descriptors().await;
    }

    /// Writes the batch `buf` (records `recs`: sequence, encoded length) into segments,
    /// rotating at `max_bytes_per_file` (nsqd: writeOne). False after a failure (logged,
    /// recorded as the store's error, waiters failed).
    async fn write_batch(&mut self, buf: &[u8], recs: &[RecordLen]) -> bool {
        let store = self.store.clone();
        let mut i = 0usize;
        let mut start = 0usize;
        while i < recs.len() {
            if self
                .active
                .as_ref()
                .is_some_and(|a| a.pos >= store.cfg.max_bytes_per_file)
            {
                if let Err(failed) = self.rotate().await {
                    // Its writer failed: the rest of this batch goes back first, then
                    // (in front of it) what the failed writer had not flushed.
                    requeue(&store, &buf[start..], &recs[i..]);
                    abandon(&store, Some(failed), false).await;
                    return false;
                }
            }
            if self.active.is_none() {
                match open_segment(&store, recs[i].0).await {
                    Ok(a) => self.active = Some(a),
                    Err(e) => {
                        store
                            .health
                            .set_error(&e, format_args!("STORE: {} - {e}", store.dir.display()));
                        requeue(&store, &buf[start..], &recs[i..]);
                        store.durability.fail_waiters(&e);
                        return false;
                    }
                }
            }
            let Some(a) = self.active.as_mut() else {
                break;
            };
            // Records that go into this segment: up to the one that crosses the limit.
            let mut j = i;
            let mut bytes = 0u64;
            while j < recs.len() {
                bytes += recs[j].1 as u64;
                j += 1;
                if a.pos + bytes >= store.cfg.max_bytes_per_file {
                    break;
                }
            }
            store.segments.note_records(a.base, a.pos, &recs[i..j]);
            let chunk = &buf[start..start + bytes as usize];
            match write_chunk(&mut a.writer, chunk).await {
                Ok(()) => {
                    a.pos += bytes;
                    a.unflushed.push_back(Unflushed {
                        end: a.pos,
                        upto: recs[j - 1].0 + 1,
                        bytes: chunk.to_vec(),
                        recs: recs[i..j].to_vec(),
                    });
                    a.written = recs[j - 1].0 + 1;
                    self.unsynced.add((j - i) as u64);
                    if let Err(e) = mark_readable(&store, a, u64::MAX) {
                        // The segment ends short of what was written: the rest of the
                        // batch goes back, then (in front of it) what the file lacks.
                        let e = e.context(format_args!("write {}", store.dir.display()));
                        store.health.set_error(&e, format_args!("STORE: {e}"));
                        requeue(&store, &buf[start + bytes as usize..], &recs[j..]);
                        store.durability.fail_waiters(&e);
                        abandon(&store, self.active.take(), false).await;
                        return false;
                    }
                }
                Err((e, sound)) => {
                    let e = io_err(e).context(format_args!("write {}", store.dir.display()));
                    store.health.set_error(&e, format_args!("STORE: {e}"));
                    store
                        .segments
                        .unnote_records(a.base, recs[i].0, (j - i) as u64);
                    requeue(&store, &buf[start..], &recs[i..]);
                    store.durability.fail_waiters(&e);
                    abandon(&store, self.active.take(), sound).await;
                    return false;
                }
            }
            start += bytes as usize;
            i = j;
        }
        true
    }

    /// Closes the full segment: synced, so all of it is durable, then sealed in the
    /// background (nsqd: writeOne's rotation to the next file). `Err` gives back a
    /// segment whose stream writer itself failed (the error recorded, waiters failed),
    /// for the caller to put its unflushed records back and [`abandon`] it.
    async fn rotate(&mut self) -> Result<(), Active> {
        let store = &self.store;
        let Some(mut a) = self.active.take() else {
            return Ok(());
        };
        let synced = sync_segment(&mut a.writer).await;
        // A writer whose own flush failed is dropped, not closed (see `write_chunk`).
        let closed = match &synced {
            Err((_, false)) => Err(None),
            _ => a.writer.close().await.map_err(|e| Some(io_err(e))),
        };
        let writer_ok = closed.is_ok();
        let failed = match (synced, closed) {
            (Ok(()), Ok(())) => None,
            (Err((e, _)), _) | (Ok(()), Err(Some(e))) => Some(e),
            (Ok(()), Err(None)) => None,
        };
        if let Some(e) = &failed {
            // As a failed sync of the open segment: unhealthy, and whoever waits for
            // records of this segment is told, for a later sync of the next segment
            // must not count them as durable.
            let e = e
                .clone()
                .context(format_args!("sync {}", store.dir.display()));
            store.health.set_error(&e, format_args!("STORE: {e}"));
            store.durability.fail_waiters(&e);
        }
        if !writer_ok {
            return Err(a);
        }
        if let Err(e) = mark_readable(store, &mut a, u64::MAX) {
            if failed.is_none() {
                let e = e.context(format_args!("write {}", store.dir.display()));
                store.health.set_error(&e, format_args!("STORE: {e}"));
                store.durability.fail_waiters(&e);
            }
            return Err(a);
        }
        if failed.is_none() {
            if a.written > 0 {
                store.durability.advance(a.written);
            }
            // In the background: publishers waiting for a sync need not wait for the
            // index file's fsync too. (Counted as an open: `close` waits for it.)
            let (st, base, end) = (store.clone(), a.base, a.pos);
            store.dir.begin_open();
            glommio::spawn_local(async move {
                seal_closed(&st, base, end).await;
                st.dir.end_open();
            })
            .detach();
        }
        Ok(())
    }

    /// Syncs the journal and the open segment (nsqd: sync), checkpoints the segment's
    /// partial index when due, and releases the publishers waiting for durability.
    async fn sync(&mut self) {
        let store = self.store.clone();
        store.journal.sync(store.cfg.io, &store.dir).await;
        let mut ok = true;
        if let Some(a) = self.active.as_mut() {
            // Synced, and the file holds all that was written (else a short write).
            let synced = match sync_segment(&mut a.writer).await {
                Ok(()) => mark_readable(&store, a, u64::MAX).map_err(|e| (e, false)),
                Err(e) => Err(e),
            };
            match synced {
                Ok(()) => {
                    a.synced = true;
                    let upto = (a.written > 0).then_some(a.written);
                    if let Some(seq) = upto {
                        store.durability.advance(seq);
                    }
                    store.health.clear();
                    let (at, base, pos) = self.last_partial;
                    if at.elapsed() >= store.cfg.sync_timeout
                        || base != a.base
                        || a.pos >= pos + PARTIAL_EVERY
                    {
                        self.last_partial = (Instant::now(), a.base, a.pos);
                        write_partial(&store, a.base, a.pos);
                    }
                }
                Err((e, sound)) => {
                    let e = e.context(format_args!("sync {}", store.dir.display()));
                    store.health.set_error(&e, format_args!("STORE: {e}"));
                    store.durability.fail_waiters(&e);
                    abandon(&store, self.active.take(), sound).await;
                    ok = false;
                }
            }
        }
        self.unsynced.synced();
        if ok && store.pending.is_empty() {
            // Nothing left unwritten: everything appended so far is durable, or needs
            // no write (records every channel finished before they were written, which
            // the checkpoint drops: `TopicStore::forget_unwritten_below`). A publisher
            // waiting for one of those would otherwise wait for a write that never comes.
            store.durability.advance(store.pending.next_seq());
        }
        store.durability.release_waiters();
    }

    /// Clean close: closes (and seals, if synced) the open segment and fails whoever
    /// still waits.
    async fn close(&mut self) {
        let store = &self.store;
        if let Some(mut a) = self.active.take() {
            let closed = a.writer.close().await.is_ok();
            if let Err(e) = mark_readable(store, &mut a, u64::MAX) {
                log::error!("STORE: {}: {e}", store.dir.display());
            }
            if closed && a.synced {
                seal_closed(store, a.base, a.pos).await;
            }
        }
        store.journal.drop_file();
        store.durability.fail_waiters(&StoreError::exiting());
    }
}

/// Writes `chunk` to the segment, through the fault-injection layer ([`faults`]). The
/// error says whether the stream writer is still sound (an injected fault before or
/// after a partial write) or failed itself (then glommio's `close` must not be called:
/// it asserts on a writer whose flush failed).
async fn write_chunk(w: &mut SegmentWriter, chunk: &[u8]) -> Result<(), (std::io::Error, bool)> {
    match faults::write_fault(chunk.len()).await {
        Err(e) => Err((e, true)),
        Ok(None) => w.write_all(chunk).await.map_err(|e| (e, false)),
        Ok(Some((n, e))) => {
            w.write_all(&chunk[..n]).await.map_err(|e| (e, false))?;
            Err((e, true))
        }
    }
}

/// fdatasyncs the segment, through the fault-injection layer ([`faults`]); the error
/// says whether the stream writer is still sound, as [`write_chunk`]'s.
async fn sync_segment(w: &mut SegmentWriter) -> Result<(), (StoreError, bool)> {
    faults::check(faults::Op::Sync)
        .await
        .map_err(|e| (io_err(e), true))?;
    w.sync().await.map_err(|e| (io_err(e), false))
}

/// Writes, syncs and removes a 4 KiB file in `dir` (blocking): whether the disk takes
/// writes again, for a store whose error no pending write can clear.
fn probe_blocking(dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    crate::faults::check_blocking(crate::faults::Op::Write)?;
    crate::faults::check_blocking(crate::faults::Op::Sync)?;
    let path = dir.join("probe.tmp");
    let res = std::fs::File::create(&path).and_then(|mut f| {
        f.write_all(&[0u8; 4096])?;
        f.sync_data()
    });
    let _ = std::fs::remove_file(&path);
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreConfig;

    /// Three 64 KiB batches written through a new segment's stream writer and flushed;
    /// with `hole`, 4 KiB inside the second batch is then punched out (what a short
    /// write followed by a complete one at a higher offset leaves). Returns what
    /// `mark_readable` gave, the segment's readable end and the batch ends.
    async fn write_three_batches(
        store: &TopicStore,
        base: u64,
        hole: bool,
    ) -> (Result<(), StoreError>, u64, Vec<u64>, usize) {
        let mut a = open_segment(store, base).await.unwrap();
        let mut ends = Vec::new();
        for (i, fill) in [b'a', b'b', b'c'].into_iter().enumerate() {
            let bytes = vec![fill; 64 * 1024];
            a.writer.write_all(&bytes).await.unwrap();
            a.pos += bytes.len() as u64;
            ends.push(a.pos);
            let seq = base + i as u64;
            a.unflushed.push_back(Unflushed {
                end: a.pos,
                upto: seq + 1,
                recs: vec![(seq, bytes.len() as u32)],
                bytes,
            });
        }
        a.writer.flush().await.unwrap();
        assert_eq!(a.writer.current_flushed_pos(), a.pos);
        if hole {
            let (path, _) = store.segments.path_and_readable_end(base).unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            let flags =
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
            rustix::fs::fallocate(&f, flags, 64 * 1024 + 8192, 4096).unwrap();
            assert!(
                f.metadata().unwrap().len() >= a.pos,
                "the length hides the hole"
            );
        }
        let r = mark_readable(store, &mut a, u64::MAX);
        let (_, readable) = store.segments.path_and_readable_end(base).unwrap();
        let left = a.unflushed.len();
        a.writer.close().await.unwrap();
        (r, readable, ends, left)
    }

    #[test]
    fn a_hole_inside_the_written_length_is_a_short_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                let cfg = StoreConfig {
                    max_bytes_per_file: 1 << 30,
                    sync_every: 1 << 20,
                    sync_timeout: Duration::from_secs(60),
                    io: crate::SegmentIo::Ring,
                };
                let store = TopicStore::open(path, cfg, 0).await.unwrap().store;
                // Without a hole: all three batches readable.
                let (r, readable, ends, left) = write_three_batches(&store, 0, false).await;
                assert!(r.is_ok(), "{r:?}");
                assert_eq!((readable, left), (ends[2], 0));
                // A hole in the second batch: only the first is readable; the other two
                // stay unflushed (to be written again) and the call fails.
                let (r, readable, ends, left) = write_three_batches(&store, 100, true).await;
                let e = r.expect_err("a hole is a short write").to_string();
                assert!(e.contains("short write"), "{e}");
                assert!(
                    e.contains(&format!("stops at byte {}", 64 * 1024 + 8192)),
                    "{e}"
                );
                assert_eq!((readable, left), (ends[0], 2));
                store.close().await;
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
