//! A held set of keys ([`HeldLocks`], from `locks.hold_all`) and its view
//! ([`LockSet`], what a `with_locks` closure gets). How a set is acquired
//! is the engine's ([`engine::set`](crate::locks::engine::set)).

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use super::guard::{AtRisk, LockGuard};
use super::held::HeldLock;
use crate::error::{Error, LockLost, Result};

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
        first_of(self.guards.iter().map(|guard| guard.lost())).await
    }

    /// The first key at risk, in key order ([`LockGuard::at_risk`]);
    /// `None` once any key is lost (the set is lost).
    pub fn at_risk(&self) -> Option<AtRisk> {
        if self.is_lost() {
            return None;
        }
        self.guards.iter().find_map(LockGuard::at_risk)
    }

    /// Resolves at the next change of any key's
    /// [`LockGuard::at_risk_changed`]. Cancel-safe; it watches from the
    /// moment it is called.
    pub fn at_risk_changed(&self) -> impl Future<Output = ()> + Send + '_ {
        first_of(self.guards.iter().map(|guard| guard.at_risk_changed()))
    }
}

/// Completes when the first of `each` does. The futures are made at once
/// (each watches from then), not at the first poll.
fn first_of<'a, F>(each: impl Iterator<Item = F>) -> impl Future<Output = ()> + Send + 'a
where
    F: Future<Output = ()> + Send + 'a,
{
    let mut each: Vec<Pin<Box<F>>> = each.map(Box::pin).collect();
    std::future::poll_fn(move |cx| {
        if each.iter_mut().any(|one| one.as_mut().poll(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
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
#[must_use = "dropping it hands the release to the client at once"]
pub struct HeldLocks {
    held: Vec<HeldLock>,
    set: LockSet,
}

impl HeldLocks {
    pub(crate) fn new(held: Vec<HeldLock>) -> Self {
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
    pub(crate) async fn finish(self) -> (Option<LockLost>, Result<()>) {
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
