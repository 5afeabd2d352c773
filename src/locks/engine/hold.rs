//! A lock held until it is released or dropped: the acquire, a renewal
//! before the hand-over when the acquire left no time for the first, the
//! renewal task, and the end of the hold ([`Holding`]), which every way of
//! holding goes through: [`HeldLock`], scopes, sets and leader terms.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::release::{self, LetGo};
use super::renewal::{renew_in_window, Counted, Renewal};
use super::state::{MaxHold, State};
use super::Spec;
use crate::error::{Error, LockLost, LostReason, Result};
use crate::locks::{HeldLock, Locks, MinHold};
use crate::validate;

mod keep;

/// Acquires and keeps `spec`'s key, in `span` (by default a `volcano.hold`
/// span under the caller's: the renewal task and any background release
/// log under it too, so a job's fields stay on its lock's logs).
pub(crate) async fn hold(spec: Spec, span: Option<tracing::Span>) -> Result<HeldLock> {
    let span = span.unwrap_or_else(|| {
        tracing::info_span!("volcano.hold", key = %spec.key, fencing_token = tracing::field::Empty)
    });
    acquire_in(spec, span.clone()).instrument(span).await
}

async fn acquire_in(spec: Spec, span: tracing::Span) -> Result<HeldLock> {
    let ttl = spec.ttl;
    validate::ttl(ttl)?;
    let max_hold = spec.options.max_hold;
    validate::hold_bounds(spec.min_hold, max_hold)?;
    let min_hold = spec.min_hold.filter(|_| !sabotaged!(NoMinHold));
    let locks = spec.locks.clone();
    let clock = locks.client().lease_clock().clone();
    let started = clock.now();
    let acquired = super::acquire::acquire(spec).await?;
    span.record("fencing_token", acquired.lease.fencing_token());
    // INFO, with host and pid: an operator finds a holder by its fence.
    tracing::info!(
        key = acquired.lease.key(),
        fencing_token = acquired.lease.fencing_token(),
        host = crate::telemetry::host(),
        pid = std::process::id(),
        "lock acquired"
    );
    let cap = max_hold.map(|d| MaxHold::after(d, clock.now(), &locks));
    let state = Arc::new(State::new(acquired, ttl, clock, started, cap));
    // From here on dropping this future releases the lease.
    // From when the lock is handed over: at least that long after the
    // server granted it.
    let min_until = min_hold.map(|d| state.clock.now().saturating_add(d));
    let mut holding = Holding {
        state,
        locks,
        span,
        stage: Stage::Acquired(Counted::start()),
        min_until,
    };
    // A slow or retried acquire may leave no time before the first
    // renewal: renew once before handing the lock over.
    let state = holding.state.clone();
    if state.next_delay().is_zero() {
        if let Err(lost) = renew_in_window(&state, &holding.locks).await {
            state.mark(lost.clone());
            let _ = holding.release_lease().await;
            return Err(Error::LockLost(lost));
        }
    }
    if let Stage::Acquired(counted) = std::mem::replace(&mut holding.stage, Stage::Stopped) {
        let renewal = Renewal::start(&state, &holding.locks, &holding.span, counted);
        holding.stage = Stage::Renewing(renewal);
    }
    Ok(HeldLock::new(holding))
}

/// A hold's life after the acquire: its renewal, and the duty to let go
/// of the lease (on `finish`, or in the background when dropped).
pub(crate) struct Holding {
    pub(crate) state: Arc<State>,
    locks: Locks,
    /// Where its renewals and release log.
    span: tracing::Span,
    stage: Stage,
    /// The end of its minimum hold (lease clock), if it has one.
    min_until: Option<Duration>,
}

/// Where a held lock is in its life, and so what dropping it must do.
enum Stage {
    /// Acquired, not handed over yet (a renewal before the first may be
    /// running): a drop releases the lease.
    Acquired(Counted),
    /// Handed over and renewing: a drop stops the renewal and releases.
    Renewing(Renewal),
    /// No longer renewing or counted, the release not sent or not done: a
    /// drop releases the lease.
    Stopped,
    /// The release was sent: nothing left to do.
    Released,
}

impl Holding {
    /// Stops the renewal, records how the hold ended, marks every guard
    /// clone released *before* the release is sent, then releases: the
    /// loss (if any) up to this moment, and the release's result.
    ///
    /// With a minimum hold not passed yet and the lock not lost, the
    /// service keeps the key until the minimum's end instead
    /// ([`keep_for`](Self::keep_for)): a keeping renewal answered by
    /// another token's lease is a loss (when the key was taken cannot be
    /// told); one that cannot be made leaves the outcome (the work was
    /// covered), logged at WARN and counted.
    pub(crate) async fn finish(self) -> (Option<LockLost>, Result<()>) {
        let (lost, released, _) = self.finish_reporting().await;
        (lost, released)
    }

