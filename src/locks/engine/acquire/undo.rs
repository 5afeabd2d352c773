//! Undoing an acquire whose outcome the caller will never see ([`Undo`]):
//! which tries may still land, and the releases that free what they got.

use std::time::Duration;

use crate::error::Result;
use crate::lease::LockLease;
use crate::locks::engine::release;
use crate::locks::Locks;
use crate::retry::LATE_TRY_MARGIN;
use tokio::time::Instant;

/// Undoes an acquire whose outcome the caller will never see. Armed only
/// for a token the SDK generated ([`Owner`](super::Owner)): a caller who chose the token
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
pub(super) struct Undo<'a> {
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
    pub(super) fn new(
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

    pub(super) fn sending(&mut self) {
        self.in_flight = true;
    }

    pub(super) fn answered<T>(&mut self, result: &Result<T>) {
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
    pub(super) fn unknown_from_now(&mut self) {
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
    pub(super) fn granted(&mut self) {
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
