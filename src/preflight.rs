//! Preflight: what the runtime needs from the host, checked before any shard starts.
//!
//! glommio reports a host it cannot run on with a panic ("Failed to register a probe ...")
//! or an error that reaches the user as "a shard failed to start". Instead, every check
//! here runs, and each problem becomes one line saying what is wrong, the value found and
//! how to fix it; `main` prints them and exits 1. Checks:
//! - io_uring: a raw `io_uring_setup` (seccomp filters and `kernel.io_uring_disabled`
//!   answer EPERM, kernels without io_uring ENOSYS) and the opcode probe glommio needs
//!   (Linux >= 5.8);
//! - `RLIMIT_MEMLOCK` against what the shards register with io_uring (see
//!   [`MEMLOCK_PER_SHARD`]);
//! - the CPUs this process may use against `--shards` (a warning: more shards than CPUs
//!   works, slower);
//! - the data path: a directory, writable, not locked by another broker (its lock is
//!   taken here and kept for the life of the process, nsqd: dirlock);
//! - the TCP and HTTP addresses: bound here, exclusively, and handed to the runtime.

use crate::config::Config;
use crate::runtime::ListenError;
use std::fmt;
use std::fs::File;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// glommio's I/O memory per executor (glommio 0.9 `DEFAULT_IO_MEMORY`, 10 MiB), which the
/// runtime leaves at its default.
const IO_MEMORY: u64 = 10 << 20;

/// Rings per executor that register the I/O memory: main, latency and poll (glommio 0.9
/// `Reactor::new`). The kernel charges each registration separately to the user's
/// locked memory (io_uring/rsrc.c `io_account_mem`; only pages already registered in the
/// same ring are shared).
const RINGS_PER_SHARD: u64 = 3;

/// Bytes of locked memory one shard registers: 30 MiB.
pub const MEMLOCK_PER_SHARD: u64 = IO_MEMORY * RINGS_PER_SHARD;

/// Below this `RLIMIT_MEMLOCK`, glommio refuses to create an executor at all (glommio 0.9
/// `Reactor::new`, `MIN_MEMLOCK_LIMIT`: 512 KiB).
pub const GLOMMIO_MIN_MEMLOCK: u64 = 512 * 1024;

/// io_uring opcodes glommio 0.9 requires (`GLOMMIO_URING_OPS`), as (number, name).
const REQUIRED_OPS: &[(u8, &str)] = &[
    (0, "NOP"),
    (1, "READV"),
    (2, "WRITEV"),
    (3, "FSYNC"),
    (4, "READ_FIXED"),
    (5, "WRITE_FIXED"),
    (6, "POLL_ADD"),
    (7, "POLL_REMOVE"),
    (9, "SENDMSG"),
    (10, "RECVMSG"),
    (11, "TIMEOUT"),
    (12, "TIMEOUT_REMOVE"),
    (13, "ACCEPT"),
    (15, "LINK_TIMEOUT"),
    (16, "CONNECT"),
    (17, "FALLOCATE"),
    (18, "OPENAT"),
    (19, "CLOSE"),
    (21, "STATX"),
    (22, "READ"),
    (23, "WRITE"),
    (26, "SEND"),
    (27, "RECV"),
];

/// What a successful preflight hands to the runtime: the data path's lock (held until the
/// process exits) and the two listening sockets.
pub struct Ready {
    pub data_path: PathBuf,
    pub lock: File,
    pub tcp: (SocketAddr, socket2::Socket),
    pub http: (SocketAddr, socket2::Socket),
    /// The HTTPS listener: with a TLS certificate and `--https-address` set (nsqd).
    pub https: Option<(SocketAddr, socket2::Socket)>,
    /// Conditions the broker runs with but should not (logged as warnings).
    pub warnings: Vec<String>,
    /// What the checks created (see [`undo_created`]).
    pub created: Vec<PathBuf>,
}

