//! End-to-end processing latency percentiles (`--e2e-processing-latency-percentile`),
//! as nsqd computes them: a port of bmizerany/perks' targeted quantile stream (the CKMS
//! algorithm, "Effective Computation of Biased Quantiles over Data Streams", epsilon
//! 0.01) and of nsqd's `internal/quantile.Quantile`, which keeps two streams and drops
//! the older one every half `--e2e-processing-latency-window-time`.
//!
//! A channel inserts `now - message timestamp` (ns) on every FIN (nsqd: channel.go
//! FinishMessage); a topic's percentiles merge its channels' streams (nsqd: topic.go
//! AggregateChannelE2eProcessingLatency). Time is passed in (Unix ns), never read here.

/// One sample of a stream (perks: quantile.Sample).
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    value: f64,
    width: f64,
    delta: f64,
}

/// perks' `quantile.Stream` built by `NewTargeted(quantiles...)`.
#[derive(Clone, Debug)]
pub struct Stream {
    quantiles: Vec<f64>,
    epsilon: f64,
    n: f64,
    l: Vec<Sample>,
    b: Vec<Sample>,
    sorted: bool,
}

/// perks' insert buffer size: the stream is merged and compressed every 500 inserts.
const BUFFER: usize = 500;

impl Stream {
    pub fn targeted(quantiles: &[f64]) -> Stream {
        Stream {
            quantiles: quantiles.to_vec(),
            epsilon: 0.01,
            n: 0.0,
            l: Vec::new(),
            b: Vec::with_capacity(BUFFER),
            sorted: true,
        }
    }

    /// The targeted invariant ƒ(r) (perks: NewTargeted).
    fn f(&self, r: f64) -> f64 {
        let mut m = f64::MAX;
        for &q in &self.quantiles {
            let f = if q * self.n <= r {
                (2.0 * self.epsilon * r) / q
            } else {
                (2.0 * self.epsilon * (self.n - r)) / (1.0 - q)
            };
            if f < m {
                m = f;
            }
        }
        m
    }

    pub fn insert(&mut self, v: f64) {
        self.b.push(Sample {
            value: v,
            width: 1.0,
            delta: 0.0,
        });
        self.sorted = false;
        if self.b.len() == BUFFER {
            self.flush();
            self.compress();
        }
    }

    fn flushed(&self) -> bool {
        !self.l.is_empty()
    }

    fn maybe_sort(&mut self) {
        if !self.sorted {
            self.sorted = true;
            sort_samples(&mut self.b);
        }
    }

    fn flush(&mut self) {
        self.maybe_sort();
        let b = std::mem::take(&mut self.b);
        self.merge_sorted(&b);
        self.b = b;
        self.b.clear();
    }

    /// perks: Stream.Merge (sorts, then merges into the compressed list).
    pub fn merge(&mut self, mut samples: Vec<Sample>) {
        sort_samples(&mut samples);
        self.merge_sorted(&samples);
    }

    fn merge_sorted(&mut self, samples: &[Sample]) {
        let mut r = 0.0;
        let mut i = 0;
        for sample in samples {
            let mut inserted = false;
            while i < self.l.len() {
                let c = self.l[i];
                if c.value > sample.value {
                    let delta = self.f(r).floor() - 1.0;
                    self.l.insert(
                        i,
                        Sample {
                            value: sample.value,
                            width: sample.width,
                            delta,
                        },
                    );
                    i += 1;
                    inserted = true;
                    break;
                }
                r += c.width;
                i += 1;
            }
            if !inserted {
                self.l.push(Sample {
                    value: sample.value,
                    width: sample.width,
                    delta: 0.0,
                });
                i += 1;
            }
            self.n += sample.width;
        }
    }

    fn compress(&mut self) {
        if self.l.len() < 2 {
            return;
        }
        let mut xi = self.l.len() - 1;
        let mut x = self.l[xi];
        let mut r = self.n - 1.0 - x.width;
        let mut i = self.l.len() - 1;
        while i > 0 {
            i -= 1;
            let c = self.l[i];
            if c.width + x.width + x.delta <= self.f(r) {
                x.width += c.width;
                self.l[xi] = x;
                self.l.remove(i);
                xi -= 1;
            } else {
                x = c;
                xi = i;
            }
            r -= c.width;
        }
    }

    /// The samples to merge elsewhere (perks: Stream.Samples), without changing `self`.
    pub fn samples(&self) -> Vec<Sample> {
        if !self.flushed() {
            return self.b.clone();
        }
        let mut s = self.clone();
        s.flush();
        s.compress();
        s.l
    }

    /// Samples observed (perks: Stream.Count).
    pub fn count(&self) -> u64 {
        self.b.len() as u64 + self.n as u64
    }

    /// The `q` quantile (perks: Stream.Query); 0 when empty.
    pub fn query(&mut self, q: f64) -> f64 {
        if !self.flushed() {
            let l = self.b.len();
            if l == 0 {
                return 0.0;
            }
            let i = ((l as f64 * q) as usize).saturating_sub(1);
            self.maybe_sort();
            return self.b[i.min(l - 1)].value;
        }
        self.flush();
        let mut t = (q * self.n).ceil();
        t += (self.f(t) / 2.0).ceil();
        let mut p = self.l[0];
        let mut r = 0.0;
        for c in &self.l[1..] {
            if r + c.width + c.delta > t {
                return p.value;
            }
            r += p.width;
            p = *c;
        }
        p.value
    }

