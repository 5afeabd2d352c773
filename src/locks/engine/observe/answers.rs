//! What an answer says, read on the server's clock: the lease it shows
//! ([`Lease`]), what changed since the answer before ([`change`]), and the
//! server's clock as bounded by the answers' `Date`s ([`ServerClock`]).

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

use crate::lease::LockState;
use crate::locks::handles::observe::ChangeKind;

/// One second: the resolution of `Date`, the service's grace after an
/// expiry, and the least time left a renewal needs.
pub(super) const SECOND: TimeDelta = TimeDelta::seconds(1);

/// A lease as the observer last saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) fence: i64,
    pub(super) expires_at: DateTime<Utc>,
    /// The newest `Date` of an answer that showed this lease (same fence,
    /// same expiry): the server's clock read at least this then.
    pub(super) latest: DateTime<Utc>,
}

impl Lease {
    pub(super) fn of(state: &LockState, date: DateTime<Utc>) -> Option<Lease> {
        match (state.held(), state.fencing_token(), state.expires_at()) {
            (true, Some(fence), Some(expires_at)) => Some(Lease {
                fence,
                expires_at,
                latest: date,
            }),
            _ => None,
        }
    }

    /// Whether it was seen when it could no longer be renewed: with a
    /// second or less left (the service refuses such a renewal), or in its
    /// grace. After that, nothing but its end can change it.
    pub(super) fn seen_final(&self) -> bool {
        self.latest + SECOND >= self.expires_at
    }

    /// The stretch of the server's clock in which a look shows it final
    /// if it was not renewed: from the whole second before its expiry
    /// (`Date` is truncated to whole seconds) until its grace ends; more
    /// than a second long.
    pub(super) fn final_stretch(&self) -> (DateTime<Utc>, DateTime<Utc>) {
        let whole = self.expires_at.timestamp();
        let ceil = if self.expires_at.timestamp_subsec_nanos() > 0 {
            whole + 1
        } else {
            whole
        };
        let from = DateTime::from_timestamp(ceil, 0).unwrap_or(self.expires_at) - SECOND;
        (from, self.expires_at + SECOND)
    }
}

/// How a lease seen before was freed, judged on the server's clock.
fn freed(old: &Lease, date: DateTime<Utc>) -> ChangeKind {
    if date + SECOND <= old.expires_at {
        // Free while the server's clock read before the expiry.
        ChangeKind::Released
    } else if old.seen_final() {
        // Current when it could no longer be renewed, free now: it ran
        // out (or was released in its last second; the answers cannot
        // tell).
        ChangeKind::Expired
    } else {
        ChangeKind::Ended
    }
}

/// What the observer knew before an answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Before<'a> {
    /// Nothing: this is the first answer.
    First,
    Free,
    Held(&'a Lease),
}

/// What changed between two answers (`None`: nothing worth a line).
pub(super) fn change(
    before: Before<'_>,
    now: Option<&Lease>,
    date: DateTime<Utc>,
) -> Option<ChangeKind> {
    match (before, now) {
        (Before::First, _) => Some(ChangeKind::Initial),
        (Before::Free, None) => None,
        (Before::Free, Some(_)) => Some(ChangeKind::Acquired),
        (Before::Held(old), Some(new))
            if old.fence != new.fence && !sabotaged!(ObserveMissesTakeover) =>
        {
            Some(ChangeKind::TakenOver)
        }
        (Before::Held(old), Some(new)) if old.expires_at != new.expires_at => {
            Some(ChangeKind::Renewed)
        }
        (Before::Held(_), Some(_)) => None,
        (Before::Held(old), None) => Some(freed(old, date)),
    }
}

/// The server's clock as seen from here: at the local instant `base` it
/// read between `lo` and `hi`.
#[derive(Debug)]
pub(super) struct ServerClock {
    pub(super) base: Instant,
    pub(super) bounds: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

impl ServerClock {
    /// An answer sent after `sent` and received at `received`, whose
    /// `Date` read `date` (so the server's clock read in `[date, date+1s)`
    /// at some moment between the two).
    pub(super) fn sample(&mut self, sent: Instant, received: Instant, date: DateTime<Utc>) {
        let since = |t: Instant| TimeDelta::from_std(t - self.base).unwrap_or(TimeDelta::MAX);
        let lo = date - since(received);
        let hi = date + SECOND - since(sent);
        self.bounds = match self.bounds {
            // Bounds that no longer meet: the server's clock moved (a
            // jump, a drift): start again from this answer.
            Some((l, h)) if l.max(lo) <= h.min(hi) => Some((l.max(lo), h.min(hi))),
            _ => Some((lo, hi)),
        };
    }

    /// The local instant at which the server's clock reads `at`, by the
    /// middle of the bounds; `None` before any answer, or too far off.
    pub(super) fn local(&self, at: DateTime<Utc>) -> Option<Instant> {
        let (lo, hi) = self.bounds?;
        let mid = lo + (hi - lo) / 2;
        self.at(at - mid)
    }

    /// When to send a look that the server should answer while its clock
    /// reads within `[from, to)`, `rtt` after it is sent at the latest:
    /// the middle of the instants for which the bounds make that sure; if
    /// they are too wide for any (a second of `Date` against a stretch
    /// not much longer), the latest that comes before `to` by the bounds.
    /// Such a look, found too early, narrows the bounds for the next. (The
    /// observer sends no look sooner than its least interval after an
    /// answer, which can move it later.)
    pub(super) fn local_within(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        rtt: TimeDelta,
    ) -> Option<Instant> {
        let (lo, hi) = self.bounds?;
        // Sent at `base + d`, answered when the clock reads between
        // `lo + d` and `hi + d + rtt`.
        let (earliest, latest) = (from - lo, to - hi - rtt);
        if earliest <= latest {
            self.at(earliest + (latest - earliest) / 2)
        } else {
            self.at(latest)
        }
    }

    /// `base` and `after` (`base` itself if negative: due now; none past
    /// what an instant can hold).
    fn at(&self, after: TimeDelta) -> Option<Instant> {
        self.base.checked_add(after.to_std().unwrap_or_default())
    }
}
