//! `locks.acquire(key, ttl)`: the one operation that may be tried again,
//! waited for, and undone. What a guard needs to time the lease it got
//! ([`Measured`]) is measured here too.

use std::time::Duration;

use super::{release, requests, wait, Spec};
use crate::error::{Error, Result};
use crate::lease::LockLease;
use crate::locks::{Locks, RequestOptions};
use crate::ops;
use crate::retry::wait::{DEFAULT_POLL, LAST_TRY_LEAD};
use crate::retry::LATE_TRY_MARGIN;
use crate::validate;
use tokio::time::Instant;

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
    pub(crate) fn new(
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
    /// The caller's [`Acquire::token`](crate::Acquire::token): the caller recovers an uncertain
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
/// An outcome is a window, not an event: a try whose outcome became
/// unknown at `t` (its error, its timeout, its future dropped) may still be
/// applied until `t` plus its request timeout plus
/// [`LATE_TRY_MARGIN`](crate::retry::LATE_TRY_MARGIN) (held in the
/// network, or by a gateway that answered 503/504 and let the request go
/// on). The undo owns the key until that window has closed: if the call
/// fails, or its future is dropped, `Drop` hands [`release::undo`] to the
/// client's background releases ([`Client::shutdown`] waits for them and
/// names the key meanwhile): a release at once and another once no try can
/// land. If the call succeeds after such a try, the window is remembered
/// with the client, and a release of the lease before it closes is
/// followed by another after it. Release is idempotent: freeing a lease
/// that was never granted costs one request. It borrows what it would
/// release from the acquire it guards (declared before it, so dropped
/// after it): nothing is copied unless a release is sent.
struct Undo<'a> {
    locks: &'a Locks,
    key: &'a str,
    /// The ttl asked for: how long a late try's lease lives.
    ttl: Duration,
    /// Each try's timeout.
    request_timeout: Duration,
    /// The token sent; `None` once there is nothing to undo.
    token: Option<&'a str>,
    /// The SDK generated it: an unknown outcome is undone. A caller's
    /// token is never released behind the caller's back.
    generated: bool,
    in_flight: bool,
    /// A try may have been applied (also by the service's own 5xx):
    /// released at once when the call fails.
    uncertain: bool,
    /// The latest moment a try may still be applied (no answer, a
    /// gateway's 5xx, a future dropped in flight); `None` while none may.
    land_by: Option<Instant>,
}

impl<'a> Undo<'a> {
    fn new(
        locks: &'a Locks,
        key: &'a str,
        ttl: Duration,
        request_timeout: Duration,
        token: &'a str,
        generated: bool,
    ) -> Self {
        Undo {
            locks,
            key,
            ttl,
            request_timeout,
            token: Some(token),
            generated,
            in_flight: false,
            uncertain: false,
            land_by: None,
        }
    }

    fn sending(&mut self) {
        self.in_flight = true;
    }

    fn answered<T>(&mut self, result: &Result<T>) {
        self.in_flight = false;
        if let Err(err) = result {
            self.uncertain |= err.may_have_applied();
            if err.may_land_late() {
                self.unknown_from_now();
            }
        }
    }

    /// A try's outcome became unknown now: it may land until its timeout
    /// and the margin have passed.
    fn unknown_from_now(&mut self) {
        let late = self.request_timeout.saturating_add(LATE_TRY_MARGIN);
        let by = Instant::now().checked_add(late);
        let by = by.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        self.land_by = Some(self.land_by.map_or(by, |was| was.max(by)));
    }

    /// The acquisition succeeded: nothing to undo, but a try of it whose
    /// outcome was unknown may still land after its lease is let go of.
    /// Only for a generated token: a caller's token is never released
    /// behind its back, even after a release it asked for (it may have
    /// acquired again with it, from another client or process).
    fn granted(&mut self) {
        let token = self.token.take().filter(|_| self.generated);
        let (Some(token), Some(land_by)) = (token, self.land_by) else {
            return;
        };
        if land_by > Instant::now() {
            let background = self.locks.client().background();
            background.late_window(self.key, token, land_by, self.ttl);
        }
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        if self.in_flight {
            self.unknown_from_now();
        }
        if !self.generated {
            // The caller recovers the lease with its token (the error
            // says it may have been applied): nothing is released behind
            // its back, not even later.
            return;
        }
        if !(self.uncertain || self.land_by.is_some()) || sabotaged!(NoUndo) {
            return;
        }
        let lease = LockLease::new(
            self.key,
            token,
            chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            0,
        );
        match self.land_by {
            // A try may still land: released at once and again once none
            // can.
            Some(land_by) => release::undo(self.locks, lease, land_by, self.ttl),
            // The service answered every try itself: one release, for as
            // long as a lease it granted may live.
            None => release::in_background(
                self.locks,
                lease,
                self.ttl.saturating_add(self.request_timeout),
                "undo an acquire whose outcome is unknown",
            ),
        }
    }
}

