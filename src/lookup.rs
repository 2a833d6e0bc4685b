//! Registration with nsqlookupd (nsqd: lookup.go, lookup_peer.go), protocol V1.
//!
//! Shard 0 owns one connection per `--lookupd-tcp-address`. Every shard reports its topic
//! and channel creations and deletions ([`nsq_shards::shard::LookupEvent`]); the other
//! shards forward theirs to shard 0 through the mesh. Shard 0 keeps the set of
//! registrations, so that after a (re)connect it can IDENTIFY and REGISTER everything
//! again, as nsqd does.
//!
//! ```text
//! nsqd -> lookupd   "  V1"
//!                   IDENTIFY\n[int32 len]{"broadcast_address":..,"hostname":..,
//!                                         "http_port":..,"tcp_port":..,"version":"1.3.0"}
//!                   REGISTER <topic>[ <channel>]\n   UNREGISTER <topic>[ <channel>]\n
//!                   PING\n  (every 15 s)
//! lookupd -> nsqd   [int32 size][data]   (OK, JSON, or "E_... text")
//! ```

use crate::server::Server;
use crate::tcp::SharedStream;
use glommio::net::TcpStream;
use nsq_shards::shard::LookupEvent;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

/// nsqd pings every lookupd every 15 s.
const PING_INTERVAL: Duration = Duration::from_secs(15);
/// nsqd's dial timeout and per-read/write deadline.
const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// The V1 command line for an event.
pub fn command(ev: &LookupEvent) -> String {
    match ev {
        LookupEvent::Register(t, None) => format!("REGISTER {t}\n"),
        LookupEvent::Register(t, Some(c)) => format!("REGISTER {t} {c}\n"),
        LookupEvent::Unregister(t, None) => format!("UNREGISTER {t}\n"),
        LookupEvent::Unregister(t, Some(c)) => format!("UNREGISTER {t} {c}\n"),
    }
}

/// The IDENTIFY body nsqd sends (Go marshals a map, so keys are sorted).
pub fn identify_body(server: &Server) -> Vec<u8> {
    let c = &server.cfg;
    let tcp_port = if c.broadcast_tcp_port != 0 {
        c.broadcast_tcp_port
    } else {
        server.tcp_port
    };
    let http_port = if c.broadcast_http_port != 0 {
        c.broadcast_http_port
    } else {
        server.http_port
    };
    let mut m = BTreeMap::new();
    m.insert(
        "broadcast_address",
        serde_json::Value::from(c.broadcast_address.clone()),
    );
    m.insert("hostname", c.hostname.clone().into());
    m.insert("http_port", http_port.into());
    m.insert("tcp_port", tcp_port.into());
    m.insert("version", crate::protocol::identify::VERSION.into());
    serde_json::to_vec(&m).unwrap_or_default()
}

/// Registrations known to shard 0: topic -> channels.
#[derive(Default)]
pub struct Registry {
    topics: BTreeMap<String, BTreeSet<String>>,
}

impl Registry {
    pub fn apply(&mut self, ev: &LookupEvent) {
        match ev {
            LookupEvent::Register(t, None) => {
                self.topics.entry(t.clone()).or_default();
            }
            LookupEvent::Register(t, Some(c)) => {
                self.topics.entry(t.clone()).or_default().insert(c.clone());
            }
            LookupEvent::Unregister(t, None) => {
                self.topics.remove(t);
            }
            LookupEvent::Unregister(t, Some(c)) => {
                if let Some(chs) = self.topics.get_mut(t) {
                    chs.remove(c);
                }
            }
        }
    }

    /// What a fresh connection registers: `REGISTER t` for a topic without channels,
    /// otherwise `REGISTER t c` per channel.
    pub fn snapshot(&self) -> Vec<LookupEvent> {
        let mut out = Vec::new();
        for (t, chs) in &self.topics {
            if chs.is_empty() {
                out.push(LookupEvent::Register(t.clone(), None));
            }
            for c in chs {
                out.push(LookupEvent::Register(t.clone(), Some(c.clone())));
            }
        }
        out
    }
}

/// One lookupd peer: a lazily (re)connected V1 connection.
struct Peer {
    addr: String,
    conn: Option<SharedStream>,
}

async fn read_response(s: &SharedStream) -> std::io::Result<Vec<u8>> {
    let mut hdr = [0u8; 4];
    read_exact(s, &mut hdr).await?;
    let n = u32::from_be_bytes(hdr) as usize;
    if n > 5 * 1024 * 1024 {
        return Err(std::io::Error::other("response too big"));
    }
    let mut data = vec![0u8; n];
    read_exact(s, &mut data).await?;
    Ok(data)
}

