//! One benchmark run, whatever the mode: set up the shared state, start consumers (so a
//! pubsub run's channels exist before anything is published) and producers, print a
//! progress line every second, sample the counters at the edges of the measured window
//! (after --warmup, for --runfor), then drain (pubsub), join and report.

use crate::args::{indexed_name, Args, Mode};
use crate::publish::Producers;
use crate::pubsub::{self, Burst};
use crate::report::{self, ChannelResult};
use crate::subscribe::{self, Consumers};
use crate::{now_unix_ns, tls, Shared};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs the benchmark; the process exit code.
pub fn run(args: Args) -> i32 {
    let shared = match setup(args) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mode = shared.args.mode;
    let a = &shared.args;

    let mut consumers = Consumers::default();
    if mode.consumes() {
        consumers = Consumers::start(&shared);
        if !consumers.wait_subscribed() {
            shared.error("not every consumer subscribed within 10s".into());
            if mode == Mode::Pubsub {
                consumers.abandon(&shared);
                let r = report::Results::failed(&shared);
                r.print(a.json);
                return 1;
            }
        }
    }

    let t0 = Instant::now();
    let measure_start = t0 + a.warmup;
    let end = measure_start + a.runfor;
    shared
        .measure_from_ns
        .store(now_unix_ns() + a.warmup.as_nanos() as u64, Ordering::SeqCst);
    let mut producers = if mode.publishes() {
        Producers::start(&shared, t0, end)
    } else {
        Producers::none()
    };
    let mut burst = Burst::new(&shared, t0);

    let w = window(&shared, &producers, &consumers, &mut burst, t0);
    let ack_hist = producers.join();

    let sent_per_topic = producers.sent_per_topic(shared.topics.len());
    if mode == Mode::Pubsub {
        pubsub::drain(&shared, &producers, &consumers, &sent_per_topic, &mut burst);
    }
    shared.stop_consumers.store(true, Ordering::SeqCst);
    let hist = consumers.merged_hist();
    let drain = burst.as_ref().map(|b| {
        let after = consumers.merged_hist_after();
        let ms = b
            .drained_at
            .map(|t| t.saturating_duration_since(b.from).as_secs_f64() * 1e3);
        (ms, after)
    });
    let (mut seen_by, raw_by, foreign) = consumers.join(&shared);
    let mut per_channel: Vec<ChannelResult> = Vec::new();
    if mode.consumes() {
        for (t, &sent) in sent_per_topic.iter().enumerate() {
            for c in 0..shared.channels.len() {
                let idx = t * shared.channels.len() + c;
                let seen = seen_by[idx].take().unwrap_or_default();
                let cr = ChannelResult {
                    topic: shared.topics[t].clone(),
                    channel: shared.channels[c].clone(),
                    sent,
                    received: raw_by[idx],
                    unique: 0,
                    lost: 0,
                    duplicates: 0,
                };
                per_channel.push(if mode == Mode::Pubsub {
                    pubsub::pubsub_channel_result(&producers, t, &seen, cr)
                } else {
                    subscribe::sub_channel_result(&shared, cr)
                });
            }
        }
    }

    let secs = w.measured.as_secs_f64().max(1e-9);
    let r = report::Results {
        mode,
        args: a.clone(),
        measured_s: secs,
        pub_msgs: w.end.0 - w.start.0,
        sub_msgs: w.end.1 - w.start.1,
        sent: producers.acked(),
        written: producers.written(),
        received: per_channel.iter().map(|c| c.received).sum(),
        foreign,
        errors: shared.error_count.load(Ordering::SeqCst),
        error_messages: shared
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
        latency: hist,
        ack_latency: ack_hist,
        channels: per_channel,
        topics: shared.topics.clone(),
        drain,
    };
    r.print(a.json);
    r.exit_code()
}

