//! A guard whose renewals fail transiently keeps trying until its window
//! closes, and then says why it lost (DESIGN.md §10): `RenewalFailed`
//! when the service kept answering with a transient refusal (a 429, a
//! 5xx), `Expired` when no answer came. A guard that gives up at its
//! first 503 loses its lock by itself and never lies: this catches it.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::{Belief, Run};
use crate::log::Event;
use crate::net::Attempt;

/// The most a guard whose renewals fail may have left before the deadline
/// it knew (the send time of the first attempt of the latest grant or
/// renewal it heard succeed, plus the ttl) when it gives up: its safety margin (1 s) and its last
/// attempt's room (0.5 s), the `Date` header's whole seconds (its deadline
/// is timed on them: up to 1 s sooner), and a tick.
const GIVES_UP_WITHIN: Duration = Duration::from_millis(2_700);

/// For every loss by itself (`Expired`, `RenewalFailed`) whose latest
/// renewal attempt failed transiently before it: the reason follows that
/// attempt (no answer: `Expired`; a 429, a 5xx or a success it could not
/// read: `RenewalFailed`), and
/// the guard gave up no sooner than its window closed (within
/// [`GIVES_UP_WITHIN`] of the deadline it knew). Not judged when its
/// host's lease clock moved, or a force-release or clock jump moved the
/// lease.
pub(super) fn gives_up_last(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for b in &run.beliefs {
        let why = run.why_ended(b);
        let Some(why) = why.filter(|why| matches!(*why, "Expired" | "RenewalFailed")) else {
            continue;
        };
        let Some((grant, token)) = grant_of(attempts, b) else {
            continue;
        };
        let last = attempts.iter().rfind(|a| {
            a.operation == Operation::Renew
                && a.client == b.client
                && a.token.as_deref() == Some(token)
                && a.sent >= grant.sent
                && a.sent <= b.to
        });
        let Some(last) = last else { continue };
        let (ended, answered) = match (&last.answer, last.failed) {
            (Some(o), _) if o.status == 429 || o.status >= 500 => (o.at, Some(o.status)),
            // A success it could not read is an answer all the same.
            (None, Some(failed)) => (failed, last.garbled),
            _ => continue,
        };
        // From the grant's first attempt: the guard times its lease from
        // there (a suspend while a retried acquire was in flight moved it:
        // kept-minimums seed 246).
        let first_sent = attempts
            .iter()
            .find(|a| a.request_id == grant.request_id)
            .map_or(grant.sent, |first| first.sent);
        let since = first_sent.saturating_sub(Duration::from_secs(1));
        if ended > b.to || run.lease_clock_moved(b.client, since, b.to) {
            continue;
        }
        let expected = if answered.is_some() {
            "RenewalFailed"
        } else {
            "Expired"
        };
        if why != expected {
            out.push(format!(
                "loss reason: client {}'s guard on {} (fence {}) said {why} at {:?}; its last \
                 renewal attempt ({:?}) was answered {answered:?}, so {expected}",
                b.client, b.key, b.fence, b.to, last.sent
            ));
        }
        let Some(until) =
            deadline_known(attempts, b.client, token, grant.sent, b.to, run.clock_rate)
        else {
            continue;
        };
        if run.breaks.any(&b.key, grant.sent, b.to.max(until)) {
            continue;
        }
        if until > b.to + GIVES_UP_WITHIN {
            out.push(format!(
                "gave up early: client {}'s guard on {} (fence {}) lost it ({why}) at {:?}, \
                 {:?} before the deadline it knew, after its renewal attempt at {:?} failed \
                 ({answered:?})",
                b.client,
                b.key,
                b.fence,
                b.to,
                until - b.to,
                last.sent
            ));
        }
    }
}

/// The deadline a guard knew at `at`: the first attempt's send time of the
/// latest grant or renewal of `token` it heard succeed by then (since
/// `since`), plus its ttl as its host's clock (running at `rate`) counts
/// it: a fast clock reaches it sooner.
fn deadline_known(
    attempts: &[Attempt],
    client: usize,
    token: &str,
    since: Duration,
    at: Duration,
    rate: f64,
) -> Option<Duration> {
    let heard = attempts.iter().rfind(|a| {
        a.client == client
            && a.token.as_deref() == Some(token)
            && a.sent >= since
            && matches!(a.operation, Operation::Acquire | Operation::Renew)
            && a.answer
                .as_ref()
                .is_some_and(|o| matches!(o.status, 200 | 201) && o.at <= at)
    })?;
    let ttl = u64::try_from(heard.ttl_seconds?).unwrap_or_default();
    // What the answer said was left, when less (a retried acquire's lease
    // granted by its first attempt, applied earlier: kept-minimums seed
    // 246); the guard times its deadline on it.
    let ttl = Duration::from_secs(ttl).min(
        heard
            .answer
            .as_ref()
            .and_then(|o| o.left)
            .map_or(Duration::MAX, |left| left + Duration::from_secs(1)),
    );
    // Timed from its request's first attempt (a retried acquire may have
    // been applied at the first).
    let sent = attempts
        .iter()
        .find(|a| a.request_id == heard.request_id)
        .map_or(heard.sent, |first| first.sent);
    Some(sent + ttl.div_f64(rate.max(1.0)))
}

