//! Leaders: capped terms (`max_hold`) share the key, after a term ends
//! by its cap, its leader campaigns again no sooner than its poll
//! interval, the time every other candidate takes to try (a leader that
//! campaigns again at once wins every time and the cap shares nothing);
//! and a leader's status says whether the service answers its campaign.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::{Event, Waiting};
use crate::net::Attempt;

/// Leeway: a tick or two of the simulation.
const SLACK: Duration = Duration::from_millis(60);

/// After a term ended by its cap (`MaxHold`), the leader's next acquire
/// of the key comes at least its poll interval later.
pub(super) fn makes_way(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::Ended {
            client, key, why, ..
        } = &e.event
        else {
            continue;
        };
        if why != "MaxHold" {
            continue;
        }
        // The campaign it belongs to: the client's latest wait, if it is a
        // leader's on this key.
        let campaign = run.events[..i].iter().rev().find_map(|w| match &w.event {
            Event::Waits {
                client: c,
                key: k,
                how,
                poll,
                ..
            } if c == client => Some((k == key && *how == Waiting::Campaign, *poll)),
            _ => None,
        });
        let Some((true, poll)) = campaign else {
            continue;
        };
        // Within the campaign: once `until` fires, its step ends and the
        // next step may acquire the key at once.
        let step_ended = run.step_ended(i, *client);
        let next = run.server.sent.attempts.iter().find(|a| {
            a.client == *client
                && a.key == *key
                && a.operation == Operation::Acquire
                && a.sent > e.at
                && a.sent < step_ended
        });
        if let Some(next) = next.filter(|a| a.sent + SLACK < e.at + poll) {
            out.push(format!(
                "leader did not make way: client {client}'s term on {key} ended by its cap at \
                 {:?}, and it campaigned again at {:?}, sooner than its poll interval ({poll:?})",
                e.at, next.sent
            ));
        }
        // ... and no later than 1.2 poll intervals after its term's release
        // ended (a pause of one to 1.2 intervals), unless its host was
        // touched meanwhile.
        let released = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| {
                a.client == *client
                    && a.key == *key
                    && a.operation == Operation::Release
                    && a.sent + SLACK >= e.at
                    && next.is_none_or(|n| a.sent <= n.sent)
            })
            .filter_map(|a| ended(a).map(|(end, _)| end))
            .max();
        let Some(released) = released else { continue };
        let due = released + poll.mul_f64(1.2) + SLACK;
        let touched = super::aim::touched(run, *client, e.at, due);
        if !touched && due < step_ended && next.is_none_or(|n| n.sent > due) {
            out.push(format!(
                "leader kept away: client {client}'s term on {key} ended by its cap at {:?}, its \
                 release ended at {released:?}, and it had not campaigned again by {due:?} (poll \
                 {poll:?})",
                e.at
            ));
        }
    }
}

/// When an attempt's end came, and its status (`None`: no answer).
fn ended(a: &Attempt) -> Option<(Duration, Option<u16>)> {
    match (&a.answer, a.failed) {
        (Some(o), _) => Some((o.at, Some(o.status))),
        // An answer it could not read: answered all the same.
        (None, Some(failed)) if a.garbled.is_some() => Some((failed, a.garbled)),
        (None, Some(failed)) => Some((failed, None)),
        (None, None) => None,
    }
}

/// How long after its first attempt failed the single retry is sent, at
/// most (at once; a new try waits a ramp step, far longer).
const AT_ONCE: Duration = Duration::from_millis(20);

