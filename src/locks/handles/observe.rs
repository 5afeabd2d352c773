//! A key's holders as a stream: [`Observe`] and the [`LockChange`]s it
//! yields.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::lease::LockState;
use crate::locks::engine::observe::Observer;
use crate::locks::Locks;

/// Each change of one key's holder, from [`Locks::observe`]: acquired,
/// renewed, taken over, released or expired, judged on the service's clock.
///
/// It looks at the key (`get`, no ownership token) every poll interval
/// (default 10 s: six requests a minute, 1 % of a 600/min project quota).
/// Around a known lease's expiry it looks once more when that comes
/// sooner (at most one such look per interval while the holder keeps
/// renewing, so a holder whose TTL is shorter than the interval costs at
/// most twice as much; one such look that came too early, the service's
/// clock known here to a second only, gets one more, three times at most),
/// and once as a lease that could no longer be renewed frees: an expiry is
/// told from a release, and a holder that stopped renewing is seen gone
/// about a second after its lease ended.
/// After a 429 with a `Retry-After`, every observer of the client waits
/// out that window (each with its own spread of up to a poll interval).
///
/// ```no_run
/// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
/// let mut changes = locks.observe("nightly-report");
/// while let Some(change) = changes.next().await {
///     let change = change?;
///     println!("{:?}: fencing token {:?}", change.kind(), change.state().fencing_token());
/// }
/// # Ok(()) }
/// ```
///
/// A failed look is yielded as an error. After a bad argument, or an
/// answer about the request itself (400, 401, 403, 404: a bad key, a
/// refused service key), the stream ends (`None`); after any other (no
/// answer, a 429, a 5xx, an answer it could not use) it goes on, and the
/// next look waits out the poll interval or the `Retry-After`. A look in
/// flight when its `next()` is dropped is kept: the next call gets its
/// answer instead of sending another. Changes while looks failed are not
/// lost but
/// merged: the next answer is compared with the last one that came.
///
/// What it cannot see: two changes between two looks show as one (a
/// release and a new holder as [`ChangeKind::TakenOver`]; a holder that
/// acquired and released as nothing). A lease renewed to a shorter TTL
/// between two looks and then expired reads as released.
///
/// `next` is cancel-safe: a `next()` dropped while it waits or looks (a
/// `select!` branch that lost) has changed nothing, and the next call
/// reports what it would have: a look it had sent is answered to it.
pub struct Observe {
    locks: Locks,
    observer: Observer,
}

impl Observe {
    pub(crate) fn new(locks: Locks, key: String) -> Observe {
        Observe {
            locks,
            observer: Observer::new(key),
        }
    }

    /// The longest interval between two looks (default 10 s; at least
    /// 100 ms, else the first `next()` yields `InvalidArgument`). A
    /// release is seen on average half an interval after it happened.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.observer.poll = interval;
        self
    }

    /// The key observed.
    pub fn key(&self) -> &str {
        &self.observer.key
    }

    /// How long until the next look may go (zero if it may go now), as
    /// the last answer or failure set it: after a 429, the window the
    /// service named and its spread.
    pub fn next_look_in(&self) -> Duration {
        self.observer.next_look_in()
    }

    /// The next change: the first call yields how the key stood
    /// ([`ChangeKind::Initial`]); every later one waits for a change.
    /// `Some(Err)` for a failed look; `None` once the stream has ended
    /// (after an error that another look cannot mend).
    pub async fn next(&mut self) -> Option<Result<LockChange>> {
        self.observer.next(&self.locks).await
    }

    /// True once the stream has ended: the error `next` just yielded was
    /// one another look cannot mend (a bad key, a refused service key),
    /// and `next` returns `None` from now on. What a consumer that shows
    /// errors as they come (the CLI's `locks watch`) asks, so that it ends
    /// exactly where the stream does.
    pub fn is_ended(&self) -> bool {
        self.observer.is_ended()
    }
}

impl fmt::Debug for Observe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observe")
            .field("key", &self.observer.key)
            .field("poll_interval", &self.observer.poll)
            .finish_non_exhaustive()
    }
}

/// One change of a key's holder, as [`Observe::next`] yields it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockChange {
    pub(crate) key: String,
    pub(crate) state: LockState,
    pub(crate) previous: Option<LockState>,
    pub(crate) kind: ChangeKind,
    pub(crate) date: DateTime<Utc>,
}

impl LockChange {
    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key's state after the change.
    pub fn state(&self) -> &LockState {
        &self.state
    }

    /// The state before it (the last answer that came); `None` for
    /// [`ChangeKind::Initial`].
    pub fn previous(&self) -> Option<&LockState> {
        self.previous.as_ref()
    }

    /// What kind of change it was.
    pub fn kind(&self) -> ChangeKind {
        self.kind
    }

    /// When the service answered, by its own clock (the answer's `Date`,
    /// whole seconds; this machine's clock if it had none).
    pub fn observed_at(&self) -> DateTime<Utc> {
        self.date
    }

    /// How long, at least, the holder's lease had left when the service
    /// answered, by the service's clock alone: see
    /// [`LockState::remaining`].
    pub fn remaining(&self) -> Option<Duration> {
        self.state.remaining()
    }
}

/// What kind of change a [`LockChange`] was. Released and expired are
/// told apart on the service's clock (the answers' `Date`), never this
/// machine's, unless an answer comes without a `Date`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChangeKind {
    /// The first answer: how the key stood when observing began.
    Initial,
    /// Free before, held now.
    Acquired,
    /// Held under the same fencing token, with another expiry (later, or
    /// sooner after a renewal with a shorter TTL).
    Renewed,
    /// Held under another fencing token than before: the lease seen
    /// before ended (released, expired or force-released) and another was
    /// granted between two looks.
    TakenOver,
    /// Freed before its expiry: released by its holder, or
    /// force-released (the service does not say which).
    Released,
    /// Freed at or after its expiry: it was seen current when it could no
    /// longer be renewed (its last second, or the grace after it). A
    /// release within that last second reads as this too.
    Expired,
    /// Freed, and the answers cannot tell a release from an expiry: it
    /// was last seen before its final second, and seen free only when that
    /// second had begun (the looks between failed, or it was released
    /// just before its expiry).
    Ended,
}

impl ChangeKind {
    /// A short name: `initial`, `acquired`, `renewed`, `taken_over`,
    /// `released`, `expired`, `ended`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ChangeKind::Initial => "initial",
            ChangeKind::Acquired => "acquired",
            ChangeKind::Renewed => "renewed",
            ChangeKind::TakenOver => "taken_over",
            ChangeKind::Released => "released",
            ChangeKind::Expired => "expired",
            ChangeKind::Ended => "ended",
        }
    }
}

impl fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
