//! Recovery: opening a topic's directory after a start or a crash (nsqd: diskqueue.go
//! retrieveMetaData, which trusts its metadata file; here each segment's side index is
//! checked and a segment without a valid one is scanned record by record, CRC-checked).

use super::{
    idx_path, io_err, pidx_path, seg_path, Recovered, Segment, StoreConfig, TopicStore,
    INDEX_EVERY, RECOVERY_CHUNK, TAIL_BYTES,
};
use crate::error::StoreError;
use crate::index::SegmentIndex;
use crate::record::{self, Decoded, StoredRecord, SEGMENT_HEADER_LEN};
use bytes::Bytes;
use glommio::io::DmaFile;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// A segment file found at recovery: its base, trusted side index, or else trusted
/// partial index (its synced prefix, as of the last checkpoint of the open segment).
pub(super) struct Found {
    base: u64,
    index: Option<SegmentIndex>,
    partial: Option<SegmentIndex>,
}

/// The salt in a segment file's header (blocking), if it has a valid one.
pub(super) fn header_salt(seg: &Path) -> Option<u32> {
    use std::io::Read;
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    std::fs::File::open(seg).ok()?.read_exact(&mut h).ok()?;
    record::parse_segment_header(&h).ok().map(|(_, salt)| salt)
}

/// Reads and checks an index file of segment `base` (`size` bytes now); `sealed`
/// requires the size recorded at sealing, a partial index only a prefix of the file.
pub(super) fn read_index(
    path: &Path,
    base: u64,
    size: u64,
    sealed: bool,
) -> Result<SegmentIndex, StoreError> {
    let ix = std::fs::read(path).map_err(io_err).and_then(|b| {
        crate::index::decode(&b).map_err(|e| StoreError::invalid_data(e.to_string()))
    })?;
    if ix.base != base {
        Err(StoreError::invalid_data(format!(
            "index of base {} in the file of {base}",
            ix.base
        )))
    } else if sealed && ix.file_len != size {
        Err(StoreError::invalid_data(format!(
            "segment is {size} bytes, {} when sealed",
            ix.file_len
        )))
    } else if !sealed && ix.data_end > size {
        Err(StoreError::invalid_data(format!(
            "segment is {size} bytes, shorter than the indexed {}",
            ix.data_end
        )))
    } else {
        Ok(ix)
    }
}

