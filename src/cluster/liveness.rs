//! Which peers this member is in touch with, for all its shards: what lets a quiet
//! group stop ticking (docs/replication.md, "Quiet groups").
//!
//! Every frame a peer's connection delivers (shard 0 reads them all) counts as
//! hearing from the peer, and each connection writes a
//! [`Frame::Ping`](nsq_replication::wire::Frame::Ping) every [`PING_EVERY`]. A peer is
//! *in touch* while one of its connections is open and it was heard within
//! [`SILENT_AFTER`]. This member counts, per peer, the times touch was lost and found
//! again (a connection closed or opened, a silence ended), and each ping carries the
//! sender's count for the receiver; a peer's *contact number* ([`Contact`]) is the
//! pair of both counts, so it changes on both members whenever either of them lost
//! touch with the other. (Their sum would not always change: when a follower restarted
//! and then its leader did, the follower's count for the leader went up by two while
//! the leader's count for the follower went back down by two.) A follower that
//! confirmed its leader under one contact number must hear from the leader again under
//! a new one before it stops ticking again (a leader that restarted, or was stopped
//! and went on, is never trusted on the strength of what it said before), and the
//! leader, which sees the same change, heartbeats meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often each member connection writes a ping.
pub const PING_EVERY: Duration = Duration::from_millis(100);

/// A peer not heard from for this long is out of touch (a stopped process, a host cut
/// off): the followers of the groups it leads tick again and elect another leader
/// within an election timeout (0.5-0.95 s) after it.
pub const SILENT_AFTER: Duration = Duration::from_millis(400);

struct Peer {
    replica: u64,
    /// Milliseconds since [`EPOCH`] when a frame last came from the peer (0: never).
    heard_ms: AtomicU64,
    /// The peer's connections to this member that are open.
    open: AtomicU64,
    /// This member's count of the times touch with the peer was lost and found again.
    contact: AtomicU64,
    /// The peer's count for this member, from its latest ping.
    theirs: AtomicU64,
}

static PEERS: OnceLock<Vec<Peer>> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ms() -> u64 {
    let epoch = *EPOCH.get_or_init(Instant::now);
    // Never 0, which means "never heard".
    u64::try_from(epoch.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

fn peer(replica: u64) -> Option<&'static Peer> {
    PEERS.get()?.iter().find(|p| p.replica == replica)
}

/// Sets up the table for the peers' replica ids (the first call wins: every shard has
/// the same members).
pub fn init(replicas: &[u64]) {
    EPOCH.get_or_init(Instant::now);
    PEERS.get_or_init(|| {
        replicas
            .iter()
            .map(|&replica| Peer {
                replica,
                heard_ms: AtomicU64::new(0),
                open: AtomicU64::new(0),
                contact: AtomicU64::new(0),
                theirs: AtomicU64::new(0),
            })
            .collect()
    });
}

/// A connection from peer `replica` was greeted: it is heard now, under a new contact
/// number.
pub fn opened(replica: u64) {
    if let Some(p) = peer(replica) {
        p.open.fetch_add(1, Ordering::Relaxed);
        p.contact.fetch_add(1, Ordering::Relaxed);
        p.heard_ms.store(now_ms(), Ordering::Relaxed);
    }
}

/// A greeted connection from peer `replica` closed.
pub fn closed(replica: u64) {
    if let Some(p) = peer(replica) {
        // Saturating: never below 0 whatever the order of calls.
        let _ = p
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        p.contact.fetch_add(1, Ordering::Relaxed);
    }
}

/// A frame came from peer `replica`. After a silence of [`SILENT_AFTER`] or more, the
/// contact number changes.
pub fn heard(replica: u64) {
    if let Some(p) = peer(replica) {
        let now = now_ms();
        let before = p.heard_ms.swap(now, Ordering::Relaxed);
        if now.saturating_sub(before) >= silent_ms() {
            p.contact.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A ping from peer `replica` with its count for this member.
pub fn pinged(replica: u64, theirs: u64) {
    heard(replica);
    if let Some(p) = peer(replica) {
        // Stored as it comes: a restarted peer counts from 0 again. Pings of its
        // several shards can cross a change for a moment; each wakes the groups once.
        p.theirs.store(theirs, Ordering::Relaxed);
    }
}

/// This member's count for peer `replica`: what its pings to the peer carry.
#[must_use]
pub fn own_count(replica: u64) -> u64 {
    peer(replica).map_or(0, |p| p.contact.load(Ordering::Relaxed))
}

/// A peer's contact number: (this member's count of the times touch with the peer was
/// lost and found again, the peer's count for this member from its latest ping). Two
/// differ whenever either member lost touch with the other in between: this member's
/// count only grows while it runs, and a peer that restarted shows here as a closed
/// and a new connection.
pub type Contact = (u64, u64);

fn contact_of(p: &Peer) -> Contact {
    (
        p.contact.load(Ordering::Relaxed),
        p.theirs.load(Ordering::Relaxed),
    )
}

fn silent_ms() -> u64 {
    u64::try_from(SILENT_AFTER.as_millis()).unwrap_or(u64::MAX)
}

/// Each peer's touch as of now: `(replica, in touch, contact number)`, in the order of
/// `--cluster-peer`. Two views differ exactly when some peer's touch changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View(Vec<(u64, bool, Contact)>);

impl View {
    /// Reads the table now.
    #[must_use]
    pub fn now() -> View {
        let now = now_ms();
        View(
            PEERS
                .get()
                .map(|peers| {
                    peers
                        .iter()
                        .map(|p| {
                            let heard = p.heard_ms.load(Ordering::Relaxed);
                            let touch = p.open.load(Ordering::Relaxed) > 0
                                && heard != 0
                                && now.saturating_sub(heard) < silent_ms();
                            (p.replica, touch, contact_of(p))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    /// Peer `replica`'s contact number while it is in touch (`None`: out of touch, or
    /// not a peer).
    #[must_use]
    pub fn contact(&self, replica: u64) -> Option<Contact> {
        self.0
            .iter()
            .find(|(r, _, _)| *r == replica)
            .and_then(|&(_, touch, contact)| touch.then_some(contact))
    }
}

/// Whether peer `replica` is in touch now: one of its connections is open and it was
/// heard from within [`SILENT_AFTER`].
#[must_use]
pub fn in_touch(replica: u64) -> bool {
    View::now().contact(replica).is_some()
}

/// Peer `replica`'s contact number now (what a group records when it hears from it).
#[must_use]
pub fn contact(replica: u64) -> Contact {
    peer(replica).map_or((0, 0), contact_of)
}
