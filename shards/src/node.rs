//! Node-wide settings that change at run time: the nsqlookupd TCP addresses and the log
//! level (`PUT /config/nsqlookupd_tcp_addresses`, `PUT /config/log_level`, nsqd:
//! http.go doConfig), the nsqlookupd HTTP addresses shard 0 learns from each peer's
//! IDENTIFY answer (nsqd: lookupdHTTPAddrs), and the drain (`PUT /config/drain` or
//! SIGTERM with `--sigterm=drain`, nsqd RFC nsqio/nsq#1302: see docs/draining.md).
//!
//! Every shard keeps its own copy ([`NodeSettings`], in [`crate::Shard::node`]) so that
//! reads are local and synchronous (a topic's creation reads the lookupd HTTP
//! addresses). Shard 0 owns the settings: every change goes through it, which applies it
//! and then sends it to every other shard (the root crate's `ShardMsg::NodeApply`) and
//! waits until each has it, so all shards see changes in the same order and a `PUT`
//! answers only once every shard serves the new value. A change made on another shard
//! is sent to shard 0 first (`ShardMsg::NodeChange`).

use std::cell::{Cell, RefCell};

/// A lookupd TCP address list as /config shows it: `None` is JSON `null`.
pub type PeerList = Option<Vec<String>>;

/// One change of the node-wide settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeUpdate {
    /// `PUT /config/nsqlookupd_tcp_addresses`: the new list (shard 0's lookup loop adds
    /// and removes peers to match).
    LookupdTcpAddresses(PeerList),
    /// A lookupd peer's HTTP address (`host:port`) learned from its IDENTIFY answer, or
    /// forgotten (`None`).
    LookupdHttp { peer: String, http: Option<String> },
    /// `PUT /config/log_level`: nsqd's level number, 1 (debug) to 5 (fatal).
    LogLevel(u8),
    /// The node drains (`PUT /config/drain`, SIGTERM with `--sigterm=drain`): publishes
    /// and the creation of topics and channels are refused from now on. One way: a drain
    /// is never cancelled.
    Drain,
}

/// One shard's copy of the node-wide settings (see the module docs).
#[derive(Default, Debug)]
pub struct NodeSettings {
    /// `None` until a PUT changed it (the command line's list applies).
    lookupd_tcp: RefCell<Option<PeerList>>,
    /// Counts changes of `lookupd_tcp` (shard 0's lookup loop compares it).
    lookupd_generation: Cell<u64>,
    /// (peer TCP address, `host:port` of its HTTP API), in peer order. A peer's entry
    /// stays while it is disconnected (nsqd keeps `lp.Info` until the next IDENTIFY
    /// answers).
    lookupd_http: RefCell<Vec<(String, String)>>,
    /// nsqd's level number set by a PUT; 0 until then (the command line's level applies).
    log_level: Cell<u8>,
    /// Set once the node drains ([`NodeUpdate::Drain`]); never cleared.
    draining: Cell<bool>,
}

impl NodeSettings {
    /// Applies one change to this copy.
    pub fn apply(&self, update: &NodeUpdate) {
        match update {
            NodeUpdate::LookupdTcpAddresses(list) => {
                *self.lookupd_tcp.borrow_mut() = Some(list.clone());
                self.lookupd_generation
                    .set(self.lookupd_generation.get() + 1);
            }
            NodeUpdate::LookupdHttp { peer, http } => {
                let mut v = self.lookupd_http.borrow_mut();
                match (v.iter().position(|(p, _)| p == peer), http) {
                    (Some(i), Some(h)) => v[i].1 = h.clone(),
                    (None, Some(h)) => v.push((peer.clone(), h.clone())),
                    (Some(i), None) => {
                        v.remove(i);
                    }
                    (None, None) => {}
                }
            }
            NodeUpdate::LogLevel(n) => self.log_level.set(*n),
            NodeUpdate::Drain => self.draining.set(true),
        }
    }

    /// The lookupd TCP addresses set at run time; `None` until a PUT set them.
    pub fn lookupd_tcp_addresses(&self) -> Option<PeerList> {
        self.lookupd_tcp.borrow().clone()
    }

    /// How many times the lookupd TCP addresses changed.
    pub fn lookupd_generation(&self) -> u64 {
        self.lookupd_generation.get()
    }

    /// The HTTP addresses of the lookupd peers that answered IDENTIFY with a broadcast
    /// address, in peer order (nsqd: lookupdHTTPAddrs).
    pub fn lookupd_http_addrs(&self) -> Vec<String> {
        self.lookupd_http
            .borrow()
            .iter()
            .map(|(_, h)| h.clone())
            .collect()
    }

    /// nsqd's log level number set by a PUT (1 debug .. 5 fatal); 0 if none was.
    pub fn log_level(&self) -> u8 {
        self.log_level.get()
    }

    /// True once the node drains: publishes, new topics and new channels are refused.
    pub fn draining(&self) -> bool {
        self.draining.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookupd_http_addresses_follow_peers() {
        let n = NodeSettings::default();
        let set = |peer: &str, http: Option<&str>| {
            n.apply(&NodeUpdate::LookupdHttp {
                peer: peer.into(),
                http: http.map(String::from),
            })
        };
        set("a:4160", Some("a:4161"));
        set("b:4160", Some("b:4161"));
        set("a:4160", Some("a2:4161"));
        assert_eq!(n.lookupd_http_addrs(), ["a2:4161", "b:4161"]);
        set("a:4160", None);
        set("b:4160", None);
        assert!(n.lookupd_http_addrs().is_empty());
    }

    #[test]
    fn peer_list_and_log_level() {
        let n = NodeSettings::default();
        assert_eq!(n.lookupd_tcp_addresses(), None);
        n.apply(&NodeUpdate::LookupdTcpAddresses(None));
        assert_eq!(n.lookupd_tcp_addresses(), Some(None));
        n.apply(&NodeUpdate::LookupdTcpAddresses(Some(
            vec!["x:4160".into()],
        )));
        assert_eq!(n.lookupd_generation(), 2);
        assert_eq!(n.log_level(), 0);
        n.apply(&NodeUpdate::LogLevel(3));
        assert_eq!(n.log_level(), 3);
        assert!(!n.draining());
        n.apply(&NodeUpdate::Drain);
        n.apply(&NodeUpdate::Drain);
        assert!(n.draining());
    }
}
