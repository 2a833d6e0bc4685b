//! Topic metadata: the meaning of nsqd's `nsqd.dat` (topics, channels, paused flags)
//! plus each channel's position, kept per topic in `meta.json` beside its segments and
//! written atomically: write `meta.json.tmp`, fsync, rename over `meta.json`, fsync the
//! directory.
//!
//! Channels' lists of pending messages (in flight, requeued, deferred) go inline in the
//! JSON while they are short. Beyond [`INLINE_PENDING_MAX`] messages in all they go to a
//! binary file, `pending-<id>.bin`, written and synced before the `meta.json` that
//! names it (with its length and CRC-32), so a crash between the two leaves the old
//! `meta.json` with the old file it names; files no `meta.json` names are deleted after
//! each write. Ten million deferred messages are 180 MB there and load in a fraction of
//! a second (as JSON: about 600 MB, several seconds).

use crate::error::StoreError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Version of the metadata layout.
pub const META_VERSION: u32 = 1;

/// A message of a channel that is not finished although its sequence is below the
/// channel's cursor: in flight, requeued or deferred when the metadata was written.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct PendingMessage {
    pub seq: u64,
    pub attempts: u16,
    /// Due time of a deferred message, Unix ns (0 = ready now).
    pub due_unix_ns: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct ChannelMeta {
    pub name: String,
    pub paused: bool,
    /// Next sequence the channel reads; everything below it except `pending` is finished.
    pub cursor: u64,
    #[serde(default)]
    pub pending: Vec<PendingMessage>,
    /// Sequences at or above `cursor` the channel already finished: published with a
    /// defer time (handed to the channel at once, see `Channel::defer_published`) and
    /// finished before the cursor reached their records. The cursor steps over them
    /// after a restart; without them it would deliver them again (attempts 1). Absent
    /// (empty) in metadata written before this field existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finished: Vec<u64>,
    /// The channel's own delivery limits set over HTTP (beyond nsqd). Absent (no
    /// limits) in metadata without them, written by nsqd's `nsqd.dat` import or before
    /// this field existed.
    #[serde(default, skip_serializing_if = "ChannelLimits::is_unset")]
    pub limits: ChannelLimits,
}

/// A channel's delivery limits (beyond nsqd; see docs/dead-letters-and-rate-limits.md),
/// in `meta.json` as `"limits":{"max_attempts":3,"rate_limit":200}`, each key present
/// only when set.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct ChannelLimits {
    /// `POST /channel/max-attempts`: deliveries after which a message goes to the
    /// dead-letter topic (0 = unlimited on this channel); `None` follows
    /// `--max-attempts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u16>,
    /// `POST /channel/rate-limit`: messages a second delivered on the channel across its
    /// consumers; `None` = not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<u32>,
}