/// A failed preflight: one line per problem (what, the value found, the fix), and the
/// warnings found on the way.
pub struct Failed {
    pub problems: Vec<Problem>,
    pub warnings: Vec<String>,
    /// What the checks created (see [`undo_created`]).
    pub created: Vec<PathBuf>,
}

/// What the host lacks, one per failed check. `Display` is the line `--preflight` and a
/// failed start print: what is wrong, the value found, and the fix.
#[derive(Debug)]
pub enum Problem {
    /// `io_uring_setup` failed with `errno`; the rest is what the host says about why
    /// (kernel release, `kernel.io_uring_disabled`, `kernel.io_uring_group`, the
    /// `Seccomp` mode, the locked-memory limit in bytes).
    IoUringSetup {
        errno: i32,
        release: String,
        disabled: Option<String>,
        group: Option<String>,
        seccomp: String,
        memlock: u64,
    },
    /// The opcode probe failed with `errno` (a kernel before 5.6).
    IoUringProbe { errno: i32, release: String },
    /// The kernel lacks opcodes glommio uses.
    IoUringOps {
        release: String,
        missing: Vec<&'static str>,
    },
    /// `RLIMIT_MEMLOCK` (bytes) is below what glommio needs to start at all.
    Memlock { limit: u64, shards: usize },
    /// The data path is a file.
    DataPathNotDir(PathBuf),
    /// The data path does not exist and cannot be created.
    DataPathCreate {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A file cannot be created in the data path.
    DataPathNotWritable {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The data path's lock file cannot be opened.
    LockFile {
        path: PathBuf,
        lock: PathBuf,
        error: std::io::Error,
    },
    /// Another broker (pid, when known) holds the data path's lock.
    Locked { path: PathBuf, holder: Option<u32> },
    /// An address could not be bound (`flag`: the option that gave it).
    Bind {
        error: ListenError,
        addr: String,
        flag: &'static str,
    },
    /// A bound address could not be opened to connections.
    Listen {
        error: ListenError,
        flag: &'static str,
    },
}

/// The fix of a data path the broker cannot use.
const FIX_PERM: &str = "fix: create it and give the broker's user write access (e.g. chown \
                        nsqd:nsqd /var/lib/nsqd; systemd with ProtectSystem=strict: \
                        ReadWritePaths=/var/lib/nsqd), or choose another --data-path";

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::IoUringSetup {
                errno,
                release,
                disabled,
                group,
                seccomp,
                memlock,
            } => io_uring_unavailable(f, *errno, release, disabled, group, seccomp, *memlock),
            Problem::IoUringProbe { errno, release } => write!(
                f,
                "io_uring is too old: the opcode probe failed with {} on kernel {release}; \
                 fix: run on Linux 5.8 or newer",
                errno_name(*errno)
            ),
            Problem::IoUringOps { release, missing } => write!(
                f,
                "io_uring is too old: kernel {release} lacks the opcodes {}; \
                 fix: run on Linux 5.8 or newer",
                missing.join(", ")
            ),
            Problem::Memlock { limit, shards } => {
                let need = MEMLOCK_PER_SHARD * *shards as u64;
                write!(
                    f,
                    "locked-memory limit (RLIMIT_MEMLOCK) is {}: the io_uring runtime needs at least \
                     {} to start and {} for --shards={shards} ({} per shard); {}",
                    fmt_limit(*limit),
                    fmt_limit(GLOMMIO_MIN_MEMLOCK),
                    fmt_limit(need),
                    fmt_limit(MEMLOCK_PER_SHARD),
                    memlock_fix(need)
                )
            }
            Problem::DataPathNotDir(path) => write!(
                f,
                "--data-path={} is not a directory (found a file); fix: point \
                 --data-path at a directory, or remove that file",
                path.display()
            ),
            Problem::DataPathCreate { path, error } => write!(
                f,
                "--data-path={} does not exist and cannot be created: {error}; {FIX_PERM}",
                path.display()
            ),
            Problem::DataPathNotWritable { path, error } => write!(
                f,
                "--data-path={} is not writable: creating a file there failed: {error}; {FIX_PERM}",
                path.display()
            ),
            Problem::LockFile { path, lock, error } => write!(
                f,
                "--data-path={}: cannot open its lock file {}: {error}; {FIX_PERM}",
                path.display(),
                lock.display()
            ),
            Problem::Locked { path, holder } => {
                let holder = holder
                    .map(|pid| format!(" (pid {pid})"))
                    .unwrap_or_default();
                write!(
                    f,
                    "--data-path={} is locked by another running broker{holder}; fix: stop that \
                     broker, or give this one its own --data-path (and its own --tcp-address and \
                     --http-address)",
                    path.display()
                )
            }
            Problem::Bind { error, addr, flag } => {
                // The fix follows the system's text, as the message names the cause.
                let line = error.to_string();
                let port = addr.rsplit(':').next().unwrap_or("");
                if line.contains("in use") {
                    write!(
                        f,
                        "{line}; fix: stop the process listening there (ss -ltnp 'sport = :{port}') or \
                         choose another {flag}"
                    )
                } else if line.contains("ermission denied") {
                    write!(
                        f,
                        "{line}; fix: ports below 1024 need CAP_NET_BIND_SERVICE (systemd: \
                         AmbientCapabilities=CAP_NET_BIND_SERVICE), or choose another {flag}"
                    )
                } else {
                    write!(
                        f,
                        "{line}; fix: give {flag} as <addr>:<port>, e.g. 0.0.0.0:4150"
                    )
                }
            }
            Problem::Listen { error, flag } => write!(f, "{error} ({flag})"),
        }
    }
}

