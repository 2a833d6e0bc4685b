//! Moving from nsqd: a one-time import of what an upstream nsqd left in `--data-path`
//! (its `nsqd.dat` and go-diskqueue files) into this broker's store, run by
//! [`crate::runtime::run`] before any shard recovers, so nothing is served before it is
//! done.
//!
//! nsqd keeps one diskqueue per topic (messages its topic pump has not yet handed to the
//! channels) and one per channel (`<topic>:<channel>`: messages only that channel still
//! has to deliver; at a clean shutdown its in-flight, deferred and in-memory messages are
//! flushed there, with their attempts). This broker keeps one log per topic read by
//! channel cursors. The import writes, per topic, one log:
//!
//! ```text
//! seq 0 ..                 each channel's own backlog, channel by channel; the channel
//!                          gets them as pending (requeued) messages with their attempts,
//!                          every cursor starts after them, so no other channel sees them
//! pumped = cursors = P ..  the topic's backlog: not yet pumped, so every channel gets it
//!                          (when the topic is not paused), as from nsqd's pump
//! ```
//!
//! Message IDs, timestamps and attempts are kept: nsqd's 16 hex ASCII ID bytes are parsed
//! into the u64 that renders back to the same bytes ([`MessageId::from_hex`]).
//!
//! Exactly once: everything is first built under `<data-path>/.nsqd-import.tmp/`; then
//! the marker `<data-path>/.nsqd-import-done` is written (fsync, rename), listing the
//! topics imported and the nsqd files consumed; only then are the built topics moved into
//! `topics/` and the consumed files renamed to `*.imported`. A crash before the marker
//! redoes the import from scratch; a crash after it finishes the moves and renames at the
//! next start. With the marker present nothing is imported again.
//!
//! Damaged input never stops the import (nsqd: go-diskqueue `readOne` /
//! `handleReadError`): a record whose length is outside `26..=max-msg-size + 26`, or a
//! file cut short, ends that file (the rest of it is lost, as in nsqd) and reading goes on
//! with the next file; each case is logged. An unparsable `nsqd.dat` stops the start, as
//! it does nsqd's (`failed to parse metadata`).

use nsq_shards::message::{IdGenerator, MessageId};
use nsq_shards::names;
use nsq_storage::meta::{ChannelMeta, PendingMessage, TopicMeta, META_VERSION};
use nsq_storage::record::{self, StoredRecord};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The marker written once the import is decided; its presence prevents another one.
pub const MARKER: &str = ".nsqd-import-done";
/// Where the topics are built before they are moved into `topics/`.
const STAGING: &str = ".nsqd-import.tmp";
/// nsqd's message header in a diskqueue record: timestamp (8), attempts (2), ID (16).
const MIN_MSG_LEN: usize = 26;
/// Segment files are padded to this (the store reads them with O_DIRECT).
const BLOCK: u64 = 4096;

/// nsqd.dat (nsqd: nsqd.go `Metadata`).
#[derive(Deserialize)]
struct NsqdMeta {
    #[serde(default)]
    topics: Option<Vec<NsqdTopic>>,
}

#[derive(Deserialize)]
struct NsqdTopic {
    name: String,
    #[serde(default)]
    paused: bool,
    #[serde(default)]
    channels: Option<Vec<NsqdChannel>>,
}

#[derive(Deserialize)]
struct NsqdChannel {
    name: String,
    #[serde(default)]
    paused: bool,
}

/// Limits the import follows (from the broker's flags).
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// `--max-msg-size` (bytes): a diskqueue record longer than this plus 26 is corrupt.
    pub max_msg_size: i64,
    /// `--max-bytes-per-file`: segment size at which the import starts a new segment.
    pub max_bytes_per_file: u64,
    /// `--node-id`, for the rare message whose nsqd ID is not 16 lowercase hex bytes.
    pub node_id: u16,
}

