//! A producer: one connection, a writer thread (this one) sending MPUB/PUB/DPUB batches
//! and a reader thread matching the `OK`s to them in order, with up to --pipeline writes
//! outstanding.

use crate::tls::Stream;
use crate::{now_unix_ns, write_header, Shared, HEADER};
use hdrhistogram::Histogram;
use nsq_wire::client::{self, Decoded, Frame, MpubEncoder};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Counters the main thread reads while the producer runs.
pub struct ProducerStats {
    /// Messages whose PUB/MPUB/DPUB was answered OK.
    pub acked: AtomicU64,
    /// Per topic: acked messages. Sequence numbers are per (producer, topic) and acks come
    /// in order, so this is also the first unacknowledged sequence number.
    pub acked_per_topic: Vec<AtomicU64>,
    /// Messages written (acked or not).
    pub written: AtomicU64,
}

impl ProducerStats {
    pub fn new(topics: usize) -> ProducerStats {
        ProducerStats {
            acked: AtomicU64::new(0),
            acked_per_topic: (0..topics).map(|_| AtomicU64::new(0)).collect(),
            written: AtomicU64::new(0),
        }
    }
}

/// One write: `cmds` commands of `msgs_per_cmd` messages each, for one topic.
struct Entry {
    sent: Instant,
    topic: usize,
    msgs_per_cmd: u64,
    cmds_left: u32,
}

#[derive(Default)]
struct WindowState {
    entries: VecDeque<Entry>,
    /// The reader has exited.
    closed: bool,
}

struct Window {
    state: Mutex<WindowState>,
    cv: Condvar,
    need_nop: AtomicBool,
    stopping: AtomicBool,
}

/// Runs one producer until `end`, then waits for the outstanding OKs. Returns the
/// histogram of acknowledgement latencies (µs, per command).
pub fn run(
    shared: Arc<Shared>,
    id: u32,
    addr: String,
    t0: Instant,
    end: Instant,
    stats: Arc<ProducerStats>,
) -> Histogram<u64> {
    let hist = crate::new_hist();
    let identify = format!(r#"{{"client_id":"producer-{id}","user_agent":"nsq-bench""#);
    let stream = match crate::connect_stream(&shared, &addr, &identify) {
        Ok(s) => s,
        Err(e) => {
            shared.error(format!("producer {id}: connect {addr}: {e}"));
            return hist;
        }
    };
    let reader_stream = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            shared.error(format!("producer {id}: {e}"));
            return hist;
        }
    };
    let window = Arc::new(Window {
        state: Mutex::new(WindowState::default()),
        cv: Condvar::new(),
        need_nop: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
    });
    let reader = {
        let (shared, window, stats) = (shared.clone(), window.clone(), stats.clone());
        std::thread::Builder::new()
            .name(format!("prod-rd-{id}"))
            .spawn(move || read_acks(shared, id, reader_stream, window, stats))
            .expect("spawn producer reader")
    };
    write_loop(
        &shared,
        id,
        stream.try_clone().ok(),
        t0,
        end,
        &window,
        &stats,
    );
    // Wait for the outstanding OKs (bounded), then close.
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut st = window
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while !st.entries.is_empty() && !st.closed {
            let now = Instant::now();
            if now >= deadline {
                shared.error(format!(
                    "producer {id}: {} publish command(s) not answered after 30s",
                    st.entries
                        .iter()
                        .map(|e| e.cmds_left as usize)
                        .sum::<usize>()
                ));
                break;
            }
            st = window
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
    window.stopping.store(true, Ordering::SeqCst);
    let _ = stream.shutdown(Shutdown::Both);
    reader.join().unwrap_or(hist)
}

