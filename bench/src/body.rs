//! The 24-byte header every message body starts with, `[u64 publish unix ns][u64 seq]
//! [u32 producer][u32 run id]` (big-endian), and the latency histograms built from it.

use hdrhistogram::Histogram;
use std::time::{SystemTime, UNIX_EPOCH};

/// Size of the header every body starts with.
pub const HEADER: usize = 24;

/// A decoded body header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub ts_ns: u64,
    pub seq: u64,
    pub producer: u32,
    pub run_id: u32,
}

/// Writes the header into the first [`HEADER`] bytes of `b`.
pub fn write_header(b: &mut [u8], ts_ns: u64, seq: u64, producer: u32, run_id: u32) {
    b[0..8].copy_from_slice(&ts_ns.to_be_bytes());
    b[8..16].copy_from_slice(&seq.to_be_bytes());
    b[16..20].copy_from_slice(&producer.to_be_bytes());
    b[20..24].copy_from_slice(&run_id.to_be_bytes());
}

/// Reads the header; `None` when `b` is shorter than [`HEADER`].
pub fn read_header(b: &[u8]) -> Option<Header> {
    if b.len() < HEADER {
        return None;
    }
    let u64_at = |i: usize| Some(u64::from_be_bytes(b.get(i..i + 8)?.try_into().ok()?));
    let u32_at = |i: usize| Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?));
    Some(Header {
        ts_ns: u64_at(0)?,
        seq: u64_at(8)?,
        producer: u32_at(16)?,
        run_id: u32_at(20)?,
    })
}

/// The wall clock, Unix ns.
pub fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Latency histogram in µs, 1 µs .. 1 hour, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let mut b = [0u8; 30];
        write_header(&mut b, 1_700_000_000_000_000_001, 42, 7, 0xdead_beef);
        let h = read_header(&b).unwrap();
        assert_eq!(
            h,
            Header {
                ts_ns: 1_700_000_000_000_000_001,
                seq: 42,
                producer: 7,
                run_id: 0xdead_beef
            }
        );
        assert_eq!(read_header(&b[..23]), None);
    }
}
