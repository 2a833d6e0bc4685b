//! nsqlookupd's command line and config file (apps/nsqlookupd/main.go, options.go).
//! Go-style single-dash flags are accepted; a `--config` TOML file fills in what the
//! command line did not set.

// The flags' doc comments are their --help text in nsqlookupd's words (`<addr>:<port>`,
// `[deprecated]`), not rustdoc markup.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use super::Options;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use nsq_wire::duration::parse_duration;
use std::time::Duration;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "nsqlookupd",
    disable_version_flag = true,
    args_override_self = true,
    about = "nsqlookupd: the NSQ directory service (TCP protocol V1 for nsqd, HTTP for clients)"
)]
// The field docs are the `--help` text, verbatim (`<addr>:<port>`, `[deprecated]` as
// nsqd prints them), not Markdown for rustdoc.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
pub struct Cli {
    /// path to config file
    #[arg(long)]
    pub config: Option<String>,
    /// print version string
    #[arg(long)]
    pub version: bool,
    /// set log verbosity: debug, info, warn, error, or fatal
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// log message prefix
    #[arg(long, default_value = "[nsqlookupd] ")]
    pub log_prefix: String,
    /// [deprecated] has no effect, use --log-level
    #[arg(long)]
    pub verbose: bool,
    /// <addr>:<port> to listen on for TCP clients
    #[arg(long, default_value = "0.0.0.0:4160")]
    pub tcp_address: String,
    /// <addr>:<port> to listen on for HTTP clients
    #[arg(long, default_value = "0.0.0.0:4161")]
    pub http_address: String,
    /// address of this lookupd node, (default to the OS hostname)
    #[arg(long)]
    pub broadcast_address: Option<String>,
    /// duration of time a producer will remain in the active list since its last ping
    #[arg(long, default_value = "5m0s", value_parser = parse_duration)]
    pub inactive_producer_timeout: Duration,
    /// duration of time a producer will remain tombstoned if registration remains
    #[arg(long, default_value = "45s", value_parser = parse_duration)]
    pub tombstone_lifetime: Duration,
}

/// Everything the binary needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    pub opts: Options,
    pub log_level: log::LevelFilter,
    pub log_prefix: String,
    pub print_version: bool,
}

