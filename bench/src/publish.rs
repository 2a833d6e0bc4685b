//! `pub` mode (and the publishing half of `pubsub`): one producer thread pair per
//! --producers, spread over the --nsqd-tcp-address list round robin.

use crate::producer::{self, ProducerStats};
use crate::{new_hist, Shared};
use hdrhistogram::Histogram;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// The running producers.
pub struct Producers {
    /// One per producer, in start order (the producer index is the position).
    pub stats: Vec<Arc<ProducerStats>>,
    handles: Vec<JoinHandle<Histogram<u64>>>,
}

impl Producers {
    /// No producers (a `sub` run).
    pub fn none() -> Producers {
        Producers {
            stats: Vec::new(),
            handles: Vec::new(),
        }
    }

    /// Starts --producers producers publishing from `t0` until `end`.
    pub fn start(shared: &Arc<Shared>, t0: Instant, end: Instant) -> Producers {
        let a = &shared.args;
        let mut p = Producers::none();
        for i in 0..a.producers {
            let stats = Arc::new(ProducerStats::new(shared.topics.len()));
            p.stats.push(stats.clone());
            let addr = a.nsqd_tcp_address[i % a.nsqd_tcp_address.len()].clone();
            let sh = shared.clone();
            p.handles.push(
                std::thread::Builder::new()
                    .name(format!("prod-{i}"))
                    .spawn(move || producer::run(sh, i as u32, addr, t0, end, stats))
                    .expect("spawn producer"),
            );
        }
        p
    }

    /// Messages acknowledged so far, all producers.
    pub fn acked(&self) -> u64 {
        self.stats
            .iter()
            .map(|s| s.acked.load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes written so far, all producers.
    pub fn written(&self) -> u64 {
        self.stats
            .iter()
            .map(|s| s.written.load(Ordering::SeqCst))
            .sum()
    }

    /// Messages acknowledged per topic (index as `Shared::topics`).
    pub fn sent_per_topic(&self, topics: usize) -> Vec<u64> {
        (0..topics)
            .map(|t| {
                self.stats
                    .iter()
                    .map(|s| s.acked_per_topic[t].load(Ordering::SeqCst))
                    .sum()
            })
            .collect()
    }

    /// Waits for every producer and merges their publish-to-ack histograms.
    pub fn join(&mut self) -> Histogram<u64> {
        let mut ack_hist = new_hist();
        for p in self.handles.drain(..) {
            if let Ok(h) = p.join() {
                let _ = ack_hist.add(&h);
            }
        }
        ack_hist
    }
}
