//! Observing a key (`locks.observe(key)`): one look (`get`) at a time,
//! each answer compared with the one before, and what changed named on the
//! server's clock (its `Date` header), never this machine's.
//!
//! A look every poll interval (default [`DEFAULT_POLL`], jittered down by
//! up to a tenth), plus one look at a known lease's last moments when that
//! comes sooner: in the window where a lease that was not renewed still
//! shows as held and can no longer be renewed (its final second, or the
//! service's 1 s grace after it), then one at the moment it frees. So an
//! expiry is told from a release without polling faster, and a holder
//! that stopped renewing is seen gone about a second after its lease.
//! The look in that window is aimed where the answers so far make sure it
//! lands; when they cannot (after a jump of the server's clock they know
//! it to a second only), surely before the window ends, and a look that
//! came too early gets one more, aimed with what its answer told.
//! A failed look is returned to the caller; after a transient one (a 429,
//! a 5xx, no answer) the next waits out the poll interval or the
//! `Retry-After` it named (up to a minute), plus up to one poll interval
//! of spread, so that a fleet of observers does not fire together.
//!
//! Where the next look falls on this machine's clock comes from the
//! server's: every answer bounds what the server's clock read when it was
//! sent and received (`Date` has whole seconds), and the bounds of many
//! answers are kept intersected.
//!
//! Here the observer itself; what an answer says is read in
//! `observe/answers.rs`, and the client's spent quota kept in
//! `observe/quota.rs`.

mod answers;
mod quota;

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lease::LockState;
use crate::locks::handles::observe::{ChangeKind, LockChange};
use crate::locks::options::RequestOptions;
use crate::locks::Locks;
use crate::retry::observe::{AFTER_GRACE, MAX_PAUSE, RETRY_LATE};
use crate::retry::wait::{LOOK_SPREAD, MAX_POLL, POLL_MIN};
use answers::{change, Before, Lease, ServerClock};

pub(crate) use crate::retry::observe::DEFAULT_POLL;
pub(crate) use quota::Quota;

/// Whether a failed look ends the stream: a bad argument, or an answer
/// about the request itself (400, 401, 403, 404) that another look would
/// get again. Anything else (no answer, 429, 5xx, an unusable answer) is
/// looked at again.
fn ends(err: &Error) -> bool {
    matches!(
        err,
        Error::InvalidArgument(_)
            | Error::Validation(_)
            | Error::Authentication(_)
            | Error::NotFound(_)
    )
}

/// A look's answer: the state, and the answer's `Date`.
type Answer = Result<(LockState, Option<DateTime<Utc>>)>;

/// A look on its way: when it was sent, whether it is the one at a lease's
/// last moments, and its answer to come. The answer sits behind a mutex
/// only to keep [`Observe`](crate::Observe) `Sync`; it is reached through
/// `&mut` (`Mutex::get_mut`), never locked.
struct Look {
    sent: Instant,
    special: bool,
    answer: std::sync::Mutex<std::pin::Pin<Box<dyn Future<Output = Answer> + Send>>>,
}

impl Look {
    async fn answer(&mut self) -> Answer {
        let answer = self
            .answer
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        answer.await
    }
}

impl std::fmt::Debug for Look {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Look")
            .field("sent", &self.sent)
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

/// The state of one observer.
#[derive(Debug)]
pub(crate) struct Observer {
    pub(crate) key: String,
    pub(crate) poll: Duration,
    /// The last answer: `None` before the first; then the lease, or free.
    last: Option<(LockState, Option<Lease>)>,
    clock: ServerClock,
    /// When the next look may go (`None`: at once).
    next_at: Option<Instant>,
    /// A permanent failure was returned: the stream has ended.
    ended: bool,
    /// The next look is one at a lease's last moments, not a regular one.
    special_next: bool,
    /// The look sent and not answered yet: a `next()` dropped while it
    /// was in flight leaves it here, and the next call awaits its answer
    /// instead of sending another (a look at a lease's last moments sent
    /// again later would miss them).
    in_flight: Option<Look>,
    /// Since the last regular look, a look at a lease's last moments came
    /// and found it renewed: the next such look waits for a regular one,
    /// so that a holder with a TTL shorter than the poll interval costs at
    /// most one look more per interval (two when the first came too early).
    special_spent: bool,
    /// Since the last regular look, a look at a lease's last moments came
    /// too early (the server's clock known to a second only) and got
    /// another: a second such look spends as a renewal does.
    retried_early: bool,
    /// When the last answer came.
    last_received: Option<Instant>,
}

impl Observer {
    pub(crate) fn new(key: String) -> Observer {
        Observer {
            key,
            poll: DEFAULT_POLL,
            last: None,
            clock: ServerClock {
                base: Instant::now(),
                bounds: None,
            },
            next_at: None,
            ended: false,
            special_next: false,
            in_flight: None,
            special_spent: false,
            retried_early: false,
            last_received: None,
        }
    }

