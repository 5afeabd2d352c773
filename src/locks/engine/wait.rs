//! Waiting for a held lock: `locks.acquire(key, ttl).wait(timeout)`, and
//! through it `hold(..).wait`, `with_lock(..).wait`, `leader` campaigns and
//! `volcano locks run --wait`.
//!
//! Fast when it matters, cheap when it lasts. Most waits end soon (the
//! holder's job was short) or last long (a standby leader), and a poller
//! that sends r requests a second notices a graceful release after 1/(2r)
//! on average, whatever it does: so a waiter spends its requests early.
//! The interval between its tries is a ramp on the time it has waited:
//! `RAMP_RATIO` of it (jittered down by up to a tenth), at least
//! `RAMP_FLOOR`, at most the poll interval (default `DEFAULT_POLL`,
//! `.poll_interval(d)`; all three in [`retry::wait`]). A release is then noticed within 30 % of the time
//! already waited (0.3 s at first), and a wait that lasts costs one try
//! per poll interval: a few requests more per wait, not per minute.
//!
//! Quota-aware: a project's 600 lock operations a minute are shared by its
//! whole fleet, and holders' renewals must never be starved by waiters.
//! A waiter that knows the holder's expiry (learned with one `get`) looks
//! again (`get`) at the takeover moment (`expires_at` + 1 s grace) when
//! that comes before its next try. A 429 (or a 503 with `Retry-After`)
//! pauses until the window it names has passed, plus a jitter of up to one
//! poll interval, so that a fleet does not fire all at the first second of
//! the next window. Waiters of one client on one key take turns (see
//! `turns`): only the first in line sends requests.
//!
//! A wait without a deadline (`Duration::MAX`: a leader's campaign, a
//! standby) does not ramp: it tries at the poll interval from the start,
//! and looks at the takeover moment when that comes within one and a half
//! intervals. Standbys are long waits by nature, and a fleet of them
//! starting together (a deploy) would spend most of the project's quota in
//! its first minute on a ramp: 16 candidates about 60 % (measured: docs/benchmarks.md,
//! section 10), 28 more than all of it.
//!
//! Uncertain outcomes end in a known state. No try (nor acquire's single
//! retry, nor a `get`) starts after the deadline. A try still in flight at
//! the deadline gets [`ANSWER_GRACE`] more to answer: a late `201` is
//! returned as the lease. If no answer comes, the acquire may have been
//! applied: the wait returns that try's error (`Error::Transport`), never
//! an older `409`. With a generated token the SDK also undoes the try with
//! a release (the caller could never name that token); with the caller's
//! own token the caller recovers by acquiring again with it. A timeout too
//! large to represent (`Duration::MAX`) waits forever.
//!
//! The pauses are paced in `wait/pace.rs`; tries failing without an answer
//! are followed in `wait/episode.rs`.

mod episode;
mod pace;

use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use crate::error::Error;
use crate::retry;
use crate::retry::wait::{ANSWER_GRACE, MAX_POLL, POLL_MIN};

pub(crate) use episode::Episode;

/// What a look at the holder (`get`) found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder {
    pub(crate) held: bool,
    pub(crate) expires_at: Option<chrono::DateTime<Utc>>,
    /// The answer's `Date`: the server's clock when it answered.
    pub(crate) date: Option<chrono::DateTime<Utc>>,
}

/// Checks a caller's poll interval.
pub(crate) fn check_poll_interval(poll: Duration) -> crate::error::Result<()> {
    if poll < POLL_MIN {
        return Err(Error::invalid(format!(
            "poll_interval must be at least {} ms (got {poll:?})",
            POLL_MIN.as_millis()
        )));
    }
    Ok(())
}

/// When a try may start and by when its answer is due; unbounded by
/// default (a plain acquire).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    pub(crate) send_by: Option<Instant>,
    pub(crate) answer_by: Option<Instant>,
}

