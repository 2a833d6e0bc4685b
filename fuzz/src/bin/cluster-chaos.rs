//! Cluster chaos: faults of a 3-node cluster under load (RELIABILITY.md, "Cluster chaos:
//! faults of a 3-node cluster under load").
//!
//!   cluster-chaos [--shards N] [--cycles 50] [--seed N] [--min-ms 500] [--max-ms 2000]
//!                 [--faults abcd] [--consumer-ms 0] [--body-bytes 16] [--sync-every N]
//!                 [--overlap] [--nsqd PATH]
//!
//! Starts three `nsqd` members (`--node-id`, `--cluster-address`, `--cluster-peer`; each
//! with `--shards N`) on loopback ports and data paths that stay the same for the whole
//! run, creates topic `chaos` with channel `c0`, and puts it under load:
//!
//! - a publisher PUBs numbered bodies (every fifth time an MPUB of 4) to a random member
//!   that is up (another one every 200 commands) and records those answered `OK`; a
//!   connection error or `E_PUB_FAILED` is no acknowledgement: it reconnects to a member
//!   and goes on;
//! - a consumer finds the topic's leader through `GET /cluster`, SUBs there (RDY 50),
//!   records every body and FINs it; when its connection closes or the SUB is refused it
//!   finds the leader again. A connection to a member that has not led for 2 s must be
//!   one it relays to the leader (in none of its channels: counted, and consumed on);
//!   one in its channel fails the run (a member that stops leading relays its
//!   consumers to the new leader). With `--consumer-ms N` it spends N ms on
//!   each message during odd cycles, so failovers also meet a backlog.
//!
//! Each cycle, after a seeded random delay, one fault, in a seeded order that goes
//! through every kind of `--faults` before repeating one: (a) kill -9 the leader and
//! restart it at once on its data path; (b) kill -9 a follower and restart it; (c) kill
//! -9 the leader, delete its data path and restart it empty (under the same identity: it
//! catches up from the others); (d) SIGSTOP a member (leader or follower, seeded) for
//! 2 s, longer than the election timeout, then SIGCONT; (e), only when asked for with
//! `--faults`, kill -9 both followers, delete their data paths and restart them empty
//! after 1.5 s (the leader steps down meanwhile: the two must elect it, not each other);
//! (f), only when asked for, a follower lost with its disk and replaced by a new member
//! at a new cluster address, the others restarted one at a time with the new list (the
//! topic's replicas move to the new member); (g), only when asked for, kill -9 every
//! member at once and restart them all at once (nothing acknowledged may be lost only
//! under `--sync-every 1`, whose replicas sync their Raft logs before acknowledging;
//! otherwise what a member held unwritten is lost); (h), only when asked for, `POST
//! /topic/move-leader` hands the leadership to a follower (no member goes down; a
//! publish sent from the move until 300 ms after the agreed leader that is refused or
//! unanswered fails the run: publishes wait for the new leader); (i), only when asked
//! for, the leader is cut off from the other members for 2 s while it runs, its
//! connections left open, as in a network partition (`NSQD_CLUSTER_CUT_FILE`: the
//! broker must be a build with the `fault-injection` feature, as the test suite's is;
//! the load avoids it meanwhile; a message the consumer's connection to it brings,
//! sent 450 ms or more after the cut while the cut lasts, fails the run: the member's
//! delivery lease has run out by then. Sent, not read: only a read that began with
//! nothing waiting in the socket counts, so `--consumer-ms` gives the check a backlog
//! without reads of old messages counting). The next cycle's delay
//! starts once every member holds what the leader committed (one member impaired at a
//! time, the promise of docs/replication.md; `--overlap`: once every member names the
//! same leader and that leader says it leads, so a fault can hit while another member
//! still catches up), and its fault comes once they agree on a leader. With `--sync-every N` each
//! member runs with that flag (`--sync-every 1`: the Raft logs are journaled, and a
//! restarted member comes back with its log).
//!
//! After the last cycle the publisher stops and the consumer drains at full speed (until
//! it has every acknowledged body, or 60 s). Checks: every acknowledged body was received at least
//! once (each loss is reported with the cycle and member its acknowledgement came in and
//! the fault that followed it), nothing foreign was received, no member's log shows a
//! panic, FATAL or a replicated batch skipped as numbered below its topic's log, no
//! member exited by itself, and every member exits 0 on SIGTERM.
//! Bodies received more than once are counted, not failures (at least once); the
//! redeliveries of bodies first received over 1 s before the fault that preceded them
//! are counted apart, per subscription: a failover should only redeliver what was
//! unfinished or finished within the last ~100 ms. The summary also gives each member's
//! channel depth once everything is finished (what it would deliver again if it led
//! next). Exit status 1 on any failure. When a run fails its temporary directory (data
//! paths and every member's log) is kept.
#![allow(
    clippy::unwrap_used,
    reason = "fuzzing and chaos tools: a panic is a reported failure of the run"
)]
#![forbid(unsafe_code)]

use nsq_fuzz::mutate::Rng;
use nsq_fuzz::net::{self, Broker, Stop};
use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const TOPIC: &str = "chaos";
const CHANNEL: &str = "c0";
const MEMBERS: usize = 3;

/// How long fault (d) keeps a member stopped: longer than the election timeout (0.5 to
/// 0.95 s).
const STOP_FOR: Duration = Duration::from_secs(2);
/// A leader cut off by fault (i) delivers nothing this long after the cut: its delivery
/// lease (250 ms past the last ping its replicas answered) has run out, before the
/// others can elect another leader (400 ms of silence, then a tick or more).
const CUT_LATE: Duration = Duration::from_millis(450);

/// What a member logs when fault (i) cuts it off.
const CUT_LINE: &str = "CLUSTER: cut this member's connections to its peers";

/// How long fault (e) keeps both followers down.
const WIPED_FOR: Duration = Duration::from_millis(1500);

/// The longest the tool waits for an agreed leader after a fault before it gives up.
const LEADER_WAIT: Duration = Duration::from_secs(60);

/// The longest the final drain waits for the acknowledged bodies.
const DRAIN_WAIT: Duration = Duration::from_secs(60);

/// Each `GET /cluster` waits at most this long (a stopped member does not answer).
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// A redelivery is "old" when the body was first received more than this before the
/// fault that preceded the redelivery: a failover should only redeliver what was
/// unfinished or finished within the last cursor period (100 ms) before it.
const OLD: Duration = Duration::from_secs(1);

/// Command line (the module's doc comment describes the run).
#[derive(clap::Parser, Debug)]
#[command(
    name = "cluster-chaos",
    about = "faults of a 3-node cluster under load: kill -9, wiped data path, SIGSTOP, a replaced member"
)]
struct Cli {
    #[command(flatten)]
    tool: net::ToolArgs,
    /// Faults, one per cycle, per shard count.
    #[arg(long, default_value_t = 50)]
    cycles: u64,
    /// Shortest delay before a fault, in ms.
    #[arg(long, default_value_t = 500)]
    min_ms: u64,
    /// Longest delay before a fault, in ms (at least `--min-ms` + 1).
    #[arg(long, default_value_t = 2000)]
    max_ms: u64,
    /// Time the consumer spends on each message before its FIN during odd cycles, in
    /// ms (0: never). Slow and fast cycles alternate, so failovers also meet a backlog.
    #[arg(long, default_value_t = 0)]
    consumer_ms: u64,
    /// Bytes of each body (at least its 16-byte number): with a slow consumer, large
    /// bodies build a backlog larger than a snapshot carries (32 MiB), which a wiped
    /// member fetches in pages.
    #[arg(long, default_value_t = 16)]
    body_bytes: usize,
    /// The members' `--sync-every` (their default when not given).
    #[arg(long)]
    sync_every: Option<u64>,
    /// Let the next fault come as soon as the members agree on a leader, while a member
    /// may still be catching up. By default it waits until every member holds what the
    /// leader committed: the promise is one member lost at a time, and a second fault
    /// while the first one's member catches up can lose what only the two held.
    #[arg(long)]
    overlap: bool,
    /// The fault kinds to inject, a subset of `abcdefg`: (a) kill -9 the leader, (b) a
    /// follower, (c) the leader with its data path deleted, (d) SIGSTOP a member 2 s,
    /// (e) both followers with their data paths deleted, back after 1.5 s, (f) a
    /// follower replaced by a new member at a new cluster address (a rolling restart
    /// of the others with the new list), (g) every member at once, restarted at once.
    #[arg(long, default_value = "abcd", value_parser = parse_faults)]
    faults: Faults,
}

