//! Every retry question answered in one place: which outcomes are worth
//! another attempt, how long to back off, whether an attempt still fits
//! its window, and every number of the policies that use them: when a
//! lease is renewed and how late its last attempt may go ([`renewal`]), how
//! hard a release tries ([`release`]), how a waiter paces its tries and
//! honours a 429 ([`wait`]). The transport (acquire's single retry),
//! releases, renewals and waiting acquires all ask here.
//!
//! | outcome | acquire | waiting acquire | renewal | release |
//! |---|---|---|---|---|
//! | no answer (connect, I/O, timeout) | once more | again | again, in the window | again, in the budget |
//! | no answer, timed by a paused runtime clock | no | stops | lost | refused |
//! | 503 | once more | again, after any `Retry-After` | again | again |
//! | 429 | no | again, after the window | again, in the window | again |
//! | 500, 502, 504 | no | again | again | again |
//! | a 2xx that is not a JSON object | once more | stops | again | again |
//! | 409 | no | waits | lost | refused (released, after an uncertain attempt) |
//! | 400, 401, 403, 404, others | no | stops | lost | refused |
//!
//! Trying again is safe because the idempotency material is fixed before
//! the first attempt: acquire's token and request id, release's request id.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::error::{Error, InvalidReason, TransportKind};

/// An attempt with less time than this left is not sent.
pub(crate) const MIN_ATTEMPT: Duration = Duration::from_millis(100);
/// How long past its own timeout a request is still counted as possibly
/// applied. An acquire whose outcome became unknown at `t` (its error, its
/// timeout, its future dropped) may still be applied until `t` plus its
/// request timeout plus this: held on its way, or by a gateway that
/// answered 503/504 and let it go on. The SDK undoes an acquire of a
/// generated token until then; with your own token, an acquire again with
/// it after then settles what the first did. A request applied later than
/// that (queued somewhere for longer than its client waited, and more) is
/// beyond what a client can bound.
pub const LATE_TRY_MARGIN: Duration = Duration::from_secs(2);

/// The longest a lock held through this SDK goes between two renewals
/// (a guard, `with_lock`, `hold`, a permit, a leader's term, `volcano
/// locks run`): renewals come at most 60 s apart, plus 10 % jitter. A
/// held key whose expiry has not moved for longer than this (on the
/// service's clock) has no live holder of this SDK renewing it, unless a
/// renewal is stuck in flight. `volcano locks diagnose` watches that long
/// at most.
pub const LONGEST_RENEWAL_INTERVAL: Duration = Duration::from_secs(66);
/// The first step of a backoff.
const BACKOFF_MIN: Duration = Duration::from_millis(100);

/// Worth another attempt by a renewal or a release: no answer, 429, the
/// 5xx statuses a healthy service or proxy sends while it recovers, and a
/// success status whose body could not be used (the request may have been
/// applied). Wider than [`Error::is_transient`], which leaves out the
/// unusable success: a caller cannot tell whether it was applied.
pub(crate) fn worth_another_attempt(err: &Error) -> bool {
    err.is_transient() || matches!(err, Error::InvalidResponse(_))
}

/// Failures after which acquire is sent once more, at once, byte for
/// byte: no answer at all, a 503 (ownership undecidable), or a success
/// status whose body is not a JSON object. Field-level problems are not
/// retried.
pub(crate) fn retries_acquire(err: &Error) -> bool {
    match err {
        Error::Transport(e) => e.kind != TransportKind::PausedClock,
        Error::Server(api) => api.status() == Some(503),
        Error::InvalidResponse(e) => e.reason() == InvalidReason::NotAnObject,
        Error::Conflict(_) => sabotaged!(RetryOn409),
        _ => false,
    }
}

/// Whether a retry's error may stand for the first attempt's unknown
/// outcome: only one just as uncertain (it may have been applied, and may
/// still land if the first may: the service's own 503 to the retry does
/// not stand for a first attempt a gateway let go on). Anything else (a
/// 429, a 401, a 409) answers the retry alone and says nothing of what the
/// first attempt did, or may still do: it may be held on its way and
/// applied later.
pub(crate) fn settles(first: &Error, retry: &Error) -> bool {
    sabotaged!(RetrySettlesAll)
        || (retry.may_have_applied() && (retry.may_land_late() || !first.may_land_late()))
}

/// What an acquire reports when its single retry failed with `retry`
/// after a first attempt that may have been applied (`first`): a `409`
/// stays a conflict (`is_lock_held()`), marked as coming after an attempt
/// that may have been applied; an error as uncertain as the first stands;
/// anything else gives way to the first attempt's error.
pub(crate) fn after_uncertain(first: Error, retry: Error) -> Error {
    if settles(&first, &retry) {
        return retry;
    }
    match retry {
        // Whether the first may still land, too: the service's own 503
        // leaves nothing on its way.
        retry @ Error::Conflict(_) => retry.after_uncertain_attempt(first.may_land_late()),
        _ => first,
    }
}

