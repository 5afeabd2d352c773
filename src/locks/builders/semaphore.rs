//! The builders of a semaphore's permits: `acquire`, `with_permit` and
//! `try_with_permit` collect the options, and `.await` hands them to the
//! engine ([`engine::semaphore`]).

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::locks::engine::scope::{self, Ends};
use crate::locks::engine::semaphore::{self as engine, PermitSpec};
use crate::locks::{AcquireOptions, HeldLock, LockGuard, Locks};
use crate::BoxFuture;

/// A counting semaphore over locks, from [`Locks::semaphore`]: at most
/// `permits` holders at once across every process, each holding one
/// permit. Permit `i` of `name` is the lock `name:i` (`i` in
/// `0..permits`), with its own lease, renewal and fencing token, so
/// everything a lock promises holds per permit: an uncertain acquire is
/// undone, a loss is reported on the permit's guard, and a store can fence
/// each permit's writes by its key and fencing token. Cheap to clone;
/// clones, and semaphores of the same client with the same name and count,
/// share what the client remembers of the permits and their waiters' turn.
///
/// The count is part of what every holder must agree on: semaphores of the
/// same name with different counts share keys (`x` with 4 and with 5
/// together let five hold). When lowering N in a rolling deploy, holders of
/// the old count may still hold a permit at or above the new N until they
/// release it; use a new name for a new count if that matters.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// // At most 4 workers call the partner API at once, fleet-wide.
/// let partner = locks.semaphore("partner-api", 4);
/// partner
///     .with_permit(Duration::from_secs(30), |permit| async move {
///         // ... a call, fenced by permit.lease().key() and its fencing token ...
///         # let _ = permit;
///         Ok::<_, volcano::Error>(())
///     })
///     .wait(Duration::from_secs(60))
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    pub(crate) locks: Locks,
    pub(crate) name: String,
    pub(crate) permits: u32,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .finish()
    }
}

impl Semaphore {
    /// Its name: permit `i` is the lock `"{name}:{i}"`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Whether its name and count fit (`Error::InvalidArgument` if not),
    /// without sending anything: every permit's key `name:i` a valid key,
    /// and 1 to [`MAX_PERMITS`](crate::MAX_PERMITS) permits.
    pub fn check(&self) -> Result<()> {
        engine::check(&self.name, self.permits)
    }

    /// The key of permit `i` (for `get`, `force_release` or a fence).
    pub fn permit_key(&self, i: u32) -> String {
        engine::permit_key(&self.name, i)
    }

    /// Takes a permit: a renewing [`HeldLock`] on its key, as
    /// [`Locks::hold`] gives. Without `.wait(..)` one round of tries, on
    /// through the permits until one is free: a permit taken (one request
    /// when the first tried is free), or `Error::Conflict`
    /// (`is_lock_held()`) only when every permit was seen held (one
    /// request each). A permit this client releases is tried first by its
    /// own waiter on the semaphore, at once. A name whose permits' keys are not valid keys, a
    /// count of 0 or over [`MAX_PERMITS`](crate::MAX_PERMITS), and a token
    /// or request id of the caller's are `Error::InvalidArgument`, before
    /// anything is sent.
    pub fn acquire(&self, ttl: Duration) -> AcquirePermit {
        AcquirePermit {
            semaphore: self.clone(),
            ttl,
            options: AcquireOptions::default(),
            min_hold: None,
        }
    }

    /// Runs `f` under a permit, as [`Locks::with_lock`] runs it under a
    /// lock: the permit renews in the background and is released on every
    /// exit. Every failure to take a permit is an error.
    pub fn with_permit<'f, F, Fut, T, E>(&self, ttl: Duration, f: F) -> WithPermit<'f, F, E>
    where
        F: FnOnce(LockGuard) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
        E: From<Error>,
    {
        WithPermit {
            acquire: self.acquire(ttl),
            cancel_on_loss: false,
            f,
            into_err: E::from,
            _scope: PhantomData,
        }
    }

    /// [`with_permit`](Self::with_permit), but `Ok(None)` (the closure not
    /// run) when every permit was held (within `.wait(..)`, if set).
    pub fn try_with_permit<'f, F, Fut, T, E>(&self, ttl: Duration, f: F) -> TryWithPermit<'f, F, E>
    where
        F: FnOnce(LockGuard) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
        E: From<Error>,
    {
        TryWithPermit(self.with_permit(ttl, f))
    }
}

/// `semaphore.acquire(ttl)`; see [`Semaphore::acquire`]. A builder, not a
/// future: `.await` it, or `.send()` for a future to spawn or store.
#[derive(Debug, Clone)]
#[must_use = "a permit is acquired only when this is awaited"]
pub struct AcquirePermit {
    semaphore: Semaphore,
    ttl: Duration,
    options: AcquireOptions,
    min_hold: Option<Duration>,
}

option_setters!(impl[] AcquirePermit => [options] {
    timeout,
    wait,
    poll_interval,
    max_hold,
});

