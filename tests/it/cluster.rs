//! Replication (docs/replication.md): three brokers on loopback with `--cluster-address`
//! and `--cluster-peer`, each with its own shard count (the frames between them are
//! routed to each node's owning shard). Publishes through any member reach every
//! replica with the leader's message IDs; only the leader serves consumers (a follower
//! relays its consumers to it) and is listed by nsqlookupd; a leader killed with `kill -9` is replaced and its unfinished
//! messages are delivered by the new one; a publish needs a quorum; a restarted member
//! catches up without duplicates.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common::{
    self, dpub_cmd, eventually, expect_ok, line, mpub_cmd, parse_message, pub_cmd,
    read_frame_skip_hb, send, wait_for, Broker, Lookupd,
};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Three members to start with (more with [`Cluster::add_member`]); `nodes[i]` is
/// `None` while member `i` is down.
struct Cluster {
    nodes: Vec<Option<Broker>>,
    addresses: Vec<String>,
    dirs: Vec<PathBuf>,
    shards: Vec<usize>,
    extra: Vec<String>,
    /// The members each one lists (`--cluster-address` and `--cluster-peer`) when it
    /// starts.
    members: Vec<usize>,
}

impl Cluster {
    fn start(shards: [usize; 3], extra: &[&str]) -> Cluster {
        let mut c = Cluster {
            nodes: Vec::new(),
            addresses: Vec::new(),
            dirs: Vec::new(),
            shards: Vec::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            members: vec![0, 1, 2],
        };
        for n in shards {
            c.add_member(n);
        }
        for i in 0..3 {
            c.start_node(i);
        }
        c
    }

