//! A consumer connected to a follower, served through it from the topic's leader.
//!
//! A SUB on a member that holds a replica of the topic but does not lead it opens a
//! protocol V2 connection from this member to the leader's TCP address (each member
//! gives its own in its cluster greeting), sends IDENTIFY with the consumer's heartbeat
//! interval and message timeout and the same SUB, and from then on:
//!
//! - message frames from the leader go to the consumer as they are (the consumer's own
//!   connection keeps its TLS, compression and output buffering, all ended here);
//! - the consumer's RDY, FIN, REQ, TOUCH and CLS go to the leader (the last RDY is kept);
//! - the leader's heartbeats are answered here (`NOP`); this member sends the consumer
//!   its own, as for any connection;
//! - when the leader's connection ends (it was killed, or it lost leadership and
//!   relays its own consumers), the relay finds the topic's new leader and subscribes
//!   again with the consumer's last RDY: the consumer's connection stays up. A FIN, REQ or TOUCH of
//!   a message delivered by the previous leader is dropped (the new leader delivers that
//!   message again unless the finish had been replicated). If this member becomes the
//!   leader, the consumer is subscribed to its channel here, on the same connection.
//!
//! The same relay serves a consumer subscribed on the leader once that member stops
//! leading ([`serve_detached`]): its connection stays up across a move of the
//! leadership or a failover that leaves it running.

