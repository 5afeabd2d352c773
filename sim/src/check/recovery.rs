//! A key freed goes to a live waiter. Freed by a crash: once the crashed
//! holder's lease has expired on the server, a program that was waiting
//! for the key all along gets it within the grace and a little slack.
//! Freed by a graceful release: a program that was waiting for the key
//! (with a deadline) gets it within 30 % of the time it had waited (at
//! least 0.3 s, at most its poll interval) and two round trips.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::{Run, Server};
use crate::log::{Event, Stamped, Waiting};

/// The server's grace after an expiry, before another token may take the
/// key, plus what a waiter needs to notice (it looks at the holder at the
/// takeover moment, up to 0.6 s later) and two round trips.
const BOUND_AFTER_EXPIRY: Duration = Duration::from_millis(3_500);

/// Beliefs of crashed programs still open at their crash; for each, if a
/// live program waited for the key from before the lease's expiry until
/// past the bound, someone other than the crashed holder must have taken
/// the key by then. Runs where anything else could delay it (a fault, a
/// force-release, a server clock jump) are not judged.
pub(super) fn after_crash(run: &Run<'_>, out: &mut Vec<String>) {
    let events = run.events;
    for (crashed, at) in events.iter().filter_map(|e| match e.event {
        Event::Crashed { client } => Some((client, e.at)),
        _ => None,
    }) {
        for b in run
            .beliefs
            .iter()
            .filter(|b| b.client == crashed && b.to == at)
        {
            let Some(expired) = expiry(run, &b.key, b.fence) else {
                continue;
            };
            let base = expired + BOUND_AFTER_EXPIRY;
            let Some(waiter) = waiter(events, &b.key, crashed, expired, base) else {
                continue;
            };
            // The waiter's own round trips (its link may have been slowed
            // before the crash): a try in flight, a look, the try that
            // takes it. Not judged if one went unanswered or paused it.
            let horizon = base + Duration::from_secs(1);
            let Some(round_trip) = longest_round_trip(run.server, waiter, at, horizon) else {
                continue;
            };
            let bound = base + round_trip * 3;
            // ... and no slower, nor paused, up to that bound.
            match longest_round_trip(run.server, waiter, at, bound) {
                Some(longest) if longest <= round_trip => {}
                _ => continue,
            }
            // Judged on the stretch after the crash: the crash itself is
            // what is judged, and faults of other hosts do not reach the
            // waiter. The server's own faults reach everyone.
            let disturbed = events.iter().any(|e| {
                e.at >= at
                    && e.at <= bound
                    && match &e.event {
                        Event::Fault { what } => !what.contains("client-") || touches(what, waiter),
                        Event::Crashed { client } => *client == waiter,
                        _ => false,
                    }
            });
            let still_waiting = self::waiter(events, &b.key, crashed, expired, bound).is_some();
            // A server clock jump since the waiter last looked moves the
            // takeover moment it knows: not judged (a ttl before expiry).
            let looked_since = expired.saturating_sub(Duration::from_secs(13));
            if disturbed || !still_waiting || run.breaks.any(&b.key, looked_since, bound) {
                continue;
            }
            let granted = run
                .grants
                .iter()
                .any(|g| g.key == b.key && g.fence != b.fence && g.at >= at && g.at <= bound);
            let taken = granted
                || events.iter().any(|e| {
                    e.at >= at
                        && e.at <= bound
                        && match &e.event {
                            Event::Believes { key, fence, .. }
                            | Event::Leased { key, fence, .. } => {
                                *key == b.key && *fence != b.fence
                            }
                            _ => false,
                        }
                });
            if !taken {
                out.push(format!(
                    "crash recovery: {} was freed by client {crashed}'s crash (its lease \
                     expired at {expired:?}), but client {waiter}, waiting for it, did not \
                     get it by {bound:?}",
                    b.key
                ));
            }
        }
    }
}

/// The latest expiry the server granted the lease `fence` of `key`.
fn expiry(run: &Run<'_>, key: &str, fence: i64) -> Option<Duration> {
    run.server
        .journal
        .iter()
        .filter(|r| r.key == key && r.fencing_token == Some(fence))
        .filter(|r| matches!(r.operation, Operation::Acquire | Operation::Renew))
        .filter(|r| matches!(r.status, Some(200 | 201)))
        .filter_map(|r| r.expires_at)
        .max()
        .map(|e| run.sim_time(e))
}

/// Whether the fault described by `what` names `client`'s host.
pub(super) fn touches(what: &str, client: usize) -> bool {
    let host = crate::client_name(client);
    what.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .any(|word| word == host)
}

/// A program other than `crashed` whose wait for `key` (a waiting acquire
/// or a leader's campaign: a set waits for its keys one by one) began
/// before `expired` and lasts past `bound`, with its operation still
/// running then.
fn waiter(
    events: &[Stamped],
    key: &str,
    crashed: usize,
    expired: Duration,
    bound: Duration,
) -> Option<usize> {
    events.iter().enumerate().find_map(|(i, e)| match &e.event {
        Event::Waits {
            client, key: k, until, how, ..
        }
            if *client != crashed
                && k == key
                && *how != Waiting::Set
                && e.at <= expired
                && *until >= bound =>
        {
            let ended_early = events[i + 1..].iter().any(|later| {
                later.at <= bound
                    && matches!(&later.event, Event::StepEnded { client: c } | Event::Crashed { client: c } if c == client)
            });
            (!ended_early).then_some(*client)
        }
        _ => None,
    })
}