/// A plain acquire (`locks.acquire(..)`): the lease alone. A `max_hold`
/// would have nothing to end it, so it is refused before anything is sent.
pub(crate) async fn lease(spec: Spec) -> Result<LockLease> {
    if spec.options.max_hold.is_some() {
        return Err(Error::invalid(
            "max_hold applies to a lock that is held (hold, with_lock, sets, leaders), not to acquire",
        ));
    }
    acquire(spec).await.map(|measured| measured.lease)
}

/// Acquires (waiting if the options say so) and also returns what a guard
/// needs to time the lease.
pub(crate) async fn acquire(spec: Spec) -> Result<Measured> {
    let Spec {
        locks,
        key,
        ttl,
        owner,
        options,
        reach,
        min_hold: _,
    } = spec;
    let ttl_secs = validate::ttl(ttl)?;
    validate::key(&key)?;
    let request = options.request();
    requests::check_timeout(&request)?;
    if let Some(poll) = options.poll_interval {
        wait::check_poll_interval(poll)?;
    }
    let (token, generated) = owner.resolve()?;
    let request_id = requests::request_id(&request)?;
    let background = locks.client().background();
    if !generated {
        // A background release of this very token (a cancelled scope,
        // say) must not free the lease this acquire may recover.
        background.supersede_releases(&key, &token).await;
    }
    let request_timeout = request.timeout.unwrap_or(locks.client().timeout());
    let mut undo = Undo::new(
        &locks,
        &key,
        ttl,
        request_timeout,
        token.as_str(),
        generated,
    );
    let one = Try {
        locks: &locks,
        key: &key,
        ttl: ttl_secs,
        token: &token,
        request_id: &request_id,
        timeout: request.timeout,
        reach: reach.as_ref(),
    };
    let started = std::time::Instant::now();
    let result = match options.wait {
        None => one.once(wait::Window::default(), &mut undo).await,
        Some(timeout) => {
            let poll = options.poll_interval.unwrap_or(DEFAULT_POLL);
            one.wait_for(wait::Waiter::new(timeout, poll), &mut undo)
                .await
        }
    };
    crate::telemetry::acquired(started.elapsed(), options.wait.is_some(), &result);
    if result.is_ok() {
        undo.granted();
    }
    drop(undo);
    let settled = match &result {
        Ok(_) => true,
        Err(err @ Error::Conflict(_)) => !err.may_have_applied(),
        Err(_) => false,
    };
    if !generated && settled {
        // Answered: a failed release of this token left nothing behind
        // (the lease is this acquire's, or another token's).
        background.forget(&key, &token);
    }
    result
}

/// The tries of one acquisition: the same token and request id each time.
struct Try<'a> {
    locks: &'a Locks,
    key: &'a str,
    ttl: u64,
    token: &'a str,
    request_id: &'a str,
    timeout: Option<Duration>,
    reach: Option<&'a super::Reach>,
}

