//! How long a waiter pauses: the ramp on the time waited, the spread past
//! a window the server named (a 429's, the client's quota), and the aim at
//! a known holder's takeover moment.

use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::{Then, Waiter};
use crate::retry::wait::{
    ramp, LOOK_AFTER, LOOK_SPREAD, MAX_RETRY_AFTER, POLL_MIN, TAKEOVER_GRACE,
};

impl Waiter {
    /// With the holder known and not yet free: try again after a ramp
    /// step (an early release), or, if the takeover moment comes first,
    /// sleep to it and look again. `None` when the holder is unknown or
    /// past its takeover moment.
    pub(super) fn toward_the_holder(&mut self) -> Option<(Duration, Then)> {
        let now = Instant::now();
        let free_at = self.holder_free_at.take().filter(|t| *t > now)?;
        self.holder_free_at = Some(free_at);
        let until_free = free_at - now;
        let step = self.ramp();
        // A standby would rather look a little later than try and look.
        let reach = if self.deadline.is_none() { 1.5 } else { 1.0 };
        Some(if until_free <= step.mul_f64(reach) {
            (until_free, Then::LookAtHolder)
        } else {
            (step, Then::Acquire)
        })
    }

    /// Records what `get` said about the holder: when its lease can be
    /// taken over, as a local instant. The time left is read on the
    /// server's clock alone (`expires_at` minus the answer's `Date`), so
    /// skew between the clocks does not enter; only without a `Date` is
    /// this machine's clock used. The look comes a moment after the grace,
    /// spread a little so that a fleet does not look in one burst. Held
    /// with no expiry (or one too far ahead to represent) is unknown.
    pub(super) fn holder(
        &mut self,
        held: bool,
        expires_at: Option<chrono::DateTime<Utc>>,
        date: Option<chrono::DateTime<Utc>>,
    ) {
        let now = Instant::now();
        self.holder_free_at = match (held, expires_at) {
            (false, _) => Some(now),
            (true, Some(expires_at)) => {
                let server_now = date.unwrap_or_else(Utc::now);
                let left = (expires_at - server_now).to_std().unwrap_or_default();
                let spread = LOOK_SPREAD.mul_f64(crate::random::unit());
                now.checked_add(left.saturating_add(TAKEOVER_GRACE + LOOK_AFTER + spread))
            }
            (true, None) => None,
        };
    }

    /// The pause until the client's quota window (`quiet`, named by a 429
    /// to another of its requests) has passed, spread by up to one poll
    /// interval; from then on this waiter, too, stops ramping.
    pub(crate) fn until_quota(&mut self, quiet: Instant) -> Duration {
        self.throttled = true;
        let spread = self.poll_interval.min(MAX_RETRY_AFTER);
        quiet.saturating_duration_since(Instant::now()) + spread.mul_f64(crate::random::unit())
    }

    /// A pause past a server-named window (`Retry-After`, at most
    /// [`MAX_RETRY_AFTER`]), spread by up to one poll interval.
    pub(super) fn spread(&self, retry_after: Option<Duration>) -> Duration {
        let after = retry_after.map_or(POLL_MIN, |a| a.min(MAX_RETRY_AFTER));
        let spread = self.poll_interval.min(MAX_RETRY_AFTER);
        after + spread.mul_f64(crate::random::unit())
    }

    /// The pause before the next try: [`RAMP_RATIO`](crate::retry::wait::RAMP_RATIO) of the time waited,
    /// within [[`RAMP_FLOOR`](crate::retry::wait::RAMP_FLOOR), poll interval], jittered down by up to a
    /// tenth while it grows (never up: the pause is the longest a release
    /// goes unseen), ±5 % once at the poll interval.
    /// A wait without a deadline (a leader's campaign, a standby) polls
    /// at the poll interval from the start: a fleet of candidates starting
    /// together would otherwise spend most of the project's quota in its
    /// first minute. So does a waiter that was refused with 429.
    pub(super) fn ramp(&self) -> Duration {
        if sabotaged!(WaiterSpins) {
            return Duration::from_millis(20);
        }
        let u = crate::random::unit();
        match self.deadline {
            Some(_) if !self.throttled && !sabotaged!(NoRamp) => {
                let step = ramp(self.started.elapsed(), self.poll_interval);
                if step < self.poll_interval {
                    step.mul_f64(1.0 - 0.1 * u)
                } else {
                    // At the poll interval, ±5 %: a try every interval on
                    // average (not a tenth more often).
                    step.mul_f64(0.95 + 0.1 * u)
                }
            }
            // ±10 %: a fleet's tries spread out.
            _ => self.poll_interval.mul_f64(0.9 + 0.2 * u),
        }
    }
}