impl AcquirePermit {
    /// Sets every option at once, replacing those set before (its token
    /// and request id must be unset: a permit's are the SDK's).
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.options = options;
        self
    }

    /// Keeps the permit at least `min_hold` after it was taken, as
    /// [`Hold::min_hold`](crate::Hold::min_hold): a release before then
    /// has the service keep it until the minimum's end.
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// Acquires: the future `.await` runs, as a value that can be spawned
    /// or stored.
    pub fn send(self) -> impl Future<Output = Result<HeldLock>> + Send + 'static {
        self.into_future()
    }

    fn spec(self) -> PermitSpec {
        PermitSpec {
            locks: self.semaphore.locks,
            name: self.semaphore.name,
            permits: self.semaphore.permits,
            ttl: self.ttl,
            options: self.options,
            min_hold: self.min_hold,
        }
    }
}

impl IntoFuture for AcquirePermit {
    type Output = Result<HeldLock>;
    type IntoFuture = BoxFuture<Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        let span = tracing::info_span!(
            "volcano.permit",
            semaphore = %self.semaphore.name,
            permits = self.semaphore.permits
        );
        Box::pin(tracing::Instrument::instrument(
            engine::acquire(self.spec()),
            span,
        ))
    }
}

/// `semaphore.with_permit(ttl, f)`; see [`Semaphore::with_permit`].
#[must_use = "a scoped permit does nothing until it is awaited"]
pub struct WithPermit<'f, F, E> {
    acquire: AcquirePermit,
    cancel_on_loss: bool,
    f: F,
    into_err: fn(Error) -> E,
    _scope: PhantomData<&'f ()>,
}

/// `semaphore.try_with_permit(ttl, f)`; see [`Semaphore::try_with_permit`].
#[must_use = "a scoped permit does nothing until it is awaited"]
pub struct TryWithPermit<'f, F, E>(WithPermit<'f, F, E>);

impl<F, E> std::fmt::Debug for WithPermit<'_, F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithPermit")
            .field("acquire", &self.acquire)
            .field("cancel_on_loss", &self.cancel_on_loss)
            .finish_non_exhaustive()
    }
}

impl<F, E> std::fmt::Debug for TryWithPermit<'_, F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TryWithPermit").field(&self.0).finish()
    }
}

option_setters!(impl[F, E] WithPermit<'_, F, E> => [acquire options] {
    timeout,
    wait,
    poll_interval,
    max_hold,
});

option_setters!(impl[F, E] TryWithPermit<'_, F, E> => [0 acquire options] {
    timeout,
    wait,
    poll_interval,
    max_hold,
});

impl<F, E> WithPermit<'_, F, E> {
    /// Stop `f` at its next await point once the permit is lost, and
    /// return `Error::LockLost`.
    pub fn cancel_on_loss(mut self) -> Self {
        self.cancel_on_loss = true;
        self
    }

    /// Keeps the permit at least `min_hold` after it was taken, however
    /// soon `f` returns, kept by the service (see
    /// [`WithLock::min_hold`](crate::WithLock::min_hold)).
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.acquire.min_hold = Some(min_hold);
        self
    }

    /// Sets every option at once, as [`AcquirePermit::options`] does.
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.acquire = self.acquire.options(options);
        self
    }
}

impl<F, E> TryWithPermit<'_, F, E> {
    /// See [`WithPermit::options`].
    pub fn options(self, options: AcquireOptions) -> Self {
        TryWithPermit(self.0.options(options))
    }

    /// See [`WithPermit::cancel_on_loss`].
    pub fn cancel_on_loss(self) -> Self {
        TryWithPermit(self.0.cancel_on_loss())
    }

    /// See [`WithPermit::min_hold`].
    pub fn min_hold(self, min_hold: Duration) -> Self {
        TryWithPermit(self.0.min_hold(min_hold))
    }
}

impl<'f, F, Fut, T, E> WithPermit<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    /// Runs it, as a value that can be spawned or stored.
    pub fn send(self) -> impl Future<Output = std::result::Result<T, E>> + Send + 'f {
        self.into_future()
    }

    fn scope<U: Send + 'f>(
        self,
        ends: Ends<T, U>,
    ) -> Pin<Box<dyn Future<Output = std::result::Result<U, E>> + Send + 'f>> {
        let span = tracing::info_span!(
            "volcano.with_permit",
            semaphore = %self.acquire.semaphore.name,
            permits = self.acquire.semaphore.permits
        );
        let how = scope::How {
            cancel_on_loss: self.cancel_on_loss,
            min_hold: None,
        };
        let acquire: BoxFuture<Result<HeldLock>> = Box::pin(engine::acquire(self.acquire.spec()));
        Box::pin(scope::with_held(
            acquire,
            span,
            how,
            self.f,
            self.into_err,
            ends,
        ))
    }
}

impl<'f, F, Fut, T, E> IntoFuture for WithPermit<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    type Output = std::result::Result<T, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        self.scope(Ends::with_lock())
    }
}

impl<'f, F, Fut, T, E> TryWithPermit<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    /// Runs it, as a value that can be spawned or stored.
    pub fn send(self) -> impl Future<Output = std::result::Result<Option<T>, E>> + Send + 'f {
        self.into_future()
    }
}

impl<'f, F, Fut, T, E> IntoFuture for TryWithPermit<'f, F, E>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: Send + 'f,
{
    type Output = std::result::Result<Option<T>, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        self.0.scope(Ends::try_with_lock())
    }
}