/// One message read from a diskqueue (nsqd: message.go `decodeMessage`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsqdMessage {
    pub timestamp: i64,
    pub attempts: u16,
    pub id: [u8; 16],
    pub body: bytes::Bytes,
}

/// The go-diskqueue file of `name` number `num` (nsqd: diskqueue.go `fileName`).
pub fn queue_file(dp: &Path, name: &str, num: u64) -> PathBuf {
    dp.join(format!("{name}.diskqueue.{num:06}.dat"))
}

/// The go-diskqueue metadata file of `name` (diskqueue.go `metaDataFileName`).
pub fn queue_meta_file(dp: &Path, name: &str) -> PathBuf {
    dp.join(format!("{name}.diskqueue.meta.dat"))
}

/// Reads meta.dat: `depth\nreadFileNum,readPos\nwriteFileNum,writePos\n`.
fn parse_queue_meta(text: &str) -> Option<[i64; 5]> {
    let nums: Vec<i64> = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().ok())
        .collect::<Option<_>>()?;
    let v: [i64; 5] = nums.get(..5)?.try_into().ok()?;
    v[1..].iter().all(|n| *n >= 0).then_some(v)
}

/// Why the import stopped (a damaged queue file does not stop it: it is logged and
/// skipped). `Display` is what the start-up failure prints after `failed to import nsqd
/// data - `.
#[derive(Debug)]
pub enum ImportError {
    /// `failed to read metadata from PATH - <error>`: nsqd.dat is unreadable.
    ReadMeta {
        path: PathBuf,
        error: std::io::Error,
    },
    /// `failed to parse metadata in PATH - <error>`: nsqd.dat is not nsqd's JSON.
    ParseMeta {
        path: PathBuf,
        error: serde_json::Error,
    },
    /// `OP PATH: <error>` (OP: create, write, read, remove, move, rename, sync).
    Io {
        op: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// `OP segment: <error>`: writing (OP `write`) or syncing (`sync`) a segment file.
    Segment(&'static str, std::io::Error),
}

impl ImportError {
    fn io(op: &'static str, path: &Path, error: std::io::Error) -> ImportError {
        ImportError::Io {
            op,
            path: path.to_path_buf(),
            error,
        }
    }
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImportError::ReadMeta { path, error } => write!(
                f,
                "failed to read metadata from {} - {error}",
                path.display()
            ),
            ImportError::ParseMeta { path, error } => write!(
                f,
                "failed to parse metadata in {} - {error}",
                path.display()
            ),
            ImportError::Io { op, path, error } => write!(f, "{op} {}: {error}", path.display()),
            ImportError::Segment(op, error) => write!(f, "{op} segment: {error}"),
        }
    }
}

impl std::error::Error for ImportError {}

/// Reads every unread message of the diskqueue `name` in `dp`, in order, calling `f` for
/// each; returns the message count. Follows go-diskqueue: reading starts at meta.dat's
/// (readFileNum, readPos); a file before writeFileNum is read to its end, the write file
/// up to writePos (when the write file is longer than writePos, the metadata was stale:
/// it is then read to its end, as diskqueue's `retrieveMetaData` arranges). Without a
/// meta.dat the queue is empty (as for nsqd). Damage ends a file, never the import.
pub fn read_queue(
    dp: &Path,
    name: &str,
    max_msg_size: i64,
    mut f: impl FnMut(NsqdMessage) -> Result<(), ImportError>,
) -> Result<u64, ImportError> {
    let meta_path = queue_meta_file(dp, name);
    let text = match std::fs::read_to_string(&meta_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            log::error!(
                "IMPORT: {} unreadable - {e}; queue skipped",
                meta_path.display()
            );
            return Ok(0);
        }
    };
    let Some([_depth, rfn, rpos, mut wfn, mut wpos]) = parse_queue_meta(&text) else {
        log::error!(
            "IMPORT: {} is not diskqueue metadata; queue skipped",
            meta_path.display()
        );
        return Ok(0);
    };
    if let Ok(md) = std::fs::metadata(queue_file(dp, name, wfn as u64)) {
        if (wpos as u64) < md.len() {
            log::warn!(
                "IMPORT: DISKQUEUE({name}) metadata writePos {wpos} < file size {}; reading the file to its end",
                md.len()
            );
            wfn += 1;
            wpos = 0;
        }
    }
    let max = (max_msg_size.max(0) as u64).saturating_add(MIN_MSG_LEN as u64);
    let mut count = 0u64;
    for num in existing_files(dp, name, rfn as u64, wfn as u64) {
        let start = if num == rfn as u64 { rpos as u64 } else { 0 };
        let limit = (num == wfn as u64).then_some(wpos as u64);
        let path = queue_file(dp, name, num);
        let data = match std::fs::read(&path) {
            Ok(d) => bytes::Bytes::from(d),
            Err(e) => {
                log::error!("IMPORT: {} unreadable - {e}; file skipped", path.display());
                continue;
            }
        };
        count += read_file(&data, start, limit, max, &path, &mut f)?;
    }
    Ok(count)
}

