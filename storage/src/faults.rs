//! Deterministic disk-fault injection (as FoundationDB's simulation does): I/O errors,
//! full-disk errors, short writes and delays on chosen storage operations, decided by
//! operation count or by a PRNG seeded from the spec, so a failing run can be repeated.
//!
//! Compiled in only with the cargo feature `fault-injection` (the tests enable it; a
//! plain build, release binaries included, has no way to inject faults: every check
//! below is then a constant "no fault"). With the feature, enabled at run time by the
//! environment variable `NSQD_STORAGE_FAULTS`, read once (the first storage operation,
//! or `init_from_env` at start-up). Unset, every operation pays one load of an
//! initialised `OnceLock` and a predictable branch.
//!
//! Grammar (rules separated by `,`; a token without `=` adds a trigger to the rule
//! before it):
//! ```text
//! spec    = item ("," item)*
//! item    = "seed=" u64 | op "=" action ["@" trigger ("," trigger)*]
//! op      = "write" (segment writes) | "sync" (fdatasync of segments)
//!         | "open" (segment open/create) | "read" (segment reads)
//!         | "meta" (meta.json, segment index and checkpoint writes)
//! action  = "eio" | "enospc" | "short" (half the bytes written, then EIO; on other
//!           operations the same as eio) | "delay:" duration ("500ms", "2s", "300us")
//!         | "panic" (a panic where the operation runs: a bug, to test that the
//!           process ends with a failure status rather than running on without a shard)
//! trigger = "nth:" N   only the Nth operation of that kind (1-based)
//!         | "every:" N every Nth operation
//!         | "p:" F     each operation with probability F (seeded PRNG)
//!         | "after:" N not the first N operations
//!         | "count:" N at most N faults from this rule
//! ```
//! Without a trigger a rule fires on every operation of its kind. Triggers combine:
//! with `after:N`, `nth` and `every` count the operations after the first N; the first
//! rule (in spec order) that fires decides; `count` counts only that rule's faults.
//! Journal syncs and recovery's reads at start-up are not covered. Example:
//! `NSQD_STORAGE_FAULTS="seed=7,write=eio@after:100,count:20,sync=delay:200ms@p:0.1"`.
//! Operations are counted per kind over the whole process (all shards); the PRNG is a
//! hash of (seed, rule, operation number), so a run of one shard is repeatable.
//!
//! A fault is an ordinary `io::Error` (`EIO` = raw OS error 5, `ENOSPC` = 28): it goes
//! through the store's error paths like a real one; nothing here panics but the `panic`
//! action.

use std::io;
#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "fault-injection")]
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable holding the fault spec.
#[cfg(feature = "fault-injection")]
pub const ENV: &str = "NSQD_STORAGE_FAULTS";

/// A kind of storage operation faults can be injected into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Write = 0,
    Sync = 1,
    Open = 2,
    Read = 3,
    Meta = 4,
}

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    Eio,
    Enospc,
    /// Write half the bytes, then fail with EIO.
    Short,
    Delay(Duration),
    /// Panic (a simulated bug).
    Panic,
}

#[cfg(feature = "fault-injection")]
#[derive(Debug)]
struct Rule {
    op: Op,
    action: Action,
    nth: Option<u64>,
    every: Option<u64>,
    p: Option<f64>,
    after: u64,
    count: Option<u64>,
    fired: AtomicU64,
}

#[cfg(feature = "fault-injection")]
/// A parsed fault spec with its operation counters.
#[derive(Debug)]
pub struct Faults {
    seed: u64,
    rules: Vec<Rule>,
    ops: [AtomicU64; 5],
}

#[cfg(feature = "fault-injection")]
static FAULTS: OnceLock<Option<Faults>> = OnceLock::new();

