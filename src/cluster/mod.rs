//! Replication across brokers (docs/replication.md): with `--cluster-address` and
//! `--cluster-peer`, every durable topic is held by `--replication-factor` members, its
//! log is one Raft group ([`nsq_replication::TopicGroup`]) on the shard that owns the
//! topic, and a publish is answered once the `--replication-ack` policy's replicas have it.
//!
//! - this file: the cluster's members from the flags, each member's replica id, and
//!   which members hold a topic;
//! - [`link`]: the connections between members (greeting, frames, reconnects);
//! - [`liveness`]: which peers this member is in touch with (what quiet groups rely
//!   on instead of heartbeats per topic);
//! - [`replica`]: a shard's groups: proposing, forwarding to the leader, applying
//!   committed entries to the topic, leadership changes and nsqlookupd;
//! - [`relay`]: a consumer connected to a follower, served from the leader.
//!
//! Without the flags nothing here runs and the broker is a standalone nsqd.

pub mod cut;
pub mod link;
pub mod liveness;
pub mod relay;
pub mod replica;

use nsq_replication::AckPolicy;

pub use replica::ShardCluster;

/// One member of the cluster: its `--cluster-address` and its replica id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// HOST:PORT, exactly as every member spells it (`--cluster-address` on the member
    /// itself, `--cluster-peer` on the others).
    pub address: String,
    /// Its id in every topic group: [`replica_id`] of the address.
    pub replica: u64,
}

/// The cluster as this node's flags describe it.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This node.
    pub me: Member,
    /// The other members.
    pub peers: Vec<Member>,
    /// Replicas per topic (`--replication-factor`, capped at the cluster size).
    pub factor: usize,
    /// `--replication-ack`.
    pub ack: AckPolicy,
    /// `--node-id`: must differ on every member (message IDs carry it).
    pub node_id: u16,
    /// `--cluster-tls`: the member connections' TLS; `None`: plain TCP.
    pub tls: Option<ClusterTls>,
    /// `--rebalance-leaders`: leaders hand each topic to its preferred member
    /// ([`replica`]'s `rebalance`).
    pub rebalance_leaders: bool,
    /// Why peers' connections are refused now (shared by the shards' copies of the
    /// configuration; `GET /cluster`'s `refused_peers`).
    pub refusals: std::sync::Arc<link::PeerReports>,
    /// The peers whose greeting carried a member list other than this member's
    /// (`GET /cluster`'s `peers_listing_other_members`): expected while members are
    /// added or removed by a rolling restart, a misconfiguration otherwise.
    pub other_lists: std::sync::Arc<link::PeerReports>,
}

/// Both sides of the member connections under `--cluster-tls`
/// ([`crate::tls::cluster_configs`]).
#[derive(Clone, Debug)]
pub struct ClusterTls {
    /// The listening side: this member's certificate, peers' verified.
    pub server: std::sync::Arc<rustls::ServerConfig>,
    /// The dialling side: this member's certificate, the peer's verified.
    pub client: std::sync::Arc<rustls::ClientConfig>,
}

/// A member's replica id: FNV-1a 64 of its address (never 0, which raft-rs reserves).
/// Every member computes the same ids from the same addresses, so no id is configured.
pub fn replica_id(address: &str) -> u64 {
    fnv(address.as_bytes(), 0).max(1)
}

