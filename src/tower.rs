//! Locks and permits as [tower](https://docs.rs/tower/0.5) middleware
//! (feature `tower`): one layer makes every call of a service run under a
//! lock ([`LockLayer`]: one call at a time per key, across every process),
//! or under one permit of a semaphore ([`PermitLayer`]: at most N calls at
//! once across every process, the fleet-wide counterpart of tower's
//! `ConcurrencyLimitLayer`).
//!
//! ```no_run
//! # async fn demo(locks: volcano::Locks) {
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt as _};
//! use volcano::tower::LockLayer;
//!
//! struct Job {
//!     id: u64,
//! }
//!
//! let svc = ServiceBuilder::new()
//!     .layer(LockLayer::new(locks.clone(), Duration::from_secs(30), |job: &Job| {
//!         format!("job-{}", job.id)
//!     }))
//!     .service_fn(|job: Job| async move {
//!         // ... the job, once at a time per id, fleet-wide ...
//!         Ok::<_, std::io::Error>(job.id)
//!     });
//! match svc.oneshot(Job { id: 7 }).await {
//!     Ok(id) => println!("ran job {id}"),
//!     Err(err) => match err.downcast_ref::<volcano::Error>() {
//!         Some(lock) if lock.is_lock_held() => println!("job 7 runs elsewhere: retry later"),
//!         _ => println!("job 7 failed: {err}"),
//!     },
//! }
//! # }
//! ```
//!
//! # What each call gets
//!
//! Each call runs under [`Locks::with_lock`] (or
//! [`Semaphore::with_permit`](crate::Semaphore::with_permit)): the lock is acquired in `call`, renewed in
//! the background while the inner service's future runs, and released when
//! that future completes, fails, panics or is dropped (a client that gives
//! up, a timeout layer outside). `.min_hold(..)` keeps it as
//! `with_lock`'s does.
//!
//! The inner service sees the lock through [`guard`]: inside its future,
//! `volcano::tower::guard()` is the call's [`LockGuard`], for its fencing
//! token (pass it to the store you write to) and `lost()`. It is a task
//! local: a task the call spawns does not see it (clone the guard into
//! it).
//!
//! # Errors
//!
//! The layered service's error is [`tower::BoxError`]:
//!
//! - the lock (or every permit) held elsewhere, after the `.wait(..)` if
//!   any: a [`crate::Error`] with [`is_lock_held`](crate::Error::is_lock_held)
//!   (`err.downcast_ref::<volcano::Error>()`). A job framework retries it
//!   later; an HTTP handler answers 409 or 429;
//! - a key from `key_of` that is not a valid key, or any other failure to
//!   take the lock: a [`crate::Error`] too (`InvalidArgument`, a transport
//!   error, ...), never a panic;
//! - the inner service's own error: passed through, boxed (downcast it to
//!   its own type);
//! - a loss while the call ran: with `.cancel_on_loss()`, the inner future
//!   is dropped at its next await point and the call fails with
//!   `Error::LockLost`; without it, the call completes and then fails with
//!   `Error::LockLost` unless the inner service failed first (as
//!   `with_lock`);
//! - a release that failed after the inner call succeeded: that error (the
//!   response is dropped, though the work was done; a transient failure is
//!   tried again in the background, and `Client::shutdown` names the key).
//!
//! The lock covers the inner service's future: a response body streamed
//! after it (an HTTP body) is not under the lock. With layers nested,
//! [`guard`] is the innermost one's.
//!
//! # Readiness and backpressure
//!
//! `poll_ready` is the inner service's: the lock depends on the request,
//! so it is taken in `call`, not reserved in `poll_ready`. A service that
//! says it is ready may still wait in `call` for its lock (up to
//! `.wait(..)`) or fail there with "held". The inner service is made
//! ready again once the lock is held: what its `poll_ready` reserved (a
//! slot of a `Buffer` or `ConcurrencyLimit` inside the layer) is given back
//! while the call waits. Layers outside count such a call as in flight: a
//! `ConcurrencyLimitLayer` outside holds a slot while the call waits for
//! its lock, and a load shedder sees readiness, not the lock. To shed
//! calls whose lock is taken, leave `.wait` unset: they fail at once,
//! after one request. The inner service must be `Clone`: wrap one that is
//! not in a `Buffer`.
//!
//! # Retries
//!
//! Each try of a held lock is a request against the project's quota (600
//! lock operations a minute, shared by the fleet). A retry policy that
//! retries "held" at once spends it fast and finds the lock held again: let
//! it back off (seconds), or use `.wait(..)`, which polls at a bounded
//! rate and notices a release at once when the holder uses the same
//! `Client`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{BoxError, Layer, Service};

use crate::{AcquireOptions, LockGuard, Locks};