/// Numbers in `from..=to` whose file of queue `name` exists, ascending.
fn existing_files(dp: &Path, name: &str, from: u64, to: u64) -> Vec<u64> {
    let prefix = format!("{name}.diskqueue.");
    let mut nums: Vec<u64> = std::fs::read_dir(dp)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.strip_prefix(&prefix)?.to_string();
                    let digits = n.strip_suffix(".dat")?;
                    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                        return None;
                    }
                    digits.parse::<u64>().ok()
                })
                .filter(|n| (from..=to).contains(n))
                .collect()
        })
        .unwrap_or_default();
    nums.sort_unstable();
    nums
}

/// Decodes the records of one diskqueue file from byte `pos` (to `limit` for the write
/// file: a record starting before it is read whole, as diskqueue does).
fn read_file(
    data: &bytes::Bytes,
    mut pos: u64,
    limit: Option<u64>,
    max: u64,
    path: &Path,
    f: &mut impl FnMut(NsqdMessage) -> Result<(), ImportError>,
) -> Result<u64, ImportError> {
    let mut count = 0;
    let end = data.len() as u64;
    while pos < limit.unwrap_or(end).min(end) {
        let at = pos as usize;
        let Some(hdr) = data.get(at..at + 4) else {
            log::error!(
                "IMPORT: {} offset {pos}: truncated record; rest of the file skipped",
                path.display()
            );
            break;
        };
        let size = i32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as i64;
        if size < MIN_MSG_LEN as i64 || size as u64 > max {
            log::error!(
                "IMPORT: {} offset {pos}: invalid message read size ({size}); rest of the file skipped",
                path.display()
            );
            break;
        }
        let Some(m) = data.get(at + 4..at + 4 + size as usize) else {
            log::error!(
                "IMPORT: {} offset {pos}: truncated record; rest of the file skipped",
                path.display()
            );
            break;
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&m[10..26]);
        f(NsqdMessage {
            timestamp: i64::from_be_bytes([m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]]),
            attempts: u16::from_be_bytes([m[8], m[9]]),
            id,
            body: data.slice(at + 4 + MIN_MSG_LEN..at + 4 + size as usize),
        })?;
        count += 1;
        pos += 4 + size as u64;
    }
    Ok(count)
}

/// Writes a topic's segment files (the store's record format) from std code, before the
/// store runs.
struct SegmentWriter {
    dir: PathBuf,
    salt: u32,
    max_bytes: u64,
    file: Option<(std::io::BufWriter<std::fs::File>, u64)>,
    next_seq: u64,
    buf: Vec<u8>,
    ids: IdGenerator,
}

