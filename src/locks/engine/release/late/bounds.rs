//! A kept minimum's fix-up ([`super::kept_sweep`]): its instants and the
//! decisions it makes on them, each a pure function.

use std::time::Duration;

use tokio::time::Instant;

/// How often a kept minimum's expiry is put back while a late request may
/// still land: one landing sets the expiry at least the shortest lease
/// (5 s) from then, so a renewal back within 3 s arrives before a shortened
/// lease lapses.
pub(super) const REASSERT: Duration = Duration::from_secs(3);

/// The timeout of each renewal back: short, so that one left unanswered
/// extends the window only a little.
pub(super) const BACK_TIMEOUT: Duration = Duration::from_secs(3);

/// A kept minimum's instants: until a late request may land (`land_by`),
/// the minimum's end (`kept_until`), the lease's expiry as last measured
/// (`live_until`), the earliest it may lapse, a late request that may have
/// landed since counted (`floor_until`: one sets the expiry at least the
/// shortest lease from when it lands), and the hold's `max_hold` cap, if
/// it has one (`cap_until`, no earlier than the minimum's end but for the
/// moment between the two readings). The fix-up's decisions on them, each
/// a pure function (unit-tested at its edges).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) land_by: Instant,
    pub(crate) kept_until: Instant,
    pub(crate) live_until: Instant,
    pub(crate) floor_until: Instant,
    pub(crate) cap_until: Option<Instant>,
}

/// What the fix-up does at a wake before the minimum's end.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Act {
    /// Put the expiry back to the minimum's end.
    RenewBack,
    /// Less than the shortest lease left and the lease may lapse first:
    /// kept live with a renewal back, then released at the end.
    RenewBackThenEnd,
    /// Released at the minimum's end, whatever a late request made of it.
    AtTheEnd,
}

impl Bounds {
    /// The next wake after `now`: at once once no late request can land;
    /// else after [`REASSERT`], or as the window closes if sooner; never
    /// past the minimum's end.
    pub(super) fn wake(&self, now: Instant) -> Instant {
        let wake = if now >= self.land_by {
            now
        } else {
            (now + REASSERT).min(self.land_by)
        };
        wake.min(self.kept_until)
    }

    /// What to do at a wake at `now`, before the minimum's end. With less
    /// than the shortest lease (5 s) left, no renewal back (it would reach
    /// past the end) unless the lease may lapse before it (a late request
    /// landed since the last renewal back counted: 16-client kept-minimums
    /// seed 82, a late acquire's 5 s lease 1.3 s short of the end); one
    /// that can no longer be renewed (within the safety margin of its
    /// expiry) is left to the release at the end.
    pub(super) fn act(&self, now: Instant) -> Act {
        let renewable =
            now + crate::retry::renewal::SAFETY_MARGIN < self.live_until && self.fits_the_cap(now);
        if self.kept_until.saturating_duration_since(now) < crate::validate::MIN_TTL {
            if renewable && self.floor_until < self.kept_until {
                Act::RenewBackThenEnd
            } else {
                Act::AtTheEnd
            }
        } else if renewable {
            Act::RenewBack
        } else {
            Act::AtTheEnd
        }
    }

    /// Whether a renewal back sent at `sent` for `back` put the minimum
    /// right for good: sent once no late request could land any more (also
    /// when it was retried past that: 16-client seed 17), and not past the
    /// minimum's end (a retry with less than the shortest lease left
    /// reaches past it; then the release at the end).
    pub(super) fn put_right_by(&self, sent: Instant, back: Duration) -> bool {
        sent >= self.land_by && sent + back <= self.kept_until + Duration::from_secs(1)
    }

    /// Whether a renewal back sent at `now` ends by the cap, if there is
    /// one: the shortest lease (5 s) fits in what is left of it. One that
    /// does not is not sent, even to keep the lease from lapsing before
    /// the minimum's end: the cap comes first (kept-minimums seed 861: a
    /// renewal back of 5 s with 2.9 s of the cap left, its host crashed
    /// before the release at the end).
    pub(super) fn fits_the_cap(&self, now: Instant) -> bool {
        self.back(now).is_some()
    }

    /// The ttl of a renewal back sent at `now`: to the minimum's end,
    /// rounded up to a whole second (never under the shortest lease), but
    /// no more than the cap's whole seconds left, as the keep asks
    /// ([`crate::validate::ttl_under_cap`]): a renewal back never reaches
    /// past `max_hold` (kept-minimums seed 107: a second past it). `None`
    /// when it does not fit the cap.
    pub(super) fn back(&self, now: Instant) -> Option<Duration> {
        let back = crate::validate::ttl_covering(self.kept_until.saturating_duration_since(now));
        let cap_left = self.cap_until.map(|cap| cap.saturating_duration_since(now));
        crate::validate::ttl_under_cap(back, cap_left)
    }

