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
pub(crate) use bounds::Bounds;
use bounds::{back_lands_by, release_again, Act, BACK_TIMEOUT};

mod bounds;

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
/// but a gateway. Either sets the expiry its own ttl from when it lands:
/// later than the minimum's end, or sooner.
///
/// - Until the window closes (and before the minimum's end), the expiry is
///   put back to the minimum's end every [`REASSERT`], and once more when
///   the window has closed: a late request that shortened it is undone
///   before the lease lapses, one that stretched it is cut back. With less
///   than the shortest lease (5 s) left, no renewal back (it would reach
///   past the end; a retry of one that does is not the last word):
///   released at the minimum's end instead.
/// - At the minimum's end with the window still open, released (a renewal
///   landing later finds no lease; a late acquire is released again once
///   none can land).
/// - A renewal back that the service cannot be brought to answer, or a
///   lease as last measured (`live_until`) that can no longer be renewed:
///   left until the release at the minimum's end, and never put off past
///   it by a retry's pause.
/// - Under a `max_hold` cap (`cap_until`), a renewal back asks no more
///   than the cap's whole seconds left, as the keep does.
pub(crate) fn kept_sweep(
    locks: &Locks,
    lease: LockLease,
    bounds: Bounds,
    ttl: Duration,
    acquire_late: bool,
) {
    let live_for = bounds
        .land_by
        .max(bounds.kept_until)
        .saturating_duration_since(Instant::now())
        .saturating_add(ttl);
    spawn(
        locks,
        lease,
        live_for,
        move |task_locks, lease, superseded| {
            let kept = Kept {
                locks: task_locks,
                lease,
                superseded,
                bounds,
                ttl,
                acquire_late,
            };
            Box::pin(kept.put_right())
        },
    );
}

/// A kept minimum being put right ([`kept_sweep`]).
struct Kept {
    locks: Locks,
    lease: LockLease,
    superseded: tokio::sync::watch::Receiver<bool>,
    bounds: Bounds,
    ttl: Duration,
    acquire_late: bool,
}

/// Why a kept minimum is put right, for the logs.
const KEPT_WHY: &str = "put a kept minimum right while a late request may land";

impl Kept {
    async fn put_right(mut self) -> Settled {
        loop {
            if Instant::now() >= self.bounds.kept_until {
                return self.release_at_the_end().await;
            }
            if !self.sleep_until(self.bounds.wake(Instant::now())).await {
                return Settled::MayBeHeld;
            }
            let now = Instant::now();
            if now >= self.bounds.kept_until {
                continue;
            }
            if sabotaged!(KeptSweepReleases) {
                let last = Persistence::background(&self.locks, self.ttl);
                let ended = confirmed(&self.locks, &self.lease, last, Some(self.superseded)).await;
                return settled(ended, &self.lease, KEPT_WHY);
            }
            match self.bounds.act(now) {
                Act::RenewBack => {}
                act => {
                    if act == Act::RenewBackThenEnd {
                        let _ = self.renew_back().await;
                    }
                    if !self.sleep_until(self.bounds.kept_until).await {
                        return Settled::MayBeHeld;
                    }
                    continue;
                }
            }
            match self.renew_back().await {
                Back::Kept { sent, back } if self.bounds.put_right_by(sent, back) => {
                    return Settled::Freed
                }
                Back::Kept { .. } => {}
                // Another's, or lapsed: nothing of ours, unless a late
                // acquire may still take it again.
                Back::Gone
                    if self
                        .bounds
                        .acquire_may_land(self.acquire_late, Instant::now()) =>
                {
                    return self.release_once_none_lands().await;
                }
                Back::Gone => return Settled::Freed,
                // Released now, and again once no late acquire can land.
                Back::Stranger => return self.release_now_then(true).await,
                Back::Refused => return Settled::MayBeHeld,
                // Unanswered: it may land late too; left until the minimum's
                // end, where it is released.
                Back::Unanswered => {
                    self.bounds.live_until = Instant::now();
                    self.bounds.floor_until = self.bounds.live_until;
                }
            }
        }
    }

