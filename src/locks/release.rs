//! Releasing a lease so that the outcome is known.
//!
//! Release is idempotent for one token: an absent lock answers `204`, so a
//! release whose answer was lost can be sent again. The one answer that
//! changes meaning on a retry is `409`: after an attempt whose outcome is
//! unknown, a `409` says the lock changed hands *after* that attempt freed
//! it, so the release is confirmed, not refused.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::time::Instant;

use super::lease::LockLease;
use super::Locks;
use crate::error::{Error, Result};
use crate::validate;

/// Attempts of a release the caller waits for.
pub(crate) const FOREGROUND_ATTEMPTS: usize = 3;
/// An attempt with less time than this left is not sent.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Failures worth another attempt: no answer, 429, and the 5xx statuses a
/// healthy service or proxy sends while it recovers. `InvalidResponse`
/// counts too: a success status was seen, so the request may have applied.
pub(crate) fn is_transient(err: &Error) -> bool {
    match err {
        Error::Transport(_) | Error::RateLimited(_) | Error::InvalidResponse(_) => true,
        Error::Server(api) => matches!(api.status(), Some(500 | 502 | 503 | 504)),
        _ => false,
    }
}

/// Releases `lease` with one fresh request id: at most `attempts`
/// attempts, all within `budget` and each within the client's timeout,
/// transient failures backed off with jitter. A `409` that follows an
/// attempt with an unknown outcome counts as released.
pub(crate) async fn confirmed(
    locks: &Locks,
    lease: &LockLease,
    budget: Duration,
    attempts: usize,
) -> Result<()> {
    let request_id = validate::new_uuid();
    let started = Instant::now();
    let per_attempt = locks.client().timeout();
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_jitter()
        .with_max_times(attempts.saturating_sub(1))
        .build();
    let mut uncertain = false;
    loop {
        let left = budget.saturating_sub(started.elapsed());
        let attempt = locks
            .release(lease)
            .request_id(request_id.clone())
            .timeout(left.min(per_attempt).max(MIN_ATTEMPT))
            .await;
        match attempt {
            Err(Error::Conflict(_)) if uncertain => {
                tracing::info!(
                    key = lease.key(),
                    request_id,
                    "release confirmed: an earlier attempt freed the lock before it changed hands"
                );
                return Ok(());
            }
            Err(err) if is_transient(&err) => {
                uncertain = true;
                match backoff.next() {
                    Some(wait) if started.elapsed() + wait + MIN_ATTEMPT < budget => {
                        tracing::info!(
                            key = lease.key(),
                            request_id,
                            error = %err,
                            "release failed; retrying"
                        );
                        tokio::time::sleep(wait).await;
                    }
                    _ => return Err(err),
                }
            }
            other => return other,
        }
    }
}

/// Hands a release of `lease` to the client's background releases, which
/// [`Client::shutdown`](crate::Client::shutdown) waits for. It keeps
/// trying transient failures for `live_for` (as long as the lease may still
/// be live: after that the service lets it go by itself), and at least for
/// one client timeout.
pub(crate) fn in_background(
    locks: &Locks,
    lease: LockLease,
    live_for: Duration,
    why: &'static str,
) {
    let key = lease.key().to_owned();
    let locks_for_task = locks.clone();
    locks.client().spawn_release(&key, async move {
        let budget = live_for.max(locks_for_task.client().timeout());
        match confirmed(&locks_for_task, &lease, budget, usize::MAX).await {
            Ok(()) => tracing::info!(key = lease.key(), why, "lock released in the background"),
            Err(err) => tracing::warn!(
                key = lease.key(),
                why,
                error = %err,
                "background release failed; the lease expires at its ttl"
            ),
        }
    });
}
