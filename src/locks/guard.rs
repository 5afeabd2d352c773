//! Scoped locks: `with_lock`, [`LockGuard`], and the renewal task.
//!
//! The guard keeps its own deadline on the lease clock, measured from just
//! before each acquire or renew was sent: the server cannot have started the
//! lease earlier, so the local deadline never falls after the server's
//! expiry.
//!
//! How long a lease lasts is the lesser of the ttl asked for and what the
//! server says it granted. The server may grant less (the 90-day cap of the
//! original acquisition, which a recovering `.token(T)` cannot see). That
//! grant is measured on the server's clock alone, `expires_at` minus the
//! answer's `Date` less a second for `Date`'s rounding, and applied from
//! the local send time; the server's clock is never compared with this
//! machine's, so skew between them cannot lengthen the deadline.

use std::any::Any;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::clock::LeaseClock;
use super::lease::LockLease;
use super::release::{self, is_transient};
use super::{Locks, Measured};
use crate::error::{Error, LockLost, LostReason, Result};
use crate::validate;

/// The server needs a renewal more than this long before expiry.
const SAFETY_MARGIN: Duration = Duration::from_secs(1);
/// Time allowed for one renewal request to arrive.
const REQUEST_BUDGET: Duration = Duration::from_secs(1);
/// Renewals are never further apart than this.
const MAX_RENEW_DELAY: Duration = Duration::from_secs(60);
/// Longest sleep between two looks at the deadline (a suspended machine
/// wakes its timers late; the lease clock does not lag).
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// A renewal attempt with less time than this left is not sent.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Delay before the next renewal (protocol 5.3): about ttl/3, at most 60 s,
/// ±10 % jitter (`u` uniform in [0, 1)), and never later than 2 s before
/// the local deadline (`remaining` from now). Zero means renew now.
pub(crate) fn renewal_delay(ttl: Duration, remaining: Duration, u: f64) -> Duration {
    let base = (ttl / 3).min(MAX_RENEW_DELAY);
    let latest = remaining.saturating_sub(SAFETY_MARGIN + REQUEST_BUDGET);
    let delay = base.min(latest).mul_f64(0.9 + 0.2 * u.clamp(0.0, 1.0));
    delay.min(latest)
}

/// The lease-clock deadline of a lease obtained by a request sent at
/// `sent_at`: the ttl asked for or the time the server granted, whichever
/// is less, never past the 90-day `cap`.
fn deadline(measured: &Measured, ttl: Duration, cap: Duration) -> Duration {
    let lasts = measured.granted.map_or(ttl, |granted| granted.min(ttl));
    measured.sent_at.saturating_add(lasts).min(cap)
}

// ------------------------------------------------------------------ state

struct Held {
    lease: LockLease,
    /// Lease-clock reading after which the lease may be gone.
    deadline: Duration,
    failure: Option<LockLost>,
}

/// Shared by every clone of a guard and by its renewal task.
struct State {
    key: String,
    ttl: Duration,
    clock: LeaseClock,
    /// Acquisition start + 90 days: no renewal moves the deadline past it.
    cap: Duration,
    held: Mutex<Held>,
    lost: watch::Sender<bool>,
}

