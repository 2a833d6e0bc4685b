//! The `nsqlookupd` binary: flags, logging, then the TCP and HTTP servers until SIGINT or
//! SIGTERM. Under systemd (`NOTIFY_SOCKET`) it sends READY=1 once both listeners accept
//! and STOPPING=1 on shutdown.

#![forbid(unsafe_code)]

use nsqlookupd::{config, logger, NsqLookupd, VERSION};

fn main() {
    let cfg = match config::from_args(std::env::args()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("[nsqlookupd] FATAL: {e}");
            std::process::exit(1);
        }
    };
    if cfg.print_version {
        println!("nsqlookupd v{VERSION} (built w/rust)");
        return;
    }
    logger::init(&cfg.log_prefix, cfg.log_level);
    let mut signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "{}FATAL: cannot install signal handlers - {e}",
                cfg.log_prefix
            );
            std::process::exit(1);
        }
    };
    let lookupd = match NsqLookupd::new(cfg.opts) {
        Ok(l) => l,
        Err(e) => {
            log::error!("failed to instantiate nsqlookupd - {e}");
            eprintln!(
                "{}FATAL: failed to instantiate nsqlookupd - {e}",
                cfg.log_prefix
            );
            std::process::exit(1);
        }
    };
    let ctx = lookupd.context().clone();
    if let Err(e) = lookupd.start() {
        log::error!("{e}");
        std::process::exit(1);
    }
    // systemd Type=notify (deploy/nsqlookupd.service): both listeners accept now.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        log::warn!("sd_notify READY=1 failed: {e}");
    }
    let _ = signals.forever().next();
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    log::info!("TCP: closing {}", ctx.tcp_addr);
    log::info!("HTTP: closing {}", ctx.http_addr);
    std::process::exit(0);
}
