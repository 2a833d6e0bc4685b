use clap::Parser;
use nsqd::config::{normalize_args, Cli, Config};

fn main() {
    let cli = Cli::parse_from(normalize_args(std::env::args()));
    let prefix = cli.log_prefix.clone();
    let cfg = match Config::from_cli(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{prefix}FATAL: {e}");
            std::process::exit(1);
        }
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
