//! The builders of `with_lock`, `try_with_lock` and `with_locks`: they
//! collect the options and the closure, and `.await` hands them to the
//! engine ([`engine::scope`]).

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::time::Duration;

use crate::error::Error;
use crate::locks::engine::scope::{self, Ends};
use crate::locks::engine::Spec;
use crate::locks::{AcquireOptions, LockGuard, LockSet, Locks};

/// `locks.with_lock(key, ttl, f)`; see [`Locks::with_lock`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[must_use = "a scoped lock does nothing until it is awaited"]
pub struct WithLock<'f, F, E> {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) options: AcquireOptions,
    pub(crate) cancel_on_loss: bool,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) f: F,
    /// `E::from`, checked where `with_lock` is called, so that a missing
    /// `From<volcano::Error>` is reported there, once.
    pub(crate) into_err: fn(Error) -> E,
    pub(crate) _scope: PhantomData<&'f ()>,
}

/// `locks.try_with_lock(key, ttl, f)`; see [`Locks::try_with_lock`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[must_use = "a scoped lock does nothing until it is awaited"]
pub struct TryWithLock<'f, F, E>(pub(crate) WithLock<'f, F, E>);

impl<F, E> std::fmt::Debug for WithLock<'_, F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLock")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("options", &self.options)
            .field("cancel_on_loss", &self.cancel_on_loss)
            .field("min_hold", &self.min_hold)
            .finish_non_exhaustive()
    }
}

impl<F, E> std::fmt::Debug for TryWithLock<'_, F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TryWithLock").field(&self.0).finish()
    }
}

option_setters!(impl[F, E] WithLock<'_, F, E> => [options] {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
    max_hold,
});

option_setters!(impl[F, E] TryWithLock<'_, F, E> => [0 options] {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
    max_hold,
});

impl<F, E> WithLock<'_, F, E> {
    /// Sets every option at once, replacing those set before.
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.options = options;
        self
    }

    /// Stop `f` at its next await point once ownership is lost (a
    /// `max_hold` too), and return `Error::LockLost`.
    pub fn cancel_on_loss(mut self) -> Self {
        self.cancel_on_loss = true;
        self
    }

    /// Keeps the lock at least `min_hold` after it was acquired, however
    /// soon `f` returns, so a job that finishes in two seconds runs at most
    /// once per period across hosts whose clocks and schedules differ by a
    /// few seconds (ShedLock's `lockAtLeastFor`). The minimum is kept by the
    /// service, not by this process: when `f` returns, one renewal sets the
    /// lease's expiry to the minimum's end, nothing is released, and the
    /// future completes once that renewal is answered. The key stays taken
    /// until then even if the process exits at once.
    ///
    /// - The expiry is the time left of the minimum rounded up to a whole
    ///   second, never under the shortest lease (5 s): a job that ends less
    ///   than 5 s before its minimum's end keeps the key up to 5 s from
    ///   then. The key is free by that expiry plus the service's grace.
    /// - A minimum already passed when `f` returns releases, as without
    ///   one. A panic in `f` is not held back: the lease is released.
    /// - A loss before `f` returned is reported as without a minimum. A
    ///   keeping renewal answered by another token's lease is a loss
    ///   (`Error::LockLost`): when the key was taken cannot be told. One
    ///   that cannot be made (the service failing until the lease's
    ///   deadline) does not change the outcome, since the work was covered,
    ///   but the minimum is not kept: the key is free at the lease's last
    ///   expiry. That is logged at WARN ("minimum hold not kept") and counted
    ///   in `volcano_min_hold_not_kept_total`.
    /// - It never outlives `max_hold`: a `min_hold` longer than the
    ///   `max_hold` (or than 90 days) is `Error::InvalidArgument`, before
    ///   anything is sent.
    /// - Dropping the future while `f` runs releases the lease at once, as
    ///   always. [`Client::shutdown`](crate::Client::shutdown) neither
    ///   waits for nor releases a kept minimum.
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }
}

