//! The constructors of what many callers share: [`Locks::leader`] (one
//! leads at a time) and [`Locks::semaphore`] (a few hold at once).

use std::time::Duration;

use crate::locks::{AcquireOptions, Leader, LeaderStatus, Locks, Semaphore};

impl Locks {
    /// Leader election on `key`: among all callers of `leader` on this key,
    /// one at a time leads.
    ///
    /// `run(term)` campaigns (waits for the lock, quota-aware like
    /// [`Acquire::wait`](crate::Acquire::wait)), then calls `term` with a
    /// [`LockGuard`](crate::LockGuard) and polls its future while it leads. If the lease is
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
            until: std::sync::Mutex::new(None),
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