/// A tick or two, past the waiter's bound and its round trips.
const PICKUP_SLACK: Duration = Duration::from_millis(100);

/// The longest round trip of `client`'s requests in flight at some time
/// from `from` to `to`, or `None` if one of them got no answer, or one a
/// waiter pauses on (a 429, a 5xx: injected faults, or the quota).
fn longest_round_trip(
    server: &Server,
    client: usize,
    from: Duration,
    to: Duration,
) -> Option<Duration> {
    let mut longest = Duration::ZERO;
    for a in &server.sent.attempts {
        // Over before `from`: answered, or given up (the simulation's
        // request timeout is 10 s).
        let over = match &a.answer {
            Some(o) => o.at < from,
            None => a.sent + Duration::from_secs(10) < from,
        };
        if a.client != client || a.sent > to || over {
            continue;
        }
        let answer = a.answer.as_ref()?;
        if !matches!(answer.status, 200 | 201 | 204 | 409) {
            return None;
        }
        longest = longest.max(answer.at.saturating_sub(a.sent));
    }
    Some(longest)
}

/// After every graceful release (a guard's scope or hold released), a
/// program waiting for the key since `began`, with a deadline, takes it
/// (or someone does) within max(0.3 s, 30 % of the time waited) capped at
/// its poll interval, plus three of its round trips (a try in flight at
/// the release, a look, the try that takes it) as the network gave them.
/// Not judged when anything else could delay it: a request of the
/// waiter's that got no answer or a 429 or 5xx (faults reach it only
/// through its requests, and slow ones lengthen the round trips allowed),
/// a 429 to any request of its client asking for quiet then, a force
/// release, a server clock jump.
pub(super) fn after_release(run: &Run<'_>, out: &mut Vec<String>) {
    let (events, server) = (run.events, run.server);
    for released in events
        .iter()
        .filter(|e| matches!(&e.event, Event::Ended { why, .. } if why == "Released"))
    {
        let Event::Ended {
            client: holder,
            key,
            ..
        } = &released.event
        else {
            continue;
        };
        // When the release was applied at the latest: the answer (204) to
        // the holder's release of the key sent after its scope ended. No
        // such answer: the release did not happen (a partition, a refusal).
        let applied = server.sent.attempts.iter().find(|a| {
            a.client == *holder
                && a.operation == Operation::Release
                && a.key == *key
                && a.sent >= released.at
                && a.answer.as_ref().is_some_and(|o| o.status == 204)
        });
        let Some(t) = applied.and_then(|a| a.answer.as_ref()).map(|o| o.at) else {
            continue;
        };
        if t > released.at + Duration::from_secs(10) {
            continue;
        }
        for (i, wait) in events.iter().enumerate() {
            let Event::Waits {
                client,
                key: k,
                until,
                how: Waiting::Acquire,
                poll,
            } = &wait.event
            else {
                continue;
            };
            let began = wait.at;
            if client == holder || k != key || began >= t {
                continue;
            }
            let bound = (t - began)
                .mul_f64(0.3)
                .max(Duration::from_millis(300))
                .min(*poll);
            let horizon = t + bound + Duration::from_secs(10);
            let Some(round_trip) = longest_round_trip(server, *client, began, horizon) else {
                continue;
            };
            let by = t + bound + round_trip * 3 + PICKUP_SLACK;
            if *until < by {
                continue;
            }
            let later = &events[i + 1..];
            // Still waiting at the release, and for the whole bound.
            let waiting = !later.iter().any(|e| {
                e.at <= by
                    && match &e.event {
                        Event::StepEnded { client: c } | Event::Crashed { client: c } => {
                            c == client
                        }
                        Event::Believes {
                            client: c, key: kk, ..
                        }
                        | Event::Leased {
                            client: c, key: kk, ..
                        } => c == client && kk == key && e.at <= t,
                        _ => false,
                    }
            });
            // Faults reach the waiter through its requests, judged above
            // by their answers; a crash of the waiter ended its step.
            // Nor while a 429 to any request of its client asked for
            // quiet (one answered just before the wait began: 16-client
            // seed 306).
            if !waiting
                || run.breaks.any(key, began, by)
                || super::aim::quiet_from(run, *client, began, by)
            {
                continue;
            }
            // Taken: granted to anyone (a set holding some of its keys
            // has not said so yet), or believed held.
            let granted = run
                .grants
                .iter()
                .any(|g| g.key == *key && g.at > released.at && g.at <= by);
            let taken = granted || later.iter().any(|e| {
                e.at > released.at
                    && e.at <= by
                    && matches!(&e.event, Event::Believes { key: kk, .. } | Event::Leased { key: kk, .. } if kk == key)
            });
            if !taken {
                out.push(format!(
                    "slow pickup: client {holder} released {key} at {t:?}; client {client}, \
                     waiting since {began:?} (poll {poll:?}), did not get it by {by:?}"
                ));
            }
        }
    }
}