impl<F, E> TryWithLock<'_, F, E> {
    /// Sets every option at once, replacing those set before.
    pub fn options(self, options: AcquireOptions) -> Self {
        TryWithLock(self.0.options(options))
    }

    /// Stop `f` at its next await point once ownership is lost (a
    /// `max_hold` too), and return `Error::LockLost`.
    pub fn cancel_on_loss(self) -> Self {
        TryWithLock(self.0.cancel_on_loss())
    }

    /// Keeps the lock at least `min_hold` after it was acquired, however
    /// soon `f` returns; see [`WithLock::min_hold`]. For a job run from
    /// cron on several hosts: the ones whose schedule fires a little later
    /// find the lock still held and skip (`Ok(None)`).
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let ran = locks
    ///     .try_with_lock("nightly-report", Duration::from_secs(60), |_guard| async move {
    ///         // ... a job that may take two seconds ...
    ///         Ok::<_, volcano::Error>(())
    ///     })
    ///     .min_hold(Duration::from_secs(60))
    ///     .await?;
    /// # let _ = ran; Ok(()) }
    /// ```
    pub fn min_hold(self, min_hold: Duration) -> Self {
        TryWithLock(self.0.min_hold(min_hold))
    }
}

impl<'f, F, Fut, T, E> WithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    /// Runs it: the future `.await` runs, as a value that can be spawned
    /// or stored (the builder itself is not a future).
    pub fn send(self) -> impl Future<Output = Result<T, E>> + Send + 'f {
        self.into_future()
    }

    /// The engine's scope, ending as `ends` says.
    fn scope<U: Send + 'f>(
        self,
        ends: Ends<T, U>,
    ) -> Pin<Box<dyn Future<Output = Result<U, E>> + Send + 'f>> {
        let spec = Spec::new(&self.locks, self.key, self.ttl, self.options);
        let how = scope::How {
            cancel_on_loss: self.cancel_on_loss,
            min_hold: self.min_hold,
        };
        Box::pin(scope::with_lock(spec, how, self.f, self.into_err, ends))
    }
}

impl<'f, F, Fut, T, E> IntoFuture for WithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    type Output = Result<T, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        self.scope(Ends::with_lock())
    }
}

impl<'f, F, Fut, T, E> TryWithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    /// Runs it: the future `.await` runs, as a value that can be spawned
    /// or stored (the builder itself is not a future).
    pub fn send(self) -> impl Future<Output = Result<Option<T>, E>> + Send + 'f {
        self.into_future()
    }
}

impl<'f, F, Fut, T, E> IntoFuture for TryWithLock<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    type Output = Result<Option<T>, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        self.0.scope(Ends::try_with_lock())
    }
}

/// `locks.with_locks(keys, ttl, f)`; see [`Locks::with_locks`].
#[must_use = "the locks are acquired only when this is awaited"]
pub struct WithLocks<'f, F> {
    pub(crate) locks: Locks,
    pub(crate) keys: Vec<String>,
    pub(crate) ttl: Duration,
    pub(crate) options: AcquireOptions,
    pub(crate) f: F,
    pub(crate) _scope: PhantomData<&'f ()>,
}

impl<F> std::fmt::Debug for WithLocks<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLocks")
            .field("keys", &self.keys)
            .field("ttl", &self.ttl)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

option_setters!(impl[F] WithLocks<'_, F> => [options] {
    wait,
    poll_interval,
    max_hold,
});

impl<'f, F, Fut, T, E> WithLocks<'f, F>
where
    F: FnOnce(LockSet) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: From<Error> + Send + 'f,
{
    /// Runs it: the future `.await` runs, as a value that can be spawned
    /// or stored (the builder itself is not a future).
    pub fn send(self) -> impl Future<Output = Result<T, E>> + Send + 'f {
        self.into_future()
    }
}

impl<'f, F, Fut, T, E> IntoFuture for WithLocks<'f, F>
where
    F: FnOnce(LockSet) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: From<Error> + Send + 'f,
{
    type Output = Result<T, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        let WithLocks {
            locks,
            keys,
            ttl,
            options,
            f,
            ..
        } = self;
        Box::pin(scope::with_locks(locks, keys, ttl, options, f))
    }
}
