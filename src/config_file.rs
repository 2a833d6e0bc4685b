//! `--config FILE`: nsqd's TOML config file, resolved the way nsqd resolves it, and the
//! table of nsqd's option names that `GET /config/<name>` answers from.
//!
//! nsqd (apps/nsqd/main.go) decodes the file into a `map[string]interface{}` with
//! BurntSushi/toml, runs `config.Validate` (tls_required, tls_min_version, log_level) and
//! then mreiferson/go-options v1.0.0 `Resolve`, which walks nsqd's `Options` struct in field
//! order and takes, for each field: the command-line flag if it was given, else the file's
//! value under the field's cfg name, else the default. This module follows that source:
//!
//! * unknown keys (and tables) are ignored;
//! * a value of another type is coerced as go-options does: a string is parsed (integers
//!   in base 10, Go durations, Go bools), an integer duration is **milliseconds**, an
//!   integer bool is `n == 0` (go-options' inverted test: `snappy = 0` enables snappy), a
//!   non-string value for a string option is Go's `%s` of it (`%!s(int64=5)`), a string for
//!   a list is split on `,`, and any other value for a list gives an empty (`null`) list;
//! * a value that cannot be coerced is fatal with go-options' message
//!   (`Resolve failed to coerce value abc (10000) for field MemQueueSize - strconv.ParseInt:
//!   parsing "abc": invalid syntax`), printed through Go's plain `log` (no prefix);
//! * a list element of the wrong type makes nsqd panic; here it is a fatal error naming the
//!   key instead.

use crate::config::{go_duration_string, parse_go_bool, Cli};
use clap::parser::ValueSource;
use clap::ArgMatches;
use std::time::Duration;

/// An option's value as nsqd's `Options` holds it, for `/config` and go-options' messages.
#[derive(Clone, Debug, PartialEq)]
pub enum GoValue {
    Int(i64),
    Bool(bool),
    /// A `time.Duration`, ns.
    Dur(i64),
    Str(String),
    /// `None` is a nil slice (JSON `null`).
    StrList(Option<Vec<String>>),
    FloatList(Option<Vec<f64>>),
}

impl GoValue {
    /// The body `GET /config/<name>` answers: a string raw, anything else as JSON
    /// (durations in ns). Returns (is_raw_string, body).
    pub fn config_body(&self) -> (bool, String) {
        match self {
            GoValue::Str(s) => (true, s.clone()),
            GoValue::Int(n) | GoValue::Dur(n) => (false, n.to_string()),
            GoValue::Bool(b) => (false, b.to_string()),
            GoValue::StrList(None) | GoValue::FloatList(None) => (false, "null".into()),
            GoValue::StrList(Some(v)) => (
                false,
                String::from_utf8_lossy(&nsq_wire::json::to_vec_go(v)).into_owned(),
            ),
            GoValue::FloatList(Some(v)) => {
                let items: Vec<String> = v.iter().map(|f| go_float_json(*f)).collect();
                (false, format!("[{}]", items.join(",")))
            }
        }
    }

