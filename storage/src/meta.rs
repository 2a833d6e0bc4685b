//! Topic metadata: the meaning of nsqd's `nsqd.dat` (topics, channels, paused flags)
//! plus each channel's position, kept per topic in `meta.json` beside its segments and
//! written atomically: write `meta.json.tmp`, fsync, rename over `meta.json`, fsync the
//! directory.

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
    /// The last journal generation whose events this metadata includes; recovery
    /// replays only newer ones ([`crate::journal`]). 0 in metadata written before the
    /// journal existed.
    #[serde(default)]
    pub journal_gen: u64,
}

fn meta_path(dir: &Path) -> PathBuf {
    dir.join("meta.json")
}

/// Writes `meta` atomically into `dir` (blocking; run it off the executor). `dir` must
/// exist: it is the topic's, made with its store. A missing one is an error, never
/// created here: a write that races the topic's delete must not bring the topic's
/// directory back (it would be recovered, deleted channels and all, at the next start).
pub fn write_blocking(dir: &Path, meta: &TopicMeta) -> std::io::Result<()> {
    use std::io::Write;
    crate::faults::check_blocking(crate::faults::Op::Meta)?;
    let tmp = dir.join("meta.json.tmp");
    let data = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, meta_path(dir))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Reads `meta.json` from `dir`; `Ok(None)` when there is none. A corrupt file is an
/// error (the caller logs it and starts the topic without channel positions).
pub fn read_blocking(dir: &Path) -> Result<Option<TopicMeta>, StoreError> {
    let path = meta_path(dir);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| StoreError::invalid_data(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io(e).context(path.display())),
    }
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
            }],
            next_seq: 0,
            journal_gen: 4,
        };
        write_blocking(d.path(), &m).unwrap();
        assert_eq!(read_blocking(d.path()), Ok(Some(m)));
        assert!(!d.path().join("meta.json.tmp").exists());
        std::fs::write(d.path().join("meta.json"), b"{broken").unwrap();
        assert!(read_blocking(d.path()).is_err());
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
            journal_gen: 0,
        };
        let e = write_blocking(&gone, &m).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        assert!(
            !gone.exists(),
            "a deleted topic's directory is not made again"
        );
    }
}
