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
//!
//! Pings also carry the time the sender wrote them (its monotonic clock, [`clock_ms`])
//! and send back the latest such time read from the receiver. A peer that sends back
//! time `t` of this member heard from it at or after `t`, so it does not find this
//! member silent before `t` + [`SILENT_AFTER`], and until then neither starts nor grants
//! an election against it: what a leader's delivery lease rests on
//! (src/cluster/replica/lease.rs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often each member connection writes a ping: often enough that a replica's
/// answer (the time it sends back) is at most this plus a round trip old when the next
/// comes, well inside a leader's 250 ms delivery lease.
pub const PING_EVERY: Duration = Duration::from_millis(50);

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
    /// The peer's clock in its latest ping read here (0: none since its connections
    /// last closed): sent back in this member's pings.
    their_clock: AtomicU64,
    /// The latest of this member's own ping times the peer sent back ([`clock_ms`]; 0:
    /// none since the peer's connections to this member last closed).
    echoed: AtomicU64,
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
                their_clock: AtomicU64::new(0),
                echoed: AtomicU64::new(0),
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

/// A greeted connection from peer `replica` closed. What the peer sent back of this
/// member's clock, and what it sent of its own, no longer count: the peer may have
/// restarted, and then remembers hearing nothing.
pub fn closed(replica: u64) {
    if let Some(p) = peer(replica) {
        // Saturating: never below 0 whatever the order of calls.
        let _ = p
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        p.contact.fetch_add(1, Ordering::Relaxed);
        p.echoed.store(0, Ordering::Relaxed);
        p.their_clock.store(0, Ordering::Relaxed);
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

/// How long ago a frame last came from peer `replica`, in milliseconds (`u64::MAX`:
/// never, or not a peer).
#[must_use]
pub fn silent_for_ms(replica: u64) -> u64 {
    peer(replica).map_or(u64::MAX, |p| match p.heard_ms.load(Ordering::Relaxed) {
        0 => u64::MAX,
        at => now_ms().saturating_sub(at),
    })
}

/// A ping from peer `replica`: its count for this member, its clock as it wrote the
/// ping, and the latest time of this member's clock it read (`echo`, 0: none).
pub fn pinged(replica: u64, theirs: u64, sent: u64, echo: u64) {
    heard(replica);
    if let Some(p) = peer(replica) {
        // Stored as it comes: a restarted peer counts from 0 again. Pings of its
        // several shards can cross a change for a moment; each wakes the groups once.
        p.theirs.store(theirs, Ordering::Relaxed);
        // As it comes too: any time the peer wrote a ping read here is one this member
        // heard it at or after, whatever the order its shards' pings arrive in.
        p.their_clock.store(sent, Ordering::Relaxed);
        if let Some(echo) = valid_echo(echo, clock_ms()) {
            p.echoed.fetch_max(echo, Ordering::Relaxed);
        }
    }
}

/// `echo` as a proof that the peer heard this member at or after it: none when 0, or
/// later than `now` (a time of no clock of this host's: a bad frame).
fn valid_echo(echo: u64, now: u64) -> Option<u64> {
    (echo != 0 && echo <= now).then_some(echo)
}

/// What a ping to peer `replica` carries: (this member's count for it, this member's
/// clock now, the peer's latest clock read here).
#[must_use]
pub fn ping_fields(replica: u64) -> (u64, u64, u64) {
    (
        own_count(replica),
        clock_ms(),
        peer(replica).map_or(0, |p| p.their_clock.load(Ordering::Relaxed)),
    )
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`) in milliseconds, never 0: what pings
/// carry. One clock for every process on the host, so a time sent back to a restarted
/// member is not mistaken for a later one of its own.
#[must_use]
pub fn clock_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 1;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let millis = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000;
    secs.saturating_mul(1000).saturating_add(millis).max(1)
}

/// The latest of this member's ping times ([`clock_ms`]) peer `replica` sent back while
/// one of its connections to this member is open (`None`: none since its connections
/// last closed).
#[must_use]
pub fn echoed(replica: u64) -> Option<u64> {
    let p = peer(replica)?;
    let at = p.echoed.load(Ordering::Relaxed);
    (at != 0 && p.open.load(Ordering::Relaxed) > 0).then_some(at)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_of_none_or_from_the_future_proves_nothing() {
        assert_eq!(valid_echo(0, 1000), None);
        assert_eq!(valid_echo(1001, 1000), None);
        assert_eq!(valid_echo(1000, 1000), Some(1000));
        assert_eq!(valid_echo(7, 1000), Some(7));
    }

    #[test]
    fn the_clock_moves_forward_and_is_never_zero() {
        let a = clock_ms();
        std::thread::sleep(Duration::from_millis(20));
        let b = clock_ms();
        assert!(a > 0);
        assert!(b >= a + 19, "{a} then {b}");
    }
}
