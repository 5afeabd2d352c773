//! Every retry question answered in one place: which outcomes are worth
//! another attempt, how long to back off, and whether an attempt still
//! fits its window. The transport (acquire's single retry), releases,
//! renewals and waiting acquires all ask here.
//!
//! | outcome | acquire | waiting acquire | renewal | release |
//! |---|---|---|---|---|
//! | no answer (connect, I/O, timeout) | once more | again | again, in the window | again, in the budget |
//! | no answer, timed by a paused runtime clock | no | stops | lost | refused |
//! | 503 | once more | again, after any `Retry-After` | again | again |
//! | 429 | no | again, after the window | again, in the window | again |
//! | 500, 502, 504 | no | stops | again | again |
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
/// The first step of a backoff.
const BACKOFF_MIN: Duration = Duration::from_millis(100);

/// Worth another attempt by a renewal or a release: no answer, 429, the
/// 5xx statuses a healthy service or proxy sends while it recovers, and a
/// success status whose body could not be used (the request may have been
/// applied).
pub(crate) fn is_transient(err: &Error) -> bool {
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
        _ => false,
    }
}

/// Whether a retry's error tells the caller where ownership stands (a 409,
/// or an outcome just as uncertain as the first attempt's); otherwise the
/// first attempt's unknown outcome stands.
pub(crate) fn settles(err: &Error) -> bool {
    matches!(err, Error::Conflict(_)) || err.may_have_applied()
}

/// Whether a waiting acquire waits through this error rather than
/// returning it: the lock is held (409), the quota is spent (429), or the
/// try may be made again with the same token (no answer, 503).
pub(crate) fn waits_through(err: &Error) -> bool {
    matches!(err, Error::Conflict(_) | Error::RateLimited(_))
        || err.is_transient() && err.is_transport()
        || err.status() == Some(503)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16) -> Error {
        Error::from_status(crate::ApiError {
            status: Some(status),
            code: None,
            message: String::new(),
            request_id: None,
            retry_after: None,
        })
    }

    #[test]
    fn the_table_holds() {
        for status in [429, 500, 502, 503, 504] {
            assert!(is_transient(&answer(status)), "{status}");
        }
        for status in [400, 401, 403, 404, 409, 501, 418] {
            assert!(!is_transient(&answer(status)), "{status}");
        }
        assert!(retries_acquire(&answer(503)));
        for status in [429, 500, 502, 504, 409] {
            assert!(!retries_acquire(&answer(status)), "{status}");
        }
        for status in [409, 429, 503] {
            assert!(waits_through(&answer(status)), "{status}");
        }
        for status in [400, 401, 403, 500, 502, 504] {
            assert!(!waits_through(&answer(status)), "{status}");
        }
        assert!(settles(&answer(409)) && settles(&answer(503)));
        assert!(!settles(&answer(429)) && !settles(&answer(401)));
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