/// Whether a waiting acquire waits through this error rather than
/// returning it: the lock is held (409), or the error is transient (no
/// answer, 429, 500/502/503/504): the same token makes another try safe,
/// and a caller who asked to wait asked for exactly that.
pub(crate) fn waits_through(err: &Error) -> bool {
    matches!(err, Error::Conflict(_)) || err.is_transient()
}

/// The pauses of a [`backoff`], one per `next()`.
pub(crate) type Backoff = ExponentialBackoff;

/// Jittered exponential backoff from 100 ms up to `max`, for at most
/// `retries` more attempts (`None`: no limit).
pub(crate) fn backoff(max: Duration, retries: Option<usize>) -> Backoff {
    let builder = ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(max)
        .with_jitter()
        .with_jitter_seed(crate::random::u64());
    match retries {
        Some(n) => builder.with_max_times(n),
        None => builder.without_max_times(),
    }
    .build()
}

/// Whether an attempt with `left` before its window ends is worth sending.
pub(crate) fn fits(left: Duration) -> bool {
    left >= MIN_ATTEMPT
}

/// Renewal: when a held lease is renewed, and how its attempts are paced.
pub(crate) mod renewal {
    use std::time::Duration;

    /// The server needs a renewal more than this long before expiry.
    pub(crate) const SAFETY_MARGIN: Duration = Duration::from_secs(1);
    /// Time allowed for one renewal request to arrive.
    pub(crate) const REQUEST_BUDGET: Duration = Duration::from_secs(1);
    /// Renewals are never further apart than this.
    pub(crate) const MAX_DELAY: Duration = Duration::from_secs(60);
    /// Time a renewal keeps before the deadline for its retries, when the
    /// ttl leaves room for it: the first attempt comes at about half the
    /// ttl, or earlier to keep this much (ttl/3 at the earliest).
    pub(crate) const RETRY_ROOM: Duration = Duration::from_secs(10);
    /// A pause cut short to fit the window leaves the last attempt this
    /// long.
    pub(crate) const LAST_ATTEMPT: Duration = Duration::from_millis(500);
    /// The longest pause between a renewal's attempts
    /// ([`backoff`](super::backoff) from 100 ms).
    pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(2);
}

/// Release: how hard one release tries before it reports a failure.
pub(crate) mod release {
    use std::time::Duration;

    /// A release the caller waits for: this many attempts within one
    /// client timeout ...
    pub(crate) const FOREGROUND_ATTEMPTS: usize = 3;
    /// ... with pauses of at most this.
    pub(crate) const FOREGROUND_BACKOFF_MAX: Duration = Duration::from_secs(2);
    /// A release nobody waits for tries until the lease can no longer be
    /// live, backing off to this so that a struggling service is not
    /// hammered.
    pub(crate) const BACKGROUND_BACKOFF_MAX: Duration = Duration::from_secs(30);
}

/// Waiting for a held lock: the ramp of its tries, the look at the
/// takeover moment, 429s, and the deadline.
pub(crate) mod wait {
    use std::time::Duration;

    /// The shortest poll interval a caller may ask for.
    pub(crate) const POLL_MIN: Duration = Duration::from_millis(100);
    /// The interval between tries, as a share of the time waited so far: a
    /// release is noticed within that share of the wait.
    pub(crate) const RAMP_RATIO: f64 = 0.3;
    /// The interval between tries at the start of a wait (or the poll
    /// interval, if shorter).
    pub(crate) const RAMP_FLOOR: Duration = Duration::from_millis(300);
    /// The default poll interval: once its ramp has grown, a waiter tries
    /// about six times a minute, plus a look per holder's lease period
    /// (docs/benchmarks.md).
    pub(crate) const DEFAULT_POLL: Duration = Duration::from_secs(10);
    /// The longest poll interval used: a larger one (`Duration::MAX` for
    /// "do not poll") polls once a day.
    pub(crate) const MAX_POLL: Duration = Duration::from_secs(86_400);
    /// The service's takeover grace after `expires_at`.
    pub(crate) const TAKEOVER_GRACE: Duration = Duration::from_secs(1);
    /// A look comes this long after the takeover moment (the server's
    /// grace ends exactly there), plus up to [`LOOK_SPREAD`].
    pub(crate) const LOOK_AFTER: Duration = Duration::from_millis(100);
    /// See [`LOOK_AFTER`].
    pub(crate) const LOOK_SPREAD: Duration = Duration::from_millis(500);
    /// The longest `Retry-After` a waiter honours: the service's quota
    /// window is a minute; a proxy's maintenance answer may name hours,
    /// and a waiter should not sleep through the service's recovery. After
    /// a 429 the waiter pauses past the window it names, plus a jitter of
    /// up to one poll interval (so a fleet does not fire at the window's
    /// first second), then polls at the poll interval.
    pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
    /// How long past the deadline a try already in flight may take to
    /// answer.
    pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(2);
    /// How long before its deadline a waiter behind another of its client
    /// makes its one try of its own.
    pub(crate) const LAST_TRY_LEAD: Duration = Duration::from_millis(500);
    /// How long the tries of a wait fail without an answer (the service is
    /// unreachable or failing) before it is said at WARN, once per episode.
    pub(crate) const WARN_UNANSWERED_AFTER: Duration = Duration::from_secs(30);

