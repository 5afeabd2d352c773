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
/// the minimum's end (`kept_until`), and the lease's expiry as last
/// measured (`live_until`). The fix-up's decisions on them, each a pure
/// function (unit-tested at its edges).
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    pub(super) land_by: Instant,
    pub(super) kept_until: Instant,
    pub(super) live_until: Instant,
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
    /// past the end) unless the lease may lapse before it; one that can no
    /// longer be renewed (within the safety margin of its expiry) is left
    /// to the release at the end.
    pub(super) fn act(&self, now: Instant) -> Act {
        let renewable = now + crate::retry::renewal::SAFETY_MARGIN < self.live_until;
        if self.kept_until.saturating_duration_since(now) < crate::validate::MIN_TTL {
            if renewable && self.live_until < self.kept_until {
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
        }
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
        let measured = |live_until: Instant| Bounds { live_until, ..b };
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
