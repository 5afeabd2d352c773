//! A wait for a permit, paced as DESIGN.md §17 says: after a round in
//! which every permit it tried was held, the next round goes after the
//! ramp's step (30 % of the time waited, 0.3 s at least, the poll interval
//! at most, jittered down by up to a tenth), neither sooner nor much
//! later, and rounds go on until the wait's last moment; a permit its own
//! client frees ends that pause at once, and that permit is tried first.
//!
//! `check/semaphore.rs` judges what a wait may say and that it finds a
//! permit free for a whole rotation; these judge what it costs the
//! project's quota and how soon it notices its own client's release.
//! Judged on exact clocks only, where no fault touched the client's host
//! and no 429 asked its client for quiet (the wait then pauses past it).

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;
use crate::net::Attempt;

/// How much later than its pause a request may go out: a tick or two and
/// the answer's processing.
const LATE: Duration = Duration::from_millis(150);
/// How much sooner: timers fire on ticks.
const SOON: Duration = Duration::from_millis(5);
/// A wait's last round goes this long before its deadline at the latest
/// (half the SDK's `LAST_TRY_LEAD`).
const LAST_CALL: Duration = Duration::from_millis(250);
/// A wait's first round tries this many permits; later rounds one.
const FIRST_ROUND: usize = 2;

/// The ramp's step after `waited`: 30 % of it, 0.3 s at least, the poll
/// interval at most (the SDK's `RAMP_RATIO`, `RAMP_FLOOR`).
fn step(waited: Duration, poll: Duration) -> Duration {
    waited.mul_f64(0.3).clamp(
        Duration::from_millis(300),
        poll.max(Duration::from_millis(300)),
    )
}

/// One wait for a permit and the requests it made.
struct Wait<'a> {
    client: usize,
    name: &'a str,
    began: Duration,
    until: Duration,
    poll: Duration,
    /// Whether it ended saying every permit stayed taken.
    held: bool,
    /// Its acquires, one per request id (a retry is of the same request),
    /// in the order sent: the first attempt and the last.
    requests: Vec<(&'a Attempt, &'a Attempt)>,
}

/// The waits for a permit that ended by themselves (not dropped, not
/// crashed), with their requests.
fn waits<'a>(run: &Run<'a>) -> Vec<Wait<'a>> {
    let mut found = Vec::new();
    for (i, e) in run.events.iter().enumerate() {
        let Event::PermitWait {
            client,
            name,
            until,
            poll,
            ..
        } = &e.event
        else {
            continue;
        };
        let Some((ended, Some(held))) = super::semaphore::wait_end(run, i, *client) else {
            continue;
        };
        let prefix = format!("{name}:");
        let mut requests: Vec<(&Attempt, &Attempt)> = Vec::new();
        for a in run.server.sent.attempts.iter().filter(|a| {
            a.client == *client
                && a.operation == Operation::Acquire
                && a.key.starts_with(&prefix)
                && a.sent >= e.at
                && a.sent <= ended
        }) {
            match requests
                .iter_mut()
                .find(|(first, _)| first.request_id == a.request_id)
            {
                Some((_, last)) => *last = a,
                None => requests.push((a, a)),
            }
        }
        found.push(Wait {
            client: *client,
            name,
            began: e.at,
            until: *until,
            poll: *poll,
            held,
            requests,
        });
    }
    found
}

/// When a request's last attempt was answered 409 by the service (its
/// envelope, not a proxy's page), without a `Retry-After`.
fn held_at(a: &Attempt) -> Option<Duration> {
    a.answer
        .as_ref()
        .filter(|o| o.status == 409 && o.json && o.retry_after.is_none())
        .map(|o| o.at)
}

/// Whether `client` freed a permit of `name` itself (a release or force
/// release answered) in `(from, to]`: when and which.
fn freed_by_itself(
    run: &Run<'_>,
    client: usize,
    name: &str,
    from: Duration,
    to: Duration,
) -> Option<(Duration, String)> {
    let prefix = format!("{name}:");
    run.server.sent.attempts.iter().find_map(|a| {
        let o = a.answer.as_ref()?;
        (a.client == client
            && matches!(a.operation, Operation::Release | Operation::ForceRelease)
            && a.key.starts_with(&prefix)
            && o.status == 204
            && o.at > from
            && o.at <= to)
            .then(|| (o.at, a.key.clone()))
    })
}