    /// The ramp's interval, without jitter, `waited` into a wait.
    pub(crate) fn ramp(waited: Duration, poll_interval: Duration) -> Duration {
        waited
            .mul_f64(RAMP_RATIO)
            .max(RAMP_FLOOR)
            .min(poll_interval)
    }
}

/// Observing a key (`locks.observe(key)`): its cadence.
pub(crate) mod observe {
    use std::time::Duration;

    /// The default interval between looks: six a minute, 1 % of a
    /// 600/min project quota (the same as a waiter's poll interval).
    pub(crate) const DEFAULT_POLL: Duration = super::wait::DEFAULT_POLL;
    /// A lease seen when it could no longer be renewed (its last second,
    /// or its grace) gets a look this long after its expiry, past the
    /// grace, plus up to [`super::wait::LOOK_SPREAD`]: the moment it frees.
    pub(crate) const AFTER_GRACE: Duration = Duration::from_millis(1_100);
    /// A lease's last moments that a look missed (it still showed the
    /// lease as before) get another look this much later.
    pub(crate) const RETRY_LATE: Duration = Duration::from_secs(1);
    /// The longest pause after a failed look (a `Retry-After` is honoured
    /// up to this), before up to one poll interval of spread.
    pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(60);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16) -> Error {
        answer_with(status, None)
    }

    /// The service's own error envelope (its code), not a gateway's page.
    fn answer_with(status: u16, code: Option<&str>) -> Error {
        Error::from_status(crate::ApiError {
            status: Some(status),
            code: code.map(str::to_owned),
            message: String::new(),
            request_id: None,
            retry_after: None,
            after_uncertain: false,
            first_may_land_late: false,
            from_service: code.is_some(),
        })
    }

    #[test]
    fn the_table_holds() {
        for status in [429, 500, 502, 503, 504] {
            assert!(worth_another_attempt(&answer(status)), "{status}");
        }
        for status in [400, 401, 403, 404, 409, 501, 418] {
            assert!(!worth_another_attempt(&answer(status)), "{status}");
        }
        assert!(retries_acquire(&answer(503)));
        for status in [429, 500, 502, 504, 409] {
            assert!(!retries_acquire(&answer(status)), "{status}");
        }
        for status in [409, 429, 500, 502, 503, 504] {
            assert!(waits_through(&answer(status)), "{status}");
        }
        for status in [400, 401, 403, 404, 501, 418] {
            assert!(!waits_through(&answer(status)), "{status}");
        }
        let late = answer(503);
        assert!(settles(&late, &answer(503)) && settles(&late, &answer(504)));
        for status in [409, 429, 401] {
            assert!(!settles(&late, &answer(status)), "{status}");
        }
        // The service's own 503 does not stand for a first attempt that
        // may still land; it does for one that cannot.
        let own = answer_with(503, Some("lock_service_unavailable"));
        assert!(!settles(&late, &own) && settles(&own, &late) && settles(&own, &own));
        let conflict = after_uncertain(answer(503), answer(409));
        assert!(conflict.is_lock_held() || conflict.status() == Some(409));
        assert!(conflict.may_have_been_applied(), "{conflict:?}");
        assert_eq!(
            after_uncertain(answer(503), answer(429)).status(),
            Some(503)
        );
        assert_eq!(
            after_uncertain(answer(503), answer(504)).status(),
            Some(504)
        );
        assert!(fits(MIN_ATTEMPT) && !fits(MIN_ATTEMPT - Duration::from_millis(1)));
    }

    #[test]
    fn backoff_grows_to_its_cap_and_stops_when_told() {
        let steps: Vec<Duration> = backoff(Duration::from_secs(2), Some(3)).collect();
        assert_eq!(steps.len(), 3);
        assert!(
            steps.iter().all(|d| *d <= Duration::from_secs(4)),
            "{steps:?}"
        );
        assert!(backoff(Duration::from_secs(2), None).take(50).count() == 50);
    }
}
