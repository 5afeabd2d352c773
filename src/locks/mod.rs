//! The lock API: [`Locks`] and its request builders.
//!
//! Every operation returns a builder; optional parameters are builder
//! methods, and `.await` sends the request.

mod clock;
mod guard;
pub(crate) mod lease;
mod release;
mod wait;

pub use clock::LeaseClock;
pub use guard::{LockGuard, WithLock};

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::ops::{self, Operation};
use crate::transport::{Answer, Timing};
use crate::validate;
use lease::{LockLease, LockState};

/// The boxed future behind each builder's `.await`.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

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

/// A lease as a guard needs it: when it was asked for, and what the server
/// granted by its own clock.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) lease: LockLease,
    /// Lease-clock reading taken just before the request that produced the
    /// lease was sent: the earliest the lease can have started.
    pub(crate) sent_at: Duration,
    /// Lower bound of the time the server granted, from server-clock
    /// readings only (see [`granted`]); `None` without a `Date` header.
    pub(crate) granted: Option<Duration>,
}

impl Measured {
    fn new(
        lease: LockLease,
        sent_at: Duration,
        date: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Self {
        let granted = date.map(|date| granted(lease.expires_at(), date));
        Measured {
            lease,
            sent_at,
            granted,
        }
    }
}

/// The time a lease answer grants at the latest moment the server can have
/// sent it: `expires_at` minus the answer's `Date`, less one second because
/// `Date` has whole seconds (the server's clock may have read up to a second
/// more). Both readings come from the server's clock, so no clock skew
/// between it and this machine enters; zero when the lease had already
/// expired.
pub(crate) fn granted(
    expires_at: chrono::DateTime<chrono::Utc>,
    date: chrono::DateTime<chrono::Utc>,
) -> Duration {
    let whole_second = chrono::TimeDelta::seconds(1);
    expires_at
        .signed_duration_since(date)
        .checked_sub(&whole_second)
        .and_then(|left| left.to_std().ok())
        .unwrap_or_default()
}

/// Undoes an acquire whose outcome the caller will never see. Armed only
/// for a token the SDK generated: a caller who chose the token recovers by
/// acquiring again with it, and a release sent behind its back could free
/// the lease that recovery just obtained.
///
/// If the acquire future is dropped while a try is in flight, or the call
/// fails after a try whose outcome is unknown, `Drop` hands a release with
/// the token to the client's background releases ([`Client::shutdown`]
/// waits for them). Release is idempotent: freeing a lease that was never
/// granted costs one request.
struct Undo {
    locks: Locks,
    key: String,
    /// The ttl asked for: the longest a granted lease can live.
    ttl: Duration,
    /// The generated token; `None` once there is nothing to undo.
    token: Option<String>,
    in_flight: bool,
    uncertain: bool,
}

impl Undo {
    fn new(locks: &Locks, key: &str, ttl: Duration, generated: Option<&str>) -> Self {
        Undo {
            locks: locks.clone(),
            key: key.to_owned(),
            ttl,
            token: generated.map(str::to_owned),
            in_flight: false,
            uncertain: false,
        }
    }

    fn sending(&mut self) {
        self.in_flight = true;
    }

    fn answered<T>(&mut self, result: &Result<T>) {
        self.in_flight = false;
        match result {
            Ok(_) => self.token = None,
            Err(err) if err.may_have_applied() => self.uncertain = true,
            Err(_) => {}
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        if !(self.in_flight || self.uncertain) {
            return;
        }
        let lease = LockLease::new(
            self.key.clone(),
            token,
            chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            0,
        );
        release::in_background(
            &self.locks,
            lease,
            self.ttl,
            "undo an acquire whose outcome is unknown",
        );
    }
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
    /// error returns at once.
    ///
    /// No try starts after `timeout`; one in flight then has 2 s more to
    /// answer (a late success is returned as the lease). If it never
    /// answers, the wait returns its `Error::Transport`, not an older
    /// conflict, and a lease it may have obtained is undone with a release
    /// when the SDK generated the token. With [`Acquire::token`], acquire
    /// again with the same token to recover it. `Duration::MAX` waits
    /// forever; `Duration::ZERO` makes one try with 2 s to answer.
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
        self.send_measured().await.map(|measured| measured.lease)
    }

