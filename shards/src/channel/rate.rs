//! A channel's rate limit (beyond nsqd; `POST /channel/rate-limit`): a token bucket that
//! paces delivery on the channel to `msgs_per_sec` across all its consumers. Messages
//! wait in the channel (nothing is dropped); the bucket holds at most a tenth of a
//! second's worth of tokens (at least one), so a burst after an idle spell is at most
//! that many messages and the rate over any second stays within about 10 % of the
//! limit. When delivery stops for want of a token, the channel registers the instant
//! the next one is back in its shard's timer queue (see [`Channel::next_timer`]), and
//! the timer pass delivers again.

use super::Channel;
use std::time::{Duration, Instant};

/// The token bucket of one channel.
#[derive(Default)]
pub(super) struct RateLimit {
    /// Messages a second; 0 = not limited.
    per_sec: u32,
    /// Tokens available (fractions accumulate between deliveries).
    tokens: f64,
    /// When `tokens` was last brought up to date; `None` before the first delivery (the
    /// bucket then starts full).
    refilled: Option<Instant>,
    /// Set when delivery stopped for want of a token: when the next one is back.
    resume_at: Option<Instant>,
}

impl RateLimit {
    /// The most tokens the bucket holds: a tenth of a second's worth, at least one.
    fn burst(&self) -> f64 {
        (f64::from(self.per_sec) / 10.0).max(1.0)
    }

    /// Takes a token for one delivery at `now`; false (and `resume_at` set) when none is
    /// left. Always true without a limit.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        if self.per_sec == 0 {
            return true;
        }
        let rate = f64::from(self.per_sec);
        match self.refilled {
            None => self.tokens = self.burst(),
            Some(last) => {
                let dt = now.saturating_duration_since(last).as_secs_f64();
                self.tokens = (self.tokens + dt * rate).min(self.burst());
            }
        }
        self.refilled = Some(self.refilled.map_or(now, |last| last.max(now)));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        let wait = Duration::from_secs_f64((1.0 - self.tokens) / rate);
        self.resume_at = Some(now + wait.max(Duration::from_micros(1)));
        false
    }

    /// Gives back the token of a delivery that did not happen.
    pub(super) fn give_back(&mut self) {
        if self.per_sec > 0 {
            self.tokens = (self.tokens + 1.0).min(self.burst());
        }
    }

    /// When delivery may resume, if it stopped for want of a token.
    pub(super) fn resume_at(&self) -> Option<Instant> {
        self.resume_at
    }

    /// The timer pass at `now`: true when delivery stopped for a token and may resume.
    pub(super) fn resume_due(&mut self, now: Instant) -> bool {
        if self.resume_at.is_some_and(|at| at <= now) {
            self.resume_at = None;
            return true;
        }
        false
    }
}

impl Channel {
    /// The channel's rate limit in messages a second (`POST /channel/rate-limit`), `None`
    /// when it has none.
    pub fn rate_limit(&self) -> Option<u32> {
        let r = self.limits.rate.per_sec;
        (r > 0).then_some(r)
    }

    /// Limits delivery on this channel to `per_sec` messages a second across its
    /// consumers (0 removes the limit). The bucket starts full. Call `dispatch` after it:
    /// a removed limit delivers at once what was waiting.
    pub fn set_rate_limit(&mut self, per_sec: u32) {
        self.limits.rate = RateLimit {
            per_sec,
            ..RateLimit::default()
        };
    }
}
