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
use nsq_shards::node::{NodeUpdate, PeerList};
use nsq_shards::shard::LookupEvent;
use nsq_wire::lookupd_v1;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// nsqd's dial timeout and per-read/write deadline.
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// First wait before redialling a lookupd that could not be reached; it doubles on every
/// failure up to [`MAX_BACKOFF`] and is reset by a successful connect.
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(15);

// The run-time peer list (`PUT /config/nsqlookupd_tcp_addresses`) and the lookupd HTTP
// addresses are node-wide settings: every shard has a copy, shard 0 owns them and makes
// every change (see `nsq_shards::node`). `None` until the first change: the command
// line's list. `Some(None)` is a JSON `null` body (Go then reports `null`).

fn peer_config(server: &Server) -> PeerList {
    match server.shard.node.lookupd_tcp_addresses() {
        Some(v) => v,
        // A config file's nil list stays `null` (nsqd: go-options coerceStringSlice).
        None => match server.cfg.option("nsqlookupd_tcp_addresses") {
            Some(crate::config_file::GoValue::StrList(None)) => None,
            _ => Some(server.cfg.flags.lookupd_tcp_address.clone()),
        },
    }
}

/// The current `nsqlookupd_tcp_addresses` as /config reports it (a JSON array, or `null`).
pub fn peer_addresses_json(server: &Server) -> serde_json::Value {
    serde_json::json!(peer_config(server))
}

/// The current lookupd TCP addresses.
pub fn peer_addresses(server: &Server) -> Vec<String> {
    peer_config(server).unwrap_or_default()
}

/// Replaces the lookupd peer list and wakes shard 0's lookup loop, which adds and
/// removes peers to match (nsqd: swapOpts + triggerOptsNotification).
pub async fn set_peer_addresses(server: &Server, addrs: PeerList) {
    server
        .change_node_settings(NodeUpdate::LookupdTcpAddresses(addrs))
        .await;
}

/// Records (or, with `None`, forgets) a peer's HTTP address on every shard (nsqd:
/// lookupdHTTPAddrs; shard 0 learns them from each peer's IDENTIFY answer).
async fn set_lookupd_http(server: &Server, peer: &str, http: Option<String>) {
    let peer = peer.to_string();
    server
        .change_node_settings(NodeUpdate::LookupdHttp { peer, http })
        .await;
}

/// What nsqd reads from lookupd's IDENTIFY response (nsqd: lookup_peer.go peerInfo).
/// Go leaves missing and `null` fields at zero and ignores unknown keys.
#[derive(serde::Deserialize, Debug, Default)]
struct PeerInfo {
    #[serde(default)]
    tcp_port: Option<i64>,
    #[serde(default)]
    http_port: Option<i64>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    broadcast_address: Option<String>,
}

/// Go's `net.JoinHostPort`: an IPv6 host (any host with a colon) in brackets.
fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The channels every lookupd knows for `topic` (nsqd: ClusterInfo.GetLookupdTopicChannels):
/// `GET http://<addr>/channels?topic=<topic>` on all of them at once, the union sorted.
/// `Err` when none answered; otherwise the channels and, when some failed, their errors.
pub async fn lookupd_topic_channels(
    cfg: &crate::auth::AuthConfig,
    topic: &str,
    addrs: &[String],
) -> Result<(Vec<String>, Option<String>), String> {
    #[derive(serde::Deserialize)]
    struct Resp {
        #[serde(default)]
        channels: Option<Vec<String>>,
    }
    let queries = addrs.iter().map(|addr| async move {
        let endpoint = format!(
            "http://{addr}/channels?topic={}",
            crate::auth::query_escape(topic.as_bytes())
        );
        log::info!("CI: querying nsqlookupd {endpoint}");
        let body = crate::auth::timed_request(cfg, &endpoint, None)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice::<Resp>(&body)
            .map(|r| r.channels.unwrap_or_default())
            .map_err(|e| {
                format!(
                    "JSON unmarshal error {e} - {}",
                    String::from_utf8_lossy(&body)
                )
            })
    });
    let mut channels = BTreeSet::new();
    let mut errs = Vec::new();
    for r in futures::future::join_all(queries).await {
        match r {
            Ok(c) => channels.extend(c),
            Err(e) => errs.push(e),
        }
    }
    if !addrs.is_empty() && errs.len() == addrs.len() {
        return Err(format!(
            "failed to query any nsqlookupd: {}",
            errs.join("\n")
        ));
    }
    let errs = (!errs.is_empty()).then(|| errs.join("\n"));
    Ok((channels.into_iter().collect(), errs))
}