impl State {
    /// `started`: the lease-clock reading before the acquire's first try
    /// (an earlier try than the one answered may be the one applied).
    fn new(acquired: Measured, ttl: Duration, clock: LeaseClock, started: Duration) -> Self {
        let cap = started.saturating_add(validate::MAX_TTL);
        State {
            key: acquired.lease.key().to_owned(),
            ttl,
            cap,
            held: Mutex::new(Held {
                deadline: deadline(&acquired, ttl, cap),
                lease: acquired.lease,
                failure: None,
            }),
            clock,
            lost: watch::Sender::new(false),
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lease(&self) -> LockLease {
        self.held().lease.clone()
    }

    fn deadline(&self) -> Duration {
        self.held().deadline
    }

    fn failure(&self) -> Option<LockLost> {
        self.held().failure.clone()
    }

    fn remaining(&self) -> Duration {
        self.deadline().saturating_sub(self.clock.now())
    }

    /// How long the server may still keep the latest lease: the local
    /// deadline is conservative by up to a second of `Date` rounding plus
    /// the time an answer took, so allow a little more.
    fn server_may_hold_for(&self) -> Duration {
        self.remaining()
            .saturating_add(SAFETY_MARGIN + REQUEST_BUDGET)
    }

    /// Records a loss; the first one wins and flips the watch channel.
    fn mark(&self, lost: LockLost) {
        let fencing_token = {
            let mut held = self.held();
            if held.failure.is_some() {
                return;
            }
            held.failure = Some(lost.clone());
            held.lease.fencing_token()
        };
        self.lost
            .send_if_modified(|flag| !std::mem::replace(flag, true));
        if lost.reason() == LostReason::Released {
            tracing::debug!(key = %self.key, fencing_token, "scoped lock ended");
        } else {
            tracing::warn!(key = %self.key, fencing_token, reason = %lost, "lock lost");
        }
    }

    /// Lost, or past the deadline (which records the expiry now). Reads the
    /// clock itself, so it holds even when no task has run.
    fn check(&self) -> bool {
        let deadline = {
            let held = self.held();
            if held.failure.is_some() {
                return true;
            }
            held.deadline
        };
        if self.clock.now() >= deadline {
            self.mark(LockLost::new(self.key.clone(), LostReason::Expired));
            return true;
        }
        false
    }

    /// Takes a renewal.
    fn renewed(&self, renewed: Measured) -> Result<(), LockLost> {
        let mut held = self.held();
        if let Some(failure) = &held.failure {
            return Err(failure.clone());
        }
        held.deadline = deadline(&renewed, self.ttl, self.cap);
        held.lease = renewed.lease;
        let left = held.deadline.saturating_sub(self.clock.now());
        drop(held);
        if left <= SAFETY_MARGIN + REQUEST_BUDGET {
            return Err(LockLost::new(self.key.clone(), LostReason::NoSafeWindow));
        }
        Ok(())
    }

    fn next_delay(&self) -> Duration {
        renewal_delay(self.ttl, self.remaining(), rand::random::<f64>())
    }

    /// When the next renewal is due, as a lease-clock reading.
    fn next_renewal_at(&self) -> Duration {
        self.clock.now() + self.next_delay()
    }

    /// Waits until the lease clock reads `until`, looking at the deadline at
    /// least once a second; false if the lock was lost meanwhile.
    async fn sleep_while_held(&self, until: Duration) -> bool {
        loop {
            if self.check() {
                return false;
            }
            let left = until.saturating_sub(self.clock.now());
            if left.is_zero() {
                return true;
            }
            tokio::time::sleep(left.min(CHECK_INTERVAL)).await;
        }
    }

    async fn wait_lost(&self) {
        let mut changes = self.lost.subscribe();
        loop {
            if self.check() {
                return;
            }
            let left = self.remaining().min(CHECK_INTERVAL);
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(left) => {}
            }
        }
    }
}

/// Renews until it succeeds, the lease is definitively refused, or no
/// attempt can arrive in time. Each attempt's timeout ends where the safe
/// window ends; transient failures back off with jitter.
async fn renew_in_window(state: &State, locks: &Locks) -> Result<(), LockLost> {
    let mut backoff = ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_jitter()
        .without_max_times()
        .build();
    let mut last_error = None;
    loop {
        if state.check() {
            return Err(state.failure().expect("a checked loss is recorded"));
        }
        let renew_by = state.deadline().saturating_sub(SAFETY_MARGIN);
        let budget = renew_by.saturating_sub(state.clock.now());
        if budget < MIN_ATTEMPT {
            let lost = LockLost::new(state.key.clone(), LostReason::Expired);
            return Err(match last_error {
                Some(err) => lost.with_cause(err),
                None => lost,
            });
        }
        let lease = state.lease();
        let request_id = validate::new_uuid();
        let result = locks
            .renew(&lease, state.ttl)
            .request_id(request_id.clone())
            .timeout(budget.min(locks.client().timeout()))
            .send_measured()
            .await;
        match result {
            Ok(renewed) => {
                tracing::debug!(
                    key = %state.key,
                    fencing_token = renewed.lease.fencing_token(),
                    request_id,
                    "lock renewed"
                );
                return state.renewed(renewed);
            }
            Err(err) if is_transient(&err) => {
                let wait = backoff
                    .next()
                    .unwrap_or(BACKOFF_MAX)
                    .max(err.retry_after().unwrap_or_default());
                // `Retry-After` is the server's number: it may be huge.
                if state
                    .clock
                    .now()
                    .saturating_add(wait)
                    .saturating_add(MIN_ATTEMPT)
                    > renew_by
                {
                    return Err(
                        LockLost::new(state.key.clone(), LostReason::Expired).with_cause(err)
                    );
                }
                tracing::info!(
                    key = %state.key,
                    fencing_token = lease.fencing_token(),
                    request_id,
                    error = %err,
                    retry_in_ms = wait.as_millis() as u64,
                    "renewal failed; retrying"
                );
                last_error = Some(err);
                if !state.sleep_while_held(state.clock.now() + wait).await {
                    return Err(state.failure().expect("a checked loss is recorded"));
                }
            }
            Err(err) => {
                return Err(
                    LockLost::new(state.key.clone(), LostReason::RenewalFailed).with_cause(err)
                )
            }
        }
    }
}

/// Decrements the client's live-renewal count when the task ends or is
/// aborted.
struct LiveRenewal(Arc<AtomicUsize>);

impl Drop for LiveRenewal {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Renews at each due time (`next_at`, a lease-clock reading fixed when the
/// lease was obtained, not when the task first runs) until the lock is lost
/// or the task is aborted.
async fn renewal_task(state: Arc<State>, locks: Locks, mut next_at: Duration, _live: LiveRenewal) {
    loop {
        if !state.sleep_while_held(next_at).await {
            return;
        }
        if let Err(lost) = renew_in_window(&state, &locks).await {
            state.mark(lost);
            return;
        }
        next_at = state.next_renewal_at();
    }
}

// ------------------------------------------------------------------ guard

/// The handle a `with_lock` closure gets: the latest lease and the
/// lost-ownership signal. Cheap to clone.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// locks
///     .with_lock("nightly-report", Duration::from_secs(30), |guard| async move {
///         for chunk in 0..10 {
///             if guard.is_lost() {
///                 break; // another worker may hold the lock now
///             }
///             let fence = guard.lease().fencing_token();
///             println!("writing chunk {chunk} with fence {fence}");
///         }
///         Ok::<_, volcano::Error>(())
///     })
///     .await
/// # }
/// ```
#[derive(Clone)]
pub struct LockGuard {
    state: Arc<State>,
}

impl LockGuard {
    /// The latest lease (renewals replace it; the token stays the same).
    pub fn lease(&self) -> LockLease {
        self.state.lease()
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The ttl each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.state.ttl
    }

    /// Time left before the local deadline (zero once lost to expiry).
    pub fn remaining(&self) -> Duration {
        self.state.remaining()
    }

    /// True once ownership is lost. Also true the moment the local deadline
    /// passes, even if no background task got to run.
    pub fn is_lost(&self) -> bool {
        self.state.check()
    }

    /// Waits up to `timeout` for ownership to be lost; true if it was.
    /// A zero timeout checks once.
    pub async fn wait_lost(&self, timeout: Duration) -> bool {
        if timeout.is_zero() {
            return self.is_lost();
        }
        tokio::time::timeout(timeout, self.state.wait_lost())
            .await
            .is_ok()
            || self.is_lost()
    }

    /// Resolves once ownership is lost. Cancel-safe, for `tokio::select!`.
    ///
    /// ```no_run
    /// # async fn demo(guard: volcano::LockGuard) {
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lost the lock; stopping"),
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) {
        self.state.wait_lost().await
    }

    /// The lost-ownership channel: `false` while held, `true` once lost,
    /// never back.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.state.check();
        self.state.lost.subscribe()
    }

