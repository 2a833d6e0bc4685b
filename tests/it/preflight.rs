//! Preflight, as a user on a badly set up host sees it: the broker exits 1 before any
//! shard starts, with one `FATAL:` line per problem that names the value found and the
//! fix, and never a panic:
//! - a locked-memory limit below what glommio needs (`ulimit -l 64`, the default of many
//!   container runtimes);
//! - io_uring blocked by a seccomp filter (as Docker 25+ and containerd's default
//!   profiles do), installed here on the child alone; the `kernel.io_uring_disabled`
//!   sysctl is machine-wide, so it is tested by `scripts/preflight-io_uring-sysctl.sh`
//!   (root, restores the setting), not here;
//! - a data path that is a file or cannot be created, one that is not writable (when not
//!   root), one locked by another running broker (its pid named);
//! - a TCP or HTTP address in use; several problems at once give one line each;
//! - more shards than CPUs is only a warning: the broker starts.

use crate::common;

use common::*;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn temp_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("nsqd-preflight-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

fn nsqd(data_path: &std::path::Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqd"));
    cmd.arg("--tcp-address=127.0.0.1:0")
        .arg("--http-address=127.0.0.1:0")
        .arg(format!("--data-path={}", data_path.display()))
        .args(extra)
        .stdin(Stdio::null());
    cmd
}

/// How a run ended: its exit status and its stderr.
struct Output {
    status: std::process::ExitStatus,
    stderr: Vec<u8>,
}

/// Runs the command to its end through the harness's spawner (the preflight fails within a
/// few seconds; 60 s at most) and returns its exit status and stderr.
fn run(cmd: Command) -> Output {
    let mut d = Daemon::spawn_cmd(cmd);
    let status = d
        .wait_exit(std::time::Duration::from_secs(60))
        .unwrap_or_else(|| panic!("nsqd kept running: {}", d.log_text()));
    Output {
        status,
        stderr: d.stderr_text().into_bytes(),
    }
}

/// Asserts a failed preflight: exit 1, no panic, and returns the FATAL lines.
fn fatal_lines(out: &Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status; stderr:\n{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "a panic reached the user:\n{stderr}"
    );
    assert!(
        !stderr.contains("a shard failed to start"),
        "the old unexplained failure:\n{stderr}"
    );
    let lines: Vec<String> = stderr
        .lines()
        .filter(|l| l.contains("FATAL: "))
        .map(String::from)
        .collect();
    for l in &lines {
        assert!(l.contains("fix: "), "a FATAL line without its fix: {l}");
    }
    lines
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn low_memlock_limit_says_how_to_raise_it() {
    let dir = temp_path("memlock");
    // Lowering a limit needs no privilege, so this works as root and as any user.
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(r#"ulimit -l 64 && exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_nsqd"))
        .arg("--tcp-address=127.0.0.1:0")
        .arg("--http-address=127.0.0.1:0")
        .arg("--shards=2")
        .arg(format!("--data-path={}", dir.display()));
    let out = run(cmd);
    let lines = fatal_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let l = &lines[0];
    for want in [
        "locked-memory limit (RLIMIT_MEMLOCK) is 64 KiB",
        "needs at least 512 KiB",
        "60 MiB for --shards=2",
        "ulimit -l 61440",
        "LimitMEMLOCK=60M",
        "--ulimit memlock=",
    ] {
        assert!(l.contains(want), "missing {want:?} in {l}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A classic BPF seccomp filter answering `errno` to io_uring_setup, io_uring_enter and
/// io_uring_register (425-427 on every 64-bit architecture), allowing everything else:
/// what Docker's and containerd's default profiles do to io_uring.
fn block_io_uring(cmd: &mut Command, errno: u32) {
    use std::os::unix::process::CommandExt;
    const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS
    const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let stmt = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let filter = [
        stmt(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        stmt(JEQ_K, 3, 0, 425),
        stmt(JEQ_K, 2, 0, 426),
        stmt(JEQ_K, 1, 0, 427),
        stmt(RET_K, 0, 0, RET_ALLOW),
        stmt(RET_K, 0, 0, RET_ERRNO | errno),
    ];
    let filter = Box::leak(Box::new(filter));
    let prog = Box::leak(Box::new(libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    }));
    // An address, not a reference: pre_exec needs a Send closure.
    let prog = prog as *const libc::sock_fprog as usize;
    // SAFETY: the closure runs in the forked child before exec and makes only two prctl
    // system calls (async-signal-safe) on a filter that lives for the whole process.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn io_uring_blocked_by_seccomp_names_the_profile() {
    for (errno, name) in [
        (libc::EPERM as u32, "EPERM"),
        (libc::ENOSYS as u32, "ENOSYS"),
    ] {
        let dir = temp_path(&format!("seccomp-{name}"));
        let mut cmd = nsqd(&dir, &["--shards=2"]);
        block_io_uring(&mut cmd, errno);
        let out = run(cmd);
        let lines = fatal_lines(&out);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let l = &lines[0];
        for want in [
            "io_uring is blocked by a seccomp filter",
            name,
            "deploy/seccomp-io_uring.json",
            "seccompProfile",
        ] {
            assert!(l.contains(want), "missing {want:?} in {l}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn data_path_that_is_a_file_or_cannot_be_created() {
    let file = temp_path("file");
    std::fs::write(&file, b"not a directory").unwrap();
    let lines = fatal_lines(&run(nsqd(&file, &[])));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("is not a directory"), "{}", lines[0]);
    assert!(
        lines[0].contains(&file.display().to_string()),
        "{}",
        lines[0]
    );

    let under_file = file.join("data");
    let lines = fatal_lines(&run(nsqd(&under_file, &[])));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("does not exist and cannot be created"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("chown"), "{}", lines[0]);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn data_path_not_writable() {
    if is_root() {
        // Root writes through any mode bits; the file-as-path test covers root.
        common::skip("running as root, which writes through any mode bits");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_path("readonly");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).unwrap();
    let out = run(nsqd(&dir, &[]));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let lines = fatal_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("is not writable"), "{}", lines[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn data_path_locked_by_another_broker() {
    let first = Broker::start(1, &[]);
    let lines = fatal_lines(&run(nsqd(&first.data_dir, &[])));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("is locked by another running broker"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains(&format!("(pid {})", first.pid())),
        "the holder's pid: {}",
        lines[0]
    );
    // The first broker still serves.
    assert_eq!(first.http("GET", "/ping", b"").0, 200);
}

#[test]
fn ports_in_use_one_line_each() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let (t, h) = (tcp.local_addr().unwrap(), http.local_addr().unwrap());
    let dir = temp_path("ports");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqd"));
    cmd.arg(format!("--tcp-address={t}"))
        .arg(format!("--http-address={h}"))
        .arg(format!("--data-path={}", dir.display()));
    let lines = fatal_lines(&run(cmd));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains(&format!(
        "listen ({t}) failed - listen tcp {t}: bind: address already in use"
    )));
    assert!(lines[0].contains("--tcp-address"), "{}", lines[0]);
    assert!(lines[1].contains(&format!(
        "listen ({h}) failed - listen tcp {h}: bind: address already in use"
    )));
    assert!(lines[1].contains("--http-address"), "{}", lines[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn several_problems_at_once() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let file = temp_path("several");
    std::fs::write(&file, b"x").unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(r#"ulimit -l 64 && exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_nsqd"))
        .arg(format!("--tcp-address={}", tcp.local_addr().unwrap()))
        .arg("--http-address=127.0.0.1:0")
        .arg(format!("--data-path={}", file.display()));
    let lines = fatal_lines(&run(cmd));
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].contains("locked-memory limit"), "{lines:?}");
    assert!(lines[1].contains("is not a directory"), "{lines:?}");
    assert!(
        lines[2].contains("bind: address already in use"),
        "{lines:?}"
    );
    let _ = std::fs::remove_file(&file);
}

#[test]
fn more_shards_than_cpus_is_a_warning() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shards = cpus + 1;
    let b = Broker::start(shards, &[]);
    assert_eq!(b.http("GET", "/ping", b"").0, 200);
    let log = b.log_text();
    assert!(
        log.contains(&format!(
            "WARNING: --shards={shards} is more than the {cpus} CPUs"
        )),
        "{log}"
    );
    assert!(log.contains("fix: --shards="), "{log}");
}

#[test]
fn preflight_flag_checks_and_exits() {
    let dir = temp_path("flag");
    let out = run(nsqd(&dir, &["--preflight", "--shards=1"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("preflight: ok (1 shards"), "{stderr}");
    assert!(
        !stderr.contains("listening on"),
        "it must not serve: {stderr}"
    );
    // A check, not a start: a data path that did not exist does not exist afterwards
    // (created to be checked, then removed with its lock file).
    let absent = temp_path("flag-absent").join("a/b");
    assert!(!absent.exists());
    let out = run(nsqd(&absent, &["--preflight", "--shards=1"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("preflight: ok (1 shards"), "{stderr}");
    let top = absent.parent().unwrap().parent().unwrap();
    assert!(!top.exists(), "--preflight left {}", top.display());
    // An existing one keeps what it held, and gets no lock file.
    std::fs::create_dir_all(&absent).unwrap();
    std::fs::write(absent.join("keep"), b"x").unwrap();
    let out = run(nsqd(&absent, &["--preflight", "--shards=1"]));
    assert_eq!(out.status.code(), Some(0));
    let names: Vec<String> = std::fs::read_dir(&absent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["keep"]);
    let _ = std::fs::remove_dir_all(top);

    let file = temp_path("flag-file");
    std::fs::write(&file, b"x").unwrap();
    let lines = fatal_lines(&run(nsqd(&file, &["--preflight"])));
    assert_eq!(lines.len(), 1, "{lines:?}");
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_dir_all(&dir);
}