    /// A renewal back sent at `sent` for `back` was answered: the lease
    /// lives until `sent + back`, or, if a late request may land after it,
    /// at least the shortest lease from `sent`.
    pub(super) fn renewed_back(&mut self, sent: Instant, back: Duration) {
        self.live_until = sent + back;
        self.floor_until = if sent < self.land_by {
            self.live_until.min(sent + crate::validate::MIN_TTL)
        } else {
            self.live_until
        };
    }

    /// Whether a late acquire may still take the key again at `now`.
    pub(super) fn acquire_may_land(&self, acquire_late: bool, now: Instant) -> bool {
        acquire_late && now < self.land_by
    }
}

/// The latest a renewal back sent at `sent` and answered without proof
/// that the service handled it (a gateway's 5xx) may still land.
pub(super) fn back_lands_by(sent: Instant) -> Instant {
    sent + BACK_TIMEOUT + crate::retry::LATE_TRY_MARGIN
}

/// After a first release sent at `sent`: whether to release again once no
/// late try can land (`land_by`). Not when none could when it went, nor
/// when an acquire with the token superseded it. (When its answer came is
/// no measure: one whose answer was held past the window may have been
/// applied before a late try: kept-minimums seed 798.)
pub(super) fn release_again(
    again: bool,
    land_by: Instant,
    sent: Instant,
    superseded: bool,
) -> bool {
    again && sent < land_by && !superseded
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A minimum kept until 20 s from `now`, its lease measured to then, a
    /// late request possible for 7 s.
    fn bounds(now: Instant) -> Bounds {
        Bounds {
            land_by: now + ms(7_000),
            kept_until: now + ms(20_000),
            live_until: now + ms(20_000),
            floor_until: now + ms(20_000),
            cap_until: None,
        }
    }

    #[test]
    fn a_late_request_that_may_have_landed_since_the_last_renewal_back_may_cut_the_lease_short() {
        let now = Instant::now();
        let mut b = bounds(now);
        // Back to the end while a late request may still land: it may
        // set the expiry the shortest lease from when it lands.
        b.renewed_back(now + ms(1_000), ms(19_000));
        assert_eq!(b.live_until, b.kept_until);
        assert_eq!(b.floor_until, now + ms(6_000));
        // With less than the shortest lease left: kept live, then the end.
        let late = b.kept_until - ms(4_000);
        assert_eq!(b.act(late), Act::RenewBackThenEnd);
        // Once none can land, the lease is what the renewal back made it.
        b.renewed_back(b.land_by, ms(13_000));
        assert_eq!(b.floor_until, b.live_until);
        assert_eq!(b.act(late), Act::AtTheEnd);
    }

    #[test]
    fn a_renewal_back_reaches_the_minimums_end_and_never_past_the_cap() {
        let now = Instant::now();
        let b = bounds(now);
        // To the end, rounded up to a whole second.
        assert_eq!(b.back(now), Some(ms(20_000)));
        assert_eq!(b.back(now + ms(1)), Some(ms(20_000)));
        assert_eq!(b.back(now + ms(1_000)), Some(ms(19_000)));
        // Never under the shortest lease.
        assert_eq!(b.back(b.kept_until - ms(1_500)), Some(ms(5_000)));
        // A cap at the minimum's end: its whole seconds left, no more.
        let capped = |cap: Instant| Bounds {
            cap_until: Some(cap),
            ..b
        };
        let at_end = capped(b.kept_until);
        assert_eq!(at_end.back(now), Some(ms(20_000)));
        assert_eq!(at_end.back(now + ms(1)), Some(ms(19_000)));
        assert_eq!(at_end.back(now + ms(1_999)), Some(ms(18_000)));
        // A cap half a second later: still not past it.
        assert_eq!(
            capped(b.kept_until + ms(500)).back(now + ms(1)),
            Some(ms(20_000))
        );
        assert_eq!(
            capped(b.kept_until + ms(500)).back(now + ms(600)),
            Some(ms(19_000))
        );
        // A cap two seconds later: the end, rounded up.
        assert_eq!(
            capped(b.kept_until + ms(2_000)).back(now + ms(1)),
            Some(ms(20_000))
        );
        // With less than the shortest lease left of the cap, none is sent:
        // released at the end, even if the lease may lapse first.
        let late = b.kept_until - ms(4_999);
        assert!(at_end.fits_the_cap(b.kept_until - ms(5_000)));
        assert!(!at_end.fits_the_cap(late));
        let lapsing = Bounds {
            live_until: b.kept_until - ms(1),
            floor_until: b.kept_until - ms(1),
            ..at_end
        };
        assert_eq!(lapsing.act(late), Act::AtTheEnd);
        assert_eq!(
            Bounds {
                cap_until: None,
                ..lapsing
            }
            .act(late),
            Act::RenewBackThenEnd
        );
        assert_eq!(lapsing.act(b.kept_until - ms(5_000)), Act::RenewBack);
    }

    #[test]
    fn the_fix_up_wakes_every_3_s_while_a_late_request_may_land_then_at_once() {
        let now = Instant::now();
        let b = bounds(now);
        assert_eq!(b.wake(now), now + REASSERT);
        // The window's close, when sooner.
        assert_eq!(b.wake(now + ms(5_000)), b.land_by);
        // At once from the window's close on.
        assert_eq!(b.wake(b.land_by), b.land_by);
        assert_eq!(b.wake(b.land_by + ms(1)), b.land_by + ms(1));
        // Never past the minimum's end.
        let short = Bounds {
            kept_until: now + ms(2_000),
            ..b
        };
        assert_eq!(short.wake(now), now + ms(2_000));
        let closed = Bounds {
            land_by: now,
            kept_until: now,
            ..b
        };
        assert_eq!(closed.wake(now), now);
    }

    #[test]
    fn with_less_than_the_shortest_lease_left_it_renews_back_only_if_the_lease_may_lapse() {
        let now = Instant::now();
        let b = bounds(now);
        // 20 s left, renewable: back to the minimum's end.
        assert_eq!(b.act(now), Act::RenewBack);
        // 5 s left exactly: still a renewal back.
        assert_eq!(b.act(b.kept_until - ms(5_000)), Act::RenewBack);
        // Less: released at the end, the lease lasting to it...
        let late = b.kept_until - ms(4_999);
        assert_eq!(b.act(late), Act::AtTheEnd);
        // ... kept live first if it lapses sooner (not at the end exactly).
        let measured = |live_until: Instant| Bounds {
            live_until,
            floor_until: live_until,
            ..b
        };
        assert_eq!(
            measured(b.kept_until - ms(1)).act(late),
            Act::RenewBackThenEnd
        );
        assert_eq!(measured(b.kept_until).act(late), Act::AtTheEnd);
        // Within the safety margin of its expiry: no renewal can make it.
        let margin = crate::retry::renewal::SAFETY_MARGIN;
        assert_eq!(measured(late + margin).act(late), Act::AtTheEnd);
        assert_eq!(
            measured(late + margin + ms(1)).act(late),
            Act::RenewBackThenEnd
        );
        // With 5 s or more left, a lease that can no longer be renewed
        // (an unanswered renewal back) is left to the release at the end.
        assert_eq!(measured(now + margin).act(now), Act::AtTheEnd);
        assert_eq!(measured(now + margin + ms(1)).act(now), Act::RenewBack);
    }

    #[test]
    fn a_renewal_back_puts_it_right_once_sent_after_the_window_and_not_past_the_end() {
        let now = Instant::now();
        let b = bounds(now);
        let back = ms(13_000);
        assert!(b.put_right_by(b.land_by, back));
        assert!(!b.put_right_by(b.land_by - ms(1), back + ms(1)));
        // A whole-second ttl may reach a second past the end, no more.
        assert!(b.put_right_by(b.land_by, back + ms(1_000)));
        assert!(!b.put_right_by(b.land_by, back + ms(1_001)));
        // A late acquire may take the key again only while its window is
        // open, and only if there was one.
        assert!(b.acquire_may_land(true, b.land_by - ms(1)));
        assert!(!b.acquire_may_land(true, b.land_by));
        assert!(!b.acquire_may_land(false, now));
    }

    #[test]
    fn a_renewal_back_that_may_land_late_counts_its_timeout_and_the_margin() {
        let sent = Instant::now();
        assert_eq!(back_lands_by(sent), sent + ms(5_000));
    }

    #[test]
    fn the_release_goes_again_unless_none_could_land_after_the_first_went_out() {
        let now = Instant::now();
        let land_by = now + ms(7_000);
        assert!(release_again(true, land_by, now, false));
        assert!(release_again(true, land_by, land_by - ms(1), false));
        assert!(!release_again(true, land_by, land_by, false));
        assert!(!release_again(false, land_by, now, false));
        assert!(!release_again(true, land_by, now, true));
    }
}