    /// Why ownership was lost, once it was.
    pub fn failure(&self) -> Option<LockLost> {
        self.state.check();
        self.state.failure()
    }

    /// Records that the protected work found the lock unusable (for example
    /// a fencing check failed). The first recorded loss wins; `with_lock`
    /// then returns `Error::LockLost` unless the closure returned an error.
    pub fn mark_lost(&self, reason: impl Into<String>) {
        let lost = LockLost::new(self.state.key.clone(), LostReason::Marked).with_detail(reason);
        self.state.mark(lost);
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.lease())
            .field("ttl", &self.state.ttl)
            .field("failure", &self.state.failure())
            .finish()
    }
}

// ------------------------------------------------------------- with_lock

/// `locks.with_lock(key, ttl, f)`; see [`Locks::with_lock`].
#[must_use = "a scoped lock does nothing until it is awaited"]
pub struct WithLock<'f, F> {
    locks: Locks,
    key: String,
    ttl: Duration,
    token: Option<String>,
    request_id: Option<String>,
    wait: Option<Duration>,
    cancel_on_loss: bool,
    f: F,
    _scope: PhantomData<&'f ()>,
}

impl<F> std::fmt::Debug for WithLock<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLock")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("request_id", &self.request_id)
            .field("wait", &self.wait)
            .field("cancel_on_loss", &self.cancel_on_loss)
            .finish_non_exhaustive()
    }
}

