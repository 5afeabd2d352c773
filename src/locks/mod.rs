//! The lock API: [`Locks`] and its request builders.
//!
//! Every operation returns a builder; optional parameters are builder
//! methods, and `.await` sends the request.

mod clock;
mod guard;
pub(crate) mod lease;
mod wait;

pub use clock::LeaseClock;
pub use guard::{LockGuard, WithLock};

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use crate::client::Client;
use crate::error::{Error, InvalidReason, InvalidResponse, Result};
use crate::transport::{Call, Op};
use crate::validate;
use lease::{LockLease, LockState};

/// The boxed future behind each builder's `.await`.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

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
            token: None,
            wait: None,
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

    /// Sends one call; `limit` (one try of a waiting acquire) overrides the
    /// builder's timeout.
    async fn send(
        &self,
        op: Op,
        key: &str,
        token: Option<&str>,
        request_id: &str,
        ttl_secs: Option<u64>,
        limit: Option<Duration>,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>> {
        let call = Call {
            op,
            key,
            token,
            request_id,
            ttl_secs,
            timeout: limit.or(self.timeout),
        };
        self.locks.client.transport().execute(&call).await
    }
}

/// Builder methods shared by all five request builders, and `.await`.
macro_rules! common_methods {
    ($builder:ident => $output:ty) => {
        impl IntoFuture for $builder {
            type Output = Result<$output>;
            type IntoFuture = BoxFuture<Self::Output>;

            fn into_future(self) -> Self::IntoFuture {
                Box::pin(self.send())
            }
        }

        impl $builder {
            /// Sends this request id (a UUID string, sent exactly as spelled)
            /// instead of a fresh one. Reuse it only to retry the same
            /// logical operation.
            pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
                self.common.request_id = Some(request_id.into());
                self
            }

            /// Overrides the client's per-request timeout for this call.
            pub fn timeout(mut self, timeout: Duration) -> Self {
                self.common.timeout = Some(timeout);
                self
            }
        }
    };
}

fn invalid_response(reason: InvalidReason, status: u16, request_id: String) -> Error {
    Error::InvalidResponse(InvalidResponse {
        reason,
        status,
        request_id,
    })
}

/// The body of a success that carries one; the transport guarantees it.
fn expect_body(
    body: Option<serde_json::Map<String, serde_json::Value>>,
) -> serde_json::Map<String, serde_json::Value> {
    body.unwrap_or_default()
}

/// `locks.acquire(key, ttl)`; see [`Locks::acquire`].
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Acquire {
    common: Common,
    key: String,
    ttl: Duration,
    token: Option<String>,
    wait: Option<Duration>,
}

common_methods!(Acquire => LockLease);

impl std::fmt::Debug for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("request_id", &self.common.request_id)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Acquire {
    /// Uses this ownership token (a UUID string, sent exactly as spelled)
    /// instead of a fresh one. Acquiring again with the same token recovers
    /// the same lease.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// On `409 lock_held`, keep trying with the same ownership token until
    /// the lock is acquired or `timeout` has passed; then the last
    /// `Error::Conflict` is returned (so `is_lock_held()` stays true).
    ///
    /// Between tries the waiter sleeps until the holder's lease can be taken
    /// over (learned with `get`) or for a jittered poll interval growing
    /// from 100 ms to 1 s, whichever is sooner: a released lock is picked up
    /// within about a second, and a waiter sends at most about 60 acquires
    /// a minute. A 429 is honoured (`Retry-After`); transport failures and
    /// 503 are tried again (the same token makes that safe); any other
    /// error returns at once. Dropping the future stops it: nothing runs in
    /// the background.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let lease = locks
    ///     .acquire("schema-migration", Duration::from_secs(60))
    ///     .wait(Duration::from_secs(120))
    ///     .await?;
    /// # let _ = lease; Ok(()) }
    /// ```
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    async fn send(self) -> Result<LockLease> {
        self.send_measured().await.map(|(lease, _)| lease)
    }

