//! A guard's shared state: the latest lease, the local deadline on the
//! lease clock, and the lost-ownership signal every clone watches.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::risk::Risk;
use super::{release, Measured};
use crate::clock::{Jumps, LeaseClock};
use crate::error::{LockLost, LostReason};
use crate::lease::LockLease;
use crate::locks::Locks;
use crate::realtime::{Stopwatch, PAUSED_CLOCK};
use late::LateRenewals;

mod late;
use crate::retry::renewal::{
    MAX_DELAY as MAX_RENEW_DELAY, REQUEST_BUDGET, RETRY_ROOM, SAFETY_MARGIN,
};
use crate::validate;

/// Delay before the next renewal: about half the ttl, as long as that
/// leaves [`RETRY_ROOM`] of the time `remaining` for retries, else ttl/3
/// (Ruby's cadence, protocol
/// 5.3, which short ttls keep); at most 60 s; ±10 % jitter (`u` uniform in
/// [0, 1)); never later than 2 s before the local deadline (`remaining`
/// from now). Zero means renew now. A project's quota pays for every
/// renewal: at ttl 30 s this is 4 renewals a minute instead of 6.
fn renewal_delay(ttl: Duration, remaining: Duration, u: f64) -> Duration {
    // From the time actually left (a slow acquire leaves less than the
    // ttl): never past the point that keeps the retry room.
    let later = (ttl / 2).min(remaining.saturating_sub(RETRY_ROOM));
    let base = later.max(ttl / 3).min(MAX_RENEW_DELAY);
    let latest = remaining.saturating_sub(SAFETY_MARGIN + REQUEST_BUDGET);
    let delay = base.min(latest).mul_f64(0.9 + 0.2 * u.clamp(0.0, 1.0));
    delay.min(latest)
}

/// The lease-clock deadline of a lease obtained by a request sent at
/// `sent_at`: the ttl asked for or the time the server granted, whichever
/// is less, never past the 90-day `cap`.
fn deadline(measured: &Measured, ttl: Duration, cap: Duration) -> Duration {
    let lasts = measured.granted.map_or(ttl, |granted| granted.min(ttl));
    measured.sent_at.saturating_add(lasts).min(cap)
}

/// The detail of an expiry with no renewal sent since the lease was
/// measured.
const JUMPED: &str = "no renewal was due yet: the lease clock jumped past the deadline; \
    the process was suspended or stalled, or LeaseClock::advance moved it";

/// The detail of an expiry with a renewal sent that had not completed.
const RENEWAL_TOO_LATE: &str = "a renewal was sent but did not complete in time";

/// What is known about the lease now; changes with each renewal.
struct Current {
    lease: LockLease,
    /// Lease-clock reading after which the lease may be gone.
    deadline: Duration,
    failure: Option<LockLost>,
    /// A renewal was sent since the lease was last measured: an expiry
    /// without one means the clock jumped past the renewal's time and the
    /// deadline at once (a suspend, a stall), not a renewal too slow.
    renewal_tried: bool,
    /// The clock's jumps (suspends, test advances): a sleeper wakes on one
    /// to look at the deadline again. Dropped once the lock is lost, so a
    /// guard kept afterwards does not keep the suspend detector running.
    jumps: Option<Jumps>,
    /// Renewals that may still be applied, and until when: a renewal
    /// answered with no answer or a gateway's (it may land until its
    /// timeout and the margin have passed), and the one in flight now.
    /// One landing after a keep moves the expiry a whole ttl on.
    renewals: LateRenewals,
}

/// A hold's cap: the lease-clock reading at which it ends, and the lock
/// API its release goes through.
pub(crate) struct MaxHold {
    at: Duration,
    locks: Locks,
}

impl MaxHold {
    /// A cap `after` from the clock's `now`.
    pub(crate) fn after(after: Duration, now: Duration, locks: &Locks) -> Self {
        MaxHold {
            at: now.saturating_add(after),
            locks: locks.clone(),
        }
    }
}

/// Shared by every clone of a guard and by its renewal task.
pub(crate) struct State {
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) clock: LeaseClock,
    /// Acquisition start + 90 days: no renewal moves the deadline past it.
    cap: Duration,
    /// When the lock ends by `max_hold`, if set, and the handle that
    /// releases it then.
    max_hold: Option<MaxHold>,
    current: Mutex<Current>,
    pub(crate) lost: watch::Sender<bool>,
    /// Renewals failing while the lease is still ours.
    pub(crate) risk: Risk,
    /// A leader's term asked to end (its candidate steps down and drains
    /// it); never set for any other lock.
    pub(crate) stepping_down: watch::Sender<bool>,
}

