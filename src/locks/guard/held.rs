//! `locks.hold(key, ttl)` and [`HeldLock`]: a renewing lock that lives
//! outside any closure, in a struct or an `Arc`, until it is released or
//! dropped. `with_lock` is a thin layer over it.

use std::future::{Future, IntoFuture};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::handle::LockGuard;
use super::renewal::{renew_in_window, Counted, Renewal};
use super::state::{MaxHold, State};
use crate::error::{Error, LockLost, LostReason, Result};
use crate::locks::release::{self, LetGo};
use crate::locks::{Acquire, Locks};
use crate::validate;
use crate::BoxFuture;

/// The shortest `max_hold`: a cap that ends a hold as soon as it begins
/// would only churn the lock.
const MIN_MAX_HOLD: Duration = Duration::from_secs(1);

/// `locks.hold(key, ttl)`; see [`Locks::hold`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored. It holds an [`Acquire`](crate::Acquire)
/// and has the same options, plus [`Hold::max_hold`].
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// // A stuck job cannot keep the report lock past an hour.
/// let held = locks
///     .hold("report", Duration::from_secs(30))
///     .wait(Duration::from_secs(60))
///     .max_hold(Duration::from_secs(3600))
///     .await?;
/// # let _ = held; Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a held lock is acquired only when this is awaited"]
pub struct Hold {
    /// The acquisition: key, ttl, token, request id, timeout, wait.
    pub(super) acquire: Acquire,
    pub(super) max_hold: Option<Duration>,
    /// The span the acquire, the renewals and the release run in; by
    /// default a `volcano.hold` span under the caller's.
    pub(super) span: Option<tracing::Span>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("acquire", &self.acquire)
            .field("max_hold", &self.max_hold)
            .finish_non_exhaustive()
    }
}

impl Locks {
    /// Acquires `key` and keeps it: the lease is renewed in the background
    /// exactly as `with_lock` renews it (the same local deadline, retries
    /// and lost-ownership signal) until the [`HeldLock`] is released or
    /// dropped. For a lock that lives in a long-lived struct or state
    /// machine, where a closure does not fit.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let held = locks.hold("ingest", Duration::from_secs(30)).await?;
    /// let fence = held.lease().fencing_token();
    /// // ... work, passing `fence` to the store; watch `held.lost()` ...
    /// held.release().await?;
    /// # let _ = fence; Ok(()) }
    /// ```
    pub fn hold(&self, key: impl Into<String>, ttl: Duration) -> Hold {
        Hold {
            acquire: self.acquire(key, ttl),
            max_hold: None,
            span: None,
        }
    }
}

acquisition_setters!(impl[] Hold {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
    max_hold,
});

impl Hold {
    fn acquire_spec(&mut self) -> &mut Acquire {
        &mut self.acquire
    }

    fn hold_spec(&mut self) -> &mut Hold {
        self
    }

    /// The key to hold.
    pub(super) fn key(&self) -> &str {
        &self.acquire.key
    }

    /// Acquires, renews once at once if the acquire left no time before
    /// the first renewal, and starts the renewal task.
    pub(super) async fn acquire(mut self) -> Result<HeldLock> {
        // A child of the caller's span: the renewal task and any background
        // release log under it too, so a job's fields stay on its lock's logs.
        let span = self.span.take().unwrap_or_else(|| {
            tracing::info_span!("volcano.hold", key = %self.key(), fencing_token = tracing::field::Empty)
        });
        self.acquire_in(span.clone()).instrument(span).await
    }