/// Why a fault spec does not parse (grammar in the module doc); its `Display` names
/// the token at fault, as the start-up error shows it.
#[cfg(feature = "fault-injection")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecError {
    /// A duration without a unit (`delay:5`).
    DurationWithoutUnit(String),
    /// A duration whose number does not parse.
    BadDuration(String),
    /// A duration with a unit other than `us`, `ms`, `s`.
    BadDurationUnit(String),
    /// A value that is not a number, and what it was for (`seed`, `nth`, ...).
    BadNumber { value: String, what: String },
    /// A trigger without `:`.
    BadTrigger(String),
    /// A probability that is not a number.
    BadProbability(String),
    /// A probability outside 0..1.
    ProbabilityOutOfRange(String),
    /// A trigger name other than `nth`, `every`, `p`, `after`, `count`.
    UnknownTrigger(String),
    /// A trigger with no rule before it.
    TriggerBeforeRule(String),
    /// An operation other than `write`, `sync`, `open`, `read`, `meta`.
    UnknownOperation(String),
    /// An action other than `eio`, `enospc`, `short`, `panic`, `delay:`.
    UnknownAction(String),
}

#[cfg(feature = "fault-injection")]
impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecError::DurationWithoutUnit(s) => {
                write!(f, "duration {s:?} needs a unit (us, ms, s)")
            }
            SpecError::BadDuration(s) => write!(f, "bad duration {s:?}"),
            SpecError::BadDurationUnit(s) => write!(f, "bad duration unit in {s:?}"),
            SpecError::BadNumber { value, what } => {
                write!(f, "bad number {value:?} for {what}")
            }
            SpecError::BadTrigger(t) => write!(f, "bad trigger {t:?}"),
            SpecError::BadProbability(v) => write!(f, "bad probability {v:?}"),
            SpecError::ProbabilityOutOfRange(v) => write!(f, "probability {v} not in 0..1"),
            SpecError::UnknownTrigger(k) => write!(f, "unknown trigger {k:?}"),
            SpecError::TriggerBeforeRule(t) => write!(f, "trigger {t:?} before any rule"),
            SpecError::UnknownOperation(k) => write!(f, "unknown operation {k:?}"),
            SpecError::UnknownAction(a) => write!(f, "unknown action {a:?}"),
        }
    }
}

#[cfg(feature = "fault-injection")]
impl std::error::Error for SpecError {}

/// [`ENV`] holds a spec that does not parse: `NSQD_STORAGE_FAULTS: <why>`.
#[cfg(feature = "fault-injection")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvError(pub SpecError);

#[cfg(feature = "fault-injection")]
impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{ENV}: {}", self.0)
    }
}

#[cfg(feature = "fault-injection")]
impl std::error::Error for EnvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[cfg(feature = "fault-injection")]
/// Reads [`ENV`] (once). Errors: the spec does not parse ([`EnvError`], saying where);
/// the layer then stays off. Returns whether faults are enabled.
pub fn init_from_env() -> Result<bool, EnvError> {
    let mut err = None;
    let f = FAULTS.get_or_init(|| match std::env::var(ENV) {
        Ok(s) if !s.trim().is_empty() => match Faults::parse(&s) {
            Ok(f) => Some(f),
            Err(e) => {
                err = Some(e);
                None
            }
        },
        _ => None,
    });
    match err {
        Some(e) => Err(EnvError(e)),
        None => Ok(f.is_some()),
    }
}

#[cfg(feature = "fault-injection")]
fn faults() -> Option<&'static Faults> {
    match FAULTS.get() {
        Some(f) => f.as_ref(),
        None => {
            let _ = init_from_env();
            FAULTS.get().and_then(|f| f.as_ref())
        }
    }
}