/// What the waiter does after a failed try or a look at the holder.
pub(crate) enum Step {
    /// Pause, then do `then`.
    Retry { pause: Duration, then: Then },
    /// Stop and return this error.
    Stop(Error),
}

/// What follows a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    /// Try to acquire.
    Acquire,
    /// Look at the holder (`get`) first: it may have renewed.
    LookAtHolder,
}

/// The state of one waiting acquire.
pub(crate) struct Waiter {
    /// `None`: the timeout is too large to represent; wait forever.
    deadline: Option<Instant>,
    /// The longest interval between tries.
    poll_interval: Duration,
    /// When the wait began: the ramp grows with the time since.
    started: Instant,
    /// A 429 came: the project's quota is spent, so this waiter polls at
    /// the poll interval from now on (no ramp).
    throttled: bool,
    /// When the known holder's lease can be taken over (local time).
    holder_free_at: Option<Instant>,
    /// The newest `409`: what a timed-out wait returns.
    last_conflict: Option<Error>,
    /// The newest other error worth waiting through (429, a 5xx, no answer).
    last_other: Option<Error>,
    /// The newest try whose outcome is unknown, while no later `409`
    /// came.
    last_uncertain: Option<Error>,
    /// A try whose outcome was unknown came before a later `409`: that
    /// `409` answers the later try only (the earlier may still land), so a
    /// timed-out wait's conflict says the acquire may have been applied.
    uncertain_before_conflict: bool,
    /// ... and it may still land later.
    late_before_conflict: bool,
    /// That try's error: what a timed-out wait returns rather than a later
    /// failed connection, which would say nothing was applied.
    earlier_uncertain: Option<Error>,
    /// The step being taken follows a look at the holder.
    looked: bool,
    /// The newest failed try had no answer (a transport failure, a 503)
    /// and no `409` came since: nothing says the lock is held.
    unanswered: bool,
    /// Since when the tries have been failing without an answer about the
    /// lock, and whether that was said already.
    failing_since: Option<Instant>,
    warned: bool,
}

impl Waiter {
    pub(crate) fn new(timeout: Duration, poll_interval: Duration) -> Self {
        Waiter {
            deadline: Instant::now().checked_add(timeout),
            poll_interval: poll_interval.min(MAX_POLL),
            started: Instant::now(),
            throttled: false,
            holder_free_at: None,
            last_conflict: None,
            last_other: None,
            last_uncertain: None,
            uncertain_before_conflict: false,
            late_before_conflict: false,
            earlier_uncertain: None,
            looked: false,
            unanswered: false,
            failing_since: None,
            warned: false,
        }
    }

    /// Time left before the caller's timeout (`Duration::MAX`: no deadline).
    pub(crate) fn remaining(&self) -> Duration {
        self.waits_until().map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }

    /// The deadline the waiting keeps (a planted bug in the simulation
    /// keeps trying a second past it).
    fn waits_until(&self) -> Option<Instant> {
        let overrun = if sabotaged!(TryAfterDeadline) {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        };
        self.deadline.map(|d| d + overrun)
    }

    /// The bounds of the next try: started before the deadline, answered
    /// within the grace after it.
    pub(crate) fn window(&self) -> Window {
        Window {
            send_by: self.deadline,
            answer_by: self.deadline.and_then(|d| d.checked_add(ANSWER_GRACE)),
        }
    }

