//! Messages and their IDs (nsqd: message.go, guid.go).
//!
//! Wire layout of a message frame (protocol V2, big-endian):
//! ```text
//! [int32 size = 30 + len(body)][int32 frame_type = 2]
//! [int64 timestamp_ns][uint16 attempts][16 bytes id: lowercase hex][body]
//! ```

use bytes::Bytes;

/// A message ID: 64 bits shown on the wire as 16 lowercase hex ASCII characters, most
/// significant byte first (nsqd: guid.go `Hex()`). Clients treat it as 16 opaque bytes;
/// only the exact lowercase form this broker sends finds a message again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub u64);

const HEX: &[u8; 16] = b"0123456789abcdef";

impl MessageId {
    /// The 16 ASCII bytes sent on the wire.
    pub fn to_hex(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            let shift = 60 - 4 * i;
            *o = HEX[((self.0 >> shift) & 0xf) as usize];
        }
        out
    }

    /// Parses 16 lowercase hex characters. Anything else (upper case, wrong length) is
    /// `None`, which callers report as "not in flight": nsqd compares IDs as raw bytes.
    pub fn from_hex(s: &[u8]) -> Option<MessageId> {
        if s.len() != 16 {
            return None;
        }
        let mut v = 0u64;
        for &c in s {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                _ => return None,
            };
            v = (v << 4) | d as u64;
        }
        Some(MessageId(v))
    }
}

/// Generates the IDs of one topic as nsqd's guid factory does:
/// `ts << 22 | node_id << 12 | seq`, `ts` = `(unix_ns >> 20) - 1288834974288`
/// ("pseudo-milliseconds" of 2^20 ns), `seq` counting from 0 within one `ts`. The clock
/// is the kernel's coarse real-time clock (a few ns to read, ticks of 1-4 ms); where nsqd
/// sleeps once 4,096 IDs used up a `ts`, this one takes the next `ts` instead, so IDs
/// stay unique and their node bits intact at any rate (running ahead of the clock only
/// above 4,096 IDs per ms on one topic).
pub struct IdGenerator {
    node_bits: u64,
    ts: u64,
    seq: u64,
    /// The largest ID given or resumed after (0: none yet).
    last: u64,
}

/// nsqd's guid epoch, in 2^20-ns units.
const GUID_EPOCH: u64 = 1288834974288;

impl IdGenerator {
    pub fn new(node_id: u16) -> IdGenerator {
        IdGenerator {
            node_bits: (node_id as u64 & 0x3ff) << 12,
            ts: 0,
            seq: 0,
            last: 0,
        }
    }

    /// Continues after `last`, an ID this generator's topic gave before a restart: no
    /// new ID repeats or precedes it even when the clock now reads earlier (a clock
    /// stepped back across a restart; nsqd's factory waits for the clock within one
    /// run). A repeated ID would overwrite an in-flight message of a channel.
    pub fn resume_after(&mut self, last: MessageId) {
        self.last = self.last.max(last.0);
        let ts = last.0 >> 22;
        let seq = last.0 & 0xfff;
        if (ts, seq) > (self.ts, self.seq) {
            self.ts = ts;
            self.seq = seq;
        }
    }

