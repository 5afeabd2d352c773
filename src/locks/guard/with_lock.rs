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

use super::handle::LockGuard;
use super::held::Hold;
use crate::error::Error;
use crate::locks::Locks;

/// `locks.with_lock(key, ttl, f)`; see [`Locks::with_lock`].
#[must_use = "a scoped lock does nothing until it is awaited"]
pub struct WithLock<'f, F> {
    /// How the lock is acquired and kept: `with_lock` is `hold`, the
    /// closure, then `release`.
    hold: Hold,
    cancel_on_loss: bool,
    f: F,
    _scope: PhantomData<&'f ()>,
}

impl<F> std::fmt::Debug for WithLock<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLock")
            .field("hold", &self.hold)
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
            hold: self.hold(key, ttl),
            cancel_on_loss: false,
            f,
            _scope: PhantomData,
        }
    }
}

impl<F> WithLock<'_, F> {
    /// Acquire with this ownership token (a UUID string, sent verbatim).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.hold = self.hold.token(token);
        self
    }

    /// Acquire with this request id; renewals and the release use fresh ones.
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.hold = self.hold.request_id(request_id);
        self
    }

    /// If the lock is held, wait up to `timeout` for it (see
    /// [`Acquire::wait`](crate::Acquire::wait)) before giving up with the
    /// last `Error::Conflict`.
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.hold = self.hold.wait(timeout);
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
            hold,
            cancel_on_loss,
            f,
            ..
        } = self;
        // Dropping this future from here on drops `held`, which stops the
        // renewal and hands the release to the client.
        // Boxed, as is `finish` below: a future's size is that of its
        // largest state, and the closure's state is the one that lasts.
        let held = Box::pin(hold.acquire()).await?;
        let guard = LockGuard::clone(&held);
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
        let (loss, released) = Box::pin(held.finish()).await;

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