    fn reset(&mut self) {
        self.l.clear();
        self.n = 0.0;
        self.b.clear();
    }
}

fn sort_samples(s: &mut [Sample]) {
    s.sort_by(|a, b| a.value.total_cmp(&b.value));
}

/// nsqd's `quantile.Quantile`: two streams, the current one replaced every half window.
#[derive(Clone, Debug)]
pub struct Quantile {
    streams: [Stream; 2],
    current: usize,
    /// Unix ns of the last window move.
    last_move: i64,
    /// Half the window, ns.
    move_window: i64,
    percentiles: Vec<f64>,
}

impl Quantile {
    /// `window`: --e2e-processing-latency-window-time; `percentiles` as configured;
    /// `now`: Unix ns.
    pub fn new(window: std::time::Duration, percentiles: &[f64], now: i64) -> Quantile {
        Quantile {
            streams: [Stream::targeted(percentiles), Stream::targeted(percentiles)],
            current: 0,
            last_move: now,
            move_window: (window.as_nanos() / 2).min(i64::MAX as u128) as i64,
            percentiles: percentiles.to_vec(),
        }
    }

    fn is_stale(&self, now: i64) -> bool {
        self.move_window > 0 && now > self.last_move.saturating_add(self.move_window)
    }

    fn catch_up(&mut self, now: i64) {
        // At most two moves matter (both streams cleared); skip the rest at once.
        let mut moves = 0;
        while self.is_stale(now) {
            if moves >= 2 {
                let behind = (now - self.last_move) / self.move_window;
                self.last_move += behind * self.move_window;
                continue;
            }
            self.current ^= 1;
            self.streams[self.current].reset();
            self.last_move += self.move_window;
            moves += 1;
        }
    }

    /// Records a finished message published at `timestamp` (Unix ns).
    pub fn insert(&mut self, now: i64, timestamp: i64) {
        self.catch_up(now);
        self.streams[self.current].insert((now - timestamp) as f64);
    }

    /// nsqd's Quantile.Merge: our current stream takes theirs, the other the other.
    pub fn merge(&mut self, them: &Quantile) {
        let us = self.current;
        let th = them.current;
        self.streams[us].merge(them.streams[th].samples());
        self.streams[us ^ 1].merge(them.streams[th ^ 1].samples());
        if self.last_move < them.last_move {
            self.last_move = them.last_move;
        }
    }

    /// (count, [(quantile, value ns)]) over the window (nsqd: Quantile.Result).
    pub fn result(&mut self, now: i64) -> (u64, Vec<(f64, f64)>) {
        self.catch_up(now);
        let mut merged = Stream::targeted(&self.percentiles);
        merged.merge(self.streams[0].samples());
        merged.merge(self.streams[1].samples());
        let count = merged.count();
        let values = self
            .percentiles
            .iter()
            .map(|&p| (p, merged.query(p)))
            .collect();
        (count, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Expected values from perks (Go) given the same inserts and merges.
    #[test]
    fn same_answers_as_perks() {
        let mut s = Stream::targeted(&[0.99, 0.9, 0.5]);
        for i in 0..100_000u64 {
            s.insert(((i * 7919) % 100_000) as f64);
        }
        assert_eq!(s.count(), 100_000);
        assert_eq!(
            (s.query(0.99), s.query(0.9), s.query(0.5)),
            (99_999.0, 91_719.0, 51_021.0)
        );

        let mut m = Stream::targeted(&[0.99, 0.5]);
        let mut b = Stream::targeted(&[0.99, 0.5]);
        for i in 1..=100 {
            b.insert(i as f64);
        }
        m.merge(b.samples());
        assert_eq!((m.count(), m.query(0.99), m.query(0.5)), (100, 100.0, 52.0));

        let mut m2 = Stream::targeted(&[0.99, 0.9, 0.5]);
        m2.merge(s.samples());
        let mut c = Stream::targeted(&[0.99, 0.9, 0.5]);
        for i in 0..1234u64 {
            c.insert(((i * 31) % 1234 * 3) as f64);
        }
        m2.merge(c.samples());
        assert_eq!(
            (m2.count(), m2.query(0.99), m2.query(0.9), m2.query(0.5)),
            (101_234, 99_999.0, 91_719.0, 51_021.0)
        );
    }

    #[test]
    fn result_of_a_channel() {
        let mut q = Quantile::new(Duration::from_secs(600), &[0.99, 0.5], 0);
        for i in 1..=100 {
            q.insert(1_000, 1_000 - i);
        }
        assert_eq!(q.result(1_000), (100, vec![(0.99, 100.0), (0.5, 52.0)]));
    }

    #[test]
    fn the_window_forgets() {
        let mut q = Quantile::new(Duration::from_secs(10), &[1.0], 0);
        q.insert(1_000_000_000, 0);
        assert_eq!(q.result(2_000_000_000).0, 1);
        // One half-window later the sample is in the older stream, still counted.
        assert_eq!(q.result(6_000_000_000).0, 1);
        // Two half-windows later it is gone.
        assert_eq!(q.result(11_000_000_000).0, 0);
    }
}
