//! [`LockGuard`]: what protected code holds to see the latest lease and
//! learn that ownership was lost.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, LockLost, LostReason};
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

    /// `Some` while the lease's renewals are failing (the service
    /// unavailable, the quota spent, no answer) but the lease is still
    /// ours by its local deadline: how long is left, and the last failure.
    /// `None` while renewals succeed, and once the lock is lost: a refusal
    /// (`401`, `403`, `409`) is a loss at once, never a risk. It clears
    /// when a renewal succeeds.
    ///
    /// ```no_run
    /// # async fn demo(guard: volcano::LockGuard) {
    /// if let Some(risk) = guard.at_risk() {
    ///     // Checkpoint now: the lock may be gone in `risk.remaining()`.
    ///     eprintln!("{risk}");
    /// }
    /// # }
    /// ```
    pub fn at_risk(&self) -> Option<AtRisk> {
        if self.state.check() {
            return None;
        }
        let cause = self.state.risk.cause()?;
        Some(AtRisk {
            key: self.state.key.clone(),
            remaining: self.state.remaining(),
            cause,
        })
    }

    /// Resolves once this guard's leader term is asked to end: its
    /// candidate's `until` fired and the term drains
    /// ([`Leader::drain`](crate::Leader::drain)) while the lock stays held
    /// and renewed. Finish the work in hand, then return from the term:
    /// the lock is released only after that (or when the drain runs out
    /// and the term is dropped). Never resolves for any other guard (a
    /// `with_lock`, `hold` or set guard), nor for a term whose leader has
    /// no drain (it is dropped at once). Cancel-safe, for `tokio::select!`.
    ///
    /// ```no_run
    /// # async fn demo(term: volcano::LockGuard) {
    /// loop {
    ///     tokio::select! {
    ///         () = term.stepping_down() => break,
    ///         _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => { /* the next job */ }
    ///     }
    /// }
    /// # }
    /// ```
    pub fn stepping_down(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut asked = self.state.stepping_down.subscribe();
        async move {
            if asked.wait_for(|asked| *asked).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether this guard's leader term was asked to end
    /// ([`LockGuard::stepping_down`]); never true for any other guard.
    pub fn is_stepping_down(&self) -> bool {
        *self.state.stepping_down.borrow()
    }

    /// Resolves at the next change of [`LockGuard::at_risk`]: an episode
    /// of failing renewals begins or ends, or the lock is lost (after which
    /// nothing changes any more: await it beside [`LockGuard::lost`]).
    /// Cancel-safe. It watches from the moment it is called, not from its
    /// first poll: an episode that begins between reading
    /// [`LockGuard::at_risk`] and awaiting this is not missed.
    pub fn at_risk_changed(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        let mut changed = self.state.risk.subscribe();
        async move {
            if self.state.check() {
                return std::future::pending().await;
            }
            tokio::select! {
                _ = changed.changed() => {}
                _ = self.state.wait_lost() => {}
            }
        }
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

/// A held lock whose renewals are failing while its lease is still ours
/// ([`LockGuard::at_risk`]): the time left before its local deadline, and
/// the last failure, so that an outage (`503`, a spent quota, no answer)
/// can be told from a loss.
#[derive(Debug, Clone)]
pub struct AtRisk {
    key: String,
    remaining: Duration,
    cause: Arc<Error>,
}

impl AtRisk {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Time left before the local deadline, when this was read: unless a
    /// renewal succeeds first, the lock is lost then.
    pub fn remaining(&self) -> Duration {
        self.remaining
    }

    /// The last renewal attempt's failure.
    pub fn cause(&self) -> &Error {
        &self.cause
    }
}

/// `lock "k" at risk: renewals failing, 12.5 s left: service unavailable (HTTP 503 ...)`.
impl fmt::Display for AtRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lock {:?} at risk: renewals failing, {} left: {}",
            self.key,
            crate::validate::seconds(self.remaining),
            self.cause
        )
    }
}