    /// See [`Observe::is_ended`](crate::Observe::is_ended).
    pub(crate) fn is_ended(&self) -> bool {
        self.ended
    }

    /// The next change of the key, or failed look; `None` once a failure
    /// that another look will not mend was returned. Cancel-safe: dropped
    /// while it waits, it has changed nothing; dropped while it looks, the
    /// look stays in flight and its answer goes to the next call.
    pub(crate) async fn next(&mut self, locks: &Locks) -> Option<Result<LockChange>> {
        if self.ended {
            return None;
        }
        if self.poll < POLL_MIN {
            self.ended = true;
            return Some(Err(Error::invalid(format!(
                "poll_interval must be at least {} ms (got {:?})",
                POLL_MIN.as_millis(),
                self.poll
            ))));
        }
        let quota = locks.client().quota();
        loop {
            // Not before this client's last 429 named (then spread, so
            // that its observers do not all fire at that moment).
            // Checked again after each sleep: another observer may have
            // been told meanwhile.
            while self.in_flight.is_none() {
                let spread = || self.spread();
                if let Some(at) =
                    past_quiet(self.next_at, quota.quiet_until(), Instant::now(), spread)
                {
                    self.next_at = Some(at);
                }
                match self.next_at {
                    Some(at) if at > Instant::now() => tokio::time::sleep_until(at).await,
                    _ => break,
                }
            }
            if self.in_flight.is_none() {
                self.in_flight = Some(self.send(locks));
            }
            let look = self.in_flight.as_mut().expect("a look in flight");
            let answer = look.answer().await;
            // Answered: from here on nothing awaits, so nothing is lost.
            let Look { sent, special, .. } = self.in_flight.take().expect("a look in flight");
            self.special_next = false;
            let received = Instant::now();
            self.last_received = Some(received);
            match answer {
                Ok((state, date)) => {
                    if let Some(change) = self.saw(state, date, sent, received, special) {
                        return Some(Ok(change));
                    }
                }
                // A bad key, a refused service key: another look will not
                // mend it.
                Err(err) if ends(&err) => {
                    self.ended = true;
                    return Some(Err(err));
                }
                Err(err) => {
                    // The window the service named is the client's (every
                    // request's 429 sets it: see `requests::send`); each
                    // observer adds its own spread.
                    self.next_at = Some(received + self.pause(err.retry_after()));
                    return Some(Err(err));
                }
            }
        }
    }

    /// Sends a look now: a regular one, or the one at a lease's last
    /// moments. A look counts when it goes (the next waits its interval),
    /// so a caller that keeps dropping `next()` costs no more looks.
    fn send(&mut self, locks: &Locks) -> Look {
        let sent = Instant::now();
        // A look at a lease's last moments that goes when a regular one
        // would (0.9 of the poll interval or more after the last answer)
        // costs nothing extra: it counts as regular, and does not spend
        // the next such look.
        let on_cadence = self
            .last_received
            .is_some_and(|at| sent >= at + self.poll().mul_f64(0.9));
        let special = self.special_next && !on_cadence;
        if !self.special_next {
            self.next_at = Some(sent + self.poll());
        }
        let (locks, key) = (locks.clone(), self.key.clone());
        let answer = Box::pin(async move {
            super::requests::get(&locks, &key, &RequestOptions::default()).await
        });
        Look {
            sent,
            special,
            answer: std::sync::Mutex::new(answer),
        }
    }

