//! A key freed by a crash goes to a live waiter: once the crashed holder's
//! lease has expired on the server, a program that was waiting for the key
//! all along gets it within the grace and a little slack.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::{sim_time, Belief, Breaks, Server};
use crate::log::{Event, Stamped};

/// The server's grace after an expiry, before another token may take the
/// key, plus what a waiter needs to notice (it looks at the holder at the
/// takeover moment, up to 0.6 s later) and two round trips.
const BOUND_AFTER_EXPIRY: Duration = Duration::from_millis(3_500);

/// Beliefs of crashed programs still open at their crash; for each, if a
/// live program waited for the key from before the lease's expiry until
/// past the bound, someone other than the crashed holder must have taken
/// the key by then. Runs where anything else could delay it (a fault, a
/// force-release, a server clock jump) are not judged.
pub(super) fn after_crash(
    events: &[Stamped],
    beliefs: &[Belief],
    server: &Server,
    jumps: &[(Duration, Duration)],
    breaks: &Breaks,
    out: &mut Vec<String>,
) {
    for (crashed, at) in events.iter().filter_map(|e| match e.event {
        Event::Crashed { client } => Some((client, e.at)),
        _ => None,
    }) {
        for b in beliefs.iter().filter(|b| b.client == crashed && b.to == at) {
            let Some(expired) = expiry(server, jumps, &b.key, b.fence) else {
                continue;
            };
            let bound = expired + BOUND_AFTER_EXPIRY;
            let disturbed = events.iter().any(|e| {
                e.at >= at
                    && e.at <= bound
                    && matches!(e.event, Event::Fault { .. } | Event::Crashed { .. })
            });
            if disturbed || breaks.any(&b.key, at, bound) {
                continue;
            }
            let Some(waiter) = waiter(events, &b.key, crashed, expired, bound) else {
                continue;
            };
            let taken = events.iter().any(|e| {
                e.at >= at
                    && e.at <= bound
                    && match &e.event {
                        Event::Believes { key, fence, .. } | Event::Leased { key, fence, .. } => {
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
fn expiry(
    server: &Server,
    jumps: &[(Duration, Duration)],
    key: &str,
    fence: i64,
) -> Option<Duration> {
    server
        .journal
        .iter()
        .filter(|r| r.key == key && r.fencing_token == Some(fence))
        .filter(|r| matches!(r.operation, Operation::Acquire | Operation::Renew))
        .filter(|r| matches!(r.status, Some(200 | 201)))
        .filter_map(|r| r.expires_at)
        .max()
        .map(|e| sim_time(server, jumps, e))
}

/// A program other than `crashed` whose wait for `key` began before
/// `expired` and lasts past `bound`, with its operation still running then.
fn waiter(
    events: &[Stamped],
    key: &str,
    crashed: usize,
    expired: Duration,
    bound: Duration,
) -> Option<usize> {
    events.iter().enumerate().find_map(|(i, e)| match &e.event {
        Event::Waits {
            client, key: k, until, ..
        }
            if *client != crashed && k == key && e.at <= expired && *until >= bound =>
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
