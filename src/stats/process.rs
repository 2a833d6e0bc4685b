//! The process's own resource use, read from /proc (the one reader for /stats, statsd
//! and /metrics): CPU time, resident set size and open file descriptors, and nsqd's
//! `memory` keys built from them (nsqd: runtime.ReadMemStats in statsd.go and
//! http.go doStats; there is no GC here).

use serde::Serialize;

/// Bytes per page, the unit of /proc/self/stat's resident set size:
/// `sysconf(_SC_PAGESIZE)` (4 KiB on x86-64, up to 64 KiB on aarch64 kernels), read once.
fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| sysconf_or(libc::_SC_PAGESIZE, 4096))
}

/// Clock ticks per second, the unit of /proc/self/stat's CPU times (USER_HZ):
/// `sysconf(_SC_CLK_TCK)`, read once.
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| sysconf_or(libc::_SC_CLK_TCK, 100))
}

/// `sysconf(name)`, or `fallback` where the system does not report it (sysconf -1).
fn sysconf_or(name: libc::c_int, fallback: u64) -> u64 {
    // SAFETY: sysconf takes no pointers; it only reads a system constant.
    let n = unsafe { libc::sysconf(name) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(fallback)
}

/// One read of the process's resource use.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Process {
    /// User and system CPU time (seconds).
    pub cpu_seconds: f64,
    /// Resident set size (bytes).
    pub resident_bytes: u64,
}

impl Process {
    /// Reads /proc/self/stat (fields utime, stime, rss); zeros when it cannot be read.
    pub fn read() -> Process {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after.split_whitespace().collect();
        let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let (utime, stime, rss_pages) = (field(11), field(12), field(21));
        Process {
            cpu_seconds: (utime + stime) as f64 / clock_ticks() as f64,
            resident_bytes: rss_pages * page_size(),
        }
    }
}

/// Open file descriptors (entries of /proc/self/fd); 0 when it cannot be read.
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0) as u64
}

/// Process memory in nsqd's `memory` keys (/stats) and `mem.*` gauges (statsd). There
/// is no GC here: `heap_in_use_bytes` is the resident set size, the rest are 0.
#[derive(Serialize, Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    pub heap_objects: u64,
    pub heap_idle_bytes: u64,
    pub heap_in_use_bytes: u64,
    pub heap_released_bytes: u64,
    pub gc_pause_usec_100: u64,
    pub gc_pause_usec_99: u64,
    pub gc_pause_usec_95: u64,
    pub next_gc_bytes: u64,
    pub gc_total_runs: u64,
}

impl Memory {
    /// The gauges now (one read of /proc/self/stat).
    pub fn read() -> Memory {
        Memory {
            heap_in_use_bytes: Process::read().resident_bytes,
            ..Default::default()
        }
    }
}
