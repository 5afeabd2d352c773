//! The constructors of the locks held while work runs: [`Locks::hold`],
//! [`Locks::with_lock`], [`Locks::try_with_lock`], [`Locks::hold_all`] and
//! [`Locks::with_locks`].

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use crate::error::Error;
use crate::locks::{
    AcquireOptions, Hold, HoldAll, LockGuard, LockSet, Locks, TryWithLock, WithLock, WithLocks,
};

impl Locks {
    /// Acquires `key` and keeps it: the lease is renewed in the background
    /// exactly as `with_lock` renews it (the same local deadline, retries
    /// and lost-ownership signal) until the [`HeldLock`](crate::HeldLock) is released or
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
            locks: self.clone(),
            key: key.into(),
            ttl,
            options: AcquireOptions::default(),
            min_hold: None,
        }
    }

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
            locks: self.clone(),
            key: key.into(),
            ttl,
            options: AcquireOptions::default(),
            cancel_on_loss: false,
            min_hold: None,
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
            locks: self.clone(),
            keys: keys.into_iter().map(Into::into).collect(),
            ttl,
            options: AcquireOptions::default(),
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
            locks: self.clone(),
            keys: keys.into_iter().map(Into::into).collect(),
            ttl,
            options: AcquireOptions::default(),
            f,
            _scope: PhantomData,
        }
    }
}
