//! nsqlookupd's registration database (nsqlookupd: registration_db.go).
//!
//! A registration is a `(category, key, subkey)` triple: `("client", "", "")` for every
//! identified nsqd, `("topic", t, "")` and `("channel", t, c)` for what it holds. Each
//! registration maps peer ids (the remote address of the V1 connection) to a [`Producer`].
//! Registrations stay in the database with no producers left; only an explicit removal
//! (HTTP delete, ephemeral UNREGISTER) drops the key.
//!
//! Go iterates maps in random order; here every listing comes out in insertion order
//! (registrations by the time they were first added, producers likewise), which is one of
//! the orders Go may produce.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Wall clock in Unix nanoseconds.
pub fn now_nanos() -> i64 {
    nsq_wire::timefmt::now_unix_nanos()
}

/// What an nsqd told us in IDENTIFY, plus the connection's identity.
#[derive(Debug)]
pub struct PeerInfo {
    /// The remote address of the V1 connection; the producer key in every registration.
    pub id: String,
    pub remote_address: String,
    pub hostname: String,
    pub broadcast_address: String,
    pub tcp_port: i64,
    pub http_port: i64,
    pub version: String,
    /// Unix ns of IDENTIFY or of the last PING.
    last_update: AtomicI64,
}

impl PeerInfo {
    pub fn new(
        id: String,
        hostname: String,
        broadcast_address: String,
        tcp_port: i64,
        http_port: i64,
        version: String,
    ) -> PeerInfo {
        PeerInfo {
            remote_address: id.clone(),
            id,
            hostname,
            broadcast_address,
            tcp_port,
            http_port,
            version,
            last_update: AtomicI64::new(now_nanos()),
        }
    }

    /// Unix ns of the last IDENTIFY or PING.
    pub fn last_update(&self) -> i64 {
        self.last_update.load(Ordering::Relaxed)
    }

    /// Sets the last update (Unix ns); PING does this.
    pub fn touch(&self, now_ns: i64) {
        self.last_update.store(now_ns, Ordering::Relaxed);
    }
}

/// A peer inside one registration, with that registration's tombstone state.
#[derive(Debug, Clone)]
pub struct Producer {
    pub peer: Arc<PeerInfo>,
    pub tombstoned: bool,
    /// Unix ns of the tombstone; `None` is Go's zero `time.Time`.
    pub tombstoned_at: Option<i64>,
}

impl Producer {
    pub fn new(peer: Arc<PeerInfo>) -> Producer {
        Producer {
            peer,
            tombstoned: false,
            tombstoned_at: None,
        }
    }

    /// Tombstoned less than `lifetime` ago (nsqlookupd: Producer.IsTombstoned).
    pub fn is_tombstoned(&self, lifetime: Duration, now_ns: i64) -> bool {
        match (self.tombstoned, self.tombstoned_at) {
            (true, Some(at)) => ((now_ns - at) as i128) < lifetime.as_nanos() as i128,
            _ => false,
        }
    }

    /// `tombstonedAt.UnixNano()` as Go computes it: the zero time overflows to
    /// -6795364578871345152.
    pub fn tombstoned_at_go(&self) -> i64 {
        match self.tombstoned_at {
            Some(at) => at,
            None => (-62_135_596_800i64).wrapping_mul(1_000_000_000),
        }
    }
}