    async fn acquire_in(self, span: tracing::Span) -> Result<HeldLock> {
        let Hold {
            acquire,
            max_hold,
            span: _,
        } = self;
        let ttl = acquire.ttl;
        validate::ttl(ttl)?;
        if max_hold.is_some_and(|d| d < MIN_MAX_HOLD) {
            return Err(Error::invalid("max_hold must be at least 1 s"));
        }
        let locks = acquire.common.locks.clone();
        let clock = locks.client().lease_clock().clone();
        let started = clock.now();
        let acquired = acquire.send_measured().await?;
        span.record("fencing_token", acquired.lease.fencing_token());
        tracing::debug!(
            key = acquired.lease.key(),
            fencing_token = acquired.lease.fencing_token(),
            "lock acquired"
        );
        let cap = max_hold.map(|d| MaxHold::after(d, clock.now(), &locks));
        let state = Arc::new(State::new(acquired, ttl, clock, started, cap));
        // From here on dropping this future releases the lease.
        let mut held = HeldLock {
            guard: LockGuard { state },
            locks,
            span,
            stage: Stage::Acquired(Counted::start()),
        };
        // A slow or retried acquire may leave no time before the first
        // renewal: renew once before handing the lock over.
        let state = &held.guard.state;
        if state.next_delay().is_zero() {
            if let Err(lost) = renew_in_window(state, &held.locks).await {
                state.mark(lost.clone());
                let _ = held.release_lease().await;
                return Err(Error::LockLost(lost));
            }
        }
        if let Stage::Acquired(counted) = std::mem::replace(&mut held.stage, Stage::Stopped) {
            let renewal = Renewal::start(&held.guard.state, &held.locks, &held.span, counted);
            held.stage = Stage::Renewing(renewal);
        }
        Ok(held)
    }
}

impl Hold {
    /// Acquires: the future `.await` runs, as a value that can be spawned
    /// or stored (the builder itself is not a future):
    /// `tokio::spawn(locks.hold("ingest", ttl).send())`.
    pub fn send(self) -> impl Future<Output = Result<HeldLock>> + Send + 'static {
        self.into_future()
    }
}

impl IntoFuture for Hold {
    type Output = Result<HeldLock>;
    type IntoFuture = BoxFuture<Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

/// A lock held until [`HeldLock::release`] or drop, renewed in the
/// background. Derefs to [`LockGuard`]: `is_lost()`, `lost()`, `watch()`,
/// `lease()` and `failure()` all work on it. `Send + Sync + 'static`, so it
/// can live in a struct or an `Arc`.
///
/// Dropping it stops the renewal and hands a best-effort release to the
/// client, which [`Client::shutdown`](crate::Client::shutdown) waits for.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// struct Ingest {
///     lock: volcano::HeldLock,
/// }
/// let ingest = Ingest { lock: locks.hold("ingest", Duration::from_secs(30)).await? };
/// tokio::select! {
///     _ = ingest.lock.lost() => eprintln!("lost the ingest lock; stopping"),
///     _ = tokio::time::sleep(Duration::from_secs(60)) => {}
/// }
/// ingest.lock.release().await?;
/// # Ok(()) }
/// ```
pub struct HeldLock {
    guard: LockGuard,
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

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl Deref for HeldLock {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl HeldLock {
    /// Stops renewing and releases the lease (tried again on transient
    /// failures; release is idempotent). Returns `Error::LockLost` if
    /// ownership was lost while held (the release is still sent), or if
    /// the release found another token holding the lock
    /// ([`LostReason::TakenOver`]); else the release's own error, if any.
    /// A release that did not free the lease goes on in the background
    /// (a transient failure) or is recorded (a refusal): either way
    /// [`Client::shutdown`](crate::Client::shutdown) names the key while
    /// the lease may still be live.
    pub async fn release(self) -> Result<()> {
        match self.finish().await {
            (Some(lost), _) => Err(Error::LockLost(lost)),
            (None, released) => released,
        }
    }

    /// Stops the renewal, records how the hold ended, marks every guard
    /// clone released *before* the release is sent, then releases: the
    /// loss (if any) up to this moment, and the release's result.
    pub(super) async fn finish(self) -> (Option<LockLost>, Result<()>) {
        let span = self.span.clone();
        self.finish_unscoped().instrument(span).await
    }

    async fn finish_unscoped(mut self) -> (Option<LockLost>, Result<()>) {
        // Its count ends here: time spent releasing is not holding.
        match std::mem::replace(&mut self.stage, Stage::Stopped) {
            Stage::Renewing(renewal) => renewal.stop().await,
            other => drop(other),
        }
        let state = self.guard.state.clone();
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
        let state = &self.guard.state;
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

impl Drop for HeldLock {
    fn drop(&mut self) {
        let stage = std::mem::replace(&mut self.stage, Stage::Released);
        if let Stage::Released = stage {
            return;
        }
        // Stops the renewal, if it runs.
        drop(stage);
        let _span = self.span.enter();
        let state = &self.guard.state;
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