    /// Go's `%v` of the value (`1m0s`, `[a b]`).
    pub fn go_v(&self) -> String {
        match self {
            GoValue::Int(n) => n.to_string(),
            GoValue::Bool(b) => b.to_string(),
            GoValue::Dur(ns) => {
                let s = go_duration_string(Duration::from_nanos(ns.unsigned_abs()));
                if *ns < 0 {
                    format!("-{s}")
                } else {
                    s
                }
            }
            GoValue::Str(s) => s.clone(),
            GoValue::StrList(v) => format!("[{}]", v.clone().unwrap_or_default().join(" ")),
            GoValue::FloatList(v) => {
                let items: Vec<String> = v.iter().flatten().map(|f| go_float_v(*f)).collect();
                format!("[{}]", items.join(" "))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Go number and duration text
// ---------------------------------------------------------------------------------------

/// (negative, shortest round-trip digits, decimal exponent of the first digit).
fn float_digits(f: f64) -> (bool, String, i32) {
    let e = format!("{:e}", f.abs());
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    (
        f.is_sign_negative() && f != 0.0,
        mant.replace('.', ""),
        exp.parse().unwrap_or(0),
    )
}

fn fixed(digits: &str, exp: i32) -> String {
    let n = digits.len() as i32;
    if exp < 0 {
        format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
    } else if exp + 1 >= n {
        format!("{}{}", digits, "0".repeat((exp + 1 - n) as usize))
    } else {
        format!(
            "{}.{}",
            &digits[..(exp + 1) as usize],
            &digits[(exp + 1) as usize..]
        )
    }
}

fn sci(digits: &str, exp: i32, min_exp_digits: usize) -> String {
    let mant = if digits.len() > 1 {
        format!("{}.{}", &digits[..1], &digits[1..])
    } else {
        digits.to_string()
    };
    let sign = if exp < 0 { '-' } else { '+' };
    format!(
        "{mant}e{sign}{:0w$}",
        exp.unsigned_abs(),
        w = min_exp_digits
    )
}

/// Go's `%v` of a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`: `1.5`, `1`, `1e+21`,
/// `1e-05`).
pub fn go_float_v(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let (neg, digits, exp) = float_digits(f);
    let body = if f == 0.0 {
        "0".into()
    } else if !(-4..21).contains(&exp) {
        sci(&digits, exp, 2)
    } else {
        fixed(&digits, exp)
    };
    if neg {
        format!("-{body}")
    } else {
        body
    }
}

/// encoding/json's float64: fixed notation, exponent form below 1e-6 or from 1e21
/// (`1e-7`, `1e+21`).
pub fn go_float_json(f: f64) -> String {
    if !f.is_finite() || f == 0.0 {
        return "0".into();
    }
    let (neg, digits, exp) = float_digits(f);
    let a = f.abs();
    let body = if !(1e-6..1e21).contains(&a) {
        sci(&digits, exp, 1)
    } else {
        fixed(&digits, exp)
    };
    if neg {
        format!("-{body}")
    } else {
        body
    }
}

/// Go's `strconv.Quote` for the ASCII text our messages carry.
fn go_quote(s: &str) -> String {
    format!("{s:?}")
}

/// Go's `time.ParseDuration`, with its error texts (`time: missing unit in duration
/// "60"`). Returns ns. (One parser for flags and the config file:
/// [`nsq_wire::duration::parse_go_duration`].)
pub use nsq_wire::duration::parse_go_duration;

/// Why a config file value could not be coerced into, or set on, an option: go-options'
/// error, whose `Display` (Go's text) ends its `Resolve failed to coerce ...` line.
#[derive(Clone, Debug, PartialEq)]
pub enum GoError {
    /// `strconv.ParseInt: parsing "x": invalid syntax` (or `value out of range`).
    ParseInt { text: String, out_of_range: bool },
    /// `strconv.ParseFloat: parsing "x": invalid syntax`.
    ParseFloat(String),
    /// `strconv.ParseBool: parsing "x": invalid syntax`.
    ParseBool(String),
    /// time.ParseDuration's error.
    Duration(nsq_wire::duration::DurationError),
    /// `invalid int64 value type float64`: a TOML value of a type the option's cannot
    /// be made from.
    ValueType {
        want: &'static str,
        got: &'static str,
    },
    /// `value N out of range [MIN,MAX] for this broker`: an integer the option's Rust
    /// type cannot hold.
    OutOfRange { value: i64, min: i128, max: i128 },
    /// `unexpected value <debug>`: a value of another Go type than the option's (a bug
    /// in the option table).
    Unexpected(GoValue),
    /// `negative durations are not supported`.
    NegativeDuration,
    /// `invalid log level <v>`: a `log_level` outside 1..=5.
    LogLevel(GoValue),
}

impl std::fmt::Display for GoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GoError::ParseInt { text, out_of_range } => {
                let why = if *out_of_range {
                    "value out of range"
                } else {
                    "invalid syntax"
                };
                write!(f, "strconv.ParseInt: parsing {}: {why}", go_quote(text))
            }
            GoError::ParseFloat(text) => write!(
                f,
                "strconv.ParseFloat: parsing {}: invalid syntax",
                go_quote(text)
            ),
            GoError::ParseBool(text) => write!(
                f,
                "strconv.ParseBool: parsing {}: invalid syntax",
                go_quote(text)
            ),
            GoError::Duration(e) => e.fmt(f),
            GoError::ValueType { want, got } => write!(f, "invalid {want} value type {got}"),
            GoError::OutOfRange { value, min, max } => {
                write!(
                    f,
                    "value {value} out of range [{min},{max}] for this broker"
                )
            }
            GoError::Unexpected(v) => write!(f, "unexpected value {v:?}"),
            GoError::NegativeDuration => f.write_str("negative durations are not supported"),
            GoError::LogLevel(v) => write!(f, "invalid log level {}", v.go_v()),
        }
    }
}

impl std::error::Error for GoError {}

fn go_parse_int(s: &str) -> Result<i64, GoError> {
    s.parse::<i64>().map_err(|_| {
        let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
        GoError::ParseInt {
            text: s.to_string(),
            out_of_range: !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
        }
    })
}

fn go_parse_float(s: &str) -> Result<f64, GoError> {
    s.parse::<f64>()
        .map_err(|_| GoError::ParseFloat(s.to_string()))
}

// ---------------------------------------------------------------------------------------
// TOML values as Go sees them (BurntSushi/toml into interface{})
// ---------------------------------------------------------------------------------------

/// Go's `%T` of the decoded value.
fn go_type(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "string",
        toml::Value::Integer(_) => "int64",
        toml::Value::Float(_) => "float64",
        toml::Value::Boolean(_) => "bool",
        toml::Value::Datetime(_) => "time.Time",
        toml::Value::Array(_) => "[]interface {}",
        toml::Value::Table(_) => "map[string]interface {}",
    }
}

