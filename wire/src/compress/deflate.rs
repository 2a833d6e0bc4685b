//! Raw DEFLATE (RFC 1951, no zlib header) both ways, as nsqd speaks after IDENTIFY
//! negotiates `deflate`; the writer sync-flushes on every flush. Each side keeps the last
//! 32 KiB it produced (the DEFLATE window), so a connection moved to another shard
//! continues with a fresh stream primed with that history as its preset dictionary: the
//! peer's back-references stay valid.

use super::{codec, CompressError};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The DEFLATE window.
pub const WINDOW: usize = 32 * 1024;

fn remember(history: &mut Vec<u8>, data: &[u8]) {
    if data.len() >= WINDOW {
        history.clear();
        history.extend_from_slice(&data[data.len() - WINDOW..]);
        return;
    }
    history.extend_from_slice(data);
    if history.len() > WINDOW {
        let cut = history.len() - WINDOW;
        history.drain(..cut);
    }
}

/// Inflates the client's stream incrementally.
pub struct DeflateDecoder {
    inner: Decompress,
    history: Vec<u8>,
    /// The last 4 input bytes (a sync flush ends with `00 00 ff ff`).
    tail: [u8; 4],
}

impl DeflateDecoder {
    /// A decoder for a new stream, or one that continues a stream whose last 32 KiB of
    /// output is `history` (after a hand-off; the stream must be at a flush point).
    pub fn new(history: Vec<u8>) -> Result<DeflateDecoder, CompressError> {
        let mut inner = Decompress::new(false);
        if !history.is_empty() {
            inner.set_dictionary(&history).map_err(codec)?;
        }
        Ok(DeflateDecoder {
            inner,
            history,
            tail: [0, 0, 0xff, 0xff],
        })
    }

    /// True when the input so far ends at a sync-flush point, where the stream can move
    /// to a fresh inflater primed with [`history`](Self::history).
    pub fn at_flush_point(&self) -> bool {
        self.tail == [0, 0, 0xff, 0xff]
    }

    /// The last 32 KiB of inflated data.
    pub fn history(&self) -> &[u8] {
        &self.history
    }

    /// Inflates `data` (any amount, any split) into `out`.
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
        let start = out.len();
        for &b in data.iter().rev().take(4).collect::<Vec<_>>().iter().rev() {
            self.tail.rotate_left(1);
            self.tail[3] = *b;
        }
        loop {
            out.reserve(data.len() * 4 + 4096);
            let before_in = self.inner.total_in();
            let before_out = self.inner.total_out();
            let st = self
                .inner
                .decompress_vec(data, out, FlushDecompress::Sync)
                .map_err(codec)?;
            let used = (self.inner.total_in() - before_in) as usize;
            let made = (self.inner.total_out() - before_out) as usize;
            data = &data[used..];
            if st == Status::StreamEnd {
                return Err(CompressError::DeflateEnded);
            }
            if data.is_empty() && out.len() < out.capacity() {
                break;
            }
            if used == 0 && made == 0 {
                break;
            }
        }
        remember(&mut self.history, &out[start..]);
        Ok(())
    }
}

/// A non-final stored block of no bytes, starting on a byte boundary: the 3 header bits
/// padded to a byte, then LEN 0 and NLEN 0xffff (RFC 1951 3.2.4).
const EMPTY_STORED_BLOCK: [u8; 5] = [0x00, 0x00, 0x00, 0xff, 0xff];

/// Deflates outgoing bytes, sync-flushing every call.
pub struct DeflateEncoder {
    inner: Compress,
}

impl DeflateEncoder {
    /// An encoder at `level` (1-9), primed with `history` when continuing a stream.
    pub fn new(level: u32, history: &[u8]) -> Result<DeflateEncoder, CompressError> {
        let mut inner = Compress::new(Compression::new(level.clamp(1, 9)), false);
        if !history.is_empty() {
            inner.set_dictionary(history).map_err(codec)?;
        }
        Ok(DeflateEncoder { inner })
    }

    /// Appends the deflated, sync-flushed form of `data` to `out` (Go's compress/flate
    /// `Flush` ends a block and writes a sync marker, one per nsqd flush).
    pub fn encode(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
        self.sync_flushed(data, out)
    }

    /// A flush with nothing new: Go's `Flush` still writes a sync marker, an empty
    /// stored block (5 bytes, byte-aligned after a sync flush). nsqd flushes twice where
    /// its messagePump also flushes: the upgrade's `OK`, a heartbeat to a client not
    /// ready for messages (nsqd 1.3.0's bytes end in `00 00 00 ff ff` twice there).
    pub fn flush_again(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&EMPTY_STORED_BLOCK);
    }

    fn sync_flushed(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
        loop {
            out.reserve(data.len() / 2 + 1024);
            let before_in = self.inner.total_in();
            self.inner
                .compress_vec(data, out, FlushCompress::Sync)
                .map_err(codec)?;
            let used = (self.inner.total_in() - before_in) as usize;
            data = &data[used..];
            // Done once all input is consumed and the flush fit (room was left over).
            if data.is_empty() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }
}

