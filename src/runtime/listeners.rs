//! The listening sockets: bound exclusively once, before recovery, with a retry while a
//! previous instance still releases its address, and opened to connections only once every
//! address is bound (every shard then accepts on a duplicate).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Why a listening address could not be bound or opened.
#[derive(Debug)]
pub enum ListenError {
    /// `invalid address ADDR: <resolver error>`, or `invalid address ADDR` when it
    /// resolved to nothing.
    InvalidAddress {
        addr: String,
        error: Option<std::io::Error>,
    },
    /// A socket call failed: `listen (ADDR) failed - listen tcp ADDR: OP: <errno text>`,
    /// nsqd's line (Go's net.OpError, e.g. `bind: address already in use`).
    Go {
        addr: String,
        op: &'static str,
        error: std::io::Error,
    },
    /// Creating the socket or setting its options failed (the system's text).
    Socket(std::io::Error),
    /// `cannot read the listening address`.
    LocalAddress,
}

impl std::fmt::Display for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenError::InvalidAddress {
                addr,
                error: Some(e),
            } => write!(f, "invalid address {addr}: {e}"),
            ListenError::InvalidAddress { addr, error: None } => {
                write!(f, "invalid address {addr}")
            }
            ListenError::Go { addr, op, error } => {
                // Go's text for the errno: the system's, lower case, without Rust's
                // `(os error N)`.
                let text = error.to_string();
                let text = text
                    .split(" (os error")
                    .next()
                    .unwrap_or(&text)
                    .to_lowercase();
                write!(
                    f,
                    "listen ({addr}) failed - listen tcp {addr}: {op}: {text}"
                )
            }
            ListenError::Socket(e) => e.fmt(f),
            ListenError::LocalAddress => f.write_str("cannot read the listening address"),
        }
    }
}

impl std::error::Error for ListenError {}

/// How long a bind that finds its address in use is retried before giving up.
pub(crate) const BIND_RETRY: Duration = Duration::from_secs(2);

/// Binds `s` to `sa`, retrying until `deadline` (normally [`BIND_RETRY`] from start-up)
/// while the address is in use.
///
/// After a `kill -9`, the dead process's listening socket can stay bound for tens of
/// milliseconds while the kernel tears down its io_uring instances (pending accepts hold a
/// reference to it), so a supervisor's immediate restart would otherwise fail. An address
/// still taken after the retry fails with nsqd's message:
/// `listen (ADDR) failed - listen tcp ADDR: bind: address already in use`.
fn bind_retrying(
    s: &socket2::Socket,
    sa: &SocketAddr,
    addr: &str,
    deadline: Instant,
) -> Result<(), ListenError> {
    let mut logged = false;
    loop {
        match s.bind(&(*sa).into()) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                if !logged {
                    log::warn!(
                        "listen ({addr}): address in use; retrying for up to {:.1}s \
                         (a previous instance may still be releasing it)",
                        deadline
                            .saturating_duration_since(Instant::now())
                            .as_secs_f64()
                    );
                    logged = true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => {
                return Err(ListenError::Go {
                    addr: addr.to_string(),
                    op: "bind",
                    error,
                })
            }
        }
    }
}

/// Binds `addr` exclusively, as nsqd does (an address in use is an error, even if its
/// holder used SO_REUSEPORT); [`listen`] then opens it to connections. Every shard
/// accepts on a duplicate of this one socket, so the kernel hands each connection to one
/// idle shard.
pub(crate) fn bind(
    addr: &str,
    retry_until: Instant,
) -> Result<(SocketAddr, socket2::Socket), ListenError> {
    let invalid = |error| ListenError::InvalidAddress {
        addr: addr.to_string(),
        error,
    };
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| invalid(Some(e)))?
        .next()
        .ok_or_else(|| invalid(None))?;
    let domain = if sa.is_ipv6() {
        socket2::Domain::IPV6
    } else {
        socket2::Domain::IPV4
    };
    let s =
        socket2::Socket::new(domain, socket2::Type::STREAM, None).map_err(ListenError::Socket)?;
    // Go's listeners set SO_REUSEADDR (rebinding over TIME_WAIT), never SO_REUSEPORT.
    s.set_reuse_address(true).map_err(ListenError::Socket)?;
    bind_retrying(&s, &sa, addr, retry_until)?;
    let local = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or(ListenError::LocalAddress)?;
    Ok((local, s))
}

/// Starts listening on a socket [`bind`] bound to `addr`: only once every address is
/// bound, so a broker that then fails to start (another address taken) never had a
/// connection queued that its exit would reset (a client sees "connection refused"
/// meanwhile, and retries).
pub(crate) fn listen(addr: &str, s: &socket2::Socket) -> Result<(), ListenError> {
    s.listen(1024).map_err(|error| ListenError::Go {
        addr: addr.to_string(),
        op: "listen",
        error,
    })?;
    // Non-blocking for good: glommio toggles O_NONBLOCK around its first accept attempt,
    // and the file description (so its flags) is shared by every shard's duplicate.
    s.set_nonblocking(true).map_err(ListenError::Socket)
}
