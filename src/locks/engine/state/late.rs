//! Until when a hold's renewals may still land: one abandoned in flight
//! (its task stopped before the answer) or answered without proof the
//! service handled it. A keep that follows puts the expiry right once none
//! can ([`super::super::release::kept_sweep`]).

use std::time::Duration;

use super::State;
use crate::error::{LockLost, LostReason};

/// When renewal requests of a hold may still land ([`State::renewal_sent`]).
#[derive(Default, Clone, Copy)]
pub(super) struct LateRenewals {
    /// The latest moment an answered or abandoned renewal may still land.
    answered: Option<tokio::time::Instant>,
    /// The timeout of the renewal in flight.
    in_flight: Option<Duration>,
}

impl LateRenewals {
    fn may_land_until(&mut self, by: tokio::time::Instant) {
        if !sabotaged!(LateRenewalForgotten) {
            self.answered = Some(self.answered.map_or(by, |was| was.max(by)));
        }
    }
}

impl State {
    /// A renewal sent now with `timeout`: until it is answered
    /// ([`renewal_answered`](Self::renewal_answered)) it may be applied as
    /// late as its timeout and the late margin after it went out; if its
    /// task is stopped before the answer, after the moment it was given up.
    pub(crate) fn renewal_sent(&self, timeout: Duration) {
        let mut current = self.current();
        current.renewal_tried = true;
        let renewals = &mut current.renewals;
        // One still in flight was abandoned unanswered (its task stopped):
        // it went out before now, so it may land until now plus its
        // timeout and the margin.
        if let Some(abandoned) = renewals.in_flight.replace(timeout) {
            renewals.may_land_until(late_by(abandoned));
        }
    }

    /// The renewal in flight was answered: `late` when the answer does not
    /// prove the service handled it (`timed_out`: its timeout ran out, so
    /// it may land until the margin has passed; else a gateway's answer or
    /// a broken connection, until its timeout and the margin have).
    pub(crate) fn renewal_answered(&self, late: bool, timed_out: bool) {
        let mut current = self.current();
        let renewals = &mut current.renewals;
        if let Some(timeout) = renewals.in_flight.take() {
            if late {
                let left = if timed_out { Duration::ZERO } else { timeout };
                renewals.may_land_until(late_by(left));
            }
        }
    }

    /// Until when a renewal of this hold sent so far may still be applied
    /// (`None`: none can any more).
    pub(crate) fn renewals_land_by(&self) -> Option<tokio::time::Instant> {
        let renewals = self.current().renewals;
        let in_flight = renewals.in_flight.map(late_by);
        let by = renewals.answered.max(in_flight)?;
        (by > tokio::time::Instant::now()).then_some(by)
    }
}

impl State {
    /// A keep that renewed under another fencing token than `fence`
    /// renewed another lease of this token, which a late try of the
    /// acquire took once the kept one was gone (force-released, say): the
    /// minimum asked for is not kept, and that lease is the caller's to
    /// release. (A guard's own renewals take such a lease as theirs:
    /// protocol scenarios 27 and 30.)
    pub(crate) fn taken_again(&self, fence: i64) -> Option<LockLost> {
        let now = self.lease().fencing_token();
        (now != fence).then(|| {
            LockLost::new(self.key.clone(), LostReason::TakenOver).with_detail(format!(
                "the keep found the key held anew under this token (fencing token {now}, was \
                 {fence}): the lease was ended meanwhile and a late try of its acquire took the \
                 key again"
            ))
        })
    }
}

/// When a request may land at the latest, `timeout` (what is left of its
/// own) and the late margin from now.
fn late_by(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    let late = timeout.saturating_add(crate::retry::LATE_TRY_MARGIN);
    now.checked_add(late)
        .unwrap_or(now + Duration::from_secs(86_400))
}
