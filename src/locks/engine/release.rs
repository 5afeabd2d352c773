//! Releasing a lease so that the outcome is known.
//!
//! Release is idempotent for one token: an absent lock answers `204`, so a
//! release whose answer was lost can be sent again. The one answer that
//! changes meaning on a retry is `409`: after an attempt that may have been
//! applied, a `409` says the lock changed hands *after* that attempt freed
//! it, so the release is confirmed, not refused.
//!
//! Releases the caller does not wait for (a cancelled scope, a final
//! release that kept failing, an acquire being undone) run in the
//! background, registered with the client so that `Client::shutdown` can
//! wait for them. They keep trying while the lease may still be live, and
//! stop as soon as an acquire with the same token supersedes them.
//!
//! The releases that wait out a late try's window are in
//! `release/late.rs`.

mod late;

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::requests;
use crate::background::Settled;
use crate::error::Error;
use crate::lease::LockLease;
use crate::locks::{Locks, RequestOptions};
use crate::retry;
use crate::validate;

pub(crate) use late::{kept_sweep, sweep, undo, Bounds as KeptBounds};

/// How hard one release tries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Persistence {
    /// All attempts and pauses fit in this.
    budget: Duration,
    attempts: usize,
    max_backoff: Duration,
}

impl Persistence {
    /// A release the caller waits for: three attempts within one client
    /// timeout.
    pub(crate) fn foreground(locks: &Locks) -> Self {
        Persistence {
            budget: locks.client().timeout(),
            attempts: retry::release::FOREGROUND_ATTEMPTS,
            max_backoff: retry::release::FOREGROUND_BACKOFF_MAX,
        }
    }

    /// A release nobody waits for: attempts until the lease can no longer
    /// be live (`live_for`, at least one client timeout), backing off to
    /// 30 s so that a struggling service is not hammered.
    pub(crate) fn background(locks: &Locks, live_for: Duration) -> Self {
        Persistence {
            budget: live_for.max(locks.client().timeout()),
            attempts: usize::MAX,
            max_backoff: retry::release::BACKGROUND_BACKOFF_MAX,
        }
    }
}

/// How a release that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Released (or found released by an earlier attempt).
    Released,
    /// Stopped by an acquire with the same token before it was confirmed:
    /// that acquire decides what the lease is now.
    Superseded,
}

/// A release that failed: the last answer, and whether it answered the
/// first attempt (sent at once, with no pause before it).
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) err: Error,
    pub(crate) first_attempt: bool,
}

/// Releases `lease` with one fresh request id: attempts each within the
/// client's timeout, transient failures backed off with jitter (and at
/// least `Retry-After`), all within the budget. A `409` that follows an
/// attempt that may have been applied counts as released. Once
/// `superseded` turns `true`, no further attempt is sent.
pub(crate) async fn confirmed(
    locks: &Locks,
    lease: &LockLease,
    persistence: Persistence,
    mut superseded: Option<watch::Receiver<bool>>,
) -> std::result::Result<Ended, Failed> {
    let request_id = validate::new_uuid();
    let started = Instant::now();
    let budget = persistence.budget;
    let per_attempt = locks.client().timeout();
    let mut backoff = retry::backoff(
        persistence.max_backoff,
        Some(persistence.attempts.saturating_sub(1)),
    );
    let mut uncertain = false;
    let mut first_attempt = true;
    loop {
        if superseded.as_ref().is_some_and(|s| *s.borrow()) {
            tracing::debug!(key = lease.key(), "release superseded by a new acquire");
            return Ok(Ended::Superseded);
        }
        let left = budget.saturating_sub(started.elapsed());
        let options = RequestOptions {
            request_id: Some(request_id.clone()),
            timeout: Some(left.min(per_attempt).max(retry::MIN_ATTEMPT)),
        };
        let attempt = requests::release(locks, lease, &options).await;
        let failed = |err| Failed { err, first_attempt };
        let err = match attempt {
            Ok(()) => return Ok(Ended::Released),
            Err(Error::Conflict(_)) if uncertain => {
                tracing::debug!(
                    key = lease.key(),
                    request_id,
                    "release confirmed: an earlier attempt freed the lock before it changed hands"
                );
                return Ok(Ended::Released);
            }
            Err(err) if retry::worth_another_attempt(&err) => err,
            Err(err) => return Err(failed(err)),
        };
        uncertain |= err.may_have_applied();
        let wait = match backoff.next() {
            Some(wait) => wait.max(err.retry_after().unwrap_or_default()),
            None => return Err(failed(err)),
        };
        let left_then = budget.saturating_sub(started.elapsed().saturating_add(wait));
        if !retry::fits(left_then) {
            return Err(failed(err));
        }
        first_attempt = false;
        tracing::warn!(
            key = lease.key(),
            request_id,
            error = %crate::error::chain(&err),
            retry_in_ms = wait.as_millis() as u64,
            "release failed; retrying"
        );
        pause(wait, superseded.as_mut()).await;
    }
}