/// Topic and channel names, the TLS configuration and the shared state; Err(exit code)
/// when --tls-ca cannot be loaded.
fn setup(args: Args) -> Result<Arc<Shared>, i32> {
    let mode = args.mode;
    let run_id = ((now_unix_ns() / 1000) as u32 ^ (std::process::id() << 12)) | 1;
    let base_topic = args.topic.clone().unwrap_or_else(|| match mode {
        Mode::Pubsub => format!("nsq_bench_{run_id:08x}"),
        _ => "nsq_bench".to_string(),
    });
    let topics: Vec<String> = (0..args.topics)
        .map(|i| indexed_name(&base_topic, i, args.topics))
        .collect();
    let channels: Vec<String> = (0..args.channels)
        .map(|i| indexed_name(&args.channel, i, args.channels))
        .collect();
    let tls = match &args.tls_ca {
        None => None,
        Some(p) => match tls::client_config(p) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("nsq-bench: --tls-ca: {e}");
                return Err(2);
            }
        },
    };
    Ok(Arc::new(Shared {
        args,
        run_id,
        topics,
        channels,
        check_seq: mode == Mode::Pubsub,
        stop_consumers: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        measure_from_ns: AtomicU64::new(0),
        drained_ns: AtomicU64::new(0),
        error_count: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
        tls,
    }))
}

/// The measured window: its length and (acked, received) at its start and end.
struct Window {
    measured: Duration,
    start: (u64, u64),
    end: (u64, u64),
}

/// The run loop: a progress line every second, counters sampled at the window's edges. A
/// `sub` run also ends early (see [`subscribe::sub_done`]); its window then ends there.
fn window(
    shared: &Shared,
    producers: &Producers,
    consumers: &Consumers,
    burst: &mut Option<Burst>,
    t0: Instant,
) -> Window {
    let a = &shared.args;
    let mode = a.mode;
    let measure_start = t0 + a.warmup;
    let end = measure_start + a.runfor;
    let mut window_start = (0u64, 0u64);
    let mut measured_started = a.warmup.is_zero();
    let mut next_tick = t0 + Duration::from_secs(1);
    let mut last = (t0, 0u64, 0u64);
    let mut last_rx = (t0, 0u64);
    let mut window_end_at = end;
    loop {
        let mut next = next_tick.min(end);
        if !measured_started {
            next = next.min(measure_start);
        }
        let now = Instant::now();
        if mode == Mode::Sub {
            next = next.min(now + Duration::from_millis(20));
        }
        if burst.is_some() && shared.drained_ns.load(Ordering::Relaxed) == 0 {
            next = next.min(now + Duration::from_millis(20));
        }
        if next > now {
            std::thread::sleep(next - now);
        }
        let now = Instant::now();
        if let Some(b) = burst.as_mut() {
            b.check(shared, producers, consumers, now);
        }
        if !measured_started && now >= measure_start {
            window_start = (producers.acked(), consumers.received());
            measured_started = true;
        }
        if now >= end {
            break;
        }
        if now >= next_tick {
            next_tick += Duration::from_secs(1);
            let (pa, sr) = (producers.acked(), consumers.received());
            if !a.quiet {
                progress_line(shared, consumers, now, t0, last, (pa, sr));
            }
            last = (now, pa, sr);
        }
        if mode == Mode::Sub {
            if let Some(at) = subscribe::sub_done(shared, consumers, now, &mut last_rx) {
                window_end_at = at;
                break;
            }
        }
    }
    let measured = window_end_at
        .min(Instant::now())
        .saturating_duration_since(measure_start)
        .min(a.runfor);
    Window {
        measured,
        start: window_start,
        end: (producers.acked(), consumers.received()),
    }
}

/// `[  3.0s] pub    123,456/s sub    123,400/s  p99   1.2ms  errors 0` on stderr.
fn progress_line(
    shared: &Shared,
    consumers: &Consumers,
    now: Instant,
    t0: Instant,
    last: (Instant, u64, u64),
    (pa, sr): (u64, u64),
) {
    let a = &shared.args;
    let dt = (now - last.0).as_secs_f64();
    let mut line = format!("[{:>5.1}s]", (now - t0).as_secs_f64());
    if a.mode.publishes() {
        line += &format!(
            " pub {:>10}/s",
            report::fmt_count(((pa - last.1) as f64 / dt) as u64)
        );
    }
    if a.mode.consumes() {
        line += &format!(
            " sub {:>10}/s  p99 {:>8}",
            report::fmt_count(((sr - last.2) as f64 / dt) as u64),
            report::fmt_us(consumers.merged_hist().value_at_quantile(0.99))
        );
    }
    line += &format!("  errors {}", shared.error_count.load(Ordering::Relaxed));
    if now < t0 + a.warmup {
        line += " (warmup)";
    }
    eprintln!("{line}");
}
