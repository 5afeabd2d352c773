//! The lock API: [`Locks`] and its request builders.
//!
//! Every operation returns a builder; optional parameters are builder
//! methods, and `.await` sends the request. [`Acquire`] (with its waiting
//! and undo rules) has a file of its own; the other four are in
//! `requests.rs`; `with_lock` and the guard are in `guard/`.

use std::time::Duration;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::lease::LockLease;
use crate::ops::Operation;
use crate::transport::{Answer, Timing};
use crate::validate;

/// The lock API of a [`Client`]: cheap to clone, `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo() -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// let locks = volcano::Client::from_env()?.locks();
/// let lease = locks.acquire("nightly-report", Duration::from_secs(30)).await?;
/// let lease = locks.renew(&lease, Duration::from_secs(30)).await?;
/// locks.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Locks {
    client: Client,
}

impl Client {
    /// The lock API of this client.
    ///
    /// ```no_run
    /// # async fn demo(client: volcano::Client) -> Result<(), volcano::Error> {
    /// let state = client.locks().get("nightly-report").await?;
    /// println!("held: {}", state.held());
    /// # Ok(()) }
    /// ```
    pub fn locks(&self) -> Locks {
        Locks::new(self.clone())
    }
}

impl Locks {
    pub(crate) fn new(client: Client) -> Self {
        Locks { client }
    }

    /// The client this handle uses.
    pub fn client(&self) -> &Client {
        &self.client
    }

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
    /// released in the background (see [`Client::shutdown`]). With
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
            common: Common::new(self),
            key: key.into(),
            ttl,
            token: acquire::Owner::Fresh,
            wait: None,
            poll_interval: None,
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
            common: Common::new(self),
            lease: lease.clone(),
            ttl,
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
            common: Common::new(self),
            key: key.into(),
        }
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
            common: Common::new(self),
            lease: lease.clone(),
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
            common: Common::new(self),
            key: key.into(),
        }
    }
}

/// Parameters every builder has.
#[derive(Debug, Clone)]
struct Common {
    locks: Locks,
    request_id: Option<String>,
    timeout: Option<Duration>,
}

impl Common {
    fn new(locks: &Locks) -> Self {
        Common {
            locks: locks.clone(),
            request_id: None,
            timeout: None,
        }
    }

    /// The caller's request id (checked) or a fresh one.
    fn request_id(&mut self) -> Result<String> {
        match self.request_id.take() {
            Some(id) => validate::uuid("request_id", &id).map(|()| id),
            None => Ok(validate::new_uuid()),
        }
    }

    fn check_timeout(&self) -> Result<()> {
        match self.timeout {
            Some(t) if t.is_zero() => Err(Error::invalid("timeout must be greater than zero")),
            _ => Ok(()),
        }
    }

    /// Sends one operation; `window` bounds the tries of a waiting acquire.
    async fn send<O: Operation>(
        &self,
        op: &O,
        request_id: &str,
        window: wait::Window,
    ) -> Result<Answer<O::Output>> {
        let timing = Timing {
            timeout: self.timeout,
            send_by: window.send_by,
            answer_by: window.answer_by,
        };
        self.locks
            .client
            .transport()
            .send(op, request_id, timing)
            .await
    }
}

/// Builder methods shared by all five request builders, and `.await`.
macro_rules! common_methods {
    ($builder:ident => $output:ty) => {
        impl ::std::future::IntoFuture for $builder {
            type Output = $crate::error::Result<$output>;
            type IntoFuture = $crate::BoxFuture<Self::Output>;

            fn into_future(self) -> Self::IntoFuture {
                Box::pin(self.execute())
            }
        }

        impl $builder {
            /// Sends the request: the future `.await` runs, as a value that
            /// can be spawned or stored (a builder itself is not a future):
            /// `tokio::spawn(locks.get("nightly-report").send())`.
            pub fn send(
                self,
            ) -> impl ::std::future::Future<Output = $crate::error::Result<$output>>
                   + Send
                   + 'static {
                ::std::future::IntoFuture::into_future(self)
            }

            /// Sends this request id (a UUID string, sent exactly as spelled)
            /// instead of a fresh one. Reuse it only to retry the same
            /// logical operation.
            pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
                self.common.request_id = Some(request_id.into());
                self
            }

            /// Overrides the client's per-request timeout for this call.
            pub fn timeout(mut self, timeout: ::std::time::Duration) -> Self {
                self.common.timeout = Some(timeout);
                self
            }
        }
    };
}

#[macro_use]
mod setters;

mod acquire;
mod guard;
mod release;
mod requests;
pub(crate) mod turns;
mod wait;

pub use acquire::Acquire;
pub(crate) use acquire::{Measured, Owner};
pub use guard::{
    HeldLock, HeldLocks, Hold, HoldAll, Leader, LockGuard, LockSet, TryWithLock, WithLock,
    WithLocks,
};
pub use requests::{ForceRelease, Get, Release, Renew};