    /// Acquires and also returns what a guard needs to time the lease.
    pub(crate) async fn send_measured(mut self) -> Result<Measured> {
        let ttl = validate::ttl(self.ttl)?;
        validate::key(&self.key)?;
        self.common.check_timeout()?;
        let (token, generated) = match self.token.take() {
            Some(token) => (validate::uuid("token", &token).map(|()| token)?, false),
            None => (validate::new_uuid(), true),
        };
        let request_id = self.common.request_id()?;
        if !generated {
            // A background release of this very token (a cancelled scope,
            // say) must not free the lease this acquire may recover.
            self.common
                .locks
                .client
                .supersede_releases(&self.key, &token)
                .await;
        }
        let mut undo = Undo::new(
            &self.common.locks,
            &self.key,
            self.ttl,
            generated.then_some(token.as_str()),
        );
        match self.wait {
            None => {
                let window = wait::Window::default();
                self.try_once(ttl, &token, &request_id, window, &mut undo)
                    .await
            }
            Some(timeout) => {
                let waiter = wait::Waiter::new(timeout);
                self.wait_for(waiter, ttl, &token, &request_id, &mut undo)
                    .await
            }
        }
    }

    /// Tries until acquired, a definitive error, or the waiter's deadline. No
    /// try starts after the deadline; one in flight then gets a bounded
    /// grace to answer (see [`wait::Window`]).
    async fn wait_for(
        &self,
        mut waiter: wait::Waiter,
        ttl: u64,
        token: &str,
        request_id: &str,
        undo: &mut Undo,
    ) -> Result<Measured> {
        loop {
            let window = waiter.window();
            let err = match self.try_once(ttl, token, request_id, window, undo).await {
                Ok(measured) => return Ok(measured),
                Err(err) => err,
            };
            let (pause, learn_holder) = match waiter.after(err) {
                wait::Step::Stop(err) => return Err(err),
                wait::Step::Retry {
                    pause,
                    learn_holder,
                } => (pause, learn_holder),
            };
            let left = waiter.remaining();
            if learn_holder && !left.is_zero() {
                let limit = left.min(self.common.locks.client.timeout());
                let get = self.common.locks.get(self.key.clone()).timeout(limit);
                if let Ok(state) = get.await {
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
            if let Some(err) = waiter.timed_out() {
                return Err(err);
            }
        }
    }

    /// One acquire (with the transport's single retry on transport failure
    /// or 503), with the lease-clock reading taken before it was sent.
    async fn try_once(
        &self,
        ttl: u64,
        token: &str,
        request_id: &str,
        window: wait::Window,
        undo: &mut Undo,
    ) -> Result<Measured> {
        let sent_at = self.common.locks.client.lease_clock().now();
        undo.sending();
        let op = ops::Acquire {
            key: &self.key,
            token,
            ttl_secs: ttl,
        };
        let result = self
            .common
            .send(&op, request_id, window)
            .await
            .map(|answer| Measured::new(answer.value, sent_at, answer.date));
        undo.answered(&result);
        let measured = result?;
        tracing::debug!(
            key = measured.lease.key(),
            fencing_token = measured.lease.fencing_token(),
            request_id,
            "lock acquired"
        );
        Ok(measured)
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
    async fn send(self) -> Result<LockLease> {
        self.send_measured().await.map(|measured| measured.lease)
    }

    /// Renews and also returns what a guard needs to time the lease.
    pub(crate) async fn send_measured(mut self) -> Result<Measured> {
        let ttl = validate::ttl(self.ttl)?;
        validate::key(self.lease.key())?;
        validate::uuid("token", self.lease.token())?;
        self.common.check_timeout()?;
        let request_id = self.common.request_id()?;
        let sent_at = self.common.locks.client.lease_clock().now();
        let op = ops::Renew {
            lease: &self.lease,
            ttl_secs: ttl,
        };
        let answer = self
            .common
            .send(&op, &request_id, Default::default())
            .await?;
        Ok(Measured::new(answer.value, sent_at, answer.date))
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
        let op = ops::Get { key: &self.key };
        let answer = self
            .common
            .send(&op, &request_id, Default::default())
            .await?;
        Ok(answer.value)
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
        let op = ops::Release { lease: &self.lease };
        self.common
            .send(&op, &request_id, Default::default())
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
        let op = ops::ForceRelease { key: &self.key };
        self.common
            .send(&op, &request_id, Default::default())
            .await?;
        tracing::info!(key = %self.key, request_id, "lock force-released");
        Ok(())
    }
}
