//! Topology-aware consumption (nsqd master's experiment `topology-aware-consumption`,
//! nsqio/nsq#1301; docs/compatibility.md): with `--enable-experiment=topology-aware-consumption`
//! a channel delivers to a ready consumer in the node's zone (`--topology-zone`) first,
//! then to one in its region (`--topology-region`), then to anyone. A consumer says where
//! it is with IDENTIFY's `topology_zone` and `topology_region`.
//!
//! nsqd does it with one unbuffered Go channel per tier that only the consumers of that
//! tier read: a message goes to a waiting zone-local consumer if there is one, else to a
//! region-local one, else to the shared queue. Here a channel picks the consumer for
//! each message itself (`Channel::dispatch`), so the same preference is a rank each
//! client gets at IDENTIFY ([`Topology::rank`], kept in its settings) and the pick takes
//! the ready client of the lowest rank, round robin among equals.

/// The node's place and whether the experiment is on (`nsq_shards::Options::topology`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// `--topology-region` ("" = none).
    pub region: String,
    /// `--topology-zone` ("" = none).
    pub zone: String,
    /// `--enable-experiment=topology-aware-consumption`.
    pub aware: bool,
}

/// A client's rank without the experiment: every client is equal (plain round robin).
pub const RANK_NONE: u8 = 0;
/// Same zone as the node: served first.
pub const RANK_ZONE: u8 = 1;
/// Same region (not the same zone): served next.
pub const RANK_REGION: u8 = 2;
/// Anywhere else: served when no closer consumer is ready.
pub const RANK_GLOBAL: u8 = 3;

/// The experiment's name, as nsqd master spells it (`--enable-experiment`).
pub const TOPOLOGY_AWARE_CONSUMPTION: &str = "topology-aware-consumption";

impl Topology {
    /// The delivery rank of a client at `region`/`zone` (its IDENTIFY fields, "" when
    /// not sent): [`RANK_NONE`] when the experiment is off, else [`RANK_ZONE`] when the
    /// node has a zone and it is the client's, [`RANK_REGION`] likewise for the region,
    /// else [`RANK_GLOBAL`]. (nsqd master compares the strings the same way; its zone
    /// and region queues exist only when the node has a zone or region.)
    pub fn rank(&self, region: &str, zone: &str) -> u8 {
        if !self.aware {
            RANK_NONE
        } else if !self.zone.is_empty() && self.zone == zone {
            RANK_ZONE
        } else if !self.region.is_empty() && self.region == region {
            RANK_REGION
        } else {
            RANK_GLOBAL
        }
    }
}

/// Deliveries of a channel by the rank of the client that got them (nsqd master's
/// channel `zone_local_msg_count`, `region_local_msg_count`, `global_msg_count`); all 0
/// without the experiment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RankCounts {
    /// To clients in the node's zone.
    #[serde(skip_serializing_if = "is_zero")]
    pub zone_local_msg_count: u64,
    /// To clients in the node's region, not its zone.
    #[serde(skip_serializing_if = "is_zero")]
    pub region_local_msg_count: u64,
    /// To other clients.
    #[serde(skip_serializing_if = "is_zero")]
    pub global_msg_count: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RankCounts {
    /// Counts one delivery to a client of rank `rank` (nothing for [`RANK_NONE`]).
    pub fn count(&mut self, rank: u8) {
        match rank {
            RANK_ZONE => self.zone_local_msg_count += 1,
            RANK_REGION => self.region_local_msg_count += 1,
            RANK_GLOBAL => self.global_msg_count += 1,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks() {
        let t = Topology {
            region: "us-east".into(),
            zone: "us-east-1a".into(),
            aware: true,
        };
        assert_eq!(t.rank("us-east", "us-east-1a"), RANK_ZONE);
        assert_eq!(t.rank("", "us-east-1a"), RANK_ZONE);
        assert_eq!(t.rank("us-east", "us-east-1b"), RANK_REGION);
        assert_eq!(t.rank("eu", "eu-1a"), RANK_GLOBAL);
        assert_eq!(t.rank("", ""), RANK_GLOBAL);
        let off = Topology {
            aware: false,
            ..t.clone()
        };
        assert_eq!(off.rank("us-east", "us-east-1a"), RANK_NONE);
        // No zone or region on the node: nobody is local.
        let bare = Topology {
            aware: true,
            ..Topology::default()
        };
        assert_eq!(bare.rank("", ""), RANK_GLOBAL);
        let mut c = RankCounts::default();
        for r in [RANK_NONE, RANK_ZONE, RANK_ZONE, RANK_REGION, RANK_GLOBAL] {
            c.count(r);
        }
        assert_eq!(
            (
                c.zone_local_msg_count,
                c.region_local_msg_count,
                c.global_msg_count
            ),
            (2, 1, 1)
        );
    }
}
