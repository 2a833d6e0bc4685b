//! Name lookups off the shard threads and off glommio's blocking pool.
//!
//! `getaddrinfo` can block for seconds (a name that does not resolve, a resolver that
//! does not answer). On a shard's executor thread that would stall every client of the
//! shard; on glommio's blocking pool it would queue the shard's file work (meta.json
//! writes, fsyncs, store opens) behind the lookups: with 100-300 AUTHs waiting on an
//! auth server name that does not resolve, a `/channel/create` would wait 10-60 s. Each lookup here runs on a thread of its own (as
//! Go's resolver runs each in a goroutine), at most [`MAX_IN_FLIGHT`] at once; the caller
//! waits without blocking its executor.

use crate::offload::{off_executor, OffloadError, Slots};
use std::net::{SocketAddr, ToSocketAddrs};

/// Why a name did not resolve. `Display`: the resolver's message, `no address`, or the
/// lookup thread's failure.
#[derive(Debug)]
pub enum LookupError {
    /// The resolver failed (`getaddrinfo`'s error).
    Resolver(std::io::Error),
    /// The name resolved to no address.
    NoAddress,
    /// The lookup's thread could not run it.
    Thread(OffloadError),
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LookupError::Resolver(e) => e.fmt(f),
            LookupError::NoAddress => f.write_str("no address"),
            LookupError::Thread(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LookupError {}

/// Lookups running at once, process-wide; a further one waits for a slot.
pub const MAX_IN_FLIGHT: usize = 128;

/// The name lookups' slots.
static LOOKUPS: Slots = Slots::new(MAX_IN_FLIGHT);

/// Resolves `host:port` (an IP address without a lookup) to its first address.
/// Errors: the resolver's message, or `no address`.
pub async fn lookup(host: &str, port: u16) -> Result<SocketAddr, LookupError> {
    lookup_with(host, port, system_lookup).await
}

/// The system resolver (`getaddrinfo`): the first address of `host:port`.
fn system_lookup(host: &str, port: u16) -> Result<SocketAddr, LookupError> {
    (host, port)
        .to_socket_addrs()
        .map_err(LookupError::Resolver)
        .and_then(|mut a| a.next().ok_or(LookupError::NoAddress))
}

async fn lookup_with(
    host: &str,
    port: u16,
    resolver: fn(&str, u16) -> Result<SocketAddr, LookupError>,
) -> Result<SocketAddr, LookupError> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let h = host.to_string();
    off_executor("dns", &LOOKUPS, move || resolver(&h, port))
        .await
        .map_err(LookupError::Thread)
        .and_then(|r| r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn addresses_and_names_resolve_without_the_blocking_pool() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async {
                assert_eq!(
                    lookup("127.0.0.1", 80).await.ok(),
                    Some("127.0.0.1:80".parse().unwrap())
                );
                let local = lookup("localhost", 81).await.unwrap();
                assert!(local.ip().is_loopback() && local.port() == 81, "{local}");
                assert!(lookup("name.that.does.not.resolve.invalid", 1)
                    .await
                    .is_err());
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// Lookups that hang (a name whose resolver does not answer) leave glommio's
    /// blocking pool, which the shard's file work uses, free: a blocking call made
    /// while 40 slow lookups wait is done before any of them (in the pool, the
    /// file work would queue behind them for 10-60 s).
    #[test]
    fn slow_lookups_do_not_hold_the_blocking_pool() {
        fn slow(_: &str, port: u16) -> Result<SocketAddr, LookupError> {
            std::thread::sleep(Duration::from_millis(500));
            Ok(SocketAddr::from(([10, 0, 0, 1], port)))
        }
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async {
                let done = std::rc::Rc::new(std::cell::Cell::new(0));
                let tasks: Vec<_> = (0..40)
                    .map(|i| {
                        let done = done.clone();
                        glommio::spawn_local(async move {
                            let a = lookup_with("slow.example", i, slow).await;
                            assert_eq!(a.ok(), Some(SocketAddr::from(([10, 0, 0, 1], i))));
                            done.set(done.get() + 1);
                        })
                    })
                    .collect();
                glommio::timer::sleep(Duration::from_millis(50)).await;
                glommio::executor().spawn_blocking(|| ()).await;
                assert_eq!(done.get(), 0, "the blocking call waited for lookups");
                for t in tasks {
                    t.await;
                }
                assert_eq!(done.get(), 40);
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