    /// How long until the next look may go.
    pub(crate) fn next_look_in(&self) -> Duration {
        self.next_at.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// Takes in an answer; schedules the next look; returns the change.
    fn saw(
        &mut self,
        state: LockState,
        date: Option<DateTime<Utc>>,
        sent: Instant,
        received: Instant,
        special: bool,
    ) -> Option<LockChange> {
        // Without a `Date` (not the service), this machine's clock.
        let date = match date {
            Some(date) => {
                self.clock.sample(sent, received, date);
                date
            }
            None => Utc::now(),
        };
        let mut now = Lease::of(&state, date);
        let before = match &self.last {
            None => Before::First,
            Some((_, None)) => Before::Free,
            Some((_, Some(lease))) => Before::Held(lease),
        };
        let kind = change(before, now.as_ref(), date);
        if kind.is_none() {
            // The same lease again: keep its newest sighting.
            if let (Some(now), Some((_, Some(old)))) = (&mut now, &self.last) {
                now.latest = now.latest.max(old.latest);
            }
        }
        // A look at a lease's last moments that found it renewed spends
        // the next such look until a regular one; one that found another
        // lease (a takeover) or none spends nothing: that lease's last
        // moments are news. One that found the same lease before them
        // (aimed with the server's clock known to a second only) gets
        // one more, aimed with what its answer told.
        let early = special
            && kind.is_none()
            && !self.retried_early
            && now.as_ref().is_some_and(|lease| !lease.seen_final());
        // (A new lease's last moments get their own.)
        let new_lease = matches!(kind, Some(ChangeKind::TakenOver | ChangeKind::Acquired));
        self.retried_early = special && !new_lease && (self.retried_early || early);
        self.special_spent = special && matches!(kind, None | Some(ChangeKind::Renewed)) && !early;
        let rtt = received.saturating_duration_since(sent);
        let (next_at, special) = self.schedule(now.as_ref(), received, rtt);
        self.next_at = Some(next_at);
        self.special_next = special;
        let previous = self.last.replace((state.clone(), now));
        let kind = kind?;
        tracing::debug!(key = %self.key, ?kind, fencing_token = state.fencing_token(), "lock changed");
        Some(LockChange {
            key: self.key.clone(),
            state,
            previous: previous.map(|(state, _)| state),
            kind,
            date,
        })
    }

    /// When to look next after an answer received at `received`, and
    /// whether that look is a special one: at the poll interval, or sooner
    /// at the known lease's last moments. A lease seen when it could no
    /// longer be renewed always gets its look as it frees; one not seen so
    /// gets a look at its last moments only if no such look has found a
    /// renewal since the last regular look.
    fn schedule(&self, lease: Option<&Lease>, received: Instant, rtt: Duration) -> (Instant, bool) {
        let regular = received + self.poll().mul_f64(1.0 - 0.1 * crate::random::unit());
        let special = lease.and_then(|lease| {
            if lease.seen_final() {
                let spread = LOOK_SPREAD.mul_f64(crate::random::unit());
                let at = lease.expires_at + TimeDelta::from_std(AFTER_GRACE + spread).ok()?;
                self.clock.local(at)
            } else if !self.special_spent {
                let (from, to) = lease.final_stretch();
                let rtt = TimeDelta::from_std(rtt).unwrap_or(TimeDelta::MAX);
                self.clock.local_within(from, to, rtt)
            } else {
                None
            }
        });
        match special {
            Some(special) if special > received && special < regular => {
                (special.max(received + POLL_MIN), true)
            }
            // Passed already, and the lease still shows as before: the
            // estimate was off (the server's clock jumped) or its grace is
            // longer than a second. Again in a second.
            Some(special) if special <= received && received + RETRY_LATE < regular => {
                (received + RETRY_LATE, true)
            }
            _ => (regular, false),
        }
    }

    /// The poll interval, at most [`MAX_POLL`] (a day).
    fn poll(&self) -> Duration {
        self.poll.min(MAX_POLL)
    }

    /// The pause after a transient failure: the poll interval, or the
    /// window a `Retry-After` names (up to [`MAX_PAUSE`]), plus up to one
    /// poll interval (at most [`MAX_PAUSE`]) of spread.
    fn pause(&self, retry_after: Option<Duration>) -> Duration {
        if sabotaged!(ObserveStalls) {
            return Duration::from_secs(86_400);
        }
        let poll = self.poll();
        let wait = retry_after.map_or(poll, |after| after.min(MAX_PAUSE).max(poll));
        wait + self.spread()
    }

    /// Up to one poll interval (at most [`MAX_PAUSE`]).
    fn spread(&self) -> Duration {
        self.poll().min(MAX_PAUSE).mul_f64(crate::random::unit())
    }
}

/// When the next look goes once a 429's window told to this client
/// (`quiet`) is taken in: past the window, plus a spread (so that the
/// client's observers do not all look at that moment), if the look was
/// due before the window has passed; `None`: as it was (no window open at
/// `now`, or the look due after it anyway).
fn past_quiet(
    next_at: Option<Instant>,
    quiet: Option<Instant>,
    now: Instant,
    spread: impl FnOnce() -> Duration,
) -> Option<Instant> {
    let quiet = quiet.filter(|&quiet| quiet > now)?;
    next_at
        .is_none_or(|at| at < quiet)
        .then(|| quiet + spread())
}

#[cfg(test)]
mod tests {
    use super::answers::SECOND;
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    fn lease(fence: i64, expires_ms: i64, seen_ms: i64) -> Lease {
        Lease {
            fence,
            expires_at: t(expires_ms),
            latest: t(seen_ms),
        }
    }

