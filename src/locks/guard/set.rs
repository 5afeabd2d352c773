//! Several keys at once: `locks.hold_all(keys, ttl)` ([`HeldLocks`]) and
//! `locks.with_locks(keys, ttl, f)`. The keys are deduplicated and acquired
//! one by one in one canonical order (sorted), so two callers whose sets
//! overlap never wait for each other in a cycle; any failure lets go of
//! every key already taken (an uncertain acquire is undone as any other),
//! so a set is held whole or not at all.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::handle::LockGuard;
use super::held::{HeldLock, Hold};
use super::with_lock::{outcome_of, CatchUnwind};
use crate::error::{Error, LockLost, Result};
use crate::locks::{Acquire, Locks};
use crate::validate;
use crate::BoxFuture;

/// `locks.hold_all(keys, ttl)`; see [`Locks::hold_all`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[must_use = "the locks are acquired only when this is awaited"]
#[derive(Debug, Clone)]
pub struct HoldAll {
    /// The options every key is held with; its key is unused.
    hold: Hold,
    keys: Vec<String>,
}

impl Locks {
    /// Acquires every key of `keys` (deduplicated, in sorted order) and
    /// keeps them all, each renewed in the background as by
    /// [`Locks::hold`]. All or nothing: if one cannot be had (held
    /// elsewhere past the wait, an error, the future dropped), the keys
    /// already taken are released before this returns, and an acquire
    /// whose outcome is unknown is undone. [`HoldAll::wait`] is one
    /// deadline for the whole set.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let set = locks
    ///     .hold_all(["accounts", "ledger"], Duration::from_secs(30))
    ///     .wait(Duration::from_secs(30))
    ///     .await?;
    /// let fence = set.fencing_token("ledger");
    /// // ... work, passing each key's fence to the store ...
    /// set.release().await?;
    /// # let _ = fence; Ok(()) }
    /// ```
    pub fn hold_all<I, K>(&self, keys: I, ttl: Duration) -> HoldAll
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        HoldAll {
            hold: self.hold(String::new(), ttl),
            keys: keys.into_iter().map(Into::into).collect(),
        }
    }

    /// [`Locks::with_lock`] over several keys: acquires them all as
    /// [`Locks::hold_all`] does, runs `f` with the [`LockSet`], then
    /// releases them all (on success, error, panic or cancellation). The
    /// outcome follows `with_lock`'s rules: `f`'s error wins; else a loss
    /// of any key is `Error::LockLost`; else a failed release; else `f`'s
    /// value.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// locks
    ///     .with_locks(["accounts", "ledger"], Duration::from_secs(30), |set| async move {
    ///         let fence = set.fencing_token("accounts");
    ///         // ... protected work ...
    ///         # let _ = fence;
    ///         Ok::<_, volcano::Error>(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn with_locks<'f, I, K, F, Fut, T, E>(
        &self,
        keys: I,
        ttl: Duration,
        f: F,
    ) -> WithLocks<'f, F>
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
        F: FnOnce(LockSet) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
        T: Send + 'f,
        E: From<Error> + Send + 'f,
    {
        WithLocks {
            all: self.hold_all(keys, ttl),
            f,
            _scope: PhantomData,
        }
    }
}

acquisition_setters!(impl[] HoldAll {
    wait,
    poll_interval,
    max_hold,
});

impl HoldAll {
    fn acquire_spec(&mut self) -> &mut Acquire {
        &mut self.hold.acquire
    }

    fn hold_spec(&mut self) -> &mut Hold {
        &mut self.hold
    }

    /// Acquires: the future `.await` runs, as a value that can be spawned
    /// or stored.
    pub fn send(self) -> impl Future<Output = Result<HeldLocks>> + Send + 'static {
        self.into_future()
    }

    async fn acquire(self) -> Result<HeldLocks> {
        let HoldAll { hold, mut keys } = self;
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return Err(Error::invalid("hold_all needs at least one key"));
        }
        // Nothing is sent when any argument is invalid.
        validate::ttl(hold.acquire.ttl)?;
        for key in &keys {
            validate::key(key)?;
        }
        let deadline = hold
            .acquire
            .wait
            .map(|timeout| Instant::now().checked_add(timeout));
        // Dropped with this future, each one hands its release to the client.
        let mut held: Vec<HeldLock> = Vec::with_capacity(keys.len());
        for key in keys {
            let mut one = hold.clone();
            one.acquire.key = key;
            one.acquire.wait = deadline.map(|deadline| {
                deadline.map_or(Duration::MAX, |d| {
                    d.saturating_duration_since(Instant::now())
                })
            });
            match one.await {
                Ok(lock) => held.push(lock),
                Err(err) => {
                    release_all(held).await;
                    return Err(err);
                }
            }
        }
        // A key taken early may have been lost while a later one was waited
        // for: the set is not whole, so it is not handed over.
        if let Some(lost) = held.iter().find_map(|lock| lock.failure()) {
            release_all(held).await;
            return Err(Error::LockLost(lost));
        }
        Ok(HeldLocks::new(held))
    }
}