    /// Acquires and also returns the lease-clock reading taken just before
    /// the try that succeeded: the earliest the lease can have started.
    pub(crate) async fn send_measured(mut self) -> Result<(LockLease, Duration)> {
        let ttl = validate::ttl(self.ttl)?;
        validate::key(&self.key)?;
        self.common.check_timeout()?;
        let token = match self.token.take() {
            Some(token) => validate::uuid("token", &token).map(|()| token)?,
            None => validate::new_uuid(),
        };
        let request_id = self.common.request_id()?;
        let Some(timeout) = self.wait else {
            return self.try_once(ttl, token, &request_id, None).await;
        };
        let mut waiter = wait::Waiter::new(timeout);
        let client_timeout = self
            .common
            .timeout
            .unwrap_or(self.common.locks.client.timeout());
        loop {
            let limit = client_timeout.min(waiter.remaining().max(Duration::from_millis(1)));
            let err = match self
                .try_once(ttl, token.clone(), &request_id, Some(limit))
                .await
            {
                Ok(lease) => return Ok(lease),
                Err(err) => err,
            };
            let (pause, learn_holder) = match waiter.after(err) {
                wait::Step::Stop(err) => return Err(err),
                wait::Step::Retry {
                    pause,
                    learn_holder,
                } => (pause, learn_holder),
            };
            if learn_holder {
                if let Ok(state) = self.common.locks.get(self.key.clone()).timeout(limit).await {
                    waiter.holder(state.held(), state.expires_at());
                }
            }
            tracing::debug!(
                key = %self.key,
                request_id,
                pause_ms = pause.as_millis() as u64,
                "lock held; waiting"
            );
            tokio::time::sleep(pause.min(waiter.remaining())).await;
            if let Some(conflict) = waiter.timed_out() {
                return Err(conflict);
            }
        }
    }

    /// One acquire (with its own single retry on transport failure or 503),
    /// with the lease-clock reading taken before it was sent.
    async fn try_once(
        &self,
        ttl: u64,
        token: String,
        request_id: &str,
        timeout: Option<Duration>,
    ) -> Result<(LockLease, Duration)> {
        let sent_at = self.common.locks.client.lease_clock().now();
        let body = self
            .common
            .send(
                Op::Acquire,
                &self.key,
                Some(&token),
                request_id,
                Some(ttl),
                timeout,
            )
            .await?;
        let lease = LockLease::decode(self.key.clone(), token, &expect_body(body))
            .map_err(|r| invalid_response(r, 201, request_id.to_owned()))?;
        tracing::debug!(
            key = lease.key(),
            fencing_token = lease.fencing_token(),
            request_id,
            "lock acquired"
        );
        Ok((lease, sent_at))
    }
}

/// `locks.renew(&lease, ttl)`; see [`Locks::renew`].
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Renew {
    common: Common,
    lease: LockLease,
    ttl: Duration,
}

common_methods!(Renew => LockLease);

impl Renew {
    async fn send(mut self) -> Result<LockLease> {
        let ttl = validate::ttl(self.ttl)?;
        validate::key(self.lease.key())?;
        validate::uuid("token", self.lease.token())?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        let lease = self.lease;
        let body = self
            .common
            .send(
                Op::Renew,
                lease.key(),
                Some(lease.token()),
                &request_id,
                Some(ttl),
                None,
            )
            .await?;
        LockLease::decode(
            lease.key().to_owned(),
            lease.token().to_owned(),
            &expect_body(body),
        )
        .map_err(|r| invalid_response(r, 200, request_id))
    }
}

/// `locks.get(key)`; see [`Locks::get`].
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Get {
    common: Common,
    key: String,
}

common_methods!(Get => LockState);

impl Get {
    async fn send(mut self) -> Result<LockState> {
        validate::key(&self.key)?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        let body = self
            .common
            .send(Op::Get, &self.key, None, &request_id, None, None)
            .await?;
        LockState::decode(&expect_body(body)).map_err(|r| invalid_response(r, 200, request_id))
    }
}

/// `locks.release(&lease)`; see [`Locks::release`].
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Release {
    common: Common,
    lease: LockLease,
}

common_methods!(Release => ());

impl Release {
    async fn send(mut self) -> Result<()> {
        validate::key(self.lease.key())?;
        validate::uuid("token", self.lease.token())?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        self.common
            .send(
                Op::Release,
                self.lease.key(),
                Some(self.lease.token()),
                &request_id,
                None,
                None,
            )
            .await?;
        tracing::debug!(
            key = self.lease.key(),
            fencing_token = self.lease.fencing_token(),
            request_id,
            "lock released"
        );
        Ok(())
    }
}

/// `locks.force_release(key)`; see [`Locks::force_release`].
#[derive(Debug)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct ForceRelease {
    common: Common,
    key: String,
}

common_methods!(ForceRelease => ());

impl ForceRelease {
    async fn send(mut self) -> Result<()> {
        validate::key(&self.key)?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        self.common
            .send(Op::ForceRelease, &self.key, None, &request_id, None, None)
            .await?;
        tracing::info!(key = %self.key, request_id, "lock force-released");
        Ok(())
    }
}
