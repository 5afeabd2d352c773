//! `locks.acquire(key, ttl)`: the one operation that may be tried again,
//! waited for, and undone. What a guard needs to time the lease it got
//! ([`Measured`]) is measured here too; the tries and the wait are in
//! [`tries`], the undo of an uncertain outcome in [`undo`].

mod tries;
mod undo;

use std::time::Duration;

use super::{requests, wait, Spec};
use crate::error::{Error, Result};
use crate::lease::LockLease;
use crate::retry::wait::DEFAULT_POLL;
use crate::validate;
use tries::Try;
use undo::Undo;

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
        send_by,
        on_retry,
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
        None => {
            let window = wait::Window {
                send_by,
                answer_by: None,
            };
            let on_retry = on_retry.as_deref().map(|f| f as &(dyn Fn() + Sync));
            one.once(window, &mut undo, on_retry).await
        }
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