/// The tries of a campaign's acquire attempts (sent in order): when each
/// ended and whether the service answered it about the lock
/// (`Some(true)`: a status under 500, to a first attempt; a 409 or a
/// grant to the retry), or not (`Some(false)`: no answer or a 5xx, to
/// the last attempt), or cannot be told (`None`: a retry after a failed
/// connection answered 429 or a refusal, or one after any other failure:
/// the first attempt's outcome stands or not, by how the first failed).
/// Tries whose attempts took more than a second are left out.
fn tries(attempts: &[&Attempt]) -> Vec<(Duration, Option<bool>)> {
    // Only an attempt that ended within a second of being sent: a late
    // answer can come after its client gave up on it.
    let ended_soon =
        |a: &Attempt| ended(a).filter(|(end, _)| *end <= a.sent + Duration::from_secs(1));
    let mut out = Vec::new();
    let mut k = 0;
    while k < attempts.len() {
        let Some((end, status)) = ended_soon(attempts[k]) else {
            // Left out, and so is its retry (whose outcome cannot be told
            // without it).
            let late = ended(attempts[k]).map(|(end, _)| end);
            let retried = attempts.get(k + 1).is_some_and(|next| {
                next.request_id == attempts[k].request_id
                    && late.is_some_and(|end| next.sent <= end + AT_ONCE)
            });
            k += if retried { 2 } else { 1 };
            continue;
        };
        let retry = attempts.get(k + 1).filter(|next| {
            next.request_id == attempts[k].request_id
                && (matches!(status, None | Some(503)) || attempts[k].garbled.is_some())
                && next.sent <= end + AT_ONCE
        });
        match retry.and_then(|r| ended_soon(r)) {
            Some((end, status)) => {
                let answered = match status {
                    Some(200..=299 | 409) => Some(true),
                    None | Some(500..) => Some(false),
                    Some(_) => None,
                };
                out.push((end, answered));
                k += 2;
            }
            None if retry.is_some() => k += 2,
            None => {
                out.push((end, Some(status.is_some_and(|s| s < 500))));
                k += 1;
            }
        }
    }
    out
}

/// A leader says it is unreachable when its campaign's tries go
/// unanswered, and stops saying so once one is answered: a tick after a
/// try ends (when no other attempt ended meanwhile), an unanswered one
/// leaves it not following, an answered one not unreachable.
pub(super) fn says_unreachable(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::Waits {
            client,
            key,
            how: Waiting::Campaign,
            ..
        } = &e.event
        else {
            continue;
        };
        let step_ended = run.step_ended(i, *client);
        // What the status said, and from when, within the step.
        let says: Vec<(Duration, &str)> = run.events[i..]
            .iter()
            .take_while(|later| later.at <= step_ended)
            .filter_map(|later| match &later.event {
                Event::LeaderSays {
                    client: c,
                    key: k,
                    status,
                } if c == client && k == key => Some((later.at, *status)),
                _ => None,
            })
            .collect();
        let said_at = |t: Duration| says.iter().rev().find(|(at, _)| *at <= t).map(|(_, s)| *s);
        let attempts: Vec<&Attempt> = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| a.client == *client && a.key == *key && a.operation == Operation::Acquire)
            .filter(|a| a.sent >= e.at && a.sent < step_ended)
            .collect();
        let ends: Vec<Duration> = attempts
            .iter()
            .filter_map(|a| ended(a))
            .map(|(t, _)| t)
            .collect();
        for (at, answered) in tries(&attempts) {
            let then = at + SLACK;
            if then >= step_ended || ends.iter().any(|t| *t > at && *t <= then) {
                continue;
            }
            let wrong = match (answered, said_at(then)) {
                (Some(true), Some("unreachable")) => "an answered try",
                (Some(false), Some("following")) => "an unanswered try",
                _ => continue,
            };
            out.push(format!(
                "leader status: client {client}'s campaign on {key} said {:?} at {then:?}, after \
                 {wrong} ended at {at:?}",
                said_at(then).unwrap_or_default()
            ));
        }
    }
}