/// Whether the wait's client freed a permit itself (a release or force
/// release answered) by `to` and after the wait's last attempt on that
/// permit before `to` (after the wait began, if it never tried it): news
/// the wait acts on at once. One freed before an attempt on it went is
/// no news (permits seed 648: a try's undo answered before the next
/// round's retry).
fn news_to_the_wait(run: &Run<'_>, w: &Wait<'_>, to: Duration) -> bool {
    let prefix = format!("{}:", w.name);
    let last_tried = |key: &str| {
        w.requests
            .iter()
            .filter(|(first, _)| first.key == key)
            .map(|(_, last)| last.sent)
            .filter(|&sent| sent < to)
            .max()
            .unwrap_or(w.began)
    };
    run.server.sent.attempts.iter().any(|a| {
        a.answer.as_ref().is_some_and(|o| {
            a.client == w.client
                && matches!(a.operation, Operation::Release | Operation::ForceRelease)
                && a.key.starts_with(&prefix)
                && o.status == 204
                && o.at <= to
                // (A release answered in the tick its attempt went may
                // be counted after it: news.)
                && o.at >= last_tried(&a.key)
        })
    })
}

/// Whether the stretch is not judged: a fault touched the client's host,
/// or a 429 to any of its requests asked for quiet within it.
fn excused(run: &Run<'_>, w: &Wait<'_>, from: Duration, to: Duration) -> bool {
    super::aim::touched(
        run,
        w.client,
        w.began.saturating_sub(Duration::from_secs(15)),
        to,
    ) || super::aim::quiet_from(run, w.client, from, to)
}

/// After a round whose every permit was held, the next round goes after
/// the ramp's step, jittered down by at most a tenth, or at the wait's
/// last call; and a wait that says every permit stayed taken kept trying
/// until its last call.
pub(super) fn permit_waits_paced(run: &Run<'_>, out: &mut Vec<String>) {
    // Timed on the host's clock.
    if run.clock_rate != 1.0 {
        return;
    }
    for w in waits(run) {
        let last_call = w.until.saturating_sub(LAST_CALL);
        // Rounds after the first: one request each.
        for k in FIRST_ROUND..w.requests.len() {
            let (_, before) = w.requests[k - 1];
            let Some(t) = held_at(before) else { break };
            let (next, _) = w.requests[k];
            if excused(run, &w, t, next.sent) || t >= last_call {
                break;
            }
            let step = step(t.saturating_sub(w.began), w.poll);
            let due = (t + step).min(last_call);
            let soonest = (t + step.mul_f64(0.9)).min(last_call).saturating_sub(SOON);
            // Freed by its own client since the wait last tried it (also
            // while that try was in flight: 16-client seed 11), the
            // permit is tried at once.
            let woken = news_to_the_wait(run, &w, next.sent);
            if (next.sent < soonest && !woken) || next.sent > due + LATE {
                out.push(format!(
                    "permit wait off its ramp: client {}'s wait for {} (poll {:?}, from {:?}) had \
                     every permit held at {t:?}, {:?} into it: its next round was due from \
                     {soonest:?} to {:?}, and went at {:?}",
                    w.client,
                    w.name,
                    w.poll,
                    w.began,
                    t.saturating_sub(w.began),
                    due + LATE,
                    next.sent
                ));
                break;
            }
        }
        // Said "every permit taken": its last round went at its last call,
        // or a step before it.
        if !w.held {
            continue;
        }
        let Some(&(_, last)) = w.requests.last() else {
            continue;
        };
        let Some(t) = held_at(last) else { continue };
        let step = step(t.saturating_sub(w.began), w.poll);
        if t + step + LATE < last_call && !excused(run, &w, t, w.until) {
            out.push(format!(
                "permit wait gave up early: client {}'s wait for {} (until {:?}, poll {:?}) said \
                 every permit stayed taken, but its last round was answered at {t:?}, a step of \
                 {step:?} before its last call at {last_call:?}",
                w.client, w.name, w.until, w.poll
            ));
        }
    }
}