use super::ClusterConfig;
use crate::server::Server;
use crate::tcp::SharedStream;
use bytes::{Bytes, BytesMut};
use glommio::net::TcpStream;
use nsq_shards::client::Client;
use nsq_shards::ClientState;
use nsq_wire::v2::{FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// What a relay's connection to the leader puts before the consumer's `user_agent` in
/// its IDENTIFY: how a leader that stops leading tells a relay (closed, so that the
/// relaying member follows the new leader itself) from a consumer (relayed).
const RELAY_USER_AGENT: &str = "nsqd-relay";

/// The most IDs a relay keeps as delivered by a previous leader ([`Relay::add_stale`]).
const STALE_MAX: usize = 1 << 16;

/// How long a relay looks for the topic's leader before it gives the consumer up.
const FIND_LEADER: Duration = Duration::from_secs(10);

/// One consumer's relay.
pub struct Relay {
    topic: String,
    channel: String,
    /// The connection to the leader now (`None` between two).
    upstream: RefCell<Option<SharedStream>>,
    /// The replica id of the member that connection goes to.
    leader: Cell<u64>,
    /// The consumer's last RDY.
    rdy: Cell<i64>,
    /// IDs of the messages the current leader delivered and the consumer has not
    /// answered yet.
    delivered: RefCell<HashSet<[u8; 16]>>,
    /// Set when the consumer's connection ended.
    closed: Cell<bool>,
    /// Set once this member leads the topic and serves the consumer itself.
    local: Cell<bool>,
    /// IDs a previous leader delivered: their FIN, REQ and TOUCH are dropped while
    /// relayed, and run without an error frame once this member serves the consumer
    /// ([`Relay::stale_here`]).
    stale: RefCell<HashSet<[u8; 16]>>,
    /// Commands for the current leader not yet written ([`Relay::forward`]).
    pending: RefCell<Vec<u8>>,
    /// Set while a task writes [`Relay::pending`] out.
    flushing: Cell<bool>,
}

/// What the consumer sends that goes to the leader.
pub enum Forward<'a> {
    Rdy(i64),
    Fin(&'a [u8; 16]),
    Req(&'a [u8; 16], i64),
    Touch(&'a [u8; 16]),
    Cls,
}

impl Relay {
    /// A relay of `topic`/`channel` not connected to a leader yet, with the consumer's
    /// last RDY `rdy` and the IDs `stale` a previous leader delivered to it.
    fn new(topic: &str, channel: String, rdy: i64, stale: HashSet<[u8; 16]>) -> Rc<Relay> {
        Rc::new(Relay {
            topic: topic.to_string(),
            channel,
            upstream: RefCell::new(None),
            leader: Cell::new(0),
            rdy: Cell::new(rdy),
            delivered: RefCell::new(HashSet::new()),
            closed: Cell::new(false),
            local: Cell::new(false),
            stale: RefCell::new(stale),
            pending: RefCell::new(Vec::new()),
            flushing: Cell::new(false),
        })
    }

    /// Queues the consumer's command for the leader, or drops it (between two leaders;
    /// a message the current leader did not deliver). Returns false when the command is
    /// to run here as usual: this member took the topic's leadership over.
    ///
    /// The commands of one read from the consumer go to the leader in one write: a task
    /// started by the first of them writes them once the consumer's connection has run
    /// all it read (a FIN per write cost a system call per message).
    pub fn forward(self: &Rc<Self>, client: &Client, cmd: Forward<'_>) -> bool {
        use std::io::Write;
        if self.local.get() {
            return false;
        }
        let mut pending = self.pending.borrow_mut();
        // Writing into a Vec cannot fail.
        let _ = match cmd {
            Forward::Rdy(n) => {
                self.rdy.set(n);
                writeln!(pending, "RDY {n}")
            }
            Forward::Fin(id) => {
                if !self.answered(client, id) {
                    return true;
                }
                pending.extend_from_slice(b"FIN ");
                pending.extend_from_slice(id);
                writeln!(pending)
            }
            Forward::Req(id, ms) => {
                if !self.answered(client, id) {
                    return true;
                }
                pending.extend_from_slice(b"REQ ");
                pending.extend_from_slice(id);
                writeln!(pending, " {ms}")
            }
            Forward::Touch(id) => {
                if !self.delivered.borrow().contains(id) {
                    return true;
                }
                pending.extend_from_slice(b"TOUCH ");
                pending.extend_from_slice(id);
                writeln!(pending)
            }
            Forward::Cls => writeln!(pending, "CLS"),
        };
        if !self.flushing.replace(true) {
            let relay = self.clone();
            glommio::spawn_local(async move { relay.flush().await }).detach();
        }
        true
    }

    /// Writes [`Relay::pending`] to the current leader until none is left; started by
    /// [`Relay::forward`], after the consumer's connection has run what it read.
    async fn flush(&self) {
        glommio::executor().yield_now().await;
        loop {
            let data = std::mem::take(&mut *self.pending.borrow_mut());
            let up = self.upstream.borrow().clone();
            let (Some(up), false) = (up, data.is_empty()) else {
                break;
            };
            if up.write_all(&data).await.is_err() {
                up.shutdown();
            }
        }
        self.flushing.set(false);
    }
}

impl Relay {
    /// Whether the current leader delivered message `id` to the consumer, which has
    /// now answered it (it is no longer counted in flight).
    fn answered(&self, client: &Client, id: &[u8; 16]) -> bool {
        let mut delivered = self.delivered.borrow_mut();
        let was = delivered.remove(id);
        client.set_relayed_in_flight(delivered.len() as i64);
        was
    }

    /// Once this member serves the consumer itself: whether message `id` was delivered
    /// by a previous leader. Its FIN, REQ or TOUCH then runs here without an error
    /// frame when this member holds no such message in flight for the consumer: the
    /// consumer may answer both that delivery and this member's own delivery of the
    /// same message again (the IDs are the group's), and only one of them can succeed.
    pub fn stale_here(&self, id: &[u8; 16]) -> bool {
        self.local.get() && self.stale.borrow().contains(id)
    }

    /// Adds `ids` to [`Relay::stale`], which is forgotten whole past [`STALE_MAX`] IDs
    /// (a consumer answers a message within its `--max-msg-timeout` anyway).
    fn add_stale(&self, ids: impl IntoIterator<Item = [u8; 16]>) {
        let mut stale = self.stale.borrow_mut();
        if stale.len() > STALE_MAX {
            stale.clear();
        }
        stale.extend(ids);
    }
}

/// True when `client` is another member's relay connection (its IDENTIFY's
/// `user_agent` starts with `nsqd-relay (`): a member that does not lead the
/// topic refuses its SUB rather than relaying it again, and a member that stops
/// leading closes it rather than relaying it, so that relays never chain (a chain can
/// loop back to the leader it started from).
pub fn is_member_relay(client: &Client) -> bool {
    client
        .settings()
        .user_agent
        .strip_prefix(RELAY_USER_AGENT)
        .is_some_and(|rest| rest.starts_with(" ("))
}

/// The relay of `client`, if its SUB was relayed.
pub fn of(server: &Server, client: &Client) -> Option<Rc<Relay>> {
    server
        .cluster
        .as_ref()?
        .relays
        .borrow()
        .get(&client.id())
        .cloned()
}

/// Ends `client`'s relay (its connection closed).
pub fn client_gone(server: &Server, client: &Client) {
    let Some(c) = &server.cluster else { return };
    if let Some(r) = c.relays.borrow_mut().remove(&client.id()) {
        r.closed.set(true);
        if let Some(up) = r.upstream.borrow_mut().take() {
            up.shutdown();
        }
    }
}

/// Subscribes `client` to `topic`/`channel` through the topic's leader; on success the
/// client is subscribed and served by a relay task. `Ok(false)`: this member leads the
/// topic by now, subscribe here. Errors: the text of the error frame to send the
/// consumer (fatal).
pub async fn subscribe(
    server: &Rc<Server>,
    client: &Rc<Client>,
    topic: &str,
    channel: &str,
) -> Result<bool, String> {
    let Some(c) = server.cluster.clone() else {
        return Ok(false);
    };
    let relay = Relay::new(topic, channel.to_string(), 0, HashSet::new());
    let Some(up) = connect_retrying(server, client, &relay).await? else {
        return Ok(false);
    };
    *relay.upstream.borrow_mut() = Some(up.clone());
    c.relays.borrow_mut().insert(client.id(), relay.clone());
    client.set_state(ClientState::Subscribed);
    log::info!(
        "[{}] SUB {topic} {channel} relayed to the topic's leader",
        client.remote_address()
    );
    let server = server.clone();
    let client = client.clone();
    glommio::spawn_local(async move { run(&server, &client, &relay, up).await }).detach();
    Ok(true)
}

/// The leader's TCP address for `topic`, once a leader other than this member is known
/// (`Ok(None)`: this member leads it).
async fn leader_tcp(server: &Server, topic: &str) -> Result<Option<(u64, String)>, String> {
    let Some(c) = &server.cluster else {
        return Err("not a cluster member".into());
    };
    let deadline = Instant::now() + FIND_LEADER;
    loop {
        match c.leader_of(topic) {
            // Served here once this member handled its election (`leads`): delivery
            // is held from then until its channels have the states of every entry
            // before its term, which a consumer subscribed earlier would not wait for.
            Some(l) if l == c.cfg.me.replica && c.leads(topic) => return Ok(None),
            Some(l) if l == c.cfg.me.replica => {}
            Some(l) => {
                if let Some(tcp) = c.peer_tcp(l) {
                    return Ok(Some((l, tcp)));
                }
            }
            None => {}
        }
        if Instant::now() >= deadline {
            return Err(format!("topic {topic} has no reachable leader"));
        }
        glommio::timer::sleep(super::replica::TICK).await;
    }
}

/// [`connect`], tried again every `TICK` for as long as [`FIND_LEADER`] while it fails
/// and the consumer stays: the group may still name a lost leader until its election
/// timeout, and a member that does not lead refuses a relay's SUB.
async fn connect_retrying(
    server: &Server,
    client: &Client,
    relay: &Relay,
) -> Result<Option<SharedStream>, String> {
    let deadline = Instant::now() + FIND_LEADER;
    loop {
        let r = connect(server, client, relay).await;
        if r.is_err() {
            relay.upstream.replace(None);
        }
        match r {
            Err(e) if Instant::now() < deadline && !relay.closed.get() => {
                log::debug!("[{}] relay: {e}; trying again", client.remote_address());
                glommio::timer::sleep(super::replica::TICK).await;
            }
            r => return r,
        }
    }
}

/// Opens a connection to the topic's leader and subscribes it like the consumer
/// (`Ok(None)`: this member leads the topic).
async fn connect(
    server: &Server,
    client: &Client,
    relay: &Relay,
) -> Result<Option<SharedStream>, String> {
    let topic = &relay.topic;
    let fail = |e: String| format!("E_SUB_FAILED SUB failed {e}");
    let Some((leader, addr)) = leader_tcp(server, topic).await.map_err(fail)? else {
        return Ok(None);
    };
    relay.leader.set(leader);
    let stream = TcpStream::connect_timeout(addr.as_str(), Duration::from_secs(2))
        .await
        .map_err(|e| fail(format!("leader {addr} unreachable: {e}")))?;
    let _ = stream.set_nodelay(true);
    let up = SharedStream::new(stream);
    // Known from now on: a leader stopped with its listener up accepts the connection
    // but does not answer, and [`leader_changed`] ends the wait when another leads.
    relay.upstream.replace(Some(up.clone()));
    let identify = {
        let s = client.settings();
        serde_json::json!({
            "client_id": s.client_id,
            "hostname": s.hostname,
            "user_agent": format!("{RELAY_USER_AGENT} ({})", s.user_agent),
            "heartbeat_interval": s.heartbeat_interval.map_or(-1, |d| d.as_millis() as i64),
            "msg_timeout": s.msg_timeout.as_millis() as i64,
            "feature_negotiation": true,
        })
        .to_string()
    };
    let mut hello = b"  V2IDENTIFY\n".to_vec();
    hello.extend_from_slice(&(identify.len() as u32).to_be_bytes());
    hello.extend_from_slice(identify.as_bytes());
    hello.extend_from_slice(format!("SUB {} {}\n", relay.topic, relay.channel).as_bytes());
    let io = |e: std::io::Error| fail(format!("leader {addr}: {e}"));
    up.write_all(&hello).await.map_err(io)?;
    let mut frames = FrameReader::default();
    // IDENTIFY's answer (JSON), then SUB's.
    for _ in 0..2 {
        let (ft, data) = frames.next(&up).await.map_err(io)?;
        if ft == FRAME_ERROR {
            up.shutdown();
            return Err(String::from_utf8_lossy(&data).into_owned());
        }
    }
    let rdy = relay.rdy.get();
    if rdy > 0 {
        up.write_all(format!("RDY {rdy}\n").as_bytes())
            .await
            .map_err(io)?;
    }
    Ok(Some(up))
}

/// Carries the leader's frames to the consumer until the consumer goes; reconnects to
/// each new leader.
async fn run(server: &Rc<Server>, client: &Rc<Client>, relay: &Rc<Relay>, mut up: SharedStream) {
    loop {
        let mut frames = FrameReader::default();
        loop {
            let (ft, data) = match frames.next(&up).await {
                Ok(f) => f,
                Err(_) => break,
            };
            match ft {
                FRAME_MESSAGE => {
                    if let Some(id) = data.get(10..26) {
                        let mut key = [0u8; 16];
                        key.copy_from_slice(id);
                        let mut delivered = relay.delivered.borrow_mut();
                        delivered.insert(key);
                        // In flight as a delivery here is: the output is flushed once
                        // the consumer holds as many as its RDY allows.
                        client.set_relayed_in_flight(delivered.len() as i64);
                    }
                    // Buffered as the consumer's own deliveries are (its output buffer
                    // size and timeout), not flushed one by one.
                    client.buffer_message_frame(&data);
                }
                FRAME_RESPONSE if &data[..] == b"_heartbeat_" => {
                    if up.write_all(b"NOP\n").await.is_err() {
                        break;
                    }
                }
                _ => client.send_frame(ft, &data),
            }
        }
        up.shutdown();
        *relay.upstream.borrow_mut() = None;
        // Commands for the leader that is gone (its deliveries are stale).
        relay.pending.borrow_mut().clear();
        let delivered = std::mem::take(&mut *relay.delivered.borrow_mut());
        relay.add_stale(delivered);
        client.set_relayed_in_flight(0);
        if relay.closed.get() || server.shard.shutdown.is_set() {
            return;
        }
        log::info!(
            "[{}] relay of {}/{}: the leader's connection ended; finding the new leader",
            client.remote_address(),
            relay.topic,
            relay.channel
        );
        match follow_leader(server, client, relay).await {
            Some(next) => up = next,
            None => return,
        }
    }
}

/// Subscribes the relay at the topic's leader: the connection to it, or `None` when the
/// relay ends here (the consumer left; this member leads the topic and serves the
/// consumer itself, [`take_over`]; or no leader answered within [`FIND_LEADER`]: the
/// consumer's connection is closed, and it reconnects as after any lost nsqd).
async fn follow_leader(
    server: &Rc<Server>,
    client: &Rc<Client>,
    relay: &Rc<Relay>,
) -> Option<SharedStream> {
    match connect_retrying(server, client, relay).await {
        Ok(Some(next)) => {
            if relay.closed.get() {
                next.shutdown();
                return None;
            }
            *relay.upstream.borrow_mut() = Some(next.clone());
            Some(next)
        }
        Ok(None) => {
            take_over(server, client, relay);
            None
        }
        Err(e) => {
            log::info!("[{}] relay ended: {e}", client.remote_address());
            client.kill();
            None
        }
    }
}

/// Serves `consumer`, taken out of its channel of `topic` because this member no longer
/// leads the topic, through the topic's new leader on the same connection, as a SUB
/// relayed from the start is ([`subscribe`]): the consumer's connection stays up. The
/// messages it held in flight here are stale: their FIN, REQ and TOUCH are dropped, and
/// the new leader delivers them again unless their finish had been replicated (the
/// channel's positions go to the replicas every 100 ms, and before a requested move).
/// A consumer that is another member's relay is closed instead: that member follows
/// the new leader itself.
pub fn serve_detached(
    server: &Rc<Server>,
    topic: &str,
    consumer: nsq_shards::shard::DetachedConsumer,
) {
    let nsq_shards::shard::DetachedConsumer {
        client,
        channel,
        in_flight,
    } = consumer;
    let is_relay = is_member_relay(&client);
    let Some(c) = server.cluster.clone().filter(|_| !is_relay) else {
        // Another member's relay: closed, and that member follows the new leader (or
        // serves its consumer itself, if it is the new leader).
        client.kill();
        return;
    };
    let rdy = client.ready_count();
    let stale = in_flight.iter().map(|id| id.to_hex()).collect();
    let relay = Relay::new(topic, channel, rdy, stale);
    c.relays.borrow_mut().insert(client.id(), relay.clone());
    log::info!(
        "[{}] SUB {topic} {}: this member no longer leads the topic; relayed to the new leader",
        client.remote_address(),
        relay.channel
    );
    let server = server.clone();
    glommio::spawn_local(async move {
        if let Some(up) = follow_leader(&server, &client, &relay).await {
            run(&server, &client, &relay, up).await;
        }
    })
    .detach();
}

/// `topic`'s group on this member names `leader` now: each relay of the topic
/// subscribed at another member ends that subscription (shuts its connection down) and
/// follows the new leader, as when the old leader's connection ends.
/// A leader that stopped running (SIGSTOP, a paused VM) keeps its connections up, and
/// its relays would otherwise wait for it to run again. `None` (an election under way)
/// changes nothing.
pub fn leader_changed(c: &super::replica::ShardCluster, topic: &str, leader: Option<u64>) {
    let Some(leader) = leader else {
        return;
    };
    for r in c.relays.borrow().values() {
        if r.topic == topic && r.leader.get() != leader {
            if let Some(up) = r.upstream.borrow().as_ref() {
                up.shutdown();
            }
        }
    }
}

/// This member leads the topic now: the consumer is subscribed to its channel here with
/// its last RDY, on the same connection.
fn take_over(server: &Server, client: &Rc<Client>, relay: &Relay) {
    relay.local.set(true);
    match server.shard.subscribe(client, &relay.topic, &relay.channel) {
        Ok(_) => {
            log::info!(
                "[{}] relay of {}/{}: this member leads the topic now; served here",
                client.remote_address(),
                relay.topic,
                relay.channel
            );
            client.set_ready_count(relay.rdy.get());
            server.shard.client_ready_changed(client);
        }
        Err(e) => {
            log::info!("[{}] relay ended: {e}", client.remote_address());
            client.kill();
        }
    }
}

/// Reads the leader's protocol V2 frames from a stream, split by the client-side frame
/// decoder ([`nsq_wire::client::decode_frame`]).
#[derive(Default)]
struct FrameReader {
    buf: BytesMut,
}

/// How much a relay reads from the leader at once (more for the rest of a larger
/// frame, up to [`RELAY_FRAME_ROOM_MAX`]).
const RELAY_READ: usize = 64 << 10;

/// The most room a relay makes at once for the rest of a frame whose size is in.
const RELAY_FRAME_ROOM_MAX: usize = 8 << 20;

impl FrameReader {
    /// The next frame: (type, data), the data a slice of the buffer it was read into
    /// (frames are split off the front, never shifted or copied out).
    async fn next(&mut self, s: &SharedStream) -> std::io::Result<(u32, Bytes)> {
        use nsq_wire::client::{decode_frame, Decoded};
        loop {
            let need = match decode_frame(&self.buf) {
                Ok(Decoded::Frame(_, used)) => {
                    let frame = self.buf.split_to(used).freeze();
                    let ft = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
                    return Ok((ft, frame.slice(8..)));
                }
                Ok(Decoded::Incomplete { need }) => need,
                Err(e) => {
                    return Err(std::io::Error::other(format!(
                        "bad frame from the leader: {e:?}"
                    )))
                }
            };
            let rest = need
                .saturating_sub(self.buf.len())
                .min(RELAY_FRAME_ROOM_MAX);
            let n = s.read_append(&mut self.buf, RELAY_READ.max(rest)).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// True when a SUB to `topic` on this member should be relayed: a replicated topic this
/// member holds but does not lead, with a leader elected.
pub fn should_relay(server: &Server, topic: &str) -> bool {
    let Some(c) = &server.cluster else {
        return false;
    };
    ClusterConfig::replicates(topic)
        && c.leader_of(topic)
            .is_some_and(|l| l != c.cfg.me.replica && c.peer_tcp(l).is_some())
}