fn fnv(bytes: &[u8], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// splitmix64's finalizer: every input bit moves every output bit, so the rendezvous
/// scores of one topic on different members are independent.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

impl ClusterConfig {
    /// A digest of this member's members (its own address and its peers', sorted):
    /// CRC-32 of the addresses joined by newlines. Sent in the greeting, so that a
    /// member whose `--cluster-peer` list differs is reported.
    pub fn members_digest(&self) -> u32 {
        let mut all: Vec<&str> = std::iter::once(self.me.address.as_str())
            .chain(self.peers.iter().map(|m| m.address.as_str()))
            .collect();
        all.sort_unstable();
        crc32fast::hash(all.join("\n").as_bytes())
    }

    /// The cluster from the flags; `Ok(None)` when this node runs standalone (neither
    /// flag given).
    ///
    /// # Errors
    ///
    /// The text start-up prints: a peer without `--cluster-address`, an address that is
    /// not HOST:PORT, a peer listed twice or equal to this node, a factor of 0.
    pub fn from_flags(
        address: &str,
        peers: &[String],
        factor: u16,
        ack: &str,
        node_id: u16,
    ) -> Result<Option<ClusterConfig>, String> {
        if address.is_empty() && peers.is_empty() {
            return Ok(None);
        }
        if address.is_empty() {
            return Err(
                "--cluster-peer needs --cluster-address (this node's replication listener)".into(),
            );
        }
        let check = |a: &str| -> Result<(), String> {
            match a.rsplit_once(':') {
                Some(("0.0.0.0" | "[::]" | "::", _)) => Err(format!(
                    "cluster address {a:?} names no host: each member's address must be the one its peers dial"
                )),
                // The port as digits without leading zeros: a member's identity is its
                // address string, so `:05153` and `:5153` would be two members.
                Some((host, port))
                    if !host.is_empty()
                        && port.parse::<u16>().is_ok_and(|p| p.to_string() == port) =>
                {
                    Ok(())
                }
                _ => Err(format!("cluster address {a:?} is not HOST:PORT")),
            }
        };
        check(address)?;
        let mut members: Vec<Member> = Vec::new();
        for p in peers {
            check(p)?;
            if p == address {
                return Err(format!(
                    "--cluster-peer {p} is this node's own --cluster-address"
                ));
            }
            if members.iter().any(|m| &m.address == p) {
                return Err(format!("--cluster-peer {p} is listed twice"));
            }
            members.push(Member {
                address: p.clone(),
                replica: replica_id(p),
            });
        }
        if factor == 0 {
            return Err("--replication-factor must be at least 1".into());
        }
        let ack: AckPolicy = ack.parse()?;
        Ok(Some(ClusterConfig {
            me: Member {
                address: address.to_string(),
                replica: replica_id(address),
            },
            factor: usize::from(factor).min(peers.len() + 1),
            peers: members,
            ack,
            node_id,
            tls: None,
            rebalance_leaders: false,
            refusals: Default::default(),
            other_lists: Default::default(),
        }))
    }

    /// The replicas of `topic`, best first: the `factor` members with the highest
    /// rendezvous score of (topic, member). Every member computes the same list, and
    /// adding a member moves only the topics it now scores into.
    pub fn replicas_of(&self, topic: &str) -> Vec<u64> {
        let mut all: Vec<(u64, u64)> = std::iter::once(&self.me)
            .chain(&self.peers)
            .map(|m| (mix(fnv(topic.as_bytes(), 0) ^ m.replica), m.replica))
            .collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all.into_iter().take(self.factor).map(|(_, r)| r).collect()
    }

    /// True when `topic` is replicated: every topic but the `#ephemeral` ones, which
    /// nsqd keeps in memory only.
    pub fn replicates(topic: &str) -> bool {
        !topic.ends_with("#ephemeral")
    }

    /// The member with replica id `replica`.
    pub fn member(&self, replica: u64) -> Option<&Member> {
        std::iter::once(&self.me)
            .chain(&self.peers)
            .find(|m| m.replica == replica)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three(me: &str) -> ClusterConfig {
        let all = ["10.0.0.1:4153", "10.0.0.2:4153", "10.0.0.3:4153"];
        let peers: Vec<String> = all
            .iter()
            .filter(|a| **a != me)
            .map(|a| a.to_string())
            .collect();
        ClusterConfig::from_flags(me, &peers, 3, "quorum", 1)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn every_member_places_a_topic_on_the_same_replicas() {
        let a = three("10.0.0.1:4153");
        let b = three("10.0.0.2:4153");
        for t in ["orders", "payments", "x", "a.dead"] {
            assert_eq!(a.replicas_of(t), b.replicas_of(t));
            assert_eq!(a.replicas_of(t).len(), 3);
        }
        let mut two = a.clone();
        two.factor = 2;
        let firsts: std::collections::HashSet<u64> = (0..50)
            .map(|i| two.replicas_of(&format!("t{i}"))[0])
            .collect();
        assert_eq!(
            firsts.len(),
            3,
            "leaders' first choices spread over the members"
        );
    }

    #[test]
    fn bad_cluster_flags_are_refused() {
        assert!(ClusterConfig::from_flags("", &[], 3, "quorum", 0)
            .unwrap()
            .is_none());
        for (addr, peers, factor, ack) in [
            ("", vec!["a:1"], 3, "quorum"),
            ("a", vec!["b:1"], 3, "quorum"),
            ("a:1", vec!["b:x"], 3, "quorum"),
            ("a:1", vec!["b:01"], 3, "quorum"),
            ("a:01", vec!["b:1"], 3, "quorum"),
            ("a:1", vec!["a:1"], 3, "quorum"),
            ("a:1", vec!["b:1", "b:1"], 3, "quorum"),
            ("a:1", vec!["b:1"], 0, "quorum"),
            ("a:1", vec!["b:1"], 3, "most"),
            ("0.0.0.0:1", vec!["b:1"], 3, "quorum"),
        ] {
            let peers: Vec<String> = peers.into_iter().map(String::from).collect();
            assert!(
                ClusterConfig::from_flags(addr, &peers, factor, ack, 0).is_err(),
                "{addr} {peers:?} {factor} {ack}"
            );
        }
        let c = ClusterConfig::from_flags("a:1", &["b:1".to_string()], 3, "all", 0)
            .unwrap()
            .unwrap();
        assert_eq!(c.factor, 2, "capped at the cluster size");
    }
}