fn write_loop(
    shared: &Shared,
    id: u32,
    stream: Option<Stream>,
    t0: Instant,
    end: Instant,
    window: &Window,
    stats: &ProducerStats,
) {
    let Some(mut stream) = stream else { return };
    let a = &shared.args;
    let topics = &shared.topics;
    let mut seq = vec![0u64; topics.len()];
    let filler: Vec<u8> = (0..a.size).map(|i| b'a' + (i % 26) as u8).collect();
    let pacing = a.pacing().map(|s| s.scaled(1.0 / a.producers as f64));
    let mut buf = Vec::with_capacity(a.batch_size * (a.size + 4) + 256);
    if !stream.is_tls() {
        // (With TLS the magic went out before the upgrade.)
        client::encode_magic(&mut buf);
    }
    if let Err(e) = stream.write_all(&buf) {
        shared.error(format!("producer {id}: write: {e}"));
        return;
    }
    let mut written: u64 = 0;
    let mut next_topic = id as usize % topics.len();
    // nsqd's default --max-body-size (5 MiB) bounds an MPUB body.
    let batch = (a.batch_size as u64)
        .min(((5 << 20) - 4) / (a.size as u64 + 4))
        .max(1);
    loop {
        let now = Instant::now();
        if now >= end || shared.abort.load(Ordering::Relaxed) {
            break;
        }
        let mut n = batch;
        if let Some(p) = &pacing {
            let due = p.due(now - t0) as u64;
            if due <= written {
                let next = t0 + p.time_of((written + 1) as f64);
                std::thread::sleep(next.min(end).saturating_duration_since(now));
                continue;
            }
            n = n.min(due - written);
        }
        // Wait for room in the pipeline.
        {
            let mut st = window
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while st.entries.len() >= a.pipeline() && !st.closed {
                st = window
                    .cv
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
                if Instant::now() >= end {
                    break;
                }
            }
            if st.closed {
                return;
            }
            if st.entries.len() >= a.pipeline() {
                break;
            }
        }
        let t = next_topic;
        next_topic = (next_topic + 1) % topics.len();
        buf.clear();
        if window.need_nop.swap(false, Ordering::Relaxed) {
            client::encode_nop(&mut buf);
        }
        let ts = now_unix_ns();
        let (cmds, msgs_per_cmd) = if a.deferred_ms > 0 || a.batch_size == 1 {
            for _ in 0..n {
                let start = buf.len();
                if a.deferred_ms > 0 {
                    client::encode_dpub(&mut buf, &topics[t], a.deferred_ms, &filler);
                } else {
                    client::encode_pub(&mut buf, &topics[t], &filler);
                }
                let body = buf.len() - a.size;
                debug_assert!(body > start);
                write_header(&mut buf[body..body + HEADER], ts, seq[t], id, shared.run_id);
                seq[t] += 1;
            }
            (n as u32, 1)
        } else {
            let mut m = MpubEncoder::begin(&mut buf, &topics[t]);
            for _ in 0..n {
                m.push_with(&mut buf, a.size, |b| {
                    b[HEADER..].copy_from_slice(&filler[HEADER..]);
                    write_header(&mut b[..HEADER], ts, seq[t], id, shared.run_id);
                });
                seq[t] += 1;
            }
            m.finish(&mut buf);
            (1, n)
        };
        window
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entries
            .push_back(Entry {
                sent: Instant::now(),
                topic: t,
                msgs_per_cmd,
                cmds_left: cmds,
            });
        if let Err(e) = stream.write_all(&buf) {
            if !window
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .closed
            {
                shared.error(format!("producer {id}: write: {e}"));
            }
            return;
        }
        written += n;
        stats.written.fetch_add(n, Ordering::Relaxed);
    }
}

fn read_acks(
    shared: Arc<Shared>,
    id: u32,
    mut stream: Stream,
    window: Arc<Window>,
    stats: Arc<ProducerStats>,
) -> Histogram<u64> {
    let mut hist = crate::new_hist();
    let mut buf = vec![0u8; 64 * 1024];
    let (mut start, mut end) = (0usize, 0usize);
    let close = |window: &Window| {
        window
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .closed = true;
        window.cv.notify_all();
    };
    loop {
        match stream.read(&mut buf[end..]) {
            Ok(0) => {
                if !window.stopping.load(Ordering::SeqCst) {
                    shared.error(format!("producer {id}: connection closed by the server"));
                }
                break;
            }
            Ok(n) => end += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if !window.stopping.load(Ordering::SeqCst) {
                    shared.error(format!("producer {id}: read: {e}"));
                }
                break;
            }
        }
        let now = Instant::now();
        loop {
            match client::decode_frame(&buf[start..end]) {
                Ok(Decoded::Incomplete { need }) => {
                    if need > buf.len() - start {
                        buf.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                        if need > buf.len() {
                            buf.resize(need, 0);
                        }
                    }
                    break;
                }
                Ok(Decoded::Frame(frame, used)) => {
                    start += used;
                    match frame {
                        Frame::Response(b"OK") => {
                            let mut st = window
                                .state
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            let Some(e) = st.entries.front_mut() else {
                                drop(st);
                                shared.error(format!("producer {id}: unexpected OK"));
                                close(&window);
                                return hist;
                            };
                            let us = (now - e.sent).as_micros() as u64;
                            hist.saturating_record(us);
                            stats.acked.fetch_add(e.msgs_per_cmd, Ordering::Relaxed);
                            stats.acked_per_topic[e.topic]
                                .fetch_add(e.msgs_per_cmd, Ordering::Relaxed);
                            e.cmds_left -= 1;
                            if e.cmds_left == 0 {
                                st.entries.pop_front();
                                window.cv.notify_all();
                            }
                        }
                        f if f.is_heartbeat() => window.need_nop.store(true, Ordering::Relaxed),
                        Frame::Response(other) => {
                            shared.error(format!(
                                "producer {id}: unexpected response {:?}",
                                String::from_utf8_lossy(other)
                            ));
                        }
                        Frame::Error(e) => {
                            shared.error(format!(
                                "producer {id}: error frame {:?}",
                                String::from_utf8_lossy(e)
                            ));
                            close(&window);
                            return hist;
                        }
                        Frame::Message(_) => {
                            shared.error(format!("producer {id}: unexpected message frame"));
                        }
                    }
                }
                Err(e) => {
                    shared.error(format!("producer {id}: {e}"));
                    close(&window);
                    return hist;
                }
            }
        }
        if start == end {
            start = 0;
            end = 0;
        }
    }
    close(&window);
    hist
}