impl ChannelLimits {
    /// True when no limit is set (nothing to write).
    pub fn is_unset(&self) -> bool {
        self.max_attempts.is_none() && self.rate_limit.is_none()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct TopicMeta {
    pub version: u32,
    pub name: String,
    pub paused: bool,
    /// nsqd's topic pump position: records below it were handed to the channels.
    pub pumped: u64,
    /// Sequence ranges [from, to) dropped by topic empty.
    #[serde(default)]
    pub holes: Vec<(u64, u64)>,
    pub channels: Vec<ChannelMeta>,
    /// The sequence the next published record gets. The newest records may be absent
    /// from the segments (finished before they were written); a restart must not reuse
    /// their sequences. 0 in metadata written before this field existed.
    #[serde(default)]
    pub next_seq: u64,
    /// The newest message ID the topic gave or held when this metadata was written (0:
    /// none, or metadata written before this field existed). With `next_seq`, of the
    /// same moment: a replicated topic's member restarted on its data path skips, by
    /// ID, what it had applied before, even the records finished before they were
    /// written (docs/replication.md).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub last_id: u64,
    /// The last journal generation whose events this metadata includes; recovery
    /// replays only newer ones ([`crate::journal`]). 0 in metadata written before the
    /// journal existed.
    #[serde(default)]
    pub journal_gen: u64,
    /// Where the channels' pending lists are when they are not inline (set by
    /// [`write_blocking`] in what it writes, filled back in by [`read_blocking`]; `None`
    /// in memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_file: Option<PendingFile>,
}

/// The binary file holding the channels' pending lists: for each channel of
/// `TopicMeta::channels`, in order, its count (u64 LE) then that many entries of
/// [`PENDING_ENTRY`] bytes: seq (u64 LE), attempts (u16 LE), due_unix_ns (i64 LE).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct PendingFile {
    pub name: String,
    pub len: u64,
    /// CRC-32 (IEEE) of the whole file.
    pub crc32: u32,
}

/// Pending messages in all channels beyond which they go to a [`PendingFile`].
pub const INLINE_PENDING_MAX: usize = 65_536;

/// Bytes of one pending message in a [`PendingFile`].
pub const PENDING_ENTRY: usize = 18;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_pending_file_name(n: &str) -> bool {
    n.strip_prefix("pending-")
        .and_then(|r| r.strip_suffix(".bin"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn encode_pending(meta: &TopicMeta) -> Vec<u8> {
    let total: usize = meta.channels.iter().map(|c| c.pending.len()).sum();
    let mut out = Vec::with_capacity(meta.channels.len() * 8 + total * PENDING_ENTRY);
    for c in &meta.channels {
        out.extend_from_slice(&(c.pending.len() as u64).to_le_bytes());
        for p in &c.pending {
            out.extend_from_slice(&p.seq.to_le_bytes());
            out.extend_from_slice(&p.attempts.to_le_bytes());
            out.extend_from_slice(&p.due_unix_ns.to_le_bytes());
        }
    }
    out
}

/// Fills the channels' pending lists from a [`PendingFile`]'s bytes; `None` when they
/// do not match the channels (a damaged or foreign file).
fn decode_pending(channels: &mut [ChannelMeta], b: &[u8]) -> Option<()> {
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
        let s = b.get(*at..at.checked_add(n)?)?;
        *at += n;
        Some(s)
    };
    for c in channels.iter_mut() {
        let n = u64::from_le_bytes(take(&mut at, 8)?.try_into().ok()?);
        let n = usize::try_from(n).ok()?;
        if n > (b.len() - at) / PENDING_ENTRY {
            return None;
        }
        c.pending = Vec::with_capacity(n);
        for e in take(&mut at, n * PENDING_ENTRY)?.chunks_exact(PENDING_ENTRY) {
            c.pending.push(PendingMessage {
                seq: u64::from_le_bytes(e[0..8].try_into().ok()?),
                attempts: u16::from_le_bytes(e[8..10].try_into().ok()?),
                due_unix_ns: i64::from_le_bytes(e[10..18].try_into().ok()?),
            });
        }
    }
    (at == b.len()).then_some(())
}

/// `syncfs(2)` of the filesystem holding `path` (blocking): flushes every file written
/// on it, with its directory entries, in one go. A checkpoint writing many topics'
/// `meta.json` without a sync each ([`write_to`]) makes them durable with it.
pub fn sync_filesystem(path: &Path) -> std::io::Result<()> {
    crate::faults::check_blocking(crate::faults::Op::Meta)?;
    let dir = std::fs::File::open(path)?;
    rustix::fs::syncfs(&dir).map_err(std::io::Error::from)
}

/// fsyncs `dir/meta.json` and `dir` (blocking): a `meta.json` written by [`write_to`]
/// without a sync becomes durable.
pub fn sync_blocking(dir: &Path) -> std::io::Result<()> {
    crate::faults::check_blocking(crate::faults::Op::Meta)?;
    std::fs::File::open(meta_path(dir))?.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

/// `dir` holds a `pending-<hex>.bin` (named by its meta.json or left by a failed write).
fn holds_pending_file(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(|e| e.ok())
            .any(|e| is_pending_file_name(&e.file_name().to_string_lossy()))
    })
}

fn meta_path(dir: &Path) -> PathBuf {
    dir.join("meta.json")
}

/// Writes `meta` atomically into `dir` and fsyncs it ([`write_to`] with `sync`).
pub fn write_blocking(dir: &Path, meta: &TopicMeta) -> std::io::Result<()> {
    write_to(dir, meta, true)
}

/// Writes `meta` atomically into `dir` (blocking; run it off the executor): a temporary
/// file renamed over `meta.json`, so a crash leaves the old or the new one, never a mix.
/// With `sync` the file (and its pending file) and the directory are fsynced before
/// this returns, so the write also survives power loss; without, it survives the
/// process (kill -9) and reaches the disk with the kernel's writeback or the next
/// synced write or [`sync_blocking`] / [`sync_filesystem`]. A write with a pending file
/// (or into a directory holding one) is synced whatever `sync` says. `dir` must exist: it is the topic's, made with its store. A missing
/// one is an error, never created here: a write that races the topic's delete must not
/// bring the topic's directory back (it would be recovered, deleted channels and all,
/// at the next start).
pub fn write_to(dir: &Path, meta: &TopicMeta, sync: bool) -> std::io::Result<()> {
    use std::io::Write;
    crate::faults::check_blocking(crate::faults::Op::Meta)?;
    let tmp = dir.join("meta.json.tmp");
    let total: usize = meta.channels.iter().map(|c| c.pending.len()).sum();
    // A write that makes or replaces a pending file is always synced: the file must be
    // on disk before the meta.json naming it, and the one it replaces may only go once
    // the new meta.json is durable.
    let sync = sync || total > INLINE_PENDING_MAX || holds_pending_file(dir);
    // The pending file the new meta.json names, if any.
    let mut keep = None;
    let data = if total > INLINE_PENDING_MAX {
        let bin = encode_pending(meta);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let name = format!("pending-{now:016x}.bin");
        {
            let mut f = std::fs::File::create(dir.join(&name))?;
            f.write_all(&bin)?;
            if sync {
                f.sync_all()?;
            }
        }
        keep = Some(name.clone());
        let mut outline = TopicMeta {
            pending_file: Some(PendingFile {
                name,
                len: bin.len() as u64,
                crc32: crc32fast::hash(&bin),
            }),
            channels: Vec::with_capacity(meta.channels.len()),
            ..meta.clone_without_channels()
        };
        for c in &meta.channels {
            outline.channels.push(ChannelMeta {
                name: c.name.clone(),
                paused: c.paused,
                cursor: c.cursor,
                pending: Vec::new(),
                finished: c.finished.clone(),
                limits: c.limits,
            });
        }
        serde_json::to_vec(&outline).map_err(std::io::Error::other)?
    } else {
        serde_json::to_vec(meta).map_err(std::io::Error::other)?
    };
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&data)?;
        if sync {
            f.sync_all()?;
        }
    }
    std::fs::rename(&tmp, meta_path(dir))?;
    if sync {
        std::fs::File::open(dir)?.sync_all()?;
    }
    // Pending files the new meta.json does not name (the previous one, or one written
    // by a write that failed before its rename) go, once it is synced: until then a
    // power loss may bring back the previous meta.json, which names its own.
    if !sync {
        return Ok(());
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            let n = e.file_name().to_string_lossy().into_owned();
            if is_pending_file_name(&n) && keep.as_deref() != Some(n.as_str()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

impl TopicMeta {
    /// A copy of everything but the channels (and no pending file).
    fn clone_without_channels(&self) -> TopicMeta {
        TopicMeta {
            version: self.version,
            name: self.name.clone(),
            paused: self.paused,
            pumped: self.pumped,
            holes: self.holes.clone(),
            channels: Vec::new(),
            next_seq: self.next_seq,
            last_id: self.last_id,
            journal_gen: self.journal_gen,
            pending_file: None,
        }
    }
}

/// Reads `meta.json` from `dir`; `Ok(None)` when there is none. A corrupt file is an
/// error (the caller logs it and starts the topic without channel positions).
pub fn read_blocking(dir: &Path) -> Result<Option<TopicMeta>, StoreError> {
    let path = meta_path(dir);
    let mut m: TopicMeta = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| StoreError::invalid_data(format!("{}: {e}", path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io(e).context(path.display())),
    };
    if let Some(pf) = m.pending_file.take() {
        if !is_pending_file_name(&pf.name) {
            return Err(StoreError::invalid_data(format!(
                "{}: pending file name {:?} is not pending-<hex>.bin",
                path.display(),
                pf.name
            )));
        }
        let ppath = dir.join(&pf.name);
        let b = std::fs::read(&ppath).map_err(|e| StoreError::io(e).context(ppath.display()))?;
        if b.len() as u64 != pf.len || crc32fast::hash(&b) != pf.crc32 {
            return Err(StoreError::invalid_data(format!(
                "{}: {} bytes, checksum {:08x}; meta.json says {} bytes, {:08x}",
                ppath.display(),
                b.len(),
                crc32fast::hash(&b),
                pf.len,
                pf.crc32
            )));
        }
        decode_pending(&mut m.channels, &b).ok_or_else(|| {
            StoreError::invalid_data(format!(
                "{}: does not match the channels of meta.json",
                ppath.display()
            ))
        })?;
    }
    Ok(Some(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_round_trip() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_blocking(d.path()), Ok(None));
        let m = TopicMeta {
            version: META_VERSION,
            name: "t".into(),
            paused: true,
            pumped: 10,
            holes: vec![(3, 5)],
            channels: vec![ChannelMeta {
                name: "c".into(),
                paused: false,
                cursor: 7,
                pending: vec![PendingMessage {
                    seq: 2,
                    attempts: 3,
                    due_unix_ns: 0,
                }],
                finished: vec![8, 11],
                limits: ChannelLimits {
                    max_attempts: Some(3),
                    rate_limit: None,
                },
            }],
            next_seq: 0,
            last_id: 0,
            journal_gen: 4,
            pending_file: None,
        };
        write_blocking(d.path(), &m).unwrap();
        assert_eq!(read_blocking(d.path()), Ok(Some(m)));
        assert!(!d.path().join("meta.json.tmp").exists());
        std::fs::write(d.path().join("meta.json"), b"{broken").unwrap();
        assert!(read_blocking(d.path()).is_err());
    }

    fn pending_files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| is_pending_file_name(n))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn long_pending_lists_go_to_a_binary_file_named_by_meta_json() {
        let d = tempfile::tempdir().unwrap();
        let chan = |name: &str, n: u64| ChannelMeta {
            name: name.into(),
            paused: false,
            cursor: n,
            pending: (0..n)
                .map(|s| PendingMessage {
                    seq: s,
                    attempts: (s % 7) as u16,
                    due_unix_ns: if s % 2 == 0 { 0 } else { -(s as i64) },
                })
                .collect(),
            finished: vec![n + 3],
            limits: ChannelLimits {
                max_attempts: Some(0),
                rate_limit: Some(200),
            },
        };
        let mut m = TopicMeta {
            version: META_VERSION,
            name: "t".into(),
            paused: false,
            pumped: 1,
            holes: Vec::new(),
            channels: vec![chan("a", 50_000), chan("b", 0), chan("c", 30_000)],
            next_seq: 80_000,
            last_id: 0,
            journal_gen: 2,
            pending_file: None,
        };
        write_blocking(d.path(), &m).unwrap();
        let files = pending_files(d.path());
        assert_eq!(files.len(), 1);
        let json = std::fs::read(d.path().join("meta.json")).unwrap();
        assert!(
            json.len() < 1000,
            "the lists are not inline: {} bytes",
            json.len()
        );
        assert_eq!(
            std::fs::metadata(d.path().join(&files[0])).unwrap().len(),
            3 * 8 + 80_000 * PENDING_ENTRY as u64
        );
        assert_eq!(read_blocking(d.path()), Ok(Some(m.clone())));

        // A second long write replaces the file (synced even when asked for no sync); a
        // short one goes inline and removes it, also when asked for no sync (a
        // directory holding a pending file is always written with a sync).
        m.channels[0].pending.pop();
        write_to(d.path(), &m, false).unwrap();
        assert_eq!(pending_files(d.path()).len(), 1);
        assert_eq!(read_blocking(d.path()), Ok(Some(m.clone())));
        m.channels[0].pending.truncate(10);
        m.channels[2].pending.clear();
        write_to(d.path(), &m, false).unwrap();
        assert!(pending_files(d.path()).is_empty());
        assert_eq!(read_blocking(d.path()), Ok(Some(m.clone())));
        // Unsynced inline writes, then their sync.
        m.pumped = 2;
        write_to(d.path(), &m, false).unwrap();
        assert_eq!(read_blocking(d.path()), Ok(Some(m.clone())));
        sync_blocking(d.path()).unwrap();
        sync_filesystem(d.path()).unwrap();

        // A damaged pending file is an error, never a silently shorter list.
        m.channels[2] = chan("c", 70_000);
        write_blocking(d.path(), &m).unwrap();
        let f = d.path().join(&pending_files(d.path())[0]);
        let mut b = std::fs::read(&f).unwrap();
        b[100] ^= 1;
        std::fs::write(&f, &b).unwrap();
        assert!(read_blocking(d.path()).is_err());
        std::fs::remove_file(&f).unwrap();
        assert!(read_blocking(d.path()).is_err());
    }

    #[test]
    fn channel_limits_are_optional_and_written_only_when_set() {
        let d = tempfile::tempdir().unwrap();
        // As written before the limits existed (and by the nsqd.dat import).
        std::fs::write(
            meta_path(d.path()),
            br#"{"version":1,"name":"t","paused":false,"pumped":0,"channels":[{"name":"c","paused":true,"cursor":0}]}"#,
        )
        .unwrap();
        let mut m = read_blocking(d.path()).unwrap().unwrap();
        assert_eq!(m.channels[0].limits, ChannelLimits::default());
        write_blocking(d.path(), &m).unwrap();
        let text = std::fs::read_to_string(meta_path(d.path())).unwrap();
        assert!(!text.contains("limits"), "{text}");
        m.channels[0].limits.rate_limit = Some(5);
        write_blocking(d.path(), &m).unwrap();
        let text = std::fs::read_to_string(meta_path(d.path())).unwrap();
        assert!(text.contains(r#""limits":{"rate_limit":5}"#), "{text}");
        assert_eq!(read_blocking(d.path()).unwrap(), Some(m));
    }

    #[test]
    fn a_write_never_creates_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let gone = d.path().join("t-gone");
        let m = TopicMeta {
            version: META_VERSION,
            name: "gone".into(),
            paused: false,
            pumped: 0,
            holes: Vec::new(),
            channels: Vec::new(),
            next_seq: 0,
            last_id: 0,
            journal_gen: 0,
            pending_file: None,
        };
        let e = write_blocking(&gone, &m).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        assert!(
            !gone.exists(),
            "a deleted topic's directory is not made again"
        );
    }
}
