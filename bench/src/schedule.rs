//! Open-loop publish pacing: a piecewise-constant rate over time (`--rate` is one phase;
//! `--rate-schedule 10s@400000,20s@100000` is a burst and then a lower rate).

use std::time::Duration;

/// Phases of (length, msgs/s), from the start of publishing. After the last phase the
/// last rate continues.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    phases: Vec<(Duration, f64)>,
}

impl Schedule {
    /// One rate for ever.
    pub fn constant(rate: f64) -> Schedule {
        Schedule {
            phases: vec![(Duration::from_secs(1 << 40), rate)],
        }
    }

    /// `DUR@RATE[,DUR@RATE...]` with Go durations and rates in msgs/s (> 0), e.g.
    /// `10s@400000,20s@100000`.
    // A `String` error: CLI-only, printed once before the bench exits.
    pub fn parse(s: &str) -> Result<Schedule, String> {
        let mut phases = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (d, r) = part
                .split_once('@')
                .ok_or_else(|| format!("rate schedule phase {part:?}: want DURATION@RATE"))?;
            let d = crate::args::parse_duration(d)?;
            let r: f64 = r
                .trim()
                .parse()
                .map_err(|_| format!("rate schedule phase {part:?}: bad rate"))?;
            if d.is_zero() || !(r > 0.0 && r.is_finite()) {
                return Err(format!(
                    "rate schedule phase {part:?}: duration and rate must be > 0"
                ));
            }
            phases.push((d, r));
        }
        if phases.is_empty() {
            return Err("empty rate schedule".into());
        }
        Ok(Schedule { phases })
    }

    /// Sum of the phases' lengths.
    pub fn total(&self) -> Duration {
        self.phases.iter().map(|(d, _)| *d).sum()
    }

    /// When the last phase starts (zero with one phase).
    pub fn last_phase_start(&self) -> Duration {
        self.total() - self.phases.last().map(|(d, _)| *d).unwrap_or_default()
    }

    /// Rate of the last phase, msgs/s.
    pub fn last_rate(&self) -> f64 {
        self.phases.last().map(|(_, r)| *r).unwrap_or(0.0)
    }

    /// Number of phases.
    pub fn len(&self) -> usize {
        self.phases.len()
    }

    /// Messages due by `t` after the start (fractional).
    pub fn due(&self, t: Duration) -> f64 {
        let mut left = t.as_secs_f64();
        let mut n = 0.0;
        for (i, (d, r)) in self.phases.iter().enumerate() {
            let d = d.as_secs_f64();
            if left <= d || i + 1 == self.phases.len() {
                return n + left * r;
            }
            n += d * r;
            left -= d;
        }
        n
    }

    /// The time after the start at which `n` messages are due.
    pub fn time_of(&self, n: f64) -> Duration {
        let mut left = n;
        let mut t = 0.0;
        for (i, (d, r)) in self.phases.iter().enumerate() {
            let in_phase = d.as_secs_f64() * r;
            if left <= in_phase || i + 1 == self.phases.len() {
                return Duration::from_secs_f64(t + left / r);
            }
            left -= in_phase;
            t += d.as_secs_f64();
        }
        Duration::from_secs_f64(t)
    }

    /// The same schedule with every rate multiplied by `f` (one producer's share).
    pub fn scaled(&self, f: f64) -> Schedule {
        Schedule {
            phases: self.phases.iter().map(|&(d, r)| (d, r * f)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_accumulate_and_invert() {
        let s = Schedule::parse("10s@400, 20s@100").unwrap();
        assert_eq!(s.total(), Duration::from_secs(30));
        assert_eq!(s.last_phase_start(), Duration::from_secs(10));
        assert_eq!(s.last_rate(), 100.0);
        assert_eq!(s.due(Duration::from_secs(5)), 2000.0);
        assert_eq!(s.due(Duration::from_secs(10)), 4000.0);
        assert_eq!(s.due(Duration::from_secs(12)), 4200.0);
        // The last rate continues after the end.
        assert_eq!(s.due(Duration::from_secs(40)), 4000.0 + 3000.0);
        assert_eq!(s.time_of(2000.0), Duration::from_secs(5));
        assert_eq!(s.time_of(4200.0), Duration::from_secs(12));
        assert_eq!(s.scaled(0.5).due(Duration::from_secs(10)), 2000.0);
        let c = Schedule::constant(5000.0);
        assert_eq!(c.due(Duration::from_secs(2)), 10_000.0);
        assert_eq!(c.time_of(5000.0), Duration::from_secs(1));
    }

    #[test]
    fn bad_schedules() {
        assert!(Schedule::parse("").is_err());
        assert!(Schedule::parse("10s").is_err());
        assert!(Schedule::parse("10s@0").is_err());
        assert!(Schedule::parse("0s@10").is_err());
        assert!(Schedule::parse("10x@10").is_err());
    }
}