impl Locks {
    /// Acquires `key`, runs `f` with a [`LockGuard`] while renewing the lease
    /// in the background, then releases it — on success, error, panic or
    /// cancellation.
    ///
    /// Outcome: `f`'s error wins; else a recorded loss gives
    /// `Error::LockLost`; else a failed release gives that error; else `f`'s
    /// value. `f` is not interrupted when ownership is lost unless
    /// [`WithLock::cancel_on_loss`] is set: poll `guard.is_lost()`, await
    /// `guard.lost()`, or pass `guard.lease().fencing_token()` to the
    /// protected resource.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let fence = locks
    ///     .with_lock("daily-report", Duration::from_secs(30), |guard| async move {
    ///         let fence = guard.lease().fencing_token();
    ///         // ... protected work, passing `fence` to the store ...
    ///         Ok::<_, volcano::Error>(fence)
    ///     })
    ///     .await?;
    /// # let _ = fence; Ok(()) }
    /// ```
    pub fn with_lock<'f, F, Fut, T, E>(
        &self,
        key: impl Into<String>,
        ttl: Duration,
        f: F,
    ) -> WithLock<'f, F>
    where
        F: FnOnce(LockGuard) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
        T: Send + 'f,
        E: From<Error> + Send + 'f,
    {
        WithLock {
            locks: self.clone(),
            key: key.into(),
            ttl,
            token: None,
            request_id: None,
            wait: None,
            cancel_on_loss: false,
            f,
            _scope: PhantomData,
        }
    }
}

impl<F> WithLock<'_, F> {
    /// Acquire with this ownership token (a UUID string, sent verbatim).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Acquire with this request id; renewals and the release use fresh ones.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// If the lock is held, wait up to `timeout` for it (see
    /// [`Acquire::wait`](super::Acquire::wait)) before giving up with the
    /// last `Error::Conflict`.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// Stop `f` at its next await point once ownership is lost, and return
    /// `Error::LockLost`.
    pub fn cancel_on_loss(mut self) -> Self {
        self.cancel_on_loss = true;
        self
    }
}

impl<'f, F, Fut, T, E> IntoFuture for WithLock<'f, F>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: From<Error> + Send + 'f,
{
    type Output = std::result::Result<T, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

impl<'f, F, Fut, T, E> WithLock<'f, F>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: From<Error> + Send + 'f,
{
    async fn run(self) -> std::result::Result<T, E> {
        let WithLock {
            locks,
            key,
            ttl,
            token,
            request_id,
            wait,
            cancel_on_loss,
            f,
            ..
        } = self;
        validate::ttl(ttl)?;
        let clock = locks.client().lease_clock().clone();
        let mut acquire = locks.acquire(key, ttl);
        if let Some(token) = token {
            acquire = acquire.token(token);
        }
        if let Some(request_id) = request_id {
            acquire = acquire.request_id(request_id);
        }
        if let Some(timeout) = wait {
            acquire = acquire.wait(timeout);
        }
        let started = clock.now();
        let acquired = acquire.send_measured().await?;
        tracing::info!(
            key = acquired.lease.key(),
            fencing_token = acquired.lease.fencing_token(),
            "lock acquired"
        );
        let state = Arc::new(State::new(acquired, ttl, clock, started));
        let mut scope = Scope {
            locks: locks.clone(),
            state: state.clone(),
            renewer: None,
            armed: true,
        };

        // A slow or retried acquire may leave no time before the first
        // renewal: renew once before running `f`.
        if state.next_delay().is_zero() {
            if let Err(lost) = renew_in_window(&state, &locks).await {
                state.mark(lost.clone());
                let _ = scope.release().await;
                return Err(E::from(Error::LockLost(lost)));
            }
        }
        scope.start_renewer();

        let guard = LockGuard {
            state: state.clone(),
        };
        let outcome = CatchUnwind(Box::pin(async move {
            let lost_guard = guard.clone();
            let work = f(guard);
            if cancel_on_loss {
                tokio::select! {
                    biased;
                    result = work => result,
                    _ = lost_guard.lost() => Err(E::from(Error::LockLost(
                        lost_guard.failure().expect("a loss is recorded"),
                    ))),
                }
            } else {
                work.await
            }
        }))
        .await;

        scope.stop_renewer().await;
        // Expiry counts up to this moment; time spent releasing does not.
        state.check();
        let loss = state.failure();
        // Guard clones that outlive `f` stop believing before the lock can
        // be free for someone else.
        state.mark(LockLost::new(state.key.clone(), LostReason::Released));
        let released = scope.release().await;

        match outcome {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(Err(err)) => Err(err),
            Ok(Ok(value)) => match (loss, released) {
                (Some(lost), _) => Err(E::from(Error::LockLost(lost))),
                (None, Err(err)) => Err(E::from(err)),
                (None, Ok(())) => Ok(value),
            },
        }
    }
}

/// Owns the renewal task and the duty to release. If the `with_lock`
/// future is dropped half-way, `Drop` stops the task and spawns a
/// best-effort release; it never blocks.
struct Scope {
    locks: Locks,
    state: Arc<State>,
    renewer: Option<JoinHandle<()>>,
    /// The lease still needs releasing.
    armed: bool,
}

impl Scope {
    fn start_renewer(&mut self) {
        let counter = self.locks.client().renewal_counter().clone();
        counter.fetch_add(1, Ordering::SeqCst);
        let live = LiveRenewal(counter);
        let first_at = self.state.next_renewal_at();
        self.renewer = Some(tokio::spawn(renewal_task(
            self.state.clone(),
            self.locks.clone(),
            first_at,
            live,
        )));
    }