mod permit;
pub use permit::{PermitLayer, PermitService};

/// The future of a layered call.
pub(crate) type Call<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

tokio::task_local! {
    static GUARD: LockGuard;
}

/// The lock (or permit) of the call running on this task: inside the inner
/// service's future under a [`LockLayer`] or [`PermitLayer`]. `None`
/// elsewhere, in a task the call spawned too.
pub fn guard() -> Option<LockGuard> {
    GUARD.try_with(LockGuard::clone).ok()
}

/// What every layered call asks of its lock or permit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asks {
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) cancel_on_loss: bool,
    pub(crate) min_hold: Option<Duration>,
}

impl Asks {
    pub(crate) fn new(ttl: Duration) -> Self {
        Asks {
            ttl,
            wait: None,
            cancel_on_loss: false,
            min_hold: None,
        }
    }

    pub(crate) fn options(self) -> AcquireOptions {
        AcquireOptions::default().set_wait(self.wait)
    }
}

/// Runs each call of the inner service under the lock of the key
/// `key_of(&request)`; see the [module](self).
pub struct LockLayer<K> {
    locks: Locks,
    key_of: Arc<K>,
    asks: Asks,
}

impl<K> LockLayer<K> {
    /// Each call under the lock `key_of(&request)`, with leases of `ttl`.
    /// Without [`wait`](Self::wait), a call whose lock is held fails at
    /// once (one request).
    pub fn new(locks: Locks, ttl: Duration, key_of: K) -> Self {
        LockLayer {
            locks,
            key_of: Arc::new(key_of),
            asks: Asks::new(ttl),
        }
    }

    /// Waits up to `wait` for a held lock (as `with_lock`'s
    /// [`AcquireOptions::wait`]), then fails with "held".
    pub fn wait(mut self, wait: Duration) -> Self {
        self.asks.wait = Some(wait);
        self
    }

    /// Drops the call at its next await point once the lock is lost: it
    /// fails with `Error::LockLost`.
    pub fn cancel_on_loss(mut self) -> Self {
        self.asks.cancel_on_loss = true;
        self
    }

    /// Keeps the lock at least `min_hold` after it was acquired, however
    /// soon the call ends, as [`WithLock::min_hold`](crate::WithLock::min_hold).
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.asks.min_hold = Some(min_hold);
        self
    }
}

impl<K> Clone for LockLayer<K> {
    fn clone(&self) -> Self {
        LockLayer {
            locks: self.locks.clone(),
            key_of: self.key_of.clone(),
            asks: self.asks,
        }
    }
}

impl<K> fmt::Debug for LockLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("locks", &self.locks)
            .field("ttl", &self.asks.ttl)
            .field("wait", &self.asks.wait)
            .field("cancel_on_loss", &self.asks.cancel_on_loss)
            .field("min_hold", &self.asks.min_hold)
            .finish_non_exhaustive()
    }
}

impl<S, K> Layer<S> for LockLayer<K> {
    type Service = LockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service a [`LockLayer`] makes.
pub struct LockService<S, K> {
    inner: S,
    layer: LockLayer<K>,
}

impl<S: Clone, K> Clone for LockService<S, K> {
    fn clone(&self) -> Self {
        LockService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for LockService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, K, Req> Service<Req> for LockService<S, K>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    K: Fn(&Req) -> String + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Call<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let key = (self.layer.key_of)(&request);
        let inner = unreserved(&mut self.inner);
        let asks = self.layer.asks;
        let mut scope = self
            .layer
            .locks
            .with_lock(key, asks.ttl, move |guard| under(guard, inner, request))
            .options(asks.options());
        if asks.cancel_on_loss {
            scope = scope.cancel_on_loss();
        }
        if let Some(min_hold) = asks.min_hold {
            scope = scope.min_hold(min_hold);
        }
        Box::pin(scope.send())
    }
}

/// The inner service for this call, made ready again once the lock is
/// held ([`under`]): the instance `poll_ready` made ready is dropped here,
/// so that what it reserved (a `Buffer`'s slot, a `ConcurrencyLimit`'s
/// permit) is not held while the call waits for its lock, and a clone not
/// polled yet takes its place for the next call (tower's rule for a
/// service called from a future).
pub(crate) fn unreserved<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    let reserved = std::mem::replace(inner, fresh);
    let for_the_call = reserved.clone();
    drop(reserved);
    for_the_call
}

/// The inner call, made ready first, with its guard reachable through
/// [`guard`].
pub(crate) async fn under<S, Req>(
    guard: LockGuard,
    mut inner: S,
    request: Req,
) -> Result<S::Response, BoxError>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    GUARD
        .scope(guard, async move {
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(request).await
        })
        .await
        .map_err(Into::into)
}