async fn read_exact(s: &SharedStream, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = s.read(buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf = &mut buf[n..];
    }
    Ok(())
}

impl Peer {
    async fn connect(&mut self, server: &Server, registry: &Registry) -> std::io::Result<()> {
        log::info!("LOOKUP connecting to {}", self.addr);
        let stream = TcpStream::connect_timeout(self.addr.as_str(), IO_TIMEOUT)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let s = SharedStream::new(stream);
        s.set_read_timeout(Some(IO_TIMEOUT));
        s.set_write_timeout(Some(IO_TIMEOUT));
        let body = identify_body(server);
        let mut msg = b"  V1IDENTIFY\n".to_vec();
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes());
        msg.extend_from_slice(&body);
        s.write_all(&msg).await?;
        let resp = read_response(&s).await?;
        if resp == b"E_INVALID" {
            return Err(std::io::Error::other("lookupd returned E_INVALID"));
        }
        log::info!(
            "LOOKUPD({}): peer info {}",
            self.addr,
            String::from_utf8_lossy(&resp)
        );
        self.conn = Some(s);
        for ev in registry.snapshot() {
            let cmd = command(&ev);
            log::info!("LOOKUPD({}): {}", self.addr, cmd.trim_end());
            self.send(cmd.as_bytes()).await?;
        }
        Ok(())
    }

    async fn send(&mut self, cmd: &[u8]) -> std::io::Result<Vec<u8>> {
        let Some(s) = self.conn.clone() else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        let r = async {
            s.write_all(cmd).await?;
            read_response(&s).await
        }
        .await;
        if r.is_err() {
            s.shutdown();
            self.conn = None;
        }
        r
    }

    /// Sends `cmd` (or nothing, just connecting), connecting first if needed; any I/O
    /// error closes the connection and the next command reconnects.
    async fn command(&mut self, server: &Server, registry: &Registry, cmd: Option<&[u8]>) {
        if self.conn.is_none() {
            if let Err(e) = self.connect(server, registry).await {
                log::error!("LOOKUPD({}): connect - {e}", self.addr);
                self.conn = None;
                return;
            }
        }
        if let Some(cmd) = cmd {
            if let Err(e) = self.send(cmd).await {
                log::error!(
                    "LOOKUPD({}): {} - {e}",
                    self.addr,
                    String::from_utf8_lossy(cmd).trim_end()
                );
            }
        }
    }
}

/// Shard 0's lookup loop: applies events from every shard to the registry and to every
/// peer, and pings every 15 s.
pub async fn lookup_loop(server: Rc<Server>) {
    let inbox = &server.shard.lookup_events;
    let mut registry = Registry::default();
    let mut peers: Vec<Peer> = server
        .cfg
        .lookupd_tcp_addresses
        .iter()
        .map(|a| Peer {
            addr: a.clone(),
            conn: None,
        })
        .collect();
    for p in &peers {
        log::info!("LOOKUP({}): adding peer", p.addr);
    }
    for p in peers.iter_mut() {
        p.command(&server, &registry, None).await;
    }
    let mut next_ping = std::time::Instant::now() + PING_INTERVAL;
    loop {
        let events: Vec<LookupEvent> = std::mem::take(&mut *inbox.borrow_mut());
        for ev in &events {
            registry.apply(ev);
            let cmd = command(ev);
            for p in peers.iter_mut() {
                log::info!("LOOKUPD({}): {}", p.addr, cmd.trim_end());
                p.command(&server, &registry, Some(cmd.as_bytes())).await;
            }
        }
        if !inbox.borrow().is_empty() {
            continue;
        }
        let now = std::time::Instant::now();
        if now >= next_ping {
            for p in peers.iter_mut() {
                p.command(&server, &registry, Some(b"PING\n")).await;
            }
            next_ping = now + PING_INTERVAL;
        }
        let wake = std::pin::pin!(server.shard.lookup_wake.wait());
        let stop = std::pin::pin!(server.shard.shutdown.wait());
        let sleep = std::pin::pin!(glommio::timer::sleep(
            next_ping.saturating_duration_since(now)
        ));
        let first = futures::future::select(wake, stop);
        if let futures::future::Either::Left((futures::future::Either::Right(_), _)) =
            futures::future::select(first, sleep).await
        {
            break;
        }
    }
}
