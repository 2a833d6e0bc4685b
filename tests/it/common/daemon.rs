//! The one child-process spawner of the integration tests, for both daemons (`nsqd` of
//! this package and `nsqlookupd` of lookupd/): std only, so that lookupd/tests includes
//! this same file (`#[path = "../../tests/it/common/daemon.rs"] mod daemon;`).
//!
//! A [`Daemon`] is a child process whose stderr lines are collected into a shared log
//! (echoed too when `NSQD_TEST_LOG` is set); it is killed (SIGKILL) and reaped when
//! dropped, so a failing test leaves nothing behind.
//!
//! Tests wait for a daemon the way users and supervisors do: for the first moment its
//! ports answer a TCP connect, never for a log line. [`Daemon::start_listening`] picks two
//! free loopback ports, passes them as `--tcp-address`/`--http-address`, and polls both;
//! if the child exits first the test fails with its log, unless another process took one
//! of the ports in the meantime ("address already in use"), which is retried on fresh
//! ports.
#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a daemon may take to answer on its ports: generous, because CI runs many
/// daemons at once on two cores.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How many times [`Daemon::start_listening`] retries on fresh ports when a port it picked
/// was taken by someone else before the daemon bound it.
pub const PORT_RETRIES: usize = 3;

/// A running child process with its stderr collected line by line.
pub struct Daemon {
    pub child: Child,
    /// The program's file name, for failure messages.
    pub name: String,
    /// Every stderr line the process printed so far.
    pub log: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

/// Why a daemon never answered on its ports.
#[derive(Debug)]
pub enum StartError {
    /// The process exited first: its status and everything it printed.
    Exited(ExitStatus, String),
    /// Still running, but a port never answered within the time given.
    Timeout(SocketAddr, String),
}

impl StartError {
    /// The process exited because a port it was given was already taken.
    pub fn address_in_use(&self) -> bool {
        matches!(self, StartError::Exited(_, log) if log.contains("address already in use"))
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Exited(st, log) => {
                write!(f, "exited ({st}) before its ports answered; log:\n{log}")
            }
            StartError::Timeout(addr, log) => write!(f, "{addr} never answered; log:\n{log}"),
        }
    }
}