    /// [`finish`](Self::finish), and what became of the minimum hold.
    pub(crate) async fn finish_reporting(self) -> (Option<LockLost>, Result<()>, MinHold) {
        let state = self.state.clone();
        let now = state.clock.now();
        let left = self
            .min_until
            .map(|until| until.saturating_sub(now))
            .filter(|left| !left.is_zero() && !state.check())
            // Never past `max_hold`: with less than the shortest lease (5 s)
            // left of the cap, it releases instead (the keep itself asks
            // for no more than the cap's whole seconds left).
            .filter(|_| {
                sabotaged!(KeepPastMaxHold)
                    || state
                        .cap_at()
                        .is_none_or(|cap| cap.saturating_sub(now) >= validate::MIN_TTL)
            });
        // Asked for, and not reached: kept unless lost or stopped short.
        let asked = self.min_until.is_some();
        if let Some(left) = left {
            return match self.keep_for(left).await {
                (Some(loss), _) => (Some(loss), Ok(()), MinHold::NotKept),
                (None, Ok(())) if sabotaged!(KeptReportedNotKept) => {
                    (None, Ok(()), MinHold::NotKept)
                }
                (None, Ok(())) => (None, Ok(()), MinHold::Kept),
                (None, Err(failed)) if taken_by_another(&failed) => {
                    (Some(failed), Ok(()), MinHold::NotKept)
                }
                // No keep fitted before the cap any more: released instead
                // (the release's failure, if it failed, as the cause).
                (None, Err(capped)) if capped.reason() == LostReason::MaxHold => {
                    let released = match capped.cause() {
                        Some(_) => Err(Error::LockLost(capped)),
                        None => Ok(()),
                    };
                    (None, released, MinHold::NotKept)
                }
                (None, Err(failed)) => {
                    crate::telemetry::min_hold_not_kept();
                    tracing::warn!(
                        key = %state.key,
                        reason = %failed,
                        "minimum hold not kept: the lease ends at its last expiry, before the \
                         minimum's end"
                    );
                    (None, Ok(()), MinHold::NotKept)
                }
            };
        }
        let passed = self.min_until.is_some_and(|end| state.clock.now() >= end);
        let (lost, released) = self.finish_now().await;
        let min_hold = MinHold::released(asked, passed, lost.as_ref());
        (lost, released, min_hold)
    }

    /// [`finish`](Self::finish) without the minimum hold: released now.
    pub(crate) async fn finish_now(self) -> (Option<LockLost>, Result<()>) {
        let span = self.span.clone();
        self.finish_unscoped().instrument(span).await
    }

    async fn finish_unscoped(mut self) -> (Option<LockLost>, Result<()>) {
        // Its count ends here: time spent releasing is not holding.
        match std::mem::replace(&mut self.stage, Stage::Stopped) {
            Stage::Renewing(renewal) => renewal.stop().await,
            other => drop(other),
        }
        let state = self.state.clone();
        // Expiry counts up to this moment; time spent releasing does not.
        state.check();
        let loss = state.failure();
        let released = LockLost::new(state.key.clone(), LostReason::Released);
        if sabotaged!(ReleaseBeforeMark) {
            let result = match self.release_lease().await {
                LetGo::NotFreed(err) | LetGo::NotOurs { conflict: err, .. } => Err(err),
                LetGo::Freed => Ok(()),
            };
            state.mark(released);
            return (loss, result);
        }
        state.mark(released);
        match self.release_lease().await {
            LetGo::Freed => (loss, Ok(())),
            LetGo::NotFreed(err) => (loss, Err(err)),
            // Another token holds the lock. Answered to the first attempt
            // (sent at once) and while the lease should still have been
            // ours, that proves it was taken while held (a force release,
            // a clock that jumped): the work since is not covered. After a
            // pause between attempts, or past the deadline, the lease may
            // have lapsed during the release itself, after the work.
            LetGo::NotOurs { conflict, at_once } => {
                let taken = at_once && loss.is_none() && !state.remaining().is_zero();
                if !taken {
                    // Nothing of ours was left to release: said as the
                    // service said it.
                    return (loss, Err(conflict));
                }
                crate::telemetry::lost(LostReason::TakenOver);
                tracing::warn!(
                    key = %state.key,
                    "lock lost: another token held it when it was released"
                );
                let lost =
                    LockLost::new(state.key.clone(), LostReason::TakenOver).with_cause(conflict);
                (Some(lost), Ok(()))
            }
        }
    }

    /// Lets go of the latest lease by the one release policy
    /// ([`release::let_go`]): a failure goes on in the background or is
    /// recorded for `Client::shutdown`.
    async fn release_lease(&mut self) -> LetGo {
        let state = &self.state;
        let lease = state.lease();
        let outcome = release::let_go(&self.locks, &lease, state.server_may_hold_for()).await;
        self.stage = Stage::Released;
        match &outcome {
            LetGo::Freed => tracing::debug!(
                key = lease.key(),
                fencing_token = lease.fencing_token(),
                "lock released"
            ),
            LetGo::NotOurs { .. } => tracing::debug!(
                key = lease.key(),
                fencing_token = lease.fencing_token(),
                "another token holds the lock: nothing of ours to release"
            ),
            LetGo::NotFreed(err) => tracing::warn!(
                key = lease.key(),
                fencing_token = lease.fencing_token(),
                error = %crate::error::chain(err),
                "lock release failed"
            ),
        }
        outcome
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let stage = std::mem::replace(&mut self.stage, Stage::Released);
        if let Stage::Released = stage {
            return;
        }
        // Stops the renewal, if it runs.
        drop(stage);
        let _span = self.span.enter();
        let state = &self.state;
        // A deadline already passed is an expiry (counted as a loss, and
        // the server may keep the lease a whole ttl), not a release.
        state.check();
        state.mark(LockLost::new(state.key.clone(), LostReason::Released));
        release::in_background(
            &self.locks,
            state.lease(),
            state.server_may_hold_for(),
            "held lock dropped",
        );
    }
}

/// A loss that shows another holder (a renewal or the release found
/// another token), as opposed to an expiry, a failing service or a cap.
fn taken_by_another(lost: &LockLost) -> bool {
    lost.reason() == LostReason::TakenOver
        || lost
            .cause()
            .is_some_and(|cause| cause.is_ownership_lost() || cause.is_lock_held())
}