/// The kinds of `--faults`, in `Fault::ALL` order.
#[derive(Clone, Debug)]
struct Faults(Vec<Fault>);

fn parse_faults(v: &str) -> Result<Faults, String> {
    if let Some(bad) = v.chars().find(|ch| !"abcdefghi".contains(*ch)) {
        return Err(format!(
            "unknown fault kind {bad:?} (a, b, c, d, e, f, g, h or i)"
        ));
    }
    let kinds: Vec<Fault> = Fault::ALL
        .iter()
        .zip("abcdefghi".chars())
        .filter(|(_, ch)| v.contains(*ch))
        .map(|(f, _)| *f)
        .collect();
    if kinds.is_empty() {
        return Err("no fault kind given".into());
    }
    Ok(Faults(kinds))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KillLeader,
    KillFollower,
    WipeLeader,
    Pause,
    WipeFollowers,
    Replace,
    KillAll,
    Move,
    Cut,
}

impl Fault {
    const ALL: [Fault; 9] = [
        Fault::KillLeader,
        Fault::KillFollower,
        Fault::WipeLeader,
        Fault::Pause,
        Fault::WipeFollowers,
        Fault::Replace,
        Fault::KillAll,
        Fault::Move,
        Fault::Cut,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "(a) kill -9 leader",
            Fault::KillFollower => "(b) kill -9 follower",
            Fault::WipeLeader => "(c) kill -9 leader, data path deleted",
            Fault::Pause => "(d) SIGSTOP 2 s",
            Fault::WipeFollowers => "(e) kill -9 both followers, data paths deleted",
            Fault::Replace => "(f) follower replaced by a new member at a new address",
            Fault::KillAll => "(g) kill -9 every member, restarted at once",
            Fault::Move => "(h) leadership moved to a follower (POST /topic/move-leader)",
            Fault::Cut => "(i) leader cut off from the others for 2 s",
        }
    }

    fn index(self) -> usize {
        Fault::ALL.iter().position(|f| *f == self).unwrap_or(0)
    }
}

/// Where the members listen and which are down (killed, or stopped) right now; shared
/// by the load threads, which only use members that are up.
struct Cluster {
    tcp: Vec<SocketAddr>,
    http: Vec<SocketAddr>,
    /// `--cluster-address` of each member (what `/cluster` names a leader by); fault (f)
    /// gives a member a new one.
    address: Mutex<Vec<String>>,
    down: Vec<AtomicBool>,
    /// The cycle under way (1-based; 0 before the first fault's cycle).
    cycle: AtomicU64,
    /// When the last fault was injected.
    last_fault: Mutex<Option<Instant>>,
    /// `--consumer-ms`: what the consumer spends on each message before its FIN, in odd
    /// cycles.
    consumer_delay: Duration,
    /// Set for the final drain: the consumer no longer spends `consumer_delay` on a
    /// message (a backlog left by a slow last cycle drains at full speed).
    draining: AtomicBool,
    /// Flags every member gets besides its identity (`--sync-every`).
    extra: Vec<String>,
    /// The member cut off by fault (i) and when, while the cut lasts.
    cut: Mutex<Option<(usize, Instant)>>,
}

impl Cluster {
    fn is_up(&self, i: usize) -> bool {
        !self.down[i].load(Ordering::SeqCst)
    }

    fn up(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MEMBERS).filter(|&i| self.is_up(i))
    }

    fn cycle(&self) -> u64 {
        self.cycle.load(Ordering::SeqCst)
    }
}

/// One acknowledged body: when, in which cycle, through which member.
struct Ack {
    at: Instant,
    cycle: u64,
    via: usize,
}

/// A body's deliveries.
struct Delivery {
    count: u32,
    first: Instant,
}

/// One subscription of the consumer.
struct Subscription {
    member: usize,
    cycle: u64,
    deliveries: u64,
    /// Deliveries of bodies received before.
    again: u64,
    /// Of those, bodies first received more than [`OLD`] before the last fault (lowest,
    /// highest, count).
    old: (u64, u64, u64),
}

/// One fault injected.
struct Injected {
    cycle: u64,
    fault: Fault,
    member: usize,
    was_leader: bool,
    at: Instant,
    /// The wall clock then, as the members' logs print it (UTC).
    clock: String,
}

/// What the checker has seen so far. Flat on purpose: one counter or record per figure
/// of the report, each updated where the event happens.
#[derive(Default)]
struct State {
    /// Bodies whose PUB/MPUB got OK.
    acked: BTreeMap<u64, Ack>,
    /// Next body number to publish.
    next: u64,
    /// Body -> deliveries.
    received: HashMap<u64, Delivery>,
    /// Deliveries of a body received before.
    redelivered: u64,
    /// Deliveries of a body first received more than [`OLD`] before the fault that
    /// preceded the delivery.
    old: u64,
    subscriptions: Vec<Subscription>,
    foreign: Vec<String>,
    /// Publishes answered with an error frame (E_PUB_FAILED, E_MPUB_FAILED, ...), and
    /// the first few texts.
    refused: u64,
    refusals: Vec<String>,
    /// When each publish refused or unanswered was sent.
    failed_sends: Vec<Instant>,
    /// Publishes whose connection failed before an answer.
    unanswered: u64,
    /// Longest time between two acknowledgements, and when it began.
    outage: (Duration, Option<Instant>),
    /// SUBs accepted, SUBs refused, connections a member that does not lead kept in
    /// its channel, connections it relays to the leader.
    subs: u64,
    sub_refused: u64,
    stale: u64,
    relayed: u64,
    /// Longest time without any member that says it leads, and when it began.
    leaderless: (Duration, Option<Instant>),
    /// Messages a member cut off by fault (i) delivered [`CUT_LATE`] or more after the
    /// cut: (cycle, milliseconds after the cut).
    cut_late: Vec<(u64, u128)>,
}

/// One member: its addresses, data path and the running process.
struct Member {
    dir: PathBuf,
    tcp: u16,
    http: u16,
    args: Vec<String>,
    broker: Option<Broker>,
    /// Log lines with a panic, FATAL or a misnumbered replicated batch, of every run of
    /// this member.
    alarms: Vec<String>,
    /// Where each run's log is appended.
    log_file: PathBuf,
    runs: u32,
    /// The file whose existence cuts the member off from the others (fault (i)).
    cut_file: PathBuf,
}

impl Member {
    /// Appends the current run's log to the member's log file and keeps its alarms.
    fn save_log(&mut self) {
        let Some(b) = &self.broker else { return };
        self.alarms.extend(b.alarms.lock().unwrap().iter().cloned());
        let lines = b.log.lock().unwrap().join("\n");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
        {
            let _ = writeln!(f, "---- run {} ----\n{lines}", self.runs);
        }
    }

    fn kill9(&mut self) {
        if let Some(b) = &mut self.broker {
            b.kill9();
        }
        self.save_log();
        self.broker = None;
    }

    fn pid(&self) -> Option<u32> {
        self.broker.as_ref().map(Broker::pid)
    }