impl State {
    /// `started`: the lease-clock reading before the acquire's first try
    /// (an earlier try than the one answered may be the one applied).
    /// `max_hold`: when the lock ends at the latest.
    pub(crate) fn new(
        acquired: Measured,
        ttl: Duration,
        clock: LeaseClock,
        started: Duration,
        max_hold: Option<MaxHold>,
    ) -> Self {
        let cap = started.saturating_add(validate::MAX_TTL);
        State {
            key: acquired.lease.key().to_owned(),
            ttl,
            cap,
            max_hold,
            current: Mutex::new(Current {
                deadline: deadline(&acquired, ttl, cap),
                lease: acquired.lease,
                failure: None,
                renewal_tried: false,
                jumps: Some(clock.jumps()),
                renewals: LateRenewals::default(),
            }),
            clock,
            lost: watch::Sender::new(false),
            risk: Risk::new(),
            stepping_down: watch::Sender::new(false),
        }
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        crate::lock_unpoisoned(&self.current)
    }

    pub(crate) fn lease(&self) -> LockLease {
        self.current().lease.clone()
    }

    pub(crate) fn deadline(&self) -> Duration {
        self.current().deadline
    }

    pub(crate) fn failure(&self) -> Option<LockLost> {
        self.current().failure.clone()
    }

    pub(crate) fn remaining(&self) -> Duration {
        self.deadline().saturating_sub(self.clock.now())
    }

    /// How long the server may still keep the latest lease, at most: a
    /// whole ttl from now (and a little more). The local deadline is no
    /// bound: it is early on purpose (by the time an answer took, a second
    /// of `Date` rounding, a suspend it has not seen), and a renewal
    /// abandoned in flight may be applied late. What is kept this long is
    /// a release still being tried, or a lease reported as possibly held.
    pub(crate) fn server_may_hold_for(&self) -> Duration {
        self.ttl.saturating_add(SAFETY_MARGIN + REQUEST_BUDGET)
    }

    /// Records a loss; the first one wins and flips the watch channel. At
    /// the max hold time the release is handed to the client first, so
    /// that it is registered before anyone can see the loss (an acquire
    /// with the same token then supersedes it rather than race it).
    pub(crate) fn mark(&self, lost: LockLost) {
        let (fencing_token, lease) = {
            let mut current = self.current();
            if current.failure.is_some() {
                return;
            }
            current.failure = Some(lost.clone());
            current.jumps = None;
            (current.lease.fencing_token(), current.lease.clone())
        };
        if let (LostReason::MaxHold, Some(cap)) = (lost.reason(), &self.max_hold) {
            tracing::info!(key = %self.key, fencing_token, "max hold time reached; releasing");
            release::in_background(
                &cap.locks,
                lease,
                self.server_may_hold_for(),
                "max hold time reached",
            );
        }
        self.risk.clear(&self.key, false);
        self.lost
            .send_if_modified(|flag| !std::mem::replace(flag, true));
        crate::telemetry::lost(lost.reason());
        if lost.reason() == LostReason::Released {
            tracing::debug!(key = %self.key, fencing_token, "scoped lock ended");
        } else {
            tracing::warn!(key = %self.key, fencing_token, reason = %lost, "lock lost");
        }
    }

    /// Lost, past the deadline (which records the expiry now), or past the
    /// max hold time (recorded as such). Reads the clock itself, so it
    /// holds even when no task has run. Copies nothing: `is_lost` is
    /// called before every side effect.
    pub(crate) fn check(&self) -> bool {
        let (deadline, tried) = {
            let current = self.current();
            if current.failure.is_some() {
                return true;
            }
            (current.deadline, current.renewal_tried)
        };
        // An expiry first: past its deadline the lease may be another's,
        // whatever the cap says.
        let now = self.clock.now();
        if now >= deadline {
            let detail = if tried { RENEWAL_TOO_LATE } else { JUMPED };
            self.mark(LockLost::new(self.key.clone(), LostReason::Expired).with_detail(detail));
            return true;
        }
        if self.max_hold.as_ref().is_some_and(|cap| now >= cap.at) {
            self.mark(LockLost::new(self.key.clone(), LostReason::MaxHold));
            return true;
        }
        false
    }

    /// The loss, if [`State::check`] finds the lock lost: the one recorded
    /// (the first wins).
    pub(crate) fn loss(&self) -> Option<LockLost> {
        if self.check() {
            self.failure()
        } else {
            None
        }
    }