    #[test]
    fn changes_are_named_on_the_servers_clock() {
        let l = lease(1, 30_000, 10_000);
        assert_eq!(change(Before::First, None, t(0)), Some(ChangeKind::Initial));
        assert_eq!(change(Before::Free, None, t(0)), None);
        assert_eq!(
            change(Before::Free, Some(&l), t(0)),
            Some(ChangeKind::Acquired)
        );
        assert_eq!(change(Before::Held(&l), Some(&l), t(12_000)), None);
        let renewed = lease(1, 40_000, 20_000);
        assert_eq!(
            change(Before::Held(&l), Some(&renewed), t(20_000)),
            Some(ChangeKind::Renewed)
        );
        let other = lease(2, 40_000, 20_000);
        assert_eq!(
            change(Before::Held(&l), Some(&other), t(20_000)),
            Some(ChangeKind::TakenOver)
        );
        // Free with a second to spare before the expiry: released.
        assert_eq!(
            change(Before::Held(&l), None, t(29_000)),
            Some(ChangeKind::Released)
        );
        // Free later, the lease last seen long before its expiry: cannot tell.
        assert_eq!(
            change(Before::Held(&l), None, t(30_000)),
            Some(ChangeKind::Ended)
        );
        assert_eq!(
            change(Before::Held(&l), None, t(60_000)),
            Some(ChangeKind::Ended)
        );
        // Seen when it could no longer be renewed, free later: expired.
        let last_second = lease(1, 30_000, 29_000);
        assert!(
            !lease(1, 30_500, 29_000).seen_final(),
            "1.5 s may have been left"
        );
        assert!(last_second.seen_final());
        assert_eq!(
            change(Before::Held(&last_second), None, t(31_000)),
            Some(ChangeKind::Expired)
        );
        let in_grace = lease(1, 30_500, 31_000);
        assert_eq!(
            change(Before::Held(&in_grace), None, t(32_000)),
            Some(ChangeKind::Expired)
        );
    }

