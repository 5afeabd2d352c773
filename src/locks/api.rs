//! Every constructor of the lock API's builders, in one place: a
//! constructor only fills in its builder; `.await` on the builder hands its
//! options to the engine.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use crate::error::Error;
use crate::lease::LockLease;
use crate::locks::{
    Acquire, AcquireOptions, ForceRelease, Get, Hold, HoldAll, Leader, LeaderStatus, LockGuard,
    LockSet, Locks, Release, Renew, RequestOptions, Semaphore, TryWithLock, WithLock, WithLocks,
};

impl Locks {
    /// Acquires `key` for `ttl` (whole seconds, 5 s to 90 days).
    ///
    /// Fails with `Error::Conflict` (`is_lock_held()`) when another live
    /// lease owns the key. On a transport failure or a 503 the request is
    /// sent once more, immediately, with the same ownership token and
    /// request id: acquiring with the same token is idempotent, so a lease
    /// whose answer was lost is recovered, not duplicated.
    ///
    /// If the outcome stays unknown (no answer after the retry, a 5xx, an
    /// unusable `201`, or the future dropped while a request is in flight)
    /// and the SDK generated the token, the lease it may have obtained is
    /// released in the background (see [`Client::shutdown`](crate::Client::shutdown)). With
    /// [`Acquire::token`] nothing is released behind your back: acquire
    /// again with the same token to recover the lease.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// // A caller-owned token lets you recover after an uncertain outcome by
    /// // acquiring again with the same token.
    /// let token = "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10";
    /// let lease = locks
    ///     .acquire("schema-migration", Duration::from_secs(60))
    ///     .token(token)
    ///     .await?;
    /// assert_eq!(lease.token(), token);
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self, key: impl Into<String>, ttl: Duration) -> Acquire {
        Acquire {
            locks: self.clone(),
            key: key.into(),
            ttl,
            options: AcquireOptions::default(),
        }
    }

    /// Renews `lease` for `ttl` from now (a shorter ttl shortens it). Must
    /// arrive more than 1 s before the lease expires. Sent once.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks, lease: volcano::LockLease) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let lease = locks.renew(&lease, Duration::from_secs(60)).await?;
    /// # let _ = lease; Ok(()) }
    /// ```
    pub fn renew(&self, lease: &LockLease, ttl: Duration) -> Renew {
        Renew {
            locks: self.clone(),
            lease: lease.clone(),
            ttl,
            request: RequestOptions::default(),
        }
    }

    /// Reads the state of `key`: whether it is held, until when, and the
    /// holder's fencing token. Needs no ownership token.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// let state = locks.get("nightly-report").await?;
    /// # let _ = state; Ok(()) }
    /// ```
    pub fn get(&self, key: impl Into<String>) -> Get {
        Get {
            locks: self.clone(),
            key: key.into(),
            request: RequestOptions::default(),
        }
    }

    /// Observes `key`: each change of its holder (acquired, renewed, taken
    /// over, released, expired), polling with a quota-aware cadence (one
    /// look every 10 s by default). See [`Observe`](crate::Observe).
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// let mut changes = locks.observe("nightly-report");
    /// while let Some(change) = changes.next().await {
    ///     let change = change?;
    ///     println!("{} (fencing token {:?})", change.kind(), change.state().fencing_token());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn observe(&self, key: impl Into<String>) -> crate::Observe {
        crate::Observe::new(self.clone(), key.into())
    }

    /// Releases `lease` if it still owns the lock (succeeds when the lock is
    /// already free; `Error::Conflict` when another token owns it).
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks, lease: volcano::LockLease) -> Result<(), volcano::Error> {
    /// locks.release(&lease).await?;
    /// # Ok(()) }
    /// ```
    pub fn release(&self, lease: &LockLease) -> Release {
        Release {
            locks: self.clone(),
            lease: lease.clone(),
            request: RequestOptions::default(),
        }
    }

    /// Drops whatever lease holds `key`, for recovery after a holder died.
    ///
    /// This breaks mutual exclusion by itself: the displaced holder keeps
    /// running until its next renewal fails. Use it only when the protected
    /// resource checks fencing tokens.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// locks.force_release("nightly-report").await?;
    /// # Ok(()) }
    /// ```
    pub fn force_release(&self, key: impl Into<String>) -> ForceRelease {
        ForceRelease {
            locks: self.clone(),
            key: key.into(),
            request: RequestOptions::default(),
        }
    }

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

    /// Leader election on `key`: among all callers of `leader` on this key,
    /// one at a time leads.
    ///
    /// `run(term)` campaigns (waits for the lock, quota-aware like
    /// [`Acquire::wait`](crate::Acquire::wait)), then calls `term` with a
    /// [`LockGuard`] and polls its future while it leads. If the lease is
    /// lost, that future is dropped, the lock released, and the campaign
    /// starts again with a fresh token. `term` returning `Ok(())` ends
    /// leadership (release, then `Ok`); `Err(e)` releases and returns
    /// `Err(e)`; after either, `term` is not called again.
    /// [`Leader::until`] steps down cleanly when a shutdown signal fires.
    /// `run` returns only after its release has finished.
    ///
    /// Followers wait quota-aware: each costs about one `get` per lease
    /// period plus `60 / interval` acquires a minute, where the interval is
    /// [`Leader::poll_interval`] (default 10 s). A leader that steps down
    /// is replaced within about one interval, one that crashed within
    /// ttl + 1 s. [`Leader::max_hold`] caps each term.
    ///
    /// Every term's fencing token is higher than the previous term's (each
    /// term is a new acquisition): hand it to the resource you protect, so
    /// a deposed leader that has not noticed yet cannot overwrite the new
    /// one's work.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
    /// locks
    ///     .leader("scheduler", Duration::from_secs(15))
    ///     .until(shutdown)
    ///     .run(|term| async move {
    ///         let fence = term.lease().fencing_token();
    ///         loop {
    ///             // schedule jobs, writing with `fence` so the store
    ///             // rejects a deposed leader's late writes
    ///             # let _ = fence;
    ///             tokio::time::sleep(Duration::from_secs(1)).await;
    ///         }
    ///         #[allow(unreachable_code)]
    ///         Ok::<(), volcano::Error>(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub fn leader(&self, key: impl Into<String>, ttl: Duration) -> Leader {
        Leader {
            locks: self.clone(),
            key: key.into(),
            ttl,
            options: AcquireOptions::default(),
            until: None,
            drain: Duration::ZERO,
            status: tokio::sync::watch::Sender::new(LeaderStatus::Following),
            term: Default::default(),
            key_in_metrics: false,
        }
    }

    /// A counting semaphore: at most `permits` holders of `name` at once,
    /// across every process (see [`Semaphore`]). Permit `i` is the lock
    /// `"{name}:{i}"`; nothing is sent until a permit is taken, and a name
    /// or count that does not fit is refused then.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let migrations = locks.semaphore("heavy-migrations", 2);
    /// let permit = migrations.acquire(Duration::from_secs(60)).wait(Duration::from_secs(30)).await?;
    /// // ... at most two of these run at once ...
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore {
            locks: self.clone(),
            name: name.into(),
            permits,
        }
    }
}