    /// The lease-clock reading at which the lock ends by itself: its
    /// deadline, or its max hold time if sooner.
    pub(crate) fn ends_at(&self) -> Duration {
        let deadline = self.deadline();
        self.max_hold
            .as_ref()
            .map_or(deadline, |cap| cap.at.min(deadline))
    }

    /// The lease-clock reading of its `max_hold` cap, if it has one.
    pub(crate) fn cap_at(&self) -> Option<Duration> {
        self.max_hold.as_ref().map(|cap| cap.at)
    }

    /// Records that a renewal is being sent.
    /// A watch of the clock's jumps from now on (none once lost).
    fn jumps(&self) -> Jumps {
        self.current()
            .jumps
            .as_ref()
            .map_or_else(Jumps::none, Jumps::watch)
    }

    /// Takes a renewal.
    pub(crate) fn renewed(&self, renewed: Measured) -> Result<(), LockLost> {
        let mut current = self.current();
        if let Some(failure) = &current.failure {
            return Err(failure.clone());
        }
        current.deadline = deadline(&renewed, self.ttl, self.cap);
        current.lease = renewed.lease;
        current.renewal_tried = false;
        let left = current.deadline.saturating_sub(self.clock.now());
        drop(current);
        if left <= SAFETY_MARGIN + REQUEST_BUDGET {
            return Err(LockLost::new(self.key.clone(), LostReason::NoSafeWindow));
        }
        self.risk.clear(&self.key, true);
        Ok(())
    }

    pub(crate) fn next_delay(&self) -> Duration {
        if sabotaged!(RenewsInATightLoop) {
            return Duration::ZERO;
        }
        if sabotaged!(RenewsTooLate) {
            return self
                .remaining()
                .saturating_sub(Duration::from_millis(1_500));
        }
        renewal_delay(self.ttl, self.remaining(), crate::random::unit())
    }

    /// When the next renewal is due, as a lease-clock reading.
    pub(crate) fn next_renewal_at(&self) -> Duration {
        self.clock.now() + self.next_delay()
    }

    /// Waits until the lease clock reads `until`; the loss if the lock was
    /// lost meanwhile. Wakes early only when the lock is lost, marked, or the
    /// clock jumps (a suspend): no periodic look at the deadline.
    pub(crate) async fn sleep_while_held(&self, until: Duration) -> Result<(), LockLost> {
        let mut lost = self.lost.subscribe();
        loop {
            // Watch first, then read the clock: a jump in between still wakes.
            let mut jumps = self.jumps();
            if let Some(loss) = self.loss() {
                return Err(loss);
            }
            let now = self.clock.now();
            if now >= until {
                return Ok(());
            }
            let wake = until.min(self.ends_at()).saturating_sub(now);
            let stopwatch = Stopwatch::start();
            tokio::select! {
                biased;
                _ = tokio::time::sleep(wake) => self.check_runtime_clock(&stopwatch),
                _ = jumps.next() => {}
                _ = lost.changed() => {}
            }
        }
    }

    /// After a sleep on the runtime's clock: if that clock ran ahead of real
    /// time, it is paused (a test's `start_paused`), and every sleep would
    /// end at once from now on. Ends the lock with the reason rather than
    /// spin.
    fn check_runtime_clock(&self, stopwatch: &Stopwatch) {
        if stopwatch.runtime_ran_ahead() {
            tracing::error!(key = %self.key, "{PAUSED_CLOCK}");
            self.mark(
                LockLost::new(self.key.clone(), LostReason::Expired).with_detail(PAUSED_CLOCK),
            );
        }
    }

    /// Completes when the lock is lost in a way the runtime's timers cannot
    /// foresee: it is marked, or the clock jumps (from then on the deadline
    /// is watched as [`State::wait_lost`] does). Without a jump a timer set
    /// before the deadline fires before it, so no timer is needed here.
    pub(crate) async fn lost_behind_timers(&self) -> LockLost {
        let mut lost = self.lost.subscribe();
        let mut jumps = self.jumps();
        if let Some(loss) = self.loss() {
            return loss;
        }
        // The cap is not bounded by any request's timeout: a timer for it.
        let cap = self.max_hold.as_ref().map(|cap| cap.at);
        let until_cap = cap.map_or(Duration::MAX, |at| at.saturating_sub(self.clock.now()));
        tokio::select! {
            biased;
            _ = lost.changed() => {}
            () = jumps.next() => {}
            () = tokio::time::sleep(until_cap), if cap.is_some() => {}
        }
        self.wait_lost().await
    }