#[cfg(feature = "fault-injection")]
fn parse_duration(s: &str) -> Result<Duration, SpecError> {
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .ok_or_else(|| SpecError::DurationWithoutUnit(s.to_string()))?;
    let n: u64 = n
        .parse()
        .map_err(|_| SpecError::BadDuration(s.to_string()))?;
    match unit {
        "us" => Ok(Duration::from_micros(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(SpecError::BadDurationUnit(s.to_string())),
    }
}

#[cfg(feature = "fault-injection")]
fn num(v: &str, what: &str) -> Result<u64, SpecError> {
    v.parse().map_err(|_| SpecError::BadNumber {
        value: v.to_string(),
        what: what.to_string(),
    })
}

#[cfg(feature = "fault-injection")]
impl Rule {
    fn add_trigger(&mut self, t: &str) -> Result<(), SpecError> {
        let (k, v) = t
            .split_once(':')
            .ok_or_else(|| SpecError::BadTrigger(t.to_string()))?;
        match k {
            "nth" => self.nth = Some(num(v, k)?.max(1)),
            "every" => self.every = Some(num(v, k)?.max(1)),
            "after" => self.after = num(v, k)?,
            "count" => self.count = Some(num(v, k)?),
            "p" => {
                let p: f64 = v
                    .parse()
                    .map_err(|_| SpecError::BadProbability(v.to_string()))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(SpecError::ProbabilityOutOfRange(v.to_string()));
                }
                self.p = Some(p);
            }
            _ => return Err(SpecError::UnknownTrigger(k.to_string())),
        }
        Ok(())
    }
}

#[cfg(feature = "fault-injection")]
impl Faults {
    /// Parses a spec (grammar in the module doc).
    pub fn parse(spec: &str) -> Result<Faults, SpecError> {
        let mut seed = 0;
        let mut rules: Vec<Rule> = Vec::new();
        for tok in spec.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let Some((k, v)) = tok.split_once('=') else {
                let r = rules
                    .last_mut()
                    .ok_or_else(|| SpecError::TriggerBeforeRule(tok.to_string()))?;
                r.add_trigger(tok)?;
                continue;
            };
            let op = match k {
                "seed" => {
                    seed = num(v, "seed")?;
                    continue;
                }
                "write" => Op::Write,
                "sync" => Op::Sync,
                "open" => Op::Open,
                "read" => Op::Read,
                "meta" => Op::Meta,
                _ => return Err(SpecError::UnknownOperation(k.to_string())),
            };
            let (action, trigger) = match v.split_once('@') {
                Some((a, t)) => (a, Some(t)),
                None => (v, None),
            };
            let action = match action {
                "eio" => Action::Eio,
                "enospc" => Action::Enospc,
                "short" => Action::Short,
                "panic" => Action::Panic,
                a => match a.strip_prefix("delay:") {
                    Some(d) => Action::Delay(parse_duration(d)?),
                    None => return Err(SpecError::UnknownAction(a.to_string())),
                },
            };
            let mut r = Rule {
                op,
                action,
                nth: None,
                every: None,
                p: None,
                after: 0,
                count: None,
                fired: AtomicU64::new(0),
            };
            if let Some(t) = trigger {
                r.add_trigger(t)?;
            }
            rules.push(r);
        }
        Ok(Faults {
            seed,
            rules,
            ops: Default::default(),
        })
    }

    /// Counts one operation of kind `op` and returns the fault of the first rule that
    /// fires for it, if any.
    pub fn next(&self, op: Op) -> Option<Action> {
        let n = self.ops[op as usize].fetch_add(1, Ordering::Relaxed) + 1;
        for (i, r) in self.rules.iter().enumerate() {
            if r.op != op || n <= r.after {
                continue;
            }
            let k = n - r.after;
            let hit = r.nth.is_none_or(|m| k == m)
                && r.every.is_none_or(|m| k.is_multiple_of(m))
                && r.p.is_none_or(|p| unit(self.seed, i as u64, n) < p);
            if !hit {
                continue;
            }
            if let Some(c) = r.count {
                if r.fired.fetch_add(1, Ordering::Relaxed) >= c {
                    continue;
                }
            }
            return Some(r.action);
        }
        None
    }
}

