//! Where a Go server's `bufio.Reader` stands on a connection: how many bytes past the
//! next unconsumed one it has already taken from the socket. nsqd (16 KiB,
//! defaultBufferSize) and nsqlookupd (4 KiB, bufio's default) close a connection after a
//! fatal error with whatever the client sent beyond that unread, and the kernel then
//! resets the connection instead of closing it; this model tells a server which close
//! a Go one would have made. It assumes the client's bytes had all arrived when each read
//! was made (as they have when a client pipelines its writes).

/// A Go `bufio.Reader` of `size` bytes over a socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoBufReader {
    size: usize,
    ahead: usize,
}

impl GoBufReader {
    /// An empty reader of `size` bytes (`size` > 0), as just created.
    pub fn new(size: usize) -> GoBufReader {
        GoBufReader::with_ahead(size, 0)
    }

    /// A reader of `size` bytes holding `ahead` bytes past the next unconsumed one.
    pub fn with_ahead(size: usize, ahead: usize) -> GoBufReader {
        GoBufReader {
            size: size.max(1),
            ahead,
        }
    }

    /// Bytes held past the next unconsumed one.
    pub fn ahead(&self) -> usize {
        self.ahead
    }

    /// A line of `n` bytes read with ReadSlice or ReadString: a refill keeps the line's
    /// start and reads up to `size` bytes from it; a line longer than the buffer is
    /// collected a full buffer at a time.
    pub fn read_line(&mut self, n: usize) {
        self.ahead = self.after_line(n) - n;
    }

    /// Where the buffer would end, counted from the next unconsumed byte, once a line
    /// of `n` bytes was read (without consuming it: the line a command failed on).
    pub fn after_line(&self, n: usize) -> usize {
        if n <= self.ahead {
            self.ahead
        } else {
            n.div_ceil(self.size).max(1) * self.size
        }
    }

    /// `n` bytes read with io.ReadFull: bufio hands over what it holds, then reads the
    /// rest straight from the socket when it is at least a buffer's worth, else refills.
    pub fn read_full(&mut self, n: usize) {
        if n <= self.ahead {
            self.ahead -= n;
            return;
        }
        let rest = n - self.ahead;
        // A refill when less than a buffer's worth is wanted; else straight through.
        self.ahead = self.size.saturating_sub(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_bufio() {
        // nsqd: 150 PUBs of 100 bytes (a 6-byte line, then size and body) in one write.
        let mut r = GoBufReader::new(16_384);
        for _ in 0..150 {
            r.read_line(6);
            r.read_full(4);
            r.read_full(90);
        }
        assert_eq!(r.ahead(), 16_384 - 15_000);
        // A line that runs past the buffer refills from its start.
        r.read_line(2_000);
        assert_eq!(r.ahead(), 16_384 - 2_000);
        // What a body wants past the buffer: a refill when less than a buffer's worth,
        // straight from the socket when more.
        r.read_full(20_000);
        assert_eq!(r.ahead(), 16_384 - (20_000 - 14_384));
        r.read_full(40_000);
        assert_eq!(r.ahead(), 0);
        // A shorter one refills.
        let mut r = GoBufReader::with_ahead(4_096, 100);
        r.read_full(1_100);
        assert_eq!(r.ahead(), 4_096 - 1_000);
        // Long lines are collected a buffer at a time.
        assert_eq!(GoBufReader::new(4_096).after_line(5_000), 8_192);
        assert_eq!(GoBufReader::with_ahead(4_096, 300).after_line(200), 300);
    }
}