/// Installs the shard's topic-creation hook once recovery is over (nsqd: GetTopic when
/// not loading): with lookupd HTTP addresses known, a new topic holds its pump while a
/// task asks every lookupd for the topic's channels, then creates them (but no
/// `#ephemeral` one) and starts the pump ([`nsq_shards::Shard::release_topic`]), so that
/// a message published meanwhile reaches every channel the cluster knows. The query runs
/// on its own task, bounded by `--http-client-connect-timeout` and
/// `--http-client-request-timeout`: a lookupd that hangs or is down delays the pump by at
/// most that long and never blocks the shard or the publisher.
pub fn install_channel_query(server: &Rc<Server>) {
    let weak = Rc::downgrade(server);
    let hook = move |topic: &str, token: u64| -> bool {
        let Some(server) = weak.upgrade() else {
            return false;
        };
        // A replicated topic's channels come from its group's log, never from
        // nsqlookupd (docs/replication.md).
        if server.replicates(topic) {
            return false;
        }
        let addrs = server.shard.node.lookupd_http_addrs();
        if addrs.is_empty() {
            if !peer_addresses(&server).is_empty() {
                log::error!(
                    "no available nsqlookupd to query for channels to pre-create for topic {topic}"
                );
            }
            return false;
        }
        let topic = topic.to_string();
        glommio::spawn_local(async move {
            // Never touch the topics from inside the creating call (glommio may poll a
            // new task at once).
            glommio::executor().yield_now().await;
            let warn = |e: &str| {
                log::warn!(
                    "failed to query nsqlookupd for channels to pre-create for topic {topic} - {e}"
                )
            };
            // A shutdown ends the wait: the topic keeps its backlog unpumped (in its
            // store), and the next start pumps it to the channels it has then.
            let query = std::pin::pin!(lookupd_topic_channels(&server.cfg.auth, &topic, &addrs));
            let stop = std::pin::pin!(server.shard.shutdown.wait());
            let answer = match futures::future::select(query, stop).await {
                futures::future::Either::Left((a, _)) => a,
                futures::future::Either::Right(_) => return,
            };
            let channels = match answer {
                Ok((c, None)) => c,
                Ok((c, Some(e))) => {
                    warn(&e);
                    c
                }
                Err(e) => {
                    warn(&e);
                    Vec::new()
                }
            };
            // nsqd skips #ephemeral channels (no consumer would keep them); a name this
            // broker could not create from a client is skipped too (lookupd could hold
            // anything).
            let channels: Vec<String> = channels
                .into_iter()
                .filter(|c| !c.ends_with("#ephemeral"))
                .filter(|c| {
                    let ok = nsq_shards::names::is_valid_channel_name(c);
                    if !ok {
                        log::warn!("TOPIC({topic}): lookupd channel {c:?} has an invalid name; not created");
                    }
                    ok
                })
                .collect();
            server.shard.release_topic(&topic, token, &channels);
        })
        .detach();
        true
    };
    server.shard.lookup.set_topic_created(Box::new(hook));
}

/// The V1 command line for an event.
pub fn command(ev: &LookupEvent) -> String {
    match ev {
        LookupEvent::Register(t, c) => lookupd_v1::register_line(t, c.as_deref()),
        LookupEvent::Unregister(t, c) => lookupd_v1::unregister_line(t, c.as_deref()),
    }
}

