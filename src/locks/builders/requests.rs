//! The request builders of `acquire`, `renew`, `get`, `release` and
//! `force_release`: each collects its options, and `.await` hands them to
//! the engine.

use std::time::Duration;

use crate::error::Result;
use crate::lease::{LockLease, LockState};
use crate::locks::engine::{self, Spec};
use crate::locks::{AcquireOptions, Locks, RequestOptions};

/// `.await` and `.send()` for a request builder: `$run` turns the builder
/// into the engine's future.
macro_rules! sends {
    ($builder:ident => $output:ty, $run:expr) => {
        impl ::std::future::IntoFuture for $builder {
            type Output = Result<$output>;
            type IntoFuture = $crate::BoxFuture<Self::Output>;

            fn into_future(self) -> Self::IntoFuture {
                let run: fn($builder) -> $crate::BoxFuture<Self::Output> = $run;
                run(self)
            }
        }

        impl $builder {
            /// Sends the request: the future `.await` runs, as a value that
            /// can be spawned or stored (a builder itself is not a future):
            /// `tokio::spawn(locks.get("nightly-report").send())`.
            pub fn send(
                self,
            ) -> impl ::std::future::Future<Output = Result<$output>> + Send + 'static {
                ::std::future::IntoFuture::into_future(self)
            }
        }
    };
}

/// `locks.acquire(key, ttl)`; see [`Locks::acquire`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored. Its options (token, request id, timeout,
/// wait, poll interval) are those of [`AcquireOptions`] but `max_hold`.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// // Wait up to two minutes for the holder, trying about every 2 s once
/// // the wait's ramp has grown to that.
/// let lease = locks
///     .acquire("schema-migration", Duration::from_secs(60))
///     .wait(Duration::from_secs(120))
///     .poll_interval(Duration::from_secs(2))
///     .await?;
/// # let _ = lease; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Acquire {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) options: AcquireOptions,
}

option_setters!(impl[] Acquire => [options] {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
});

impl Acquire {
    /// Sets every option at once, replacing those set before. A `max_hold`
    /// among them fails the acquire with `Error::InvalidArgument`: only a
    /// lock that is held can be held for at most a while.
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.options = options;
        self
    }
}

sends!(Acquire => LockLease, |this| {
    Box::pin(engine::acquire::lease(Spec::new(&this.locks, this.key, this.ttl, this.options)))
});

/// `locks.renew(&lease, ttl)`; see [`Locks::renew`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug, Clone)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Renew {
    pub(crate) locks: Locks,
    pub(crate) lease: LockLease,
    pub(crate) ttl: Duration,
    pub(crate) request: RequestOptions,
}

option_setters!(impl[] Renew => [request] { request_id, timeout });

sends!(Renew => LockLease, |this| Box::pin(async move {
    let renewed = engine::requests::renew(&this.locks, &this.lease, this.ttl, &this.request);
    renewed.await.map(|measured| measured.lease)
}));

/// `locks.get(key)`; see [`Locks::get`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug, Clone)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Get {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) request: RequestOptions,
}

option_setters!(impl[] Get => [request] { request_id, timeout });

sends!(Get => LockState, |this| Box::pin(async move {
    let got = engine::requests::get(&this.locks, &this.key, &this.request).await;
    got.map(|(state, _date)| state)
}));

/// `locks.release(&lease)`; see [`Locks::release`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug, Clone)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Release {
    pub(crate) locks: Locks,
    pub(crate) lease: LockLease,
    pub(crate) request: RequestOptions,
}

option_setters!(impl[] Release => [request] { request_id, timeout });

sends!(Release => (), |this| Box::pin(async move {
    engine::requests::release(&this.locks, &this.lease, &this.request).await
}));

/// `locks.force_release(key)`; see [`Locks::force_release`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored.
#[derive(Debug, Clone)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct ForceRelease {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) request: RequestOptions,
}

option_setters!(impl[] ForceRelease => [request] { request_id, timeout });

sends!(ForceRelease => (), |this| Box::pin(async move {
    engine::requests::force_release(&this.locks, &this.key, &this.request).await
}));
