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
use crate::locks::{HeldLock, Locks};
use crate::validate;

/// The shortest `max_hold`: a cap that ends a hold as soon as it begins
/// would only churn the lock.
const MIN_MAX_HOLD: Duration = Duration::from_secs(1);

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
    if max_hold.is_some_and(|d| d < MIN_MAX_HOLD) {
        return Err(Error::invalid("max_hold must be at least 1 s"));
    }
    let locks = spec.locks.clone();
    let clock = locks.client().lease_clock().clone();
    let started = clock.now();
    let acquired = super::acquire::acquire(spec).await?;
    span.record("fencing_token", acquired.lease.fencing_token());
    tracing::debug!(
        key = acquired.lease.key(),
        fencing_token = acquired.lease.fencing_token(),
        "lock acquired"
    );
    let cap = max_hold.map(|d| MaxHold::after(d, clock.now(), &locks));
    let state = Arc::new(State::new(acquired, ttl, clock, started, cap));
    // From here on dropping this future releases the lease.
    let mut holding = Holding {
        state,
        locks,
        span,
        stage: Stage::Acquired(Counted::start()),
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
    pub(crate) async fn finish(self) -> (Option<LockLost>, Result<()>) {
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
