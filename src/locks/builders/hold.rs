//! The builders of `hold` and `hold_all`: they collect the options, and
//! `.await` hands them to the engine ([`engine::hold`], [`engine::set`]).

use std::future::{Future, IntoFuture};
use std::time::Duration;

use crate::error::Result;
use crate::locks::engine::{self, Spec};
use crate::locks::{AcquireOptions, HeldLock, HeldLocks, Locks};
use crate::BoxFuture;

/// `locks.hold(key, ttl)`; see [`Locks::hold`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored. It has the options of
/// [`Acquire`](crate::Acquire), plus [`Hold::max_hold`].
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// // A stuck job cannot keep the report lock past an hour.
/// let held = locks
///     .hold("report", Duration::from_secs(30))
///     .wait(Duration::from_secs(60))
///     .max_hold(Duration::from_secs(3600))
///     .await?;
/// # let _ = held; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a held lock is acquired only when this is awaited"]
pub struct Hold {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) options: AcquireOptions,
    pub(crate) min_hold: Option<Duration>,
}

option_setters!(impl[] Hold => [options] {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
    max_hold,
});

impl Hold {
    /// Sets every option at once, replacing those set before.
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.options = options;
        self
    }

    /// Keeps the lock at least `min_hold` after it was acquired, however
    /// soon it is released: [`HeldLock::release`] before the minimum's end
    /// has the service keep the key until then (one renewal, nothing
    /// released), as [`WithLock::min_hold`](crate::WithLock::min_hold)
    /// does when its closure returns; same rules, same errors. Dropping the
    /// [`HeldLock`] still releases at once. A `min_hold` longer than 90
    /// days or than the `max_hold` is `Error::InvalidArgument`, before
    /// anything is sent.
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// Acquires: the future `.await` runs, as a value that can be spawned
    /// or stored (the builder itself is not a future):
    /// `tokio::spawn(locks.hold("ingest", ttl).send())`.
    pub fn send(self) -> impl Future<Output = Result<HeldLock>> + Send + 'static {
        self.into_future()
    }
}

impl IntoFuture for Hold {
    type Output = Result<HeldLock>;
    type IntoFuture = BoxFuture<Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        let mut spec = Spec::new(&self.locks, self.key, self.ttl, self.options);
        spec.min_hold = self.min_hold;
        Box::pin(engine::hold::hold(spec, None))
    }
}

/// `locks.hold_all(keys, ttl)`; see [`Locks::hold_all`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[must_use = "the locks are acquired only when this is awaited"]
#[derive(Debug, Clone)]
pub struct HoldAll {
    pub(crate) locks: Locks,
    pub(crate) keys: Vec<String>,
    pub(crate) ttl: Duration,
    /// Every key is held with these; each gets a token of its own.
    pub(crate) options: AcquireOptions,
}

option_setters!(impl[] HoldAll => [options] {
    wait,
    poll_interval,
    max_hold,
});

impl HoldAll {
    /// Acquires: the future `.await` runs, as a value that can be spawned
    /// or stored.
    pub fn send(self) -> impl Future<Output = Result<HeldLocks>> + Send + 'static {
        self.into_future()
    }
}

impl IntoFuture for HoldAll {
    type Output = Result<HeldLocks>;
    type IntoFuture = BoxFuture<Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(engine::set::hold_all(
            self.locks,
            self.keys,
            self.ttl,
            self.options,
        ))
    }
}
