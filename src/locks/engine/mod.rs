//! The engine: how a lease lives, from the acquire to the last release.
//!
//! The builders above it only collect options and hand them here; the
//! handles beside it ([`LockGuard`](crate::LockGuard),
//! [`HeldLock`](crate::HeldLock), the sets) read its state and call its
//! ends. It calls the wire layer ([`Transport`](crate::transport)) itself
//! and never constructs a public builder.
//!
//! One concept a file:
//! - [`requests`]: the single requests (renew, get, release, force
//!   release), validated and sent once;
//! - [`acquire`]: the acquire, its single retry, undoing an uncertain
//!   outcome, and waiting for a held lock, with [`wait`] (the pacing of the
//!   tries) and [`turns`] (waiters of one client on one key);
//! - [`state`]: a held lease's local deadline and lost-ownership signal;
//!   [`risk`]: its early warning; [`renewal`]: the background renewal;
//! - [`release`]: the one release policy, in the foreground and behind it;
//! - [`hold`]: a lock held until released or dropped; [`scope`]: a closure
//!   run while held; [`set`]: several keys, all or nothing; [`leader`]:
//!   terms run while elected.
//!
//! The guard keeps its own deadline on the lease clock, measured from just
//! before each acquire or renew was sent: the server cannot have started
//! the lease earlier, so the local deadline never falls after the server's
//! expiry. How long a lease lasts is the lesser of the ttl asked for and
//! what the server says it granted, measured on the server's clock alone
//! (`expires_at` minus the answer's `Date`, less a second for `Date`'s
//! rounding) and applied from the local send time: the server's clock is
//! never compared with this machine's.

pub(crate) mod acquire;
pub(crate) mod hold;
pub(crate) mod leader;
pub(crate) mod observe;
pub(crate) mod release;
pub(crate) mod renewal;
pub(crate) mod requests;
pub(crate) mod risk;
pub(crate) mod scope;
pub(crate) mod semaphore;
pub(crate) mod set;
pub(crate) mod state;
pub(crate) mod turns;
pub(crate) mod wait;

use std::time::Duration;

use crate::locks::{AcquireOptions, Locks};

pub(crate) use acquire::{Measured, Owner};

/// One acquisition as the engine runs it: where, for how long, whose
/// token, and the options. A set makes one per key; a leader one per
/// campaign, with a token of its own.
#[derive(Clone)]
pub(crate) struct Spec {
    pub(crate) locks: Locks,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) owner: Owner,
    /// The rest of the options; its token is in `owner`.
    pub(crate) options: AcquireOptions,
    /// Told when a wait's tries begin to fail without an answer from the
    /// service (`Some`: since when) and when answers come back (`None`):
    /// a leader's status.
    pub(crate) reach: Option<Reach>,
    /// Keep the lock at least this long after it was handed over: its end
    /// is kept by the service ([`hold::Holding::finish`]).
    pub(crate) min_hold: Option<Duration>,
    /// A try that does not wait sends no retry from this instant on: a
    /// permit's try inside a wait for a permit, whose deadline it is.
    pub(crate) send_by: Option<tokio::time::Instant>,
    /// Told when the transport's retry of a try that does not wait goes
    /// (a permit's try: its round learns what the retry came after).
    pub(crate) on_retry: Option<OnRetry>,
}

/// See [`Spec::on_retry`].
pub(crate) type OnRetry = std::sync::Arc<dyn Fn() + Send + Sync>;

/// See [`Spec::reach`].
pub(crate) type Reach = std::sync::Arc<dyn Fn(Option<tokio::time::Instant>) + Send + Sync>;

impl Spec {
    /// The caller's token, if the options name one, becomes the owner.
    pub(crate) fn new(
        locks: &Locks,
        key: impl Into<String>,
        ttl: Duration,
        mut options: AcquireOptions,
    ) -> Self {
        let owner = match options.token.take() {
            Some(token) => Owner::Caller(token),
            None => Owner::Fresh,
        };
        Spec {
            locks: locks.clone(),
            key: key.into(),
            ttl,
            owner,
            options,
            reach: None,
            min_hold: None,
            send_by: None,
            on_retry: None,
        }
    }
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("owner", &self.owner)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}
