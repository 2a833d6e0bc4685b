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
    match nsqd::runtime::run(cfg) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            log::error!("{e}");
            eprintln!("{prefix}FATAL: {e}");
            std::process::exit(1);
        }
    }
}
