use nsqd::config::{Cli, Config};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// nsqd's `logFatal` line (`[nsqd] <date time.µs> FATAL: <msg>`; the prefix is nsqd's
/// constant, not --log-prefix).
fn fatal(msg: &str) -> ! {
    let stamp = nsqd::timefmt::log_stamp(nsq_shards::message::now_unix_nanos());
    eprintln!("[nsqd] {stamp} FATAL: {msg}");
    std::process::exit(1);
}

fn main() {
    let cli = match Cli::load(std::env::args()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}", e.line());
            std::process::exit(1);
        }
    };
    let prefix = cli.log_prefix.clone();
    let cfg = match Config::from_cli(cli) {
        Ok(c) => c,
        Err(e) => fatal(&format!("failed to instantiate nsqd - {e}")),
    };
    nsqd::logger::init(&cfg.flags.log_prefix, cfg.log_level);
    nsqd::memory::fix_malloc_thresholds();
    // A write past the file size limit (RLIMIT_FSIZE, `ulimit -f`) fails with EFBIG,
    // which the store reports and survives, instead of the signal killing the process
    // (nsqd's Go runtime ignores SIGXFSZ too: its publishes fail with "file too large").
    // SAFETY: setting a signal's disposition to SIG_IGN, before any thread starts.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    // Descriptors: the soft limit up to the hard one (Go programs, nsqd included, do so).
    if let Some((old, new)) = nsqd::preflight::raise_nofile_limit() {
        let new = if new == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            new.to_string()
        };
        log::info!("open files limit (RLIMIT_NOFILE) raised: {old} -> {new}");
    }
    // Disk-fault injection for tests (nsq_storage::faults): compiled in only with the
    // `fault-injection` feature, and then off unless the variable is set.
    #[cfg(feature = "fault-injection")]
    match nsq_storage::faults::init_from_env() {
        Ok(true) => log::warn!(
            "{}={:?}: injecting storage faults",
            nsq_storage::faults::ENV,
            std::env::var(nsq_storage::faults::ENV).unwrap_or_default()
        ),
        Ok(false) => {}
        Err(e) => fatal(&format!("failed to instantiate nsqd - {e}")),
    }
    // A member cut off from its peers while it runs, for tests (nsqd::cluster::cut):
    // compiled in only with the same feature.
    nsqd::cluster::cut::init_from_env();
    let serving = fatal_panics_until_serving(prefix.clone());
    // What the host must provide (io_uring, locked memory, the data path, the ports),
    // checked before any shard starts: one line per problem, each with its fix.
    let ready = match nsqd::preflight::check(&cfg) {
        Ok(r) if cfg.flags.preflight => {
            for w in &r.warnings {
                log::warn!("{w}");
            }
            eprintln!(
                "{prefix}preflight: ok ({} shards, data path {}, TCP {}, HTTP {})",
                cfg.shards,
                r.data_path.display(),
                r.tcp.0,
                r.http.0
            );
            // Checked, not started: what the checks created goes (the lock first).
            let created = r.created.clone();
            drop(r);
            nsqd::preflight::undo_created(&created);
            std::process::exit(0);
        }
        Ok(r) => r,
        Err(failed) => {
            for w in failed.warnings {
                log::warn!("{w}");
            }
            // nsqd's start-up failure line, one per problem, each with its fix.
            let stamp = nsqd::timefmt::log_stamp(nsq_shards::message::now_unix_nanos());
            for p in failed.problems {
                eprintln!("[nsqd] {stamp} FATAL: failed to instantiate nsqd - {p}");
            }
            // Nothing starts: a data path this run created goes again.
            nsqd::preflight::undo_created(&failed.created);
            std::process::exit(1);
        }
    };
    // Once every shard serves, panics are reported as usual.
    let on_serving = move || serving.store(true, Ordering::SeqCst);
    match nsqd::runtime::run(cfg, ready, on_serving) {
        Ok(()) => std::process::exit(0),
        Err(e) => fatal(&format!("failed to instantiate nsqd - {e}")),
    }
}

/// Until every shard serves, a panic (one inside glommio on a host the preflight did not
/// foresee) ends the process with one FATAL line instead of a backtrace and a hang; once
/// serving, a panic is reported as usual and then ends the process with status 1 (not
/// going on without the shard and exiting 0 later, which `Restart=on-failure` would not
/// restart). Returns the flag to set once every shard serves.
fn fatal_panics_until_serving(prefix: String) -> Arc<AtomicBool> {
    let serving = Arc::new(AtomicBool::new(false));
    let flag = serving.clone();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if flag.load(Ordering::SeqCst) {
            // glommio's blocking-pool thread whose executor has already stopped, at
            // shutdown: its answer has nobody to go to. Nothing is lost; not a fault.
            if nsqd::runtime::shutting_down()
                && std::thread::current().name().is_none()
                && msg == "failed to send response"
            {
                return;
            }
            // A shard that panicked is gone with its clients and topics: the process
            // ends with a failure status, so that a supervisor restarts it on its
            // crash-safe data, instead of serving on without that shard (and exiting 0).
            default(info);
            let stamp = nsqd::timefmt::log_stamp(nsq_shards::message::now_unix_nanos());
            eprintln!("[nsqd] {stamp} FATAL: panic{at}: {msg}; exiting");
            std::process::exit(1);
        }
        eprintln!("{prefix}FATAL: start-up failed: {msg}{at}");
        std::process::exit(1);
    }));
    serving
}
