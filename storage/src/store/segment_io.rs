//! How a store's segment files are written and read: through io_uring on the shard
//! (`Ring`, O_DIRECT DMA files, the default) or by plain `pwrite`/`pread`/`fdatasync`
//! on the shard's blocking thread (`Threads`).
//!
//! Why two: io_uring issues a file write or read inline, in the `io_uring_enter` call
//! of the shard's own thread, on a filesystem that claims non-blocking support, and
//! FUSE does while it waits for its server to answer (kernel 6.18: the shard thread
//! sleeps in `fuse_direct_io` -> `request_wait_answer` under `io_submit_sqes`). A FUSE
//! server that takes 3 s per write then stalls every topic and client of that shard
//! for 3 s, where only the publishers waiting for that write should wait. On such
//! filesystems the shard hands each segment I/O to its blocking thread instead and
//! goes on; block-device filesystems (ext4, xfs, btrfs, tmpfs) keep io_uring, which
//! completes O_DIRECT I/O asynchronously there.

use bytes::Bytes;
use glommio::io::{DmaFile, DmaStreamWriter};
use std::path::Path;
use std::sync::Arc;

/// The segment I/O path of a store (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SegmentIo {
    /// io_uring O_DIRECT DMA files on the shard (glommio).
    #[default]
    Ring,
    /// Buffered `pwrite`/`pread`/`fdatasync` on the shard's blocking thread.
    Threads,
}

/// `f_type` of filesystems whose file I/O waits for a server (statfs(2) magic numbers):
/// FUSE (also fuseblk and virtiofs), NFS, SMB 1 and 2/3, 9P, Ceph. FUSE was measured
/// blocking io_uring's submitting thread; the others complete a request over the
/// network too, so they take the same path.
const SERVER_FILESYSTEMS: [(i64, &str); 6] = [
    (0x6573_5546, "fuse"),
    (0x6969, "nfs"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x0102_1997, "9p"),
    (0x00C3_6400, "ceph"),
];

impl SegmentIo {
    /// The path for data under `dir`: `env` (the value of `NSQD_SEGMENT_IO`, if set)
    /// decides when it is `uring` or `threads`; when it is unset, empty or `auto`, the
    /// filesystem holding `dir` does (statfs(2): [`SegmentIo::Threads`] on FUSE and
    /// network filesystems). Returns the choice and why, for the start-up log.
    ///
    /// Errors: an `env` value that is none of those ([`UnknownSegmentIo`], naming it).
    pub fn choose(dir: &Path, env: Option<&str>) -> Result<(SegmentIo, String), UnknownSegmentIo> {
        match env.map(str::trim) {
            Some("uring") => return Ok((SegmentIo::Ring, "NSQD_SEGMENT_IO=uring".into())),
            Some("threads") => {
                return Ok((SegmentIo::Threads, "NSQD_SEGMENT_IO=threads".into()));
            }
            None | Some("") | Some("auto") => {}
            Some(other) => return Err(UnknownSegmentIo(other.to_string())),
        }
        let ftype = match rustix::fs::statfs(dir) {
            // (`f_type` is i64 on x86-64 glibc, narrower on other targets.)
            #[allow(clippy::useless_conversion)]
            Ok(s) => i64::from(s.f_type),
            Err(e) => return Ok((SegmentIo::Ring, format!("statfs failed ({e})"))),
        };
        Ok(match SERVER_FILESYSTEMS.iter().find(|(t, _)| *t == ftype) {
            Some((_, name)) => (SegmentIo::Threads, format!("{name} filesystem")),
            None => (SegmentIo::Ring, format!("filesystem type {ftype:#x}")),
        })
    }
}

/// `NSQD_SEGMENT_IO` holds a value that is none of `auto`, `uring` and `threads` (the
/// value, trimmed); its `Display` is the start-up error's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownSegmentIo(pub String);

impl std::fmt::Display for UnknownSegmentIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NSQD_SEGMENT_IO={:?}: expected auto, uring or threads",
            self.0
        )
    }
}

impl std::error::Error for UnknownSegmentIo {}

/// Closes `file` on the blocking thread (a close on FUSE waits for the server's FLUSH
/// answer), from a task of its own so that a drop never waits.
pub(super) fn close_off_thread(file: Arc<std::fs::File>) {
    glommio::spawn_local(async move {
        glommio::executor().spawn_blocking(move || drop(file)).await;
    })
    .detach();
}