    #[test]
    fn the_final_stretch_is_where_a_lapsed_lease_shows_final() {
        // From the whole second before the expiry (a Date that reads it
        // shows a second or less left) to the end of the grace.
        assert_eq!(lease(1, 30_300, 0).final_stretch(), (t(30_000), t(31_300)));
        assert_eq!(lease(1, 30_000, 0).final_stretch(), (t(29_000), t(31_000)));
        for expires in [30_000, 30_001, 30_300, 30_999] {
            let (from, to) = lease(1, expires, 0).final_stretch();
            // A look answered anywhere in it reads a Date that shows the
            // lease final; more than a second long.
            for at in [from, to - TimeDelta::milliseconds(1)] {
                let date = DateTime::from_timestamp(at.timestamp(), 0).unwrap();
                assert!(
                    lease(1, expires, date.timestamp_millis()).seen_final(),
                    "{expires}"
                );
            }
            // A Date of the second before it leaves more than a second.
            let before = DateTime::from_timestamp((from - SECOND).timestamp(), 0).unwrap();
            assert!(!lease(1, expires, before.timestamp_millis()).seen_final());
            assert!(to - from > SECOND, "{expires}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_look_at_the_last_moments_is_aimed_where_the_bounds_make_it_land() {
        let base = Instant::now();
        let at = |ms: i64| base + MS(ms as u64);
        // Narrow bounds (200 ms): the middle of where the look surely
        // lands in [13 s, 14.3 s), a 40 ms round trip allowed.
        let narrow = ServerClock {
            base,
            bounds: Some((t(10_000), t(10_200))),
        };
        let rtt = TimeDelta::milliseconds(40);
        let look = narrow.local_within(t(13_000), t(14_300), rtt).unwrap();
        assert_eq!(look, at(3_530));
        // Its answer comes while the server's clock reads between 13.53 s
        // and 13.77 s: inside.
        // Bounds a whole second wide (after a jump of the server's clock),
        // against a stretch of 1.01 s (an expiry 10 ms past a whole
        // second): no instant is sure, so the latest surely before its end,
        // answered between 13.97 s and 15.01 s; a look found too early gets
        // one more (below).
        let wide = ServerClock {
            base,
            bounds: Some((t(10_000), t(11_000))),
        };
        let look = wide.local_within(t(14_000), t(15_010), rtt).unwrap();
        assert_eq!(look, at(3_970));
        // Aimed at the middle of the stretch by the middle of the bounds,
        // it could be answered at 15.045 s, after the grace.
        assert_eq!(wide.local(t(14_505)), Some(at(4_005)));
        assert_eq!(wide.local_within(t(9_000), t(9_500), rtt), Some(base));
    }

    /// A look at the last moments that found the lease before them gets
    /// one more, once; a second early one spends as a renewal does.
    #[tokio::test(start_paused = true)]
    async fn a_look_too_early_at_the_last_moments_gets_one_more() {
        let base = Instant::now();
        let mut observer = observer_at(base);
        let held = LockState::new(true, Some(t(14_300)), Some(1));
        let look = |observer: &mut Observer, date_ms: i64, special: bool| {
            let now = Instant::now();
            observer.saw(held.clone(), Some(t(date_ms)), now, now, special);
            (observer.special_next, observer.special_spent)
        };
        // A regular look: the next is one at the lease's last moments.
        assert_eq!(look(&mut observer, 10_000, false), (true, false));
        // That one answered with more than a second left by its Date: too
        // early; another.
        tokio::time::advance(MS(3_000)).await;
        assert_eq!(look(&mut observer, 13_000, true), (true, false));
        // Too early again: spent until a regular look.
        tokio::time::advance(MS(100)).await;
        assert_eq!(look(&mut observer, 13_000, true), (false, true));
        // A regular look, then a look in the last second: seen final, so
        // the next is the one as it frees.
        assert_eq!(look(&mut observer, 13_000, false), (true, false));
        // (A regular look gives a look too early its one more again.)
        assert_eq!(look(&mut observer, 13_000, true), (true, false));
        tokio::time::advance(MS(900)).await;
        assert_eq!(look(&mut observer, 14_000, true), (true, true));
    }

    #[tokio::test(start_paused = true)]
    async fn the_server_clock_estimate_narrows_and_restarts_after_a_jump() {
        let mut clock = ServerClock {
            base: Instant::now(),
            bounds: None,
        };
        let base = clock.base;
        let at = |ms: u64| base + Duration::from_millis(ms);
        assert_eq!(clock.local(t(0)), None);
        clock.sample(at(100), at(140), t(1_000));
        assert_eq!(clock.bounds, Some((t(860), t(1_900))));
        // A second answer in another phase of the server's second.
        clock.sample(at(700), at(740), t(2_000));
        assert_eq!(clock.bounds, Some((t(1_260), t(1_900))));
        // A jump of the server's clock: the bounds restart.
        clock.sample(at(1_000), at(1_040), t(60_000));
        assert_eq!(clock.bounds, Some((t(58_960), t(60_000))));
        assert_eq!(clock.local(t(59_480)), Some(at(0)));
        assert_eq!(clock.local(t(60_480)), Some(at(1_000)));
    }

    /// An observer of a 10 s poll interval whose estimate of the server's
    /// clock reads 10.5 s (the middle of its one-second bounds) at `base`.
    fn observer_at(base: Instant) -> Observer {
        let mut observer = Observer::new("k".to_owned());
        observer.clock.base = base;
        observer.clock.sample(base, base, t(10_000));
        observer
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[tokio::test(start_paused = true)]
    async fn the_next_look_is_regular_or_at_a_leases_last_moments_whichever_is_sooner() {
        let base = Instant::now();
        let regular = |(at, special): (Instant, bool), received: Instant, poll: Duration| {
            assert!(!special, "a regular look");
            let after = at - received;
            assert!(after > poll.mul_f64(0.9) && after <= poll, "{after:?}");
        };
        for _ in 0..20 {
            let observer = observer_at(base);
            // Free: at the poll interval, jittered down by up to a tenth.
            regular(observer.schedule(None, base, Duration::ZERO), base, S(10));
            // Held, not seen final (3.3 s left): a look in the middle of its
            // last moments, 13 s to 14.3 s on the server's clock: 13.65 s,
            // which this machine reaches 3.15 s after `base`.
            let held = lease(1, 13_300, 10_000);
            assert_eq!(
                observer.schedule(Some(&held), base, Duration::ZERO),
                (base + MS(3_150), true)
            );
            // Never sooner than the least interval after the answer.
            let late = base + MS(3_100);
            assert_eq!(
                observer.schedule(Some(&held), late, Duration::ZERO),
                (late + POLL_MIN, true)
            );
            // Due as the answer came, or passed already, and the lease still
            // shown as before: again in a second.
            let due = base + MS(3_150);
            assert_eq!(
                observer.schedule(Some(&held), due, Duration::ZERO),
                (due + RETRY_LATE, true)
            );
            let past = base + MS(5_000);
            assert_eq!(
                observer.schedule(Some(&held), past, Duration::ZERO),
                (past + RETRY_LATE, true)
            );
            // Such a look found it renewed since the last regular one: the
            // next waits for a regular look.
            let mut spent = observer_at(base);
            spent.special_spent = true;
            regular(
                spent.schedule(Some(&held), base, Duration::ZERO),
                base,
                S(10),
            );
            // Seen final (a second left): a look as it frees, 1.1 s after its
            // expiry plus up to the spread; so also when spent.
            let last = lease(1, 11_000, 10_000);
            for observer in [&observer, &spent] {
                let (at, special) = observer.schedule(Some(&last), base, Duration::ZERO);
                let after = at - base;
                assert!(special, "{after:?}");
                assert!(
                    after >= MS(1_600) && after < MS(1_600) + LOOK_SPREAD,
                    "{after:?}"
                );
            }
            // A poll interval shorter than the wait for the last moments:
            // regular.
            let mut quick = observer_at(base);
            quick.poll = S(1);
            regular(
                quick.schedule(Some(&held), base, Duration::ZERO),
                base,
                S(1),
            );
            // Past, but the regular look comes within a second anyway.
            regular(
                quick.schedule(Some(&held), past, Duration::ZERO),
                past,
                S(1),
            );
        }
    }

    /// A look at a lease's last moments that goes when a regular one would
    /// anyway (nine tenths of the poll interval after the last answer)
    /// counts as regular; neither moves the next regular look, which only a
    /// regular look sets.
    #[tokio::test(start_paused = true)]
    async fn a_look_at_the_last_moments_on_cadence_counts_as_regular() {
        let client = crate::Client::builder()
            .service_key("k")
            .api_url("http://127.0.0.1:1")
            .build()
            .unwrap();
        let locks = client.locks();
        let mut observer = Observer::new("k".to_owned());
        observer.poll = S(10);
        let base = Instant::now();
        observer.last_received = Some(base);
        observer.next_at = Some(base + S(10));
        observer.special_next = true;
        tokio::time::advance(S(5)).await;
        assert!(observer.send(&locks).special, "off the cadence");
        assert_eq!(observer.next_at, Some(base + S(10)));
        tokio::time::advance(S(4)).await;
        assert!(!observer.send(&locks).special, "on the cadence");
        assert_eq!(observer.next_at, Some(base + S(10)));
        // A regular look, off the cadence: the next is a poll interval on.
        observer.special_next = false;
        observer.last_received = Some(base + S(8));
        assert!(!observer.send(&locks).special);
        assert_eq!(observer.next_at, Some(base + S(19)));
        assert!(!observer.is_ended());
        observer.ended = true;
        assert!(observer.is_ended());
    }

    #[test]
    fn a_look_due_inside_a_quota_window_goes_past_it_plus_a_spread() {
        let now = Instant::now();
        let quiet = now + S(5);
        let spread = || MS(300);
        let never = || -> Duration { panic!("no spread drawn") };
        // No window, or one that has passed (or ends now): as it was.
        assert_eq!(past_quiet(Some(now), None, now, never), None);
        assert_eq!(past_quiet(Some(now), Some(now), now, never), None);
        assert_eq!(past_quiet(Some(now), Some(now - MS(1)), now, never), None);
        assert_eq!(past_quiet(Some(now - MS(1)), Some(now), now, never), None);
        // Due inside it (or never scheduled): past it, spread.
        assert_eq!(
            past_quiet(Some(now), Some(quiet), now, spread),
            Some(quiet + MS(300))
        );
        assert_eq!(
            past_quiet(None, Some(quiet), now, spread),
            Some(quiet + MS(300))
        );
        assert_eq!(
            past_quiet(Some(quiet - MS(1)), Some(quiet), now, spread),
            Some(quiet + MS(300))
        );
        // Due as it ends or after: as it was.
        assert_eq!(past_quiet(Some(quiet), Some(quiet), now, never), None);
        assert_eq!(
            past_quiet(Some(quiet + S(1)), Some(quiet), now, never),
            None
        );
    }

    #[test]
    fn a_failed_look_pauses_for_the_poll_interval_or_the_named_window_plus_a_spread() {
        let mut observer = Observer::new("k".to_owned());
        // Spread over the poll interval, so that a fleet does not fire
        // together (20 draws within one second of each other: about 1e-18).
        let pauses: Vec<Duration> = (0..20).map(|_| observer.pause(None)).collect();
        let (low, high) = (pauses.iter().min(), pauses.iter().max());
        assert!(
            high.unwrap().saturating_sub(*low.unwrap()) > S(1),
            "{pauses:?}"
        );
        for _ in 0..20 {
            observer.poll = S(10);
            let pause = observer.pause(None);
            assert!(pause >= S(10) && pause < S(20), "{pause:?}");
            // A Retry-After shorter than the poll interval does not hasten.
            let pause = observer.pause(Some(S(3)));
            assert!(pause >= S(10) && pause < S(20), "{pause:?}");
            observer.poll = S(1);
            let pause = observer.pause(Some(S(7)));
            assert!(pause >= S(7) && pause < S(8), "{pause:?}");
            // A proxy's huge Retry-After: a minute at most, then the spread.
            let pause = observer.pause(Some(S(3_600)));
            assert!(pause >= S(60) && pause < S(61), "{pause:?}");
            // A day's poll interval: the spread is a minute at most.
            observer.poll = S(86_400);
            let spread = observer.spread();
            assert!(spread < S(60), "{spread:?}");
            observer.poll = S(200_000);
            assert_eq!(observer.poll(), MAX_POLL);
        }
    }
}