    async fn stop_renewer(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Releases the latest lease (see [`release::confirmed`]), all within
    /// the client's timeout. If that fails on transient errors, the release
    /// goes on in the background for up to one ttl (the longest the server
    /// may still keep the lease), so the lock ends free rather than held.
    async fn release(&mut self) -> Result<()> {
        let lease = self.state.lease();
        let persistence = release::Persistence::foreground(&self.locks);
        let result = release::confirmed(&self.locks, &lease, persistence, None).await;
        self.armed = false;
        match &result {
            Ok(()) => tracing::info!(
                key = lease.key(),
                fencing_token = lease.fencing_token(),
                "lock released"
            ),
            Err(err) => {
                tracing::warn!(
                    key = lease.key(),
                    fencing_token = lease.fencing_token(),
                    error = %err,
                    "lock release failed"
                );
                if is_transient(err) {
                    release::in_background(
                        &self.locks,
                        lease,
                        self.state.server_may_hold_for(),
                        "final release failed; still trying",
                    );
                }
            }
        }
        result
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
        if !self.armed {
            return;
        }
        self.state
            .mark(LockLost::new(self.state.key.clone(), LostReason::Released));
        release::in_background(
            &self.locks,
            self.state.lease(),
            self.state.server_may_hold_for(),
            "scoped lock cancelled",
        );
    }
}

/// Runs a future, turning a panic in it into a value so that the lease can
/// be released before the panic continues.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::result::Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.get_mut().0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn renewal_cadence_follows_ruby() {
        // ttl 30 -> about 10 s, within ±10 %.
        assert_eq!(renewal_delay(S(30), S(30), 0.5), S(10));
        assert_eq!(renewal_delay(S(30), S(30), 0.0), Duration::from_secs(9));
        assert!(renewal_delay(S(30), S(30), 0.999_999) < Duration::from_millis(11_000));
        // ttl 300 -> 60 s cap.
        assert_eq!(renewal_delay(S(300), S(300), 0.5), S(60));
        // ttl 5 -> about 1.67 s.
        let d = renewal_delay(S(5), S(5), 0.5);
        assert!(
            d > Duration::from_millis(1_660) && d < Duration::from_millis(1_670),
            "{d:?}"
        );
        // Never later than 2 s before the deadline; zero when ≤ 2 s remain.
        assert_eq!(renewal_delay(S(30), S(5), 1.0), S(3));
        assert_eq!(renewal_delay(S(30), S(2), 0.5), Duration::ZERO);
        assert_eq!(renewal_delay(S(30), Duration::ZERO, 0.5), Duration::ZERO);
    }

    #[test]
    fn transient_errors_are_told_apart() {
        let api = |status| crate::ApiError {
            status: Some(status),
            code: None,
            message: String::new(),
            request_id: None,
            retry_after: None,
        };
        for status in [429, 500, 502, 503, 504] {
            assert!(is_transient(&Error::from_status(api(status))), "{status}");
        }
        for status in [400, 401, 403, 404, 409, 501, 418] {
            assert!(!is_transient(&Error::from_status(api(status))), "{status}");
        }
    }

