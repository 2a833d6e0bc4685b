//! Logging an error that may repeat thousands of times a second (a full disk under
//! load, a listener out of descriptors) without flooding the log.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// How often [`RepeatLog`] logs an error that keeps repeating.
pub const REPEAT_LOG_EVERY: Duration = Duration::from_secs(1);

/// Logs an error at once when it is new, then at most once per [`REPEAT_LOG_EVERY`]
/// while the same one repeats, with the count of repeats since the last line.
#[derive(Default)]
pub struct RepeatLog {
    /// When the error was last logged, and how many times it repeated since.
    logged: Cell<Option<(Instant, u64)>>,
}

impl RepeatLog {
    /// Logs `line` at error level; `same` says whether it is the error logged last.
    pub fn error(&self, same: bool, line: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        match self.logged.get() {
            Some((at, repeats)) if same && now.duration_since(at) < REPEAT_LOG_EVERY => {
                self.logged.set(Some((at, repeats + 1)));
            }
            Some((_, repeats)) if same && repeats > 0 => {
                log::error!("{line} (and {repeats} times more in the last second or so)");
                self.logged.set(Some((now, 0)));
            }
            _ => {
                log::error!("{line}");
                self.logged.set(Some((now, 0)));
            }
        }
    }
}