    pub fn next_id(&mut self) -> MessageId {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
        let ns = (now.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(now.tv_nsec as u64);
        let ts = (ns >> 20).saturating_sub(GUID_EPOCH);
        if ts > self.ts {
            self.ts = ts;
            self.seq = 0;
        } else {
            self.seq += 1;
            if self.seq > 0xfff {
                self.ts += 1;
                self.seq = 0;
            }
        }
        let id = self.ts << 22 | self.node_bits | self.seq;
        self.last = self.last.max(id);
        MessageId(id)
    }

    /// The largest ID this generator gave or resumed after (`None`: none yet).
    pub fn last(&self) -> Option<MessageId> {
        (self.last != 0).then_some(MessageId(self.last))
    }

    /// Continues strictly above `last` as a 64-bit number, whatever node gave it (a new
    /// leader of a replicated topic after another node's IDs): the next ID takes at
    /// least the pseudo-millisecond after `last`'s, so its node bits cannot make it
    /// smaller.
    pub fn resume_above(&mut self, last: MessageId) {
        self.last = self.last.max(last.0);
        let ts = (last.0 >> 22) + 1;
        if (ts, 0) > (self.ts, self.seq) {
            self.ts = ts;
            self.seq = 0;
        }
    }
}

/// Nanoseconds since the Unix epoch (the message timestamp unit).
pub fn now_unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The `Instant` that corresponds to a Unix-ns wall-clock time (for due times read back
/// from disk).
pub fn instant_from_unix_nanos(ns: i64) -> std::time::Instant {
    instant_at(ns, std::time::Instant::now(), now_unix_nanos())
}

/// [`instant_from_unix_nanos`] against a given reading of both clocks (`now_i` and
/// `now_ns` taken together), for converting many times at once.
pub fn instant_at(ns: i64, now_i: std::time::Instant, now_ns: i64) -> std::time::Instant {
    // Saturating: a due time from a damaged file or a flag at Go's limit (292 years)
    // must not overflow.
    if ns >= now_ns {
        let ahead = std::time::Duration::from_nanos(ns.abs_diff(now_ns));
        now_i
            .checked_add(ahead)
            .unwrap_or(now_i + std::time::Duration::from_secs(1 << 33))
    } else {
        now_i
            .checked_sub(std::time::Duration::from_nanos(now_ns.abs_diff(ns)))
            .unwrap_or(now_i)
    }
}

/// The Unix-ns wall-clock time of an `Instant` (for due times written to disk),
/// saturating at the ends of i64.
pub fn unix_nanos_from_instant(i: std::time::Instant) -> i64 {
    unix_nanos_at(i, std::time::Instant::now(), now_unix_nanos())
}

/// [`unix_nanos_from_instant`] against a given reading of both clocks (`now_i` and
/// `now_ns` taken together), for converting many instants at once.
pub fn unix_nanos_at(i: std::time::Instant, now_i: std::time::Instant, now_ns: i64) -> i64 {
    let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    if i >= now_i {
        now_ns.saturating_add(nanos(i - now_i))
    } else {
        now_ns.saturating_sub(nanos(now_i - i))
    }
}

/// One message as a channel holds it. The body is shared by every channel (a `Bytes`
/// reference count, never a copy).
#[derive(Clone, Debug)]
pub struct Message {
    /// Position in the topic's log (the channel's low watermark and the store use it).
    pub seq: u64,
    pub id: MessageId,
    /// Publish time, Unix ns; unchanged across requeues.
    pub timestamp: i64,
    /// Deliveries so far on this channel (the first delivery sends 1); wraps like nsqd's
    /// uint16.
    pub attempts: u16,
    pub body: Bytes,
}

/// Bytes a message frame adds on top of its body (size, type, ts, attempts, id).
pub use nsq_wire::frame::MESSAGE_FRAME_OVERHEAD;

impl Message {
    /// Appends the complete message frame (size prefix included) to `out`.
    pub fn write_frame(&self, out: &mut Vec<u8>) {
        nsq_wire::frame::write_message_frame(
            out,
            self.timestamp,
            self.attempts,
            &self.id.to_hex(),
            &self.body,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A due time at Go's limit (a DPUB or REQ with --max-req-timeout=2562047h) or from a
    /// damaged file saturates; the addition overflowed (a shard's panic in a debug
    /// build, a wrapped due time in a release one).
    #[test]
    fn due_times_at_the_ends_saturate() {
        let far = std::time::Instant::now() + std::time::Duration::from_nanos(i64::MAX as u64);
        assert_eq!(unix_nanos_from_instant(far), i64::MAX);
        let back = instant_from_unix_nanos(i64::MAX);
        assert!(back > std::time::Instant::now() + std::time::Duration::from_secs(1 << 30));
        let past = instant_from_unix_nanos(i64::MIN);
        assert!(past <= std::time::Instant::now());
        let now = now_unix_nanos();
        let soon = unix_nanos_from_instant(instant_from_unix_nanos(now + 5_000_000_000));
        assert!(
            (soon - (now + 5_000_000_000)).abs() < 1_000_000_000,
            "{soon} {now}"
        );
    }

    #[test]
    fn id_hex_round_trip() {
        let id = MessageId(0x18ad4a3bed269000);
        assert_eq!(&id.to_hex(), b"18ad4a3bed269000");
        assert_eq!(MessageId::from_hex(b"18ad4a3bed269000"), Some(id));
        assert_eq!(MessageId::from_hex(b"18AD4A3BED269000"), None);
        assert_eq!(MessageId::from_hex(b"18ad4a3bed26900"), None);
    }

    #[test]
    fn ids_follow_the_clock_with_node_bits_intact() {
        let mut g = IdGenerator::new(7);
        let ts_of = |id: MessageId| id.0 >> 22;
        let node_of = |id: MessageId| (id.0 >> 12) & 0x3ff;
        let first = g.next_id();
        let mut prev = first;
        // 20,000 IDs at once: more than one ts can hold; unique, increasing, node 7.
        for _ in 0..20_000 {
            let id = g.next_id();
            assert!(id.0 > prev.0);
            assert_eq!(node_of(id), 7);
            prev = id;
        }
        std::thread::sleep(std::time::Duration::from_millis(60));
        let later = g.next_id();
        // The clock moved on: a later ts, the sequence from 0 (nsqd's IDs do the same).
        assert!(ts_of(later) >= ts_of(first) + 40, "{first:?} {later:?}");
        assert_eq!(later.0 & 0xfff, 0);
    }

    #[test]
    fn ids_resumed_after_a_restart_never_repeat_when_the_clock_went_back() {
        let mut g = IdGenerator::new(5);
        let now = g.next_id();
        // IDs given before the restart, 10 s (about 9,537 units of 2^20 ns) ahead of now.
        let ahead = MessageId(((now.0 >> 22) + 9_537) << 22 | 5 << 12 | 0xffe);
        let mut g = IdGenerator::new(5);
        g.resume_after(ahead);
        let a = g.next_id();
        let b = g.next_id();
        assert!(a.0 > ahead.0 && b.0 > a.0, "{ahead:?} {a:?} {b:?}");
        assert_eq!((a.0 >> 12) & 0x3ff, 5, "node bits kept");
        // An older ID does not move the generator back.
        g.resume_after(now);
        assert!(g.next_id().0 > b.0);
    }

    #[test]
    fn frame_matches_capture() {
        // From a real nsqd 1.3.0 transcript: body "hello", attempts 1.
        let m = Message {
            seq: 0,
            id: MessageId(0x18ad4a3bed269000),
            timestamp: 1795981184279709710,
            attempts: 1,
            body: Bytes::from_static(b"hello"),
        };
        let mut out = Vec::new();
        m.write_frame(&mut out);
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "000000230000000218ec9b5f2047080e00013138616434613362656432363930303068656c6c6f"
        );
    }
}