impl Try<'_> {
    /// Tries until acquired, a definitive error, or the waiter's deadline,
    /// looking at the holder (`get`) where the waiter says (see [`wait`]).
    /// No try starts after the deadline; one in flight then gets a bounded
    /// grace to answer (see [`wait::Window`]).
    async fn wait_for(&self, mut waiter: wait::Waiter, undo: &mut Undo<'_>) -> Result<Measured> {
        let mut then = wait::Then::Acquire;
        // Waiters of this client on this key take turns, in the order they
        // began: only the first in line sends. One behind it tries once of
        // its own just before its deadline, so that what it returns is an
        // answer it got (the key may be free, or the service unreachable).
        let mut ticket = self.locks.client().turns().join(self.key);
        let mut last_try_made = false;
        // Behind another, this waiter sends nothing: what the first in
        // line says of the service is what it tells its leader's status;
        // `line_said` until its own tries are answered.
        let mut line = ticket.line_failing();
        let mut line_said = false;
        loop {
            while !ticket.is_first() {
                let wake = if last_try_made {
                    waiter.remaining()
                } else {
                    waiter.remaining().saturating_sub(LAST_TRY_LEAD)
                };
                tokio::select! {
                    biased;
                    () = ticket.first() => {
                        then = wait::Then::Acquire;
                        break;
                    }
                    Ok(()) = line.changed(), if self.reach.is_some() => {
                        let since = *line.borrow_and_update();
                        if let Some(reach) = self.reach {
                            line_said = since.is_some();
                            reach(since);
                        }
                    }
                    () = tokio::time::sleep(wake) => {
                        if last_try_made {
                            if let Some(err) = waiter.timed_out() {
                                return Err(err);
                            }
                        }
                        last_try_made = true;
                        then = wait::Then::Acquire;
                        break;
                    }
                }
            }
            // What the last try said, for the log: held, or its error.
            let mut failed: Option<String> = None;
            let step = match then {
                wait::Then::Acquire => {
                    ticket.trying();
                    let window = waiter.window();
                    match self.once(window, undo).await {
                        Ok(measured) => {
                            // Answered: a leader's status stops saying
                            // unreachable even if its term never begins
                            // (lost at once, say after a suspend).
                            if ticket.is_first() {
                                ticket.tell_failing(None);
                            }
                            if waiter.failing_since().is_some() || line_said {
                                if let Some(reach) = self.reach {
                                    reach(None);
                                }
                            }
                            return Ok(measured);
                        }
                        Err(err) => {
                            if err.is_lock_held() && err.may_have_applied() {
                                // A 409 to the transport's retry, sent
                                // when the first attempt failed: a release
                                // of this client's answered before then is
                                // older than this answer, and no news.
                                ticket.trying();
                            }
                            let was = waiter.failing_since();
                            waiter.failed(&err);
                            self.log_episode(waiter.episode(), &err);
                            let now = waiter.failing_since();
                            if ticket.is_first() {
                                ticket.tell_failing(now);
                            }
                            let told_by_line = std::mem::take(&mut line_said);
                            if let (Some(reach), true) = (self.reach, was != now || told_by_line) {
                                reach(now);
                            }
                            if !err.is_lock_held() {
                                failed = Some(crate::error::chain(&err));
                            }
                            waiter.after(err)
                        }
                    }
                }
                wait::Then::LookAtHolder => {
                    let limit = waiter.remaining().min(self.locks.client().timeout());
                    let look = RequestOptions {
                        request_id: None,
                        timeout: Some(limit),
                    };
                    let got = requests::get(self.locks, self.key, &look).await;
                    let holder = got.map(|(state, date)| wait::Holder {
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
            // Not before the window a 429 to any of this client's requests
            // named (then spread, so that its waiters do not all try at
            // that moment).
            let pause = match self.locks.client().quota().quiet_until() {
                Some(quiet) if quiet > Instant::now() => pause.max(waiter.until_quota(quiet)),
                _ => pause,
            };
            match &failed {
                None => tracing::debug!(
                    key = %self.key,
                    request_id = self.request_id,
                    pause_ms = pause.as_millis() as u64,
                    then = ?then,
                    "lock held; waiting"
                ),
                Some(error) => tracing::debug!(
                    key = %self.key,
                    request_id = self.request_id,
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
    async fn once(&self, window: wait::Window, undo: &mut Undo<'_>) -> Result<Measured> {
        let clock = self.locks.client().lease_clock();
        let sent_at = clock.now();
        undo.sending();
        let op = ops::Acquire {
            key: self.key,
            token: self.token,
            ttl_secs: self.ttl,
        };
        let result = requests::send(self.locks, &op, self.request_id, self.timeout, window).await;
        if result.as_ref().is_ok_and(|answer| answer.after_uncertain) {
            // Granted by the retry; the first attempt may still land.
            undo.unknown_from_now();
        }
        let result = result.map(|answer| Measured::new(answer.value, sent_at, answer.date, clock));
        undo.answered(&result);
        let measured = result?;
        tracing::debug!(
            key = measured.lease.key(),
            fencing_token = measured.lease.fencing_token(),
            request_id = self.request_id,
            "lock acquired"
        );
        Ok(measured)
    }
}
