//! Waiting for a held lock: `locks.acquire(key, ttl).wait(timeout)`.
//!
//! Between tries the waiter sleeps until the holder's lease can be taken
//! over (its `expires_at` + 1 s grace, learned with one `get` and read again
//! only once that moment has passed) or for a jittered poll interval that
//! grows from 100 ms to 1 s, whichever is sooner, and never past the
//! caller's timeout. A long waiter therefore sends at most about 60
//! acquires a minute plus one `get` per holder expiry it outlives.
//!
//! Uncertain outcomes end in a known state. No try (nor acquire's single
//! retry, nor a `get`) starts after the deadline. A try still in flight at
//! the deadline gets [`ANSWER_GRACE`] more to answer: a late `201` is
//! returned as the lease. If no answer comes, the acquire may have been
//! applied: the wait returns that try's error (`Error::Transport`), never
//! an older `409`. With a generated token the SDK also undoes the try with
//! a release (the caller could never name that token); with the caller's
//! own token the caller recovers by acquiring again with it. A timeout too
//! large to represent (`Duration::MAX`) waits forever.

use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use crate::error::Error;

/// First poll interval.
pub(crate) const POLL_MIN: Duration = Duration::from_millis(100);
/// Longest poll interval: bounds how late a released lock is noticed and
/// how many requests a waiter sends (about 60 acquires a minute).
pub(crate) const POLL_MAX: Duration = Duration::from_secs(1);
/// The service's takeover grace after `expires_at`.
const TAKEOVER_GRACE: Duration = Duration::from_secs(1);
/// The longest `Retry-After` a waiter honours: the service's quota window
/// is a minute; a proxy's maintenance answer may name hours, and a waiter
/// should not sleep through the service's recovery.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A server's `Retry-After`, within [`MAX_RETRY_AFTER`].
fn retry_after(after: Duration) -> Duration {
    after.min(MAX_RETRY_AFTER)
}

/// How long past the deadline a try already in flight may take to answer.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// When a try may start and by when its answer is due; unbounded by
/// default (a plain acquire).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    pub(crate) send_by: Option<Instant>,
    pub(crate) answer_by: Option<Instant>,
}

/// What the waiter does after a failed try.
pub(crate) enum Step {
    /// Try again after this pause; `learn_holder` asks for a `get` first.
    Retry { pause: Duration, learn_holder: bool },
    /// Stop and return this error.
    Stop(Error),
}

/// The state of one waiting acquire.
pub(crate) struct Waiter {
    /// `None`: the timeout is too large to represent; wait forever.
    deadline: Option<Instant>,
    poll: Duration,
    /// When the known holder's lease can be taken over (local time).
    holder_free_at: Option<Instant>,
    /// The newest `409`: what a timed-out wait returns.
    last_conflict: Option<Error>,
    /// The newest other error worth waiting through (429, 503, transport).
    last_other: Option<Error>,
    /// The newest try whose outcome is unknown, while no later `409`
    /// showed it did not take.
    last_uncertain: Option<Error>,
}

impl Waiter {
    pub(crate) fn new(timeout: Duration) -> Self {
        Waiter {
            deadline: Instant::now().checked_add(timeout),
            poll: POLL_MIN,
            holder_free_at: None,
            last_conflict: None,
            last_other: None,
            last_uncertain: None,
        }
    }

    /// Time left before the caller's timeout (`Duration::MAX`: no deadline).
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }

    /// The bounds of the next try: started before the deadline, answered
    /// within the grace after it.
    pub(crate) fn window(&self) -> Window {
        Window {
            send_by: self.deadline,
            answer_by: self.deadline.and_then(|d| d.checked_add(ANSWER_GRACE)),
        }
    }

    /// Decides what follows a failed try.
    pub(crate) fn after(&mut self, err: Error) -> Step {
        let now = Instant::now();
        let poll = self.next_poll();
        let (pause, learn_holder) = match &err {
            Error::Conflict(_) => {
                // The lock is someone else's (or our lapsed lease's): no
                // earlier try of ours holds it.
                self.last_uncertain = None;
                let until_free = self.holder_free_at.filter(|t| *t > now).map(|t| t - now);
                self.last_conflict = Some(err);
                (
                    until_free.map_or(poll, |u| u.min(poll)),
                    until_free.is_none(),
                )
            }
            Error::RateLimited(_) => {
                let pause = err.retry_after().map_or(poll, retry_after).max(poll);
                self.last_other = Some(err);
                (pause, false)
            }
            // The same token makes another try safe; a 503 may name when
            // (`Retry-After`), as a 429 does.
            _ if err.is_transport() || err.status() == Some(503) => {
                let pause = err.retry_after().map_or(poll, retry_after).max(poll);
                if err.may_have_applied() {
                    self.last_uncertain = Some(err);
                } else {
                    self.last_other = Some(err);
                }
                (pause, false)
            }
            _ => return Step::Stop(err),
        };
        match self.timed_out() {
            Some(err) => Step::Stop(err),
            None => Step::Retry {
                pause: pause.min(self.remaining()),
                learn_holder,
            },
        }
    }

    /// Once the timeout has passed: the error to return (the last conflict
    /// if there was one, so `is_lock_held()` stays true).
    pub(crate) fn timed_out(&mut self) -> Option<Error> {
        if self.deadline.is_none_or(|d| Instant::now() < d) {
            return None;
        }
        self.last_uncertain
            .take()
            .or_else(|| self.last_conflict.take())
            .or_else(|| self.last_other.take())
    }

    /// Records what `get` said about the holder: when its lease can be
    /// taken over, as a local instant. Clock skew only costs a poll.
    pub(crate) fn holder(&mut self, held: bool, expires_at: Option<chrono::DateTime<Utc>>) {
        let now = Instant::now();
        self.holder_free_at = match (held, expires_at) {
            (false, _) => Some(now),
            (true, Some(expires_at)) => {
                let left = (expires_at - Utc::now()).to_std().unwrap_or_default();
                // A holder far in the future is as good as unknown: poll.
                now.checked_add(left.saturating_add(TAKEOVER_GRACE))
            }
            (true, None) => None,
        };
    }

    /// The next poll interval: ±20 % jitter, growing by half up to 1 s.
    fn next_poll(&mut self) -> Duration {
        let base = self.poll;
        self.poll = (self.poll * 3 / 2).min(POLL_MAX);
        base.mul_f64(0.8 + 0.4 * rand::random::<f64>())
    }
}
