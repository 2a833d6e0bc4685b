//! The direct-I/O probe each shard runs before it opens any data file.
//!
//! glommio decides once per thread and block device whether O_DIRECT reads and writes
//! go to its polled ring (IOPOLL): it reads one block from the first `DmaFile` opened
//! there, and takes "no" only from an `EOPNOTSUPP` answer. When that first file is
//! empty the read stops at end of file before it reaches the device, the answer is
//! "yes" even on a device without poll queues (a virtio disk, most cloud volumes), and
//! from then on every read on that shard fails with `EOPNOTSUPP`. A kill -9 can leave
//! an empty newest segment, which recovery opens first: after such a restart no channel
//! could read its backlog from disk. Opening a file that holds a block first gives
//! glommio the device's real answer.

use std::path::Path;

/// Creates `<dir>/.direct-io-probe-<shard>` holding 4 KiB, opens it as a `DmaFile`
/// (glommio probes the device on this open), reads it, and removes it. Failures are
/// logged and otherwise ignored: the files opened later then probe as before.
pub async fn probe_direct_io(dir: &Path, shard: usize) {
    let path = dir.join(format!(".direct-io-probe-{shard}"));
    if let Err(e) = std::fs::write(&path, vec![0u8; 4096]) {
        log::warn!("STORE: direct I/O probe {} - {e}", path.display());
        return;
    }
    match glommio::io::DmaFile::open(&path).await {
        Ok(f) => {
            if let Err(e) = f.read_at(0, 4096).await {
                log::warn!("STORE: direct I/O probe read {} - {e}", path.display());
            }
            let _ = f.close().await;
        }
        Err(e) => log::warn!("STORE: direct I/O probe open {} - {e}", path.display()),
    }
    let _ = std::fs::remove_file(&path);
}