#[cfg(feature = "fault-injection")]
/// A uniform number in [0, 1) from (seed, rule, operation number): splitmix64.
fn unit(seed: u64, rule: u64, n: u64) -> f64 {
    let mut z = seed
        .wrapping_add(rule.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(n.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn error(a: Action, op: Op) -> io::Error {
    let code = if a == Action::Enospc { 28 } else { 5 };
    let e = io::Error::from_raw_os_error(code);
    io::Error::new(e.kind(), format!("{e} (injected {op:?} fault)"))
}

/// The fault for the next operation of kind `op`, if the layer is on and a rule fires.
#[cfg(feature = "fault-injection")]
#[inline]
pub fn next(op: Op) -> Option<Action> {
    faults()?.next(op)
}

/// Without the `fault-injection` feature: never a fault.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn next(_op: Op) -> Option<Action> {
    None
}

/// For an operation on the executor: sleeps through a delay fault, returns an error
/// fault (a short write counts as EIO here; see [`write_fault`] for writes).
pub async fn check(op: Op) -> io::Result<()> {
    match next(op) {
        None => Ok(()),
        Some(Action::Panic) => panic!("injected {op:?} panic"),
        Some(Action::Delay(d)) => {
            glommio::timer::sleep(d).await;
            Ok(())
        }
        Some(a) => Err(error(a, op)),
    }
}

/// For a blocking operation (off the executor): as [`check`], sleeping the thread.
pub fn check_blocking(op: Op) -> io::Result<()> {
    match next(op) {
        None => Ok(()),
        Some(Action::Panic) => panic!("injected {op:?} panic"),
        Some(Action::Delay(d)) => {
            std::thread::sleep(d);
            Ok(())
        }
        Some(a) => Err(error(a, op)),
    }
}

/// For a segment write of `len` bytes: `Ok(None)` to write them all (after any delay),
/// `Ok(Some(n))` to write only the first `n` and then fail with the returned error's
/// EIO, `Err` to write nothing.
pub async fn write_fault(len: usize) -> Result<Option<(usize, io::Error)>, io::Error> {
    match next(Op::Write) {
        None => Ok(None),
        Some(Action::Panic) => panic!("injected Write panic"),
        Some(Action::Delay(d)) => {
            glommio::timer::sleep(d).await;
            Ok(None)
        }
        Some(Action::Short) => Ok(Some((len / 2, error(Action::Short, Op::Write)))),
        Some(a) => Err(error(a, Op::Write)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "fault-injection")]
    fn grammar_and_triggers() {
        let f = Faults::parse("seed=7,write=eio@after:3,count:2,sync=delay:200ms@every:2").unwrap();
        let w: Vec<_> = (0..8).map(|_| f.next(Op::Write)).collect();
        let e = Some(Action::Eio);
        assert_eq!(w, [None, None, None, e, e, None, None, None]);
        let s: Vec<_> = (0..4).map(|_| f.next(Op::Sync)).collect();
        let d = Some(Action::Delay(Duration::from_millis(200)));
        assert_eq!(s, [None, d, None, d]);
        assert_eq!(f.next(Op::Read), None);
        let f = Faults::parse("open=enospc@nth:2,read=short").unwrap();
        assert_eq!(f.next(Op::Open), None);
        assert_eq!(f.next(Op::Open), Some(Action::Enospc));
        assert_eq!(f.next(Op::Open), None);
        assert_eq!(f.next(Op::Read), Some(Action::Short));
        let f = Faults::parse("write=panic@nth:1").unwrap();
        assert_eq!(f.next(Op::Write), Some(Action::Panic));
        for bad in [
            "write=eio@nth",
            "disk=eio",
            "write=boom",
            "count:3",
            "sync=delay:5",
        ] {
            assert!(Faults::parse(bad).is_err(), "{bad}");
        }
        // The texts a start-up error shows.
        let text = |spec: &str| Faults::parse(spec).err().map(|e| e.to_string());
        assert_eq!(
            text("sync=delay:5").as_deref(),
            Some("duration \"5\" needs a unit (us, ms, s)")
        );
        assert_eq!(
            text("write=eio@nth:x").as_deref(),
            Some("bad number \"x\" for nth")
        );
        assert_eq!(
            text("write=eio@p:2").as_deref(),
            Some("probability 2 not in 0..1")
        );
        assert_eq!(
            EnvError(SpecError::UnknownOperation("disk".into())).to_string(),
            "NSQD_STORAGE_FAULTS: unknown operation \"disk\""
        );
    }

    #[test]
    #[cfg(feature = "fault-injection")]
    fn probability_is_seeded() {
        let run = |seed| {
            let f = Faults::parse(&format!("seed={seed},write=eio@p:0.3")).unwrap();
            (0..1000)
                .map(|_| f.next(Op::Write).is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        let hits = run(1).iter().filter(|h| **h).count();
        assert!((200..400).contains(&hits), "{hits}");
    }

    #[test]
    fn errors_keep_their_kind() {
        let e = crate::StoreError::io(error(Action::Enospc, Op::Write));
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(e.message().contains("No space left on device"), "{e}");
    }
}
