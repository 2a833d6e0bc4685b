//! The log line format nsqd and nsqlookupd share on stderr:
//! `[nsqd] 2026/11/29 19:39:41.709417 INFO: message` (nsq: internal/lg). The prefix is
//! `--log-prefix`; the level filter is `log::max_level()`, so PUT /config/log_level applies.

use crate::timefmt::{log_stamp, now_unix_nanos};
use std::io::Write;

struct Logger {
    prefix: String,
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level() && m.target().starts_with("nsq")
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let level = match r.level() {
            log::Level::Error => "ERROR",
            log::Level::Warn => "WARNING",
            log::Level::Info => "INFO",
            _ => "DEBUG",
        };
        let line = format!(
            "{}{} {}: {}\n",
            self.prefix,
            log_stamp(now_unix_nanos()),
            level,
            r.args()
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// Installs the logger once for the process.
pub fn init(prefix: &str, level: log::LevelFilter) {
    let _ = log::set_boxed_logger(Box::new(Logger {
        prefix: prefix.to_string(),
    }));
    log::set_max_level(level);
}

/// A `--log-level` value (debug, info, warn, error, fatal; any case) as a filter.
pub fn parse_level(s: &str) -> Option<log::LevelFilter> {
    Some(match s.to_ascii_lowercase().as_str() {
        "debug" => log::LevelFilter::Debug,
        "info" => log::LevelFilter::Info,
        "warn" => log::LevelFilter::Warn,
        "error" => log::LevelFilter::Error,
        "fatal" => log::LevelFilter::Error,
        _ => return None,
    })
}