/// Releases the keys of a set that could not be completed. Their errors
/// are not lost: a release that did not free its lease goes on in the
/// background or is recorded for `Client::shutdown` (`release::let_go`).
async fn release_all(held: Vec<HeldLock>) {
    for lock in held.into_iter().rev() {
        let _ = lock.release().await;
    }
}

impl IntoFuture for HoldAll {
    type Output = Result<HeldLocks>;
    type IntoFuture = BoxFuture<Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.acquire())
    }
}

/// A view of a held set: each key's [`LockGuard`], and one loss signal for
/// the set (lost once any key is). Cheap to clone.
#[derive(Clone)]
pub struct LockSet {
    /// In key order.
    guards: Arc<[LockGuard]>,
}

impl LockSet {
    /// The keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The guard of `key`, if it is in the set.
    pub fn guard(&self, key: &str) -> Option<&LockGuard> {
        self.guards
            .binary_search_by(|guard| guard.key().cmp(key))
            .ok()
            .map(|i| &self.guards[i])
    }

    /// The fencing token of `key`'s lease, if it is in the set.
    pub fn fencing_token(&self, key: &str) -> Option<i64> {
        self.guard(key).map(|guard| guard.lease().fencing_token())
    }

    /// True once any key's ownership is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Why the first key that was lost was lost (in key order), once one is.
    pub fn failure(&self) -> Option<LockLost> {
        self.guards.iter().find_map(LockGuard::failure)
    }

    /// Resolves once any key's ownership is lost. Cancel-safe.
    pub async fn lost(&self) {
        let mut each: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = self
            .guards
            .iter()
            .map(|guard| Box::pin(guard.lost()) as Pin<Box<dyn Future<Output = ()> + Send>>)
            .collect();
        std::future::poll_fn(|cx| {
            if each
                .iter_mut()
                .any(|lost| lost.as_mut().poll(cx).is_ready())
            {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

impl std::fmt::Debug for LockSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.guards.iter()).finish()
    }
}

/// Several locks held together until [`HeldLocks::release`] or drop, each
/// renewed in the background. Derefs to [`LockSet`]: `is_lost()`,
/// `lost()`, `fencing_token(key)`. Dropping it hands every release to the
/// client, as dropping a [`HeldLock`] does.
pub struct HeldLocks {
    held: Vec<HeldLock>,
    set: LockSet,
}

impl HeldLocks {
    fn new(held: Vec<HeldLock>) -> Self {
        let guards: Vec<LockGuard> = held.iter().map(|lock| LockGuard::clone(lock)).collect();
        HeldLocks {
            held,
            set: LockSet {
                guards: guards.into(),
            },
        }
    }

    /// A view of the set that can be cloned and moved into tasks.
    pub fn set(&self) -> LockSet {
        self.set.clone()
    }

    /// Stops renewing and releases every key. Returns `Error::LockLost` if
    /// any key was lost while held (every release is still sent), else
    /// the first release error, if any.
    pub async fn release(self) -> Result<()> {
        match self.finish().await {
            (Some(lost), _) => Err(Error::LockLost(lost)),
            (None, released) => released,
        }
    }

    /// Ends every hold: the first loss up to now, and the first release
    /// error.
    async fn finish(self) -> (Option<LockLost>, Result<()>) {
        let mut loss = None;
        let mut released = Ok(());
        for lock in self.held {
            let (lost, result) = lock.finish().await;
            if loss.is_none() {
                loss = lost;
            }
            if released.is_ok() {
                released = result;
            }
        }
        (loss, released)
    }
}

impl Deref for HeldLocks {
    type Target = LockSet;

    fn deref(&self) -> &LockSet {
        &self.set
    }
}

impl std::fmt::Debug for HeldLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLocks")
            .field("set", &self.set)
            .finish_non_exhaustive()
    }
}

/// `locks.with_locks(keys, ttl, f)`; see [`Locks::with_locks`].
#[must_use = "the locks are acquired only when this is awaited"]
pub struct WithLocks<'f, F> {
    all: HoldAll,
    f: F,
    _scope: PhantomData<&'f ()>,
}

impl<F> std::fmt::Debug for WithLocks<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLocks")
            .field("all", &self.all)
            .finish_non_exhaustive()
    }
}

acquisition_setters!(impl[F] WithLocks<'_, F> {
    wait,
    poll_interval,
    max_hold,
});

impl<F> WithLocks<'_, F> {
    fn acquire_spec(&mut self) -> &mut Acquire {
        self.all.acquire_spec()
    }

    fn hold_spec(&mut self) -> &mut Hold {
        self.all.hold_spec()
    }
}

impl<'f, F, Fut, T, E> IntoFuture for WithLocks<'f, F>
where
    F: FnOnce(LockSet) -> Fut + Send + 'f,
    Fut: Future<Output = std::result::Result<T, E>> + Send + 'f,
    T: Send + 'f,
    E: From<Error> + Send + 'f,
{
    type Output = std::result::Result<T, E>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'f>>;

    fn into_future(self) -> Self::IntoFuture {
        let WithLocks { all, f, .. } = self;
        Box::pin(async move {
            let held = all.await.map_err(E::from)?;
            let outcome = CatchUnwind(Box::pin(f(held.set()))).await;
            let (loss, released) = held.finish().await;
            outcome_of(outcome, loss, released, E::from)
        })
    }
}
