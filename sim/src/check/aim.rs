//! A waiter's aim (DESIGN.md §15, the waiting promise): the ramp paces its
//! tries, and a holder's expiry it saw gets its look, neither sooner nor
//! much later.
//!
//! The cadence checks (`check/cadence.rs`) bound a waiter by its poll
//! interval; these bound it by its ramp, which is what makes a release
//! noticed within 30 % of the time already waited: a waiter a step late,
//! aiming at the wrong moment, or looking at the holder at every turn
//! passes the cadence checks and spends the project's quota, or notices
//! a release late. Judged on exact clocks only (the ramp is timed on the
//! host's).

use std::time::Duration;

use volcano_mock_server::Operation;

use super::cadence::{acquire_waits, AcquireWait};
use super::run::Run;
use crate::log::Event;
use crate::net::Attempt;

/// The ramp: 30 % of the time waited, at least 300 ms, at most the poll
/// interval (`retry::wait::ramp` in the SDK).
fn ramp(waited: Duration, poll: Duration) -> Duration {
    waited
        .mul_f64(0.3)
        .max(Duration::from_millis(300))
        .min(poll)
}

/// How much later than its pause a request may go out: a tick or two, and
/// the answer's processing.
const LATE: Duration = Duration::from_millis(150);
/// How much sooner: the simulation's timers fire on ticks.
const SOON: Duration = Duration::from_millis(5);

/// Whether `client` was touched by a fault (or crashed) in `[from, to]`:
/// a suspended host's timers fire late.
pub(super) fn touched(run: &Run<'_>, client: usize, from: Duration, to: Duration) -> bool {
    run.events.iter().any(|e| {
        e.at >= from
            && e.at <= to
            && match &e.event {
                Event::Fault { what } => super::recovery::touches(what, client),
                Event::Crashed { client: c } => *c == client,
                _ => false,
            }
    })
}

/// The answer a waiter paces its next request from: a try refused with
/// 409, or a look answered 200 (held, or free).
fn paces(a: &Attempt) -> Option<(Duration, bool)> {
    let o = a.answer.as_ref()?;
    match (a.operation, o.status) {
        (Operation::Acquire, 409) => Some((o.at, true)),
        (Operation::Get, 200) => Some((o.at, o.fence.is_some())),
        _ => None,
    }
}

/// The ramp paces a waiting acquire. After a try refused with 409 or a
/// look, its next request goes within the ramp's step at that moment of
/// the wait (at most the poll interval, +5 %; +10 % once a 429 made it
/// poll at the interval); and after an answer that the key is held, its
/// next try waits at least nine tenths of that step. A waiter a step late
/// notices a release late; one early spends the quota.
pub(super) fn paced(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    for w in acquire_waits(run) {
        let AcquireWait {
            client,
            key,
            from,
            end,
            poll,
            ref requests,
        } = w;
        let Some(first) = requests.first() else {
            continue;
        };
        // The 429s this client received, any request of it: until when
        // each said the quota is spent (the client's waiters hold back
        // until then, and stop ramping).
        let quiet: Vec<(Duration, Duration)> = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| a.client == client)
            .filter_map(|a| a.answer.as_ref())
            .filter(|o| o.status == 429)
            .filter_map(|o| Some((o.at, o.at + o.retry_after?.min(Duration::from_secs(60)))))
            .collect();
        let mut throttled = false;
        let mut prev: Option<(Duration, bool)> = None;
        let mut previous_sent = from;
        for (i, r) in requests
            .iter()
            .enumerate()
            .take_while(|(_, r)| r.sent < end)
        {
            if let Some((at, held)) = prev {
                // A 429 to another of its client's requests since the
                // wait began: a pause to its window, then the interval.
                let told = quiet
                    .iter()
                    .filter(|(seen, _)| *seen <= at)
                    .map(|(_, until)| *until)
                    .max()
                    .filter(|until| *until > at);
                throttled |= told.is_some() && r.sent > at;
                let step = ramp(at.saturating_sub(from), poll);
                let latest = if let Some(until) = told {
                    (until - at) + poll.mul_f64(1.1)
                } else if throttled {
                    poll.mul_f64(1.1)
                } else if step >= poll {
                    step.mul_f64(1.05)
                } else {
                    step
                };
                if r.sent > at + latest + LATE && !touched(run, client, at, r.sent) {
                    out.push(format!(
                        "late on the ramp: client {client}'s wait for {key} (poll {poll:?}) was \
                         answered at {at:?}, {:?} into its wait, and sent its next request only \
                         at {:?} (due within {latest:?})",
                        at - from,
                        r.sent
                    ));
                }
                // Past a window in effect then: from its end, spread by up
                // to the interval (the spread may be small).
                let least = if let Some(until) = told {
                    (until - at).div_f64(0.9)
                } else if throttled {
                    poll
                } else {
                    ramp(at.saturating_sub(first.sent), poll)
                }
                .mul_f64(0.9);
                let early = r.sent + SOON < at + least;
                // A try cut short by the deadline, or after its client
                // freed the key (since the request before), may go sooner.
                let excused = r.sent + Duration::from_millis(20) >= end
                    || run.freed_between(client, key, previous_sent, r.sent);
                if held && r.operation == Operation::Acquire && early && !excused {
                    out.push(format!(
                        "early on the ramp: client {client}'s wait for {key} (poll {poll:?}) \
                         was told the key is held at {at:?} and tried again at {:?} (not before \
                         {:?})",
                        r.sent,
                        at + least
                    ));
                }
            }
            previous_sent = r.sent;
            let status = r.answer.as_ref().map(|o| o.status);
            throttled |= status == Some(429);
            // Its pause after any answer (a 5xx too) or failure that came
            // while a 429 to its client asked for quiet waited for that
            // window, and stopped the ramp (16-client seed 568).
            // (Not one the transport's single retry followed at once: the
            // wait made no pause then; kept-minimums seed 35.)
            let retried_at_once = |t: Duration| {
                requests
                    .get(i + 1)
                    .is_some_and(|n| n.request_id == r.request_id && n.sent <= t)
            };
            if let Some(t) = r.answer.as_ref().map(|o| o.at).or(r.failed) {
                throttled |= !retried_at_once(t)
                    && quiet.iter().any(|(seen, until)| *seen <= t && t < *until);
            }
            if status == Some(201) {
                break;
            }
            prev = paces(r);
        }
    }
}