    /// Decides what follows a failed try.
    pub(crate) fn after(&mut self, err: Error) -> Step {
        let looked = std::mem::take(&mut self.looked);
        if sabotaged!(WaiterGivesUpOnError) && !matches!(err, Error::Conflict(_)) {
            return Step::Stop(err);
        }
        let step = match &err {
            Error::Conflict(_) => {
                // The lock is someone else's (or our lapsed lease's) now;
                // an earlier try of ours whose outcome is unknown may
                // still land later.
                if let Some(earlier) = self.last_uncertain.take() {
                    self.uncertain_before_conflict = true;
                    self.late_before_conflict |= earlier.may_land_late();
                    self.earlier_uncertain = Some(earlier);
                }
                if err.may_have_applied() {
                    self.uncertain_before_conflict = true;
                    self.late_before_conflict |= err.may_land_late();
                }
                self.unanswered = false;
                self.last_conflict = Some(err);
                match self.toward_the_holder() {
                    Some(step) => step,
                    // Unknown, or past its takeover moment: look. Right
                    // after a look that found it free, not at once.
                    None => {
                        let pause = if looked { self.ramp() } else { Duration::ZERO };
                        (pause, Then::LookAtHolder)
                    }
                }
            }
            Error::RateLimited(_) => {
                let pause = self.spread(err.retry_after());
                self.throttled = true;
                self.unanswered = false;
                self.last_other = Some(err);
                (pause, Then::Acquire)
            }
            // The same token makes another try safe; a 503 may name when
            // (`Retry-After`), as a 429 does.
            _ if retry::waits_through(&err) => {
                let pause = match err.retry_after() {
                    Some(after) => self.spread(Some(after)),
                    None => self.ramp(),
                };
                if err.may_have_applied() {
                    self.last_uncertain = Some(err);
                } else {
                    self.unanswered = true;
                    self.last_other = Some(err);
                }
                (pause, Then::Acquire)
            }
            _ => return Step::Stop(err),
        };
        self.step(step)
    }

    /// Decides what follows a look at the holder: what `get` said (held,
    /// and until when), or the error it failed with (which never ends the
    /// wait: the tries decide).
    pub(crate) fn looked(&mut self, state: Result<Holder, Error>) -> Step {
        self.looked = true;
        if sabotaged!(WaiterStopsTrying) {
            return self.step((self.remaining(), Then::Acquire));
        }
        let step = match state {
            Ok(Holder {
                held,
                expires_at,
                date,
            }) => {
                // The service answered: nothing says the lock is free.
                self.unanswered = false;
                self.holder(held, expires_at, date);
                match self.toward_the_holder() {
                    Some(step) => step,
                    // Free now: try at once.
                    None if !held => (Duration::ZERO, Then::Acquire),
                    // Held, until when unknown: try after a ramp step.
                    None => (self.ramp(), Then::Acquire),
                }
            }
            Err(err @ Error::RateLimited(_)) => {
                let pause = self.spread(err.retry_after());
                self.throttled = true;
                self.last_other.get_or_insert(err);
                (pause, Then::Acquire)
            }
            Err(_) => (self.ramp(), Then::Acquire),
        };
        self.step(step)
    }

    fn step(&mut self, (pause, then): (Duration, Then)) -> Step {
        match self.timed_out() {
            Some(err) => Step::Stop(err),
            None => Step::Retry {
                pause: pause.min(self.remaining()),
                then,
            },
        }
    }