    /// Completes when the lock is lost: marked, or its deadline passed (the
    /// expiry is recorded then), with the loss.
    pub(crate) async fn wait_lost(&self) -> LockLost {
        loop {
            if let Err(loss) = self.sleep_while_held(Duration::MAX).await {
                return loss;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn renewal_cadence_is_half_the_ttl_when_that_leaves_room_for_retries() {
        // ttl 30 -> about 15 s, within ±10 %: 4 renewals a minute.
        assert_eq!(renewal_delay(S(30), S(30), 0.5), S(15));
        assert_eq!(
            renewal_delay(S(30), S(30), 0.0),
            Duration::from_millis(13_500)
        );
        assert!(renewal_delay(S(30), S(30), 0.999_999) < Duration::from_millis(16_500));
        // ttl 60 -> 30 s; ttl 20 -> 10 s (10 s left for retries).
        assert_eq!(renewal_delay(S(60), S(60), 0.5), S(30));
        assert_eq!(renewal_delay(S(20), S(20), 0.5), S(10));
        // ttl 15 and less keep Ruby's ttl/3: half would leave under 10 s.
        assert_eq!(renewal_delay(S(15), S(15), 0.5), S(5));
        assert_eq!(renewal_delay(S(12), S(12), 0.5), S(4));
        // A slow acquire left 13 s of a 20 s ttl: 3 s would keep the retry
        // room, but never sooner than ttl/3.
        let d = renewal_delay(S(20), S(13), 0.5);
        assert!(
            d > Duration::from_millis(6_660) && d < Duration::from_millis(6_670),
            "{d:?}"
        );
        // 25 s left of 30: 15 s keeps the room.
        assert_eq!(renewal_delay(S(30), S(25), 0.5), S(15));
        // ttl 300 -> 60 s cap.
        assert_eq!(renewal_delay(S(300), S(300), 0.5), S(60));
        // The longest, with the jitter: what `LONGEST_RENEWAL_INTERVAL`
        // promises (and `locks diagnose` waits).
        let longest = renewal_delay(validate::MAX_TTL, validate::MAX_TTL, 1.0);
        assert_eq!(longest, crate::LONGEST_RENEWAL_INTERVAL);
        // ttl 5 -> about 1.67 s.
        let d = renewal_delay(S(5), S(5), 0.5);
        assert!(
            d > Duration::from_millis(1_660) && d < Duration::from_millis(1_670),
            "{d:?}"
        );
        // Never later than 2 s before the deadline; zero when ≤ 2 s remain.
        assert_eq!(renewal_delay(S(30), S(5), 1.0), S(3));
        assert_eq!(renewal_delay(S(30), S(2), 0.5), Duration::ZERO);
        assert_eq!(renewal_delay(S(30), Duration::ZERO, 0.5), Duration::ZERO);
    }

    fn measured(lease: &LockLease, sent_at: Duration, granted: Option<Duration>) -> Measured {
        Measured {
            lease: lease.clone(),
            sent_at,
            granted,
        }
    }

    fn state(clock: &LeaseClock, ttl: u64) -> State {
        let lease = LockLease::new("k", "t", chrono::Utc::now(), 1);
        let now = clock.now();
        State::new(
            measured(&lease, now, None),
            S(ttl),
            clock.clone(),
            now,
            None,
        )
    }

    #[test]
    fn is_lost_reads_the_clock_without_any_task() {
        let clock = LeaseClock::adjustable();
        let state = state(&clock, 5);
        let watch = state.lost.subscribe();
        assert!(!state.check());
        clock.advance(Duration::from_millis(4_999));
        assert!(!state.check());
        clock.advance(Duration::from_millis(1));
        assert!(state.check(), "lost exactly at the deadline");
        assert_eq!(state.failure().unwrap().reason(), LostReason::Expired);
        assert!(*watch.borrow());
    }

    #[tokio::test]
    async fn past_both_the_deadline_and_the_cap_the_loss_is_an_expiry() {
        let clock = LeaseClock::adjustable();
        let locks = crate::Client::builder()
            .service_key("k")
            .api_url("http://127.0.0.1:9")
            .build()
            .unwrap()
            .locks();
        let lease = LockLease::new("k", "t", chrono::Utc::now(), 1);
        // A 5 s lease capped `after` from now.
        let capped = |after| {
            let now = clock.now();
            let cap = MaxHold::after(after, now, &locks);
            State::new(
                measured(&lease, now, None),
                S(5),
                clock.clone(),
                now,
                Some(cap),
            )
        };
        // A suspend past both: the lease may be another's now.
        let state = capped(S(10));
        clock.advance(S(20));
        assert!(state.check());
        assert_eq!(state.failure().unwrap().reason(), LostReason::Expired);

        let state = capped(S(2));
        clock.advance(S(3));
        assert!(state.check());
        assert_eq!(state.failure().unwrap().reason(), LostReason::MaxHold);
    }

    #[test]
    fn an_expiry_says_whether_a_renewal_was_on_its_way() {
        let clock = LeaseClock::adjustable();
        let quiet = state(&clock, 30);
        let tried = state(&clock, 30);
        tried.renewal_sent(S(5));
        clock.advance(S(30));
        let detail = |state: &State| state.loss().and_then(|lost| lost.detail);
        assert_eq!(detail(&quiet).as_deref(), Some(JUMPED));
        assert_eq!(detail(&tried).as_deref(), Some(RENEWAL_TOO_LATE));
        // What the server may keep: a whole ttl and the margins, from now.
        assert_eq!(quiet.server_may_hold_for(), S(32));
    }

    #[test]
    fn first_loss_wins_and_the_watch_flips_once() {
        let clock = LeaseClock::adjustable();
        let state = state(&clock, 30);
        let mut watch = state.lost.subscribe();
        state.mark(LockLost::new("k", LostReason::Marked).with_detail("first"));
        state.mark(LockLost::new("k", LostReason::RenewalFailed));
        assert_eq!(state.failure().unwrap().reason(), LostReason::Marked);
        assert!(watch.has_changed().unwrap());
        watch.borrow_and_update();
        state.mark(LockLost::new("k", LostReason::Released));
        assert!(!watch.has_changed().unwrap(), "flips exactly once");
    }

    #[test]
    fn renewal_moves_the_deadline_from_the_send_time_and_keeps_the_cap() {
        let clock = LeaseClock::adjustable();
        let start = clock.now();
        let lease = LockLease::new("k", "t", chrono::Utc::now(), 1);
        let state = State::new(
            measured(&lease, start, None),
            S(30),
            clock.clone(),
            start,
            None,
        );
        clock.advance(S(10));
        let sent_at = clock.now();
        clock.advance(S(2)); // the renewal took 2 s
        state.renewed(measured(&lease, sent_at, None)).unwrap();
        assert_eq!(
            state.deadline(),
            sent_at + S(30),
            "measured from before sending"
        );

        // Near the 90-day cap only the time to the cap is granted.
        let cap = start + validate::MAX_TTL;
        clock.advance(cap - clock.now() - S(3));
        let sent_at = clock.now();
        clock.advance(Duration::from_millis(1_500));
        let err = state.renewed(measured(&lease, sent_at, None)).unwrap_err();
        assert_eq!(err.reason(), LostReason::NoSafeWindow);
        assert_eq!(state.deadline(), cap);
    }

    #[test]
    fn a_shorter_grant_shortens_the_deadline_and_a_longer_one_does_not_extend_it() {
        let clock = LeaseClock::adjustable();
        let start = clock.now();
        let lease = LockLease::new("k", "t", chrono::Utc::now(), 1);
        // The server granted 9 s of the 30 asked for (say, the 90-day cap
        // of the original acquisition).
        let state = State::new(
            measured(&lease, start, Some(S(9))),
            S(30),
            clock.clone(),
            start,
            None,
        );
        assert_eq!(state.deadline(), start + S(9));
        clock.advance(S(9));
        assert!(
            state.check(),
            "lost when the server lets go, not at the ttl"
        );

        let state = State::new(
            measured(&lease, start, Some(S(3_600))),
            S(30),
            clock.clone(),
            start,
            None,
        );
        assert_eq!(state.deadline(), start + S(30), "never longer than asked");
        let state = State::new(
            measured(&lease, start, Some(Duration::ZERO)),
            S(30),
            clock,
            start,
            None,
        );
        assert!(state.check(), "an already expired grant is lost at once");
    }

    #[test]
    fn the_grant_is_read_on_the_server_clock_and_rounded_against_us() {
        use chrono::{TimeZone, Utc};
        let date = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        let expires = date + chrono::TimeDelta::milliseconds(30_700);
        assert_eq!(
            crate::locks::engine::acquire::granted(expires, date),
            Duration::from_millis(29_700)
        );
        assert_eq!(
            crate::locks::engine::acquire::granted(date, date),
            Duration::ZERO
        );
        let long_ago = date - chrono::TimeDelta::days(1);
        assert_eq!(
            crate::locks::engine::acquire::granted(long_ago, date),
            Duration::ZERO
        );
    }
}