impl SegmentWriter {
    fn new(dir: PathBuf, max_bytes: u64, node_id: u16) -> SegmentWriter {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x6e73_7164);
        SegmentWriter {
            dir,
            salt: (h.finish() as u32).max(1),
            max_bytes: max_bytes.max(BLOCK),
            file: None,
            next_seq: 0,
            buf: Vec::new(),
            ids: IdGenerator::new(node_id),
        }
    }

    /// Appends `m`; returns its sequence.
    fn append(&mut self, m: NsqdMessage, ctx: &str) -> Result<u64, ImportError> {
        let id = match MessageId::from_hex(&m.id) {
            Some(id) => id,
            None => {
                let id = self.ids.next_id();
                log::warn!(
                    "IMPORT: {ctx}: message ID {:?} is not 16 lowercase hex characters; it gets ID {}",
                    String::from_utf8_lossy(&m.id),
                    String::from_utf8_lossy(&id.to_hex())
                );
                id
            }
        };
        if self
            .file
            .as_ref()
            .is_some_and(|(_, n)| *n >= self.max_bytes)
        {
            self.finish_segment()?;
        }
        let seq = self.next_seq;
        if self.file.is_none() {
            let path = self.dir.join(format!("{seq:020}.seg"));
            let f =
                std::fs::File::create(&path).map_err(|e| ImportError::io("create", &path, e))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            w.write_all(&record::segment_header(seq, self.salt))
                .map_err(|e| ImportError::io("write", &path, e))?;
            self.file = Some((w, record::SEGMENT_HEADER_LEN as u64));
        }
        let rec = StoredRecord {
            seq,
            timestamp: m.timestamp,
            defer_until: 0,
            id: id.0,
            attempts: m.attempts,
            body: m.body,
        };
        self.buf.clear();
        let n = record::encode(&rec, self.salt, &mut self.buf);
        if let Some((w, bytes)) = self.file.as_mut() {
            w.write_all(&self.buf)
                .map_err(|e| ImportError::Segment("write", e))?;
            *bytes += n as u64;
        }
        self.next_seq += 1;
        Ok(seq)
    }

    /// Pads the open segment to a whole block with zeros (a zero length ends the data)
    /// and syncs it.
    fn finish_segment(&mut self) -> Result<(), ImportError> {
        let Some((mut w, bytes)) = self.file.take() else {
            return Ok(());
        };
        let pad = (BLOCK - bytes % BLOCK) % BLOCK;
        w.write_all(&vec![0u8; pad as usize])
            .and_then(|_| w.flush())
            .map_err(|e| ImportError::Segment("write", e))?;
        let f = w
            .into_inner()
            .map_err(|e| ImportError::Segment("write", e.into_error()))?;
        f.sync_all().map_err(|e| ImportError::Segment("sync", e))
    }
}

/// What one imported topic brought.
struct TopicReport {
    name: String,
    topic_messages: u64,
    channel_messages: Vec<(String, u64)>,
    files: Vec<String>,
}

