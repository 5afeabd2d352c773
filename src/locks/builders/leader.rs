//! The builder of `leader`: it collects the options and the `until`
//! signal, and `run` hands them to the engine ([`engine::leader`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::Error;
use crate::locks::engine::{self, leader::Signal};
use crate::locks::{AcquireOptions, LockGuard, Locks};

/// `locks.leader(key, ttl)`; see [`Locks::leader`].
#[must_use = "leader election starts only when run(..) is awaited"]
pub struct Leader {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    /// How every campaign acquires and holds the lock (it waits without a
    /// deadline, with a token generated per campaign).
    pub(crate) options: AcquireOptions,
    pub(crate) until: Option<Signal>,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leader")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("options", &self.options)
            .field("until", &self.until.as_ref().map(|_| "..."))
            .finish()
    }
}

option_setters!(impl[] Leader => [options] {
    poll_interval,
    max_hold,
});

impl Leader {
    /// Step down (drop the running term, release, return `Ok(())`) once
    /// `signal` completes, for example on SIGTERM.
    pub fn until(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.until = Some(Box::pin(signal));
        self
    }

    /// Campaigns and leads until the term ends leadership or `until`
    /// fires; see [`Locks::leader`].
    pub fn run<'f, F, Fut, E>(
        self,
        term: F,
    ) -> Pin<Box<dyn Future<Output = std::result::Result<(), E>> + Send + 'f>>
    where
        F: FnMut(LockGuard) -> Fut + Send + 'f,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'f,
        E: From<Error> + Send + 'f,
    {
        let Leader {
            locks,
            key,
            ttl,
            options,
            until,
        } = self;
        Box::pin(engine::leader::elect(locks, key, ttl, options, until, term))
    }
}
