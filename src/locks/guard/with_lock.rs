//! `with_lock`: acquire, run the closure with a [`LockGuard`] while the
//! lease renews in the background, release on every exit (success, error,
//! panic, cancellation).

use std::any::Any;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::handle::LockGuard;
use super::renewal::{renew_in_window, renewal_task, LiveRenewal};
use super::state::State;
use crate::error::{Error, LockLost, LostReason, Result};
use crate::locks::release::{self, is_transient};
use crate::locks::Locks;
use crate::validate;

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
    /// [`Acquire::wait`](crate::Acquire::wait)) before giving up with the
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