/// Runs the import when `dp` holds an nsqd.dat and no marker, or finishes one a crash
/// interrupted. Errors (unparsable nsqd.dat, a failed write) stop the broker's start:
/// nothing half-imported is ever served.
pub fn run(dp: &Path, opts: &ImportOptions) -> Result<(), ImportError> {
    let marker = dp.join(MARKER);
    if marker.exists() {
        return finish(dp);
    }
    let nsqd_dat = dp.join("nsqd.dat");
    let data = match std::fs::read(&nsqd_dat) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(ImportError::ReadMeta {
                path: nsqd_dat,
                error: e,
            })
        }
    };
    let meta: NsqdMeta = serde_json::from_slice(&data).map_err(|error| ImportError::ParseMeta {
        path: nsqd_dat.clone(),
        error,
    })?;
    log::info!(
        "IMPORT: found nsqd data in {}; importing it once",
        dp.display()
    );
    let staging = dp.join(STAGING);
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| ImportError::io("remove", &staging, e))?;
    }
    std::fs::create_dir_all(&staging).map_err(|e| ImportError::io("create", &staging, e))?;
    let mut reports = Vec::new();
    let mut seen = BTreeSet::new();
    for t in meta.topics.unwrap_or_default() {
        if !names::is_valid_topic_name(&t.name) || names::is_ephemeral(&t.name) {
            log::warn!("IMPORT: skipping invalid topic {:?}", t.name);
            continue;
        }
        if !seen.insert(t.name.clone()) {
            continue;
        }
        if nsq_storage::topic_dir(dp, &t.name).exists() {
            log::error!(
                "IMPORT: TOPIC({}) already exists in this broker's store; its nsqd files are not imported and left in place",
                t.name
            );
            continue;
        }
        reports.push(import_topic(dp, &staging, &t, opts)?);
    }
    sync_dir(&staging)?;
    write_marker(dp, &reports)?;
    for r in &reports {
        let chans: Vec<String> = r
            .channel_messages
            .iter()
            .map(|(c, n)| format!("{c}: {n}"))
            .collect();
        log::info!(
            "IMPORT: TOPIC({}): {} messages for every channel, channel backlogs [{}]",
            r.name,
            r.topic_messages,
            chans.join(", ")
        );
    }
    finish(dp)
}

/// Builds `staging/t-<topic>`: segments and meta.json.
fn import_topic(
    dp: &Path,
    staging: &Path,
    t: &NsqdTopic,
    opts: &ImportOptions,
) -> Result<TopicReport, ImportError> {
    let dir = staging.join(format!("t-{}", t.name));
    std::fs::create_dir_all(&dir).map_err(|e| ImportError::io("create", &dir, e))?;
    let mut w = SegmentWriter::new(dir.clone(), opts.max_bytes_per_file, opts.node_id);
    let mut files = queue_files(dp, &t.name);
    let mut channels = Vec::new();
    let mut channel_messages = Vec::new();
    let mut seen = BTreeSet::new();
    for c in t.channels.iter().flatten() {
        if !names::is_valid_channel_name(&c.name) || names::is_ephemeral(&c.name) {
            log::warn!(
                "IMPORT: TOPIC({}): skipping invalid channel {:?}",
                t.name,
                c.name
            );
            continue;
        }
        if !seen.insert(c.name.clone()) {
            continue;
        }
        let qname = format!("{}:{}", t.name, c.name);
        let mut pending = Vec::new();
        let n = read_queue(dp, &qname, opts.max_msg_size, |m| {
            let attempts = m.attempts;
            let seq = w.append(m, &qname)?;
            pending.push(PendingMessage {
                seq,
                attempts,
                due_unix_ns: 0,
            });
            Ok(())
        })?;
        files.extend(queue_files(dp, &qname));
        channel_messages.push((c.name.clone(), n));
        channels.push(ChannelMeta {
            name: c.name.clone(),
            paused: c.paused,
            cursor: 0,
            pending,
            finished: Vec::new(),
            limits: Default::default(),
        });
    }
    let pumped = w.next_seq;
    let topic_messages = read_queue(dp, &t.name, opts.max_msg_size, |m| {
        w.append(m, &t.name).map(|_| ())
    })?;
    w.finish_segment()?;
    for c in &mut channels {
        c.cursor = pumped;
    }
    let m = TopicMeta {
        version: META_VERSION,
        name: t.name.clone(),
        paused: t.paused,
        pumped,
        holes: Vec::new(),
        channels,
        next_seq: w.next_seq,
        // The imported records carry their IDs; recovery resumes after the newest.
        last_id: 0,
        journal_gen: 0,
        pending_file: None,
    };
    nsq_storage::meta::write_blocking(&dir, &m)
        .map_err(|e| ImportError::io("write", &dir.join("meta.json"), e))?;
    Ok(TopicReport {
        name: t.name.clone(),
        topic_messages,
        channel_messages,
        files,
    })
}

