//! `with_lock`: `hold` the lock, run the closure with a [`LockGuard`] while
//! the lease renews in the background, release on every exit (success,
//! error, panic, cancellation). One renewal and one exit path, shared with
//! [`HeldLock`](super::HeldLock).

use std::any::Any;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tracing::Instrument;

use super::handle::LockGuard;
use super::held::Hold;
use crate::error::Error;
use crate::locks::{Acquire, Locks};

/// `locks.with_lock(key, ttl, f)`; see [`Locks::with_lock`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[must_use = "a scoped lock does nothing until it is awaited"]
pub struct WithLock<'f, F, E> {
    /// How the lock is acquired and kept: `with_lock` is `hold`, the
    /// closure, then `release`.
    hold: Hold,
    cancel_on_loss: bool,
    f: F,
    /// `E::from`, checked where `with_lock` is called, so that a missing
    /// `From<volcano::Error>` is reported there, once.
    into_err: fn(Error) -> E,
    _scope: PhantomData<&'f ()>,
}

/// `locks.try_with_lock(key, ttl, f)`; see [`Locks::try_with_lock`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[must_use = "a scoped lock does nothing until it is awaited"]
pub struct TryWithLock<'f, F, E>(WithLock<'f, F, E>);

impl<F, E> std::fmt::Debug for WithLock<'_, F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLock")
            .field("hold", &self.hold)
            .field("cancel_on_loss", &self.cancel_on_loss)
            .finish_non_exhaustive()
    }
}

impl<F, E> std::fmt::Debug for TryWithLock<'_, F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TryWithLock").field(&self.0).finish()
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
    /// `f`'s error type `E` must implement `From<volcano::Error>`: the lock's
    /// own failures (held elsewhere, lost, release failed) arrive in it.
    /// `volcano::Error`, `anyhow::Error` and `Box<dyn Error + Send + Sync>`
    /// do; for your own type, add a variant:
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// #[derive(Debug)]
    /// enum JobError {
    ///     Lock(volcano::Error),
    ///     Store(std::io::Error),
    /// }
    /// impl From<volcano::Error> for JobError {
    ///     fn from(err: volcano::Error) -> Self {
    ///         JobError::Lock(err)
    ///     }
    /// }
    ///
    /// # async fn demo(locks: volcano::Locks) -> Result<(), JobError> {
    /// let fence = locks
    ///     .with_lock("daily-report", Duration::from_secs(30), |guard| async move {
    ///         let fence = guard.lease().fencing_token();
    ///         // ... protected work, passing `fence` to the store ...
    ///         std::fs::write("/tmp/report", "done").map_err(JobError::Store)?;
    ///         Ok::<_, JobError>(fence)
    ///     })
    ///     .await?;
    /// # let _ = fence; Ok(()) }
    /// ```
    ///
    /// To skip the run when another worker holds the lock, use
    /// [`Locks::try_with_lock`]. The builder is awaited directly; to spawn
    /// it, call [`WithLock::send`].
    pub fn with_lock<'f, F, Fut, T, E>(
        &self,
        key: impl Into<String>,
        ttl: Duration,
        f: F,
    ) -> WithLock<'f, F, E>
    where
        F: FnOnce(LockGuard) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
        T: Send + 'f,
        E: From<Error> + Send + 'f,
    {
        WithLock {
            hold: self.hold(key, ttl),
            cancel_on_loss: false,
            f,
            into_err: E::from,
            _scope: PhantomData,
        }
    }

    /// [`Locks::with_lock`], except that a lock held elsewhere is not an
    /// error: `Ok(None)` means another holder has it and `f` did not run
    /// ("skip this run"). Only the initial acquire's `409 lock_held` (after
    /// the [`TryWithLock::wait`], if any, ran out) becomes `None`; a
    /// `lock_held` from a call inside `f`, a loss, or a failed release
    /// comes back as an error, as from `with_lock`.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let ran = locks
    ///     .try_with_lock("nightly-report", Duration::from_secs(60), |guard| async move {
    ///         // ... the job ...
    ///         Ok::<_, volcano::Error>(guard.lease().fencing_token())
    ///     })
    ///     .await?;
    /// match ran {
    ///     Some(fence) => println!("ran the report under fencing token {fence}"),
    ///     None => println!("another worker has it; skipping this run"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_with_lock<'f, F, Fut, T, E>(
        &self,
        key: impl Into<String>,
        ttl: Duration,
        f: F,
    ) -> TryWithLock<'f, F, E>
    where
        F: FnOnce(LockGuard) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
        T: Send + 'f,
        E: From<Error> + Send + 'f,
    {
        TryWithLock(self.with_lock(key, ttl, f))
    }
}

acquisition_setters!(impl[F, E] WithLock<'_, F, E> {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
    max_hold,
});

acquisition_setters!(impl[F, E] TryWithLock<'_, F, E> {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
    max_hold,
});

impl<F, E> WithLock<'_, F, E> {
    fn acquire_spec(&mut self) -> &mut Acquire {
        &mut self.hold.acquire
    }

    fn hold_spec(&mut self) -> &mut Hold {
        &mut self.hold
    }

    /// Stop `f` at its next await point once ownership is lost (a
    /// `max_hold` too), and return `Error::LockLost`.
    pub fn cancel_on_loss(mut self) -> Self {
        self.cancel_on_loss = true;
        self
    }
}