impl std::error::Error for Problem {}

/// Removes what the data-path check created (its lock file, then the directories of a
/// `--data-path` that did not exist, deepest first, each only if empty), so that
/// `--preflight` alone leaves the host as it found it.
pub fn undo_created(created: &[PathBuf]) {
    for p in created {
        if p.is_dir() {
            let _ = std::fs::remove_dir(p);
        } else {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Runs every check; nothing here panics.
pub fn check(cfg: &Config) -> Result<Ready, Failed> {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    if let Err(e) = io_uring() {
        problems.push(e);
    }
    match memlock(cfg.shards) {
        Ok(Some(w)) => warnings.push(w),
        Ok(None) => {}
        Err(e) => problems.push(e),
    }
    if let Some(w) = cpus(cfg.shards) {
        warnings.push(w);
    }
    let data_path = cfg
        .opts
        .data_path
        .clone()
        .unwrap_or_else(|| PathBuf::from("."));
    let mut created = Vec::new();
    let lock = data_dir(&data_path, &mut warnings, &mut created)
        .map_err(|e| problems.push(e))
        .ok();
    // An address in use is retried for a while (a previous instance may still be
    // releasing it), both addresses within the same window; not when another broker
    // holds the data path, which then holds the addresses too.
    let retry_until = if lock.is_some() {
        Instant::now() + crate::runtime::BIND_RETRY
    } else {
        Instant::now()
    };
    let tcp = listener(&cfg.flags.tcp_address, "--tcp-address", retry_until)
        .map_err(|e| problems.push(e));
    let http = listener(&cfg.flags.http_address, "--http-address", retry_until)
        .map_err(|e| problems.push(e));
    let https = if cfg.tls.is_some() && !cfg.flags.https_address.is_empty() {
        listener(&cfg.flags.https_address, "--https-address", retry_until)
            .map(Some)
            .map_err(|e| problems.push(e))
    } else {
        Ok(None)
    };
    // Listening only once every address is bound (see `runtime::listen`).
    if let (Some(_), Ok(tcp), Ok(http), Ok(https)) = (&lock, &tcp, &http, &https) {
        let https = https
            .as_ref()
            .map(|h| (&h.1, &cfg.flags.https_address, "--https-address"));
        let all = [
            Some((&tcp.1, &cfg.flags.tcp_address, "--tcp-address")),
            Some((&http.1, &cfg.flags.http_address, "--http-address")),
            https,
        ];
        for (socket, addr, flag) in all.into_iter().flatten() {
            if problems.is_empty() {
                if let Err(error) = crate::runtime::listen(addr, socket) {
                    problems.push(Problem::Listen { error, flag });
                }
            }
        }
    }
    match (lock, tcp, http, https) {
        (Some(lock), Ok(tcp), Ok(http), Ok(https)) if problems.is_empty() => Ok(Ready {
            data_path,
            lock,
            tcp,
            http,
            https,
            warnings,
            created,
        }),
        _ => Err(Failed {
            problems,
            warnings,
            created,
        }),
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// `io_uring_params` (include/uapi/linux/io_uring.h): 120 bytes, all zero on input
/// except what the kernel fills in.
#[repr(C, align(8))]
struct IoUringParams([u32; 30]);

/// `io_uring_probe` with room for 256 `io_uring_probe_op`s (8 bytes each: op, resv,
/// flags u16, resv2 u32) after its 16-byte header (last_op, ops_len, resv, resv2[3]).
#[repr(C, align(8))]
struct IoUringProbe([u8; 16 + 256 * 8]);

const IORING_REGISTER_PROBE: libc::c_long = 8;
const IO_URING_OP_SUPPORTED: u8 = 1;

/// Creates and closes a 2-entry ring, then asks it which opcodes the kernel supports.
fn io_uring() -> Result<(), Problem> {
    let mut params = IoUringParams([0; 30]);
    // SAFETY: io_uring_setup(2) reads and writes exactly one io_uring_params, which
    // `params` is (zeroed, correctly sized and aligned) and outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            2 as libc::c_long,
            &mut params as *mut IoUringParams,
        )
    };
    if fd < 0 {
        return Err(io_uring_unavailable_facts(errno()));
    }
    let fd = fd as libc::c_int;
    let mut probe = IoUringProbe([0; 16 + 256 * 8]);
    // SAFETY: `fd` is the ring just created; IORING_REGISTER_PROBE writes at most
    // 16 + nr_args * 8 bytes into `probe`, which has room for nr_args = 256.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            fd as libc::c_long,
            IORING_REGISTER_PROBE,
            probe.0.as_mut_ptr(),
            256 as libc::c_long,
        )
    };
    let probe_errno = errno();
    // SAFETY: `fd` is owned here and closed once.
    unsafe { libc::close(fd) };
    let release = kernel_release();
    if r < 0 {
        return Err(Problem::IoUringProbe {
            errno: probe_errno,
            release,
        });
    }
    let ops_len = probe.0[1] as usize;
    let supported = |op: u8| {
        let i = op as usize;
        i < ops_len && probe.0[16 + i * 8 + 2] & IO_URING_OP_SUPPORTED != 0
    };
    let missing: Vec<&str> = REQUIRED_OPS
        .iter()
        .filter(|(op, _)| !supported(*op))
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(Problem::IoUringOps { release, missing });
    }
    Ok(())
}

fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOSYS => "ENOSYS",
        libc::ENOMEM => "ENOMEM",
        libc::EINVAL => "EINVAL",
        libc::EACCES => "EACCES",
        libc::EMFILE => "EMFILE",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A field of /proc/self/status (`Seccomp`, `CapEff`, ...).
fn proc_status(field: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// The line for an `io_uring_setup` that failed with `e`.
/// What the host says about a failed `io_uring_setup` (`errno`).
fn io_uring_unavailable_facts(errno: i32) -> Problem {
    Problem::IoUringSetup {
        errno,
        release: kernel_release(),
        disabled: read_trim("/proc/sys/kernel/io_uring_disabled"),
        group: read_trim("/proc/sys/kernel/io_uring_group"),
        seccomp: proc_status("Seccomp").unwrap_or_default(),
        memlock: memlock_limit().unwrap_or(0),
    }
}

/// The line for [`Problem::IoUringSetup`]: the likely cause from `errno` and the host's
/// facts, and its fix.
fn io_uring_unavailable(
    f: &mut fmt::Formatter<'_>,
    e: i32,
    release: &str,
    disabled: &Option<String>,
    group: &Option<String>,
    seccomp: &str,
    memlock: u64,
) -> fmt::Result {
    let seccomp_fix = "run under a seccomp profile that allows io_uring_setup, io_uring_enter \
                       and io_uring_register (docker run --security-opt \
                       seccomp=deploy/seccomp-io_uring.json; Kubernetes: securityContext \
                       seccompProfile type Localhost, see docs/operations.md \"Deploying\")";
    match e {
        libc::EPERM if disabled.as_deref() == Some("2") => f.write_str(
            "io_uring is disabled: \
             io_uring_setup failed with EPERM and sysctl kernel.io_uring_disabled = 2; fix: \
             sysctl -w kernel.io_uring_disabled=0 (persist it in /etc/sysctl.d/)",
        ),
        libc::EPERM if disabled.as_deref() == Some("1") && seccomp != "2" => {
            let group = group.as_deref().unwrap_or_default();
            write!(
                f,
                "io_uring is restricted: io_uring_setup failed with EPERM and sysctl \
                 kernel.io_uring_disabled = 1 (only members of group id {group} from \
                 kernel.io_uring_group may use it); fix: add the broker's user to that \
                 group or sysctl -w kernel.io_uring_disabled=0"
            )
        }
        libc::EPERM | libc::EACCES | libc::ENOSYS if seccomp == "2" => write!(
            f,
            "io_uring is blocked by a seccomp filter: io_uring_setup failed with {} \
             (Seccomp: 2 in /proc/self/status; Docker 25+ and containerd block io_uring by \
             default); fix: {seccomp_fix}",
            errno_name(e)
        ),
        libc::ENOSYS => write!(
            f,
            "io_uring is not available: io_uring_setup failed with ENOSYS on kernel \
             {release} (built without CONFIG_IO_URING, or a sandbox such as gVisor); fix: \
             run on Linux 5.8 or newer with io_uring, or {seccomp_fix}"
        ),
        libc::ENOMEM => write!(
            f,
            "io_uring_setup failed with ENOMEM on kernel {release} (before 5.12 rings count \
             against the locked-memory limit, now {}); fix: raise it (ulimit -l unlimited; \
             systemd LimitMEMLOCK=infinity; docker --ulimit memlock=-1)",
            fmt_limit(memlock)
        ),
        _ => write!(
            f,
            "io_uring is not available: io_uring_setup failed with {} on kernel {release} \
             (kernel.io_uring_disabled = {}, Seccomp = {}); fix: allow io_uring: sysctl -w \
             kernel.io_uring_disabled=0, or {seccomp_fix}",
            errno_name(e),
            disabled.as_deref().unwrap_or("n/a"),
            if seccomp.is_empty() { "n/a" } else { seccomp }
        ),
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go's runtime does at the start
/// of every program (nsqd included, since Go 1.19): each connection and each active
/// topic takes descriptors, and the usual soft default of 1024 runs out at a few hundred
/// topics. Returns (old, new) when it raised it, `None` when it was already at the hard
/// limit or could not be read or set (the process then runs with what it has).
pub fn raise_nofile_limit() -> Option<(u64, u64)> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one rlimit into `rl`, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return None;
    }
    if rl.rlim_cur >= rl.rlim_max {
        return None;
    }
    let old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    // SAFETY: setrlimit(2) reads one rlimit from `rl`, which outlives the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
        return None;
    }
    Some((old, rl.rlim_max))
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX` for unlimited).
fn memlock_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one rlimit into `rl`, which outlives the call.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    if r != 0 {
        return None;
    }
    Some(if rl.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        rl.rlim_cur
    })
}

/// Whether the process has CAP_IPC_LOCK (bit 14 of CapEff), which exempts its io_uring
/// registrations from the locked-memory limit.
fn has_ipc_lock() -> bool {
    proc_status("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

fn fmt_limit(bytes: u64) -> String {
    if bytes == u64::MAX {
        "unlimited".into()
    } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes / 1024)
    }
}

/// The fix for a locked-memory limit, sized for `need` bytes.
fn memlock_fix(need: u64) -> String {
    let mib = need.div_ceil(1 << 20);
    format!(
        "fix: ulimit -l {} (or unlimited) in the shell that starts nsqd; systemd: \
         LimitMEMLOCK={mib}M (or infinity) in the unit; docker: --ulimit memlock={}:{} \
         (bytes, or -1 for unlimited)",
        mib * 1024,
        mib << 20,
        mib << 20
    )
}

/// Errors when glommio cannot start at all; warns when the shards' I/O buffers cannot all
/// be registered (glommio then uses unregistered buffers: slower storage I/O).
fn memlock(shards: usize) -> Result<Option<String>, Problem> {
    let Some(limit) = memlock_limit() else {
        return Ok(None);
    };
    let need = MEMLOCK_PER_SHARD * shards as u64;
    if limit < GLOMMIO_MIN_MEMLOCK {
        return Err(Problem::Memlock { limit, shards });
    }
    if limit < need && !has_ipc_lock() {
        return Ok(Some(format!(
            "locked-memory limit (RLIMIT_MEMLOCK) is {}, below the {} that --shards={shards} \
             register with io_uring ({} per shard, counted per user): storage I/O falls back \
             to unregistered buffers (slower); {}",
            fmt_limit(limit),
            fmt_limit(need),
            fmt_limit(MEMLOCK_PER_SHARD),
            memlock_fix(need)
        )));
    }
    Ok(None)
}

/// Warns when there are more shards than CPUs this process may use (its affinity set,
/// and its cgroup CPU quota as `available_parallelism` reads it).
fn cpus(shards: usize) -> Option<String> {
    let affinity = crate::runtime::allowed_cpus().len();
    let usable = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(affinity)
        .min(affinity);
    (shards > usable).then(|| {
        let list = proc_status("Cpus_allowed_list").unwrap_or_default();
        format!(
            "--shards={shards} is more than the {usable} CPUs this process may use \
             (Cpus_allowed_list {list}, and any cgroup CPU quota): shards share CPUs \
             (slower); fix: --shards={usable} or give the process more CPUs (taskset, \
             systemd CPUAffinity=, docker --cpuset-cpus/--cpus)"
        )
    })
}

/// Checks the data path and takes its lock (nsqd: dirlock, `.nsqd.lock` here).
/// A full disk (ENOSPC, or EDQUOT for a quota) is a warning, not a refusal: the broker
/// starts, serves what it holds (consumers drain the backlog that filled the disk) and
/// refuses publishes it cannot store until space frees, as nsqd does.
fn data_dir(
    path: &Path,
    warnings: &mut Vec<String>,
    created: &mut Vec<PathBuf>,
) -> Result<File, Problem> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => return Err(Problem::DataPathNotDir(path.to_path_buf())),
        Ok(_) => {}
        Err(_) => {
            // The directories about to be created, deepest first.
            let missing: Vec<PathBuf> = path
                .ancestors()
                .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
                .map(Path::to_path_buf)
                .collect();
            if let Err(error) = std::fs::create_dir_all(path) {
                return Err(Problem::DataPathCreate {
                    path: path.to_path_buf(),
                    error,
                });
            }
            created.extend(missing);
        }
    }
    let probe = path.join(format!(".nsqd.preflight.{}", std::process::id()));
    let written = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"nsqd preflight\n"));
    let _ = std::fs::remove_file(&probe);
    let written = match written {
        Err(error) if !is_disk_full(&error) => {
            return Err(Problem::DataPathNotWritable {
                path: path.to_path_buf(),
                error,
            })
        }
        w => w,
    };
    if let Err(e) = written {
        warnings.push(format!(
            "--data-path={shown} is full ({e}): serving what it holds; publishes are refused until space frees"
        ));
    }
    let lock_path = path.join(".nsqd.lock");
    if !lock_path.exists() {
        created.insert(0, lock_path.clone());
    }
    // flock needs no write access: a lock file left by another user (a root-run broker
    // before the package's user existed) is opened read-only rather than refused.
    let lock = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied if lock_path.is_file() => File::open(&lock_path),
            _ => Err(e),
        })
        .map_err(|error| Problem::LockFile {
            path: path.to_path_buf(),
            lock: lock_path.clone(),
            error,
        })?;
    if let Err(holder) = lock_waiting_for_exit(&lock) {
        return Err(Problem::Locked {
            path: path.to_path_buf(),
            holder,
        });
    }
    Ok(lock)
}

/// Takes an exclusive flock on `f`. After a kill -9 the dead broker keeps its locks until
/// the kernel has torn down its io_uring instances (tens of milliseconds): a holder that
/// is exiting is waited for (up to [`LOCK_RETRY`]), as a supervisor's immediate restart
/// needs; one that is running is not. Err carries the holder's pid when known.
pub(crate) fn lock_waiting_for_exit(f: &File) -> Result<(), Option<u32>> {
    let deadline = Instant::now() + LOCK_RETRY;
    while f.try_lock().is_err() {
        let holder = lock_holder(f);
        if Instant::now() < deadline && holder.is_none_or(process_exiting) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        return Err(holder);
    }
    Ok(())
}

/// How long a data-path lock held by an exiting process is waited for.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// True when process `pid` is gone or exiting (PF_EXITING in /proc/PID/stat's flags, or
/// a zombie): its locks are about to be released.
fn process_exiting(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return false;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().copied().unwrap_or("");
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    const PF_EXITING: u64 = 0x4;
    state == "Z" || state == "X" || flags & PF_EXITING != 0
}

/// The pid holding a flock on `f`, from /proc/locks (`1: FLOCK ADVISORY WRITE <pid>
/// <maj>:<min>:<inode> 0 EOF`).
fn lock_holder(f: &File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let ino = f.metadata().ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let mut out = None;
    for line in locks.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let inode = fields.get(5).and_then(|d| d.rsplit(':').next());
        if fields.get(1) == Some(&"FLOCK") && inode == Some(&ino.to_string()) {
            out = fields.get(4).and_then(|p| p.parse().ok());
        }
    }
    out
}

/// Binds `addr` as the runtime will serve it (not listening yet), with a fix hint on
/// failure.
fn listener(
    addr: &str,
    flag: &'static str,
    retry_until: Instant,
) -> Result<(SocketAddr, socket2::Socket), Problem> {
    crate::runtime::bind(addr, retry_until).map_err(|error| Problem::Bind {
        error,
        addr: addr.to_string(),
        flag,
    })
}

fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(28) | Some(122))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_format() {
        assert_eq!(fmt_limit(64 * 1024), "64 KiB");
        assert_eq!(fmt_limit(MEMLOCK_PER_SHARD * 2), "60 MiB");
        assert_eq!(fmt_limit(u64::MAX), "unlimited");
        assert!(memlock_fix(MEMLOCK_PER_SHARD).contains("LimitMEMLOCK=30M"));
        assert!(memlock_fix(MEMLOCK_PER_SHARD).contains("ulimit -l 30720"));
    }

    #[test]
    fn io_uring_lines_name_the_cause() {
        let l = io_uring_unavailable_facts(libc::ENOSYS).to_string();
        assert!(l.contains("ENOSYS") && l.contains("fix:"), "{l}");
    }
}