/// The names of the diskqueue files (data, bad, metadata) of queue `name` in `dp`.
fn queue_files(dp: &Path, name: &str) -> Vec<String> {
    let prefix = format!("{name}.diskqueue.");
    let mut out: Vec<String> = std::fs::read_dir(dp)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|n| {
                    n.strip_prefix(&prefix).is_some_and(|rest| {
                        let rest = rest.strip_suffix(".bad").unwrap_or(rest);
                        rest == "meta.dat"
                            || rest.strip_suffix(".dat").is_some_and(|d| {
                                !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
                            })
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Writes the marker atomically: the decision that the import happened.
fn write_marker(dp: &Path, reports: &[TopicReport]) -> Result<(), ImportError> {
    let mut text = String::from(
        "# nsqd data imported into this broker; the files below were renamed to <name>.imported\n",
    );
    for r in reports {
        text.push_str(&format!("topic {} {}\n", r.name, r.topic_messages));
        for (c, n) in &r.channel_messages {
            text.push_str(&format!("channel {}:{} {}\n", r.name, c, n));
        }
    }
    text.push_str("file nsqd.dat\n");
    for r in reports {
        for f in &r.files {
            text.push_str(&format!("file {f}\n"));
        }
    }
    let tmp = dp.join(format!("{MARKER}.tmp"));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, dp.join(MARKER))
    })();
    res.map_err(|e| ImportError::io("write", &dp.join(MARKER), e))?;
    sync_dir(dp)
}

/// After the marker: moves the built topics into `topics/` and renames the consumed nsqd
/// files to `*.imported`. Idempotent (a crash in the middle is finished next start).
fn finish(dp: &Path) -> Result<(), ImportError> {
    let staging = dp.join(STAGING);
    if staging.exists() {
        let topics = dp.join("topics");
        std::fs::create_dir_all(&topics).map_err(|e| ImportError::io("create", &topics, e))?;
        let rd = std::fs::read_dir(&staging).map_err(|e| ImportError::io("read", &staging, e))?;
        for e in rd.filter_map(|e| e.ok()) {
            let to = topics.join(e.file_name());
            if to.exists() {
                log::error!(
                    "IMPORT: {} exists; imported copy left in {}",
                    to.display(),
                    e.path().display()
                );
                continue;
            }
            std::fs::rename(e.path(), &to).map_err(|err| ImportError::io("move", &to, err))?;
        }
        sync_dir(&topics)?;
        let _ = std::fs::remove_dir(&staging);
    }
    let marker = std::fs::read_to_string(dp.join(MARKER))
        .map_err(|e| ImportError::io("read", &dp.join(MARKER), e))?;
    let mut renamed = Vec::new();
    for f in marker.lines().filter_map(|l| l.strip_prefix("file ")) {
        let from = dp.join(f);
        let to = dp.join(format!("{f}.imported"));
        // With `<f>.imported` there, `<f>` is newer than the import (an nsqd started
        // here again): it is not ours to rename, and it is reported below.
        if from.exists() && !to.exists() {
            std::fs::rename(&from, &to).map_err(|e| ImportError::io("rename", &from, e))?;
            renamed.push(f);
        }
    }
    if dp.join("nsqd.dat").exists() {
        log::warn!(
            "IMPORT: {} exists, but nsqd data was already imported here ({}); it is not imported again",
            dp.join("nsqd.dat").display(),
            dp.join(MARKER).display()
        );
    }
    if !renamed.is_empty() {
        sync_dir(dp)?;
        log::info!(
            "IMPORT: done; nsqd's files renamed to *.imported (delete them once satisfied): {}",
            renamed.join(" ")
        );
    }
    log_leftovers(dp);
    Ok(())
}

/// Logs diskqueue files nsqd.dat did not name (nsqd would not load them either).
fn log_leftovers(dp: &Path) {
    let Ok(rd) = std::fs::read_dir(dp) else {
        return;
    };
    let mut left: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n.contains(".diskqueue.") && n.ends_with(".dat"))
        .collect();
    if !left.is_empty() {
        left.sort();
        log::warn!(
            "IMPORT: nsqd files not imported (no topic or channel in nsqd.dat, or the topic already existed), left in place: {}",
            left.join(" ")
        );
    }
}

