//! A shard thread's delivery deadline, for cluster members: a channel delivers, and the
//! broker's TCP writers write to clients, only until the deadline its member's
//! replication clock last set ([`open_until`]), so a shard thread that did not run for
//! a while (its process was stopped, its VM paused) delivers and writes nothing on
//! waking until that clock has run again and held the topics whose leadership it must
//! confirm first. Without a deadline (a standalone broker, which never sets one) it is
//! always open.

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Lets this thread's channels deliver until `deadline`.
pub fn open_until(deadline: Instant) {
    DEADLINE.with(|d| d.set(Some(deadline)));
}

/// Removes this thread's deadline: open from now on (the clock that set it stopped).
pub fn open_for_good() {
    DEADLINE.with(|d| d.set(None));
}

/// True when this thread's channels may deliver at `now`: no deadline was set, or it
/// has not passed.
#[must_use]
pub fn is_open(now: Instant) -> bool {
    DEADLINE.with(|d| d.get().is_none_or(|d| now <= d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn open_without_a_deadline_and_until_the_one_set() {
        std::thread::spawn(|| {
            let now = Instant::now();
            assert!(is_open(now + Duration::from_secs(3600)));
            open_until(now + Duration::from_millis(200));
            assert!(is_open(now));
            assert!(is_open(now + Duration::from_millis(200)));
            assert!(!is_open(now + Duration::from_millis(201)));
            open_for_good();
            assert!(is_open(now + Duration::from_secs(3600)));
        })
        .join()
        .unwrap();
    }
}