impl Daemon {
    /// Runs `bin args...` (stdout discarded, stderr collected) and returns at once.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(bin: impl AsRef<Path>, args: &[S]) -> Daemon {
        let mut cmd = Command::new(bin.as_ref());
        cmd.args(args);
        Daemon::spawn_cmd(cmd)
    }

    /// Runs a prepared command (for extra environment such as `NOTIFY_SOCKET`); stdout is
    /// discarded and stderr collected.
    pub fn spawn_cmd(mut cmd: Command) -> Daemon {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        let name = Path::new(cmd.get_program())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = log.clone();
        let reader = std::thread::spawn(move || {
            // Lines as bytes: a line that is not UTF-8 (a logged client input) must not
            // end the reading.
            let mut r = BufReader::new(stderr);
            let mut raw = Vec::new();
            loop {
                raw.clear();
                match r.read_until(b'\n', &mut raw) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if raw.last() == Some(&b'\n') {
                    raw.pop();
                }
                let line = String::from_utf8_lossy(&raw).into_owned();
                if std::env::var_os("NSQD_TEST_LOG").is_some() {
                    eprintln!("{line}");
                }
                log2.lock().unwrap().push(line);
            }
        });
        Daemon {
            child,
            name,
            log,
            reader: Some(reader),
        }
    }

    /// Starts a daemon that listens on `--tcp-address` and `--http-address`: picks two free
    /// loopback ports, runs `bin` with `--tcp-address=127.0.0.1:T --http-address=127.0.0.1:H`
    /// followed by `args`, and waits (up to [`START_TIMEOUT`]) until both ports accept a
    /// connection. Retries on fresh ports up to [`PORT_RETRIES`] times when a port was taken
    /// in the meantime; panics (test failure) with the daemon's log otherwise.
    pub fn start_listening<S: AsRef<std::ffi::OsStr>>(
        bin: impl AsRef<Path>,
        args: &[S],
    ) -> (Daemon, SocketAddr, SocketAddr) {
        Daemon::start_listening_with(|tcp, http| {
            let mut cmd = Command::new(bin.as_ref());
            cmd.arg(format!("--tcp-address={tcp}"))
                .arg(format!("--http-address={http}"))
                .args(args);
            cmd
        })
    }

    /// [`Daemon::start_listening`] with the command built by `make(tcp, http)` for each try.
    pub fn start_listening_with(
        make: impl FnMut(SocketAddr, SocketAddr) -> Command,
    ) -> (Daemon, SocketAddr, SocketAddr) {
        Daemon::start_listening_picking(|| (free_port(), free_port()), make)
    }

    /// [`Daemon::start_listening_with`] with the (TCP, HTTP) ports of each try chosen by
    /// `pick` (the harness's own tests hand it a taken port first).
    pub fn start_listening_picking(
        mut pick: impl FnMut() -> (u16, u16),
        mut make: impl FnMut(SocketAddr, SocketAddr) -> Command,
    ) -> (Daemon, SocketAddr, SocketAddr) {
        let mut attempt = 0;
        loop {
            let (tcp, http) = pick();
            let (tcp, http) = (loopback(tcp), loopback(http));
            let mut d = Daemon::spawn_cmd(make(tcp, http));
            match d.wait_for_ports(&[tcp, http], START_TIMEOUT) {
                Ok(()) => return (d, tcp, http),
                Err(e) if e.address_in_use() && attempt < PORT_RETRIES => attempt += 1,
                Err(e) => panic!("{} (pid {}) did not start: {e}", d.name, d.pid()),
            }
        }
    }

    /// Waits until every address accepts a TCP connection (polled every 2 ms). Fails when
    /// the process exits first or `within` passes; the process is killed on failure.
    pub fn wait_for_ports(
        &mut self,
        addrs: &[SocketAddr],
        within: Duration,
    ) -> Result<(), StartError> {
        let deadline = Instant::now() + within;
        let mut foreign_seen = false;
        for &addr in addrs {
            loop {
                if let Some(st) = self.exited() {
                    return Err(StartError::Exited(st, self.final_log()));
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                    // The port answers; but while the daemon still retries a bind (a port
                    // taken since it was picked: the broker retries for 2 s), the answer
                    // may come from whoever holds it, e.g. another test's daemon, which
                    // that test may then kill under this one's connections.
                    if listens_on(self.pid(), addr).unwrap_or(true) {
                        break;
                    }
                    if !foreign_seen {
                        eprintln!(
                            "{addr} answered, but not from {} (pid {}): still waiting",
                            self.name,
                            self.pid()
                        );
                        foreign_seen = true;
                    }
                }
                if Instant::now() >= deadline {
                    self.kill9();
                    return Err(StartError::Timeout(addr, self.log_text()));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Ok(())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (and with what status), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends signal `sig` (e.g. 15 for SIGTERM) to the process.
    pub fn signal(&self, sig: i32) {
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status();
    }

    /// Waits up to `within` for the process to exit.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits for the exit status (up to `within`, then SIGKILL and
    /// `None`).
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        self.signal(15);
        let st = self.wait_exit(within);
        if st.is_none() {
            self.kill9();
        }
        st
    }

    /// `kill -9` and reap: the process is gone (its ports released by the kernel) when
    /// this returns.
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// Every log line so far, joined by newlines.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The whole stderr of an exited process as it printed it: [`Daemon::final_log`] with
    /// every line ended by a newline.
    pub fn stderr_text(&mut self) -> String {
        self.final_log();
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// Every log line so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Whether some log line so far contains `needle`.
    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// The whole log of an exited process: waits (up to 30 s) for the reader to reach the
    /// end of its stderr.
    pub fn final_log(&mut self) -> String {
        if let Some(r) = self.reader.take() {
            // The reader ends at the pipe's EOF, soon after the process has exited; on
            // a loaded machine its last lines can take seconds to come through.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !r.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if r.is_finished() {
                let _ = r.join();
            }
        }
        self.log_text()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A loopback port that was free a moment ago (bound to port 0, then released).
/// Whether process `pid` holds the socket listening on `addr`'s port (Linux: the
/// listening socket's inode in `/proc/net/tcp{,6}` among the process's fds). `None` when
/// `/proc` cannot tell (then the caller trusts the connect).
pub fn listens_on(pid: u32, addr: SocketAddr) -> Option<bool> {
    let mut inodes = Vec::new();
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        // "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid
        // timeout inode ...": local "0100007F:1F90", state 0A is LISTEN.
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = f
                .get(1)
                .and_then(|l| l.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if port == Some(addr.port()) && f.get(3) == Some(&"0A") {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    if !readable {
        return None;
    }
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .map(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
            .unwrap_or(false)
    }))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A free loopback port below the kernel's ephemeral range (32768-60999 on Linux), for
/// an address a test must fix before the process that binds it starts (a cluster
/// member's `--cluster-address`, named in the other members' flags): no other test's
/// [`free_port`] can be handed it meanwhile, as it could an ephemeral one.
pub fn reserved_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const LOW: u32 = 20000;
    const SPAN: u32 = 12000;
    let start = (std::process::id() % 600) * 20;
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let port = (LOW + (start + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Polls `addr` every millisecond until a TCP connect succeeds (the first moment the
/// port answers, as a client or a supervisor's health check sees it) and returns that
/// connection. Panics after `within`.
pub fn wait_for_port(addr: SocketAddr, within: Duration) -> TcpStream {
    let deadline = Instant::now() + within;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
            Ok(s) => return s,
            Err(e) => {
                assert!(Instant::now() < deadline, "{addr} never answered: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Reads `s` until the peer ends the connection: what arrived, and how it ended, `"FIN"`
/// (a clean close) or `"reset"`. Any other error (a read timeout) fails the test with
/// `what` and the bytes so far.
pub fn read_until_closed(s: &mut TcpStream, what: &str) -> (Vec<u8>, &'static str) {
    use std::io::Read;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, "FIN"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, "reset"),
            Err(e) => panic!("{what}: {e} after {:?}", String::from_utf8_lossy(&got)),
        }
    }
}