impl<F, E> TryWithLock<'_, F, E> {
    fn acquire_spec(&mut self) -> &mut Acquire {
        self.0.acquire_spec()
    }

    fn hold_spec(&mut self) -> &mut Hold {
        self.0.hold_spec()
    }

    /// Stop `f` at its next await point once ownership is lost (a
    /// `max_hold` too), and return `Error::LockLost`.
    pub fn cancel_on_loss(self) -> Self {
        TryWithLock(self.0.cancel_on_loss())
    }
}

impl<'f, F, Fut, T, E> IntoFuture for WithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    type Output = std::result::Result<T, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(Ran(Box::pin(self.run(false))))
    }
}

impl<'f, F, Fut, T, E> IntoFuture for TryWithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    type Output = std::result::Result<Option<T>, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.0.run(true))
    }
}

impl<'f, F, Fut, T, E> WithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    /// Runs it: the future `.await` runs, as a value that can be spawned
    /// or stored (the builder itself is not a future).
    pub fn send(self) -> impl Future<Output = std::result::Result<T, E>> + Send + 'f {
        self.into_future()
    }

    /// `None` only when `skip_held` and the initial acquire found the lock
    /// held.
    /// The scope as one future, in its span. Built here rather than in an
    /// `async fn`: a wrapper would keep a second copy of the builder (and
    /// `f`) alive beside the scope's state for as long as the lock is held.
    fn run(
        self,
        skip_held: bool,
    ) -> tracing::instrument::Instrumented<
        impl Future<Output = std::result::Result<Option<T>, E>> + Send + 'f,
    > {
        let WithLock {
            mut hold,
            cancel_on_loss,
            f,
            into_err,
            ..
        } = self;
        // One span for the whole scope (acquire, renewals, release), under
        // the caller's; `f` runs in it too.
        let span = tracing::info_span!(
            "volcano.with_lock",
            key = %hold.key(),
            fencing_token = tracing::field::Empty
        );
        hold.span = Some(span.clone());
        Self::scoped(hold, cancel_on_loss, f, into_err, skip_held).instrument(span)
    }

    async fn scoped(
        hold: Hold,
        cancel_on_loss: bool,
        f: F,
        into_err: fn(Error) -> E,
        skip_held: bool,
    ) -> std::result::Result<Option<T>, E> {
        // Dropping this future from here on drops `held`, which stops the
        // renewal and hands the release to the client.
        // Boxed, as is `finish` below: a future's size is that of its
        // largest state, and the closure's state is the one that lasts.
        let held = match Box::pin(hold.acquire()).await {
            Ok(held) => held,
            Err(err) if skip_held && err.is_lock_held() => return Ok(None),
            Err(err) => return Err(into_err(err)),
        };
        let guard = LockGuard::clone(&held);
        let outcome = CatchUnwind(Box::pin(async move {
            let lost_guard = guard.clone();
            let work = f(guard);
            if cancel_on_loss {
                tokio::select! {
                    biased;
                    result = work => result,
                    loss = lost_guard.state.wait_lost() => Err(into_err(Error::LockLost(loss))),
                }
            } else {
                work.await
            }
        }))
        .await;
        let (loss, released) = Box::pin(held.finish()).await;

        outcome_of(outcome, loss, released, into_err).map(Some)
    }
}

/// A scope's result, once its lease was let go: a panic in the closure
/// goes on; the closure's error wins; else the loss; else the release's
/// error; else the value.
pub(super) fn outcome_of<T, E>(
    ran: std::result::Result<std::result::Result<T, E>, Box<dyn Any + Send>>,
    loss: Option<crate::LockLost>,
    released: crate::error::Result<()>,
    into_err: impl FnOnce(Error) -> E,
) -> std::result::Result<T, E> {
    match ran {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(Err(err)) => Err(err),
        Ok(Ok(value)) => match (loss, released) {
            (Some(lost), _) => Err(into_err(Error::LockLost(lost))),
            (None, Err(err)) => Err(into_err(err)),
            (None, Ok(())) => Ok(value),
        },
    }
}

impl<'f, F, Fut, T, E> TryWithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    /// Runs it: the future `.await` runs, as a value that can be spawned
    /// or stored (the builder itself is not a future).
    pub fn send(self) -> impl Future<Output = std::result::Result<Option<T>, E>> + Send + 'f {
        self.into_future()
    }
}

/// `with_lock`'s outcome from the shared scope's: `f` ran (the scope only
/// returns `None` when asked to skip a held lock, which `with_lock` never
/// asks). A plain future rather than an `async` block, for the same reason
/// as [`WithLock::run`].
struct Ran<F>(Pin<Box<F>>);

impl<F, T, E> Future for Ran<F>
where
    F: Future<Output = std::result::Result<Option<T>, E>>,
{
    type Output = std::result::Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut()
            .0
            .as_mut()
            .poll(cx)
            .map(|ran| ran.map(|value| value.expect("with_lock runs f or fails")))
    }
}

/// Runs a future, turning a panic in it into a value so that the lease can
/// be released before the panic continues.
pub(super) struct CatchUnwind<F>(pub(super) Pin<Box<F>>);

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
