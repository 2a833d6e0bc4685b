//! nsqlookupd: the directory service of an NSQ topology (nsqlookupd/ upstream).
//!
//! nsqd instances connect over TCP protocol V1 ([`protocol_v1`]) and register the topics
//! and channels they hold in the [`registration_db`]; consumers and nsqadmin ask the HTTP
//! API ([`http`]) which nsqd has a topic. It is not on the message path, so it runs on
//! plain threads: one accept loop per listener and one thread per connection.
//!
//! The wire formats are the runtime-free `nsq-wire` crate's: the V1 codec
//! (`nsq_wire::lookupd_v1`; [`protocol_v1`] is the server around it), HTTP/1.1 status
//! lines and query decoding (`nsq_wire::http1`), names, Go durations and JSON strings.
//! This crate does not depend on nsqd or the broker core.

#![forbid(unsafe_code)]

pub mod config;
pub mod http;
pub use nsq_wire::logger;
pub mod protocol_v1;
pub mod registration_db;

use registration_db::RegistrationDb;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

/// The version nsqlookupd reports (/info, IDENTIFY).
pub const VERSION: &str = "1.3.0";

/// Settings (nsqlookupd: options.go).
#[derive(Debug, Clone)]
pub struct Options {
    pub tcp_address: String,
    pub http_address: String,
    /// Sent back in IDENTIFY; nsqd uses it with http_port for /channels queries.
    pub broadcast_address: String,
    /// A producer that has not pinged for this long is left out of /lookup and /nodes.
    pub inactive_producer_timeout: Duration,
    /// How long a tombstone hides a producer from /lookup.
    pub tombstone_lifetime: Duration,
}

/// State shared by every connection thread.
pub struct Context {
    pub opts: Options,
    pub db: RegistrationDb,
    /// The bound addresses (the real ports when 0 was asked for).
    pub tcp_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The OS hostname, sent in IDENTIFY replies.
    pub hostname: String,
}

/// Why nsqlookupd could not start; `Display` is the text logged for it.
#[derive(Debug)]
pub enum StartError {
    /// `listen (ADDR) failed - <error>`.
    Listen { addr: String, error: std::io::Error },
    /// `listener address - <error>`: the bound address cannot be read.
    LocalAddress(std::io::Error),
    /// `cannot start NAME - <error>`: an accept thread could not start.
    Thread { name: String, error: std::io::Error },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Listen { addr, error } => write!(f, "listen ({addr}) failed - {error}"),
            StartError::LocalAddress(e) => write!(f, "listener address - {e}"),
            StartError::Thread { name, error } => write!(f, "cannot start {name} - {error}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A bound, not yet serving nsqlookupd.
pub struct NsqLookupd {
    ctx: Arc<Context>,
    tcp: TcpListener,
    http: TcpListener,
}

impl NsqLookupd {
    /// Binds both listeners. Errors read `listen (ADDR) failed - REASON`.
    pub fn new(opts: Options) -> Result<NsqLookupd, StartError> {
        log::info!("nsqlookupd v{VERSION} (built w/rust)");
        let bind = |a: &str| {
            TcpListener::bind(a).map_err(|error| StartError::Listen {
                addr: a.to_string(),
                error,
            })
        };
        let tcp = bind(&opts.tcp_address)?;
        let http = bind(&opts.http_address)?;
        let local = |l: &TcpListener| l.local_addr().map_err(StartError::LocalAddress);
        let ctx = Arc::new(Context {
            tcp_addr: local(&tcp)?,
            http_addr: local(&http)?,
            hostname: gethostname::gethostname().to_string_lossy().into_owned(),
            db: RegistrationDb::new(),
            opts,
        });
        Ok(NsqLookupd { ctx, tcp, http })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Starts the accept loops on their own threads and returns at once. Logs
    /// `TCP: listening on ADDR` and `HTTP: listening on ADDR`.
    pub fn start(self) -> Result<(), StartError> {
        let NsqLookupd { ctx, tcp, http } = self;
        log::info!("TCP: listening on {}", ctx.tcp_addr);
        log::info!("HTTP: listening on {}", ctx.http_addr);
        spawn_acceptor("lookupd-tcp", tcp, ctx.clone(), protocol_v1::handle)?;
        spawn_acceptor("lookupd-http", http, ctx, http::serve_conn)?;
        Ok(())
    }
}

fn spawn_acceptor(
    name: &str,
    listener: TcpListener,
    ctx: Arc<Context>,
    serve: fn(Arc<Context>, std::net::TcpStream),
) -> Result<(), StartError> {
    let conn_name = format!("{name}-conn");
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    let c = ctx.clone();
                    if let Err(e) = std::thread::Builder::new()
                        .name(conn_name.clone())
                        .spawn(move || serve(c, stream))
                    {
                        log::error!("cannot start a connection thread - {e}");
                    }
                }
                Err(e) => {
                    // Like Go's temporary Accept() failures (EMFILE...): back off, retry.
                    log::warn!("temporary Accept() failure - {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        })
        .map(|_| ())
        .map_err(|error| StartError::Thread {
            name: name.to_string(),
            error,
        })
}