/// Lists a topic directory (blocking): segment files with their sizes and valid side
/// indexes, and journal generations. Removes leftovers: indexes without a segment and
/// temporary files of an interrupted seal.
pub(super) fn survey_blocking(dir: &Path) -> (Vec<Found>, BTreeSet<u64>) {
    set_aside_non_files_blocking(dir);
    rename_misnamed_blocking(dir);
    let mut segs = BTreeMap::new();
    let mut idxs = BTreeSet::new();
    let mut pidxs = BTreeSet::new();
    let mut journals = BTreeSet::new();
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for n in names {
        if let Some(b) = n.strip_suffix(".seg").and_then(|b| b.parse::<u64>().ok()) {
            let size = std::fs::metadata(dir.join(&n))
                .map(|m| m.len())
                .unwrap_or(0);
            segs.insert(b, size);
        } else if let Some(b) = n.strip_suffix(".idx").and_then(|b| b.parse::<u64>().ok()) {
            idxs.insert(b);
        } else if let Some(b) = n.strip_suffix(".pidx").and_then(|b| b.parse::<u64>().ok()) {
            pidxs.insert(b);
        } else if let Some(g) = crate::journal::parse_name(&n) {
            journals.insert(g);
        } else if n.ends_with(".idx.tmp") || n.ends_with(".pidx.tmp") || n == "probe.tmp" {
            let _ = std::fs::remove_file(dir.join(&n));
        }
    }
    let mut found = Vec::new();
    for (&base, &size) in &segs {
        let mut index = None;
        let mut partial = None;
        for (sealed, set, path) in [
            (true, &idxs, idx_path(dir, base)),
            (false, &pidxs, pidx_path(dir, base)),
        ] {
            if !set.contains(&base) {
                continue;
            }
            if index.is_some() {
                // Sealed after its last partial index: that one is obsolete.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let checked = read_index(&path, base, size, sealed).and_then(|ix| {
                if sealed || header_salt(&seg_path(dir, base)) == Some(ix.salt) {
                    Ok(ix)
                } else {
                    Err(StoreError::invalid_data("partial index of another writer"))
                }
            });
            match checked {
                Ok(ix) if sealed => index = Some(ix),
                Ok(ix) => partial = Some(ix),
                Err(e) => {
                    log::warn!(
                        "STORE: {} not used - {e}; scanning the segment",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        found.push(Found {
            base,
            index,
            partial,
        });
    }
    for b in idxs.iter().filter(|b| !segs.contains_key(b)) {
        let _ = std::fs::remove_file(idx_path(dir, *b));
    }
    for b in pidxs.iter().filter(|b| !segs.contains_key(b)) {
        let _ = std::fs::remove_file(pidx_path(dir, *b));
    }
    (found, journals)
}

/// Sets aside, as `<name>.notafile`, anything named as a segment, index or journal
/// file that is not a regular file (a directory, a FIFO, a socket, a dangling link: put
/// there by hand or by a filesystem repair after a crash). It holds no records, and
/// left under its name it would stop the topic's writer from ever opening that file.
fn set_aside_non_files_blocking(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = [".seg", ".idx", ".pidx"]
            .iter()
            .any(|x| n.strip_suffix(x).is_some_and(|b| b.parse::<u64>().is_ok()))
            || crate::journal::parse_name(&n).is_some();
        if !ours {
            continue;
        }
        // Follows links: a link to a regular file is used as that file.
        let regular = std::fs::metadata(e.path()).is_ok_and(|m| m.is_file());
        if regular {
            continue;
        }
        let kept = dir.join(format!("{n}.notafile"));
        match std::fs::rename(e.path(), &kept) {
            Ok(()) => log::error!(
                "STORE: {} is not a regular file: set aside as {}",
                e.path().display(),
                kept.display()
            ),
            Err(err) => log::error!(
                "STORE: {} is not a regular file and cannot be set aside - {err}",
                e.path().display()
            ),
        }
    }
}

/// The base a segment file's own bytes give when its name contradicts them: its header's
/// base, confirmed by its first record (the same sequence, the same salt, a valid CRC),
/// or the name cannot be right (above its first record's sequence). `None` when the name
/// is consistent or the bytes do not tell (a first record that fails its CRC is not
/// believed: a flipped sequence must not move a whole segment).
fn true_base_blocking(path: &Path, name_base: u64) -> Option<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = [0u8; SEGMENT_HEADER_LEN + 8 + 13];
    f.read_exact(&mut h).ok()?;
    let (seq, salt) = record::first_record_fields(&h[SEGMENT_HEADER_LEN..])?;
    let len = u32::from_be_bytes(
        h[SEGMENT_HEADER_LEN..SEGMENT_HEADER_LEN + 4]
            .try_into()
            .ok()?,
    );
    let size = f.metadata().ok()?.len();
    if SEGMENT_HEADER_LEN as u64 + 8 + u64::from(len) > size {
        return None;
    }
    let mut whole = vec![0u8; 8 + len as usize];
    f.seek(SeekFrom::Start(SEGMENT_HEADER_LEN as u64)).ok()?;
    f.read_exact(&mut whole).ok()?;
    if !matches!(
        record::decode(&Bytes::from(whole), 0, salt),
        Decoded::Record(..)
    ) {
        return None;
    }
    match record::parse_segment_header(&h) {
        Ok((base, s)) if s == salt && base == seq && base != name_base => Some(base),
        _ if name_base > seq => Some(seq),
        _ => None,
    }
}

/// Gives segment files found under a name their bytes contradict (renamed, swapped or
/// copied by hand) their right name, so that sequences are read from the file that holds
/// them: each such file is renamed to its base's name, or, when a file already holds
/// that name (a stray copy), set aside as `<name>.seg.misnamed` (kept, not read).
fn rename_misnamed_blocking(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut wrong: Vec<(u64, u64)> = Vec::new();
    // Files a crash left in the middle of this (renamed out of the way, not back yet).
    let mut moved: Vec<(u64, u64)> = Vec::new();
    for e in rd.filter_map(|e| e.ok()) {
        let n = e.file_name().to_string_lossy().into_owned();
        if let Some(b) = n
            .strip_suffix(".seg.renaming")
            .and_then(|b| b.parse::<u64>().ok())
        {
            moved.push((b, true_base_blocking(&e.path(), u64::MAX).unwrap_or(b)));
            continue;
        }
        let Some(b) = n.strip_suffix(".seg").and_then(|b| b.parse::<u64>().ok()) else {
            continue;
        };
        if let Some(t) = true_base_blocking(&e.path(), b) {
            wrong.push((b, t));
        }
    }
    // Out of the way first (two files may have swapped names), then each to its name.
    let aside = |b: u64| dir.join(format!("{b:020}.seg.renaming"));
    wrong.retain(|&(b, _)| std::fs::rename(seg_path(dir, b), aside(b)).is_ok());
    wrong.extend(moved);
    for (b, t) in wrong {
        let to = seg_path(dir, t);
        if !to.exists() && std::fs::rename(aside(b), &to).is_ok() {
            log::error!(
                "STORE: {}: its records start at sequence {t}: renamed to {}",
                seg_path(dir, b).display(),
                to.display()
            );
        } else {
            let kept = dir.join(format!("{b:020}.seg.misnamed"));
            let _ = std::fs::rename(aside(b), &kept);
            log::error!(
                "STORE: {}: a copy of segment {t}, which is there: set aside as {}",
                seg_path(dir, b).display(),
                kept.display()
            );
        }
    }
}

impl TopicStore {
    /// Opens (creating if needed) the store in `dir` and recovers it, keeping up to the
    /// newest `keep` records of the newest segment for the caller's memory tail. Sealed
    /// segments are taken from their side index without reading their records; other
    /// segments are scanned and then sealed in the background. Spawns the writer task on
    /// the current executor. Errors: the directory cannot be created or opened.
    pub async fn open(
        dir: PathBuf,
        cfg: StoreConfig,
        keep: usize,
    ) -> Result<Recovered, StoreError> {
        let d = dir.clone();
        glommio::executor()
            .spawn_blocking(move || std::fs::create_dir_all(&d))
            .await
            .map_err(|e| io_err(e).context(format_args!("create {}", dir.display())))?;
        let d = dir.clone();
        let (found, journals) = glommio::executor()
            .spawn_blocking(move || survey_blocking(&d))
            .await;
        let mut segments = BTreeMap::new();
        let mut tail: VecDeque<StoredRecord> = VecDeque::new();
        let mut next_seq = 0u64;
        let mut first_seq = None;
        let mut to_seal = Vec::new();
        let (mut sealed_n, mut scanned_n, mut scanned_bytes) = (0, 0, 0);
        let newest = found.last().map(|f| f.base);
        for f in found {
            let base = f.base;
            let path = seg_path(&dir, base);
            let is_newest = Some(base) == newest;
            let (mut seg, how) = recover_segment(&path, base, f, is_newest, keep, &mut tail).await;
            match how {
                How::Sealed => sealed_n += 1,
                How::Scanned { bytes, seal } => {
                    scanned_n += 1;
                    scanned_bytes += bytes;
                    to_seal.extend(seal);
                }
            }
            if seg.count == 0 {
                // Empty (or unreadable) segment: nothing to serve from it.
                let p = path.clone();
                let _ = glommio::executor()
                    .spawn_blocking(move || std::fs::remove_file(p))
                    .await;
                continue;
            }
            seg.readable_seq = seg.end_seq;
            first_seq.get_or_insert(base);
            next_seq = next_seq.max(seg.end_seq);
            segments.insert(base, seg);
        }
        // The newest file held no record (made just before a crash, or emptied): the
        // tail comes from the newest segment that has records, so that the caller
        // knows the newest record (a replicated topic continues its IDs after it).
        if tail.is_empty() && keep > 0 {
            if let Some((&base, seg)) = segments.iter().next_back() {
                if let Some(ix) = seg.sealed_index(base, seg.readable_end) {
                    load_tail(&seg.path, &ix, keep, &mut tail).await;
                }
            }
        }
        let dir_fd = std::fs::File::open(&dir)
            .map_err(|e| io_err(e).context(format_args!("open {}", dir.display())))?;
        let store = TopicStore::start(dir, dir_fd, false, cfg, segments, next_seq)?;
        store.journal.found_files(journals);
        if !to_seal.is_empty() {
            let st = store.clone();
            glommio::spawn_local(async move {
                for ix in to_seal {
                    st.seal(ix, true).await;
                }
            })
            .detach();
        }
        Ok(Recovered {
            store,
            tail,
            first_seq: first_seq.unwrap_or(next_seq),
            next_seq,
            sealed_segments: sealed_n,
            scanned_segments: scanned_n,
            scanned_bytes,
        })
    }
}

/// Reads a segment file from byte offset `start` (the first record, or a sparse index
/// entry) up to `limit` (default: the file's end) and calls `f` for every valid record
/// with its offset, logging and skipping corrupt ones. `after`: the sequence of the last
/// record before `start` when it is known (a scan that resumes where a partial index
/// ends): records at or below it are stale copies, not data. Sets `salt_out` from the
/// header. Returns the offset just after the last valid record; errors: the file cannot
/// be opened or read, or its header is not a segment header.
pub(super) async fn scan_file(
    path: &Path,
    start: u64,
    limit: Option<u64>,
    after: Option<u64>,
    salt_out: &mut u32,
    mut f: impl FnMut(StoredRecord, u64),
) -> Result<u64, StoreError> {
    let file = DmaFile::open(path).await.map_err(io_err)?;
    let res = scan_open_file(&file, path, start, limit, after, salt_out, &mut f).await;
    let _ = file.close().await;
    res
}

pub(super) async fn scan_open_file(
    file: &DmaFile,
    path: &Path,
    start: u64,
    limit: Option<u64>,
    after: Option<u64>,
    salt_out: &mut u32,
    f: &mut impl FnMut(StoredRecord, u64),
) -> Result<u64, StoreError> {
    let mut size = file.file_size().await.map_err(io_err)?;
    if let Some(l) = limit {
        size = size.min(l);
    }
    let head = file
        .read_at(0, SEGMENT_HEADER_LEN + 8 + 13)
        .await
        .map_err(io_err)?;
    let parsed = record::parse_segment_header(&head);
    let mut first = head
        .get(SEGMENT_HEADER_LEN..)
        .and_then(record::first_record_fields);
    if let (Some((_, fs)), true) = (
        first,
        parsed
            .as_ref()
            .map_or(true, |h| h.1 != first.map_or(0, |f| f.1)),
    ) {
        // Taken only if the whole first record checks out with that salt (its CRC).
        let len = u32::from_be_bytes([head[32], head[33], head[34], head[35]]) as usize;
        let whole = file
            .read_at(SEGMENT_HEADER_LEN as u64, 8 + len)
            .await
            .map(|r| Bytes::copy_from_slice(&r))
            .ok();
        if !whole.is_some_and(|w| matches!(record::decode(&w, 0, fs), Decoded::Record(..))) {
            first = None;
        }
    }
    // The first record carries the writer's salt too: a header whose salt or magic was
    // damaged is read by it (else every record would look like another writer's).
    let (header_base, salt) = match (parsed, first) {
        (Ok((b, s)), Some((_, fs))) if fs != s => {
            log::error!(
                "STORE: {}: its header's salt differs from its first record's; the records' is used",
                path.display()
            );
            (b, fs)
        }
        (Ok(h), _) => h,
        (Err(e), Some((seq, fs))) => {
            log::error!(
                "STORE: {}: its header is damaged ({e}); read by its records",
                path.display()
            );
            (seq, fs)
        }
        (Err(e), None) => return Err(StoreError::invalid_data(e.to_string())),
    };
    *salt_out = salt;
    // The file name and the header both give the base; records carry their own
    // sequences, so a mismatch (a flipped header, a file copied under another name) is
    // reported and the lower base is taken, so that no record is taken for stale.
    let name_base = path
        .file_stem()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse::<u64>().ok());
    let base = match name_base {
        Some(b) if b != header_base => {
            log::error!(
                "STORE: {}: its header gives base sequence {header_base}, its name {b}; \
                 records are taken by their own sequences",
                path.display()
            );
            b.min(header_base)
        }
        _ => header_base,
    };
    let mut pos = start.max(SEGMENT_HEADER_LEN as u64);
    let mut scan = Scanner {
        path,
        salt,
        // A write's DMA buffer can carry older records past the end of what it wrote
        // (kill -9 after it): below the last sequence known before `start`, they are
        // stale, not data.
        last: base.checked_sub(1).max(after),
        data_end: pos,
        suspect: Vec::new(),
    };
    let mut carry: Vec<u8> = Vec::new();
    let mut carry_at = pos;
    while pos < size {
        let want = RECOVERY_CHUNK.min((size - pos) as usize);
        let rr = file.read_at(pos, want).await.map_err(io_err)?;
        if rr.is_empty() {
            break;
        }
        pos += rr.len() as u64;
        let mut buf = std::mem::take(&mut carry);
        buf.extend_from_slice(&rr);
        let data = Bytes::from(buf);
        let at = scan.records(&data, carry_at, pos >= size, f);
        carry = data[at..].to_vec();
        carry_at += at as u64;
    }
    let data_end = scan.data_end;
    let trailing = size.saturating_sub(data_end);
    if !scan.suspect.is_empty() || !carry.is_empty() {
        log::info!(
            "STORE: {} offset {data_end}: the {trailing} bytes after the last record hold no \
             whole record (a torn record, or the unwritten end of the segment when the \
             broker stopped); ignored",
            path.display()
        );
    }
    Ok(data_end)
}

