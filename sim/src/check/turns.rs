//! Waiters of one client on one key take turns: twenty tasks of a process
//! waiting for one key cost the project what one does. The one behind
//! sends nothing while the one ahead is in line, but a try of its own
//! just before its deadline; it tries as soon as its turn comes; and when
//! its own client frees the key during its turn, it tries at once rather
//! than wait out its pause.

use std::time::Duration;

use super::run::Run;
use crate::log::{Event, Waiting};
use volcano_mock_server::Operation;

use crate::net::Attempt;

/// How late a request prompted at once may go out: a tick or two of the
/// simulation, and the answer's processing.
const AT_ONCE: Duration = Duration::from_millis(150);
/// How long before its deadline the one behind makes its try of its own
/// (the SDK's lead is half a second), with a tick to spare.
const LAST_TRY: Duration = Duration::from_millis(520);

/// One waiter behind another, as the run shows it.
struct Behind<'a> {
    client: usize,
    key: &'a str,
    request_id: &'a str,
    /// When it joined the line.
    from: Duration,
    /// When the one ahead left the line (its wait's outcome).
    turn: Duration,
    /// When its wait ended: granted, its deadline, its operation ended.
    end: Duration,
    until: Duration,
    /// Its tries (one request id), and the client's looks at the key from
    /// its turn on, in the order sent.
    requests: Vec<&'a Attempt>,
}

fn behind_waiters<'a>(run: &Run<'a>) -> Vec<Behind<'a>> {
    let mut out = Vec::new();
    for (b, e) in run.events.iter().enumerate() {
        let Event::Behind {
            client,
            key,
            request_id,
            until,
        } = &e.event
        else {
            continue;
        };
        // The one ahead: the operation under way, waiting since it began.
        let Some(ahead) = run.events[..b].iter().rposition(|x| {
            matches!(&x.event, Event::Waits { client: c, key: k, how: Waiting::Acquire, .. }
                if c == client && k == key)
        }) else {
            continue;
        };
        // It left the line when its acquire was granted, or with its
        // outcome (a failure, its deadline).
        let ahead_at = run.events[ahead].at;
        let ahead_tries = run.server.sent.attempts.iter().find(|a| {
            a.client == *client
                && a.key == *key
                && a.operation == Operation::Acquire
                && a.sent >= ahead_at
        });
        let turn = run
            .outcome_after(ahead, *client)
            .map_or(Duration::MAX, |o| o.at)
            .min(ahead_tries.map_or(Duration::MAX, |a| granted(run, &a.request_id)))
            .max(e.at);
        // Its own outcome, its host's crash, or its operation's end (a
        // dropped one).
        let ended = run.events[b..]
            .iter()
            .find(|x| {
                matches!(x.event,
                    Event::BehindEnded { client: c }
                    | Event::Crashed { client: c }
                    | Event::StepEnded { client: c } if c == *client)
            })
            .map_or(Duration::MAX, |x| x.at);
        let end = granted(run, request_id).min(*until).min(ended);
        let requests = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| {
                (a.client == *client
                    && a.operation == Operation::Acquire
                    && a.request_id == *request_id)
                    || (a.client == *client
                        && &a.key == key
                        && a.operation == Operation::Get
                        && a.sent >= turn)
            })
            .collect();
        out.push(Behind {
            client: *client,
            key,
            request_id,
            from: e.at,
            turn,
            end,
            until: *until,
            requests,
        });
    }
    out
}

/// When each waiter behind another (by its request id) had its turn: a
/// try of its sent at once then is a new try, not a retry.
pub(super) fn turns(run: &Run<'_>) -> Vec<(String, Duration)> {
    behind_waiters(run)
        .into_iter()
        .map(|w| (w.request_id.to_owned(), w.turn))
        .collect()
}

/// When an acquire (its request id) was first answered with a grant.
fn granted(run: &Run<'_>, request_id: &str) -> Duration {
    run.server
        .sent
        .attempts
        .iter()
        .filter(|a| a.operation == Operation::Acquire && a.request_id == request_id)
        .filter_map(|a| a.answer.as_ref().filter(|o| o.status < 300))
        .map(|o| o.at)
        .min()
        .unwrap_or(Duration::MAX)
}

/// Whether one of `requests` was sent by `at` and not yet ended then:
/// the next is due after its answer.
fn in_flight(requests: &[&Attempt], at: Duration) -> Option<Duration> {
    requests
        .iter()
        .filter(|a| a.sent <= at)
        .filter_map(|a| {
            let ended = a.answer.as_ref().map(|o| o.at).or(a.failed);
            match ended {
                Some(t) if t <= at => None,
                Some(t) => Some(t),
                None => Some(Duration::MAX),
            }
        })
        .max()
}

/// The next request after `at` is sent at once (or at once after the
/// answer to one in flight then), unless the wait ended first.
fn sends_at_once(w: &Behind<'_>, at: Duration) -> Result<(), Option<Duration>> {
    let due = in_flight(&w.requests, at).unwrap_or(at);
    if due == Duration::MAX || due + AT_ONCE >= w.end {
        return Ok(());
    }
    match w.requests.iter().map(|a| a.sent).find(|sent| *sent >= at) {
        Some(sent) if sent <= due + AT_ONCE => Ok(()),
        next => Err(next),
    }
}

/// The one behind never sends while the one ahead is in line, but its
/// own try in the last moments before its deadline.
pub(super) fn wait_their_turn(run: &Run<'_>, out: &mut Vec<String>) {
    for w in behind_waiters(run) {
        let early = w.requests.iter().find(|a| {
            a.operation == Operation::Acquire
                && a.sent >= w.from
                && a.sent < w.turn
                && a.sent + LAST_TRY < w.until
        });
        if let Some(a) = early {
            out.push(format!(
                "turns: client {}'s waiter behind another on {} sent a try at {:?}, while the one \
                 ahead was still in line (until {:?}), {:?} before its own deadline",
                w.client,
                w.key,
                a.sent,
                w.turn,
                w.until - a.sent
            ));
        }
    }
}

/// The one behind tries as soon as its turn comes, and at once when its
/// own client frees the key during its turn. Not judged where a fault
/// touched its client (a suspended host's timers fire late).
pub(super) fn take_their_turn(run: &Run<'_>, out: &mut Vec<String>) {
    for w in behind_waiters(run) {
        if w.turn >= w.end {
            continue;
        }
        let mut prompts = vec![(w.turn, "its turn came")];
        prompts.extend(
            run.server
                .sent
                .attempts
                .iter()
                .filter(|r| {
                    r.client == w.client
                        && r.key == w.key
                        && matches!(r.operation, Operation::Release | Operation::ForceRelease)
                })
                .filter_map(|r| r.answer.as_ref().filter(|o| o.status == 204))
                .map(|o| o.at)
                .filter(|t| *t > w.turn && *t < w.end)
                .map(|t| (t, "its client freed the key")),
        );
        for (at, why) in prompts {
            if super::aim::touched(run, w.client, at.saturating_sub(AT_ONCE), w.end) {
                continue;
            }
            if let Err(next) = sends_at_once(&w, at) {
                out.push(format!(
                    "turns: client {}'s waiter behind another on {} did not try at once when \
                     {why} at {at:?}: its next request went at {next:?} (its wait lasted until \
                     {:?})",
                    w.client, w.key, w.end
                ));
            }
        }
    }
}
