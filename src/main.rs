use nsqd::config::{Cli, Config};

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
    nsqd::logger::init(&cfg.log_prefix, cfg.log_level);
    fatal_panics_until_serving(prefix.clone());
    // What the host must provide (io_uring, locked memory, the data path, the ports),
    // checked before any shard starts: one line per problem, each with its fix.
    let ready = match nsqd::preflight::check(&cfg) {
        Ok(r) if cfg.preflight_only => {
            for w in r.warnings {
                log::warn!("{w}");
            }
            eprintln!(
                "{prefix}preflight: ok ({} shards, data path {}, TCP {}, HTTP {})",
                cfg.shards,
                r.data_path.display(),
                r.tcp.0,
                r.http.0
            );
            std::process::exit(0);
        }
        Ok(r) => r,
        Err(failed) => {
            for w in failed.warnings {
                log::warn!("{w}");
            }
            for p in failed.problems {
                eprintln!("{prefix}FATAL: {p}");
            }
            std::process::exit(1);
        }
    };
    match nsqd::runtime::run(cfg, ready) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            log::error!("{e}");
            eprintln!("{prefix}FATAL: {e}");
            std::process::exit(1);
        }
    }
}

/// Until every shard serves, a panic (one inside glommio on a host the preflight did not
/// foresee) ends the process with one FATAL line instead of a backtrace and a hang; once
/// serving, panics are reported as usual.
fn fatal_panics_until_serving(prefix: String) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if nsqd::runtime::SERVING.load(std::sync::atomic::Ordering::SeqCst) {
            default(info);
            return;
        }
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
        eprintln!("{prefix}FATAL: start-up failed: {msg}{at}");
        std::process::exit(1);
    }));
}