/// The state of a scan of one segment file.
struct Scanner<'a> {
    path: &'a Path,
    /// The salt of the segment's records (from its header).
    salt: u32,
    /// Sequence of the last valid record.
    last: Option<u64>,
    /// Offset just after the last valid record.
    data_end: u64,
    /// Problems seen since the last valid record. Garbage followed by a valid record is
    /// corruption (logged as an error); garbage up to the end of the data is the
    /// unwritten rest of the last DMA block after a crash (stale buffer bytes), which is
    /// expected.
    suspect: Vec<(u64, String)>,
}

impl Scanner<'_> {
    /// Decodes the records in `data` (read at file offset `data_at`), calling `f` for
    /// each valid one. Returns where an incomplete record starts (to be completed by the
    /// next read). `last_read`: `data` reaches the end of the file, so an incomplete
    /// record is damage (a length field flipped to a larger one) and the records after
    /// it are looked for. Damage (corrupt records, zeroed ranges, another writer's or
    /// stale records) is stepped over: each valid record after it is found.
    fn records(
        &mut self,
        data: &Bytes,
        data_at: u64,
        last_read: bool,
        f: &mut impl FnMut(StoredRecord, u64),
    ) -> usize {
        let mut at = 0usize;
        while at < data.len() {
            let off = data_at + at as u64;
            match record::decode(data, at, self.salt) {
                Decoded::Record(r, n) => {
                    if self.last.is_some_and(|l| r.seq <= l) {
                        // Stale bytes of a reused buffer (or an older copy): not data.
                        self.suspect(off, format!("stale record (sequence {})", r.seq));
                        at += n;
                        continue;
                    }
                    for (off, reason) in self.suspect.drain(..) {
                        log::error!(
                            "STORE: {} offset {off}: {reason}; skipped",
                            self.path.display()
                        );
                    }
                    self.last = Some(r.seq);
                    f(r, off);
                    at += n;
                    self.data_end = data_at + at as u64;
                }
                Decoded::End if record::zeros_from(data, at) => {
                    // Zeros to the end of this read: the unwritten end of the segment,
                    // unless records follow in the next read (a record may start in
                    // the last 3 bytes: they are read again with it).
                    at = if last_read {
                        data.len()
                    } else {
                        data.len().saturating_sub(3).max(at + 1)
                    };
                }
                Decoded::End => {
                    let next = record::resync(data, at + 1, self.salt);
                    if data[at..next].iter().all(|&b| b == 0) {
                        self.suspect(off, format!("{} zero bytes", next - at));
                    } else {
                        self.suspect(off, "another writer's record".into());
                    }
                    at = next;
                }
                Decoded::Incomplete if !last_read => break,
                Decoded::Incomplete => {
                    self.suspect(off, "truncated record".into());
                    at = record::resync(data, at + 1, self.salt);
                }
                Decoded::Corrupt { reason } => {
                    self.suspect(off, reason);
                    at = record::resync(data, at + 1, self.salt);
                }
            }
        }
        at.min(data.len())
    }

    /// Notes damage seen since the last valid record (the first 16 problems of one
    /// damaged range).
    fn suspect(&mut self, off: u64, reason: String) {
        if self.suspect.len() < 16 {
            self.suspect.push((off, reason));
        }
    }
}