    /// Once the timeout has passed: the error to return. A try that may
    /// have been applied first; then a failed connection with no `409`
    /// since (the lock may be free: it must not read as held); then the
    /// last conflict if there was one, so `is_lock_held()` stays true.
    pub(crate) fn timed_out(&mut self) -> Option<Error> {
        if self.waits_until().is_none_or(|d| Instant::now() < d) {
            return None;
        }
        let unanswered = if self.unanswered {
            self.earlier_uncertain
                .take()
                .or_else(|| self.last_other.take())
        } else {
            None
        };
        let uncertain = self.uncertain_before_conflict;
        let late = self.late_before_conflict;
        let conflict = || {
            self.last_conflict.take().map(|conflict| {
                if uncertain {
                    conflict.after_uncertain_attempt(late)
                } else {
                    conflict
                }
            })
        };
        self.last_uncertain
            .take()
            .or(unanswered)
            .or_else(conflict)
            .or_else(|| self.last_other.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::wait::{ramp, WARN_UNANSWERED_AFTER};

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn answer(status: u16, retry_after: Option<Duration>) -> Error {
        Error::from_status(crate::ApiError {
            status: Some(status),
            code: (status == 409).then(|| crate::codes::LOCK_HELD.to_owned()),
            message: String::new(),
            request_id: None,
            retry_after,
            after_uncertain: false,
            first_may_land_late: false,
            from_service: status == 409,
        })
    }

    fn holder(held: bool, expires_at: Option<chrono::DateTime<Utc>>) -> Holder {
        Holder {
            held,
            expires_at,
            date: Some(Utc::now()),
        }
    }

    fn retry(step: Step) -> (Duration, Then) {
        match step {
            Step::Retry { pause, then } => (pause, then),
            Step::Stop(err) => panic!("stopped: {err:?}"),
        }
    }

    #[test]
    fn the_ramp_is_thirty_percent_of_the_wait_between_its_floor_and_the_poll_interval() {
        let ms = Duration::from_millis;
        assert_eq!(ramp(S(0), S(10)), ms(300));
        assert_eq!(ramp(S(1), S(10)), ms(300));
        assert_eq!(ramp(S(2), S(10)), ms(600));
        assert_eq!(ramp(S(10), S(10)), S(3));
        assert_eq!(ramp(S(60), S(10)), S(10));
        assert_eq!(ramp(S(3600), S(10)), S(10));
        // A poll interval shorter than the floor wins.
        assert_eq!(ramp(S(0), ms(100)), ms(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_known_holder_is_tried_on_the_ramp_and_looked_at_at_its_takeover_moment() {
        let mut waiter = Waiter::new(S(600), S(10));
        // First conflict: the holder is unknown, look at once.
        assert_eq!(
            retry(waiter.after(answer(409, None))),
            (Duration::ZERO, Then::LookAtHolder)
        );
        // Free in 61 s (60 s + the grace): far; the ramp starts at 0.3 s.
        let expires = Utc::now() + chrono::TimeDelta::seconds(60);
        let (pause, then) = retry(waiter.looked(Ok(holder(true, Some(expires)))));
        assert_eq!(then, Then::Acquire);
        let ms = Duration::from_millis;
        assert!(pause >= ms(270) && pause <= ms(300), "{pause:?}");
        // 10 s into the wait: 3 s (less up to a tenth).
        tokio::time::advance(S(10)).await;
        let (pause, then) = retry(waiter.after(answer(409, None)));
        assert_eq!(then, Then::Acquire);
        assert!(pause >= ms(2_700) && pause <= S(3), "{pause:?}");
        // 40 s in: the poll interval, ±5 %.
        tokio::time::advance(S(30)).await;
        let (pause, then) = retry(waiter.after(answer(409, None)));
        assert_eq!(then, Then::Acquire);
        assert!(pause >= ms(9_500) && pause <= ms(10_500), "{pause:?}");
        // 55 s in, the takeover moment (61.1 to 61.6 s) comes before the
        // next try: sleep to it, then look.
        tokio::time::advance(S(15)).await;
        let (pause, then) = retry(waiter.after(answer(409, None)));
        assert_eq!(then, Then::LookAtHolder);
        let (low, high) = (ms(6_100), ms(6_700));
        assert!(pause >= low && pause <= high, "{pause:?}");
        // The holder renewed: tried on the ramp again.
        tokio::time::advance(pause).await;
        let expires = Utc::now() + chrono::TimeDelta::seconds(15);
        let (_, then) = retry(waiter.looked(Ok(holder(true, Some(expires)))));
        assert_eq!(then, Then::Acquire);
        // Held, until when unknown: tried after a ramp step, not at once.
        let (pause, then) = retry(waiter.looked(Ok(holder(true, None))));
        assert_eq!(then, Then::Acquire);
        assert!(pause >= ms(270), "{pause:?}");
        // Released: try at once.
        assert_eq!(
            retry(waiter.looked(Ok(holder(false, None)))),
            (Duration::ZERO, Then::Acquire)
        );
        // Taken by another right then: look again after a ramp step, not at
        // once.
        let (pause, then) = retry(waiter.after(answer(409, None)));
        assert_eq!(then, Then::LookAtHolder);
        assert!(pause > Duration::ZERO, "{pause:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_poll_interval_the_tries_spread_both_ways() {
        // Grown to the poll interval, a try every interval on average:
        // ±5 %, not jittered down only as while the ramp grows.
        let mut waiter = Waiter::new(S(600), S(10));
        tokio::time::advance(S(60)).await;
        let far = Utc::now() + chrono::TimeDelta::seconds(600);
        let pauses: Vec<Duration> = (0..20)
            .map(|_| retry(waiter.looked(Ok(holder(true, Some(far))))).0)
            .collect();
        let ms = Duration::from_millis;
        assert!(
            pauses.iter().all(|p| *p >= ms(9_500) && *p <= ms(10_500)),
            "{pauses:?}"
        );
        assert!(pauses.iter().any(|p| *p > S(10)), "{pauses:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_holders_takeover_moment_is_its_expiry_the_grace_and_a_moment_more() {
        // A standby (no deadline) polling every minute: a holder 10 s from
        // its expiry is looked at once its grace has passed, 1.1 s after the
        // expiry, plus up to the spread.
        let ms = Duration::from_millis;
        for _ in 0..20 {
            let mut waiter = Waiter::new(Duration::MAX, S(60));
            let expires = Utc::now() + chrono::TimeDelta::seconds(10);
            let (pause, then) = retry(waiter.looked(Ok(holder(true, Some(expires)))));
            assert_eq!(then, Then::LookAtHolder);
            assert!(pause >= ms(11_090) && pause <= ms(11_600), "{pause:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_waits_out_its_window_plus_a_spread_of_one_poll_interval() {
        let mut waiter = Waiter::new(S(600), S(10));
        let pauses: Vec<Duration> = (0..200)
            .map(|_| retry(waiter.after(answer(429, Some(S(7))))).0)
            .collect();
        assert!(
            pauses.iter().all(|p| *p >= S(7) && *p <= S(17)),
            "{pauses:?}"
        );
        let early = pauses.iter().filter(|p| **p < S(12)).count();
        assert!(
            early > 50 && early < 150,
            "spread, not bunched: {early} of 200"
        );
        // A huge Retry-After (a proxy's) is capped at a minute.
        let (pause, _) = retry(waiter.after(answer(503, Some(S(3_600)))));
        assert!(pause <= S(70), "{pause:?}");
        // A look refused with 429 pauses the same way.
        let (pause, then) = retry(waiter.looked(Err(answer(429, Some(S(7))))));
        assert!(pause >= S(7), "{pause:?}");
        assert_eq!(then, Then::Acquire);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_stops_at_its_deadline_with_the_last_conflict() {
        let mut waiter = Waiter::new(S(5), S(10));
        let (pause, _) = retry(waiter.after(answer(409, None)));
        assert_eq!(pause, Duration::ZERO);
        let expires = Utc::now() + chrono::TimeDelta::seconds(60);
        let (pause, _) = retry(waiter.looked(Ok(holder(true, Some(expires)))));
        assert!(pause <= S(5), "never past the deadline: {pause:?}");
        tokio::time::advance(S(5)).await;
        match waiter.after(answer(409, None)) {
            Step::Stop(err) => assert!(err.is_lock_held()),
            Step::Retry { .. } => panic!("past the deadline"),
        }
        assert!(check_poll_interval(Duration::from_millis(99)).is_err());
        assert!(check_poll_interval(POLL_MIN).is_ok());
    }

    fn refused_connection() -> Error {
        Error::Transport(crate::error::TransportError {
            kind: crate::error::TransportKind::Connect,
            request_id: String::new(),
            server: None,
            source: None,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_whose_tries_no_longer_connect_does_not_time_out_as_held() {
        let mut waiter = Waiter::new(S(5), S(10));
        retry(waiter.after(answer(409, None)));
        retry(waiter.after(refused_connection()));
        tokio::time::advance(S(5)).await;
        let err = waiter.timed_out().expect("timed out");
        assert!(err.is_transport() && !err.is_lock_held(), "{err:?}");
        // A 409 after the failures: held again.
        let mut waiter = Waiter::new(S(5), S(10));
        retry(waiter.after(refused_connection()));
        retry(waiter.after(answer(409, None)));
        tokio::time::advance(S(5)).await;
        assert!(waiter.timed_out().expect("timed out").is_lock_held());
        // A 429 is an answer too: the conflict stands.
        let mut waiter = Waiter::new(S(5), S(10));
        retry(waiter.after(answer(409, None)));
        retry(waiter.after(answer(429, Some(S(1)))));
        tokio::time::advance(S(5)).await;
        assert!(waiter.timed_out().expect("timed out").is_lock_held());
    }

    /// A try that timed out may still land: a later 409 and a later
    /// refused connection do not erase it. The timed-out wait says it may
    /// have been applied (a 409 after it alone: held, and may have been).
    #[tokio::test(start_paused = true)]
    async fn an_uncertain_try_outlives_later_409s_and_refused_connections() {
        let timed_out = || {
            Error::Transport(crate::error::TransportError {
                kind: crate::error::TransportKind::Timeout,
                request_id: String::new(),
                server: None,
                source: None,
            })
        };
        let mut waiter = Waiter::new(S(5), S(10));
        retry(waiter.after(timed_out()));
        retry(waiter.after(answer(409, None)));
        retry(waiter.after(refused_connection()));
        tokio::time::advance(S(5)).await;
        let err = waiter.timed_out().expect("timed out");
        assert!(
            err.may_have_been_applied() && err.may_land_late(),
            "{err:?}"
        );
        let mut waiter = Waiter::new(S(5), S(10));
        retry(waiter.after(timed_out()));
        retry(waiter.after(answer(409, None)));
        tokio::time::advance(S(5)).await;
        let err = waiter.timed_out().expect("timed out");
        assert!(err.is_lock_held() && err.may_have_been_applied(), "{err:?}");
        assert!(err.may_land_late(), "{err:?}");
    }

    fn said(waiter: &mut Waiter, err: &Error) -> Option<Episode> {
        waiter.failed(err);
        waiter.episode()
    }

    #[tokio::test(start_paused = true)]
    async fn tries_failing_without_an_answer_are_an_episode_said_once() {
        let mut waiter = Waiter::new(Duration::MAX, S(10));
        assert_eq!(said(&mut waiter, &refused_connection()), None);
        tokio::time::advance(WARN_UNANSWERED_AFTER - S(1)).await;
        assert_eq!(said(&mut waiter, &answer(503, None)), None, "not yet");
        tokio::time::advance(S(1)).await;
        assert_eq!(
            said(&mut waiter, &refused_connection()),
            Some(Episode::Unanswered(WARN_UNANSWERED_AFTER))
        );
        tokio::time::advance(S(60)).await;
        assert_eq!(said(&mut waiter, &refused_connection()), None, "said once");
        assert_eq!(
            said(&mut waiter, &answer(409, None)),
            Some(Episode::Answered)
        );
        assert_eq!(said(&mut waiter, &answer(409, None)), None);
        // A 500 is no answer about the lock; a 429 is one.
        waiter.failed(&answer(500, None));
        assert!(waiter.failing_since().is_some());
        waiter.failed(&answer(429, None));
        assert_eq!(waiter.failing_since(), None);
        waiter.episode();
        // A new episode starts from its own first failure.
        assert_eq!(said(&mut waiter, &refused_connection()), None);
        tokio::time::advance(S(29)).await;
        assert_eq!(said(&mut waiter, &refused_connection()), None);
    }
}