/// The IDENTIFY body nsqd sends (Go marshals a map, so keys are sorted).
pub fn identify_body(server: &Server) -> Vec<u8> {
    let c = &server.cfg;
    let tcp_port = if c.flags.broadcast_tcp_port != 0 {
        c.flags.broadcast_tcp_port
    } else {
        server.tcp_port
    };
    let http_port = if c.flags.broadcast_http_port != 0 {
        c.flags.broadcast_http_port
    } else {
        server.http_port
    };
    lookupd_v1::identify_body(
        &c.broadcast_address,
        &c.hostname,
        http_port,
        tcp_port,
        nsq_wire::identify::VERSION,
    )
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

/// One lookupd peer: a lazily (re)connected V1 connection. A peer that cannot be
/// reached is redialled after a backoff (1 s doubling to 15 s), not on every command, and
/// a connection lost on a command is redialled at once; every (re)connect IDENTIFYs and
/// REGISTERs everything again.
struct Peer {
    addr: String,
    conn: Option<SharedStream>,
    backoff: Duration,
    /// While disconnected: no dial before this instant (`None`: dial now).
    retry_at: Option<Instant>,
}

async fn read_response(s: &SharedStream) -> std::io::Result<Vec<u8>> {
    let mut hdr = [0u8; 4];
    read_exact(s, &mut hdr).await?;
    let n = lookupd_v1::response_len(hdr).map_err(std::io::Error::other)?;
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
    fn new(addr: String) -> Peer {
        Peer {
            addr,
            conn: None,
            backoff: Duration::ZERO,
            retry_at: None,
        }
    }

    /// Whether a dial is due: disconnected and not backing off.
    fn dial_due(&self, now: Instant) -> bool {
        self.conn.is_none() && self.retry_at.is_none_or(|t| now >= t)
    }

    fn close(&mut self) {
        if let Some(s) = self.conn.take() {
            s.shutdown();
        }
    }

    async fn connect(&mut self, server: &Server, registry: &Registry) -> std::io::Result<()> {
        log::info!("LOOKUP connecting to {}", self.addr);
        let stream = TcpStream::connect_timeout(self.addr.as_str(), IO_TIMEOUT)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let s = SharedStream::new(stream);
        s.set_read_timeout(Some(IO_TIMEOUT));
        s.set_write_timeout(Some(IO_TIMEOUT));
        let body = identify_body(server);
        let mut msg = lookupd_v1::MAGIC_V1.to_vec();
        lookupd_v1::write_identify(&mut msg, &body);
        let r = async {
            s.write_all(&msg).await?;
            read_response(&s).await
        }
        .await;
        let resp = match r {
            Ok(r) => r,
            Err(e) => {
                s.shutdown();
                return Err(e);
            }
        };
        if resp == b"E_INVALID" {
            s.shutdown();
            return Err(std::io::Error::other("lookupd returned E_INVALID"));
        }
        // nsqd: json.Unmarshal into lp.Info; a reply it cannot parse closes the peer.
        let info: PeerInfo = match serde_json::from_slice(&resp) {
            Ok(i) => i,
            Err(_) => {
                s.shutdown();
                return Err(std::io::Error::other(format!(
                    "parsing response - {}",
                    String::from_utf8_lossy(&resp)
                )));
            }
        };
        let broadcast = info.broadcast_address.clone().unwrap_or_default();
        if broadcast.is_empty() {
            log::error!("LOOKUPD({}): no broadcast address", self.addr);
            set_lookupd_http(server, &self.addr, None).await;
        } else {
            set_lookupd_http(
                server,
                &self.addr,
                Some(join_host_port(&broadcast, info.http_port.unwrap_or(0))),
            )
            .await;
        }
        // Logged once the HTTP address is recorded (tests wait for this line).
        log::info!(
            "LOOKUPD({}): peer info {}",
            self.addr,
            String::from_utf8_lossy(&resp)
        );
        log::debug!(
            "LOOKUPD({}): tcp_port {:?} version {:?}",
            self.addr,
            info.tcp_port,
            info.version
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
            // Lost: redial on the next pass of the loop, without waiting.
            self.close();
            self.retry_at = None;
        }
        r
    }

    /// Sends `cmd` (or nothing, just connecting), connecting first if needed and not
    /// backing off; any I/O error closes the connection. A command for a peer that is
    /// down is dropped: the reconnect REGISTERs the current state anyway.
    async fn command(&mut self, server: &Server, registry: &Registry, cmd: Option<&[u8]>) {
        if self.conn.is_none() {
            let now = Instant::now();
            if !self.dial_due(now) {
                return;
            }
            match self.connect(server, registry).await {
                Ok(()) => {
                    self.backoff = Duration::ZERO;
                    self.retry_at = None;
                }
                Err(e) => {
                    self.close();
                    self.backoff = (self.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                    self.retry_at = Some(Instant::now() + self.backoff);
                    log::error!(
                        "LOOKUPD({}): connect - {e} (retrying in {:?})",
                        self.addr,
                        self.backoff
                    );
                    return;
                }
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

/// Makes `peers` match the configured list: peers no longer listed are closed, new
/// addresses are added (duplicates ignored) and dialled, as nsqd's lookupLoop does on an
/// options notification.
async fn reconcile(server: &Server, peers: &mut Vec<Peer>, want: &[String]) {
    let mut removed = Vec::new();
    peers.retain_mut(|p| {
        let keep = want.contains(&p.addr);
        if !keep {
            log::info!("LOOKUP({}): removing peer", p.addr);
            p.close();
            removed.push(p.addr.clone());
        }
        keep
    });
    for addr in removed {
        set_lookupd_http(server, &addr, None).await;
    }
    for a in want {
        if !peers.iter().any(|p| &p.addr == a) {
            log::info!("LOOKUP({a}): adding peer");
            peers.push(Peer::new(a.clone()));
        }
    }
}

/// Shard 0's lookup loop: applies events from every shard to the registry and to every
/// peer, follows run-time changes of the peer list, redials lost peers (with backoff)
/// and pings every peer every `--lookupd-ping-interval` (15 s).
pub async fn lookup_loop(server: Rc<Server>) {
    let lookup = &server.shard.lookup;
    let ping_interval = server.cfg.flags.lookupd_ping_interval;
    let mut registry = Registry::default();
    let mut peers: Vec<Peer> = Vec::new();
    let mut seen_gen = server.shard.node.lookupd_generation();
    reconcile(&server, &mut peers, &peer_addresses(&server)).await;
    let mut next_ping = Instant::now() + ping_interval;
    loop {
        let gen = server.shard.node.lookupd_generation();
        if gen != seen_gen {
            seen_gen = gen;
            reconcile(&server, &mut peers, &peer_addresses(&server)).await;
        }
        let events: Vec<LookupEvent> = lookup.take_events();
        for ev in &events {
            registry.apply(ev);
            let cmd = command(ev);
            for p in peers.iter_mut() {
                log::info!("LOOKUPD({}): {}", p.addr, cmd.trim_end());
                p.command(&server, &registry, Some(cmd.as_bytes())).await;
            }
        }
        if lookup.has_events() || server.shard.node.lookupd_generation() != seen_gen {
            continue;
        }
        let now = Instant::now();
        if now >= next_ping {
            for p in peers.iter_mut() {
                log::debug!("LOOKUPD({}): sending heartbeat", p.addr);
                p.command(&server, &registry, Some(lookupd_v1::PING)).await;
            }
            next_ping = Instant::now() + ping_interval;
        }
        // Dial new peers and redial lost ones whose backoff is over.
        let now = Instant::now();
        for p in peers.iter_mut() {
            if p.dial_due(now) {
                p.command(&server, &registry, None).await;
            }
        }
        if lookup.has_events() || server.shard.node.lookupd_generation() != seen_gen {
            continue;
        }
        let mut wake_at = next_ping;
        for p in &peers {
            if p.conn.is_none() {
                if let Some(t) = p.retry_at {
                    wake_at = wake_at.min(t);
                }
            }
        }
        let wake = std::pin::pin!(lookup.wake().wait());
        let stop = std::pin::pin!(server.shard.shutdown.wait());
        let sleep = std::pin::pin!(glommio::timer::sleep(
            wake_at.saturating_duration_since(Instant::now())
        ));
        let first = futures::future::select(wake, stop);
        if let futures::future::Either::Left((futures::future::Either::Right(_), _)) =
            futures::future::select(first, sleep).await
        {
            break;
        }
    }
    for p in peers.iter_mut() {
        p.close();
    }
    log::info!("LOOKUP: closing");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_addresses_from_identify() {
        assert_eq!(join_host_port("10.0.0.1", 4161), "10.0.0.1:4161");
        assert_eq!(join_host_port("::1", 4161), "[::1]:4161");
        let i: PeerInfo = serde_json::from_slice(
            br#"{"broadcast_address":"h","hostname":"x","http_port":4161,"tcp_port":4160,"version":"1.3.0","extra":1}"#,
        )
        .expect("parses");
        assert_eq!(
            (i.broadcast_address.as_deref(), i.http_port),
            (Some("h"), Some(4161))
        );
        let i: PeerInfo = serde_json::from_slice(br#"{"broadcast_address":null}"#).expect("null");
        assert!(i.broadcast_address.is_none());
        assert!(serde_json::from_slice::<PeerInfo>(b"OK").is_err());
        assert!(serde_json::from_slice::<PeerInfo>(br#"{"http_port":"x"}"#).is_err());
    }
}