/// Go's `%v` (`verb_s` false) or `%s` (true) of the decoded value.
fn go_fmt(v: &toml::Value, verb_s: bool) -> String {
    let bad = |t: &str, x: String| {
        if verb_s {
            format!("%!s({t}={x})")
        } else {
            x
        }
    };
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(n) => bad("int64", n.to_string()),
        toml::Value::Float(f) => bad("float64", go_float_v(*f)),
        toml::Value::Boolean(b) => bad("bool", b.to_string()),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| go_fmt(x, verb_s)).collect();
            format!("[{}]", items.join(" "))
        }
        toml::Value::Table(t) => {
            let items: Vec<String> = t
                .iter()
                .map(|(k, x)| format!("{k}:{}", go_fmt(x, verb_s)))
                .collect();
            format!("map[{}]", items.join(" "))
        }
    }
}

/// The Go type of an nsqd option, which decides how a file value is coerced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Int,
    Bool,
    Duration,
    Str,
    StrList,
    FloatList,
}

/// Why a value could not be coerced: go-options' error, or a case where nsqd panics (a
/// list element that is not of the list's type: `interface conversion: interface {} is
/// int64, not string`).
enum CoerceError {
    Go(GoError),
    Panic {
        got: &'static str,
        want: &'static str,
    },
}

impl CoerceError {
    /// The Go runtime's text for [`CoerceError::Panic`].
    fn panic_text(got: &str, want: &str) -> String {
        format!("interface conversion: interface {{}} is {got}, not {want}")
    }
}

