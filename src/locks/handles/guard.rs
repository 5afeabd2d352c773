//! [`LockGuard`]: what protected code holds to see the latest lease and
//! learn that ownership was lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{LockLost, LostReason};
use crate::lease::LockLease;
use crate::locks::engine::state::State;

/// The handle a `with_lock` closure gets: the latest lease and the
/// lost-ownership signal. Cheap to clone.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// locks
///     .with_lock("nightly-report", Duration::from_secs(30), |guard| async move {
///         for chunk in 0..10 {
///             if guard.is_lost() {
///                 break; // another worker may hold the lock now
///             }
///             let fence = guard.lease().fencing_token();
///             println!("writing chunk {chunk} with fence {fence}");
///         }
///         Ok::<_, volcano::Error>(())
///     })
///     .await
/// # }
/// ```
#[derive(Clone)]
pub struct LockGuard {
    pub(crate) state: Arc<State>,
}

impl LockGuard {
    /// The latest lease (renewals replace it; the token stays the same).
    pub fn lease(&self) -> LockLease {
        self.state.lease()
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The ttl each renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.state.ttl
    }

    /// Time left before the lock ends by itself: its local deadline, or its
    /// max hold time if sooner. Zero once lost.
    pub fn remaining(&self) -> Duration {
        if self.state.check() {
            return Duration::ZERO;
        }
        self.state.ends_at().saturating_sub(self.state.clock.now())
    }

    /// True once ownership is lost. Also true the moment the local deadline
    /// passes, even if no background task got to run.
    pub fn is_lost(&self) -> bool {
        self.state.check()
    }

    /// Waits up to `timeout` for ownership to be lost; true if it was.
    /// A zero timeout checks once.
    pub async fn wait_lost(&self, timeout: Duration) -> bool {
        if timeout.is_zero() {
            return self.is_lost();
        }
        tokio::time::timeout(timeout, self.state.wait_lost())
            .await
            .is_ok()
            || self.is_lost()
    }

    /// Resolves once ownership is lost. Cancel-safe, for `tokio::select!`.
    ///
    /// ```no_run
    /// # async fn demo(guard: volcano::LockGuard) {
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lost the lock; stopping"),
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) {
        self.state.wait_lost().await;
    }

    /// The lost-ownership channel: `false` while held, `true` once lost,
    /// never back.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.state.check();
        self.state.lost.subscribe()
    }

    /// Why ownership was lost, once it was.
    pub fn failure(&self) -> Option<LockLost> {
        self.state.check();
        self.state.failure()
    }

    /// Records that the protected work found the lock unusable (for example
    /// a fencing check failed). The first recorded loss wins; `with_lock`
    /// then returns `Error::LockLost` unless the closure returned an error.
    pub fn mark_lost(&self, reason: impl Into<String>) {
        let lost = LockLost::new(self.state.key.clone(), LostReason::Marked).with_detail(reason);
        self.state.mark(lost);
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lease", &self.lease())
            .field("ttl", &self.state.ttl)
            .field("failure", &self.state.failure())
            .finish()
    }
}
