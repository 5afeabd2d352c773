//! The options of a lock call, in one value: [`AcquireOptions`] for every
//! way of acquiring, `RequestOptions` (its request id and timeout) for the
//! single requests. Builders only collect them and hand them to the engine.
//!
//! Each option's setters are written once, with their docs, by
//! [`option_setters!`]: `x(value)` sets it, `set_x(Option<value>)` sets or
//! clears it (`None` keeps the SDK's default), on [`AcquireOptions`] and on
//! each builder it applies to. Adding an option means one field, one arm
//! here, and its name in the lists of the builders it applies to.

use std::time::Duration;

/// `option_setters!(impl[generics] Type => [path to its options] { option, ... })`
/// writes `option(value)` and `set_option(Option<value>)` for each option
/// named, on `self.path.option`.
macro_rules! option_setters {
    (impl[$($generics:tt)*] $ty:ty => $path:tt { $($option:ident),+ $(,)? }) => {
        impl<$($generics)*> $ty {
            $( option_setters!(@ $path $option); )+
        }
    };
    (@ [$($path:tt)*] token) => {
        /// Acquires with this ownership token (a UUID string, sent exactly
        /// as spelled) instead of a fresh one. Acquiring again with the same
        /// token recovers the same lease, so after an uncertain outcome the
        /// caller recovers it that way, and nothing is released behind the
        /// caller's back.
        pub fn token(self, token: impl Into<String>) -> Self {
            self.set_token(Some(token.into()))
        }

        /// Sets or clears [`token`](Self::token); `None`: a fresh token.
        pub fn set_token(mut self, token: Option<String>) -> Self {
            self $(.$path)* .token = token;
            self
        }
    };
    (@ [$($path:tt)*] request_id) => {
        /// Sends this request id (a UUID string, sent exactly as spelled)
        /// instead of a fresh one. Reuse it only to retry the same logical
        /// operation. Where a lock is held (`hold`, `with_lock`), it is the
        /// acquire's: renewals and the release use fresh ones.
        pub fn request_id(self, request_id: impl Into<String>) -> Self {
            self.set_request_id(Some(request_id.into()))
        }

        /// Sets or clears [`request_id`](Self::request_id); `None`: a fresh
        /// one.
        pub fn set_request_id(mut self, request_id: Option<String>) -> Self {
            self $(.$path)* .request_id = request_id;
            self
        }
    };
    (@ [$($path:tt)*] timeout) => {
        /// Overrides the client's per-request timeout for this call. Where
        /// a lock is held (`hold`, `with_lock`), the acquire's: renewals are
        /// timed by the lease, and the release uses the client's timeout.
        pub fn timeout(self, timeout: ::std::time::Duration) -> Self {
            self.set_timeout(Some(timeout))
        }

        /// Sets or clears [`timeout`](Self::timeout); `None`: the client's.
        pub fn set_timeout(mut self, timeout: Option<::std::time::Duration>) -> Self {
            self $(.$path)* .timeout = timeout;
            self
        }
    };
    (@ [$($path:tt)*] wait) => {
        /// On `409 lock_held`, keep trying with the same ownership token
        /// until the lock is acquired or `timeout` has passed; then the last
        /// conflict stands: an `Error::Conflict` (so `is_lock_held()` stays
        /// true), or `Ok(None)` from `try_with_lock`. For a set of keys
        /// (`hold_all`, `with_locks`) `timeout` is one deadline for the
        /// whole set.
        ///
        /// Fast when it matters, cheap when it lasts: the pause between
        /// tries starts at 0.3 s and grows with the time waited (30 % of
        /// it, jittered) up to the poll interval (default 10 s, see
        /// `poll_interval`), so a lock released gracefully is noticed
        /// within about 30 % of the time already waited, and a long wait
        /// costs one try per poll interval. Quota-aware, because a
        /// project's 600 lock operations a minute are shared by its whole
        /// fleet: a waiter that learned the holder's expiry (one `get`)
        /// looks again at the moment the lease could be taken over
        /// (`expires_at` + 1 s), so one whose holder crashed gets it
        /// within ttl + 1 s; waiters of one client on one key take turns,
        /// only the first in line sending. Transient failures (no answer,
        /// 429, 500/502/503/504: `Error::is_transient`) are tried again
        /// (the same token makes that safe), after any `Retry-After` (at
        /// most 60 s) plus up to one poll interval of jitter, so that a
        /// fleet does not fire at the first second of the next quota
        /// window; any other error returns at once.
        ///
        /// No try starts after `timeout`; one in flight then has 2 s more to
        /// answer (a late success is returned as the lease). If it never
        /// answers, the wait returns its `Error::Transport`, not an older
        /// conflict, and a lease it may have obtained is undone with a
        /// release when the SDK generated the token; with a token of the
        /// caller's (`.token(..)`), acquire again with it to recover the
        /// lease. `Duration::MAX` waits forever (at the poll interval from
        /// the start, as a standby does); `Duration::ZERO` makes one try
        /// with 2 s to answer.
        pub fn wait(self, timeout: ::std::time::Duration) -> Self {
            self.set_wait(Some(timeout))
        }

        /// Sets or clears [`wait`](Self::wait); `None`: no waiting, a lock
        /// held elsewhere is an `Error::Conflict` at once.
        pub fn set_wait(mut self, timeout: Option<::std::time::Duration>) -> Self {
            self $(.$path)* .wait = timeout;
            self
        }
    };
    (@ [$($path:tt)*] poll_interval) => {
        /// The pause between a wait's tries once its ramp has grown to it
        /// (default 10 s, jittered by a few percent; at least 100 ms); a
        /// 429 or a `Retry-After` pauses longer (see `wait`). Shorter picks
        /// up a released lock sooner in a long wait and costs quota: each
        /// waiter sends about `60 / interval` acquires a minute once its
        /// ramp reaches it, on top of one `get` per holder lease period.
        pub fn poll_interval(self, interval: ::std::time::Duration) -> Self {
            self.set_poll_interval(Some(interval))
        }

        /// Sets or clears [`poll_interval`](Self::poll_interval); `None`:
        /// the default, 10 s.
        pub fn set_poll_interval(mut self, interval: Option<::std::time::Duration>) -> Self {
            self $(.$path)* .poll_interval = interval;
            self
        }
    };
    (@ [$($path:tt)*] max_hold) => {
        /// Holds the lock at most this long from when it was acquired (for a
        /// set: each key; for a leader: each term): then renewal stops, the
        /// lease is released, and the loss is reported as
        /// [`LostReason::MaxHold`](crate::LostReason::MaxHold), whatever the
        /// protected code is doing (it sees the loss on `lost()`; a scope
        /// with `cancel_on_loss` and a leader's term are stopped, and the
        /// candidate waits about one poll interval before campaigning
        /// again, so that another may win). A stuck job cannot keep the
        /// lock forever. At least 1 s. Only for a lock that is held
        /// (`hold`, `with_lock`, sets, leaders): a plain `acquire` given
        /// one fails with `Error::InvalidArgument`, as nothing would end it.
        pub fn max_hold(self, max_hold: ::std::time::Duration) -> Self {
            self.set_max_hold(Some(max_hold))
        }

        /// Sets or clears [`max_hold`](Self::max_hold); `None`: no cap.
        pub fn set_max_hold(mut self, max_hold: Option<::std::time::Duration>) -> Self {
            self $(.$path)* .max_hold = max_hold;
            self
        }
    };
}

