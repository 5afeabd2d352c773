//! [`HeldLock`]: a renewing lock that lives outside any closure, in a
//! struct or an `Arc`, until it is released or dropped. What happens then
//! is the engine's ([`engine::hold`](crate::locks::engine::hold)).

use std::ops::Deref;

use super::guard::LockGuard;
use crate::error::{Error, LockLost, Result};
use crate::locks::engine::hold::Holding;

/// A lock held until [`HeldLock::release`] or drop, renewed in the
/// background. Derefs to [`LockGuard`]: `is_lost()`, `lost()`, `watch()`,
/// `lease()` and `failure()` all work on it. `Send + Sync + 'static`, so it
/// can live in a struct or an `Arc`.
///
/// Dropping it stops the renewal and hands a best-effort release to the
/// client, which [`Client::shutdown`](crate::Client::shutdown) waits for.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// struct Ingest {
///     lock: volcano::HeldLock,
/// }
/// let ingest = Ingest { lock: locks.hold("ingest", Duration::from_secs(30)).await? };
/// tokio::select! {
///     _ = ingest.lock.lost() => eprintln!("lost the ingest lock; stopping"),
///     _ = tokio::time::sleep(Duration::from_secs(60)) => {}
/// }
/// ingest.lock.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping it hands the release to the client at once"]
pub struct HeldLock {
    guard: LockGuard,
    holding: Holding,
}

impl HeldLock {
    pub(crate) fn new(holding: Holding) -> Self {
        HeldLock {
            guard: LockGuard {
                state: holding.state.clone(),
            },
            holding,
        }
    }

    /// Stops renewing and releases the lease (tried again on transient
    /// failures; release is idempotent). With a
    /// [`min_hold`](crate::Hold::min_hold) not passed yet, the service
    /// keeps the key until the minimum's end instead: one renewal, nothing
    /// released, and nothing left running. Returns `Error::LockLost` if
    /// ownership was lost while held (the release is still sent), or if
    /// the release found another token holding the lock
    /// ([`LostReason::TakenOver`](crate::LostReason::TakenOver)); else the
    /// release's own error, if any. A release that did not free the lease
    /// goes on in the background (a transient failure) or is recorded (a
    /// refusal): either way [`Client::shutdown`](crate::Client::shutdown)
    /// names the key while the lease may still be live.
    pub async fn release(self) -> Result<()> {
        match self.finish().await {
            (Some(lost), _) => Err(Error::LockLost(lost)),
            (None, released) => released,
        }
    }

    /// [`release`](Self::release), and what became of its
    /// [`min_hold`](crate::Hold::min_hold): kept by the service until the
    /// minimum's end, passed already, or not kept (the renewal that keeps
    /// it failed), so that a caller can say so. `volcano locks run`'s
    /// summary reports it as `min_hold_kept`. The same requests as
    /// `release`.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// use volcano::MinHold;
    /// let held = locks
    ///     .hold("report", Duration::from_secs(30))
    ///     .min_hold(Duration::from_secs(60))
    ///     .await?;
    /// // ... the work, done in seconds ...
    /// if held.release_reporting().await? == MinHold::NotKept {
    ///     eprintln!("the report may run again on a late host this period");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release_reporting(self) -> Result<MinHold> {
        match self.holding.finish_reporting().await {
            (Some(lost), _, _) => Err(Error::LockLost(lost)),
            (None, released, min_hold) => released.map(|()| min_hold),
        }
    }

    /// Releases now, as [`release`](Self::release) does without a minimum
    /// hold, whatever its [`min_hold`](crate::Hold::min_hold): for work
    /// that never began (a command that could not be started, say), which
    /// the minimum has nothing to keep from running twice.
    pub async fn release_now(self) -> Result<()> {
        match self.finish_now().await {
            (Some(lost), _) => Err(Error::LockLost(lost)),
            (None, released) => released,
        }
    }

    /// Ends the hold: the loss up to now, if any, and the release's result
    /// (a minimum hold kept by the service instead, if it has one).
    pub(crate) async fn finish(self) -> (Option<LockLost>, Result<()>) {
        self.holding.finish().await
    }

    /// Ends the hold with a release now, whatever its minimum hold.
    pub(crate) async fn finish_now(self) -> (Option<LockLost>, Result<()>) {
        self.holding.finish_now().await
    }
}

/// What a release did with a hold's [`min_hold`](crate::Hold::min_hold)
/// ([`HeldLock::release_reporting`](HeldLock::release_reporting)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MinHold {
    /// The hold had no minimum: released.
    NotAsked,
    /// The minimum had passed when the work ended: released.
    Passed,
    /// The work ended before the minimum: the service keeps the key until
    /// the minimum's end (one renewal set its expiry there), nothing was
    /// released.
    Kept,
    /// Not kept: the renewal that keeps it failed (the key is free at the
    /// lease's last expiry, before the minimum's end; logged at WARN and
    /// counted in `volcano_min_hold_not_kept_total`), the lock was lost
    /// (when cannot be told), or `max_hold` left too little to keep it. A
    /// hold that `max_hold` ended is `Passed`: its minimum is never longer.
    NotKept,
}

impl MinHold {
    /// A hold released at once: with a minimum `asked` for, `passed` or
    /// not, after the loss `lost` if any.
    pub(crate) fn released(asked: bool, passed: bool, lost: Option<&LockLost>) -> Self {
        let held_to_the_end = lost.is_none_or(|l| l.reason() == crate::LostReason::MaxHold);
        match (asked, passed) {
            (false, _) => MinHold::NotAsked,
            // Ended by `max_hold` (never shorter than the minimum): passed.
            (true, true) if held_to_the_end => MinHold::Passed,
            // Lost (when cannot be told), or cut short: released at once.
            (true, _) => MinHold::NotKept,
        }
    }
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl Deref for HeldLock {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}