/// go-options' `coerce` of a decoded value into `kind`.
fn coerce(kind: Kind, v: &toml::Value) -> Result<GoValue, CoerceError> {
    use toml::Value as T;
    let wrong = |want: &'static str| {
        CoerceError::Go(GoError::ValueType {
            want,
            got: go_type(v),
        })
    };
    Ok(match kind {
        Kind::Int => match v {
            T::String(s) => GoValue::Int(go_parse_int(s).map_err(CoerceError::Go)?),
            T::Integer(n) => GoValue::Int(*n),
            _ => return Err(wrong("int64")),
        },
        Kind::Bool => match v {
            T::Boolean(b) => GoValue::Bool(*b),
            T::String(s) => GoValue::Bool(
                parse_go_bool(s).map_err(|_| CoerceError::Go(GoError::ParseBool(s.clone())))?,
            ),
            // go-options v1.0.0 coerceBool: `reflect.ValueOf(v).Int() == 0`.
            T::Integer(n) => GoValue::Bool(*n == 0),
            _ => return Err(wrong("bool")),
        },
        Kind::Duration => match v {
            T::String(s) => GoValue::Dur(
                parse_go_duration(s).map_err(|e| CoerceError::Go(GoError::Duration(e)))?,
            ),
            // go-options: "treat like ms".
            T::Integer(n) => GoValue::Dur(n.saturating_mul(1_000_000)),
            _ => return Err(wrong("time.Duration")),
        },
        Kind::Str => GoValue::Str(go_fmt(v, true)),
        Kind::StrList => match v {
            T::String(s) => GoValue::StrList(Some(s.split(',').map(String::from).collect())),
            T::Array(a) => {
                let mut out = Vec::with_capacity(a.len());
                for x in a {
                    match x {
                        T::String(s) => out.push(s.clone()),
                        _ => {
                            return Err(CoerceError::Panic {
                                got: go_type(x),
                                want: "string",
                            })
                        }
                    }
                }
                GoValue::StrList((!out.is_empty()).then_some(out))
            }
            _ => GoValue::StrList(None),
        },
        Kind::FloatList => match v {
            T::String(s) => {
                let mut out = Vec::new();
                for part in s.split(',') {
                    out.push(go_parse_float(part.trim()).map_err(CoerceError::Go)?);
                }
                GoValue::FloatList(Some(out))
            }
            T::Array(a) => {
                let mut out = Vec::with_capacity(a.len());
                for x in a {
                    match x {
                        T::Float(f) => out.push(*f),
                        _ => {
                            return Err(CoerceError::Panic {
                                got: go_type(x),
                                want: "float64",
                            })
                        }
                    }
                }
                GoValue::FloatList((!out.is_empty()).then_some(out))
            }
            _ => GoValue::FloatList(None),
        },
    })
}

// ---------------------------------------------------------------------------------------
// The option table
// ---------------------------------------------------------------------------------------

/// Converts between a `Cli` field and nsqd's Go value.
pub(crate) trait GoField: Sized {
    fn to_go(&self) -> GoValue;
    fn from_go(v: GoValue) -> Result<Self, GoError>;
}

fn out_of_range<T>(value: i64, min: i128, max: i128) -> Result<T, GoError> {
    Err(GoError::OutOfRange { value, min, max })
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl GoField for $t {
            fn to_go(&self) -> GoValue {
                GoValue::Int(*self as i64)
            }
            fn from_go(v: GoValue) -> Result<Self, GoError> {
                match v {
                    GoValue::Int(n) => <$t>::try_from(n)
                        .or_else(|_| out_of_range(n, <$t>::MIN as i128, <$t>::MAX as i128)),
                    other => Err(GoError::Unexpected(other)),
                }
            }
        }
    )*};
}
int_field!(u8, u16, i64, u64, usize);

impl GoField for bool {
    fn to_go(&self) -> GoValue {
        GoValue::Bool(*self)
    }
    fn from_go(v: GoValue) -> Result<Self, GoError> {
        match v {
            GoValue::Bool(b) => Ok(b),
            other => Err(GoError::Unexpected(other)),
        }
    }
}

impl GoField for Duration {
    fn to_go(&self) -> GoValue {
        GoValue::Dur(self.as_nanos().min(i64::MAX as u128) as i64)
    }
    fn from_go(v: GoValue) -> Result<Self, GoError> {
        match v {
            GoValue::Dur(ns) if ns >= 0 => Ok(Duration::from_nanos(ns as u64)),
            GoValue::Dur(_) => Err(GoError::NegativeDuration),
            other => Err(GoError::Unexpected(other)),
        }
    }
}

impl GoField for String {
    fn to_go(&self) -> GoValue {
        GoValue::Str(self.clone())
    }
    fn from_go(v: GoValue) -> Result<Self, GoError> {
        match v {
            GoValue::Str(s) => Ok(s),
            other => Err(GoError::Unexpected(other)),
        }
    }
}

impl GoField for Vec<String> {
    fn to_go(&self) -> GoValue {
        GoValue::StrList(Some(self.clone()))
    }
    fn from_go(v: GoValue) -> Result<Self, GoError> {
        match v {
            GoValue::StrList(l) => Ok(l.unwrap_or_default()),
            other => Err(GoError::Unexpected(other)),
        }
    }
}

impl GoField for Vec<f64> {
    fn to_go(&self) -> GoValue {
        GoValue::FloatList(Some(self.clone()))
    }
    fn from_go(v: GoValue) -> Result<Self, GoError> {
        match v {
            GoValue::FloatList(l) => Ok(l.unwrap_or_default()),
            other => Err(GoError::Unexpected(other)),
        }
    }
}

