//! The acquisition options, written once.
//!
//! Every way of acquiring wraps one spec: [`Hold`](crate::Hold) holds an
//! [`Acquire`](crate::Acquire); `with_lock`, `try_with_lock`, `hold_all`,
//! `with_locks` and `leader` hold a `Hold`. Each builder names the setters
//! that apply to it, and [`acquisition_setters!`] writes them (with their
//! docs, once, here) as forwards to that spec: `acquire_spec()` reaches the
//! builder's `Acquire`, `hold_spec()` its `Hold`. Adding an option means
//! one arm here and one name in each builder's list.

/// `acquisition_setters!(impl[generics] Builder { setter, ... })`.
macro_rules! acquisition_setters {
    (impl[$($generics:tt)*] $builder:ty { $($setter:ident),+ $(,)? }) => {
        impl<$($generics)*> $builder {
            $( acquisition_setters!(@ $setter); )+
        }
    };
    (@ token) => {
        /// Acquires with this ownership token (a UUID string, sent exactly
        /// as spelled) instead of a fresh one. Acquiring again with the same
        /// token recovers the same lease, so after an uncertain outcome the
        /// caller recovers it that way, and nothing is released behind the
        /// caller's back.
        pub fn token(mut self, token: impl Into<String>) -> Self {
            self.acquire_spec().token = $crate::locks::Owner::Caller(token.into());
            self
        }
    };
    (@ request_id) => {
        /// Sends the acquire with this request id (a UUID string, sent
        /// exactly as spelled) instead of a fresh one; renewals and the
        /// release use fresh ones.
        pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
            self.acquire_spec().common.request_id = Some(request_id.into());
            self
        }
    };
    (@ timeout) => {
        /// Overrides the client's per-request timeout for the acquire
        /// (renewals are timed by the lease; the release uses the client's
        /// timeout).
        pub fn timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.acquire_spec().common.timeout = Some(timeout);
            self
        }
    };
    (@ wait) => {
        /// On `409 lock_held`, keep trying with the same ownership token
        /// until the lock is acquired or `timeout` has passed; then the last
        /// conflict stands: an `Error::Conflict` (so `is_lock_held()` stays
        /// true), or `Ok(None)` from `try_with_lock`. For a set of keys
        /// (`hold_all`, `with_locks`) `timeout` is one deadline for the
        /// whole set.
        ///
        /// Quota-aware, because a project's 600 lock operations a minute are
        /// shared by its whole fleet: the waiter learns the holder's expiry
        /// with one `get` and sleeps until the lease could be taken over
        /// (`expires_at` + 1 s), then looks again; a holder that keeps
        /// renewing costs it one request per lease period. While that moment
        /// is more than 1.5 poll intervals away it also tries every poll
        /// interval (default 10 s, ±20 %; see `poll_interval`) for an early
        /// release. So a lock released gracefully is picked up within about
        /// one poll interval; one whose holder crashed within ttl + 1 s.
        /// Transport failures, 429 and 503 are tried again (the same token
        /// makes that safe), after any `Retry-After` (at most 60 s) plus up
        /// to one poll interval of jitter, so that a fleet does not fire at
        /// the first second of the next quota window; any other error
        /// returns at once.
        ///
        /// No try starts after `timeout`; one in flight then has 2 s more to
        /// answer (a late success is returned as the lease). If it never
        /// answers, the wait returns its `Error::Transport`, not an older
        /// conflict, and a lease it may have obtained is undone with a
        /// release when the SDK generated the token; with a token of the
        /// caller's (`.token(..)`), acquire again with it to recover the
        /// lease. `Duration::MAX`
        /// waits forever; `Duration::ZERO` makes one try with 2 s to answer.
        pub fn wait(mut self, timeout: ::std::time::Duration) -> Self {
            self.acquire_spec().wait = Some(timeout);
            self
        }
    };
    (@ poll_interval) => {
        /// How often a wait tries for an early release while the holder's
        /// lease has long to run (default 10 s, at least 100 ms). Shorter
        /// picks up a released lock sooner and costs quota: each waiter
        /// sends about `60 / interval` acquires a minute on top of one `get`
        /// per holder lease period.
        pub fn poll_interval(mut self, interval: ::std::time::Duration) -> Self {
            self.acquire_spec().poll_interval = Some(interval);
            self
        }
    };
    (@ max_hold) => {
        /// Holds the lock at most this long from when it was acquired (for a
        /// set: each key; for a leader: each term): then renewal stops, the
        /// lease is released, and the loss is reported as
        /// [`LostReason::MaxHold`](crate::LostReason::MaxHold), whatever the
        /// protected code is doing (it sees the loss on `lost()`; a scope
        /// with `cancel_on_loss` and a leader's term are stopped, and the
        /// candidate waits about one poll interval before campaigning
        /// again, so that another may win). A stuck job cannot keep the
        /// lock forever. At least 1 s.
        pub fn max_hold(mut self, max_hold: ::std::time::Duration) -> Self {
            self.hold_spec().max_hold = Some(max_hold);
            self
        }
    };
}