    fn measured(lease: &LockLease, sent_at: Duration, granted: Option<Duration>) -> Measured {
        Measured {
            lease: lease.clone(),
            sent_at,
            granted,
        }
    }

    fn state(clock: &LeaseClock, ttl: u64) -> State {
        let lease = LockLease::new("k", "t", chrono::Utc::now(), 1);
        let now = clock.now();
        State::new(measured(&lease, now, None), S(ttl), clock.clone(), now)
    }

    #[test]
    fn is_lost_reads_the_clock_without_any_task() {
        let clock = LeaseClock::adjustable();
        let state = state(&clock, 5);
        let watch = state.lost.subscribe();
        assert!(!state.check());
        clock.advance(Duration::from_millis(4_999));
        assert!(!state.check());
        clock.advance(Duration::from_millis(1));
        assert!(state.check(), "lost exactly at the deadline");
        assert_eq!(state.failure().unwrap().reason(), LostReason::Expired);
        assert!(*watch.borrow());
    }

    #[test]
    fn first_loss_wins_and_the_watch_flips_once() {
        let clock = LeaseClock::adjustable();
        let state = state(&clock, 30);
        let mut watch = state.lost.subscribe();
        state.mark(LockLost::new("k", LostReason::Marked).with_detail("first"));
        state.mark(LockLost::new("k", LostReason::RenewalFailed));
        assert_eq!(state.failure().unwrap().reason(), LostReason::Marked);
        assert!(watch.has_changed().unwrap());
        watch.borrow_and_update();
        state.mark(LockLost::new("k", LostReason::Released));
        assert!(!watch.has_changed().unwrap(), "flips exactly once");
    }

    #[test]
    fn renewal_moves_the_deadline_from_the_send_time_and_keeps_the_cap() {
        let clock = LeaseClock::adjustable();
        let start = clock.now();
        let lease = LockLease::new("k", "t", chrono::Utc::now(), 1);
        let state = State::new(measured(&lease, start, None), S(30), clock.clone(), start);
        clock.advance(S(10));
        let sent_at = clock.now();
        clock.advance(S(2)); // the renewal took 2 s
        state.renewed(measured(&lease, sent_at, None)).unwrap();
        assert_eq!(
            state.deadline(),
            sent_at + S(30),
            "measured from before sending"
        );

        // Near the 90-day cap only the time to the cap is granted.
        let cap = start + validate::MAX_TTL;
        clock.advance(cap - clock.now() - S(3));
        let sent_at = clock.now();
        clock.advance(Duration::from_millis(1_500));
        let err = state.renewed(measured(&lease, sent_at, None)).unwrap_err();
        assert_eq!(err.reason(), LostReason::NoSafeWindow);
        assert_eq!(state.deadline(), cap);
    }

    #[test]
    fn a_shorter_grant_shortens_the_deadline_and_a_longer_one_does_not_extend_it() {
        let clock = LeaseClock::adjustable();
        let start = clock.now();
        let lease = LockLease::new("k", "t", chrono::Utc::now(), 1);
        // The server granted 9 s of the 30 asked for (say, the 90-day cap
        // of the original acquisition).
        let state = State::new(
            measured(&lease, start, Some(S(9))),
            S(30),
            clock.clone(),
            start,
        );
        assert_eq!(state.deadline(), start + S(9));
        clock.advance(S(9));
        assert!(
            state.check(),
            "lost when the server lets go, not at the ttl"
        );

        let state = State::new(
            measured(&lease, start, Some(S(3_600))),
            S(30),
            clock.clone(),
            start,
        );
        assert_eq!(state.deadline(), start + S(30), "never longer than asked");
        let state = State::new(
            measured(&lease, start, Some(Duration::ZERO)),
            S(30),
            clock,
            start,
        );
        assert!(state.check(), "an already expired grant is lost at once");
    }

    #[test]
    fn the_grant_is_read_on_the_server_clock_and_rounded_against_us() {
        use chrono::{TimeZone, Utc};
        let date = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        let expires = date + chrono::TimeDelta::milliseconds(30_700);
        assert_eq!(
            super::super::granted(expires, date),
            Duration::from_millis(29_700)
        );
        assert_eq!(super::super::granted(date, date), Duration::ZERO);
        let long_ago = date - chrono::TimeDelta::days(1);
        assert_eq!(super::super::granted(long_ago, date), Duration::ZERO);
    }
}