/// One nsqd option: its cfg name (TOML key and `/config/<name>`), the `Cli` field (clap id)
/// of its flag, nsqd's `Options` field name (go-options' messages) and its Go type. The
/// table of them, [`OPTIONS`], is made from the declaration of [`Cli`]
/// ([`crate::config`]'s `nsqd_options!`).
pub struct OptSpec {
    pub cfg: &'static str,
    pub arg: &'static str,
    pub go_field: &'static str,
    pub kind: Kind,
    /// `PUT /config/<cfg>` may change it at run time (nsqd: http.go doConfig).
    pub put_at_run_time: bool,
    /// The current value, as nsqd's `Options` would hold it.
    pub get: fn(&Cli) -> GoValue,
    pub(crate) set: fn(&mut Cli, GoValue) -> Result<(), GoError>,
}

pub use crate::config::OPTIONS;

/// `id`: `--node-id`, else nsqd's default (crc32 of the md5 of the hostname).
pub(crate) fn node_id_go(c: &Cli) -> GoValue {
    GoValue::Int(
        c.node_id
            .unwrap_or_else(|| crate::config::default_node_id() as i64),
    )
}

pub(crate) fn set_node_id(c: &mut Cli, v: GoValue) -> Result<(), GoError> {
    c.node_id = Some(GoField::from_go(v)?);
    Ok(())
}

/// `log_level`: nsqd's level number, 1 (debug) to 5 (fatal).
pub(crate) fn log_level_go(c: &Cli) -> GoValue {
    GoValue::Int(level_number(&c.log_level))
}

pub(crate) fn set_log_level(c: &mut Cli, v: GoValue) -> Result<(), GoError> {
    let names = ["debug", "info", "warn", "error", "fatal"];
    match v {
        GoValue::Int(n @ 1..=5) => {
            c.log_level = names[n as usize - 1].to_string();
            Ok(())
        }
        other => Err(GoError::LogLevel(other)),
    }
}

/// `broadcast_address`: `--broadcast-address`, else the hostname.
pub(crate) fn broadcast_address_go(c: &Cli) -> GoValue {
    GoValue::Str(
        c.broadcast_address
            .clone()
            .unwrap_or_else(crate::config::hostname),
    )
}

pub(crate) fn set_broadcast_address(c: &mut Cli, v: GoValue) -> Result<(), GoError> {
    c.broadcast_address = Some(GoField::from_go(v)?);
    Ok(())
}

/// `shards`: `--shards`, else the CPUs this process may use.
pub(crate) fn shards_go(c: &Cli) -> GoValue {
    GoValue::Int(c.shards.unwrap_or_else(crate::config::default_shards) as i64)
}

pub(crate) fn set_shards(c: &mut Cli, v: GoValue) -> Result<(), GoError> {
    c.shards = Some(GoField::from_go(v)?);
    Ok(())
}

fn level_number(name: &str) -> i64 {
    match name.to_ascii_lowercase().as_str() {
        "debug" => 1,
        "info" => 2,
        "warn" => 3,
        "error" => 4,
        "fatal" => 5,
        _ => 0,
    }
}

/// The option with this cfg name.
pub fn spec(cfg: &str) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|o| o.cfg == cfg)
}

