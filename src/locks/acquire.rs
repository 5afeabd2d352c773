//! `locks.acquire(key, ttl)`: the one operation that may be tried again,
//! waited for, and undone. What a guard needs to time the lease it got
//! ([`Measured`]) is measured here too.

use std::time::Duration;

use super::{release, wait, Common, Locks};
use crate::error::{Error, Result};
use crate::lease::LockLease;
use crate::ops;
use crate::retry::wait::{DEFAULT_POLL, LAST_TRY_LEAD};
use crate::validate;

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
    /// `clock`: the lease clock `sent_at` was read on.
    pub(super) fn new(
        lease: LockLease,
        sent_at: Duration,
        date: Option<chrono::DateTime<chrono::Utc>>,
        clock: &crate::LeaseClock,
    ) -> Self {
        let sent_at = if sabotaged!(DeadlineFromReceipt) {
            clock.now()
        } else {
            sent_at
        };
        let _ = clock;
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

/// Who chose an acquisition's ownership token. Provenance is data, never
/// inferred from which builder method was called: it decides whether an
/// acquire whose outcome is unknown is undone behind the caller's back.
#[derive(Clone, Default)]
pub(crate) enum Owner {
    /// Generate a fresh token when the acquire is sent.
    #[default]
    Fresh,
    /// A token the SDK generated before sending (a leader's campaign,
    /// which must know it to wait for its release): no caller can name it,
    /// so an uncertain outcome is undone, as for [`Owner::Fresh`].
    Sdk(String),
    /// The caller's [`Acquire::token`]: the caller recovers an uncertain
    /// outcome by acquiring again with it, so nothing is undone.
    Caller(String),
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Owner::Fresh => "Fresh",
            Owner::Sdk(_) => "Sdk([redacted])",
            Owner::Caller(_) => "Caller([redacted])",
        })
    }
}

impl Owner {
    /// The token to send, and whether the SDK generated it.
    fn resolve(self) -> Result<(String, bool)> {
        match self {
            Owner::Fresh => Ok((validate::new_uuid(), true)),
            Owner::Sdk(token) => Ok((token, true)),
            Owner::Caller(token) => validate::uuid("token", &token).map(|()| (token, false)),
        }
    }
}

/// Undoes an acquire whose outcome the caller will never see. Armed only
/// for a token the SDK generated ([`Owner`]): a caller who chose the token
/// recovers by acquiring again with it, and a release sent behind its back
/// could free the lease that recovery just obtained.
///
/// If the acquire future is dropped while a try is in flight, or the call
/// fails after a try whose outcome is unknown, `Drop` hands a release with
/// the token to the client's background releases ([`Client::shutdown`]
/// waits for them). Release is idempotent: freeing a lease that was never
/// granted costs one request. It borrows what it would release from the
/// acquire it guards (declared before it, so dropped after it): nothing is
/// copied unless a release is sent.
struct Undo<'a> {
    locks: &'a Locks,
    key: &'a str,
    /// The ttl asked for: the longest a granted lease can live.
    ttl: Duration,
    /// The generated token; `None` once there is nothing to undo.
    token: Option<&'a str>,
    in_flight: bool,
    uncertain: bool,
}

impl<'a> Undo<'a> {
    fn new(locks: &'a Locks, key: &'a str, ttl: Duration, generated: Option<&'a str>) -> Self {
        Undo {
            locks,
            key,
            ttl,
            token: generated,
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

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        if !(self.in_flight || self.uncertain) || sabotaged!(NoUndo) {
            return;
        }
        let lease = LockLease::new(
            self.key,
            token,
            chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            0,
        );
        release::in_background(
            self.locks,
            lease,
            self.ttl,
            "undo an acquire whose outcome is unknown",
        );
    }
}

/// `locks.acquire(key, ttl)`; see [`Locks::acquire`].
///
/// A builder, not a future: `.await` it, or call `.send()` for a future
/// that can be spawned or stored. The spec inside every way of acquiring:
/// its options (token, request id, timeout, wait, poll interval) are the
/// same on [`Hold`](crate::Hold), `with_lock` and the rest.
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// // Wait up to two minutes for the holder, trying for an early release
/// // every 2 s.
/// let lease = locks
///     .acquire("schema-migration", Duration::from_secs(60))
///     .wait(Duration::from_secs(120))
///     .poll_interval(Duration::from_secs(2))
///     .await?;
/// # let _ = lease; Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a request builder does nothing until it is awaited"]
pub struct Acquire {
    pub(super) common: Common,
    pub(super) key: String,
    pub(super) ttl: Duration,
    pub(super) token: Owner,
    pub(super) wait: Option<Duration>,
    pub(super) poll_interval: Option<Duration>,
}

common_methods!(Acquire => LockLease);

impl std::fmt::Debug for Acquire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("token", &self.token)
            .field("request_id", &self.common.request_id)
            .field("wait", &self.wait)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

acquisition_setters!(impl[] Acquire { token, wait, poll_interval });

impl Acquire {
    fn acquire_spec(&mut self) -> &mut Acquire {
        self
    }

    async fn execute(self) -> Result<LockLease> {
        self.send_measured().await.map(|measured| measured.lease)
    }