/// A permit the waiting client frees itself (a release answered) while its
/// wait pauses between rounds ends the pause at once: the next round goes
/// within a moment, and tries that permit first.
pub(super) fn own_release_wakes_the_wait(run: &Run<'_>, out: &mut Vec<String>) {
    // Timed on the host's clock.
    if run.clock_rate != 1.0 {
        return;
    }
    for w in waits(run) {
        for k in 1..w.requests.len() {
            let (_, before) = w.requests[k - 1];
            let Some(t) = before.answer.as_ref().map(|o| o.at) else {
                break;
            };
            let (next, _) = w.requests[k];
            let Some((freed_at, key)) = freed_by_itself(run, w.client, w.name, t, next.sent) else {
                continue;
            };
            if excused(run, &w, t, next.sent) || held_at(before).is_none() {
                break;
            }
            // Within a round, the next permit goes at once anyway.
            if k < FIRST_ROUND || freed_at >= w.until.saturating_sub(LAST_CALL) {
                continue;
            }
            if next.sent > freed_at + LATE || next.key != key {
                out.push(format!(
                    "permit wait not woken: client {} freed {key} at {freed_at:?} while its wait \
                     for {} paused (since {t:?}); its next round went at {:?}, for {}",
                    w.client, w.name, next.sent, next.key
                ));
            }
            break;
        }
    }
}

/// A wait's first round tries two permits back to back (the second within
/// a moment of the first's 409, unless its deadline is that near); and no
/// round goes before the `Retry-After` of the answer that ended the last
/// one (at most a minute), nor while a 429 to any request of its client
/// names quiet.
pub(super) fn permit_waits_hold_back(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    let max_pause = Duration::from_secs(60);
    for w in waits(run) {
        let say = |what: String| {
            format!(
                "permit wait: client {}'s wait for {} (from {:?}, until {:?}) {what}",
                w.client, w.name, w.began, w.until
            )
        };
        // The first round's second try.
        if let (Some(&(_, first)), Some(&(second, _))) = (w.requests.first(), w.requests.get(1)) {
            if let Some(t) = held_at(first) {
                let room = w.until.saturating_sub(t) > Duration::from_millis(400);
                if room && second.sent > t + LATE && !excused(run, &w, t, second.sent) {
                    out.push(say(format!(
                        "tried one permit, held at {t:?}, and the next only at {:?}: its first \
                         round tries two",
                        second.sent
                    )));
                }
            }
        }
        // Each try answers by the deadline: its timeout at most half of
        // what is left (a try and its single retry fit), 100 ms at least.
        if let Some(&(a, _)) = w.requests.iter().find(|(a, _)| {
            let half = (w.until.saturating_sub(a.sent) / 2).max(Duration::from_millis(100));
            a.timeout > half + Duration::from_millis(5)
        }) {
            out.push(say(format!(
                "sent a try of {} at {:?} with a timeout of {:?}, past half of what was left",
                a.key, a.sent, a.timeout
            )));
        }
        for k in 1..w.requests.len() {
            let (_, before) = w.requests[k - 1];
            let (next, _) = w.requests[k];
            let told = before.answer.as_ref().and_then(|o| {
                let after = o.retry_after.filter(|_| matches!(o.status, 429 | 503))?;
                Some((o.at, o.at + after.min(max_pause)))
            });
            // (Its last round goes at its last call, told or not.)
            let last_call = w.until.saturating_sub(LAST_CALL);
            let early = |until: &Duration| next.sent + SOON < (*until).min(last_call);
            if let Some((at, until)) = told.filter(|(_, until)| early(until)) {
                out.push(say(format!(
                    "was told at {at:?} to wait until {until:?}, and tried {} at {:?}",
                    next.key, next.sent
                )));
                break;
            }
            // A round after the first pauses past the quiet its client
            // knew of when the round before ended.
            let Some(ended) = before.answer.as_ref().map(|o| o.at).or(before.failed) else {
                continue;
            };
            let quiet = run.server.sent.attempts.iter().find_map(|q| {
                let o = q.answer.as_ref().filter(|o| o.status == 429)?;
                let until = o.at + o.retry_after?.min(max_pause);
                (k >= FIRST_ROUND && q.client == w.client && o.at <= ended && early(&until))
                    .then_some((o.at, until))
            });
            if let Some((at, until)) = quiet {
                out.push(say(format!(
                    "tried {} at {:?}, though a 429 to its client at {at:?} named quiet until \
                     {until:?}",
                    next.key, next.sent
                )));
                break;
            }
        }
    }
}