/// Writes all of `data` at `off` (the blocking thread's side). Returns the bytes
/// written before an error along with it: a short count (a full disk, the file size
/// limit) ends in the error of the write that could not go on.
fn pwrite_all(file: &std::fs::File, data: &[u8], off: u64) -> (usize, std::io::Result<()>) {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < data.len() {
        match file.write_at(&data[done..], off + done as u64) {
            Ok(0) => return (done, Err(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Err(e)),
        }
    }
    (done, Ok(()))
}

/// A segment being written (see the module docs).
pub(super) enum SegmentWriter {
    Ring(DmaStreamWriter),
    Threads(ThreadWriter),
}

/// A segment written by `pwrite` on the blocking thread, unbuffered: each `write_all`
/// is one write, awaited, so what it reports flushed is what the file holds.
pub(super) struct ThreadWriter {
    file: Option<Arc<std::fs::File>>,
    /// Bytes the file holds from offset 0 (the next write goes there).
    flushed: u64,
}

impl Drop for ThreadWriter {
    fn drop(&mut self) {
        if let Some(f) = self.file.take() {
            close_off_thread(f);
        }
    }
}

impl SegmentWriter {
    /// Creates the segment file at `path` for the `Threads` path, off the shard,
    /// truncating one that is there, as `DmaFile::create` does: a segment whose header
    /// write failed is left behind empty and is created again by the next try.
    pub(super) async fn create_threaded(path: std::path::PathBuf) -> std::io::Result<Self> {
        let file = glommio::executor()
            .spawn_blocking(move || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
            })
            .await?;
        Ok(SegmentWriter::Threads(ThreadWriter {
            file: Some(Arc::new(file)),
            flushed: 0,
        }))
    }

    /// Appends `data`.
    pub(super) async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            SegmentWriter::Ring(w) => futures::io::AsyncWriteExt::write_all(w, data).await,
            SegmentWriter::Threads(t) => {
                let Some(file) = t.file.clone() else {
                    return Err(std::io::Error::other("segment writer closed"));
                };
                let buf = data.to_vec();
                let off = t.flushed;
                let (n, res) = glommio::executor()
                    .spawn_blocking(move || pwrite_all(&file, &buf, off))
                    .await;
                t.flushed += n as u64;
                res
            }
        }
    }

    /// Writes out what is buffered (a thread writer buffers nothing).
    #[cfg(test)]
    pub(super) async fn flush(&mut self) -> std::io::Result<()> {
        match self {
            SegmentWriter::Ring(w) => futures::io::AsyncWriteExt::flush(w).await,
            SegmentWriter::Threads(_) => Ok(()),
        }
    }

    /// Writes out what is buffered and fdatasyncs the file.
    pub(super) async fn sync(&mut self) -> std::io::Result<()> {
        match self {
            SegmentWriter::Ring(w) => w.sync().await.map(|_| ()).map_err(std::io::Error::from),
            SegmentWriter::Threads(t) => {
                let Some(file) = t.file.clone() else {
                    return Err(std::io::Error::other("segment writer closed"));
                };
                glommio::executor()
                    .spawn_blocking(move || file.sync_data())
                    .await
            }
        }
    }

    /// Writes out what is buffered and closes the file (no sync).
    pub(super) async fn close(&mut self) -> std::io::Result<()> {
        match self {
            SegmentWriter::Ring(w) => futures::io::AsyncWriteExt::close(w).await,
            SegmentWriter::Threads(t) => {
                if let Some(f) = t.file.take() {
                    glommio::executor().spawn_blocking(move || drop(f)).await;
                }
                Ok(())
            }
        }
    }

    /// Bytes known written from offset 0.
    pub(super) fn current_flushed_pos(&self) -> u64 {
        match self {
            SegmentWriter::Ring(w) => w.current_flushed_pos(),
            SegmentWriter::Threads(t) => t.flushed,
        }
    }
}

/// A segment open for reading (see the module docs).
pub(super) enum SegmentFile {
    Ring(DmaFile),
    Threads(Option<Arc<std::fs::File>>),
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        if let SegmentFile::Threads(f) = self {
            if let Some(f) = f.take() {
                close_off_thread(f);
            }
        }
    }
}

impl SegmentFile {
    /// Opens the segment at `path` for reading by the path `io`.
    pub(super) async fn open(path: &Path, io: SegmentIo) -> std::io::Result<Self> {
        match io {
            SegmentIo::Ring => Ok(SegmentFile::Ring(
                DmaFile::open(path).await.map_err(std::io::Error::from)?,
            )),
            SegmentIo::Threads => {
                let path = path.to_path_buf();
                let f = glommio::executor()
                    .spawn_blocking(move || std::fs::File::open(path))
                    .await?;
                Ok(SegmentFile::Threads(Some(Arc::new(f))))
            }
        }
    }

    /// Up to `len` bytes at `off`: fewer only at the end of the file.
    pub(super) async fn read_at(&self, off: u64, len: usize) -> std::io::Result<Bytes> {
        match self {
            SegmentFile::Ring(f) => {
                let rr = f.read_at(off, len).await.map_err(std::io::Error::from)?;
                Ok(Bytes::copy_from_slice(&rr))
            }
            SegmentFile::Threads(f) => {
                let Some(file) = f.clone() else {
                    return Err(std::io::Error::other("segment file closed"));
                };
                glommio::executor()
                    .spawn_blocking(move || {
                        use std::os::unix::fs::FileExt;
                        let mut buf = vec![0u8; len];
                        let mut got = 0;
                        while got < len {
                            match file.read_at(&mut buf[got..], off + got as u64) {
                                Ok(0) => break,
                                Ok(n) => got += n,
                                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                Err(e) => return Err(e),
                            }
                        }
                        buf.truncate(got);
                        Ok(Bytes::from(buf))
                    })
                    .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_decides_and_a_bad_value_is_named() {
        let dir = Path::new("/");
        assert_eq!(
            SegmentIo::choose(dir, Some(" threads ")).map(|(io, _)| io),
            Ok(SegmentIo::Threads)
        );
        assert_eq!(
            SegmentIo::choose(dir, Some("uring")).map(|(io, _)| io),
            Ok(SegmentIo::Ring)
        );
        let e = SegmentIo::choose(dir, Some("fast")).map(|(io, _)| io);
        assert_eq!(e, Err(UnknownSegmentIo("fast".into())));
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("NSQD_SEGMENT_IO=\"fast\": expected auto, uring or threads".to_string())
        );
    }
}