    /// Acquires and also returns what a guard needs to time the lease.
    pub(crate) async fn send_measured(mut self) -> Result<Measured> {
        let ttl = validate::ttl(self.ttl)?;
        validate::key(&self.key)?;
        self.common.check_timeout()?;
        if let Some(poll) = self.poll_interval {
            wait::check_poll_interval(poll)?;
        }
        let (token, generated) = std::mem::take(&mut self.token).resolve()?;
        let request_id = self.common.request_id()?;
        if !generated {
            // A background release of this very token (a cancelled scope,
            // say) must not free the lease this acquire may recover.
            self.common
                .locks
                .client
                .background()
                .supersede_releases(&self.key, &token)
                .await;
        }
        let mut undo = Undo::new(
            &self.common.locks,
            &self.key,
            self.ttl,
            generated.then_some(token.as_str()),
        );
        let started = std::time::Instant::now();
        let waited = self.wait.is_some();
        let result = match self.wait {
            None => {
                let window = wait::Window::default();
                self.try_once(ttl, &token, &request_id, window, &mut undo)
                    .await
            }
            Some(timeout) => {
                let poll = self.poll_interval.unwrap_or(DEFAULT_POLL);
                let waiter = wait::Waiter::new(timeout, poll);
                self.wait_for(waiter, ttl, &token, &request_id, &mut undo)
                    .await
            }
        };
        crate::telemetry::acquired(started.elapsed(), waited, &result);
        if !generated && matches!(&result, Ok(_) | Err(Error::Conflict(_))) {
            // Answered: a failed release of this token left nothing behind
            // (the lease is this acquire's, or another token's).
            self.common
                .locks
                .client
                .background()
                .forget(&self.key, &token);
        }
        result
    }

    /// Tries until acquired, a definitive error, or the waiter's deadline,
    /// looking at the holder (`get`) where the waiter says (see [`wait`]).
    /// No try starts after the deadline; one in flight then gets a bounded
    /// grace to answer (see [`wait::Window`]).
    async fn wait_for(
        &self,
        mut waiter: wait::Waiter,
        ttl: u64,
        token: &str,
        request_id: &str,
        undo: &mut Undo<'_>,
    ) -> Result<Measured> {
        let mut then = wait::Then::Acquire;
        // Waiters of this client on this key take turns, in the order they
        // began: only the first in line sends. One behind it tries once of
        // its own just before its deadline, so that what it returns is an
        // answer it got (the key may be free, or the service unreachable).
        let mut ticket = self.common.locks.client.turns().join(&self.key);
        let mut last_try_made = false;
        loop {
            if !ticket.is_first() {
                let wake = if last_try_made {
                    waiter.remaining()
                } else {
                    waiter.remaining().saturating_sub(LAST_TRY_LEAD)
                };
                tokio::select! {
                    biased;
                    () = ticket.first() => then = wait::Then::Acquire,
                    () = tokio::time::sleep(wake) => {
                        if last_try_made {
                            if let Some(err) = waiter.timed_out() {
                                return Err(err);
                            }
                        }
                        last_try_made = true;
                        then = wait::Then::Acquire;
                    }
                }
            }
            // What the last try said, for the log: held, or its error.
            let mut failed: Option<String> = None;
            let step = match then {
                wait::Then::Acquire => {
                    let window = waiter.window();
                    match self.try_once(ttl, token, request_id, window, undo).await {
                        Ok(measured) => return Ok(measured),
                        Err(err) => {
                            self.log_episode(waiter.episode(&err), &err);
                            if !err.is_lock_held() {
                                failed = Some(crate::error::chain(&err));
                            }
                            waiter.after(err)
                        }
                    }
                }
                wait::Then::LookAtHolder => {
                    let limit = waiter.remaining().min(self.common.locks.client.timeout());
                    let get = self.common.locks.get(self.key.clone()).timeout(limit);
                    let holder = get.send_dated().await.map(|(state, date)| wait::Holder {
                        held: state.held(),
                        expires_at: state.expires_at(),
                        date,
                    });
                    waiter.looked(holder)
                }
            };
            let pause = match step {
                wait::Step::Stop(err) => return Err(err),
                wait::Step::Retry { pause, then: next } => {
                    then = next;
                    pause
                }
            };
            match &failed {
                None => tracing::debug!(
                    key = %self.key,
                    request_id,
                    pause_ms = pause.as_millis() as u64,
                    then = ?then,
                    "lock held; waiting"
                ),
                Some(error) => tracing::debug!(
                    key = %self.key,
                    request_id,
                    error,
                    pause_ms = pause.as_millis() as u64,
                    then = ?then,
                    "acquire failed; trying again"
                ),
            }
            if ticket.is_first() {
                tokio::select! {
                    biased;
                    // This client freed the key: try now.
                    () = ticket.freed() => then = wait::Then::Acquire,
                    () = tokio::time::sleep(pause.min(waiter.remaining())) => {}
                }
            }
            if let Some(err) = waiter.timed_out() {
                return Err(err);
            }
        }
    }

    /// Says at WARN when a wait's tries have failed without an answer for
    /// a while (a leader that cannot reach the service would otherwise
    /// wait in silence), and at INFO when answers come back.
    fn log_episode(&self, episode: Option<wait::Episode>, err: &Error) {
        match episode {
            Some(wait::Episode::Unanswered(failing)) => tracing::warn!(
                key = %self.key,
                error = %crate::error::chain(err),
                failing_secs = failing.as_secs(),
                "acquire keeps failing without an answer about the lock; still trying"
            ),
            Some(wait::Episode::Answered) => tracing::info!(
                key = %self.key,
                "the lock service answers again; still waiting for the lock"
            ),
            None => {}
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
        undo: &mut Undo<'_>,
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
            .map(|answer| {
                let clock = self.common.locks.client.lease_clock();
                Measured::new(answer.value, sent_at, answer.date, clock)
            });
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