    /// A member with its own address and data path, not started and not yet in
    /// [`Cluster::members`]; returns its index.
    fn add_member(&mut self, shards: usize) -> usize {
        let i = self.nodes.len();
        let address = format!("127.0.0.1:{}", common::reserved_port());
        let first = self.addresses.first().unwrap_or(&address).clone();
        let d = std::env::temp_dir().join(format!(
            "nsqd-cluster-{}-{}-{i}",
            std::process::id(),
            first.replace([':', '.'], "_")
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        self.nodes.push(None);
        self.addresses.push(address);
        self.dirs.push(d);
        self.shards.push(shards);
        i
    }

    /// Starts member `i` on its data path, at once (as a supervisor restarts it).
    fn start_node(&mut self, i: usize) {
        let mut args = vec![
            format!("--node-id={}", i + 1),
            format!("--cluster-address={}", self.addresses[i]),
        ];
        for &j in &self.members {
            if j != i {
                args.push(format!("--cluster-peer={}", self.addresses[j]));
            }
        }
        args.extend(self.extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cut = self.cut_file(i);
        let env = [("NSQD_CLUSTER_CUT_FILE", cut.to_str().unwrap())];
        self.nodes[i] = Some(Broker::start_in_env(
            &self.dirs[i],
            self.shards[i],
            &args,
            &env,
        ));
    }

    /// The file whose existence cuts member `i` off from the others while it runs
    /// (`NSQD_CLUSTER_CUT_FILE`, with the `fault-injection` feature): beside its data
    /// path.
    fn cut_file(&self, i: usize) -> PathBuf {
        let mut name = self.dirs[i].clone().into_os_string();
        name.push(".cut");
        PathBuf::from(name)
    }

    /// Cuts member `i` off from the others (`true`; its cluster connections stay open
    /// and carry nothing, as in a network partition) or joins it again (`false`).
    #[cfg(feature = "fault-injection")]
    fn cut(&self, i: usize, cut: bool) {
        if cut {
            std::fs::write(self.cut_file(i), b"").unwrap();
        } else {
            let _ = std::fs::remove_file(self.cut_file(i));
        }
    }

    fn node(&self, i: usize) -> &Broker {
        self.nodes[i].as_ref().expect("member is up")
    }

    fn up(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_some())
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut b) = self.nodes[i].take() {
            b.kill9();
        }
    }

    /// `GET /cluster` of member `i`.
    fn state(&self, i: usize) -> serde_json::Value {
        let (code, body) = self.node(i).http("GET", "/cluster", b"");
        if code != 200 {
            // A member too busy to answer in time: no state this round.
            return serde_json::Value::Null;
        }
        serde_json::from_slice(&body).unwrap()
    }

    /// The member every member that is up names as `topic`'s leader, once they agree
    /// and it says it leads.
    fn leader(&self, topic: &str) -> Option<usize> {
        self.leader_named(topic, false)
    }

    /// [`Cluster::leader`] among the members that hold a replica of `topic` (members
    /// that hold none are not asked: the cluster has more members than replicas).
    fn holders_leader(&self, topic: &str) -> Option<usize> {
        self.leader_named(topic, true)
    }

    fn leader_named(&self, topic: &str, holders_only: bool) -> Option<usize> {
        let mut named: Option<String> = None;
        for i in self.up() {
            let st = self.state(i);
            let found = st["topics"]
                .as_array()?
                .iter()
                .find(|t| t["topic"] == topic)
                .cloned();
            let t = match found {
                // A member that knows no leader of the group yet: one being added.
                Some(t) if holders_only && t["leader"].is_null() => continue,
                Some(t) => t,
                None if holders_only => continue,
                None => return None,
            };
            let addr = t["leader"].as_str()?.to_string();
            if named.as_ref().is_some_and(|n| *n != addr) {
                return None;
            }
            named = Some(addr);
        }
        let l = self
            .addresses
            .iter()
            .position(|a| Some(a) == named.as_ref())?;
        (self.nodes[l].is_some()
            && self.state(l)["topics"]
                .as_array()?
                .iter()
                .any(|t| t["topic"] == topic && t["is_leader"] == true))
        .then_some(l)
    }

    /// Makes `topic` through `/topic/create` on member 0 and returns its leader. The
    /// first election of members started moments ago waits out their no-saved-state
    /// grace (3 s: docs/replication.md, "Guarantees") and, on a loaded machine, can
    /// run past the 5 s a replicated change waits for a leader; `/topic/create` is then
    /// asked again, as a client would retry (a repeated `TopicCreate` changes nothing).
    fn elect(&self, topic: &str) -> usize {
        let path = format!("/topic/create?topic={topic}");
        let created = common::wait_until(Duration::from_secs(60), || {
            self.node(0).http("POST", &path, b"").0 == 200
        });
        assert!(created, "POST {path} never answered 200");
        self.wait_leader(topic)
    }

    /// [`Cluster::elect`], then `channel` made through the leader; returns the leader.
    fn elect_with_channel(&self, topic: &str, channel: &str) -> usize {
        let leader = self.elect(topic);
        let (code, body) = self.node(leader).http(
            "POST",
            &format!("/channel/create?topic={topic}&channel={channel}"),
            b"",
        );
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        leader
    }

    fn wait_leader(&self, topic: &str) -> usize {
        let mut l = None;
        wait_for(&format!("a leader of {topic}"), || {
            l = self.leader(topic);
            l.is_some()
        });
        l.unwrap()
    }

    /// `topic`'s (depth, message_count) on member `i` (`None`: no such topic there).
    fn topic_depth(&self, i: usize, topic: &str) -> Option<u64> {
        let st = self.node(i).stats();
        st["topics"]
            .as_array()?
            .iter()
            .find(|t| t["topic_name"] == topic)
            .and_then(|t| t["depth"].as_u64())
    }

    fn channel_depth(&self, i: usize, topic: &str, channel: &str) -> Option<u64> {
        self.channel_field(i, topic, channel, "depth")
    }

    /// Waits (30 s) until every member `i` reports the same `depth(i)`, at least
    /// `at_least`, and returns it; fails the test with the depths otherwise.
    fn agreed_depth(&self, at_least: u64, depth: impl Fn(usize) -> Option<u64>) -> u64 {
        let depths = || -> Vec<Option<u64>> { (0..3).map(&depth).collect() };
        let agreed = common::wait_until(Duration::from_secs(30), || {
            let d = depths();
            d[0].is_some_and(|n| n >= at_least) && d.iter().all(|x| *x == d[0])
        });
        let d = depths();
        assert!(
            agreed,
            "the members do not hold {at_least} or more messages alike: depths {d:?}"
        );
        d[0].unwrap_or(0)
    }

    /// A numeric field of `channel`'s `/stats` on member `i`.
    fn channel_field(&self, i: usize, topic: &str, channel: &str, field: &str) -> Option<u64> {
        let st = self.node(i).stats();
        let t = st["topics"]
            .as_array()?
            .iter()
            .find(|t| t["topic_name"] == topic)?
            .clone();
        t["channels"]
            .as_array()?
            .iter()
            .find(|c| c["channel_name"] == channel)
            .and_then(|c| c[field].as_u64())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // CLUSTER_TEST_LOGS=DIR keeps each member's whole log there (those that are up).
        if let Some(dir) = std::env::var_os("CLUSTER_TEST_LOGS") {
            for (i, b) in self.nodes.iter().enumerate() {
                if let Some(b) = b {
                    let _ = std::fs::write(
                        std::path::Path::new(&dir).join(format!("member-{i}.log")),
                        b.daemon.log_text(),
                    );
                }
            }
        }
        if std::thread::panicking() {
            for (i, n) in self.nodes.iter().enumerate() {
                if let Some(b) = n {
                    let log = b.daemon.log_text();
                    // The test's own polling of /cluster and /stats left out.
                    let tail: Vec<&str> = log
                        .lines()
                        .rev()
                        .filter(|l| {
                            !l.contains(" GET /cluster")
                                && !l.contains(" GET /stats")
                                && !l.contains(" POST /pub")
                        })
                        .take(40)
                        .collect();
                    eprintln!("--- member {i}'s log, last lines:");
                    for l in tail.into_iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
        }
        for i in 0..self.dirs.len() {
            let _ = std::fs::remove_file(self.cut_file(i));
        }
        for n in &mut self.nodes {
            if let Some(mut b) = n.take() {
                b.kill9();
            }
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Reads `n` messages (heartbeats skipped): (id, body).
fn read_messages(s: &mut TcpStream, n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|_| {
            let (ft, data) = read_frame_skip_hb(s).expect("a message");
            assert_eq!(ft, 2, "not a message: {}", common::show(&data));
            let (_, _, id, body) = parse_message(&data);
            (id, body)
        })
        .collect()
}

fn peek(b: &Broker, topic: &str, channel: &str) -> Vec<(String, String)> {
    let (code, body) = b.http(
        "GET",
        &format!("/messages?topic={topic}&channel={channel}&count=100"),
        b"",
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["body_text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn publishes_through_any_member_reach_every_replica_with_the_leaders_ids() {
    let c = Cluster::start([1, 2, 4], &[]);
    let topic = "orders";
    c.elect(topic);
    c.node(0).http_pub(topic, b"first");
    let leader = c.wait_leader(topic);
    let follower = (leader + 1) % 3;
    // A channel made through a follower is created on every replica by the group.
    c.node(follower)
        .admin(&format!("/channel/create?topic={topic}&channel=audit"));
    for i in 0..3 {
        let b = c.node(i);
        b.tcp_pub(topic, format!("tcp-{i}").as_bytes());
        let mut s = b.connect_v2();
        send(&mut s, &mpub_cmd(topic, &[b"m-a", b"m-b"]));
        expect_ok(&mut s);
        send(&mut s, &line(&format!("DPUB {topic} 50")));
        send(&mut s, &common::sized(format!("deferred-{i}").as_bytes()));
        expect_ok(&mut s);
        b.http_pub(topic, format!("http-{i}").as_bytes());
    }
    // 1 + 3 x (1 + 2 + 1 + 1) messages on every member, all in the channel (the
    // topic's first channel gets what the topic held, as in nsqd).
    for i in 0..3 {
        wait_for(&format!("member {i} holding every message"), || {
            c.channel_depth(i, topic, "audit") == Some(16)
        });
    }
    // Every publish is in the log by now: the entries up to here hold them all.
    let published_to = c.state(leader)["topics"][0]["last_index"]
        .as_u64()
        .expect("the leader's last Raft index");
    wait_for("the deferred messages due", || {
        peek(c.node(leader), topic, "audit").len() == 16
    });
    let on_leader = peek(c.node(leader), topic, "audit");
    for i in 0..3 {
        wait_for(&format!("member {i}'s deferred messages due"), || {
            peek(c.node(i), topic, "audit").len() == 16
        });
        let mut a = peek(c.node(i), topic, "audit");
        let mut b = on_leader.clone();
        a.sort();
        b.sort();
        assert_eq!(a, b, "member {i} holds other IDs or bodies than the leader");
    }
    // Once every replica has the entries, every member drops them from its Raft log
    // (the bodies stay in the topic's own log). What stays are the entries after the
    // last publish (channel cursors and the leader's compaction marks), as many as the
    // timing of the members made.
    for i in 0..3 {
        let mut last = serde_json::Value::Null;
        let compacted = common::wait_until(Duration::from_secs(30), || {
            last = c.state(i)["topics"][0].clone();
            last["first_index"].as_u64() > Some(published_to)
        });
        assert!(
            compacted,
            "member {i}'s Raft log still holds entries up to {published_to}: {last}"
        );
    }
    // Prometheus: one leader among the members, no replica behind once idle.
    let leaders: usize = (0..3)
        .filter(|&i| {
            let (_, m) = c.node(i).http("GET", "/metrics", b"");
            String::from_utf8_lossy(&m).contains(&format!(
                "nsq_cluster_topic_is_leader{{topic=\"{topic}\"}} 1"
            ))
        })
        .count();
    assert_eq!(leaders, 1);
    wait_for("no replica lagging in /metrics", || {
        let (_, m) = c.node(leader).http("GET", "/metrics", b"");
        let m = String::from_utf8_lossy(&m);
        m.matches("nsq_cluster_replica_lag_entries{").count() == 3
            && m.lines()
                .filter(|l| l.starts_with("nsq_cluster_replica_lag_entries{"))
                .all(|l| l.ends_with(" 0"))
    });
    // Every member names the same leader and term.
    let terms: Vec<u64> = (0..3)
        .map(|i| c.state(i)["topics"][0]["term"].as_u64().expect("a term"))
        .collect();
    assert!(terms.iter().all(|t| *t == terms[0]), "{terms:?}");
}

/// Bytes of `topic`'s segment files under a member's data path.
fn segment_bytes(dir: &std::path::Path, topic: &str) -> u64 {
    let mut total = 0;
    let Ok(topics) = std::fs::read_dir(dir.join("topics")) else {
        return 0;
    };
    for t in topics.flatten() {
        if !t
            .file_name()
            .to_string_lossy()
            .ends_with(&format!("-{topic}"))
        {
            continue;
        }
        for f in std::fs::read_dir(t.path()).into_iter().flatten().flatten() {
            if f.path().extension().is_some_and(|e| e == "seg") {
                total += f.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}

/// A busy topic whose consumer keeps up is written to disk by none of its replicas:
/// the leader writes only what is unfinished after a while, and a follower, which
/// writes every record its memory queue (`--mem-queue-size`) cannot hold unless it
/// knows it finished, gets the leader's channel positions after every quarter of that
/// many messages instead of only every 100 ms.
#[test]
fn followers_do_not_write_what_the_leaders_consumer_finished() {
    let c = Cluster::start([1, 1, 1], &["--mem-queue-size=200"]);
    let topic = "busy";
    c.elect(topic);
    let leader = c.wait_leader(topic);
    let mut s = c.node(leader).subscribe(topic, "workers");
    send(&mut s, b"RDY 100\n");
    let mut p = c.node(leader).connect_v2();
    // 400 batches of 20 in lockstep: each is consumed and finished before the next.
    let body = vec![b'x'; 1024];
    let batch: Vec<&[u8]> = (0..20).map(|_| body.as_slice()).collect();
    let published = 400 * 20 * body.len() as u64;
    for _ in 0..400 {
        send(&mut p, &mpub_cmd(topic, &batch));
        expect_ok(&mut p);
        for (id, _) in read_messages(&mut s, 20) {
            send(&mut s, &line(&format!("FIN {id}")));
        }
    }
    for f in (0..3).filter(|&i| i != leader) {
        wait_for(&format!("member {f}'s channel following the FINs"), || {
            c.channel_depth(f, topic, "workers") == Some(0)
                && c.channel_field(f, topic, "workers", "in_flight_count") == Some(0)
        });
    }
    // Past the follower's store delay: what it would write is written by now.
    std::thread::sleep(Duration::from_millis(600));
    for i in 0..3 {
        let written = segment_bytes(&c.dirs[i], topic);
        assert!(
            written < published / 10,
            "member {i} (leader {leader}) wrote {written} bytes of segments for {published} bytes published and finished"
        );
    }
}

/// A PUB or MPUB over TCP is proposed with the producer's frame as the Raft entry's
/// data, on the leader and when a follower forwards it (the forwarded frame's data);
/// an HTTP publish to the leader (no such frame) is copied. Every message arrives
/// whole on every member.
#[test]
fn tcp_publishes_are_proposed_with_the_producers_frame() {
    let c = Cluster::start([1, 1, 1], &[]);
    let topic = "frames";
    let leader = c.elect_with_channel(topic, "check");
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let uncopied = || group_of(&c, leader, topic)["uncopied_proposals"].as_u64();
    let before = uncopied().expect("uncopied_proposals in GET /cluster");
    let big = vec![b'b'; 5000];
    let batch: Vec<&[u8]> = vec![b"one", &big, b"three"];
    for member in [leader, follower] {
        let mut p = c.node(member).connect_v2();
        send(&mut p, &pub_cmd(topic, b"single"));
        expect_ok(&mut p);
        send(&mut p, &mpub_cmd(topic, &batch));
        expect_ok(&mut p);
    }
    assert_eq!(
        uncopied(),
        Some(before + 4),
        "two PUBs and two MPUBs, through the leader and a follower, proposed uncopied"
    );
    c.node(leader).http_pub(topic, b"over http");
    assert_eq!(
        uncopied(),
        Some(before + 4),
        "an HTTP publish to the leader is copied"
    );
    for i in 0..3 {
        wait_for(
            &format!("member {i}'s channel holding the 9 messages"),
            || c.channel_depth(i, topic, "check") == Some(9),
        );
    }
    let mut s = c.node(leader).subscribe(topic, "check");
    send(&mut s, b"RDY 9\n");
    let mut bodies: Vec<Vec<u8>> = read_messages(&mut s, 9)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    bodies.sort();
    let mut want: Vec<Vec<u8>> = [&b"single"[..], b"one", &big, b"three"]
        .iter()
        .flat_map(|b| [b.to_vec(), b.to_vec()])
        .chain([b"over http".to_vec()])
        .collect();
    want.sort();
    assert_eq!(bodies, want);
}

/// A publish for a topic no member holds yet makes it a replicated topic: the member
/// that takes it creates the group and campaigns at once, and every replica gets the
/// message. (The other tests make their topic with `Cluster::elect` first; here the
/// members are past their start-up grace through another topic.)
#[test]
fn the_first_publish_of_a_topic_makes_it_replicated_on_every_member() {
    let c = Cluster::start([1, 2, 1], &[]);
    c.elect("warm");
    let topic = "fresh";
    c.node(1).http_pub(topic, b"first");
    let leader = c.wait_leader(topic);
    for i in 0..3 {
        wait_for(&format!("member {i} holding the message"), || {
            c.topic_depth(i, topic) == Some(1)
        });
    }
    assert_eq!(
        c.leader(topic),
        Some(leader),
        "one leader, named alike by every member"
    );
}

#[test]
fn a_follower_serves_its_consumer_through_the_leader_across_a_failover() {
    let mut c = Cluster::start([2, 1, 2], &[]);
    let topic = "payments";
    c.elect(topic);
    c.node(1).http_pub(topic, b"one");
    let leader = c.wait_leader(topic);
    let f = (leader + 1) % 3;
    let mut s = c.node(f).subscribe(topic, "ch");
    send(&mut s, b"RDY 10\n");
    c.node((leader + 2) % 3).http_pub(topic, b"two");
    // The topic's first channel gets what the topic held before it, as in nsqd.
    let got = read_messages(&mut s, 2);
    let bodies: Vec<Vec<u8>> = got.iter().map(|m| m.1.clone()).collect();
    assert_eq!(bodies, [b"one".to_vec(), b"two".to_vec()]);
    for (id, _) in &got {
        send(&mut s, &line(&format!("FIN {id}")));
    }
    // The FINs reached the leader, and the finished position reached every replica.
    for i in 0..3 {
        wait_for(&format!("member {i}'s channel empty"), || {
            c.channel_field(i, topic, "ch", "depth") == Some(0)
                && c.channel_field(i, topic, "ch", "in_flight_count") == Some(0)
        });
    }
    c.kill9(leader);
    c.node(f).http_pub(topic, b"three");
    // The same connection goes on, through the new leader (or served by the follower
    // itself if it won the election).
    let got = read_messages(&mut s, 1);
    assert_eq!(got[0].1, b"three");
    send(&mut s, &line(&format!("FIN {}", got[0].0)));
    let new_leader = c.wait_leader(topic);
    wait_for("the new leader's channel empty", || {
        c.channel_field(new_leader, topic, "ch", "depth") == Some(0)
            && c.channel_field(new_leader, topic, "ch", "in_flight_count") == Some(0)
    });
    // Nothing else arrives: no error frame, no redelivery.
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    match read_frame_skip_hb(&mut s) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("unexpected after the last FIN: {other:?}"),
    }
}

/// Of the 41 messages `got` (a warm-up and job-00..39): FINs in order (the warm-up and
/// job-00..19), then out of order (every other one of the rest), and one REQ with an
/// hour's delay (job-21): 9 left in flight (job-23, 25, .., 39), 1 deferred.
fn finish_all_but_nine_and_defer_one(s: &mut TcpStream, got: &[(String, Vec<u8>)]) {
    for (id, _) in &got[..21] {
        send(s, &line(&format!("FIN {id}")));
    }
    for (id, _) in got[21..].iter().step_by(2) {
        send(s, &line(&format!("FIN {id}")));
    }
    send(s, &line(&format!("REQ {} 3600000", got[22].0)));
}

/// Asserts no message arrives on `s` within `within` (heartbeats aside); `what` names
/// the failure, with the body that came.
fn expect_no_message(s: &mut TcpStream, within: Duration, what: &str) {
    s.set_read_timeout(Some(within)).unwrap();
    loop {
        match read_frame_skip_hb(s) {
            Ok((2, data)) => {
                let (_, _, _, body) = parse_message(&data);
                panic!("{what}: {}", String::from_utf8_lossy(&body));
            }
            Ok(_) => continue,
            Err(_) => break,
        }
    }
}

/// The next `n` messages on `s` as (body, attempts), sorted.
fn read_bodies_and_attempts(s: &mut TcpStream, n: usize) -> Vec<(String, u16)> {
    let mut out: Vec<(String, u16)> = (0..n)
        .map(|_| {
            let (ft, data) = read_frame_skip_hb(s).expect("a message");
            assert_eq!(ft, 2, "not a message: {}", common::show(&data));
            let (_, attempts, _, body) = parse_message(&data);
            (String::from_utf8(body).unwrap(), attempts)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_killed_leader_is_replaced_and_its_unfinished_messages_delivered() {
    let mut c = Cluster::start([2, 1, 2], &[]);
    let topic = "jobs";
    c.elect(topic);
    c.node(0).http_pub(topic, b"warm-up");
    let leader = c.wait_leader(topic);
    let mut s = c.node(leader).subscribe(topic, "workers");
    // An #ephemeral channel too (nsq_tail's kind): its position is replicated as well.
    let mut tail = c.node(leader).subscribe(topic, "tail#ephemeral");
    let via = (leader + 1) % 3;
    let bodies: Vec<String> = (0..40).map(|i| format!("job-{i:02}")).collect();
    let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
    let mut p = c.node(via).connect_v2();
    send(&mut p, &mpub_cmd(topic, &refs));
    expect_ok(&mut p);
    send(&mut s, b"RDY 41\n");
    // The warm-up message first (the topic's first channel gets what it held).
    let got = read_messages(&mut s, 41);
    let bodies_got: Vec<Vec<u8>> = got.iter().map(|(_, b)| b.clone()).collect();
    let mut want: Vec<Vec<u8>> = vec![b"warm-up".to_vec()];
    want.extend(bodies.iter().map(|b| b.clone().into_bytes()));
    assert_eq!(bodies_got, want);
    finish_all_but_nine_and_defer_one(&mut s, &got);
    send(&mut tail, b"RDY 40\n");
    for (id, _) in read_messages(&mut tail, 40) {
        send(&mut tail, &line(&format!("FIN {id}")));
    }
    // The leader replicates its channel's state: the followers' channel holds the 9
    // messages in flight as ready again and the deferred one.
    for f in (0..3).filter(|&i| i != leader) {
        wait_for(
            &format!("member {f}'s #ephemeral channel following the FINs"),
            || c.channel_depth(f, topic, "tail#ephemeral") == Some(0),
        );
        wait_for(&format!("member {f}'s channel following the FINs"), || {
            c.channel_depth(f, topic, "workers") == Some(9)
                && c.channel_field(f, topic, "workers", "deferred_count") == Some(1)
        });
    }
    c.kill9(leader);
    let started = Instant::now();
    let survivor = (leader + 1) % 3;
    for k in 0..5 {
        c.node(survivor)
            .http_pub(topic, format!("after-{k}").as_bytes());
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "publishing after the leader's loss took {took:?}"
    );
    let new_leader = c.wait_leader(topic);
    assert_ne!(new_leader, leader);
    let mut s = c.node(new_leader).subscribe(topic, "workers");
    send(&mut s, b"RDY 100\n");
    let bodies_got = read_bodies_and_attempts(&mut s, 14);
    // The 9 in flight, delivered a second time (their attempts kept), and the 5 new.
    let mut want: Vec<(String, u16)> = (21..40)
        .step_by(2)
        .filter(|&i| i != 21)
        .map(|i| (format!("job-{i:02}"), 2))
        .collect();
    want.extend((0..5).map(|k| (format!("after-{k}"), 1)));
    want.sort();
    assert_eq!(
        bodies_got, want,
        "every unfinished message, once, and nothing finished"
    );
    // The #ephemeral consumer continues where it was: only the 5 new messages.
    let mut tail = c.node(new_leader).subscribe(topic, "tail#ephemeral");
    send(&mut tail, b"RDY 10\n");
    let mut tail_got: Vec<String> = read_messages(&mut tail, 5)
        .into_iter()
        .map(|(_, b)| String::from_utf8(b).unwrap())
        .collect();
    tail_got.sort();
    assert_eq!(
        tail_got,
        (0..5).map(|k| format!("after-{k}")).collect::<Vec<_>>()
    );
    assert_eq!(
        c.channel_depth(new_leader, topic, "tail#ephemeral"),
        Some(0)
    );
    // The requeued one waits for its delay on the new leader too.
    assert_eq!(
        c.channel_field(new_leader, topic, "workers", "deferred_count"),
        Some(1)
    );
}

/// Messages deferred for an hour in [`deferred_channel`]'s channel.
const DEFERRED: usize = 5000;

/// Member `i`'s count of unfinished messages in the state it keeps of `channel` of
/// `topic` from its leader's changes (`GET /cluster` `channel_states`), if it keeps one.
fn kept_unfinished(c: &Cluster, i: usize, topic: &str, channel: &str) -> Option<u64> {
    group_of(c, i, topic)["channel_states"]
        .as_array()
        .and_then(|a| a.iter().find(|v| v["channel"] == channel).cloned())
        .and_then(|v| v["unfinished"].as_u64())
}

/// A 3-member cluster whose topic `topic` has a channel `workers` holding more
/// unfinished messages than a leader sends whole each round (4,096): 5,001 deferred for
/// an hour (DPUBs and one REQ) and 9 in flight on the returned consumer connection
/// (job-23, 25, .., 39, attempts 1); 31 finished. Returns once both followers keep that
/// state from the leader's changes; the leader is returned too.
fn deferred_channel(topic: &str) -> (Cluster, usize, TcpStream) {
    let c = Cluster::start([2, 1, 3], &[]);
    c.elect(topic);
    c.node(0).http_pub(topic, b"warm-up");
    let leader = c.wait_leader(topic);
    let mut s = c.node(leader).subscribe(topic, "workers");
    let mut p = c.node(leader).connect_v2();
    let mut dpubs = Vec::new();
    for i in 0..DEFERRED {
        dpubs.extend_from_slice(&dpub_cmd(topic, 3_600_000, format!("later-{i}").as_bytes()));
    }
    send(&mut p, &dpubs);
    for _ in 0..DEFERRED {
        expect_ok(&mut p);
    }
    let bodies: Vec<String> = (0..40).map(|i| format!("job-{i:02}")).collect();
    let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_bytes()).collect();
    send(&mut p, &mpub_cmd(topic, &refs));
    expect_ok(&mut p);
    send(&mut s, b"RDY 41\n");
    let got = read_messages(&mut s, 41);
    assert_eq!(got[0].1, b"warm-up".to_vec());
    finish_all_but_nine_and_defer_one(&mut s, &got);
    for f in (0..3).filter(|&i| i != leader) {
        wait_for(&format!("member {f} keeping the channel's state"), || {
            kept_unfinished(&c, f, topic, "workers") == Some(DEFERRED as u64 + 1 + 9)
        });
    }
    (c, leader, s)
}

/// A new leader of [`deferred_channel`]'s topic delivers exactly the 9 messages that
/// were in flight (attempts 2), nothing finished, and holds the `deferred` ones.
fn expect_exact_takeover(c: &Cluster, new_leader: usize, topic: &str, deferred: u64) {
    wait_for(
        "the new leader's channel taking over the deferred messages",
        || c.channel_field(new_leader, topic, "workers", "deferred_count") == Some(deferred),
    );
    let mut s = c.node(new_leader).subscribe(topic, "workers");
    send(&mut s, b"RDY 100\n");
    let again = read_bodies_and_attempts(&mut s, 9);
    let want: Vec<(String, u16)> = (23..40)
        .step_by(2)
        .map(|i| (format!("job-{i:02}"), 2))
        .collect();
    assert_eq!(again, want, "the messages in flight, and nothing finished");
    // Nothing else comes: the finished messages stay finished.
    expect_no_message(
        &mut s,
        Duration::from_millis(1500),
        "delivered again after the failover",
    );
    assert_eq!(
        c.channel_field(new_leader, topic, "workers", "deferred_count"),
        Some(deferred)
    );
}

/// A channel holding more unfinished messages than a leader sends whole each round
/// (4,096) is replicated by its changes: after a failover the new leader delivers the
/// messages in flight again, keeps the deferred ones deferred, and delivers nothing
/// the old leader's consumer finished.
#[test]
fn a_channel_with_more_unfinished_messages_than_a_round_carries_fails_over_exactly() {
    let topic = "many_deferred";
    let (mut c, leader, _consumer) = deferred_channel(topic);
    c.kill9(leader);
    let new_leader = c.wait_leader(topic);
    assert_ne!(new_leader, leader);
    expect_exact_takeover(&c, new_leader, topic, DEFERRED as u64 + 1);
}

/// A follower restarted while [`deferred_channel`]'s channel stays beyond 4,096
/// unfinished messages, and nothing happens to the channel since, has lost the state
/// its leader's changes apply to: the leader's changes come every 10 s even when empty,
/// so it asks for the whole state (`SendWhole`), keeps the channel's state again, and
/// leads it exactly when leadership moves to it.
#[test]
fn a_restarted_follower_asks_for_a_large_channels_whole_state_and_takes_over_exactly() {
    let topic = "many_deferred_restart";
    let (mut c, leader, mut consumer) = deferred_channel(topic);
    // The old leader relays its consumer to the new one after the move: with RDY 0 it
    // takes none of the messages the new leader delivers again.
    send(&mut consumer, b"RDY 0\n");
    let f = (leader + 1) % 3;
    c.kill9(f);
    c.start_node(f);
    // Nothing more happens to the channel: the leader's changes, empty, come every
    // 10 s all the same; the follower, lacking the state they apply to, asks for the
    // whole state, and keeps it from the next changes on (within about 20 s).
    let unfinished = DEFERRED as u64 + 1 + 9;
    assert!(
        common::wait_until(Duration::from_secs(45), || {
            kept_unfinished(&c, f, topic, "workers") == Some(unfinished)
        }),
        "the restarted follower never kept the channel's state again: {}",
        group_of(&c, f, topic)
    );
    let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[f]);
    let (code, body) = c.node(leader).http("POST", &path, b"");
    assert_eq!((code, common::show(&body)), (200, String::new()));
    assert_eq!(c.wait_leader(topic), f);
    expect_exact_takeover(&c, f, topic, DEFERRED as u64 + 1);
}

/// A member that loses a topic's leadership makes what its consumers held in flight
/// ready again at once, for the state its successor replicates to settle: leadership
/// moved away and back within the messages' timeout does not deliver again what was
/// finished on the other leader meanwhile.
#[test]
fn messages_finished_elsewhere_are_not_delivered_again_when_leadership_comes_back() {
    let c = Cluster::start([1, 1, 1], &[]);
    let topic = "back_and_forth";
    let leader = c.elect_with_channel(topic, "c");
    let mut a = c
        .node(leader)
        .subscribe_identified(r#"{"msg_timeout":2000}"#, topic, "c");
    for k in 0..3 {
        c.node(leader).http_pub(topic, format!("x-{k}").as_bytes());
    }
    send(&mut a, b"RDY 3\n");
    assert_eq!(read_messages(&mut a, 3).len(), 3);
    let other = (leader + 1) % 3;
    let move_to = |to: usize| {
        // The consumer's last FINs reach the leader first.
        std::thread::sleep(Duration::from_millis(50));
        let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[to]);
        let (code, body) = c.node(to).http("POST", &path, b"");
        assert_eq!((code, common::show(&body)), (200, String::new()));
        assert_eq!(c.wait_leader(topic), to);
    };
    move_to(other);
    assert_eq!(
        c.channel_field(leader, topic, "c", "in_flight_count"),
        Some(0),
        "the former leader still holds its closed consumer's messages in flight"
    );
    let mut b = c.node(other).subscribe(topic, "c");
    send(&mut b, b"RDY 10\n");
    for (id, body) in read_messages(&mut b, 3) {
        assert!(body.starts_with(b"x-"));
        send(&mut b, &line(&format!("FIN {id}")));
    }
    wait_for(
        "the former leader taking the finishes from the positions",
        || c.channel_depth(leader, topic, "c") == Some(0),
    );
    move_to(leader);
    let mut d = c.node(leader).subscribe(topic, "c");
    send(&mut d, b"RDY 10\n");
    // Past the 2 s timeout the messages had when they were first delivered here.
    expect_no_message(
        &mut d,
        Duration::from_millis(3500),
        "finished on the other leader, delivered again",
    );
}

/// Once the other members hold `depth` messages of channel `c` and, 300 ms on, the
/// channel's positions: stops `leader` (SIGSTOP) and waits until another member leads
/// `topic`, which it returns. `relayed`, a consumer on another member, then reads with a
/// 30 s timeout: the old leader stays stopped however long its reads wait (a loaded
/// machine's disk can hold the new leader's store back for seconds).
fn stop_until_replaced(
    c: &Cluster,
    topic: &str,
    leader: usize,
    depth: u64,
    relayed: &mut TcpStream,
) -> usize {
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &others {
        wait_for(&format!("member {i} holding {depth} messages"), || {
            c.channel_field(i, topic, "c", "depth") == Some(depth)
        });
    }
    std::thread::sleep(Duration::from_millis(300));
    c.node(leader).signal(19);
    let mut new_leader = None;
    wait_for("a leader among the members still running", || {
        new_leader = others
            .iter()
            .copied()
            .find(|&i| group_of(c, i, topic)["is_leader"] == true);
        new_leader.is_some()
    });
    relayed
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    new_leader.unwrap()
}

/// A leader stopped (SIGSTOP) past its followers' election timeout, its connections
/// up: a consumer relayed through a follower follows the new leader while the old one
/// is still stopped, and the old one, running again, delivers nothing of what the new
/// leader's consumer finished meanwhile, though its own consumer's FIN and RDY are read
/// first (it confirms it still leads before it delivers; docs/replication.md,
/// "Guarantees").
#[test]
fn a_stopped_leader_delivers_nothing_twice_and_its_relays_follow_the_new_leader() {
    let c = Cluster::start([1, 1, 1], &[]);
    let topic = "frozen";
    let leader = c.elect_with_channel(topic, "c");
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let mut direct = c.node(leader).subscribe(topic, "c");
    let mut relayed = c.node(others[0]).subscribe(topic, "c");
    for k in 0..10 {
        c.node(leader).http_pub(topic, format!("m-{k}").as_bytes());
    }
    send(&mut direct, b"RDY 1\n");
    let held = read_messages(&mut direct, 1);
    // The channel's positions (1 in flight, 9 ready) reach the replicas.
    // The relay follows the new leader now, not when the old one runs again.
    let new_leader = stop_until_replaced(&c, topic, leader, 10, &mut relayed);
    send(&mut relayed, b"RDY 20\n");
    let got = read_messages(&mut relayed, 10);
    let mut bodies: Vec<String> = got
        .iter()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .collect();
    bodies.sort();
    let want: Vec<String> = (0..10).map(|k| format!("m-{k}")).collect();
    assert_eq!(
        bodies, want,
        "delivered through the new leader while the old one is stopped"
    );
    for (id, _) in &got {
        send(&mut relayed, &line(&format!("FIN {id}")));
    }
    wait_for("the new leader's channel empty", || {
        c.channel_field(new_leader, topic, "c", "depth") == Some(0)
            && c.channel_field(new_leader, topic, "c", "in_flight_count") == Some(0)
    });
    // Read by the old leader as soon as it runs: each would deliver more at once.
    send(&mut direct, &line(&format!("FIN {}", held[0].0)));
    send(&mut direct, b"RDY 10\n");
    c.node(leader).signal(18);
    expect_no_message(
        &mut direct,
        Duration::from_millis(2500),
        "finished through the new leader, delivered again by the old one",
    );
    wait_for("the old leader following the new one", || {
        let g = group_of(&c, leader, topic);
        g["is_leader"] == false && g["leader"].as_str() == Some(c.addresses[new_leader].as_str())
    });
}

/// A message the leader framed for its consumer and had not written when it was
/// stopped (the consumer's output buffer waits for its 2 s tick) is dropped when the
/// leader, running again, learns it was replaced: the new leader delivered it and its
/// consumer finished it meanwhile.
#[test]
fn a_stopped_leader_drops_what_it_framed_and_had_not_written() {
    let c = Cluster::start([1, 1, 1], &[]);
    let topic = "buffered";
    let leader = c.elect_with_channel(topic, "c");
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let mut direct =
        c.node(leader)
            .subscribe_identified(r#"{"output_buffer_timeout":2000}"#, topic, "c");
    let mut relayed = c.node(others[0]).subscribe(topic, "c");
    send(&mut direct, b"RDY 100\n");
    // The first goes out at once (the tick the idle consumer's ticker held); the second
    // waits in the output buffer for the next tick, 2 s on.
    c.node(leader).http_pub(topic, b"first");
    let first = read_messages(&mut direct, 1);
    assert_eq!(first[0].1, b"first");
    c.node(leader).http_pub(topic, b"second");
    let new_leader = stop_until_replaced(&c, topic, leader, 2, &mut relayed);
    send(&mut relayed, b"RDY 10\n");
    let mut got: Vec<Vec<u8>> = Vec::new();
    for (id, body) in read_messages(&mut relayed, 2) {
        send(&mut relayed, &line(&format!("FIN {id}")));
        got.push(body);
    }
    got.sort();
    assert_eq!(got, [b"first".to_vec(), b"second".to_vec()]);
    wait_for("the new leader's channel empty", || {
        c.channel_field(new_leader, topic, "c", "depth") == Some(0)
            && c.channel_field(new_leader, topic, "c", "in_flight_count") == Some(0)
    });
    // The 2 s tick has passed by now: written at once when the old leader runs, if
    // nothing holds it.
    std::thread::sleep(Duration::from_millis(1000));
    send(&mut direct, &line(&format!("FIN {}", first[0].0)));
    c.node(leader).signal(18);
    expect_no_message(
        &mut direct,
        Duration::from_millis(3000),
        "framed before the stop, finished through the new leader, written by the old one",
    );
}

/// A leader cut off from the other members while it keeps running (a partition that
/// leaves its connections open) stops delivering before they can elect another: its
/// delivery lease ends 250 ms after the last ping a replica answered, and a follower
/// campaigns only after 400 ms without hearing from it. Its consumer, paced at one
/// message per 20 ms, gets nothing from it later than that (without the lease it would
/// until check-quorum steps it down, 0.5-1 s after the cut, while the new leader
/// delivers the same messages). Once it is joined again it follows the new leader, and
/// every message is delivered.
#[cfg(feature = "fault-injection")]
#[test]
fn a_leader_cut_off_while_it_runs_stops_delivering_before_another_is_elected() {
    let c = Cluster::start([1, 1, 1], &[]);
    let topic = "cut";
    let leader = c.elect_with_channel(topic, "c");
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let total = 300;
    let bodies: Vec<Vec<u8>> = (0..total)
        .map(|k| format!("m-{k:03}").into_bytes())
        .collect();
    for chunk in bodies.chunks(100) {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        let mut p = c.node(leader).connect_v2();
        send(&mut p, &mpub_cmd(topic, &refs));
        expect_ok(&mut p);
    }
    for &i in &others {
        wait_for(&format!("member {i} holding {total} messages"), || {
            c.channel_field(i, topic, "c", "depth") == Some(total as u64)
        });
    }
    let mut got: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    let mut direct = c.node(leader).subscribe(topic, "c");
    direct
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    send(&mut direct, b"RDY 1\n");
    // Reads `s` for `span`, finishing each message `pace` after it came; returns, for
    // each message, the earliest it can have been sent: when the read that returned it
    // began, if nothing was waiting in the socket then (`None`: it was waiting, sent at
    // some time before). A late reader thread then cannot make a message look late.
    let consume = |s: &mut TcpStream,
                   span: Duration,
                   pace: Duration,
                   got: &mut std::collections::HashSet<Vec<u8>>|
     -> Vec<Option<Instant>> {
        let until = Instant::now() + span;
        let mut sent_after = Vec::new();
        while Instant::now() < until {
            s.set_nonblocking(true).unwrap();
            let waiting = !matches!(
                s.peek(&mut [0u8; 1]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            );
            s.set_nonblocking(false).unwrap();
            let began = Instant::now();
            match read_frame_skip_hb(s) {
                Ok((2, data)) => {
                    sent_after.push((!waiting).then_some(began));
                    let (_, _, id, body) = parse_message(&data);
                    got.insert(body);
                    std::thread::sleep(pace);
                    send(s, &line(&format!("FIN {id}")));
                }
                Ok((ft, data)) => panic!("frame {ft}: {}", common::show(&data)),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("consumer: {e}"),
            }
        }
        sent_after
    };
    let pace = Duration::from_millis(20);
    let before = consume(&mut direct, Duration::from_millis(500), pace, &mut got);
    assert!(
        before.len() >= 5,
        "{} delivered before the cut",
        before.len()
    );
    let cut = Instant::now();
    c.cut(leader, true);
    let during = consume(&mut direct, Duration::from_millis(2500), pace, &mut got);
    let after_cut = |t: &Option<Instant>| t.map(|t| t.saturating_duration_since(cut).as_millis());
    let late: Vec<u128> = during
        .iter()
        .filter_map(after_cut)
        .filter(|&ms| ms >= 450)
        .collect();
    // The others elected a leader meanwhile.
    let new_leader = eventually_leader_among(&c, topic, &others);
    assert!(
        late.is_empty(),
        "the cut-off leader delivered {} message(s) 450 ms or more after the cut, at {late:?} ms (all after the cut: {:?})",
        late.len(),
        during.iter().map(after_cut).collect::<Vec<_>>()
    );
    c.cut(leader, false);
    // Joined again, it follows the new leader and relays its consumer there; with a
    // consumer of the new leader's own, every message is delivered.
    let mut on_new = c.node(new_leader).subscribe(topic, "c");
    on_new
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    send(&mut on_new, b"RDY 50\n");
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < total && Instant::now() < deadline {
        consume(
            &mut direct,
            Duration::from_millis(100),
            Duration::ZERO,
            &mut got,
        );
        consume(
            &mut on_new,
            Duration::from_millis(100),
            Duration::ZERO,
            &mut got,
        );
    }
    assert_eq!(got.len(), total, "messages delivered at least once");
    wait_for("the old leader following the new one", || {
        let g = group_of(&c, leader, topic);
        g["is_leader"] == false && g["leader"].as_str() == Some(c.addresses[new_leader].as_str())
    });
}

/// The member among `members` that each of them names as `topic`'s leader, once they
/// agree (waits up to 30 s).
#[cfg(feature = "fault-injection")]
fn eventually_leader_among(c: &Cluster, topic: &str, members: &[usize]) -> usize {
    let mut found = None;
    wait_for(&format!("a leader of {topic} among {members:?}"), || {
        let named: Vec<Option<String>> = members
            .iter()
            .map(|&i| group_of(c, i, topic)["leader"].as_str().map(str::to_string))
            .collect();
        found = match named.first() {
            Some(Some(a)) if named.iter().all(|n| n.as_deref() == Some(a.as_str())) => {
                members.iter().copied().find(|&i| c.addresses[i] == *a)
            }
            _ => None,
        };
        found.is_some()
    });
    found.unwrap()
}

/// `topic`'s entry in member `i`'s `GET /cluster` (Null when it has none or did not
/// answer).
fn group_of(c: &Cluster, i: usize, topic: &str) -> serde_json::Value {
    c.state(i)["topics"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["topic"] == topic).cloned())
        .unwrap_or_default()
}

/// Waits until the members in `members` all report `topic`'s group quiet (not ticked).
fn wait_quiet(c: &Cluster, members: &[usize], topic: &str) {
    wait_for(&format!("{topic}'s group quiet on {members:?}"), || {
        members
            .iter()
            .all(|&i| group_of(c, i, topic)["quiet"] == true)
    });
}

#[test]
fn quiet_groups_take_publishes_and_elect_a_leader_when_theirs_is_stopped_or_killed() {
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topic = "quiet";
    c.elect(topic);
    c.node(0).http_pub(topic, b"m0");
    let leader = c.wait_leader(topic);
    // Nothing under way: no member ticks the group, and with the members in touch
    // nobody starts an election however long it stays so.
    wait_quiet(&c, &[0, 1, 2], topic);
    let term = group_of(&c, leader, topic)["term"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // A member held off the CPU for longer than the silence a peer is given (400 ms:
    // a loaded test machine) wakes the groups for a few ticks; they go quiet again
    // with the same leader and term.
    wait_quiet(&c, &[0, 1, 2], topic);
    for i in 0..3 {
        let g = group_of(&c, i, topic);
        assert_eq!(g["term"].as_u64(), Some(term), "member {i}: {g}");
    }
    assert_eq!(c.leader(topic), Some(leader));
    // A publish through a follower wakes the group; it is quiet again afterwards.
    let follower = (leader + 1) % 3;
    c.node(follower).http_pub(topic, b"m1");
    wait_quiet(&c, &[0, 1, 2], topic);
    // The leader stopped (a stand-in for a host cut off): the followers hear nothing
    // from it, tick again and elect one of them.
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    c.node(leader).signal(19);
    let stopped_at = Instant::now();
    let mut new_leader = None;
    wait_for("a leader among the members still running", || {
        let named: Vec<serde_json::Value> =
            others.iter().map(|&i| group_of(&c, i, topic)).collect();
        new_leader = others
            .iter()
            .copied()
            .find(|&i| named[others.iter().position(|&o| o == i).unwrap()]["is_leader"] == true);
        new_leader.is_some()
            && named
                .iter()
                .all(|g| g["leader"].as_str() == Some(c.addresses[new_leader.unwrap()].as_str()))
    });
    let took = stopped_at.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "elected {took:?} after the stop"
    );
    let new_leader = new_leader.unwrap();
    c.node(others[0]).http_pub(topic, b"m2");
    // Back: the old leader follows the new one, and the group goes quiet everywhere.
    c.node(leader).signal(18);
    wait_for("the stopped member following the new leader", || {
        let g = group_of(&c, leader, topic);
        g["is_leader"] == false && g["leader"].as_str() == Some(c.addresses[new_leader].as_str())
    });
    c.node(others[1]).http_pub(topic, b"m3");
    wait_quiet(&c, &[0, 1, 2], topic);
    // Killed while quiet: its connections close and the other two elect at once.
    c.kill9(new_leader);
    let killed_at = Instant::now();
    let survivor = (0..3).find(|&i| i != new_leader).unwrap();
    c.node(survivor).http_pub(topic, b"m4");
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "a publish after the kill took {took:?}"
    );
    let last = c.wait_leader(topic);
    assert_ne!(last, new_leader);
    // Nothing acknowledged is missing on the survivors.
    for i in c.up().collect::<Vec<_>>() {
        wait_for(&format!("member {i} holding the 5 messages"), || {
            c.topic_depth(i, topic) == Some(5)
        });
    }
}

/// A quiet group's followers notice that their leader restarted however the members'
/// counts of lost touch add up (docs/replication.md, "Quiet groups"). Each follower
/// restarted once, then the leader is killed and comes back with an empty disk: on
/// each follower its own count for the leader went up by two while the leader's count
/// for it went back down by two, so a contact number that is their sum stays the same,
/// the followers keep trusting the leader's last heartbeat for the whole 12 s lease,
/// and the wiped leader (which asks for no votes) does not wake them either.
#[test]
fn a_wiped_leader_is_replaced_at_once_after_each_follower_restarted() {
    let mut c = Cluster::start([1, 1, 1], &[]);
    let topic = "recontact";
    c.elect(topic);
    c.node(0).http_pub(topic, b"m0");
    let leader = c.wait_leader(topic);
    for f in (0..3).filter(|&i| i != leader) {
        c.kill9(f);
        c.start_node(f);
        wait_for(&format!("member {f} holding m0 again"), || {
            c.topic_depth(f, topic) == Some(1)
        });
    }
    if c.wait_leader(topic) != leader {
        let path = format!(
            "/topic/move-leader?topic={topic}&to={}",
            c.addresses[leader]
        );
        let (code, body) = c.node(leader).http("POST", &path, b"");
        assert_eq!((code, common::show(&body)), (200, String::new()));
        assert_eq!(c.wait_leader(topic), leader);
    }
    wait_quiet(&c, &[0, 1, 2], topic);
    c.kill9(leader);
    std::fs::remove_dir_all(&c.dirs[leader]).unwrap();
    std::fs::create_dir_all(&c.dirs[leader]).unwrap();
    let killed_at = Instant::now();
    c.start_node(leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    wait_for("a leader among the members that kept their disks", || {
        others
            .iter()
            .any(|&i| group_of(&c, i, topic)["is_leader"] == true)
    });
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "elected {took:?} after the kill (the followers waited for their lease)"
    );
    let survivor = others[0];
    c.node(survivor).http_pub(topic, b"m1");
    for i in 0..3 {
        wait_for(&format!("member {i} holding both messages"), || {
            c.topic_depth(i, topic) == Some(2)
        });
    }
}

/// A member that makes a topic's group (`/topic/create`, a first publish, a SUB)
/// campaigns at once instead of after an election timeout (0.5-0.95 s), so the topic
/// has a leader a round trip later: when `/topic/create` has answered, the member is
/// already asking for votes or leads (left to the timeout, it would still be a
/// follower). Which member wins is not asserted: on a loaded machine another member's
/// timeout can run out first.
#[test]
fn the_member_that_makes_a_topic_campaigns_at_once() {
    let c = Cluster::start([1, 2, 1], &[]);
    // Past the first seconds after the members started, when they vote for no
    // candidate with an empty log.
    c.elect("warmup");
    for i in 0..3 {
        let topic = format!("made-{i}");
        let (code, body) = c
            .node(i)
            .http("POST", &format!("/topic/create?topic={topic}"), b"");
        assert_eq!((code, common::show(&body)), (200, String::new()));
        let g = group_of(&c, i, &topic);
        assert!(
            ["pre_candidate", "candidate", "leader"].contains(&g["role"].as_str().unwrap_or("")),
            "{topic} right after /topic/create on member {i}: {g}"
        );
        c.wait_leader(&topic);
        // The first publish and the first SUB of a topic make its group too.
        let topic = format!("published-{i}");
        c.node(i).http_pub(&topic, b"first");
        c.wait_leader(&topic);
        let topic = format!("subscribed-{i}");
        let mut s = c.node(i).subscribe(&topic, "c");
        send(&mut s, b"RDY 1\n");
        c.wait_leader(&topic);
    }
}

/// Whether the peer closes `s` within `within` (a read that ends or fails).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

#[test]
fn the_cluster_port_refuses_what_is_not_a_members_greeting() {
    use std::io::Write;
    let c = Cluster::start([1, 1, 1], &[]);
    c.elect("members");
    let port = c.addresses[0].clone();
    // A first frame announced at 64 MiB: refused at its length, before any of it is
    // buffered.
    let mut big = TcpStream::connect(&port).unwrap();
    big.write_all(&(64u32 << 20).to_le_bytes()).unwrap();
    let _ = big.write_all(&[0u8; 4096]);
    assert!(
        closed_within(&mut big, Duration::from_secs(3)),
        "a 64 MiB first frame was read"
    );
    // Bytes that are no frame at all.
    let mut garbage = TcpStream::connect(&port).unwrap();
    garbage.write_all(b"garbage\n").unwrap();
    assert!(
        closed_within(&mut garbage, Duration::from_secs(3)),
        "garbage was kept open"
    );
    // A frame that is not a greeting (a ping) before any greeting.
    let mut ping = TcpStream::connect(&port).unwrap();
    ping.write_all(&[10, 0, 0, 0, 3, 5, 0, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    assert!(
        closed_within(&mut ping, Duration::from_secs(3)),
        "a frame before the greeting was taken"
    );
    // Nothing at all: closed once the greeting is overdue (5 s).
    let mut idle = TcpStream::connect(&port).unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)),
        "an idle connection was kept open"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "closed before the greeting was overdue"
    );
    // A connection that greets as member 1 (its address and replica id are no secret:
    // GET /cluster shows them), then announces a frame over the 64 MiB limit: closed,
    // and logged as what it is.
    let replica = group_of(&c, 1, "members")["replicas"]
        .as_array()
        .and_then(|rs| {
            rs.iter()
                .find(|r| r["address"] == c.addresses[1].as_str())
                .cloned()
        })
        .and_then(|r| u64::from_str_radix(r["replica_id"].as_str()?, 16).ok())
        .expect("member 1's replica id");
    let mut hello = vec![0, 0, 0, 0, nsq_replication::wire::FRAME_VERSION, 1];
    hello.extend_from_slice(&2u16.to_le_bytes());
    hello.extend_from_slice(&replica.to_le_bytes());
    for name in [c.addresses[1].as_str(), "127.0.0.1:1"] {
        hello.push(name.len() as u8);
        hello.extend_from_slice(name.as_bytes());
    }
    hello.extend_from_slice(&0u32.to_le_bytes());
    let len = (hello.len() - 4) as u32;
    hello[..4].copy_from_slice(&len.to_le_bytes());
    let mut posing = TcpStream::connect(&port).unwrap();
    posing.write_all(&hello).unwrap();
    posing.write_all(&(100u32 << 20).to_le_bytes()).unwrap();
    assert!(
        closed_within(&mut posing, Duration::from_secs(3)),
        "a 100 MiB frame was waited for"
    );
    wait_for("the oversized frame logged", || {
        c.node(0)
            .log_text()
            .contains("bad frame: 104857600 bytes long, over the 67108864 bytes a frame may take")
    });
    // Logged once a minute, not once per connection; the member serves on.
    let text = c.node(0).log_text();
    assert_eq!(
        text.matches("the cluster port is for members").count(),
        1,
        "{text}"
    );
    assert!(!text.contains("panicked"));
    c.node(0).http_pub("members", b"after");
    assert!(c.leader("members").is_some());
}

#[test]
fn a_publish_needs_a_quorum_and_a_restarted_member_catches_up() {
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topic = "ledger";
    c.elect(topic);
    for k in 0..10 {
        c.node(k % 3).http_pub(topic, format!("m{k}").as_bytes());
    }
    c.wait_leader(topic);
    let term_of = |c: &Cluster, i: usize| -> Option<u64> {
        c.state(i)["topics"]
            .as_array()?
            .iter()
            .find(|t| t["topic"] == topic)?["term"]
            .as_u64()
    };
    let term_before = term_of(&c, 0).expect("member 0's term");
    c.kill9(0);
    c.kill9(1);
    // One member of three: no majority, so nothing is acknowledged.
    let mut s = c.node(2).connect_v2();
    send(&mut s, &pub_cmd(topic, b"lonely"));
    let (ft, data) = read_frame_skip_hb(&mut s).expect("an answer");
    assert_eq!(ft, 1, "{}", common::show(&data));
    assert!(
        data.starts_with(b"E_PUB_FAILED PUB failed "),
        "{}",
        common::show(&data)
    );
    let (code, _) = c
        .node(2)
        .http("POST", &format!("/pub?topic={topic}"), b"lonely");
    assert_eq!(code, 503);
    // A member back: a majority again. It kept its term and vote on disk (it never
    // votes twice in one term), so it starts at the term it had, not at 0.
    c.start_node(0);
    let term_after = term_of(&c, 0);
    assert!(
        term_after >= Some(term_before),
        "member 0 restarted at term {term_after:?}, below {term_before}"
    );
    let mut refused = 2;
    eventually("a publish accepted again", || {
        let ok = c
            .node(2)
            .http("POST", &format!("/pub?topic={topic}"), b"m10")
            .0
            == 200;
        refused += u64::from(!ok);
        ok
    });
    c.start_node(1);
    // Every member holds the 11 acknowledged messages. The refused publishes may be
    // there too: a refusal only says the policy was not met in time, and an entry
    // member 2 held then is committed once a majority is back (docs/replication.md,
    // "Guarantees"). Nothing else is: no duplicate from the catch-up.
    let held = c.agreed_depth(11, |j| c.topic_depth(j, topic));
    assert!(
        held <= 11 + refused,
        "more than the 11 acknowledged and {refused} refused: {held}"
    );
}

/// Every member killed with kill -9 at once and started again at once (a power cut, a
/// rack rebooted) under the default sync policy: their Raft logs (in memory) are empty
/// and each refuses a candidate behind its vote floor, until the floors give way (10 s
/// without a leader) and one of them is elected. What was synced is kept on every
/// member (`--mem-queue-size=0` stores each message at once and `--sync-timeout=100ms`
/// syncs it soon after), publishes are accepted again and a consumer of the new leader
/// gets every message.
#[test]
fn every_member_killed_at_once_elects_a_leader_again_and_keeps_what_was_synced() {
    let mut c = Cluster::start([1, 2, 1], &["--mem-queue-size=0", "--sync-timeout=100ms"]);
    let topic = "blackout";
    let (code, body) = c.node(0).http(
        "POST",
        &format!("/channel/create?topic={topic}&channel=ch"),
        b"",
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    for k in 0..10 {
        c.node(k % 3).http_pub(topic, format!("m{k}").as_bytes());
    }
    for i in 0..3 {
        wait_for(
            &format!("member {i}'s channel with the 10 messages"),
            || c.channel_depth(i, topic, "ch") == Some(10),
        );
    }
    // Each member's vote floor on disk reaches what it applied: the restarted members
    // then refuse each other (every Raft log empty) until the floors give way.
    for i in 0..3 {
        wait_for(&format!("member {i}'s vote floor saved"), || {
            c.state(i)["topics"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["topic"] == topic
                        && t["saved_floor_index"].as_u64() >= t["applied_index"].as_u64()
                        && t["applied_index"].as_u64() > Some(1)
                })
            })
        });
    }
    // The messages are synced within --sync-timeout of their store; twenty times that
    // leaves a loaded machine room.
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..3 {
        c.kill9(i);
    }
    for i in 0..3 {
        c.start_node(i);
    }
    let restarted = Instant::now();
    let accepted = common::wait_until(Duration::from_secs(60), || {
        c.node(1)
            .http("POST", &format!("/pub?topic={topic}"), b"m10")
            .0
            == 200
    });
    assert!(
        accepted,
        "no publish accepted 60 s after every member restarted"
    );
    let took = restarted.elapsed();
    eprintln!(
        "publishes accepted again {:.1} s after every member restarted",
        took.as_secs_f64()
    );
    // Not before the floors gave way: a member elected at once would mean a restarted
    // member voted for a candidate behind what it had applied.
    assert!(
        took >= Duration::from_secs(4),
        "a leader elected {took:?} after every member restarted, before the vote floors gave way"
    );
    // A publish refused while no leader was elected may still have been applied: the
    // members agree on 11 or more messages.
    let held = c.agreed_depth(11, |j| c.channel_depth(j, topic, "ch"));
    let held = usize::try_from(held).unwrap();
    let leader = c.wait_leader(topic);
    let mut consumer = c.node(leader).subscribe(topic, "ch");
    send(&mut consumer, b"RDY 20\n");
    let bodies: std::collections::BTreeSet<String> = read_messages(&mut consumer, held)
        .into_iter()
        .map(|(_, b)| String::from_utf8(b).unwrap())
        .collect();
    let expected: std::collections::BTreeSet<String> = (0..=10).map(|k| format!("m{k}")).collect();
    assert_eq!(bodies, expected);
}

/// Under `--sync-every=1` a follower journals its Raft log and syncs it before it
/// acknowledges an append: a message the leader acknowledged with one follower's
/// acknowledgement survives every member killed at once and the leader never coming
/// back. One follower is stopped (SIGSTOP), so each publish commits on the leader and
/// the other follower alone, and every member is killed right after the last publish
/// is acknowledged, before that follower has applied it (it learns the commit index
/// only with the next append). The two followers restart: the one with the journal
/// holds the longer log, so only it can be elected (the other votes for it), and it
/// commits and applies what it had acknowledged. With the log kept in memory both
/// would come back empty, and the last messages would be on the lost leader only.
#[test]
fn with_sync_every_1_what_a_follower_acknowledged_survives_a_blackout_and_the_leader_lost() {
    let mut c = Cluster::start([1, 2, 1], &["--sync-every=1"]);
    let topic = "journaled";
    let leader = c.elect_with_channel(topic, "ch");
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (acker, stopped) = (followers[0], followers[1]);
    wait_for("the journal of the follower that acknowledges", || {
        c.state(acker)["topics"].as_array().is_some_and(|ts| {
            ts.iter()
                .any(|t| t["topic"] == topic && t["journal_bytes"].as_u64() > Some(0))
        })
    });
    c.node(stopped).daemon.signal(19); // SIGSTOP
    let n = 30;
    for k in 0..n {
        let (code, body) = c.node(leader).http(
            "POST",
            &format!("/pub?topic={topic}"),
            format!("m{k}").as_bytes(),
        );
        assert_eq!(code, 200, "publish {k}: {}", String::from_utf8_lossy(&body));
    }
    for i in 0..3 {
        c.kill9(i);
    }
    c.start_node(acker);
    c.start_node(stopped);
    let now = c.wait_leader(topic);
    assert_eq!(
        now, acker,
        "the member without the acknowledged entries was elected"
    );
    // Both members name where clients reach the leader.
    for i in [acker, stopped] {
        wait_for(
            &format!("member {i} naming the leader's TCP address"),
            || {
                c.state(i)["topics"].as_array().is_some_and(|ts| {
                    ts.iter().any(|t| {
                        t["topic"] == topic
                            && t["leader_tcp_address"] == c.node(now).tcp.to_string().as_str()
                    })
                })
            },
        );
    }
    for i in [acker, stopped] {
        wait_for(
            &format!("member {i}'s channel with every acknowledged message, once"),
            || c.channel_depth(i, topic, "ch") == Some(n),
        );
    }
    let mut consumer = c.node(now).subscribe(topic, "ch");
    send(&mut consumer, b"RDY 50\n");
    let bodies: std::collections::BTreeSet<String> = read_messages(&mut consumer, n as usize)
        .into_iter()
        .map(|(_, b)| String::from_utf8(b).unwrap())
        .collect();
    let expected: std::collections::BTreeSet<String> = (0..n).map(|k| format!("m{k}")).collect();
    assert_eq!(bodies, expected);
}

/// Under `--sync-every=1` a leader whose journal cannot be written answers no publish
/// (not even under `--replication-ack=leader`, which answers once the leader's own log
/// has the entry): its group stops there, `GET /cluster` says so, the publish fails,
/// and the other members elect a leader that takes publishes again.
#[test]
fn a_leader_whose_journal_cannot_be_written_answers_no_publish() {
    let mut c = Cluster::start([1, 1, 1], &["--sync-every=1", "--replication-ack=leader"]);
    let topic = "unwritable";
    let leader = c.elect(topic);
    c.node(leader).http_pub(topic, b"before");
    let journal = c.dirs[leader].join("cluster-log").join(topic);
    // The journal is closed 1 s after its last write; opened again, a directory in its
    // place refuses it.
    let pid = c.node(leader).pid();
    wait_for("the leader's journal closed", || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .all(|target| target != journal)
    });
    std::fs::remove_file(&journal).unwrap();
    std::fs::create_dir(&journal).unwrap();
    let (code, body) = c
        .node(leader)
        .http("POST", &format!("/pub?topic={topic}"), b"unjournaled");
    assert_ne!(
        code,
        200,
        "a publish answered without the leader's journal: {}",
        String::from_utf8_lossy(&body)
    );
    let stopped = c.state(leader)["topics"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["topic"] == topic && t["stopped"] == true && t["is_leader"] == false);
    assert!(stopped, "{}", c.state(leader));
    // It answers later publishes with a failure too (at once: it does not propose).
    let (code, _) = c
        .node(leader)
        .http("POST", &format!("/pub?topic={topic}"), b"later");
    assert_ne!(code, 200);
    let other = (leader + 1) % 3;
    let accepted = common::wait_until(Duration::from_secs(30), || {
        c.node(other)
            .http("POST", &format!("/pub?topic={topic}"), b"after")
            .0
            == 200
    });
    assert!(accepted, "no publish accepted by the other members");
    c.kill9(leader);
}

/// A follower whose Raft log journal was damaged while it was down (under
/// `--sync-every=1`): a journal with no valid record is set aside as `<topic>~bad` and
/// the member catches up from the leader; one whose last record is cut short or fails
/// its checksum keeps the records before it; one that cannot be read keeps the member
/// out of the topic until it restarts with the journal back. Each time the member
/// comes back with every message, and nothing panics.
#[test]
fn a_damaged_journal_is_set_aside_or_cut_and_the_member_catches_up() {
    let mut c = Cluster::start([1, 2, 1], &["--sync-every=1"]);
    let topic = "damaged";
    let leader = c.elect_with_channel(topic, "ch");
    let follower = (leader + 1) % 3;
    let journal = c.dirs[follower].join("cluster-log").join(topic);
    let mut published = 0u64;
    let publish = |c: &Cluster, published: &mut u64| {
        for _ in 0..20 {
            c.node(leader)
                .http_pub(topic, format!("m{published}").as_bytes());
            *published += 1;
        }
    };
    for damage in ["garbage", "cut"] {
        publish(&c, &mut published);
        wait_for(
            &format!("member {follower}'s channel before the damage"),
            || c.channel_depth(follower, topic, "ch") == Some(published),
        );
        c.kill9(follower);
        let bytes = std::fs::read(&journal).expect("the follower's journal");
        let damaged = if damage == "garbage" {
            b"not a journal at all".to_vec()
        } else {
            bytes[..bytes.len() - 3].to_vec()
        };
        std::fs::write(&journal, damaged).unwrap();
        publish(&c, &mut published);
        c.start_node(follower);
        wait_for(
            &format!("member {follower} caught up after the {damage} journal"),
            || c.channel_depth(follower, topic, "ch") == Some(published),
        );
        let log = c.node(follower).log_text();
        assert!(!log.contains("panicked"), "{log}");
        if damage == "garbage" {
            let aside = c.dirs[follower]
                .join("cluster-log")
                .join(format!("{topic}~bad"));
            assert_eq!(
                std::fs::read(&aside).unwrap(),
                b"not a journal at all",
                "the journal set aside"
            );
            assert!(log.contains("holds no valid record"), "{log}");
        } else {
            assert!(log.contains("left out"), "{log}");
            assert!(log.contains("Raft log recovered from its journal"), "{log}");
        }
    }
    // A journal that cannot be read (a directory in its place) is not written over:
    // the member holds no replica of the topic (publishes through it are forwarded)
    // until it restarts with the journal readable.
    c.kill9(follower);
    let kept = std::fs::read(&journal).unwrap();
    std::fs::remove_file(&journal).unwrap();
    std::fs::create_dir(&journal).unwrap();
    c.start_node(follower);
    let (code, body) = c
        .node(follower)
        .http("POST", &format!("/pub?topic={topic}"), b"through");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    published += 1;
    let log = c.node(follower).log_text();
    assert!(log.contains("cannot be read"), "{log}");
    assert!(journal.is_dir(), "the unreadable journal was written over");
    c.kill9(follower);
    std::fs::remove_dir(&journal).unwrap();
    std::fs::write(&journal, kept).unwrap();
    c.start_node(follower);
    wait_for(
        &format!("member {follower} caught up with its journal back"),
        || c.channel_depth(follower, topic, "ch") == Some(published),
    );
    let mut consumer = c.node(leader).subscribe(topic, "ch");
    send(&mut consumer, b"RDY 100\n");
    let got = read_messages(&mut consumer, usize::try_from(published).unwrap());
    assert_eq!(got.len() as u64, published);
}

/// Both followers lose their disks (kill -9, data path deleted) and come back after the
/// leader stepped down for want of a quorum: the two empty replicas must not elect
/// each other (their empty logs would replace the messages), and they do not; after
/// 5 s without a leader they vote for the member that kept its log, which leads again
/// and brings them back with every message.
#[test]
fn two_members_that_lost_their_disks_elect_the_one_that_kept_its_log() {
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topic = "twodisks";
    c.elect(topic);
    for k in 0..10 {
        c.node(k % 3).http_pub(topic, format!("m{k}").as_bytes());
    }
    for i in 0..3 {
        wait_for(&format!("member {i} with the 10 messages"), || {
            c.topic_depth(i, topic) == Some(10)
        });
    }
    let kept = c.wait_leader(topic);
    for i in (0..3).filter(|&i| i != kept) {
        c.kill9(i);
        std::fs::remove_dir_all(&c.dirs[i]).unwrap();
        std::fs::create_dir_all(&c.dirs[i]).unwrap();
    }
    wait_for("the leader stepping down without a quorum", || {
        c.state(kept)["topics"].as_array().is_some_and(|ts| {
            ts.iter()
                .any(|t| t["topic"] == topic && t["is_leader"] == false)
        })
    });
    for i in (0..3).filter(|&i| i != kept) {
        c.start_node(i);
    }
    // Published through a wiped member at once: it makes its group on the publish and
    // campaigns, and the other wiped member must not elect it.
    let wiped = (kept + 1) % 3;
    let accepted = common::wait_until(Duration::from_secs(60), || {
        c.node(wiped)
            .http("POST", &format!("/pub?topic={topic}"), b"m10")
            .0
            == 200
    });
    assert!(
        accepted,
        "no publish accepted 60 s after the wiped members came back"
    );
    assert_eq!(
        c.wait_leader(topic),
        kept,
        "a member without the messages leads"
    );
    c.agreed_depth(11, |j| c.topic_depth(j, topic));
}

#[test]
fn nsqlookupd_lists_only_the_leader() {
    let lookupd = Lookupd::start(&[]);
    let flag = format!("--lookupd-tcp-address={}", lookupd.tcp);
    let mut c = Cluster::start([1, 1, 2], &[&flag]);
    let topic = "events";
    c.elect(topic);
    c.node(2).http_pub(topic, b"x");
    let leader = c.wait_leader(topic);
    let producers = |lookupd: &Lookupd| -> Vec<u64> {
        let (code, v) = lookupd.request("GET", &format!("/lookup?topic={topic}"));
        if code != 200 {
            return Vec::new();
        }
        v["producers"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["tcp_port"].as_u64()).collect())
            .unwrap_or_default()
    };
    let want = u64::from(c.node(leader).tcp.port());
    wait_for("the leader registered alone", || {
        producers(&lookupd) == [want]
    });
    c.kill9(leader);
    let new_leader = c.wait_leader(topic);
    let want = u64::from(c.node(new_leader).tcp.port());
    wait_for("the new leader registered alone", || {
        producers(&lookupd) == [want]
    });
}

#[test]
fn cluster_flags_are_checked() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nsqd"))
        .args(["--cluster-peer=127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cluster-peer needs --cluster-address"),
        "{err}"
    );
    // Standalone: no /cluster.
    let b = Broker::start(1, &[]);
    assert_eq!(b.http("GET", "/cluster", b"").0, 404);
    // A member started while a member with its --node-id runs refuses to run: it shuts
    // down with status 1 and says why, within the 5 s its peers take to greet it at
    // most. The member that ran first keeps running, refuses its connections and
    // shows why in GET /cluster.
    let (a1, a2) = (
        format!("127.0.0.1:{}", common::reserved_port()),
        format!("127.0.0.1:{}", common::reserved_port()),
    );
    let n1 = Broker::start(
        1,
        &[
            "--node-id=7",
            &format!("--cluster-address={a1}"),
            &format!("--cluster-peer={a2}"),
        ],
    );
    // Past its own start-up check (5 s): n1 only refuses the duplicate from now on.
    std::thread::sleep(Duration::from_millis(5500));
    let (mut n2, dir2) = spawn_member("dup-node-id", 7, &a2, &a1);
    let status = n2.wait_exit(Duration::from_secs(20));
    let err = n2.final_log();
    let _ = std::fs::remove_dir_all(&dir2);
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "FATAL: failed to instantiate nsqd - cluster member {a1} has this member's --node-id 7: every member needs its own"
        )),
        "{err}"
    );
    wait_for("the duplicate node id reported", || {
        n1.daemon
            .log_contains("has the same --node-id 7 as this node")
    });
    assert!(
        n1.daemon.log_contains("closed at once"),
        "{}",
        n1.daemon.log_text()
    );
    assert!(!n1.daemon.log_contains("FATAL"), "{}", n1.daemon.log_text());
    let (code, body) = n1.http("GET", "/cluster", b"");
    assert_eq!(code, 200);
    let state: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let refused = &state["refused_peers"];
    assert_eq!(refused.as_array().map(Vec::len), Some(1), "{state}");
    assert_eq!(refused[0]["address"], a2.as_str(), "{state}");
    assert!(
        refused[0]["reason"]
            .as_str()
            .unwrap()
            .contains("has the same --node-id 7"),
        "{state}"
    );
    // n1 dials the gone member again every 100 ms; the failures are logged once, not
    // at every dial.
    std::thread::sleep(Duration::from_millis(1500));
    let log = n1.daemon.log_text();
    let lines = log
        .lines()
        .filter(|l| {
            l.contains("CLUSTER:")
                && (l.contains("closed") || l.contains("connected") || l.contains("unreachable"))
        })
        .count();
    assert!(lines <= 4, "{lines} connection lines in 1.5 s:\n{log}");
    assert!(n1.http("GET", "/ping", b"").0 == 200);
    // Two members started together with one --node-id: the first to hear from the
    // other refuses to run (the other may then hear nothing more from it, and runs on
    // like n1 above).
    let (a3, a4) = (
        format!("127.0.0.1:{}", common::reserved_port()),
        format!("127.0.0.1:{}", common::reserved_port()),
    );
    let mut both: Vec<(common::Daemon, PathBuf)> = [(&a3, &a4), (&a4, &a3)]
        .iter()
        .enumerate()
        .map(|(i, (me, peer))| spawn_member(&format!("dup-node-id-{i}"), 9, me, peer))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        if let Some(i) = (0..2).find(|&i| both[i].0.exited().is_some()) {
            break i;
        }
        assert!(Instant::now() < deadline, "neither member refused to run");
        std::thread::sleep(Duration::from_millis(20));
    };
    let d = &mut both[refused].0;
    let status = d.wait_exit(Duration::from_secs(1));
    let err = d.final_log();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{err}");
    assert!(err.contains("has this member's --node-id 9"), "{err}");
    for (_, dir) in &both {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Members whose `--cluster-peer` lists differ but name each other report each other
/// (a warning, and `peers_listing_other_members` in `GET /cluster`) without refusing
/// the connection, as during a rolling change of members: here A lists B, and B lists
/// A and a member that never runs.
#[test]
fn members_with_different_lists_report_each_other() {
    let port = || format!("127.0.0.1:{}", common::reserved_port());
    let (a, b, phantom) = (port(), port(), port());
    let spawn = |name: &str, id: u16, me: &str, peers: &[&str]| {
        let dir = std::env::temp_dir().join(format!("nsqd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let http: std::net::SocketAddr = port().parse().unwrap();
        let mut args = vec![
            format!("--tcp-address={}", port()),
            format!("--http-address={http}"),
            format!("--data-path={}", dir.display()),
            format!("--node-id={id}"),
            format!("--cluster-address={me}"),
        ];
        args.extend(peers.iter().map(|p| format!("--cluster-peer={p}")));
        let d = common::Daemon::spawn(env!("CARGO_BIN_EXE_nsqd"), &args);
        (d, dir, http)
    };
    let (da, dir_a, http_a) = spawn("lists-a", 1, &a, &[&b]);
    let (db, dir_b, http_b) = spawn("lists-b", 2, &b, &[&a, &phantom]);
    let others = |http: std::net::SocketAddr| -> Vec<String> {
        let (code, body) = common::split_http(&common::http_raw(http, "GET", "/cluster", b""));
        if code != 200 {
            return Vec::new();
        }
        serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default()
            ["peers_listing_other_members"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| p["address"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    for http in [http_a, http_b] {
        wait_for("the HTTP port answering", || {
            TcpStream::connect(http).is_ok()
        });
    }
    wait_for("each reporting the other's list", || {
        others(http_a) == [b.clone()] && others(http_b) == [a.clone()]
    });
    let warning = "lists other members than this member's --cluster-address and --cluster-peer: every member must end with the same list";
    assert!(da.log_text().contains(warning), "{}", da.log_text());
    assert!(db.log_text().contains(warning), "{}", db.log_text());
    drop((da, db));
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}

/// A cluster member of one peer, spawned without waiting for its ports (it may refuse
/// to run), on a fresh data path named after `name`: the process and the path.
fn spawn_member(name: &str, node_id: u16, me: &str, peer: &str) -> (common::Daemon, PathBuf) {
    let dir = std::env::temp_dir().join(format!("nsqd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = common::Daemon::spawn(
        env!("CARGO_BIN_EXE_nsqd"),
        &[
            format!("--tcp-address=127.0.0.1:{}", common::reserved_port()),
            format!("--http-address=127.0.0.1:{}", common::reserved_port()),
            format!("--data-path={}", dir.display()),
            format!("--node-id={node_id}"),
            format!("--cluster-address={me}"),
            format!("--cluster-peer={peer}"),
        ],
    );
    (d, dir)
}

#[test]
fn a_wiped_member_gets_the_unfinished_messages_and_follows_the_group() {
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topic = "wiped";
    c.elect(topic);
    c.node(0)
        .admin(&format!("/channel/create?topic={topic}&channel=c"));
    for k in 0..10 {
        c.node(0).http_pub(topic, format!("old-{k}").as_bytes());
    }
    let leader = c.wait_leader(topic);
    let gone = (leader + 1) % 3;
    // A consumer of the leader finishes the first 4.
    let mut s = c.node(leader).subscribe(topic, "c");
    send(&mut s, b"RDY 4\n");
    let got = read_messages(&mut s, 4);
    // No more deliveries once these are finished.
    send(&mut s, b"RDY 0\n");
    for (id, _) in got {
        send(&mut s, format!("FIN {id}\n").as_bytes());
    }
    send(&mut s, b"CLS\n");
    for i in 0..3 {
        wait_for(&format!("member {i} at the consumer's position"), || {
            c.channel_depth(i, topic, "c") == Some(6)
        });
    }
    // The Raft log keeps entries for a while after every replica has them (a crash can
    // take what a disk had not synced); then it drops them.
    wait_for("the leader's log compacted past the first 10", || {
        c.state(leader)["topics"][0]["first_index"].as_u64() > Some(11)
    });
    c.kill9(gone);
    std::fs::remove_dir_all(&c.dirs[gone]).unwrap();
    std::fs::create_dir_all(&c.dirs[gone]).unwrap();
    for k in 0..10 {
        c.node(leader)
            .http_pub(topic, format!("new-{k}").as_bytes());
    }
    c.start_node(gone);
    // The wiped member restores a snapshot carrying the leader's 16 unfinished messages
    // at the leader's sequences, then gets every later entry: it holds what the leader
    // holds, and the channel position the leader replicates means the same message.
    wait_for("the wiped member caught up from a snapshot", || {
        c.node(gone)
            .daemon
            .log_contains("caught up from a snapshot")
    });
    wait_for("the wiped member holding the unfinished messages", || {
        c.channel_depth(gone, topic, "c") == Some(16)
    });
    let mut on_leader = peek(c.node(leader), topic, "c");
    let mut on_wiped = peek(c.node(gone), topic, "c");
    on_leader.sort();
    on_wiped.sort();
    assert_eq!(on_leader.len(), 16);
    assert_eq!(on_wiped, on_leader, "the wiped member holds other messages");
    // The leader's consumer finishes 6 more: the wiped member moves to the same place.
    let mut s = c.node(leader).subscribe(topic, "c");
    send(&mut s, b"RDY 6\n");
    let finished: Vec<String> = read_messages(&mut s, 6)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    send(&mut s, b"RDY 0\n");
    for id in &finished {
        send(&mut s, format!("FIN {id}\n").as_bytes());
    }
    send(&mut s, b"CLS\n");
    wait_for("the wiped member at the consumer's new position", || {
        c.channel_depth(gone, topic, "c") == Some(10)
    });
    let left: Vec<String> = peek(c.node(gone), topic, "c")
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(
        finished.iter().all(|id| !left.contains(id)),
        "a finished message is still on the wiped member: {finished:?} {left:?}"
    );
    c.node(gone).http_pub(topic, b"through-the-wiped-member");
    for i in 0..3 {
        wait_for(&format!("member {i} holding its publish"), || {
            c.channel_depth(i, topic, "c") == Some(11)
        });
    }
}

/// A backlog larger than a snapshot carries (32 MiB of unfinished bodies) reaches a
/// member that lost its disk in pages before it restores the leader's snapshot: it
/// holds every message, and once it leads, its consumer gets each of them
/// (docs/replication.md, "Snapshots of any size"). Without the pages its log had a hole
/// where the backlog was.
#[test]
fn a_wiped_member_fetches_a_backlog_larger_than_a_snapshot_carries() {
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topic = "backlog";
    let leader = c.elect_with_channel(topic, "c");
    // 9,216 bodies of 4 KiB: 36 MiB.
    const N: usize = 9 * 1024;
    let body = |k: usize| {
        let mut b = format!("big-{k:05}-").into_bytes();
        b.resize(4096, b'a' + (k % 26) as u8);
        b
    };
    let mut p = c.node(leader).connect_v2();
    let all: Vec<usize> = (0..N).collect();
    for chunk in all.chunks(128) {
        let bodies: Vec<Vec<u8>> = chunk.iter().map(|&k| body(k)).collect();
        let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
        send(&mut p, &mpub_cmd(topic, &refs));
        expect_ok(&mut p);
    }
    for i in 0..3 {
        wait_for(&format!("member {i} holding the backlog"), || {
            c.channel_depth(i, topic, "c") == Some(N as u64)
        });
    }
    // Every entry dropped from the leader's Raft log: the wiped member gets a snapshot.
    let last = c.state(leader)["topics"][0]["last_index"].as_u64().unwrap();
    wait_for("the leader's log compacted past the backlog", || {
        c.state(leader)["topics"][0]["first_index"].as_u64() >= Some(last)
    });
    let gone = (leader + 1) % 3;
    c.kill9(gone);
    std::fs::remove_dir_all(&c.dirs[gone]).unwrap();
    std::fs::create_dir_all(&c.dirs[gone]).unwrap();
    c.start_node(gone);
    wait_for("the wiped member holding the backlog", || {
        c.channel_depth(gone, topic, "c") == Some(N as u64)
    });
    assert!(c
        .node(gone)
        .daemon
        .log_contains("in pages before restoring it"));
    wait_for("the wiped member restoring the snapshot", || {
        c.node(gone)
            .daemon
            .log_contains("caught up from a snapshot")
    });
    assert!(
        !c.node(gone)
            .daemon
            .log_contains("without the messages this replica misses"),
        "the wiped member restored the snapshot with a hole"
    );
    // It leads on request and delivers every message of the backlog.
    let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[gone]);
    let (code, body_got) = c.node(leader).http("POST", &path, b"");
    assert_eq!((code, common::show(&body_got)), (200, String::new()));
    let mut s = c.node(gone).subscribe(topic, "c");
    send(&mut s, b"RDY 1000\n");
    let mut seen = vec![false; N];
    for _ in 0..N {
        let (ft, data) = read_frame_skip_hb(&mut s).expect("a message");
        assert_eq!(ft, 2, "not a message: {}", common::show(&data));
        let (_, _, id, b) = parse_message(&data);
        let k: usize = std::str::from_utf8(&b[4..9]).unwrap().parse().unwrap();
        assert_eq!(b, body(k), "message {k} differs");
        assert!(!seen[k], "message {k} delivered twice");
        seen[k] = true;
        send(&mut s, format!("FIN {id}\n").as_bytes());
    }
    assert!(seen.iter().all(|&x| x));
}

#[test]
fn leadership_moves_on_request_and_no_message_is_lost() {
    let c = Cluster::start([1, 2, 1], &[]);
    let topic = "moved";
    c.elect(topic);
    c.node(0)
        .admin(&format!("/channel/create?topic={topic}&channel=c"));
    for k in 0..5 {
        c.node(0).http_pub(topic, format!("before-{k}").as_bytes());
    }
    let leader = c.wait_leader(topic);
    let to = (leader + 1) % 3;
    // Asked of the third member: a follower passes the request to the leader.
    let via = (leader + 2) % 3;
    let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[to]);
    let (code, body) = c.node(via).http("POST", &path, b"");
    assert_eq!((code, common::show(&body)), (200, String::new()));
    assert_eq!(c.wait_leader(topic), to);
    // Asking again for the member that leads: nothing to do.
    let (code, _) = c.node(to).http("POST", &path, b"");
    assert_eq!(code, 200);
    for k in 0..5 {
        c.node(leader)
            .http_pub(topic, format!("after-{k}").as_bytes());
    }
    let mut s = c.node(to).subscribe(topic, "c");
    send(&mut s, b"RDY 10\n");
    let mut bodies: Vec<String> = read_messages(&mut s, 10)
        .into_iter()
        .map(|(_, b)| String::from_utf8(b).unwrap())
        .collect();
    bodies.sort();
    let mut want: Vec<String> = (0..5)
        .flat_map(|k| [format!("after-{k}"), format!("before-{k}")])
        .collect();
    want.sort();
    assert_eq!(bodies, want);
    // Bad requests get an error and change nothing.
    let cases = [
        (
            format!("/topic/move-leader?topic={topic}&to=127.0.0.1:1"),
            400,
            r#"{"message":"INVALID_ARG_TO"}"#,
        ),
        (
            format!("/topic/move-leader?topic={topic}"),
            400,
            r#"{"message":"MISSING_ARG_TO"}"#,
        ),
        (
            format!("/topic/move-leader?to={}", c.addresses[to]),
            400,
            r#"{"message":"MISSING_ARG_TOPIC"}"#,
        ),
        (
            format!("/topic/move-leader?topic=no-such&to={}", c.addresses[to]),
            404,
            r#"{"message":"TOPIC_NOT_FOUND"}"#,
        ),
        (
            format!("/topic/move-leader?topic=bad!name&to={}", c.addresses[to]),
            400,
            r#"{"message":"INVALID_TOPIC"}"#,
        ),
    ];
    for (path, code, body) in cases {
        let got = c.node(via).http("POST", &path, b"");
        assert_eq!(
            (got.0, common::show(&got.1)),
            (code, body.to_string()),
            "{path}"
        );
    }
    assert_eq!(c.wait_leader(topic), to);
    // `/stats` carries the cluster document as an extra key.
    let st = c.node(to).stats();
    let t = st["cluster"]["topics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["topic"] == topic)
        .unwrap()
        .clone();
    assert_eq!(t["is_leader"], true);
    wait_for("every replica in sync", || {
        let st = c.node(to).stats();
        let replicas = st["cluster"]["topics"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["topic"] == topic))
            .map(|t| t["replicas"].clone());
        replicas.is_some_and(|r| {
            r.as_array()
                .is_some_and(|a| a.len() == 3 && a.iter().all(|x| x["in_sync"] == true))
        })
    });
    // `topic=` narrows the cluster document's topics too.
    c.node(to).http_pub("other", b"x");
    wait_for("both topics in the cluster document", || {
        c.node(to).stats()["cluster"]["topics"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["topic"] == "other"))
    });
    let (code, body) = c
        .node(to)
        .http("GET", &format!("/stats?format=json&topic={topic}"), b"");
    assert_eq!(code, 200);
    let narrowed: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let names: Vec<&str> = narrowed["cluster"]["topics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["topic"].as_str())
        .collect();
    assert_eq!(names, vec![topic]);
    // A standalone broker has no such route.
    let solo = Broker::start(1, &[]);
    let (code, body) = solo.http(
        "POST",
        &format!("/topic/move-leader?topic={topic}&to=x:1"),
        b"",
    );
    assert_eq!(
        (code, common::show(&body)),
        (404, r#"{"message":"NOT_FOUND"}"#.to_string())
    );
    assert!(solo.stats().get("cluster").is_none());
}

/// With `--replication-factor=2` on three members, `/topic/create` through a member that
/// holds no replica of the topic makes the topic on its two replicas, through their
/// group, and not on that member (it made an unreplicated topic of its own).
#[test]
fn a_topic_created_through_a_member_without_a_replica_is_made_on_its_replicas_only() {
    let c = Cluster::start([1, 2, 1], &["--replication-factor=2"]);
    let mut through_other = 0;
    for k in 0..20 {
        let t = format!("placed{k}");
        let (code, body) = c
            .node(0)
            .http("POST", &format!("/topic/create?topic={t}"), b"");
        assert_eq!((code, common::show(&body)), (200, String::new()), "{t}");
        let holders = |c: &Cluster| -> Vec<usize> {
            (0..3)
                .filter(|&i| {
                    group_of(c, i, &t)["leader"]
                        .as_str()
                        .is_some_and(|l| !l.is_empty())
                })
                .collect()
        };
        wait_for(&format!("{t} held by two members with a leader"), || {
            holders(&c).len() == 2
        });
        let holders = holders(&c);
        for i in 0..3 {
            let listed = c.node(i).stats()["topics"]
                .as_array()
                .is_some_and(|ts| ts.iter().any(|x| x["topic_name"] == t.as_str()));
            assert_eq!(listed, holders.contains(&i), "{t} in member {i}'s /stats");
        }
        through_other += usize::from(!holders.contains(&0));
    }
    assert!(through_other > 0, "no topic was placed away from member 0");
}

/// A consumer subscribed on the leader stays connected when the leadership moves away
/// (its member relays it to the new leader) and back (its member serves it itself
/// again): each message published meanwhile reaches it on the same connection.
#[test]
fn a_consumer_of_a_leader_that_hands_over_stays_connected_and_keeps_receiving() {
    let c = Cluster::start([1, 2, 1], &[]);
    let topic = "kept";
    c.elect(topic);
    c.node(0)
        .admin(&format!("/channel/create?topic={topic}&channel=c"));
    let first = c.wait_leader(topic);
    let mut s = c.node(first).subscribe(topic, "c");
    send(&mut s, b"RDY 50\n");
    let round = |k: usize, via: usize, s: &mut TcpStream| {
        let want: Vec<String> = (0..10).map(|i| format!("round{k}-{i}")).collect();
        for b in &want {
            c.node(via).http_pub(topic, b.as_bytes());
        }
        let mut got = Vec::new();
        while got.len() < want.len() {
            let (ft, data) = read_frame_skip_hb(s).expect("a message on the same connection");
            assert_eq!(ft, 2, "not a message: {}", common::show(&data));
            let (_, _, id, body) = parse_message(&data);
            send(s, format!("FIN {id}\n").as_bytes());
            let body = String::from_utf8(body).unwrap();
            // Each move is asked of its target, a follower: the leader replicates its
            // channels' positions before it hands over all the same, so nothing the
            // consumer finished before comes again.
            assert!(
                body.starts_with(&format!("round{k}-")) && !got.contains(&body),
                "{body} delivered again in round {k}"
            );
            got.push(body);
        }
        got.sort();
        let mut want = want;
        want.sort();
        assert_eq!(got, want, "round {k}");
    };
    round(0, first, &mut s);
    let other = (first + 1) % 3;
    let move_to = |to: usize| {
        let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[to]);
        let (code, body) = c.node(to).http("POST", &path, b"");
        assert_eq!((code, common::show(&body)), (200, String::new()));
    };
    move_to(other);
    wait_for("the consumer relayed", || {
        c.node(first)
            .daemon
            .log_contains("this member no longer leads the topic; relayed to the new leader")
    });
    round(1, first, &mut s);
    round(2, other, &mut s);
    move_to(first);
    wait_for("the consumer served by its member again", || {
        c.node(first)
            .daemon
            .log_contains("this member leads the topic now; served here")
    });
    round(3, other, &mut s);
    // Served here again: the consumer is in this member's channel.
    let st = c.node(first).stats();
    let clients = st["topics"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["topic_name"] == topic))
        .map(|t| t["channels"][0]["clients"].as_array().map_or(0, Vec::len));
    assert_eq!(clients, Some(1), "{st}");
    expect_no_message(
        &mut s,
        Duration::from_millis(300),
        "a message delivered twice",
    );
}

/// A move waits for the leader's consumers to finish what they hold in flight, with
/// delivery held meanwhile, so the new leader delivers none of it again: a consumer
/// that holds ten messages when the move is asked finishes them 400 ms later, the
/// move completes only then, and nothing comes twice. A consumer that never finishes
/// holds the move up for at most 2 s, after which the new leader delivers those
/// messages again (attempts 2) on the same, now relayed, connection.
#[test]
fn a_move_lets_the_consumers_finish_first_and_delivers_nothing_twice() {
    let c = Cluster::start([1, 2, 1], &[]);
    let topic = "drained";
    c.elect(topic);
    c.node(0)
        .admin(&format!("/channel/create?topic={topic}&channel=c"));
    let first = c.wait_leader(topic);
    let other = (first + 1) % 3;
    let mut s = c.node(first).subscribe(topic, "c");
    send(&mut s, b"RDY 10\n");
    for i in 0..15 {
        c.node(first).http_pub(topic, format!("m{i}").as_bytes());
    }
    let held = read_messages(&mut s, 10);
    // The move, asked of the leader, answers once the target leads.
    let asked_at = Instant::now();
    let mover = {
        let (http, to) = (c.node(first).http, c.addresses[other].clone());
        std::thread::spawn(move || {
            let path = format!("/topic/move-leader?topic={topic}&to={to}");
            common::split_http(&common::http_raw(http, "POST", &path, b""))
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        c.leader(topic),
        Some(first),
        "moved before the consumer finished"
    );
    for (id, _) in &held {
        send(&mut s, format!("FIN {id}\n").as_bytes());
    }
    let (code, body) = mover.join().unwrap();
    assert_eq!((code, common::show(&body)), (200, String::new()));
    assert!(asked_at.elapsed() >= Duration::from_millis(400));
    assert_eq!(c.wait_leader(topic), other);
    // The rest comes from the new leader through the old one, once each.
    let mut rest: Vec<String> = read_messages(&mut s, 5)
        .into_iter()
        .map(|(id, b)| {
            send(&mut s, format!("FIN {id}\n").as_bytes());
            String::from_utf8(b).unwrap()
        })
        .collect();
    rest.sort();
    let mut want: Vec<String> = (10..15).map(|i| format!("m{i}")).collect();
    want.sort();
    let firsts: Vec<String> = held
        .iter()
        .map(|(_, b)| String::from_utf8(b.clone()).unwrap())
        .collect();
    assert!(
        firsts.iter().all(|b| !rest.contains(b)),
        "{firsts:?} then {rest:?}"
    );
    assert_eq!(rest, want);
    expect_no_message(
        &mut s,
        Duration::from_millis(500),
        "a message delivered twice",
    );
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // A consumer that does not finish: the move back goes after the bound, and the
    // new leader delivers what it held again.
    for i in 0..3 {
        c.node(first).http_pub(topic, format!("n{i}").as_bytes());
    }
    let kept: Vec<(String, Vec<u8>)> = read_messages(&mut s, 3);
    let asked_at = Instant::now();
    let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[first]);
    let (code, body) = c.node(other).http("POST", &path, b"");
    assert_eq!((code, common::show(&body)), (200, String::new()));
    let took = asked_at.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "the move took {took:?}"
    );
    assert_eq!(c.wait_leader(topic), first);
    let mut again: Vec<(u16, Vec<u8>)> = (0..3)
        .map(|_| {
            let (ft, data) = read_frame_skip_hb(&mut s).expect("a message");
            assert_eq!(ft, 2, "not a message: {}", common::show(&data));
            let (_, attempts, id, body) = parse_message(&data);
            send(&mut s, format!("FIN {id}\n").as_bytes());
            (attempts, body)
        })
        .collect();
    again.sort();
    let mut want: Vec<(u16, Vec<u8>)> = kept.into_iter().map(|(_, b)| (2, b)).collect();
    want.sort();
    assert_eq!(again, want);
    expect_no_message(
        &mut s,
        Duration::from_millis(500),
        "a message delivered twice",
    );
}

/// A move does not wait for messages in flight to a consumer that has left: they wait
/// for their timeout on the old leader, as in nsqd, and the new leader delivers them
/// again (attempts 2) to the consumer that is still there. Before, the hand-over counted
/// them and held delivery for its whole 2 s bound.
#[test]
fn a_move_does_not_wait_for_messages_in_flight_to_a_consumer_that_left() {
    let c = Cluster::start([1, 2, 1], &[]);
    let topic = "left";
    c.elect(topic);
    c.node(0)
        .admin(&format!("/channel/create?topic={topic}&channel=c"));
    let first = c.wait_leader(topic);
    let other = (first + 1) % 3;
    let mut gone = c.node(first).subscribe(topic, "c");
    send(&mut gone, b"RDY 5\n");
    for i in 0..5 {
        c.node(first).http_pub(topic, format!("m{i}").as_bytes());
    }
    let mut held: Vec<Vec<u8>> = read_messages(&mut gone, 5)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    drop(gone);
    let mut s = c.node(first).subscribe(topic, "c");
    send(&mut s, b"RDY 10\n");
    // The first consumer is out of the channel; its five stay in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = c
            .node(first)
            .http("GET", "/stats?format=json&topic=left", b"");
        let stats = String::from_utf8_lossy(&body).into_owned();
        if stats.contains("\"in_flight_count\":5") && stats.matches("\"client_id\"").count() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "stats: {stats}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked_at = Instant::now();
    let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[other]);
    let (code, body) = c.node(first).http("POST", &path, b"");
    assert_eq!((code, common::show(&body)), (200, String::new()));
    let took = asked_at.elapsed();
    assert!(took < Duration::from_millis(1500), "the move took {took:?}");
    assert_eq!(c.wait_leader(topic), other);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut again: Vec<Vec<u8>> = (0..5)
        .map(|_| {
            let (ft, data) = read_frame_skip_hb(&mut s).expect("a message");
            assert_eq!(ft, 2, "not a message: {}", common::show(&data));
            let (_, attempts, id, body) = parse_message(&data);
            assert_eq!(attempts, 2, "{}", common::show(&body));
            send(&mut s, format!("FIN {id}\n").as_bytes());
            body
        })
        .collect();
    again.sort();
    held.sort();
    assert_eq!(again, held);
    expect_no_message(
        &mut s,
        Duration::from_millis(500),
        "a message delivered twice",
    );
}

/// A topic elected with one message and quiet on every member, for a move that is to
/// fail: (its leader, the member to move it to, the leader's term).
fn quiet_topic_and_move_target(c: &Cluster, topic: &str) -> (usize, usize, u64) {
    c.elect(topic);
    c.node(0).http_pub(topic, b"x");
    let leader = c.wait_leader(topic);
    wait_quiet(c, &[0, 1, 2], topic);
    let term = group_of(c, leader, topic)["term"].as_u64().unwrap();
    (leader, (leader + 1) % 3, term)
}

/// After a failed move to `target` and its return: `target` follows `leader`, which
/// still leads `topic` in `term` 2 s later, and `target` takes a publish.
fn assert_the_failed_move_took_no_effect(
    c: &Cluster,
    topic: &str,
    (leader, target, term): (usize, usize, u64),
) {
    wait_for("the target back in the group", || {
        group_of(c, target, topic)["leader"] == c.addresses[leader].as_str()
    });
    std::thread::sleep(Duration::from_secs(2));
    let g = group_of(c, leader, topic);
    assert_eq!(
        (g["is_leader"].as_bool(), g["term"].as_u64()),
        (Some(true), Some(term)),
        "{g}"
    );
    c.node(target).http_pub(topic, b"y");
}

/// A move to a member that is down answers 500 `MOVE_LEADER_TIMEOUT` and is over: when
/// that member comes back, the leader keeps leading in the same term (a forced
/// campaign request queued for the member while it was down would depose it then).
#[test]
fn a_move_that_timed_out_does_not_take_effect_when_its_target_comes_back() {
    let mut c = Cluster::start([1, 1, 1], &[]);
    let topic = "given_up";
    let (leader, target, term) = quiet_topic_and_move_target(&c, topic);
    c.kill9(target);
    wait_for("the leader to see the target gone", || {
        group_of(&c, leader, topic)["replicas"]
            .as_array()
            .is_some_and(|rs| {
                rs.iter()
                    .any(|r| r["address"] == c.addresses[target].as_str() && r["in_sync"] == false)
            })
    });
    let path = format!(
        "/topic/move-leader?topic={topic}&to={}",
        c.addresses[target]
    );
    let mover = {
        let (http, path) = (c.node(leader).http, path.clone());
        std::thread::spawn(move || common::split_http(&common::http_raw(http, "POST", &path, b"")))
    };
    // Nothing is held for a member out of touch: publishes go on meanwhile.
    std::thread::sleep(Duration::from_millis(1500));
    c.node(leader).http_pub(topic, b"during");
    let (code, body) = mover.join().unwrap();
    assert_eq!(
        (code, common::show(&body)),
        (500, r#"{"message":"MOVE_LEADER_TIMEOUT"}"#.to_string())
    );
    let log = c.node(leader).log_text();
    assert!(log.contains("it is out of touch"), "{log}");
    assert!(!log.contains("delivery held until"), "{log}");
    c.start_node(target);
    assert_the_failed_move_took_no_effect(&c, topic, (leader, target, term));
}

/// A move to a member that is frozen (SIGSTOP) while its connections stay up answers
/// 500 and is over too: the campaign request the leader sent it at once (before the
/// member's silence put it out of touch) waits in its socket, stamped with the
/// leader's clock, and the member, resumed more than 2 s later, ignores it: the leader
/// keeps leading in the same term (before the stamp, the resumed member campaigned and
/// deposed it).
#[test]
fn a_move_to_a_frozen_member_does_not_take_effect_when_it_resumes() {
    let c = Cluster::start([1, 1, 1], &[]);
    let topic = "frozen_target";
    let (leader, target, term) = quiet_topic_and_move_target(&c, topic);
    c.node(target).daemon.signal(19); // SIGSTOP
    let path = format!(
        "/topic/move-leader?topic={topic}&to={}",
        c.addresses[target]
    );
    let (code, body) = c.node(leader).http("POST", &path, b"");
    assert_eq!(
        (code, common::show(&body)),
        (500, r#"{"message":"MOVE_LEADER_TIMEOUT"}"#.to_string())
    );
    // Every request sent meanwhile is over 2 s old when the member resumes.
    std::thread::sleep(Duration::from_secs(3));
    c.node(target).daemon.signal(18); // SIGCONT
    assert_the_failed_move_took_no_effect(&c, topic, (leader, target, term));
    // The first request goes at once, while the member still counts as in touch (it
    // was heard within 400 ms); later ones are not sent to a member out of touch.
    if c.node(leader).log_text().contains("; delivery held until") {
        assert!(
            c.node(target)
                .log_text()
                .contains("ms old (this member was stopped or out of touch meanwhile); ignored"),
            "no stale request logged"
        );
    }
}

/// Relays never chain: another member's relay (its IDENTIFY's `user_agent` begins with
/// `nsqd-relay (`) that SUBs on a follower is refused, exactly so, and its connection
/// closed (logged at INFO: part of every failover); the same SUB from a consumer is
/// relayed to the leader.
#[test]
fn a_follower_refuses_another_members_relay() {
    let c = Cluster::start([1, 1, 1], &[]);
    let topic = "unchained";
    c.elect(topic);
    c.node(0)
        .admin(&format!("/channel/create?topic={topic}&channel=c"));
    let leader = c.wait_leader(topic);
    let follower = (leader + 1) % 3;
    let mut s = c.node(follower).connect_v2();
    send(
        &mut s,
        &common::identify_cmd(r#"{"user_agent":"nsqd-relay (go-nsq/1.1.0)"}"#),
    );
    expect_ok(&mut s);
    send(&mut s, format!("SUB {topic} c\n").as_bytes());
    common::hostile::expect_fatal(
        &mut s,
        &format!("E_SUB_FAILED SUB failed this member does not lead topic {topic}"),
        "a relay's SUB on a follower",
    );
    let mut s =
        c.node(follower)
            .subscribe_identified(r#"{"user_agent":"go-nsq/1.1.0"}"#, topic, "c");
    send(&mut s, b"RDY 1\n");
    c.node(leader).http_pub(topic, b"relayed");
    let got = read_messages(&mut s, 1);
    assert_eq!(got[0].1, b"relayed");
    // Part of every failover (the relay asks again): logged at INFO, not as a client's
    // error.
    let log = c.node(follower).log_text();
    let refusal = log
        .lines()
        .find(|l| l.contains("does not lead topic"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(refusal.contains("INFO:"), "{refusal}");
}

/// With `--rebalance-leaders` each topic's leadership goes back to its preferred member
/// (the first of its placement in `GET /cluster`) once that member is in sync: after it
/// was moved away by hand, and after that member was killed and restarted at once.
#[test]
fn with_rebalance_leaders_leadership_goes_back_to_each_topics_preferred_member() {
    let mut c = Cluster::start([1, 2, 1], &["--rebalance-leaders"]);
    assert_eq!(c.state(0)["rebalance_leaders"], true);
    let topics: Vec<String> = (0..6).map(|i| format!("preferred{i}")).collect();
    for t in &topics {
        c.elect(t);
        c.node(0).http_pub(t, b"x");
    }
    let preferred = |c: &Cluster, t: &str| -> usize {
        let g = group_of(c, 0, t);
        let first = g["placement"][0].as_str().unwrap().to_string();
        c.addresses.iter().position(|a| *a == first).unwrap()
    };
    let prefs: Vec<usize> = topics.iter().map(|t| preferred(&c, t)).collect();
    // Away from the preferred member, by hand.
    for (t, &p) in topics.iter().zip(&prefs) {
        let to = (p + 1) % 3;
        let path = format!("/topic/move-leader?topic={t}&to={}", c.addresses[to]);
        let (code, body) = c.node(to).http("POST", &path, b"");
        assert_eq!((code, common::show(&body)), (200, String::new()), "{t}");
    }
    let back = |c: &Cluster| {
        topics
            .iter()
            .zip(&prefs)
            .all(|(t, &p)| c.leader(t) == Some(p))
    };
    wait_for("every topic led by its preferred member again", || back(&c));
    // The member preferred by the first topic, killed and restarted at once: the others
    // take its topics over, and it gets them back once in sync.
    let m = prefs[0];
    c.kill9(m);
    wait_for("the first topic led by another member", || {
        c.leader(&topics[0]).is_some_and(|l| l != m)
    });
    c.start_node(m);
    wait_for(
        "every topic led by its preferred member after the restart",
        || back(&c),
    );
    // Each topic's message is there, once.
    for t in &topics {
        let mut s = c.node(c.wait_leader(t)).subscribe(t, "c");
        send(&mut s, b"RDY 5\n");
        let got = read_messages(&mut s, 1);
        assert_eq!(got[0].1, b"x", "{t}");
        expect_no_message(
            &mut s,
            Duration::from_millis(300),
            "a message delivered twice",
        );
    }
}

/// Producers on every member publish while the leadership moves round the members:
/// each PUB is answered `OK` (a publish that reaches a leader handing over
/// waits for the new one, as one that finds no leader does), and the channel gets each
/// message once.
#[test]
fn publishes_wait_while_leadership_moves_and_none_is_refused() {
    let c = Cluster::start([1, 2, 1], &[]);
    let topic = "handed";
    c.elect(topic);
    c.node(0)
        .admin(&format!("/channel/create?topic={topic}&channel=c"));
    let first = c.wait_leader(topic);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = [first, (first + 1) % 3, (first + 2) % 3]
        .into_iter()
        .map(|m| {
            let mut s = c.node(m).connect_v2();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sent = Vec::new();
                let mut refused = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let body = format!("m{m}-{}", sent.len() + refused.len());
                    send(&mut s, &pub_cmd(topic, body.as_bytes()));
                    match read_frame_skip_hb(&mut s) {
                        Ok((0, data)) if data == b"OK" => sent.push(body),
                        // nsqd closes the connection after E_PUB_FAILED.
                        Ok((_, data)) => {
                            refused.push(format!("{body}: {}", String::from_utf8_lossy(&data)));
                            break;
                        }
                        Err(e) => {
                            refused.push(format!("{body}: {e}"));
                            break;
                        }
                    }
                }
                (sent, refused)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut leader = first;
    // Twelve moves: a member that voted for the target and had not yet heard from it
    // campaigned on a publish in a few moves in a hundred, deposing the target and
    // refusing the publish (`replaced by another leader's entry`).
    for _ in 0..12 {
        let to = (leader + 1) % 3;
        let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[to]);
        let (code, body) = c.node(leader).http("POST", &path, b"");
        assert_eq!((code, common::show(&body)), (200, String::new()));
        assert_eq!(c.wait_leader(topic), to, "the target leads after the move");
        leader = to;
        std::thread::sleep(Duration::from_millis(150));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut want = Vec::new();
    for p in producers {
        let (sent, refused) = p.join().unwrap();
        assert!(
            refused.is_empty(),
            "refused while the leadership moved: {refused:?}"
        );
        assert!(sent.len() > 10, "{} publishes", sent.len());
        want.extend(sent);
    }
    want.sort();
    let leader = c.wait_leader(topic);
    let mut s = c.node(leader).subscribe(topic, "c");
    // RDY at most --max-rdy-count (2500); each message finished as it comes.
    send(&mut s, b"RDY 2500\n");
    let mut got: Vec<String> = Vec::with_capacity(want.len());
    while got.len() < want.len() {
        let (id, body) = read_messages(&mut s, 1).remove(0);
        send(&mut s, format!("FIN {id}\n").as_bytes());
        got.push(String::from_utf8(body).unwrap());
    }
    got.sort();
    assert_eq!(got, want);
    expect_no_message(
        &mut s,
        Duration::from_millis(500),
        "a message delivered twice",
    );
}

/// Runs a client's failover scenario (scripts/clients/*_failover.*) against a 3-node
/// cluster with nsqlookupd: it prints `KILL` once its consumer has every message of
/// the first round; the leader of its topic is then killed and the scenario told to go
/// on; it must end with status 0 (every acknowledged message received). A scenario
/// that prints `MOVE` instead gets six moves of the leadership round the members.
fn failover_scenario(program: &std::path::Path, script: &str, topic_prefix: &str) {
    failover_scenario_with(program, script, topic_prefix, &[], &[]);
}

/// [`failover_scenario`] with `extra` flags for every member and `env` for the
/// scenario.
fn failover_scenario_with(
    program: &std::path::Path,
    script: &str,
    topic_prefix: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) {
    use std::io::{BufRead, BufReader, Write};
    let lookupd = Lookupd::start(&[]);
    let flag = format!("--lookupd-tcp-address={}", lookupd.tcp);
    let mut flags = vec![flag.as_str()];
    flags.extend_from_slice(extra);
    let mut c = Cluster::start([2, 1, 1], &flags);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let mut child = std::process::Command::new(program)
        .arg(&script)
        .arg(lookupd.http.to_string())
        .args((0..3).map(|i| c.node(i).tcp.to_string()))
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !matches!(line.trim(), "KILL" | "MOVE") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let o = child.wait_with_output().unwrap();
            panic!(
                "{} ended early:\n{}",
                script.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    let topic = c.state(0)["topics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["topic"].as_str())
        .find(|n| n.starts_with(topic_prefix))
        .expect("the scenario's topic")
        .to_string();
    let leader = c.wait_leader(&topic);
    if line.trim() == "MOVE" {
        // Round the members while the scenario publishes, each move asked of the
        // member that leads, and the next once the target leads.
        let mut at = leader;
        for _ in 0..6 {
            let to = (at + 1) % 3;
            let path = format!("/topic/move-leader?topic={topic}&to={}", c.addresses[to]);
            let (code, body) = c.node(at).http("POST", &path, b"");
            assert_eq!(code, 200, "{}", common::show(&body));
            assert_eq!(c.wait_leader(&topic), to);
            at = to;
            std::thread::sleep(Duration::from_millis(150));
        }
    } else {
        c.kill9(leader);
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{} failed:\n{log}", script.display());
    eprintln!("{log}");
    if extra.contains(&"--sync-every=1") {
        let survivor = (leader + 1) % 3;
        let journaled = c.state(survivor)["topics"].as_array().is_some_and(|ts| {
            ts.iter()
                .any(|t| t["topic"] == topic.as_str() && t["journal_bytes"].as_u64() > Some(0))
        });
        assert!(journaled, "{}", c.state(survivor));
    }
}

/// pynsq, unmodified: an nsq.Reader that finds the topic through nsqlookupd follows its
/// leader to the new one after the old is killed, and receives every message an
/// nsq.Writer connected to every member got acknowledged before and after.
#[test]
fn pynsq_follows_the_leader_through_nsqlookupd() {
    pynsq_failover(&[], &[]);
}

/// scripts/clients/pynsq_failover.py through [`failover_scenario_with`] (skipped
/// without pynsq).
fn pynsq_failover(extra: &[&str], env: &[(&str, &str)]) {
    let Some(py) = common::pynsq_python() else {
        return;
    };
    failover_scenario_with(
        &py,
        "scripts/clients/pynsq_failover.py",
        "failover",
        extra,
        env,
    );
}

/// [`pynsq_follows_the_leader_through_nsqlookupd`] under `--sync-every=1`: every
/// publish pynsq gets `OK` for was synced to the journals of a majority, and the
/// survivors deliver each one after the leader's kill.
#[test]
fn pynsq_follows_the_leader_with_journaled_raft_logs() {
    pynsq_failover(&["--sync-every=1"], &[]);
}

/// pynsq across a failover of a channel holding 5,000 deferred messages (more than a
/// leader replicates whole each round: docs/replication.md, "Channel state"): after the
/// leader's kill no message the reader finished is delivered again, and no deferred one
/// early.
#[test]
fn pynsq_gets_nothing_finished_again_after_a_failover_of_a_channel_with_many_deferred() {
    pynsq_failover(&[], &[("SCENARIO_DEFERRED", "5000")]);
}

/// pynsq, unmodified, across six moves of the leadership round the members
/// (`POST /topic/move-leader`) while its nsq.Writer publishes: no publish is refused,
/// the nsq.Reader's connections all stay up (a member that stops leading relays its
/// consumers to the new leader) and it receives every acknowledged message once.
#[test]
fn pynsq_stays_connected_across_leadership_moves() {
    pynsq_failover(
        &[],
        &[("SCENARIO_MOVES", "1"), ("SCENARIO_MESSAGES", "1000")],
    );
}

/// gnsq, unmodified, as [`pynsq_follows_the_leader_through_nsqlookupd`].
#[test]
fn gnsq_follows_the_leader_through_nsqlookupd() {
    let Some(py) = common::python_with("gnsq") else {
        return;
    };
    failover_scenario(&py, "scripts/clients/gnsq_failover.py", "gfailover");
}

/// nsqjs, unmodified, as [`pynsq_follows_the_leader_through_nsqlookupd`] (one nsqjs
/// Writer per member).
#[test]
fn nsqjs_follows_the_leader_through_nsqlookupd() {
    let modules =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/clients/node_modules/nsqjs");
    if !modules.exists() {
        return common::skip("no scripts/clients/node_modules/nsqjs (scripts/setup-clients.sh)");
    }
    failover_scenario(
        std::path::Path::new("node"),
        "scripts/clients/nsqjs_failover.js",
        "nfailover",
    );
}

/// tokio-nsq, unmodified, consuming through a follower (`NSQConsumerConfigSources::
/// Daemons` with the follower's address only): the follower relays it to the leader,
/// and after the leader is killed the same connection goes on (tokio-nsq reports no
/// `Unhealthy`) and delivers every message published before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_nsq_consumes_through_a_follower_across_a_failover() {
    use tokio::time::timeout;
    use tokio_nsq::{NSQChannel, NSQConsumerConfig, NSQConsumerConfigSources, NSQEvent, NSQTopic};
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topic = "tokio_failover";
    c.elect(topic);
    c.node(0).http_pub(topic, b"warm-up");
    let leader = c.wait_leader(topic);
    let f = (leader + 1) % 3;
    let mut consumer = NSQConsumerConfig::new(
        NSQTopic::new(topic).unwrap(),
        NSQChannel::new("ch").unwrap(),
    )
    .set_max_in_flight(20)
    .set_sources(NSQConsumerConfigSources::Daemons(vec![c
        .node(f)
        .tcp
        .to_string()]))
    .set_rebalance_interval(Duration::from_millis(500))
    .build();
    let mut got: std::collections::HashMap<Vec<u8>, usize> = Default::default();
    let receive = async |consumer: &mut tokio_nsq::NSQConsumer,
                         got: &mut std::collections::HashMap<Vec<u8>, usize>,
                         want: &[Vec<u8>]| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !want.iter().all(|w| got.contains_key(w)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match timeout(left, consumer.consume()).await {
                Ok(Some(NSQEvent::Message(m))) => {
                    *got.entry(m.body.clone()).or_default() += 1;
                    m.finish().await;
                }
                Ok(Some(NSQEvent::Healthy())) | Ok(Some(NSQEvent::Ok())) => {}
                Ok(Some(NSQEvent::Unhealthy())) => panic!("tokio-nsq lost its connection"),
                Ok(None) => panic!("consumer stream ended"),
                Err(_) => panic!("timed out; {} of {} received", got.len(), want.len()),
            }
        }
    };
    let first: Vec<Vec<u8>> = (0..50).map(|i| format!("a{i}").into_bytes()).collect();
    for b in &first {
        c.node(leader).http_pub(topic, b);
    }
    let mut want = vec![b"warm-up".to_vec()];
    want.extend(first.iter().cloned());
    receive(&mut consumer, &mut got, &want).await;
    c.kill9(leader);
    let second: Vec<Vec<u8>> = (0..50).map(|i| format!("b{i}").into_bytes()).collect();
    for b in &second {
        c.node(f).http_pub(topic, b);
    }
    want.extend(second.iter().cloned());
    receive(&mut consumer, &mut got, &want).await;
    let redelivered: usize = got.values().map(|n| n - 1).sum();
    eprintln!(
        "tokio-nsq through a follower: {} messages, {redelivered} redelivered",
        got.len()
    );
}

#[test]
fn a_deleted_topic_is_gone_from_every_member_and_comes_back_when_published_again() {
    let lookupd = Lookupd::start(&[]);
    let flag = format!("--lookupd-tcp-address={}", lookupd.tcp);
    let mut c = Cluster::start([1, 2, 1], &[&flag]);
    let topic = "gone";
    c.elect(topic);
    for body in [b"a", b"b", b"c"] {
        c.node(1).http_pub(topic, body);
    }
    let leader = c.wait_leader(topic);
    let mut consumer = c.node(leader).subscribe(topic, "ch");
    for i in 0..3 {
        wait_for(&format!("member {i}'s channel with the 3 messages"), || {
            c.channel_depth(i, topic, "ch") == Some(3)
        });
    }
    let registered = |lookupd: &Lookupd| -> usize {
        let (code, v) = lookupd.request("GET", &format!("/lookup?topic={topic}"));
        if code != 200 {
            return 0;
        }
        v["producers"].as_array().map_or(0, Vec::len)
    };
    wait_for("the leader registered", || registered(&lookupd) == 1);

    // Deleted through a follower: the leader's consumer is closed, the topic leaves
    // every member and nsqlookupd.
    let follower = (leader + 1) % 3;
    let (code, body) = c
        .node(follower)
        .http("POST", &format!("/topic/delete?topic={topic}"), b"");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    match read_frame_skip_hb(&mut consumer) {
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("the consumer's connection is not closed: {other:?}"),
    }
    for i in 0..3 {
        wait_for(&format!("the topic gone from member {i}"), || {
            c.topic_depth(i, topic).is_none()
        });
    }
    wait_for("the topic gone from nsqlookupd", || {
        registered(&lookupd) == 0
    });
    let (code, body) = c
        .node(leader)
        .http("POST", &format!("/topic/delete?topic={topic}"), b"");
    assert_eq!(
        (code, body.as_slice()),
        (404, br#"{"message":"TOPIC_NOT_FOUND"}"#.as_slice())
    );

    // A member restarted at once follows the group again without making the topic.
    let other = (leader + 2) % 3;
    let group = |c: &Cluster, i: usize| -> serde_json::Value {
        c.state(i)["topics"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["topic"] == topic).cloned())
            .unwrap_or_default()
    };
    let commit = group(&c, leader)["commit_index"].as_u64().unwrap();
    assert_eq!(group(&c, leader)["deleted"], true, "{}", group(&c, leader));
    c.kill9(other);
    c.start_node(other);
    wait_for("the restarted member caught up with the deletion", || {
        let g = group(&c, other);
        g["applied_index"].as_u64().is_some_and(|a| a >= commit) && g["deleted"] == true
    });
    assert_eq!(
        c.topic_depth(other, topic),
        None,
        "not made again by a restart"
    );

    // Published again: the topic is back on every member with only the new message, and
    // its leader registers again.
    c.node(other).http_pub(topic, b"again");
    for i in 0..3 {
        wait_for(&format!("the topic back on member {i}"), || {
            c.topic_depth(i, topic) == Some(1)
        });
    }
    wait_for("the leader registered again", || registered(&lookupd) == 1);
}

/// A deleted topic's group leaves every member's memory once it has been quiet for
/// 10 s (docs/replication.md, "Deleting a topic"), and comes back from what each
/// member kept of it when the topic is named again: a publish through any member makes
/// the topic again on every member with only the new message, as does `/topic/create`
/// after a second deletion, each under a new leader's term after the one before. A
/// member restarted meanwhile starts no group for the deleted topic until it is named.
#[test]
fn a_deleted_topics_group_leaves_memory_and_comes_back_when_the_topic_is_named() {
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topic = "dropped";
    c.elect_with_channel(topic, "ch");
    for body in [b"a", b"b", b"c"] {
        c.node(1).http_pub(topic, body);
    }
    for i in 0..3 {
        wait_for(&format!("member {i}'s channel with the 3 messages"), || {
            c.channel_depth(i, topic, "ch") == Some(3)
        });
    }
    let mut term = 0;
    for (round, via) in [(0, 2), (1, 0)] {
        let (code, body) = c
            .node(1)
            .http("POST", &format!("/topic/delete?topic={topic}"), b"");
        assert_eq!(code, 200, "{}", common::show(&body));
        for i in 0..3 {
            wait_for(
                &format!("round {round}: the group gone from member {i}"),
                || c.topic_depth(i, topic).is_none() && group_of(&c, i, topic).is_null(),
            );
        }
        if round == 0 {
            c.kill9(via);
            c.start_node(via);
            wait_for("the restarted member answering GET /cluster", || {
                c.state(via)["topics"].is_array()
            });
            std::thread::sleep(Duration::from_secs(1));
            assert!(
                group_of(&c, via, topic).is_null(),
                "a group started for the deleted topic: {}",
                group_of(&c, via, topic)
            );
            c.node(via).http_pub(topic, b"again");
        } else {
            let (code, body) =
                c.node(via)
                    .http("POST", &format!("/topic/create?topic={topic}"), b"");
            assert_eq!((code, common::show(&body)), (200, String::new()));
        }
        let leader = c.wait_leader(topic);
        let now = group_of(&c, leader, topic)["term"].as_u64().unwrap();
        assert!(now > term, "round {round}: term {now} after {term}");
        term = now;
        let depth = u64::from(round == 0);
        for i in 0..3 {
            wait_for(
                &format!("round {round}: the topic back on member {i}"),
                || c.topic_depth(i, topic) == Some(depth),
            );
            assert_eq!(c.channel_depth(i, topic, "ch"), None, "member {i}");
            assert_eq!(group_of(&c, i, topic)["deleted"], false, "member {i}");
        }
    }
    // Published through each member: every member holds all three.
    for i in 0..3 {
        c.node(i).http_pub(topic, format!("m{i}").as_bytes());
    }
    for i in 0..3 {
        wait_for(&format!("member {i} holding the three"), || {
            c.topic_depth(i, topic) == Some(3)
        });
    }
}

#[test]
fn with_cluster_tls_members_speak_mutual_tls_and_refuse_other_peers() {
    use std::io::{Read, Write};
    let pki = crate::tls::Pki::new();
    let flags = [
        format!("--tls-cert={}", pki.path("cert.pem")),
        format!("--tls-key={}", pki.path("key.pem")),
        format!("--tls-root-ca-file={}", pki.path("ca.pem")),
        "--cluster-tls".to_string(),
        // The certificate turns on nsqd's HTTPS listener too: on a port of the kernel's.
        "--https-address=127.0.0.1:0".to_string(),
    ];
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let c = Cluster::start([1, 2, 1], &refs);
    let topic = "sealed";
    c.elect(topic);
    c.node(1).http_pub(topic, b"one");
    let leader = c.wait_leader(topic);
    c.node((leader + 1) % 3).http_pub(topic, b"two");
    for i in 0..3 {
        wait_for(&format!("both messages on member {i}"), || {
            c.topic_depth(i, topic) == Some(2)
        });
    }
    // Until the peer closes: (bytes read, how it ended).
    let drain = |s: &mut dyn Read| -> std::io::Result<usize> {
        let mut buf = [0u8; 512];
        let mut total = 0;
        loop {
            match s.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => total += n,
                Err(e) => return Err(e),
            }
        }
    };
    // A peer that speaks plain TCP is refused before its greeting is read.
    let mut plain = TcpStream::connect(c.addresses[0].as_str()).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain.write_all(b"NSQR\x00\x01 not TLS at all\n").unwrap();
    match drain(&mut plain) {
        Ok(_) => {}
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the plain connection was not closed: {e}"
        ),
    }
    // A peer whose certificate another CA signed is refused after the handshake.
    let other = crate::tls::Pki::new();
    let config = crate::tls::client_config(
        &pki,
        Some((other.client_cert.clone(), other.client_key.clone())),
        &[&rustls::version::TLS13],
    );
    let tcp = TcpStream::connect(c.addresses[0].as_str()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let _ = tls.write_all(b"hello");
    let err = drain(&mut tls).expect_err("a certificate from another CA is refused");
    // The member's TLS refuses it with an alert (a member without TLS would only close).
    assert!(err.to_string().contains("alert"), "refused by TLS: {err}");
    wait_for("the refusal logged", || {
        c.node(0)
            .daemon
            .log_contains("TLS handshake with 127.0.0.1 failed")
    });
    // The cluster goes on.
    c.node(2).http_pub(topic, b"three");
    for i in 0..3 {
        wait_for(&format!("the third message on member {i}"), || {
            c.topic_depth(i, topic) == Some(3)
        });
    }
}

#[test]
fn cluster_tls_needs_a_cluster_and_the_certificates() {
    let pki = crate::tls::Pki::new();
    let cert = format!("--tls-cert={}", pki.path("cert.pem"));
    let key = format!("--tls-key={}", pki.path("key.pem"));
    for (args, want) in [
        (
            vec!["--cluster-tls", cert.as_str(), key.as_str()],
            "--cluster-tls needs --cluster-address",
        ),
        (
            vec![
                "--cluster-tls",
                "--cluster-address=127.0.0.1:1",
                cert.as_str(),
                key.as_str(),
            ],
            "--cluster-tls needs --tls-cert, --tls-key and --tls-root-ca-file",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nsqd"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// A POST to `addr` that never panics (the member may be down): its status, or 0.
fn try_post(addr: std::net::SocketAddr, path: &str, body: &[u8]) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() || s.write_all(body).is_err() {
        return 0;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    if out.is_empty() {
        return 0;
    }
    common::split_http(&out).0
}

impl Cluster {
    /// Restarts each member of `which` in turn (SIGTERM and start again at once, as
    /// `systemctl restart` does) with the current [`Cluster::members`], waiting after
    /// each for every topic of `topics` to have a leader (a rolling restart).
    fn rolling_restart(&mut self, which: &[usize], topics: &[String]) {
        for &i in which {
            if let Some(mut b) = self.nodes[i].take() {
                b.terminate();
            }
            self.start_node(i);
            for t in topics {
                wait_for(&format!("a leader of {t}"), || {
                    self.holders_leader(t).is_some()
                });
            }
        }
    }

    /// `topic`'s replicas as its leader's `GET /cluster` lists them: (voters, learners,
    /// placement), as member indexes, sorted.
    fn replicas(&self, topic: &str) -> Option<(Vec<usize>, Vec<usize>, Vec<usize>)> {
        let l = self.holders_leader(topic)?;
        let st = self.state(l);
        let t = st["topics"]
            .as_array()?
            .iter()
            .find(|t| t["topic"] == topic)?
            .clone();
        let index = |a: &serde_json::Value| self.addresses.iter().position(|x| a == x.as_str());
        let mut voters = Vec::new();
        let mut learners = Vec::new();
        for r in t["replicas"].as_array()? {
            let i = index(&r["address"])?;
            if r["learner"] == true {
                learners.push(i);
            } else {
                voters.push(i);
            }
        }
        let mut placement: Vec<usize> = t["placement"]
            .as_array()?
            .iter()
            .map(index)
            .collect::<Option<_>>()?;
        voters.sort_unstable();
        learners.sort_unstable();
        placement.sort_unstable();
        Some((voters, learners, placement))
    }

    /// Waits (90 s) until every topic's voters are its placement, with no learner left,
    /// and returns the placements.
    fn settled(&self, topics: &[String]) -> Vec<Vec<usize>> {
        let mut last = Vec::new();
        let ok = common::wait_until(Duration::from_secs(90), || {
            last = topics.iter().map(|t| self.replicas(t)).collect();
            last.iter()
                .all(|r| r.as_ref().is_some_and(|(v, l, p)| l.is_empty() && v == p))
        });
        assert!(ok, "replicas never settled on the placement: {last:?}");
        last.into_iter().map(|r| r.unwrap().2).collect()
    }
}

/// Adding a fourth member (factor 3) and then removing one, each by a rolling restart
/// with the new `--cluster-peer` lists: every topic's replicas move to the members its
/// placement names, one Raft membership change at a time (a learner that catches up,
/// becomes a voter, then a voter leaves); a member that leaves a topic deletes its
/// copy; a producer publishing throughout loses nothing; no message of the topics that
/// only moved is stored twice (the producer's topic may hold a publish twice per leader
/// stopped while it was forwarded, as documented).
#[test]
fn members_added_and_removed_move_topics_without_losing_or_duplicating_messages() {
    let mut c = Cluster::start([1, 2, 1], &[]);
    let topics: Vec<String> = (0..8).map(|k| format!("moving-{k}")).collect();
    for t in &topics {
        c.elect(t);
        c.node(0)
            .admin(&format!("/channel/create?topic={t}&channel=c"));
        for k in 0..20 {
            c.node(0).http_pub(t, format!("{t}-{k}").as_bytes());
        }
    }
    // A producer publishing to the first topic through every member in turn while the
    // members change; it records what was acknowledged.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let https: Vec<std::net::SocketAddr> = Vec::new();
    let https = std::sync::Arc::new(std::sync::Mutex::new(https));
    let refresh = |c: &Cluster| {
        *https.lock().unwrap() = c.up().map(|i| c.node(i).http).collect();
    };
    refresh(&c);
    let producer = {
        let (stop, https, topic) = (stop.clone(), https.clone(), topics[0].clone());
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            let mut k = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let members = https.lock().unwrap().clone();
                let body = format!("load-{k}");
                let at = members[k % members.len()];
                if try_post(at, &format!("/pub?topic={topic}"), body.as_bytes()) == 200 {
                    acked.push(body);
                }
                k += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            acked
        })
    };

    // Adding member 3: it starts listing the others, then each of them restarts
    // listing it.
    let d = c.add_member(2);
    c.members.push(d);
    c.start_node(d);
    refresh(&c);
    // Once every member lists the same four, none reports another's list as other
    // than its own.
    let others = |c: &Cluster, i: usize| -> Vec<String> {
        c.state(i)["peers_listing_other_members"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["address"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    c.rolling_restart(&[0, 1, 2], &topics);
    refresh(&c);
    wait_for("every member agreeing on the list", || {
        c.up().all(|i| others(&c, i).is_empty())
    });
    let placed = c.settled(&topics);
    eprintln!("replicas with member {d} added: {placed:?}");
    assert!(
        placed.iter().any(|p| p.contains(&d)),
        "the new member is among no topic's replicas: {placed:?}"
    );
    for (t, p) in topics.iter().zip(&placed) {
        for i in c.up().collect::<Vec<_>>() {
            if p.contains(&i) {
                if t != &topics[0] {
                    wait_for(&format!("{t}'s 20 messages on member {i}"), || {
                        c.channel_depth(i, t, "c") == Some(20)
                    });
                }
            } else {
                wait_for(&format!("{t} gone from member {i}, not a replica"), || {
                    c.topic_depth(i, t).is_none()
                });
            }
        }
    }

    // Removing member 1: it stops, and the others restart without it.
    c.kill9(1);
    c.members.retain(|&m| m != 1);
    refresh(&c);
    c.rolling_restart(&[0, 2, d], &topics);
    refresh(&c);
    let placed = c.settled(&topics);
    assert!(placed.iter().all(|p| *p == vec![0, 2, d]), "{placed:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = producer.join().unwrap();
    assert!(
        acked.len() > 10,
        "the producer got {} publishes through",
        acked.len()
    );

    // Every message of every topic, once, from its leader.
    for t in &topics {
        let l = c.wait_leader(t);
        let mut want: Vec<String> = (0..20).map(|k| format!("{t}-{k}")).collect();
        let depth = if t == &topics[0] {
            c.channel_depth(l, t, "c").unwrap()
        } else {
            20
        };
        for i in [0, 2, d] {
            wait_for(&format!("{t}'s {depth} messages on member {i}"), || {
                c.channel_depth(i, t, "c") == Some(depth)
            });
        }
        let mut s = c.node(l).subscribe(t, "c");
        send(&mut s, format!("RDY {depth}\n").as_bytes());
        let mut got: Vec<String> = read_messages(&mut s, usize::try_from(depth).unwrap())
            .into_iter()
            .map(|(_, b)| String::from_utf8(b).unwrap())
            .collect();
        got.sort();
        let n = got.len();
        got.dedup();
        if t == &topics[0] {
            // A publish forwarded to a leader that stops before it answers is sent to
            // the next leader (at least once: docs/replication.md, "Guarantees", "a
            // publish forwarded to a leader that dies before answering"): at most one per
            // member stopped, as the producer has one publish in flight.
            assert!(
                n - got.len() <= 7,
                "{t}: {} messages stored twice over 7 stops",
                n - got.len()
            );
        } else {
            assert_eq!(n, got.len(), "{t}: a message stored twice");
        }
        if t == &topics[0] {
            let lost: Vec<&String> = want
                .iter()
                .chain(&acked)
                .filter(|b| got.binary_search(b).is_err())
                .collect();
            assert!(lost.is_empty(), "{t}: acknowledged and lost: {lost:?}");
        } else {
            want.sort();
            assert_eq!(got, want, "{t}");
        }
    }
}