/// Keeps the last 32 KiB written through an encoder (for a hand-off).
pub fn remember_output(history: &mut Vec<u8>, data: &[u8]) {
    remember(history, data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// nsqd 1.3.0's deflate stream (level 6) after IDENTIFY, then after one heartbeat:
    /// the frames' blocks, each of these flushes ending in two empty stored blocks (the
    /// upgrade and a heartbeat to a client not subscribed: nsqd flushes twice there).
    #[test]
    fn flushes_end_as_nsqd_s() {
        let mut enc = DeflateEncoder::new(6, &[]).unwrap();
        let mut out = Vec::new();
        enc.encode(b"\x00\x00\x00\x06\x00\x00\x00\x00OK", &mut out)
            .unwrap();
        enc.flush_again(&mut out);
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(hex(&out), "6260606063606060f0f706000000ffff000000ffff");
        out.clear();
        enc.encode(b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_", &mut out)
            .unwrap();
        enc.flush_again(&mut out);
        assert_eq!(
            hex(&out),
            "626060e007b1e23352138b4a9252134be201000000ffff000000ffff"
        );
    }

    #[test]
    fn interoperates_with_reference_raw_deflate_and_survives_a_handoff() {
        let text: Vec<u8> = (0..100_000u32)
            .flat_map(|i| format!("line {} of text\n", i % 977).into_bytes())
            .collect();
        // Our encoder -> reference raw inflater, across a hand-off to a primed encoder.
        let mut e = DeflateEncoder::new(6, &[]).unwrap();
        let mut stream = Vec::new();
        let mut hist = Vec::new();
        e.encode(&text[..60_000], &mut stream).unwrap();
        remember_output(&mut hist, &text[..60_000]);
        let mut e2 = DeflateEncoder::new(6, &hist).unwrap();
        e2.encode(&text[60_000..], &mut stream).unwrap();
        // A live stream has no final block: inflate it with sync flushes.
        let mut inf = Decompress::new(false);
        let mut back = Vec::with_capacity(text.len() + 1024);
        inf.decompress_vec(&stream, &mut back, FlushDecompress::Sync)
            .unwrap();
        assert_eq!(back, text);
        // Reference encoder with sync flushes -> our decoder, moved mid-stream.
        let mut w = flate2::write::DeflateEncoder::new(Vec::new(), Compression::new(6));
        w.write_all(&text[..70_000]).unwrap();
        w.flush().unwrap();
        let cut = w.get_ref().len();
        w.write_all(&text[70_000..]).unwrap();
        w.flush().unwrap();
        let bytes = w.finish().unwrap();
        let mut d = DeflateDecoder::new(Vec::new()).unwrap();
        let mut out = Vec::new();
        for piece in bytes[..cut].chunks(1000) {
            d.feed(piece, &mut out).unwrap();
        }
        assert_eq!(out, &text[..70_000]);
        let mut d2 = DeflateDecoder::new(d.history().to_vec()).unwrap();
        let mut out2 = Vec::new();
        d2.feed(&bytes[cut..], &mut out2).unwrap_or(());
        assert_eq!(&out2[..text.len() - 70_000], &text[70_000..]);
    }
}

#[cfg(test)]
mod end_tests {
    use super::*;

    /// What a feed decoded before the stream's end or a corrupt block is in `out` when
    /// it reports the end or the error (the reader runs those commands first, as Go's
    /// flate reader hands over its data before io.EOF or the error).
    #[test]
    fn output_before_the_end_or_an_error_is_kept() {
        for garbage in [false, true] {
            let mut c = Compress::new(Compression::new(6), false);
            let mut data = Vec::with_capacity(4096);
            let flush = if garbage {
                FlushCompress::Sync
            } else {
                FlushCompress::Finish
            };
            c.compress_vec(b"PUB t\n\0\0\0\x02hi", &mut data, flush)
                .unwrap();
            if garbage {
                data.extend_from_slice(&[0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa]);
            }
            let mut d = DeflateDecoder::new(Vec::new()).unwrap();
            let mut out = Vec::new();
            assert!(d.feed(&data, &mut out).is_err(), "garbage={garbage}");
            assert_eq!(out, b"PUB t\n\0\0\0\x02hi", "garbage={garbage}");
        }
    }
}