    /// How many lines of the current run's log contain `needle`.
    fn log_count(&self, needle: &str) -> usize {
        self.broker.as_ref().map_or(0, |b| b.log_count(needle))
    }
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    BODY_BYTES.store(cli.body_bytes, Ordering::Relaxed);
    let seed = cli.tool.seed();
    let min_ms = cli.min_ms;
    let max_ms = cli.max_ms.max(min_ms + 1);
    let nsqd = cli.tool.nsqd();
    let mut failed = false;
    for (i, &shards) in cli.tool.shards.0.iter().enumerate() {
        let s = seed.wrapping_add(i as u64 * 7919);
        eprintln!(
            "cluster-chaos shards={shards}: seed {s}, {} faults of kinds {:?}, {min_ms}-{max_ms} ms apart, consumer {} ms per message in odd cycles, 3 members, broker {}",
            cli.cycles,
            cli.faults.0.iter().map(|f| f.name()).collect::<Vec<_>>(),
            cli.consumer_ms,
            nsqd.display()
        );
        let cfg = Config {
            shards,
            cycles: cli.cycles,
            seed: s,
            min_ms,
            max_ms,
            consumer_ms: cli.consumer_ms,
            faults: cli.faults.0.clone(),
            sync_every: cli.sync_every,
            overlap: cli.overlap,
        };
        match run(&nsqd, &cfg) {
            Ok(()) => eprintln!("cluster-chaos shards={shards}: PASS"),
            Err(e) => {
                eprintln!("cluster-chaos shards={shards}: FAIL: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}

/// One run's settings.
struct Config {
    shards: usize,
    cycles: u64,
    seed: u64,
    min_ms: u64,
    max_ms: u64,
    consumer_ms: u64,
    faults: Vec<Fault>,
    sync_every: Option<u64>,
    overlap: bool,
}

/// Starts member `m` on its ports and data path; waits for its cluster listener too.
// A `String` error: CLI-only, printed once before the tool exits.
fn start(nsqd: &Path, m: &mut Member, shards: usize) -> Result<(), String> {
    let mut last = String::new();
    // The ports were just released by the killed process; retry briefly if still busy.
    for _ in 0..40 {
        match Broker::start_with_env(
            nsqd,
            &m.dir,
            shards,
            &format!("127.0.0.1:{}", m.tcp),
            &format!("127.0.0.1:{}", m.http),
            &m.args,
            &[("NSQD_CLUSTER_CUT_FILE", m.cut_file.as_os_str())],
        ) {
            Ok(mut b) => {
                // The cluster listener binds after the client listeners; a member that
                // could not bind it exits (a port still held: start it again).
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    let listening = b
                        .log
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|l| l.contains("CLUSTER: listening on"));
                    if listening {
                        m.runs += 1;
                        m.broker = Some(b);
                        return Ok(());
                    }
                    if !b.alive() || Instant::now() > deadline {
                        b.kill9();
                        last = format!("no cluster listener: {}", b.log_tail(5).join(" | "));
                        break;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(250));
    }
    Err(format!("start failed: {last}"))
}

/// What member `http` says of the topic: (leader's cluster address, this member leads,
/// term). `None`: no answer, or it holds no group of the topic yet.
fn view(http: SocketAddr) -> Option<(Option<String>, bool, u64)> {
    let t = topic_state(http)?;
    Some((
        t["leader"].as_str().map(String::from),
        t["is_leader"] == true,
        t["term"].as_u64().unwrap_or(0),
    ))
}

/// Member `http`'s JSON answer to `GET path` (`None`: no answer in time, not 200, or
/// not JSON).
fn get_json(http: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let (code, body) = net::http_within(http, "GET", path, b"", ASK_TIMEOUT).ok()?;
    if code != 200 {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// How many clients member `http` lists in channel `c0` of the topic (`/stats`; `None`:
/// no answer, or no such channel there).
fn channel_clients(http: SocketAddr) -> Option<usize> {
    let path = format!("/stats?format=json&topic={TOPIC}&channel={CHANNEL}");
    get_json(http, &path)?["topics"]
        .as_array()?
        .iter()
        .find(|t| t["topic_name"] == TOPIC)?["channels"]
        .as_array()?
        .iter()
        .find(|ch| ch["channel_name"] == CHANNEL)?["clients"]
        .as_array()
        .map(Vec::len)
}

/// The topic's entry in member `http`'s `GET /cluster` (`None`: no answer, or no group
/// of the topic there).
fn topic_state(http: SocketAddr) -> Option<serde_json::Value> {
    get_json(http, "/cluster")?["topics"]
        .as_array()?
        .iter()
        .find(|t| t["topic"] == TOPIC)
        .cloned()
}

/// True when a member that leads the topic lists each of the members `among` as a
/// replica in sync (holding every committed entry).
fn in_sync(c: &Cluster, among: &[usize]) -> bool {
    let addresses = c.address.lock().unwrap().clone();
    (0..MEMBERS).any(|l| {
        let Some(t) = topic_state(c.http[l]) else {
            return false;
        };
        let replicas = t["replicas"].as_array().cloned().unwrap_or_default();
        t["is_leader"] == true
            && among.iter().all(|&i| {
                replicas
                    .iter()
                    .any(|r| r["address"] == addresses[i].as_str() && r["in_sync"] == true)
            })
    })
}

/// SIGTERM to every member, each of which must exit 0 having not exited by itself and
/// with no alarm in its log; their logs are saved. Failures go to `errors`.
fn stop_members(members: &mut [Member], errors: &mut Vec<String>) {
    for (i, m) in members.iter_mut().enumerate() {
        let Some(b) = &mut m.broker else { continue };
        if !b.alive() {
            errors.push(format!(
                "member {} exited by itself: {:?}",
                i + 1,
                b.log_tail(5)
            ));
        }
        match b.terminate(Duration::from_secs(20)) {
            Some(0) => {}
            other => errors.push(format!("member {}: SIGTERM: exit {other:?}", i + 1)),
        }
        m.save_log();
        m.broker = None;
        if !m.alarms.is_empty() {
            errors.push(format!(
                "member {}: panic/FATAL/misnumbered batch in its log: {:?}",
                i + 1,
                &m.alarms[..m.alarms.len().min(5)]
            ));
        }
    }
}

/// Prints how long the members took to be in sync again after each fault (ms).
fn report_in_sync(shards: usize, after: &mut [u64]) {
    if after.is_empty() {
        return;
    }
    after.sort_unstable();
    eprintln!(
        "cluster-chaos shards={shards}: every member in sync with the leader again, waited for after each fault's agreed leader: median {} ms, max {} ms",
        after[after.len() / 2],
        after[after.len() - 1]
    );
}

/// Waits (up to [`LEADER_WAIT`]) until every member holds what the leader committed:
/// the ms it took, or `None`.
fn wait_all_in_sync(c: &Cluster) -> Option<u64> {
    let all: Vec<usize> = (0..MEMBERS).collect();
    let since = Instant::now();
    // Under load a replica's match trails the commit by an append at times: once is
    // enough.
    while !in_sync(c, &all) {
        if since.elapsed() >= LEADER_WAIT {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
    Some(since.elapsed().as_millis() as u64)
}

/// True when member `http` leads the topic and its replicas are the members its
/// placement names, none a learner, each in sync: a move of the replicas is over.
fn settled(http: SocketAddr) -> bool {
    let Some(t) = topic_state(http) else {
        return false;
    };
    let replicas = t["replicas"].as_array().cloned().unwrap_or_default();
    let mut held: Vec<&str> = replicas
        .iter()
        .filter_map(|r| r["address"].as_str())
        .collect();
    let mut placed: Vec<&str> = t["placement"]
        .as_array()
        .map(|p| p.iter().filter_map(|a| a.as_str()).collect())
        .unwrap_or_default();
    held.sort_unstable();
    placed.sort_unstable();
    t["is_leader"] == true
        && held == placed
        && replicas
            .iter()
            .all(|r| r["learner"] == false && r["in_sync"] == true)
}

/// The depth of channel `c0` on member `http` (`None`: no answer, or no channel).
fn channel_depth(http: SocketAddr) -> Option<u64> {
    let (code, body) = net::http_within(
        http,
        "GET",
        &format!("/stats?format=json&topic={TOPIC}"),
        b"",
        ASK_TIMEOUT,
    )
    .ok()?;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let t = v["topics"]
        .as_array()?
        .iter()
        .find(|t| t["topic_name"] == TOPIC)?
        .clone();
    t["channels"]
        .as_array()?
        .iter()
        .find(|ch| ch["channel_name"] == CHANNEL)?["depth"]
        .as_u64()
}

/// The member that is up and says it leads (the highest term if several do).
fn claimant(c: &Cluster) -> Option<usize> {
    c.up()
        .filter_map(|i| view(c.http[i]).and_then(|(_, me, term)| me.then_some((term, i))))
        .max()
        .map(|(_, i)| i)
}

/// The leader every member that is up names, once they agree and it says it leads.
fn agreed_leader(c: &Cluster) -> Option<usize> {
    let up: Vec<usize> = c.up().collect();
    agreed_leader_among(c, &up)
}

/// [`agreed_leader`], polled every 50 ms for up to `within`.
fn wait_leader(c: &Cluster, within: Duration) -> Option<usize> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(l) = agreed_leader(c) {
            return Some(l);
        }
        thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Member `i`'s flags: its node id, its cluster address and the others' as peers, then
/// `extra`.
fn member_args(i: usize, address: &[String], extra: &[String]) -> Vec<String> {
    let mut args = vec![
        format!("--node-id={}", i + 1),
        format!("--cluster-address={}", address[i]),
    ];
    for (j, a) in address.iter().enumerate() {
        if j != i {
            args.push(format!("--cluster-peer={a}"));
        }
    }
    args.extend_from_slice(extra);
    args
}

/// The members' addresses, flags and data paths under `root`, none started yet.
fn setup(root: &Path, consumer_ms: u64, extra: Vec<String>) -> (Vec<Member>, Arc<Cluster>) {
    let ports: Vec<(u16, u16, u16)> = (0..MEMBERS)
        .map(|_| (net::free_port(), net::free_port(), net::free_port()))
        .collect();
    let address: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{}", p.2)).collect();
    let members: Vec<Member> = (0..MEMBERS)
        .map(|i| {
            let args = member_args(i, &address, &extra);
            let dir = root.join(format!("member{}", i + 1));
            std::fs::create_dir_all(&dir).unwrap();
            Member {
                dir,
                tcp: ports[i].0,
                http: ports[i].1,
                args,
                broker: None,
                alarms: Vec::new(),
                log_file: root.join(format!("member{}.log", i + 1)),
                runs: 0,
                cut_file: root.join(format!("member{}.cut", i + 1)),
            }
        })
        .collect();
    let c = Arc::new(Cluster {
        tcp: ports
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p.0)))
            .collect(),
        http: ports
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p.1)))
            .collect(),
        address: Mutex::new(address),
        down: (0..MEMBERS).map(|_| AtomicBool::new(false)).collect(),
        cycle: AtomicU64::new(0),
        last_fault: Mutex::new(None),
        consumer_delay: Duration::from_millis(consumer_ms),
        draining: AtomicBool::new(false),
        extra,
        cut: Mutex::new(None),
    });
    (members, c)
}

// A `String` error: CLI-only, printed once before the tool exits.
fn run(nsqd: &Path, cfg: &Config) -> Result<(), String> {
    let Config {
        shards,
        cycles,
        seed,
        min_ms,
        max_ms,
        consumer_ms,
        ref faults,
        sync_every,
        overlap,
    } = *cfg;
    let root = net::temp_data_dir("cluster-chaos");
    // CLUSTER_CHAOS_ARGS: more flags for every member (e.g. `--log-level=debug`, to see
    // each election's votes in the kept logs).
    let extra = sync_every
        .map(|n| format!("--sync-every={n}"))
        .into_iter()
        .chain(
            std::env::var("CLUSTER_CHAOS_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string),
        )
        .collect();
    let (mut members, c) = setup(&root, consumer_ms, extra);
    let t0 = Instant::now();
    for m in &mut members {
        start(nsqd, m, shards)?;
    }
    // The channel first, through the topic's group, so it gets every message.
    let deadline = Instant::now() + Duration::from_secs(30);
    for path in [
        format!("/topic/create?topic={TOPIC}"),
        format!("/channel/create?topic={TOPIC}&channel={CHANNEL}"),
    ] {
        loop {
            match net::http(c.http[0], "POST", &path, b"") {
                Ok((200, _)) => break,
                other if Instant::now() > deadline => return Err(format!("{path}: {other:?}")),
                _ => thread::sleep(Duration::from_millis(100)),
            }
        }
    }
    let Some(first) = wait_leader(&c, LEADER_WAIT) else {
        return Err("no leader of the topic after the start".into());
    };
    eprintln!(
        "cluster-chaos shards={shards}: members {:?}, first leader member {}",
        c.address.lock().unwrap(),
        first + 1
    );
    let state = Arc::new(Mutex::new(State::default()));
    let (load_stop, consumer_stop) = (Stop::default(), Stop::default());
    let publisher = {
        let (c, state, stop) = (c.clone(), state.clone(), load_stop.clone());
        thread::spawn(move || publish(&c, &state, &stop, seed))
    };
    let consumer = {
        let (c, state, stop) = (c.clone(), state.clone(), consumer_stop.clone());
        thread::spawn(move || consume(&c, &state, &stop))
    };
    let monitor = {
        let (c, state, stop) = (c.clone(), state.clone(), consumer_stop.clone());
        thread::spawn(move || watch_leader(&c, &state, &stop))
    };
    let mut rng = Rng::new(seed);
    let mut order: Vec<Fault> = Vec::new();
    let mut injected: Vec<Injected> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    // Per fault kind: time from the fault to an agreed leader (ms).
    let mut recovery: Vec<Vec<u64>> = vec![Vec::new(); Fault::ALL.len()];
    let mut moves: Vec<(u64, Instant, Instant)> = Vec::new();
    let mut paused_leaders = 0u64;
    // Per cycle after the first: how long after the agreed leader every member was in
    // sync again (ms).
    let mut in_sync_after: Vec<u64> = Vec::new();
    for cycle in 1..=cycles {
        c.cycle.store(cycle, Ordering::SeqCst);
        if order.is_empty() {
            order.clone_from(faults);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
        }
        let fault = order.pop().unwrap();
        // One member impaired at a time (unless --overlap): the last fault's member
        // holds what the leader committed before the next fault's delay starts.
        if !overlap && cycle > 1 {
            match wait_all_in_sync(&c) {
                Some(ms) => in_sync_after.push(ms),
                None => {
                    errors.push(format!(
                        "the members were not all in sync with the leader within {} s after cycle {}",
                        LEADER_WAIT.as_secs(),
                        cycle - 1
                    ));
                    break;
                }
            }
        }
        let delay = min_ms + rng.below((max_ms - min_ms) as usize) as u64;
        thread::sleep(Duration::from_millis(delay));
        let mut restarted = Ok(());
        for (i, m) in members.iter_mut().enumerate() {
            if m.broker.as_mut().is_some_and(|b| !b.alive()) {
                errors.push(format!(
                    "member {} exited by itself before cycle {cycle}: {:?}",
                    i + 1,
                    m.broker.as_ref().map(|b| b.log_tail(5))
                ));
                m.kill9();
                restarted = restarted.and(start(nsqd, m, shards));
            }
        }
        if let Err(e) = restarted {
            errors.push(e);
            break;
        }
        let Some(leader) = agreed_leader(&c).or_else(|| wait_leader(&c, LEADER_WAIT)) else {
            errors.push(format!("no agreed leader before cycle {cycle}"));
            break;
        };
        let victim = match fault {
            Fault::KillLeader | Fault::WipeLeader => leader,
            Fault::KillFollower => (leader + 1 + rng.below(MEMBERS - 1)) % MEMBERS,
            Fault::Pause => rng.below(MEMBERS),
            Fault::WipeFollowers => (leader + 1) % MEMBERS,
            Fault::Replace => (leader + 1 + rng.below(MEMBERS - 1)) % MEMBERS,
            Fault::KillAll => leader,
            Fault::Move => (leader + 1 + rng.below(MEMBERS - 1)) % MEMBERS,
            Fault::Cut => leader,
        };
        // (e) takes both followers down together, (g) every member.
        let victims: Vec<usize> = match fault {
            Fault::WipeFollowers => (0..MEMBERS).filter(|&i| i != leader).collect(),
            Fault::KillAll => (0..MEMBERS).collect(),
            // No member goes down: the leadership moves.
            Fault::Move => Vec::new(),
            _ => vec![victim],
        };
        let at = Instant::now();
        *c.last_fault.lock().unwrap() = Some(at);
        let clock = utc_clock();
        injected.push(Injected {
            cycle,
            fault,
            member: victim,
            was_leader: victim == leader,
            at,
            clock: clock.clone(),
        });
        for &v in &victims {
            c.down[v].store(true, Ordering::SeqCst);
        }
        paused_leaders += u64::from(fault == Fault::Pause && victim == leader);
        let injected_ok = if fault == Fault::WipeFollowers {
            wipe_both(nsqd, shards, &mut members, &victims)
        } else if fault == Fault::KillAll {
            kill_all(nsqd, shards, &mut members)
        } else if fault == Fault::Replace {
            replace(nsqd, shards, &mut members, &c, victim)
        } else if fault == Fault::Move {
            move_leader(&c, leader, victim)
        } else if fault == Fault::Cut {
            cut_off(&c, &members[victim], victim)
        } else {
            inject(nsqd, shards, &mut members[victim], fault)
        };
        if let Err(e) = injected_ok {
            errors.push(format!("cycle {cycle}, {}: {e}", fault.name()));
            break;
        }
        for &v in &victims {
            c.down[v].store(false, Ordering::SeqCst);
        }
        let Some(next) = wait_leader(&c, LEADER_WAIT) else {
            errors.push(format!(
                "no agreed leader within {} s after cycle {cycle}'s fault {}",
                LEADER_WAIT.as_secs(),
                fault.name()
            ));
            break;
        };
        let took = at.elapsed().as_millis() as u64;
        recovery[fault.index()].push(took);
        if fault == Fault::Move {
            moves.push((cycle, at, Instant::now() + Duration::from_millis(300)));
        }
        let s = state.lock().unwrap();
        eprintln!(
            "cluster-chaos shards={shards} cycle {cycle}: after {delay} ms, at {clock} UTC, {} on member {} ({}); agreed leader member {} after {took} ms; acknowledged so far {}, received {} (and {} again)",
            fault.name(),
            victim + 1,
            if victim == leader { "the leader" } else { "a follower" },
            next + 1,
            s.acked.len(),
            s.received.len(),
            s.redelivered,
        );
    }
    load_stop.set();
    let _ = publisher.join();
    // Final drain, at full speed.
    c.draining.store(true, Ordering::SeqCst);
    let drain_start = Instant::now();
    while drain_start.elapsed() < DRAIN_WAIT {
        let done = {
            let s = state.lock().unwrap();
            s.acked.keys().all(|k| s.received.contains_key(k))
        };
        if done {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let drained_in = drain_start.elapsed();
    thread::sleep(Duration::from_millis(500));
    consumer_stop.set();
    let _ = consumer.join();
    let _ = monitor.join();
    // Every member has applied the last cursor by now: its channel's depth is what it
    // would deliver if it led next (0: nothing is unfinished).
    thread::sleep(Duration::from_millis(500));
    let end_leader = agreed_leader(&c);
    let end: Vec<String> = (0..MEMBERS)
        .map(|i| {
            format!(
                "member {}{} {}",
                i + 1,
                if end_leader == Some(i) {
                    " (leader)"
                } else {
                    ""
                },
                channel_depth(c.http[i]).map_or("?".into(), |n| n.to_string()),
            )
        })
        .collect();
    stop_members(&mut members, &mut errors);
    report_in_sync(shards, &mut in_sync_after);
    let summary = Summary {
        shards,
        injected: &injected,
        recovery: &recovery,
        paused_leaders,
        elapsed: t0.elapsed(),
        drained_in,
        end: &end,
        moves: &moves,
    };
    report(&state.lock().unwrap(), &summary, &mut errors);
    if errors.is_empty() && std::env::var_os("CLUSTER_CHAOS_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&root);
        Ok(())
    } else if errors.is_empty() {
        eprintln!(
            "cluster-chaos shards={shards}: data paths and member logs kept in {} (CLUSTER_CHAOS_KEEP)",
            root.display()
        );
        Ok(())
    } else {
        eprintln!(
            "cluster-chaos shards={shards}: data paths and member logs kept in {}",
            root.display()
        );
        Err(errors.join("; "))
    }
}

/// What the run itself measured, for [`report`].
struct Summary<'a> {
    shards: usize,
    injected: &'a [Injected],
    /// Per fault kind: ms from each fault to an agreed leader.
    recovery: &'a [Vec<u64>],
    paused_leaders: u64,
    elapsed: Duration,
    drained_in: Duration,
    /// Each member's channel depth at the end.
    end: &'a [String],
    /// Fault (h)'s cycles: from the move to 300 ms after the agreed leader (what a
    /// publish sent meanwhile must not be refused for).
    moves: &'a [(u64, Instant, Instant)],
}

/// Checks the deliveries against the acknowledgements (losses and foreign bodies go to
/// `errors`) and prints the summary.
fn report(s: &State, sum: &Summary, errors: &mut Vec<String>) {
    let Summary {
        shards,
        injected,
        recovery,
        paused_leaders,
        elapsed,
        drained_in,
        end,
        moves,
    } = *sum;
    let lost: Vec<u64> = s
        .acked
        .keys()
        .copied()
        .filter(|k| !s.received.contains_key(k))
        .collect();
    if !lost.is_empty() {
        errors.push(format!(
            "{} acknowledged bodies lost: {}",
            lost.len(),
            describe_losses(&lost, &s.acked, injected)
        ));
    }
    if !s.cut_late.is_empty() {
        errors.push(format!(
            "{} message(s) delivered by a leader cut off by {} {} ms or more after the cut (cycle, ms after the cut: first {:?})",
            s.cut_late.len(),
            Fault::Cut.name(),
            CUT_LATE.as_millis(),
            &s.cut_late[..s.cut_late.len().min(10)]
        ));
    }
    for &(cycle, from, to) in moves {
        let n = s
            .failed_sends
            .iter()
            .filter(|&&t| t >= from && t <= to)
            .count();
        if n > 0 {
            errors.push(format!(
                "cycle {cycle}, {}: {n} publishes sent while the leadership moved were refused or unanswered (first refusals of the run: {:?})",
                Fault::Move.name(),
                &s.refusals
            ));
        }
    }
    if s.stale > 0 {
        errors.push(format!(
            "{} consumer connections stayed in the channel of a member that no longer led the topic",
            s.stale
        ));
    }
    if !s.foreign.is_empty() {
        errors.push(format!(
            "foreign bodies received: {:?}",
            &s.foreign[..s.foreign.len().min(5)]
        ));
    }
    let duplicates = s.received.values().filter(|d| d.count > 1).count();
    let most = s.received.values().map(|d| d.count).max().unwrap_or(0);
    let unacked = s
        .received
        .keys()
        .filter(|k| !s.acked.contains_key(k))
        .count();
    let mut counts = [0u64; Fault::ALL.len()];
    for f in injected {
        counts[f.fault.index()] += 1;
    }
    let kinds: Vec<String> = Fault::ALL
        .iter()
        .filter(|f| counts[f.index()] > 0)
        .map(|f| {
            let mut r = recovery[f.index()].clone();
            r.sort_unstable();
            format!(
                "{} x{}: median {} ms, max {} ms",
                f.name(),
                counts[f.index()],
                r.get(r.len() / 2).copied().unwrap_or(0),
                r.last().copied().unwrap_or(0),
            )
        })
        .collect();
    eprintln!(
        "cluster-chaos shards={shards}: {} cycles in {:.1} s, faults a/b/c/d/e/f/g/h/i {}/{}/{}/{}/{}/{}/{}/{}/{} ({paused_leaders} SIGSTOPs hit the leader); {} PUBs acknowledged of {} sent ({} refused, {} unanswered); {} distinct received, {} lost, {duplicates} received more than once (at most {most} times; {} redeliveries, {} of bodies first received over {} s before the preceding fault), {unacked} received whose PUB got no OK, {} foreign; longest without a leader {} ms ({}); longest publish outage {} ms ({}); consumer: {} SUBs, {} refused, {} connections served by a member that does not lead, {} relayed to the leader; final drain {:.1} s",
        injected.len(),
        elapsed.as_secs_f64(),
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        counts[4],
        counts[5],
        counts[6],
        counts[7],
        counts[8],
        s.acked.len(),
        s.next,
        s.refused,
        s.unanswered,
        s.received.len(),
        lost.len(),
        s.redelivered,
        s.old,
        OLD.as_secs(),
        s.foreign.len(),
        s.leaderless.0.as_millis(),
        fault_near(s.leaderless, injected),
        s.outage.0.as_millis(),
        fault_near(s.outage, injected),
        s.subs,
        s.sub_refused,
        s.stale,
        s.relayed,
        drained_in.as_secs_f64(),
    );
    eprintln!(
        "cluster-chaos shards={shards}: from each fault to an agreed leader: {}",
        kinds.join("; ")
    );
    eprintln!(
        "cluster-chaos shards={shards}: at the end, with nothing unfinished, channel {CHANNEL}'s depth on {}",
        end.join("; ")
    );
    for x in s.subscriptions.iter().filter(|x| x.old.2 > 0) {
        eprintln!(
            "cluster-chaos shards={shards}: the subscription to member {} in cycle {} redelivered {} bodies first received over {} s before the preceding fault (bodies {}-{}; {} deliveries, {} of them redeliveries)",
            x.member + 1,
            x.cycle,
            x.old.2,
            OLD.as_secs(),
            x.old.0,
            x.old.1,
            x.deliveries,
            x.again,
        );
    }
    if !s.refusals.is_empty() {
        eprintln!(
            "cluster-chaos shards={shards}: first publish refusals: {:?}",
            s.refusals
        );
    }
}

/// The fault a gap (its length and start) belongs to: the first one injected during it,
/// or else the last one before it.
fn fault_near(gap: (Duration, Option<Instant>), injected: &[Injected]) -> String {
    let Some(start) = gap.1 else {
        return "none".into();
    };
    let end = start + gap.0;
    injected
        .iter()
        .find(|f| f.at >= start && f.at <= end)
        .or_else(|| injected.iter().rev().find(|f| f.at < start))
        .map_or_else(
            || "before the first fault".into(),
            |f| {
                format!(
                    "cycle {}, {} on member {}{}",
                    f.cycle,
                    f.fault.name(),
                    f.member + 1,
                    if f.was_leader { ", the leader" } else { "" }
                )
            },
        )
}

/// Applies `fault` to member `m`: kill -9 and restart at once (on an emptied data path
/// for (c)), or SIGSTOP for [`STOP_FOR`] and SIGCONT.
// A `String` error: CLI-only, printed once before the tool exits.
fn inject(nsqd: &Path, shards: usize, m: &mut Member, fault: Fault) -> Result<(), String> {
    match fault {
        Fault::KillLeader | Fault::KillFollower | Fault::WipeLeader => {
            m.kill9();
            if fault == Fault::WipeLeader {
                std::fs::remove_dir_all(&m.dir).map_err(|e| format!("wipe: {e}"))?;
                std::fs::create_dir_all(&m.dir).map_err(|e| format!("wipe: {e}"))?;
            }
            start(nsqd, m, shards)
        }
        Fault::Pause => {
            let pid = m.pid().ok_or("no process to stop")?.to_string();
            signal("-STOP", &pid);
            thread::sleep(STOP_FOR);
            signal("-CONT", &pid);
            Ok(())
        }
        Fault::Cut => Err("(i) is timed against the consumer: cut_off".into()),
        Fault::WipeFollowers => Err("(e) takes two members: wipe_both".into()),
        Fault::Replace => Err("(f) restarts every member: replace".into()),
        Fault::KillAll => Err("(g) takes every member: kill_all".into()),
        Fault::Move => Err("(h) stops no member: move_leader".into()),
    }
}

/// Fault (i): cuts member `i` (`m`) off from the others for [`STOP_FOR`] while it runs
/// ([`Member::cut_file`]). The consumer's check ([`CUT_LATE`]) covers the cut and ends
/// before the member is joined again: what comes after is the new leader's.
fn cut_off(c: &Cluster, m: &Member, i: usize) -> Result<(), String> {
    let seen_before = m.log_count(CUT_LINE);
    *c.cut.lock().unwrap() = Some((i, Instant::now()));
    let written = std::fs::write(&m.cut_file, b"");
    thread::sleep(STOP_FOR);
    *c.cut.lock().unwrap() = None;
    let _ = std::fs::remove_file(&m.cut_file);
    written.map_err(|e| format!("cut: {e}"))?;
    if m.log_count(CUT_LINE) == seen_before {
        return Err(format!(
            "the member did not log {CUT_LINE:?}: (i) needs a broker built with the fault-injection feature"
        ));
    }
    Ok(())
}

/// Fault (h): `POST /topic/move-leader` on the leader hands the topic to member `to`;
/// it must answer 200 (once `to` leads). Publishes meanwhile wait for the new leader:
/// one sent from the move until 300 ms after the agreed leader and refused fails the
/// run.
fn move_leader(c: &Cluster, leader: usize, to: usize) -> Result<(), String> {
    let address = c.address.lock().unwrap()[to].clone();
    let (code, body) = net::http_within(
        c.http[leader],
        "POST",
        &format!("/topic/move-leader?topic={TOPIC}&to={address}"),
        b"",
        Duration::from_secs(10),
    )
    .map_err(|e| format!("move-leader: {e}"))?;
    if code != 200 {
        return Err(format!(
            "move-leader answered {code} {}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(())
}

/// Fault (g): every member killed with kill -9 at once (a power cut, short of the page
/// cache: see RELIABILITY.md) and every one restarted at once on its data path.
// A `String` error: CLI-only, printed once before the tool exits.
fn kill_all(nsqd: &Path, shards: usize, members: &mut [Member]) -> Result<(), String> {
    for m in members.iter_mut() {
        m.kill9();
    }
    for m in members.iter_mut() {
        start(nsqd, m, shards)?;
    }
    Ok(())
}

/// Fault (f): member `victim` (a follower) is lost with its disk and a new member takes
/// its place at a new cluster address (same client ports and node id, empty data
/// path); then the others restart one at a time, at once each, with the new member in
/// their `--cluster-peer` list instead of the lost one, each once the others are in
/// sync with the leader (and 300 ms more, for their vote floors). The topic's leader moves its replicas to
/// the new member (learner, voter, removal of the lost one: docs/replication.md,
/// "Adding and removing members"). It ends once they have.
// A `String` error: CLI-only, printed once before the tool exits.
fn replace(
    nsqd: &Path,
    shards: usize,
    members: &mut [Member],
    c: &Cluster,
    victim: usize,
) -> Result<(), String> {
    let m = &mut members[victim];
    m.kill9();
    std::fs::remove_dir_all(&m.dir).map_err(|e| format!("wipe: {e}"))?;
    std::fs::create_dir_all(&m.dir).map_err(|e| format!("wipe: {e}"))?;
    let addresses = {
        let mut a = c.address.lock().unwrap();
        a[victim] = format!("127.0.0.1:{}", net::free_port());
        a.clone()
    };
    for (i, m) in members.iter_mut().enumerate() {
        m.args = member_args(i, &addresses, &c.extra);
    }
    start(nsqd, &mut members[victim], shards)?;
    c.down[victim].store(false, Ordering::SeqCst);
    let old: Vec<usize> = (0..MEMBERS).filter(|&j| j != victim).collect();
    for &i in &old {
        // A rolling restart, as an operator does it: the next member goes once the
        // others hold what the leader committed (and their vote floors are saved), so
        // that no two members lose their in-memory Raft logs within the window that
        // docs/replication.md, "Guarantees", describes.
        let deadline = Instant::now() + LEADER_WAIT;
        while !in_sync(c, &old) {
            if Instant::now() > deadline {
                return Err(format!(
                    "members {:?} never in sync before member {} restarted",
                    old.iter().map(|j| j + 1).collect::<Vec<_>>(),
                    i + 1
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(300));
        c.down[i].store(true, Ordering::SeqCst);
        members[i].kill9();
        start(nsqd, &mut members[i], shards)?;
        c.down[i].store(false, Ordering::SeqCst);
        let deadline = Instant::now() + LEADER_WAIT;
        while agreed_leader_among(c, &old).is_none() {
            if Instant::now() > deadline {
                return Err(format!(
                    "no leader the old members agree on after member {} restarted",
                    i + 1
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
    // The next fault waits until the topic's replicas are the new placement (a second
    // member lost while the group still counts the lost one would leave no quorum).
    let deadline = Instant::now() + LEADER_WAIT;
    while !(0..MEMBERS).any(|i| settled(c.http[i])) {
        if Instant::now() > deadline {
            return Err("the replicas never moved to the new member".into());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The leader the members `among` all name, once it is one of them and the only one of
/// them that says it leads (a new member knows no leader until the group takes it in,
/// so fault (f) asks the old members only).
fn agreed_leader_among(c: &Cluster, among: &[usize]) -> Option<usize> {
    let mut named: Option<String> = None;
    let mut leading = Vec::new();
    for &i in among {
        let (leader, me, _) = view(c.http[i])?;
        let leader = leader?;
        if named.as_ref().is_some_and(|n| *n != leader) {
            return None;
        }
        named = Some(leader);
        if me {
            leading.push(i);
        }
    }
    let l = c
        .address
        .lock()
        .unwrap()
        .iter()
        .position(|a| Some(a) == named.as_ref())?;
    (leading == [l]).then_some(l)
}

/// Fault (e): kill -9 the members `victims` (both followers), delete their data paths,
/// wait [`WIPED_FOR`] (longer than the election timeout, so the leader steps down for
/// want of a quorum) and start them again, empty.
// A `String` error: CLI-only, printed once before the tool exits.
fn wipe_both(
    nsqd: &Path,
    shards: usize,
    members: &mut [Member],
    victims: &[usize],
) -> Result<(), String> {
    for &v in victims {
        let m = &mut members[v];
        m.kill9();
        std::fs::remove_dir_all(&m.dir).map_err(|e| format!("wipe: {e}"))?;
        std::fs::create_dir_all(&m.dir).map_err(|e| format!("wipe: {e}"))?;
    }
    thread::sleep(WIPED_FOR);
    for &v in victims {
        start(nsqd, &mut members[v], shards)?;
    }
    Ok(())
}

/// The time of day in UTC, `HH:MM:SS.mmm`, to find a fault in the members' logs.
fn utc_clock() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let day_ms = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// `kill SIG PID` (SIGSTOP, SIGCONT).
fn signal(sig: &str, pid: &str) {
    let _ = std::process::Command::new("kill")
        .arg(sig)
        .arg(pid)
        .status();
}

/// The lost bodies as runs of consecutive numbers, each with the cycle and member its
/// acknowledgement came in and the first fault after it.
fn describe_losses(lost: &[u64], acked: &BTreeMap<u64, Ack>, injected: &[Injected]) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &k in lost {
        match runs.last_mut() {
            Some(r) if r.1 + 1 == k => r.1 = k,
            _ => runs.push((k, k)),
        }
    }
    let described: Vec<String> = runs
        .iter()
        .take(20)
        .map(|&(a, b)| {
            let Some(ack) = acked.get(&a) else {
                return format!("{a}-{b}");
            };
            let next = injected.iter().find(|f| f.at >= ack.at).map(|f| {
                format!(
                    "{} ms before cycle {}'s {} on member {}{} at {} UTC",
                    (f.at - ack.at).as_millis(),
                    f.cycle,
                    f.fault.name(),
                    f.member + 1,
                    if f.was_leader { " (the leader)" } else { "" },
                    f.clock
                )
            });
            format!(
                "bodies {a}-{b} ({} acknowledged in cycle {} through member {}, {})",
                b - a + 1,
                ack.cycle,
                ack.via + 1,
                next.unwrap_or_else(|| "after the last fault".into())
            )
        })
        .collect();
    let more = if runs.len() > 20 {
        format!(" and {} more runs", runs.len() - 20)
    } else {
        String::new()
    };
    format!("{}{more}", described.join(", "))
}

/// `--body-bytes`.
static BODY_BYTES: AtomicUsize = AtomicUsize::new(16);

/// Body `k`: `chaos-` and `k` in 10 digits, padded with dots to `--body-bytes`.
fn body_of(k: u64) -> Vec<u8> {
    let mut b = format!("chaos-{k:010}").into_bytes();
    b.resize(BODY_BYTES.load(Ordering::Relaxed).max(b.len()), b'.');
    b
}

/// Polls the members that are up every 100 ms and records the longest time during which
/// none said it leads.
fn watch_leader(c: &Cluster, state: &Mutex<State>, stop: &Stop) {
    let mut since: Option<Instant> = None;
    while !stop.is_set() {
        if claimant(c).is_some() {
            if let Some(t) = since.take() {
                let gap = t.elapsed();
                let mut s = state.lock().unwrap();
                if gap > s.leaderless.0 {
                    s.leaderless = (gap, Some(t));
                }
            }
        } else if since.is_none() {
            since = Some(Instant::now());
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Publishes to random members that are up until `stop`.
fn publish(c: &Cluster, state: &Mutex<State>, stop: &Stop, seed: u64) {
    let mut rng = Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut round = 0u64;
    let mut last_ack = Instant::now();
    while !stop.is_set() {
        let up: Vec<usize> = c.up().collect();
        if up.is_empty() {
            thread::sleep(Duration::from_millis(20));
            continue;
        }
        let via = up[rng.below(up.len())];
        match net::v2(c.tcp[via], Duration::from_secs(10)) {
            Ok(mut s) => publish_on(&mut s, via, c, &mut round, &mut last_ack, state, stop),
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Publishes on one connection to member `via` until it fails, 200 commands, or `stop`.
fn publish_on(
    s: &mut std::net::TcpStream,
    via: usize,
    c: &Cluster,
    round: &mut u64,
    last_ack: &mut Instant,
    state: &Mutex<State>,
    stop: &Stop,
) {
    for _ in 0..200 {
        if stop.is_set() {
            return;
        }
        let (cmd, nums) = {
            let mut st = state.lock().unwrap();
            let first = st.next;
            let n = if *round % 5 == 4 { 4 } else { 1 };
            st.next += n;
            let nums: Vec<u64> = (first..first + n).collect();
            let cmd = if n == 1 {
                net::pub_cmd(TOPIC, &body_of(first))
            } else {
                net::mpub_cmd(TOPIC, &nums.iter().map(|&k| body_of(k)).collect::<Vec<_>>())
            };
            (cmd, nums)
        };
        *round += 1;
        let sent = Instant::now();
        if s.write_all(&cmd).is_err() {
            let mut st = state.lock().unwrap();
            st.unanswered += 1;
            st.failed_sends.push(sent);
            return;
        }
        match net::expect_response(s, |_| {}) {
            Ok((0, d)) if d == b"OK" => {
                let now = Instant::now();
                let gap = now - *last_ack;
                let cycle = c.cycle();
                let mut st = state.lock().unwrap();
                if gap > st.outage.0 {
                    st.outage = (gap, Some(*last_ack));
                }
                *last_ack = now;
                for k in nums {
                    st.acked.insert(
                        k,
                        Ack {
                            at: now,
                            cycle,
                            via,
                        },
                    );
                }
            }
            Ok((_, d)) => {
                let mut st = state.lock().unwrap();
                st.refused += 1;
                st.failed_sends.push(sent);
                if st.refusals.len() < 5 {
                    st.refusals.push(String::from_utf8_lossy(&d).into_owned());
                }
                return;
            }
            Err(_) => {
                let mut st = state.lock().unwrap();
                st.unanswered += 1;
                st.failed_sends.push(sent);
                return;
            }
        }
    }
}

/// Records one delivery of body `k` on subscription `sub`.
fn record(st: &mut State, sub: usize, k: u64, last_fault: Option<Instant>) {
    let now = Instant::now();
    let d = st.received.entry(k).or_insert(Delivery {
        count: 0,
        first: now,
    });
    d.count += 1;
    let again = d.count > 1;
    let old = again && last_fault.is_some_and(|f| d.first + OLD < f);
    st.redelivered += u64::from(again);
    st.old += u64::from(old);
    let s = &mut st.subscriptions[sub];
    s.deliveries += 1;
    s.again += u64::from(again);
    if old {
        s.old = (s.old.0.min(k), s.old.1.max(k), s.old.2 + 1);
    }
}

/// Consumes channel `c0` on the topic's leader until `stop`, following the leader.
fn consume(c: &Cluster, state: &Mutex<State>, stop: &Stop) {
    while !stop.is_set() {
        let Some(leader) = claimant(c) else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        let Ok(mut s) = net::v2(c.tcp[leader], Duration::from_secs(10)) else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        if s.write_all(format!("SUB {TOPIC} {CHANNEL}\nRDY 50\n").as_bytes())
            .is_err()
        {
            continue;
        }
        match net::expect_response(&mut s, |_| {}) {
            Ok((0, d)) if d == b"OK" => state.lock().unwrap().subs += 1,
            Ok(_) => {
                state.lock().unwrap().sub_refused += 1;
                thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(_) => continue,
        }
        let sub = {
            let mut st = state.lock().unwrap();
            st.subscriptions.push(Subscription {
                member: leader,
                cycle: c.cycle(),
                deliveries: 0,
                again: 0,
                old: (u64::MAX, 0, 0),
            });
            st.subscriptions.len() - 1
        };
        consume_on(&mut s, leader, sub, c, state, stop);
    }
}

/// Whether nothing waits to be read on `s` now.
fn nothing_waiting(s: &std::net::TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let empty = matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == ErrorKind::WouldBlock);
    let _ = s.set_nonblocking(false);
    empty
}

/// Reads, records and FINs on one subscribed connection to member `at` until it closes,
/// `stop`, or `at` has not led for 2 s while the connection stays open.
fn consume_on(
    s: &mut std::net::TcpStream,
    at: usize,
    sub: usize,
    c: &Cluster,
    state: &Mutex<State>,
    stop: &Stop,
) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_check = Instant::now();
    let mut deposed: Option<Instant> = None;
    let mut relayed = false;
    while !stop.is_set() {
        if last_check.elapsed() > Duration::from_secs(1) && c.is_up(at) {
            last_check = Instant::now();
            match view(c.http[at]) {
                Some((_, false, _)) if !relayed => {
                    let since = *deposed.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(2) {
                        // A member that does not lead serves a SUB through the leader
                        // (docs/replication.md): such a connection is in none of its
                        // channels and goes on. One in its channel is a follower
                        // serving a consumer of its own.
                        match channel_clients(c.http[at]) {
                            Some(0) => {
                                state.lock().unwrap().relayed += 1;
                                relayed = true;
                            }
                            Some(_) => {
                                state.lock().unwrap().stale += 1;
                                return;
                            }
                            None => {}
                        }
                    }
                }
                Some((_, true, _)) => deposed = None,
                _ => {}
            }
        }
        // While `at` is cut off (fault (i)): when this read began with nothing waiting
        // in the socket, what it returns was sent after that. (With something waiting,
        // it may have been sent at any time before.)
        let empty_since = match *c.cut.lock().unwrap() {
            Some((m, t)) if m == at && nothing_waiting(s) => Some(t.elapsed()),
            _ => None,
        };
        let n = match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        };
        // Only what came while the cut lasts.
        let empty_since =
            empty_since.filter(|_| c.cut.lock().unwrap().is_some_and(|(m, _)| m == at));
        pending.extend_from_slice(&buf[..n]);
        let mut out = Vec::new();
        let mut used = 0;
        while pending.len() - used >= 8 {
            let size = u32::from_be_bytes(pending[used..used + 4].try_into().unwrap()) as usize;
            if size < 4 || pending.len() - used < 4 + size {
                break;
            }
            let ft = i32::from_be_bytes(pending[used + 4..used + 8].try_into().unwrap());
            let d = &pending[used + 8..used + 4 + size];
            if ft == 0 && d == b"_heartbeat_" {
                out.extend_from_slice(b"NOP\n");
            } else if ft == 2 {
                if let Some((_, id, body)) = net::parse_message(d) {
                    let last_fault = *c.last_fault.lock().unwrap();
                    let mut st = state.lock().unwrap();
                    match std::str::from_utf8(body)
                        .ok()
                        .and_then(|b| b.strip_prefix("chaos-"))
                        .filter(|b| b.len() >= 10 && b[10..].bytes().all(|c| c == b'.'))
                        .and_then(|n| n[..10].parse::<u64>().ok())
                    {
                        Some(k) => {
                            record(&mut st, sub, k, last_fault);
                            if let Some(late) = empty_since.filter(|&d| d >= CUT_LATE) {
                                st.cut_late.push((c.cycle(), late.as_millis()));
                            }
                        }
                        None => st.foreign.push(String::from_utf8_lossy(body).into_owned()),
                    }
                    drop(st);
                    if !c.consumer_delay.is_zero()
                        && c.cycle() % 2 == 1
                        && !c.draining.load(Ordering::SeqCst)
                    {
                        thread::sleep(c.consumer_delay);
                    }
                    out.extend_from_slice(b"FIN ");
                    out.extend_from_slice(&id);
                    out.push(b'\n');
                }
            }
            used += 4 + size;
        }
        pending.drain(..used);
        if !out.is_empty() && s.write_all(&out).is_err() {
            return;
        }
    }
}