/// Loads the newest records of a sealed segment into `tail`: at most `keep` records and
/// about [`TAIL_BYTES`] bytes, read from the sparse index entry that covers them.
pub(super) async fn load_tail(
    path: &Path,
    ix: &SegmentIndex,
    keep: usize,
    tail: &mut VecDeque<StoredRecord>,
) {
    let by_count = (ix.count.saturating_sub(keep as u64) / INDEX_EVERY) as usize;
    let floor = ix.data_end.saturating_sub(TAIL_BYTES);
    let by_bytes = ix
        .entries
        .iter()
        .position(|&(_, off)| off >= floor)
        .unwrap_or(ix.entries.len().saturating_sub(1));
    let Some(&(_, start)) = ix.entries.get(by_count.max(by_bytes)) else {
        return;
    };
    let mut salt = 0;
    let res = scan_file(path, start, Some(ix.data_end), None, &mut salt, |rec, _| {
        if tail.len() == keep {
            tail.pop_front();
        }
        tail.push_back(rec);
    })
    .await;
    if let Err(e) = res {
        log::error!(
            "STORE: segment {} unreadable - {e}; its records are read when needed",
            path.display()
        );
        tail.clear();
    }
}

/// How a segment was recovered.
enum How {
    /// From its side index.
    Sealed,
    /// Scanned (`bytes` read); `seal` is the index to write for it.
    Scanned {
        bytes: u64,
        seal: Option<SegmentIndex>,
    },
}