    /// Sleeps until `at`; false if an acquire with the same token (a caller
    /// recovering its lease) superseded this first.
    async fn sleep_until(&mut self, at: Instant) -> bool {
        tokio::select! {
            biased;
            _ = self.superseded.wait_for(|s| *s) => false,
            () = tokio::time::sleep_until(at) => true,
        }
    }

    /// A renewal back to the minimum's end (retried twice on a transient
    /// failure), each try and pause ending by then: the release at the end
    /// is never put off by one.
    async fn renew_back(&mut self) -> Back {
        for pause in [
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::ZERO,
        ] {
            // None past the minimum's end, nor past the cap (a retry).
            let sent = Instant::now();
            let back = self
                .bounds
                .back(sent)
                .filter(|_| sent < self.bounds.kept_until);
            let Some(back) = back else {
                return Back::Unanswered;
            };
            // (Kept-minimums seed 78: two unanswered tries of 3 s put the
            // release at the end off by 2 s, past the cap.)
            let options = crate::locks::RequestOptions {
                timeout: Some(BACK_TIMEOUT.min(self.bounds.kept_until - sent)),
                ..Default::default()
            };
            match super::requests::renew(&self.locks, &self.lease, back, &options).await {
                // A late acquire took the key again after the kept lease
                // was gone (force-released, say): a lease nobody's work
                // holds, not the minimum's.
                Ok(renewed) if renewed.lease.fencing_token() != self.lease.fencing_token() => {
                    return Back::Stranger;
                }
                Ok(_) => {
                    self.bounds.renewed_back(sent, back);
                    return Back::Kept { sent, back };
                }
                Err(Error::Conflict(_)) => return Back::Gone,
                Err(err) if crate::retry::worth_another_attempt(&err) => {
                    if err.may_land_late() {
                        self.bounds.land_by = self.bounds.land_by.max(back_lands_by(sent));
                    }
                    // Not past the minimum's end, where it is released
                    // (kept-minimums seed 194: 0.7 s past it, and the cap).
                    tokio::time::sleep_until((Instant::now() + pause).min(self.bounds.kept_until))
                        .await;
                }
                Err(err) => {
                    tracing::warn!(
                        key = self.lease.key(),
                        why = KEPT_WHY,
                        error = %crate::error::chain(&err),
                        "the kept minimum may last a late request's ttl"
                    );
                    return Back::Refused;
                }
            }
        }
        Back::Unanswered
    }

    /// At the minimum's end, the window still open: released (and again
    /// once a late acquire can no longer land).
    async fn release_at_the_end(self) -> Settled {
        let again = self.acquire_late;
        self.release_now_then(again).await
    }

    /// Released now; `again`, once no late try can land, unless none could
    /// when it went or an acquire with the token superseded this.
    async fn release_now_then(self, again: bool) -> Settled {
        let sent = Instant::now();
        let land_by = self.bounds.land_by;
        let until_landed = land_by.saturating_duration_since(sent);
        let first = Persistence::background(&self.locks, until_landed.max(self.ttl));
        let superseded = Some(self.superseded.clone());
        let first = confirmed(&self.locks, &self.lease, first, superseded).await;
        let superseded = matches!(first, Ok(Ended::Superseded));
        if !release_again(again, land_by, sent, superseded) {
            return settled(first, &self.lease, KEPT_WHY);
        }
        self.release_once_none_lands().await
    }

    /// Released once no late try can land (`land_by`).
    async fn release_once_none_lands(mut self) -> Settled {
        if !self.sleep_until(self.bounds.land_by).await {
            return Settled::MayBeHeld;
        }
        let last = Persistence::background(&self.locks, self.ttl);
        let ended = confirmed(&self.locks, &self.lease, last, Some(self.superseded)).await;
        settled(ended, &self.lease, KEPT_WHY)
    }
}

/// How a renewal back to the minimum's end went.
enum Back {
    /// The expiry is the minimum's end again (`back` past `sent`: later
    /// when less than the shortest lease was left), by a renewal sent then.
    Kept { sent: Instant, back: Duration },
    /// The lease is another's, or lapsed.
    Gone,
    /// The token holds a lease a late acquire took after the kept one was
    /// gone.
    Stranger,
    /// Refused for good (a revoked key, say).
    Refused,
    /// No answer came after the tries.
    Unanswered,
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