/// A leader with a drain steps down as [`volcano::Leader::drain`] says:
/// once its `until` fired, the running term is told
/// (`stepping_down()`), is not dropped before the drain ran out unless it
/// returned or its lock was lost, is dropped by then at the latest, and
/// its lease is not released while it still runs.
pub(super) fn drains(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::UntilFired { client, key, drain } = &e.event else {
            continue;
        };
        if drain.is_zero() {
            continue;
        }
        let fired = e.at;
        // The term running then: the next one of this candidate to end.
        let Some((done_at, fence, returned)) =
            run.events[i..].iter().find_map(|later| match &later.event {
                Event::TermDone {
                    client: c,
                    key: k,
                    fence,
                    returned,
                } if c == client && k == key => Some((later.at, *fence, *returned)),
                _ => None,
            })
        else {
            continue;
        };
        // That term began before `until` fired (else no term ran then).
        let began = run.events[..i].iter().any(|earlier| {
            matches!(&earlier.event, Event::Believes { client: c, key: k, fence: f }
                if c == client && k == key && *f == fence)
        });
        if !began {
            continue;
        }
        // Its lock lost before it ended: dropped at once, as it must be.
        let lost = run.events[i..].iter().any(|later| {
            later.at <= done_at
                && matches!(&later.event, Event::Ended { client: c, key: k, fence: f, why }
                    if c == client && k == key && *f == fence && why != "Released" && why != "ended")
        });
        // Its host crashed, or the program dropped the whole `run` (a
        // cancelled operation): the term goes with it, drain or not.
        let cut_short = cut_short(run, i, *client, done_at);
        if lost || cut_short {
            continue;
        }
        let told = run.events[i..].iter().any(|later| {
            later.at <= done_at
                && matches!(&later.event, Event::Draining { client: c, key: k, fence: f }
                    if c == client && k == key && *f == fence)
        });
        let what = if !returned && !told {
            Some("was dropped without being told to step down".to_owned())
        } else if !returned && done_at + SLACK < fired + *drain {
            Some(format!(
                "was dropped {:?} after until fired, before its drain ran out",
                done_at - fired
            ))
        } else if done_at > fired + *drain + SLACK {
            Some(format!(
                "still ran {:?} after until fired, past its drain",
                done_at - fired
            ))
        } else {
            None
        };
        if let Some(what) = what {
            out.push(format!(
                "leader drain: client {client}'s term on {key} (fence {fence}, drain {drain:?}) {what}"
            ));
        }
        let Some(token) = run.token_of(key, fence) else {
            continue;
        };
        if let Some(a) = run.server.sent.attempts.iter().find(|a| {
            a.operation == Operation::Release
                && a.client == *client
                && a.token.as_deref() == Some(token)
                && a.sent >= fired
                && a.sent + SLACK < done_at
        }) {
            out.push(format!(
                "leader drain: client {client}'s lease on {key} (fence {fence}) was released at \
                 {:?} while its term still ran (until {done_at:?})",
                a.sent
            ));
        }
    }
}

/// A leader told to stop steps down in time (`Leader::until`): `run`
/// returns within 1 s of `until` when no term ran then, and within the
/// drain plus 2 s when one did, on a healthy service (judged where no
/// fault was injected from 15 s before `until` on, its host's requests
/// were answered within 200 ms, and nothing crashed or was dropped).
pub(super) fn steps_down_in_time(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::UntilFired { client, key, drain } = &e.event else {
            continue;
        };
        let fired = e.at;
        let Some(returned) = run.events[i..].iter().find_map(|later| match &later.event {
            Event::RunReturned { client: c, key: k } if c == client && k == key => Some(later.at),
            _ => None,
        }) else {
            continue;
        };
        let cut_short = cut_short(run, i, *client, returned);
        if cut_short {
            continue;
        }
        // A term of this candidate running when `until` fired.
        let mut running = std::collections::BTreeSet::new();
        for earlier in &run.events[..i] {
            match &earlier.event {
                Event::Believes {
                    client: c,
                    key: k,
                    fence,
                } if c == client && k == key => {
                    running.insert(*fence);
                }
                Event::TermDone {
                    client: c,
                    key: k,
                    fence,
                    ..
                } if c == client && k == key => {
                    running.remove(fence);
                }
                _ => {}
            }
        }
        let took = returned.saturating_sub(fired);
        if running.is_empty() {
            if took > Duration::from_secs(1) + SLACK {
                out.push(format!(
                    "leader step-down: client {client} on {key} was not leading when until fired \
                     at {fired:?}, and run returned {took:?} later (within 1 s is promised)"
                ));
            }
            continue;
        }
        // (A link made slow earlier counts: a latency lasts; seed 215 of
        // sixteen clients had round trips of 2.3 s.)
        let faulty = run.slow_link(*client, fired, returned, Duration::from_millis(200))
            || run.events.iter().any(|f| {
                matches!(f.event, Event::Fault { .. } | Event::ServerJump { .. })
                    && f.at + Duration::from_secs(15) >= fired
                    && f.at <= returned
            });
        if !faulty && took > *drain + Duration::from_secs(2) + SLACK {
            out.push(format!(
                "leader step-down: client {client} on {key} was leading when until fired at \
                 {fired:?}, and run returned {took:?} later, past its drain ({drain:?}) plus 2 s"
            ));
        }
    }
}

/// Whether `client`'s host crashed, or its program dropped the operation,
/// between the event at `i` and `by`.
fn cut_short(run: &Run<'_>, i: usize, client: usize, by: Duration) -> bool {
    run.events[i..].iter().any(|later| {
        later.at <= by
            && match &later.event {
                Event::Crashed { client: c } => *c == client,
                Event::Note {
                    client: c, what, ..
                } => *c == client && what == "dropped an operation",
                _ => false,
            }
    })
}