/// Recovers one segment file found at `path` (base sequence `base`): from its sealed
/// index, or by a scan from its start or the end of its partial index. Loads the newest
/// `keep` records into `tail` when it is the newest segment. A segment that cannot be
/// read is logged and comes back empty.
async fn recover_segment(
    path: &Path,
    base: u64,
    f: Found,
    is_newest: bool,
    keep: usize,
    tail: &mut VecDeque<StoredRecord>,
) -> (Segment, How) {
    let mut seg = Segment {
        path: path.to_path_buf(),
        salt: 0,
        end_seq: base,
        index: Vec::new(),
        count: 0,
        readable_seq: base,
        readable_end: u64::MAX,
    };
    if let Some(ix) = f.index {
        seg.salt = ix.salt;
        seg.end_seq = ix.last_seq + 1;
        seg.count = ix.count;
        seg.readable_end = ix.data_end;
        if is_newest && keep > 0 {
            load_tail(path, &ix, keep, tail).await;
        }
        seg.index = ix.entries;
        return (seg, How::Sealed);
    }
    {
        // Scanned: from the start, or from where the last partial index of the
        // open segment ends (what was written after that checkpoint).
        let mut from = SEGMENT_HEADER_LEN as u64;
        let partial = f.partial.is_some();
        if let Some(px) = f.partial {
            seg.salt = px.salt;
            seg.end_seq = px.last_seq + 1;
            seg.count = px.count;
            seg.index = px.entries;
            from = px.data_end;
        }
        let collect = is_newest && keep > 0 && !partial;
        let mut salt = 0;
        let mut bytes = 0;
        let mut seal = None;
        let after = (partial && seg.count > 0).then(|| seg.end_seq - 1);
        let res = scan_file(path, from, None, after, &mut salt, |rec, off| {
            if rec.seq < seg.end_seq && seg.count > 0 {
                return;
            }
            seg.note(rec.seq, off);
            if collect {
                if tail.len() == keep {
                    tail.pop_front();
                }
                tail.push_back(rec);
            }
        })
        .await;
        seg.salt = salt;
        match res {
            Ok(end) => {
                bytes = end.saturating_sub(from);
                // Reads stop where the scan found the last whole record: past it lies a
                // torn write (or a recycled file's old bytes), already reported here.
                seg.readable_end = end;
                if let Some(ix) = seg.sealed_index(base, end) {
                    if partial && is_newest && keep > 0 {
                        load_tail(path, &ix, keep, tail).await;
                    }
                    seal = Some(ix);
                }
            }
            // The newest segment without its header was created just before a crash
            // and never written to (records are lost only within the sync window).
            Err(e) if is_newest && e.to_string().contains("bad segment magic") => log::warn!(
                "STORE: segment {} holds no data (created just before the broker stopped or crashed); skipped",
                path.display()
            ),
            Err(e) => log::error!(
                "STORE: segment {} unreadable - {e}; skipped",
                path.display()
            ),
        }
        (seg, How::Scanned { bytes, seal })
    }
}