/// Every option's value after resolution, by cfg name: what `GET /config/<name>` shows
/// for options that do not change at run time. A list the file set to a nil slice stays
/// `null`, as in nsqd.
pub fn resolved(cli: &Cli) -> Vec<(&'static str, GoValue)> {
    OPTIONS
        .iter()
        .map(|o| {
            let v = if cli.go_nil_lists.contains(&o.cfg) {
                match o.kind {
                    Kind::FloatList => GoValue::FloatList(None),
                    _ => GoValue::StrList(None),
                }
            } else {
                (o.get)(cli)
            };
            (o.cfg, v)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------

/// A start-up failure while reading the config file, in the form nsqd prints it.
#[derive(Debug, PartialEq)]
pub enum LoadError {
    /// nsqd's `logFatal` (`[nsqd] <date time.µs> FATAL: <msg>`).
    Fatal(String),
    /// go-options' `log.Fatalf` through Go's default logger (`<date time> ERROR: <msg>`).
    Resolve(String),
}

impl LoadError {
    /// The stderr line nsqd prints for it.
    pub fn line(&self) -> String {
        let stamp = crate::timefmt::log_stamp(nsq_shards::message::now_unix_nanos());
        match self {
            LoadError::Fatal(m) => format!("[nsqd] {stamp} FATAL: {m}"),
            LoadError::Resolve(m) => format!("{} ERROR: {m}", &stamp[..19.min(stamp.len())]),
        }
    }
}

/// nsqd's `config.Validate`: tls_required, tls_min_version and log_level are translated
/// (from Go's `%v` of the value) before resolution; a bad one is fatal.
fn validate(table: &mut toml::Table) -> Result<(), LoadError> {
    if let Some(v) = table.get("tls_required") {
        let text = go_fmt(v, false);
        let n = crate::config::parse_tls_required(&text)
            .map_err(|_| LoadError::Fatal(format!("failed parsing tls_required {text}")))?;
        table.insert("tls_required".into(), toml::Value::String(n.to_string()));
    }
    if let Some(v) = table.get("tls_min_version") {
        let text = go_fmt(v, false);
        let n = crate::config::parse_tls_min_version(&text)
            .map_err(|_| LoadError::Fatal(format!("failed parsing tls_min_version {text}")))?;
        if text.is_empty() {
            table.remove("tls_min_version");
        } else {
            table.insert("tls_min_version".into(), toml::Value::String(n.to_string()));
        }
    }
    if let Some(v) = table.get("log_level") {
        let text = go_fmt(v, false);
        let n = level_number(&text);
        if n == 0 {
            return Err(LoadError::Fatal(format!("failed parsing log_level {text}")));
        }
        table.insert("log_level".into(), toml::Value::Integer(n));
    }
    Ok(())
}

/// Reads `cli.config` (when set) and applies its values to every option whose flag was
/// not given on the command line (`matches` tells which were).
pub fn apply(cli: &mut Cli, matches: &ArgMatches) -> Result<(), LoadError> {
    if cli.config.is_empty() {
        return Ok(());
    }
    let path = cli.config.clone();
    let fail = |e: String| LoadError::Fatal(format!("failed to load config file {path} - {e}"));
    let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // BurntSushi's form: `toml: line N: <what>`.
        // (Counted in bytes: the error's offset may fall inside a multi-byte character.)
        let line = e
            .span()
            .map(|r| {
                let upto = &text.as_bytes()[..r.start.min(text.len())];
                upto.iter().filter(|&&b| b == b'\n').count() + 1
            })
            .unwrap_or(1);
        fail(format!("toml: line {line}: {}", e.message().trim()))
    })?;
    validate(&mut table)?;
    apply_table(cli, matches, &table, &path)
}

fn apply_table(
    cli: &mut Cli,
    matches: &ArgMatches,
    table: &toml::Table,
    path: &str,
) -> Result<(), LoadError> {
    for o in OPTIONS.iter() {
        if matches.value_source(o.arg) == Some(ValueSource::CommandLine) {
            continue;
        }
        let Some(v) = table.get(o.cfg) else { continue };
        let current = (o.get)(cli).go_v();
        let resolve_err = |why: GoError| {
            LoadError::Resolve(format!(
                "Resolve failed to coerce value {} ({current}) for field {} - {why}",
                go_fmt(v, false),
                o.go_field
            ))
        };
        let value = match coerce(o.kind, v) {
            Ok(x) => x,
            Err(CoerceError::Go(why)) => return Err(resolve_err(why)),
            Err(CoerceError::Panic { got, want }) => {
                return Err(LoadError::Fatal(format!(
                    "failed to load config file {path} - {}: {}",
                    o.cfg,
                    CoerceError::panic_text(got, want)
                )))
            }
        };
        if matches!(value, GoValue::StrList(None) | GoValue::FloatList(None)) {
            cli.go_nil_lists.push(o.cfg);
        } else {
            cli.go_nil_lists.retain(|c| *c != o.cfg);
        }
        (o.set)(cli, value).map_err(resolve_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_table_is_in_nsqd_order_with_unique_names() {
        let names: Vec<&str> = OPTIONS.iter().map(|o| o.cfg).collect();
        assert_eq!(names[..4], ["id", "log_level", "log_prefix", "tcp_address"]);
        assert_eq!(names.last(), Some(&"shards"));
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        let put: Vec<&str> = OPTIONS
            .iter()
            .filter(|o| o.put_at_run_time)
            .map(|o| o.cfg)
            .collect();
        assert_eq!(put, ["log_level", "nsqlookupd_tcp_addresses"]);
    }

    /// deploy/nsqd.cfg, the example the Debian package installs, names every option
    /// this broker reads from a config file (set or commented out with its default).
    #[test]
    fn the_example_config_lists_every_option() {
        let example = include_str!("../deploy/nsqd.cfg");
        let listed = |cfg: &str| {
            example.lines().any(|l| {
                let l = l.trim_start_matches('#').trim_start();
                l.split_once('=').is_some_and(|(k, _)| k.trim() == cfg)
            })
        };
        let missing: Vec<&str> = OPTIONS
            .iter()
            .map(|o| o.cfg)
            .filter(|c| !listed(c))
            .collect();
        assert!(missing.is_empty(), "deploy/nsqd.cfg lacks {missing:?}");
        // And every line of it parses as TOML.
        let uncommented: String = example
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(uncommented.parse::<toml::Table>().is_ok(), "{uncommented}");
    }

    #[test]
    fn go_floats() {
        assert_eq!(go_float_v(1.5), "1.5");
        assert_eq!(go_float_v(1.0), "1");
        assert_eq!(go_float_v(0.99), "0.99");
        assert_eq!(go_float_v(1e21), "1e+21");
        assert_eq!(go_float_v(0.00001), "1e-05");
        assert_eq!(go_float_v(123456.0), "123456");
        assert_eq!(go_float_json(0.99), "0.99");
        assert_eq!(go_float_json(1.0), "1");
        assert_eq!(go_float_json(1e-7), "1e-7");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("60s"), Ok(60_000_000_000));
        assert_eq!(parse_go_duration("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(parse_go_duration("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_go_duration("0"), Ok(0));
        assert_eq!(parse_go_duration("-2s"), Ok(-2_000_000_000));
        assert_eq!(
            parse_go_duration("60").map_err(|e| e.to_string()),
            Err("time: missing unit in duration \"60\"".into())
        );
        assert_eq!(
            parse_go_duration("5x").map_err(|e| e.to_string()),
            Err("time: unknown unit \"x\" in duration \"5x\"".into())
        );
        assert_eq!(
            parse_go_duration("abc").map_err(|e| e.to_string()),
            Err("time: invalid duration \"abc\"".into())
        );
        assert_eq!(
            parse_go_duration("1.5.5s").map_err(|e| e.to_string()),
            Err("time: missing unit in duration \"1.5.5s\"".into())
        );
        assert_eq!(
            parse_go_duration("").map_err(|e| e.to_string()),
            Err("time: invalid duration \"\"".into())
        );
    }

    #[test]
    fn go_coercions() {
        let t: toml::Table = "a = 5\nb = 1.5\nc = true\nd = [\"x\", 2]\ne = \"s\""
            .parse()
            .unwrap();
        assert_eq!(go_fmt(&t["a"], true), "%!s(int64=5)");
        assert_eq!(go_fmt(&t["b"], true), "%!s(float64=1.5)");
        assert_eq!(go_fmt(&t["c"], true), "%!s(bool=true)");
        assert_eq!(go_fmt(&t["d"], true), "[x %!s(int64=2)]");
        assert_eq!(go_fmt(&t["d"], false), "[x 2]");
        assert!(matches!(
            coerce(Kind::Bool, &t["a"]),
            Ok(GoValue::Bool(false))
        ));
        assert!(matches!(
            coerce(Kind::Duration, &t["a"]),
            Ok(GoValue::Dur(5_000_000))
        ));
        assert!(matches!(
            coerce(Kind::StrList, &t["a"]),
            Ok(GoValue::StrList(None))
        ));
        assert!(matches!(
            coerce(Kind::StrList, &t["d"]),
            Err(CoerceError::Panic { .. })
        ));
        match coerce(Kind::Int, &t["b"]) {
            Err(CoerceError::Go(m)) => {
                assert_eq!(m.to_string(), "invalid int64 value type float64")
            }
            _ => panic!("float for an int"),
        }
    }
}