/// The options of one acquisition, as one value: the ownership token, the
/// request id and timeout of the acquire, how long to wait for a held lock
/// and how often to look, and (for a lock that is held, not just acquired)
/// the longest hold. An option that was not set keeps the SDK's default.
///
/// The builders take the options that apply to them, with the same
/// setters (`x(value)`, and `set_x(Option<value>)`, where `None` keeps the
/// default): `acquire` all but `max_hold`; `hold`, `with_lock` and
/// `try_with_lock` all six; `hold_all` and `with_locks` `wait`,
/// `poll_interval` and `max_hold` (each key gets a token and request id of
/// its own); `leader` `poll_interval` and `max_hold` (it waits without a
/// deadline, a fresh token per campaign). `.options(value)` on `acquire`,
/// `hold`, `with_lock` and `try_with_lock` sets them all at once, for a
/// caller that reads them from its own configuration (the `volcano` CLI
/// builds its flags into one), and `get_x()` reads them back:
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks, token: Option<String>) -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// use volcano::AcquireOptions;
/// let options = AcquireOptions::default()
///     .set_token(token) // None: a fresh token
///     .wait(Duration::from_secs(60));
/// let held = locks
///     .hold("report", Duration::from_secs(30))
///     .options(options)
///     .await?;
/// # let _ = held; Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct AcquireOptions {
    pub(crate) token: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) poll_interval: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
}

impl std::fmt::Debug for AcquireOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcquireOptions")
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .field("request_id", &self.request_id)
            .field("timeout", &self.timeout)
            .field("wait", &self.wait)
            .field("poll_interval", &self.poll_interval)
            .field("max_hold", &self.max_hold)
            .finish()
    }
}

impl AcquireOptions {
    /// The ownership token set, if any.
    pub fn get_token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The request id set, if any.
    pub fn get_request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// The timeout set, if any.
    pub fn get_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The wait set, if any.
    pub fn get_wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The poll interval set, if any.
    pub fn get_poll_interval(&self) -> Option<Duration> {
        self.poll_interval
    }

    /// The longest hold set, if any.
    pub fn get_max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The request id and timeout of the acquire.
    pub(crate) fn request(&self) -> RequestOptions {
        RequestOptions {
            request_id: self.request_id.clone(),
            timeout: self.timeout,
        }
    }
}

/// The options of a single request: its request id and timeout.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestOptions {
    pub(crate) request_id: Option<String>,
    pub(crate) timeout: Option<Duration>,
}

option_setters!(impl[] AcquireOptions => [] {
    token,
    request_id,
    timeout,
    wait,
    poll_interval,
    max_hold,
});