/// Why the command line or the config file is refused. `Display` is the message printed
/// before exiting with status 1.
#[derive(Debug)]
pub enum ConfigError {
    /// The flags do not make options (clap's text).
    Args(clap::Error),
    /// `failed to load config file PATH - <error>`: the file cannot be read.
    Read { path: String, error: std::io::Error },
    /// `failed to load config file PATH - <error>`: a line of it is refused.
    File { path: String, error: FileError },
    /// `invalid log level 'x' (debug, info, warn, error, fatal)`.
    LogLevel(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Args(e) => e.fmt(f),
            ConfigError::Read { path, error } => {
                write!(f, "failed to load config file {path} - {error}")
            }
            ConfigError::File { path, error } => {
                write!(f, "failed to load config file {path} - {error}")
            }
            ConfigError::LogLevel(l) => write!(
                f,
                "invalid log level '{l}' (debug, info, warn, error, fatal)"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A config file line that is refused (`line` counts from 1).
#[derive(Debug, PartialEq, Eq)]
pub enum FileError {
    /// `line N: expected key = value`.
    NotKeyValue { line: usize },
    /// `line N: KEY must be a string`.
    NotString { line: usize, key: String },
    /// A duration that does not parse (Go's text).
    Duration(nsq_wire::duration::DurationError),
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::NotKeyValue { line } => write!(f, "line {line}: expected key = value"),
            FileError::NotString { line, key } => write!(f, "line {line}: {key} must be a string"),
            FileError::Duration(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FileError {}

/// Parses the arguments (`argv[0]` first) and the config file they name. Errors are the
/// message to print before exiting with status 1; `--help` exits from clap.
pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Config, ConfigError> {
    let matches = Cli::command().get_matches_from(nsq_wire::goflag::normalize_args(args));
    let mut cli = Cli::from_arg_matches(&matches).map_err(ConfigError::Args)?;
    if let Some(path) = cli.config.clone() {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(error) => return Err(ConfigError::Read { path, error }),
        };
        if let Err(error) = apply_config_file(&mut cli, &matches, &text) {
            return Err(ConfigError::File { path, error });
        }
    }
    let log_level = crate::logger::parse_level(&cli.log_level)
        .ok_or_else(|| ConfigError::LogLevel(cli.log_level.clone()))?;
    let hostname = gethostname::gethostname().to_string_lossy().into_owned();
    Ok(Config {
        opts: Options {
            tcp_address: cli.tcp_address,
            http_address: cli.http_address,
            broadcast_address: cli.broadcast_address.unwrap_or(hostname),
            inactive_producer_timeout: cli.inactive_producer_timeout,
            tombstone_lifetime: cli.tombstone_lifetime,
        },
        log_level,
        log_prefix: cli.log_prefix,
        print_version: cli.version,
    })
}

/// Applies `key = value` lines of a TOML config (cfg names: `tcp_address`,
/// `log_level`, ...) to the options the command line left at their defaults. Durations
/// are Go strings (`"300s"`) or integers in ms, as go-options coerces them.
fn apply_config_file(cli: &mut Cli, m: &ArgMatches, text: &str) -> Result<(), FileError> {
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or(FileError::NotKeyValue { line: n + 1 })?;
        let (k, v) = (k.trim(), strip_comment(v.trim()));
        let id = k.replace('-', "_");
        if m.value_source(&id) == Some(ValueSource::CommandLine) {
            continue;
        }
        let string = || -> Result<String, FileError> {
            v.strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .map(str::to_owned)
                .ok_or_else(|| FileError::NotString {
                    line: n + 1,
                    key: k.to_string(),
                })
        };
        let duration = || -> Result<Duration, FileError> {
            if let Ok(ms) = v.parse::<u64>() {
                return Ok(Duration::from_millis(ms));
            }
            let s = string()?;
            match s.parse::<u64>() {
                Ok(ms) => Ok(Duration::from_millis(ms)),
                Err(_) => parse_duration(&s).map_err(FileError::Duration),
            }
        };
        match id.as_str() {
            "tcp_address" => cli.tcp_address = string()?,
            "http_address" => cli.http_address = string()?,
            "broadcast_address" => cli.broadcast_address = Some(string()?),
            "log_level" => cli.log_level = string()?,
            "log_prefix" => cli.log_prefix = string()?,
            "inactive_producer_timeout" => cli.inactive_producer_timeout = duration()?,
            "tombstone_lifetime" => cli.tombstone_lifetime = duration()?,
            _ => {}
        }
    }
    Ok(())
}

fn strip_comment(v: &str) -> &str {
    if let Some(inner) = v.strip_prefix('"') {
        match inner.find('"') {
            Some(i) => &v[..i + 2],
            None => v,
        }
    } else {
        v.split('#').next().unwrap_or("").trim()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        std::iter::once("nsqlookupd")
            .chain(a.iter().copied())
            .map(String::from)
            .collect()
    }

    #[test]
    fn defaults_and_flags() {
        let c = from_args(args(&[])).unwrap();
        assert_eq!(c.opts.tcp_address, "0.0.0.0:4160");
        assert_eq!(c.opts.http_address, "0.0.0.0:4161");
        assert_eq!(c.opts.inactive_producer_timeout, Duration::from_secs(300));
        assert_eq!(c.opts.tombstone_lifetime, Duration::from_secs(45));
        assert_eq!(c.log_prefix, "[nsqlookupd] ");
        let c = from_args(args(&[
            "-tombstone-lifetime=1s",
            "--broadcast-address",
            "b",
        ]))
        .unwrap();
        assert_eq!(c.opts.tombstone_lifetime, Duration::from_secs(1));
        assert_eq!(c.opts.broadcast_address, "b");
    }

    #[test]
    fn config_file_under_flags() {
        let m = Cli::command().get_matches_from(args(&["--tcp-address=1.2.3.4:1"]));
        let mut cli = Cli::from_arg_matches(&m).unwrap();
        let toml = "tcp_address = \"9.9.9.9:9\"\nhttp_address = \"5.5.5.5:5\" # c\ntombstone_lifetime = \"2s\"\ninactive_producer_timeout = 1500\n";
        apply_config_file(&mut cli, &m, toml).unwrap();
        assert_eq!(cli.tcp_address, "1.2.3.4:1");
        assert_eq!(cli.http_address, "5.5.5.5:5");
        assert_eq!(cli.tombstone_lifetime, Duration::from_secs(2));
        assert_eq!(cli.inactive_producer_timeout, Duration::from_millis(1500));
    }

    /// Go's flag package: a flag given twice takes its last value (nsqlookupd 1.3.0 runs
    /// with `--http-address` twice, and so must this one).
    #[test]
    fn a_flag_given_twice_takes_its_last_value() {
        let m = Cli::command().get_matches_from(args(&[
            "--http-address=127.0.0.1:1",
            "-http-address=127.0.0.1:2",
        ]));
        let cli = Cli::from_arg_matches(&m).unwrap();
        assert_eq!(cli.http_address, "127.0.0.1:2");
    }
}