/// Keeps the producers that pinged within `inactivity` and are not tombstoned within
/// `tombstone_lifetime` (nsqlookupd: Producers.FilterByActive).
pub fn filter_by_active(
    producers: Vec<Producer>,
    inactivity: Duration,
    tombstone_lifetime: Duration,
    now_ns: i64,
) -> Vec<Producer> {
    producers
        .into_iter()
        .filter(|p| {
            let idle = (now_ns - p.peer.last_update()) as i128;
            !(idle > inactivity.as_nanos() as i128 || p.is_tombstoned(tombstone_lifetime, now_ns))
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Registration {
    pub category: String,
    pub key: String,
    pub sub_key: String,
}

impl Registration {
    pub fn new(category: &str, key: &str, sub_key: &str) -> Registration {
        Registration {
            category: category.into(),
            key: key.into(),
            sub_key: sub_key.into(),
        }
    }

    /// `*` in `key` or `sub_key` matches anything.
    pub fn is_match(&self, category: &str, key: &str, sub_key: &str) -> bool {
        self.category == category
            && (key == "*" || self.key == key)
            && (sub_key == "*" || self.sub_key == sub_key)
    }
}

struct Entry {
    seq: u64,
    producers: Vec<Producer>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Registration, Entry>,
    next_seq: u64,
}

impl Inner {
    fn entry(&mut self, k: Registration) -> &mut Entry {
        let seq = self.next_seq;
        let e = self.map.entry(k).or_insert(Entry {
            seq,
            producers: Vec::new(),
        });
        if e.seq == seq {
            self.next_seq += 1;
        }
        e
    }

    /// Registrations in insertion order.
    fn ordered(&self) -> Vec<(&Registration, &Entry)> {
        let mut v: Vec<_> = self.map.iter().collect();
        v.sort_by_key(|(_, e)| e.seq);
        v
    }
}

/// The database, shared by the TCP and HTTP threads.
#[derive(Default)]
pub struct RegistrationDb {
    inner: Mutex<Inner>,
}

impl RegistrationDb {
    pub fn new() -> RegistrationDb {
        RegistrationDb::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the maps half-updated in a way that matters here.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds the key with no producers, if it is not there.
    pub fn add_registration(&self, k: Registration) {
        self.lock().entry(k);
    }

    /// Adds the producer under its peer id; false if that id was already there.
    pub fn add_producer(&self, k: Registration, p: Producer) -> bool {
        let mut g = self.lock();
        let e = g.entry(k);
        if e.producers.iter().any(|x| x.peer.id == p.peer.id) {
            return false;
        }
        e.producers.push(p);
        true
    }

    /// Removes the peer from the registration: (whether it was there, producers left).
    /// The key stays even with no producers left.
    pub fn remove_producer(&self, k: &Registration, id: &str) -> (bool, usize) {
        let mut g = self.lock();
        let Some(e) = g.map.get_mut(k) else {
            return (false, 0);
        };
        let before = e.producers.len();
        e.producers.retain(|p| p.peer.id != id);
        (e.producers.len() != before, e.producers.len())
    }

    /// Removes the registration and all its producers.
    pub fn remove_registration(&self, k: &Registration) {
        self.lock().map.remove(k);
    }

    /// Registrations matching the pattern (`*` wildcards in key and sub_key).
    pub fn find_registrations(
        &self,
        category: &str,
        key: &str,
        sub_key: &str,
    ) -> Vec<Registration> {
        let g = self.lock();
        if key != "*" && sub_key != "*" {
            let k = Registration::new(category, key, sub_key);
            return if g.map.contains_key(&k) {
                vec![k]
            } else {
                Vec::new()
            };
        }
        g.ordered()
            .into_iter()
            .filter(|(k, _)| k.is_match(category, key, sub_key))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Producers of the matching registrations, each peer once.
    pub fn find_producers(&self, category: &str, key: &str, sub_key: &str) -> Vec<Producer> {
        let g = self.lock();
        if key != "*" && sub_key != "*" {
            let k = Registration::new(category, key, sub_key);
            return g
                .map
                .get(&k)
                .map(|e| e.producers.clone())
                .unwrap_or_default();
        }
        let mut out: Vec<Producer> = Vec::new();
        for (k, e) in g.ordered() {
            if !k.is_match(category, key, sub_key) {
                continue;
            }
            for p in &e.producers {
                if !out.iter().any(|x| x.peer.id == p.peer.id) {
                    out.push(p.clone());
                }
            }
        }
        out
    }

    /// Every registration that holds the peer id.
    pub fn lookup_registrations(&self, id: &str) -> Vec<Registration> {
        self.lock()
            .ordered()
            .into_iter()
            .filter(|(_, e)| e.producers.iter().any(|p| p.peer.id == id))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Tombstones, in the topic registration, every producer whose
    /// `broadcast_address:http_port` is `node` (nsqlookupd: doTombstoneTopicProducer).
    pub fn tombstone_topic_producer(&self, topic: &str, node: &str, now_ns: i64) {
        let mut g = self.lock();
        if let Some(e) = g.map.get_mut(&Registration::new("topic", topic, "")) {
            for p in e.producers.iter_mut() {
                if format!("{}:{}", p.peer.broadcast_address, p.peer.http_port) == node {
                    p.tombstoned = true;
                    p.tombstoned_at = Some(now_ns);
                }
            }
        }
    }

    /// Every registration with its producers, in insertion order (for /debug).
    pub fn snapshot(&self) -> Vec<(Registration, Vec<Producer>)> {
        self.lock()
            .ordered()
            .into_iter()
            .map(|(k, e)| (k.clone(), e.producers.clone()))
            .collect()
    }
}

/// The keys of registrations, in order.
pub fn keys(rr: &[Registration]) -> Vec<String> {
    rr.iter().map(|r| r.key.clone()).collect()
}

/// The subkeys of registrations, in order.
pub fn sub_keys(rr: &[Registration]) -> Vec<String> {
    rr.iter().map(|r| r.sub_key.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str, last: i64) -> Arc<PeerInfo> {
        let p = PeerInfo::new(id.into(), "host".into(), "b_addr".into(), 1, 2, "v1".into());
        p.touch(last);
        Arc::new(p)
    }

    // Mirrors nsqlookupd's TestRegistrationDB.
    #[test]
    fn registration_db() {
        let t0 = 1_348_797_047 * 1_000_000_000i64;
        let (p1, p2, p3) = (peer("1", t0), peer("2", t0), peer("3", t0));
        let db = RegistrationDb::new();

        assert!(db.add_producer(Registration::new("c", "a", ""), Producer::new(p1.clone())));
        assert!(db.add_producer(Registration::new("c", "a", ""), Producer::new(p2.clone())));
        assert!(!db.add_producer(Registration::new("c", "a", ""), Producer::new(p2.clone())));
        assert!(db.add_producer(Registration::new("c", "a", "b"), Producer::new(p2.clone())));
        assert!(db.add_producer(Registration::new("d", "a", ""), Producer::new(p3.clone())));

        assert_eq!(db.find_registrations("c", "*", "").len(), 1);
        assert_eq!(db.find_registrations("c", "*", "*").len(), 2);
        assert_eq!(keys(&db.find_registrations("c", "*", "*")), ["a", "a"]);
        assert_eq!(sub_keys(&db.find_registrations("c", "a", "*")), ["", "b"]);
        assert_eq!(db.find_producers("c", "*", "").len(), 2);
        assert_eq!(db.find_producers("c", "*", "*").len(), 2);
        assert_eq!(db.find_producers("c", "a", "b").len(), 1);
        assert_eq!(db.find_producers("d", "*", "*").len(), 1);
        assert_eq!(db.lookup_registrations("2").len(), 2);

        let now = t0 + 31 * 1_000_000_000;
        let all = db.find_producers("c", "*", "*");
        assert_eq!(
            filter_by_active(all.clone(), Duration::from_secs(30), Duration::ZERO, now).len(),
            0
        );
        p2.touch(now);
        assert_eq!(
            filter_by_active(all, Duration::from_secs(30), Duration::ZERO, now).len(),
            1
        );

        assert_eq!(
            db.remove_producer(&Registration::new("c", "a", ""), "1"),
            (true, 1)
        );
        assert_eq!(
            db.remove_producer(&Registration::new("c", "a", ""), "1"),
            (false, 1)
        );
        assert_eq!(
            db.remove_producer(&Registration::new("x", "a", ""), "1"),
            (false, 0)
        );
        db.remove_registration(&Registration::new("c", "a", "b"));
        assert_eq!(db.find_registrations("c", "a", "*").len(), 1);
    }

    #[test]
    fn tombstones_expire() {
        let db = RegistrationDb::new();
        let p = peer("1", 0);
        db.add_producer(Registration::new("topic", "t", ""), Producer::new(p));
        db.tombstone_topic_producer("t", "b_addr:2", 1_000);
        let tp = &db.find_producers("topic", "t", "")[0];
        assert!(tp.is_tombstoned(Duration::from_nanos(10), 1_005));
        assert!(!tp.is_tombstoned(Duration::from_nanos(10), 1_010));
        assert_eq!(
            Producer::new(peer("2", 0)).tombstoned_at_go(),
            -6795364578871345152
        );
    }
}
