//! Side indexes of segments (nsqd: diskqueue.go persistMetaData, which writes the
//! read/write positions atomically; here each segment gets its own index): the sealed
//! index of a segment nothing more is written to, and the partial index of the segment
//! being written (its synced prefix), so recovery scans only what came after it.

use super::{idx_path, io_err, pidx_path, seg_path, TopicStore};
use crate::error::StoreError;
use crate::index::SegmentIndex;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Seals a segment (blocking): optionally syncs its data (a segment recovered after a
/// crash may hold data the dead process never synced), then writes its side index
/// atomically (temporary file, fsync, rename) and removes its partial index. `seg`,
/// `idx` and `pidx` may be `/proc/self/fd` paths. Returns the error text on failure; an
/// unsealed segment is only slower to recover.
pub(super) fn seal_blocking(
    seg: &Path,
    idx: &Path,
    pidx: &Path,
    mut ix: SegmentIndex,
    sync_data: bool,
) -> Result<(), StoreError> {
    use std::io::Write;
    crate::faults::check_blocking(crate::faults::Op::Meta).map_err(io_err)?;
    let f = std::fs::File::open(seg).map_err(io_err)?;
    if sync_data {
        f.sync_data().map_err(io_err)?;
    }
    ix.file_len = f.metadata().map_err(io_err)?.len();
    if ix.file_len < ix.data_end {
        return Err(StoreError::invalid_data(format!(
            "segment is {} bytes, shorter than its data ({})",
            ix.file_len, ix.data_end
        )));
    }
    let mut tmp = idx.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut t = std::fs::File::create(&tmp).map_err(io_err)?;
        t.write_all(&crate::index::encode(&ix)).map_err(io_err)?;
        t.sync_all().map_err(io_err)?;
    }
    std::fs::rename(&tmp, idx).map_err(io_err)?;
    let _ = std::fs::remove_file(pidx);
    Ok(())
}

/// Writes the partial index of the open segment (blocking): temporary file, rename. Not
/// fsynced: a partial index lost or torn by a power failure only means a longer scan
/// (its CRC rejects a torn one).
pub(super) fn write_partial_blocking(pidx: &Path, ix: &SegmentIndex) -> Result<(), StoreError> {
    crate::faults::check_blocking(crate::faults::Op::Meta).map_err(io_err)?;
    let mut tmp = pidx.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, crate::index::encode(ix)).map_err(io_err)?;
    std::fs::rename(&tmp, pidx).map_err(io_err)
}

impl TopicStore {
    /// Writes the side index of a segment nothing more is written to (off the executor);
    /// failures are logged (the segment is then scanned at the next start).
    pub(super) async fn seal(&self, ix: SegmentIndex, sync_data: bool) {
        if self.dir.is_deleted() || !self.segments.contains(ix.base) {
            return;
        }
        let dir = self.dir.path();
        let paths = (
            self.dir.fd_path(&seg_path(dir, ix.base)),
            self.dir.fd_path(&idx_path(dir, ix.base)),
            self.dir.fd_path(&pidx_path(dir, ix.base)),
        );
        let (Ok(seg), Ok(idx), Ok(pidx)) = paths else {
            // Deleted meanwhile, or the directory cannot be opened (then the segment
            // is scanned at the next start).
            return;
        };
        let base = ix.base;
        self.dir.begin_open();
        let res = glommio::executor()
            .spawn_blocking(move || seal_blocking(&seg, &idx, &pidx, ix, sync_data))
            .await;
        self.dir.end_open();
        if let Err(e) = res {
            log::warn!(
                "STORE: sealing {} failed - {e}",
                seg_path(self.dir.path(), base).display()
            );
        }
    }
}

/// Seals the segment just closed by the writer (rotation or clean close), once its data
/// is synced: `data_end` is its logical length.
pub(super) async fn seal_closed(store: &TopicStore, base: u64, data_end: u64) {
    if let Some(ix) = store.segments.sealed_index(base, data_end) {
        store.seal(ix, false).await;
    }
}

/// Checkpoints the open segment: writes, in the background, the partial index of its
/// synced prefix (`data_end` bytes), so that recovery after a crash scans only what was
/// written after it. Skipped while the previous one is still being written.
pub(super) fn write_partial(store: &Rc<TopicStore>, base: u64, data_end: u64) {
    if store.segments.partial_busy() || store.dir.is_deleted() {
        return;
    }
    let Some(mut ix) = store.segments.sealed_index(base, data_end) else {
        return;
    };
    ix.file_len = data_end;
    store.segments.set_partial_busy(true);
    store.dir.begin_open();
    let st = store.clone();
    glommio::spawn_local(async move {
        let res = match st.dir.fd_path(&pidx_path(st.dir.path(), base)) {
            Ok(p) => {
                glommio::executor()
                    .spawn_blocking(move || write_partial_blocking(&p, &ix))
                    .await
            }
            Err(e) => Err(e),
        };
        st.dir.end_open();
        st.segments.set_partial_busy(false);
        if let Err(e) = res {
            log::warn!("STORE: partial index of {} - {e}", st.dir.display());
        }
    })
    .detach();
}
