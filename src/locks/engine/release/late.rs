//! Releases after a late try's window: an acquire undone ([`undo`]), and a
//! lease let go of (or kept for a minimum) while a try of the acquire that
//! granted it may still land ([`sweep`], [`kept_sweep`]).

use std::time::Duration;

use tokio::time::Instant;

use super::{confirmed, settled, spawn, Ended, Persistence};
use crate::background::Settled;
use crate::error::Error;
use crate::lease::LockLease;
use crate::locks::Locks;

/// Undoes an acquisition with a token the SDK generated, whose outcome is
/// unknown: releases at once (a try that already landed frees the key for
/// the next holder now), then again once no try can land any more
/// (`land_by`): a try held in the network, or behind a gateway that
/// answered 503/504 and let it go on, may be applied after the first
/// release, and would hold the key for `ttl` under a token nobody can
/// name. The undo stays registered with the client until the second
/// release is answered, so [`Client::shutdown`](crate::Client::shutdown)
/// names the key until then.
pub(crate) fn undo(locks: &Locks, lease: LockLease, land_by: Instant, ttl: Duration) {
    until_no_try_lands(
        locks,
        lease,
        true,
        land_by,
        ttl,
        "undo an acquire whose outcome is unknown",
    );
}

/// A lease of a generated token, released (or found another's) while a
/// try of the acquisition that granted it may still land: one more
/// release once none can (`land_by`), so that such a try does not hold the
/// key for `ttl` after the lease was let go of.
pub(crate) fn sweep(locks: &Locks, lease: LockLease, land_by: Instant, ttl: Duration) {
    until_no_try_lands(
        locks,
        lease,
        false,
        land_by,
        ttl,
        "release again once a late try of the acquire can no longer land",
    );
}

/// A lease handed to the service for a minimum hold (kept until
/// `kept_until`, not released) while a request may still land (`land_by`):
/// a try of the acquisition that granted it (`acquire_late`: a generated
/// token's acquire, applied with the same token, takes the key again for
/// its own ttl), or a renewal abandoned in flight or answered by no one
/// but a gateway (it sets the expiry a whole ttl from when it lands).
///
/// - The minimum ends before that window closes: released at the
///   minimum's end (a renewal landing later finds no lease; a late
///   acquire is released again once none can land).
/// - It ends after: once nothing can land, one renewal back to the
///   minimum's end (a few tries; if none is answered, a release: the
///   minimum ends early rather than last a late request's ttl).
pub(crate) fn kept_sweep(
    locks: &Locks,
    lease: LockLease,
    land_by: Instant,
    ttl: Duration,
    kept_until: Instant,
    acquire_late: bool,
) {
    let live_for = land_by
        .saturating_duration_since(Instant::now())
        .saturating_add(ttl);
    let why = "put a kept minimum right once a late request can no longer land";
    spawn(
        locks,
        lease,
        live_for,
        move |task_locks, lease, superseded| {
            Box::pin(async move {
                let mut stopped = superseded.clone();
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => return Settled::MayBeHeld,
                    () = tokio::time::sleep_until(land_by.min(kept_until)) => {}
                }
                if kept_until < land_by {
                    // The minimum's end: let go now.
                    let until_landed = land_by.saturating_duration_since(Instant::now());
                    let first = Persistence::background(&task_locks, until_landed);
                    let first =
                        confirmed(&task_locks, &lease, first, Some(superseded.clone())).await;
                    if !acquire_late || matches!(first, Ok(Ended::Superseded)) {
                        return settled(first, &lease, why);
                    }
                    tokio::select! {
                        biased;
                        _ = stopped.wait_for(|s| *s) => return Settled::MayBeHeld,
                        () = tokio::time::sleep_until(land_by) => {}
                    }
                    let last = Persistence::background(&task_locks, ttl);
                    let ended = confirmed(&task_locks, &lease, last, Some(superseded)).await;
                    return settled(ended, &lease, why);
                }
                let pauses = if sabotaged!(KeptSweepReleases) {
                    &[][..]
                } else {
                    &[
                        Duration::from_secs(1),
                        Duration::from_secs(2),
                        Duration::ZERO,
                    ][..]
                };
                for &pause in pauses {
                    let left = kept_until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let back = crate::validate::ttl_covering(left);
                    let renewed =
                        super::requests::renew(&task_locks, &lease, back, &Default::default())
                            .await;
                    match renewed {
                        // Kept until the minimum's end, as before; or
                        // another's by now: nothing of ours left.
                        Ok(_) | Err(Error::Conflict(_)) => return Settled::Freed,
                        Err(err) if crate::retry::worth_another_attempt(&err) => {
                            tokio::time::sleep(pause).await;
                        }
                        Err(err) => {
                            tracing::warn!(
                                key = lease.key(),
                                why,
                                error = %crate::error::chain(&err),
                                "the kept minimum may last a late request's ttl"
                            );
                            return Settled::MayBeHeld;
                        }
                    }
                }
                let last = Persistence::background(&task_locks, ttl);
                let ended = confirmed(&task_locks, &lease, last, Some(superseded)).await;
                settled(ended, &lease, why)
            })
        },
    );
}

fn until_no_try_lands(
    locks: &Locks,
    lease: LockLease,
    at_once: bool,
    land_by: Instant,
    ttl: Duration,
    why: &'static str,
) {
    let live_for = land_by
        .saturating_duration_since(Instant::now())
        .saturating_add(ttl);
    spawn(
        locks,
        lease,
        live_for,
        move |task_locks, lease, superseded| {
            Box::pin(async move {
                if at_once {
                    let until_landed = land_by.saturating_duration_since(Instant::now());
                    let first = Persistence::background(&task_locks, until_landed);
                    let first =
                        confirmed(&task_locks, &lease, first, Some(superseded.clone())).await;
                    if matches!(first, Ok(Ended::Superseded)) {
                        return settled(first, &lease, why);
                    }
                    if sabotaged!(UndoEndsAtFirstRelease) {
                        return Settled::Freed;
                    }
                }
                tracing::debug!(
                    key = lease.key(),
                    why,
                    wait_ms = land_by
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64,
                    "waiting until a late try of the acquire can no longer land"
                );
                // An acquire with the same token (a caller recovering its
                // lease) stops the wait: that acquire decides.
                let mut stopped = superseded.clone();
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|s| *s) => return Settled::MayBeHeld,
                    () = tokio::time::sleep_until(land_by) => {}
                }
                let last = Persistence::background(&task_locks, ttl);
                let ended = confirmed(&task_locks, &lease, last, Some(superseded)).await;
                settled(ended, &lease, why)
            })
        },
    );
}
