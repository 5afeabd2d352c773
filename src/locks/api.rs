//! Every constructor of the lock API's builders: a constructor only fills
//! in its builder; `.await` on the builder hands its options to the
//! engine.
//!
//! Here the single requests and the observer; the locks held while work
//! runs are constructed in `api/held.rs`, leaders and semaphores in
//! `api/shared.rs`.

mod held;
mod shared;

use std::time::Duration;

use crate::lease::LockLease;
use crate::locks::{
    Acquire, AcquireOptions, ForceRelease, Get, Locks, Release, Renew, RequestOptions,
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
}