/// How close to the deadline it knew a guard may renew and still keep its
/// lock: 2 s (its safety margin and a request's budget). With the `Date`
/// header's whole seconds, a guard may see up to a second less.
const SAFE_WINDOW: Duration = Duration::from_secs(2);

/// A guard says there is no safe window left (`NoSafeWindow`) exactly
/// when a renewal's answer left it too little time: never while the
/// deadline it knew was more than [`SAFE_WINDOW`] (and a second, and a
/// tick) away; and always, within a tick, after a renewal answered with
/// [`SAFE_WINDOW`] or less left on its own clock. Not judged when its
/// host's lease clock moved.
pub(super) fn no_safe_window(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    let tick = Duration::from_millis(100);
    for b in &run.beliefs {
        let Some((grant, token)) = grant_of(attempts, b) else {
            continue;
        };
        // From the grant's first attempt: the guard times its lease from
        // there (a suspend while a retried acquire was in flight moved it:
        // kept-minimums seed 246).
        let first_sent = attempts
            .iter()
            .find(|a| a.request_id == grant.request_id)
            .map_or(grant.sent, |first| first.sent);
        let since = first_sent.saturating_sub(Duration::from_secs(1));
        if run.lease_clock_moved(b.client, since, b.to) {
            continue;
        }
        let said = run.events.iter().any(|e| {
            e.at == b.to
                && matches!(&e.event, Event::Ended { client, key, fence, why }
                    if *client == b.client && *key == b.key && *fence == b.fence
                        && why == "NoSafeWindow")
        });
        let until = deadline_known(attempts, b.client, token, grant.sent, b.to, run.clock_rate);
        if let Some(until) =
            until.filter(|u| said && *u > b.to + SAFE_WINDOW + Duration::from_secs(1) + tick)
        {
            out.push(format!(
                "no safe window said early: client {}'s guard on {} (fence {}) said so at {:?}, \
                 {:?} before the deadline it knew",
                b.client,
                b.key,
                b.fence,
                b.to,
                until - b.to
            ));
        }
        // Renewals answered with too little left keep nothing.
        let late = attempts.iter().find(|a| {
            a.client == b.client
                && a.operation == Operation::Renew
                && a.token.as_deref() == Some(token)
                && a.sent >= grant.sent
                && a.answer.as_ref().is_some_and(|o| {
                    o.status == 200
                        && o.at >= b.from
                        && o.at + tick < b.to
                        && a.ttl_seconds.is_some_and(|ttl| {
                            a.sent + Duration::from_secs(u64::try_from(ttl).unwrap_or_default())
                                <= o.at + SAFE_WINDOW
                        })
                })
        });
        if let Some(late) = late {
            out.push(format!(
                "no safe window kept: client {}'s guard on {} (fence {}) heard a renewal sent at \
                 {:?} at {:?}, with at most {SAFE_WINDOW:?} left, and still held it until {:?}",
                b.client,
                b.key,
                b.fence,
                late.sent,
                late.answer.as_ref().map_or(late.sent, |o| o.at),
                b.to
            ));
        }
    }
}

/// The longest pause between a renewal's attempts when the service named
/// no longer one: the SDK's `BACKOFF_MAX` (2 s), up to doubled by its
/// jitter, and a tick.
const RETRY_BY: Duration = Duration::from_millis(4_150);

/// A renewal that failed transiently is tried again within its backoff's
/// cap: after an attempt that got no answer, or a 500, 502 or 504 (none
/// names a `Retry-After`), the guard's next renewal attempt goes within
/// [`RETRY_BY`], unless the lock ended first. A guard that waits out its
/// window after one failure keeps its lock only by luck.
pub(super) fn retries_renewal(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for b in &run.beliefs {
        let Some((grant, token)) = grant_of(attempts, b) else {
            continue;
        };
        let renewals: Vec<&Attempt> = attempts
            .iter()
            .filter(|a| {
                a.client == b.client
                    && a.operation == Operation::Renew
                    && a.token.as_deref() == Some(token)
                    && a.sent >= grant.sent
                    && a.sent <= b.to
            })
            .collect();
        for (n, r) in renewals.iter().enumerate() {
            let failed = match (&r.answer, r.failed) {
                (Some(o), _) if matches!(o.status, 500 | 502 | 504) => o.at,
                (None, Some(failed)) => failed,
                _ => continue,
            };
            let by = failed + RETRY_BY;
            if by >= b.to || run.lease_clock_moved(b.client, failed, by) {
                continue;
            }
            let again = renewals.get(n + 1).is_some_and(|next| next.sent <= by);
            if !again {
                out.push(format!(
                    "renewal not retried: client {}'s guard on {} (fence {}) had a renewal fail \
                     at {failed:?} and sent none by {by:?}, holding it until {:?}",
                    b.client, b.key, b.fence, b.to
                ));
            }
        }
    }
}

/// The grant of belief `b`'s lease (the latest acquire answered 201 with
/// its fence by then) and its token.
fn grant_of<'a>(attempts: &'a [Attempt], b: &Belief) -> Option<(&'a Attempt, &'a str)> {
    let grant = attempts.iter().rfind(|a| {
        a.client == b.client
            && a.key == b.key
            && a.operation == Operation::Acquire
            && a.sent <= b.to
            && a.answer
                .as_ref()
                .is_some_and(|o| o.status == 201 && o.fence == Some(b.fence))
    })?;
    Some((grant, grant.token.as_deref()?))
}