/// When a waiter that saw a holder's expiry aims its look: the time left
/// it read on the server's clock (the expiry less the answer's `Date`, in
/// whole seconds), from the answer, plus the grace and the look's offset
/// (1.1 s); then up to [`LOOK_SPREAD`] of spread.
const TAKEOVER_AFTER: Duration = Duration::from_millis(1_100);
const LOOK_SPREAD: Duration = Duration::from_millis(500);

/// A holder's expiry gets its look, and no look comes before it. A
/// waiter's look that showed the key held until `E` sets its aim: the
/// answer's arrival, plus `E` less the answer's `Date` (the time left on
/// the server's clock, whole seconds), plus 1.1 s. Its next look comes no
/// sooner than that aim (a look before it can only say what the waiter
/// knows); and if nothing renewed, released or took the key by `E` + 1 s
/// (the grace), the waiter sends a request between then and the aim plus
/// [`LOOK_SPREAD`], when nothing disturbed the stretch. Not judged
/// across a server clock jump.
pub(super) fn looks_at_the_takeover(run: &Run<'_>, out: &mut Vec<String>) {
    if !run.exact_and_steady() {
        return;
    }
    let journal = &run.server.journal;
    for w in acquire_waits(run) {
        let requests: Vec<&Attempt> = w
            .requests
            .iter()
            .copied()
            .take_while(|r| r.sent < w.end)
            .collect();
        let granted = requests
            .iter()
            .find_map(|r| r.answer.as_ref().filter(|o| o.status == 201).map(|o| o.at));
        let end = granted.map_or(w.end, |g| g.min(w.end));
        for (n, look) in requests.iter().enumerate() {
            if look.operation != Operation::Get
                || look.answer.as_ref().is_none_or(|o| o.fence.is_none())
            {
                continue;
            }
            let Some(seen) = journal.iter().find(|r| {
                r.request_id.as_deref() == Some(look.request_id.as_str()) && r.status == Some(200)
            }) else {
                continue;
            };
            let (Some(expiry), Some(answer)) = (seen.expires_at, look.answer.as_ref()) else {
                continue;
            };
            let expires = run.sim_time(expiry);
            let date = seen.at.timestamp();
            let left = (expiry - chrono::DateTime::from_timestamp(date, 0).unwrap_or(seen.at))
                .to_std()
                .unwrap_or_default();
            let aim = answer.at + left + TAKEOVER_AFTER;
            let later = &requests[n + 1..];
            if let Some(next) = later.iter().find(|r| r.operation == Operation::Get) {
                if next.sent + SOON < aim {
                    out.push(format!(
                        "looked too soon: client {}'s wait for {} saw it held until {expires:?} \
                         (at {:?}) and looked again at {:?}, before its takeover moment \
                         ({aim:?})",
                        w.client, w.key, look.sent, next.sent
                    ));
                }
            }
            let due = aim + LOOK_SPREAD + LATE;
            if due >= end {
                continue;
            }
            let grace_end = expiry + chrono::TimeDelta::seconds(1);
            let freed = super::observe::lease_moved(journal, w.key, seen.at, grace_end);
            let slow = later
                .iter()
                .chain(std::iter::once(look))
                .filter(|r| r.sent <= due)
                .any(|r| {
                    r.answer.as_ref().is_none_or(|o| {
                        o.at > r.sent + Duration::from_millis(200)
                            || !matches!(o.status, 200 | 201 | 409)
                    })
                });
            if freed || slow || touched(run, w.client, look.sent, due) {
                continue;
            }
            let from = expires + Duration::from_secs(1);
            if !later.iter().any(|r| r.sent >= from && r.sent <= due) {
                out.push(format!(
                    "missed the takeover: client {}'s wait for {} saw it held until \
                     {expires:?} (at {:?}); it ran out undisturbed, and the waiter sent nothing \
                     from {from:?} to {due:?}",
                    w.client, w.key, look.sent
                ));
            }
        }
    }
}

/// Whether a 429 to any request of `client`, answered by `by`, asked for
/// quiet until `from` or later.
pub(super) fn quiet_from(run: &Run<'_>, client: usize, from: Duration, by: Duration) -> bool {
    run.server.sent.attempts.iter().any(|q| {
        q.client == client
            && q.answer.as_ref().is_some_and(|o| {
                o.status == 429
                    && o.at <= by
                    && o.at + o.retry_after.unwrap_or_default() + super::cadence::PAUSE_SLACK
                        >= from
            })
    })
}