fn sync_dir(d: &Path) -> Result<(), ImportError> {
    std::fs::File::open(d)
        .and_then(|f| f.sync_all())
        .map_err(|e| ImportError::io("sync", d, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ts: i64, attempts: u16, id: &[u8; 16], body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((26 + body.len()) as i32).to_be_bytes());
        m.extend_from_slice(&ts.to_be_bytes());
        m.extend_from_slice(&attempts.to_be_bytes());
        m.extend_from_slice(id);
        m.extend_from_slice(body);
        m
    }

    fn collect(dp: &Path, name: &str) -> Vec<NsqdMessage> {
        let mut out = Vec::new();
        read_queue(dp, name, 1024, |m| {
            out.push(m);
            Ok(())
        })
        .unwrap_or_default();
        out
    }

    #[test]
    fn meta_parse() {
        assert_eq!(
            parse_queue_meta("3\n0,52\n1,104\n"),
            Some([3, 0, 52, 1, 104])
        );
        assert_eq!(parse_queue_meta("3\n0,52\n"), None);
        assert_eq!(parse_queue_meta("3\n-1,52\n1,0\n"), None);
        assert_eq!(parse_queue_meta("garbage"), None);
    }

    #[test]
    fn reads_from_read_pos_across_files_up_to_write_pos() {
        let d = std::env::temp_dir().join(format!("import-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let a = rec(1, 0, b"0000000000000001", b"a");
        let b = rec(2, 0, b"0000000000000002", b"bb");
        let c = rec(3, 4, b"0000000000000003", b"ccc");
        std::fs::write(queue_file(&d, "t", 0), [a.clone(), b.clone()].concat()).unwrap();
        std::fs::write(queue_file(&d, "t", 1), [c.clone(), c.clone()].concat()).unwrap();
        // The second record of file 1 lies beyond writePos: not written as far as the
        // metadata knows, but the file is longer, so it is read (stale metadata).
        let meta = format!("2\n0,{}\n1,{}\n", a.len(), c.len());
        std::fs::write(queue_meta_file(&d, "t"), meta).unwrap();
        let got = collect(&d, "t");
        let bodies: Vec<&[u8]> = got.iter().map(|m| &m.body[..]).collect();
        assert_eq!(bodies, vec![&b"bb"[..], b"ccc", b"ccc"]);
        assert_eq!(got[1].attempts, 4);
        assert_eq!(&got[1].id, b"0000000000000003");
        // A bad length ends the file; the next file is still read.
        let mut bad = a.clone();
        bad[3] = 5;
        std::fs::write(queue_file(&d, "u", 0), [b.clone(), bad, b.clone()].concat()).unwrap();
        std::fs::write(queue_file(&d, "u", 1), c.clone()).unwrap();
        std::fs::write(queue_meta_file(&d, "u"), format!("9\n0,0\n1,{}\n", c.len())).unwrap();
        let got = collect(&d, "u");
        assert_eq!(got.len(), 2);
        assert_eq!(&got[1].body[..], b"ccc");
        let _ = std::fs::remove_dir_all(&d);
    }

    fn opts() -> ImportOptions {
        ImportOptions {
            max_msg_size: 1024,
            max_bytes_per_file: 4096,
            node_id: 1,
        }
    }

    fn nsqd_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("import-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("nsqd.dat"),
            br#"{"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":true}]}],"version":"1.3.0"}"#,
        )
        .unwrap();
        // 300 messages: more than one 4 KiB segment. One ID is not lowercase hex.
        let mut data = Vec::new();
        for i in 0..300u64 {
            let id = if i == 7 {
                *b"0123456789ABCDEF"
            } else {
                format!("{:016x}", 0xabc000 + i)
                    .into_bytes()
                    .try_into()
                    .unwrap()
            };
            data.extend(rec(i as i64, 0, &id, format!("m{i}").as_bytes()));
        }
        std::fs::write(queue_file(&d, "t", 0), &data).unwrap();
        std::fs::write(
            queue_meta_file(&d, "t"),
            format!("300\n0,0\n0,{}\n", data.len()),
        )
        .unwrap();
        std::fs::write(
            queue_file(&d, "t:c", 0),
            rec(5, 2, b"00000000000000ff", b"own"),
        )
        .unwrap();
        std::fs::write(queue_meta_file(&d, "t:c"), "1\n0,0\n0,31\n").unwrap();
        d
    }

    #[test]
    fn builds_segments_and_meta() {
        let d = nsqd_dir("build");
        run(&d, &opts()).unwrap();
        let dir = d.join("topics/t-t");
        let m = nsq_storage::meta::read_blocking(&dir).unwrap().unwrap();
        assert_eq!((m.pumped, m.next_seq, m.paused), (1, 301, false));
        assert_eq!(m.channels.len(), 1);
        let c = &m.channels[0];
        assert_eq!((c.name.as_str(), c.paused, c.cursor), ("c", true, 1));
        assert_eq!(
            c.pending,
            vec![PendingMessage {
                seq: 0,
                attempts: 2,
                due_unix_ns: 0
            }]
        );
        let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "seg"))
            .collect();
        segs.sort();
        assert!(segs.len() > 1, "rotated at --max-bytes-per-file");
        let mut seqs = Vec::new();
        for p in &segs {
            let data = bytes::Bytes::from(std::fs::read(p).unwrap());
            assert_eq!(data.len() % BLOCK as usize, 0);
            let (base, salt) = record::parse_segment_header(&data).unwrap();
            let (recs, skipped, _) = record::scan(&data, record::SEGMENT_HEADER_LEN, salt, None);
            assert!(skipped.is_empty());
            assert_eq!(recs.first().map(|(r, _)| r.seq), Some(base));
            seqs.extend(recs.into_iter().map(|(r, _)| (r.seq, r.id, r.body)));
        }
        assert_eq!(seqs.len(), 301);
        assert_eq!(seqs[0], (0, 0xff, bytes::Bytes::from_static(b"own")));
        assert_eq!(seqs[1].1, 0xabc000);
        assert_eq!(&seqs[300].2[..], b"m299");
        assert!(d.join("nsqd.dat.imported").exists() && d.join(MARKER).exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn crash_before_the_marker_redoes_after_it_finishes() {
        // Before the marker: a half-built staging area is thrown away.
        let d = nsqd_dir("crash1");
        std::fs::create_dir_all(d.join(STAGING).join("t-junk")).unwrap();
        run(&d, &opts()).unwrap();
        assert!(!d.join("topics/t-junk").exists());
        assert!(d.join("topics/t-t/meta.json").exists());
        assert!(!d.join(STAGING).exists());
        let _ = std::fs::remove_dir_all(&d);
        // After the marker: the moves and renames are finished, nothing is rebuilt.
        let d = nsqd_dir("crash2");
        run(&d, &opts()).unwrap();
        std::fs::create_dir_all(d.join(STAGING)).unwrap();
        std::fs::rename(d.join("topics/t-t"), d.join(STAGING).join("t-t")).unwrap();
        std::fs::rename(
            d.join("t.diskqueue.000000.dat.imported"),
            d.join("t.diskqueue.000000.dat"),
        )
        .unwrap();
        run(&d, &opts()).unwrap();
        assert!(d.join("topics/t-t/meta.json").exists());
        assert!(d.join("t.diskqueue.000000.dat.imported").exists());
        assert!(!d.join("t.diskqueue.000000.dat").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