/// Sleeps `wait`, or less if an acquire with the same token supersedes the
/// release meanwhile.
async fn pause(wait: Duration, superseded: Option<&mut watch::Receiver<bool>>) {
    match superseded {
        Some(superseded) => {
            tokio::select! {
                biased;
                _ = tokio::time::sleep(wait) => {}
                _ = superseded.wait_for(|s| *s) => {}
            }
        }
        None => tokio::time::sleep(wait).await,
    }
}

/// How letting go of a lease ended.
#[derive(Debug)]
pub(crate) enum LetGo {
    /// Released: this token holds the lock no more.
    Freed,
    /// Answered `409`: another token holds the lock, so nothing of this
    /// token's was left to release (it lapsed or was taken while held).
    /// `at_once`: the `409` answered the first attempt, sent as soon as
    /// the lease was let go of (no pause in which it could have lapsed).
    NotOurs { conflict: Error, at_once: bool },
    /// Not freed: still being tried in the background (a transient
    /// failure), or refused and recorded for `Client::shutdown`. The error
    /// is the last answer.
    NotFreed(Error),
}

/// The one release policy for a lease this client holds and lets go of,
/// whoever lets go (a held lock, a scope, a set, a leader's term): three
/// attempts within one client timeout; after a transient failure the
/// release goes on in the background; after a refusal (`401`, `403`,
/// `400`, ...) the lease is recorded as possibly held, so that
/// `Client::shutdown` names it whatever the caller does with the error.
/// `live_for` is how long the server may still keep the lease, at most.
pub(crate) async fn let_go(locks: &Locks, lease: &LockLease, live_for: Duration) -> LetGo {
    let persistence = Persistence::foreground(locks);
    let err = match confirmed(locks, lease, persistence, None).await {
        Ok(_) => return LetGo::Freed,
        Err(Failed {
            err: conflict @ Error::Conflict(_),
            first_attempt,
        }) => {
            return LetGo::NotOurs {
                conflict,
                at_once: first_attempt,
            }
        }
        Err(Failed { err, .. }) => err,
    };
    if retry::worth_another_attempt(&err) {
        in_background(
            locks,
            lease.clone(),
            live_for,
            "release failed; still trying",
        );
    } else if !sabotaged!(DropRefusedRelease) {
        tracing::warn!(
            key = lease.key(),
            fencing_token = lease.fencing_token(),
            error = %crate::error::chain(&err),
            "release refused; the lease may stay held until its ttl (Client::shutdown names it)"
        );
        locks.client().background().unreleased(
            lease.key(),
            lease.token(),
            Instant::now().checked_add(live_for),
        );
    }
    LetGo::NotFreed(err)
}

/// Hands a release of `lease` to the client's background releases, which
/// [`Client::shutdown`](crate::Client::shutdown) waits for; it keeps trying
/// for `live_for`, the longest the lease may still be live. A `409` means
/// another token holds the lock: this token's lease is gone (it lapsed, or
/// the acquire being undone never took), so there is nothing to release.
pub(crate) fn in_background(
    locks: &Locks,
    lease: LockLease,
    live_for: Duration,
    why: &'static str,
) {
    let persistence = Persistence::background(locks, live_for);
    spawn(locks, lease, live_for, move |locks, lease, superseded| {
        Box::pin(async move {
            let ended = confirmed(&locks, &lease, persistence, Some(superseded)).await;
            settled(ended, &lease, why)
        })
    });
}

/// Hands `body` (the releases of `lease`, given the client's locks, the
/// lease and the superseded signal) to the client's background releases,
/// registered for `live_for`.
fn spawn<F>(locks: &Locks, lease: LockLease, live_for: Duration, body: F)
where
    F: FnOnce(Locks, LockLease, watch::Receiver<bool>) -> crate::BoxFuture<Settled>,
{
    let task_locks = locks.clone();
    let (key, token) = (lease.key().to_owned(), lease.token().to_owned());
    locks
        .client()
        .background()
        .spawn_release(&key, &token, live_for, move |superseded| {
            body(task_locks, lease, superseded)
        });
}

/// How a background release's end counts for `Client::shutdown`.
fn settled(ended: std::result::Result<Ended, Failed>, lease: &LockLease, why: &str) -> Settled {
    match ended {
        Ok(Ended::Released) => {
            tracing::debug!(key = lease.key(), why, "lock released in the background");
            Settled::Freed
        }
        // The acquire that stopped it decides: until it holds the lease
        // again, the lease may still be live.
        Ok(Ended::Superseded) => Settled::MayBeHeld,
        Err(Failed {
            err: Error::Conflict(_),
            ..
        }) => {
            tracing::debug!(
                key = lease.key(),
                why,
                "another token holds the lock: nothing of ours to release"
            );
            Settled::Freed
        }
        Err(Failed { err, .. }) => {
            tracing::warn!(
                key = lease.key(),
                why,
                error = %crate::error::chain(&err),
                "background release failed; the lease expires at its ttl"
            );
            Settled::MayBeHeld
        }
    }
}
