//! Checks that a held lock is renewed on its schedule: renewed at all
//! (a guard that never sends a renewal loses its lock by itself), never
//! in a tight loop, never too late to be safe. Judged from what the
//! clients sent: a lock that loses itself, or a guard that hammers the
//! service, passes every safety check.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use super::safety::expiry_granted;
use crate::log::Event;
use crate::net::Attempt;

/// How the belief ended, in words the log uses, for a loss that only
/// failing renewals (or none sent) can cause.
const LOST_BY_ITSELF: [&str; 3] = ["Expired", "RenewalFailed", "NoSafeWindow"];

/// A held lock is renewed: a guard whose lease ended by itself (an expiry,
/// failed renewals, no safe window) with no renewal of that lease ever
/// sent, when its grant left time for one, never tried to keep it, unless its host was suspended
/// or its term stalled meanwhile (the lease clock jumped past the moment
/// a renewal was due).
pub(super) fn renewed(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for b in &run.beliefs {
        let ended = run.why_ended(b);
        let Some(why) = ended.filter(|why| LOST_BY_ITSELF.contains(why)) else {
            continue;
        };
        // The lease: the acquire that was granted this fence.
        let granted = attempts.iter().find(|a| {
            a.client == b.client
                && a.key == b.key
                && a.operation == Operation::Acquire
                && a.answer
                    .as_ref()
                    .is_some_and(|o| o.status == 201 && o.fence == Some(b.fence))
        });
        let Some((token, ttl)) = granted.and_then(|a| a.token.as_deref().zip(a.ttl_seconds)) else {
            continue;
        };
        let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or_default());
        // Judged when a renewal could have been sent: the grant's answer
        // left more than the last moment for one (2 s, and a second for
        // the whole seconds of the `Date` the guard times it on).
        let answered = granted
            .and_then(|a| a.answer.as_ref())
            .map_or(b.from, |o| o.at);
        let sent = granted.map_or(b.from, |a| a.sent);
        if (sent + ttl).saturating_sub(answered) <= Duration::from_secs(3) {
            continue;
        }
        let renewal_sent = attempts.iter().any(|a| {
            a.operation == Operation::Renew
                && a.token.as_deref() == Some(token)
                && a.sent >= sent
                && a.sent <= b.to
        });
        let jumped =
            run.lease_clock_moved(b.client, sent.saturating_sub(Duration::from_secs(1)), b.to);
        if !renewal_sent && !jumped {
            out.push(format!(
                "never renewed: client {}'s guard on {} (fence {}, ttl {ttl:?}) held from {:?} \
                 ended ({why}) at {:?} without a renewal ever sent",
                b.client, b.key, b.fence, b.from, b.to
            ));
        }
    }
}

/// The longest a guard waits after an answer before its next renewal,
/// `left` before the deadline (at most): half the ttl when that keeps
/// 10 s of it for retries, else a third, at most a minute, jittered up
/// by a tenth at most; never later than 2 s before the deadline.
fn on_cadence(ttl: Duration, left: Duration) -> Duration {
    let later = (ttl / 2).min(left.saturating_sub(Duration::from_secs(10)));
    let base = later.max(ttl / 3).min(Duration::from_secs(60));
    base.mul_f64(1.1)
        .min(left.saturating_sub(Duration::from_secs(2)))
}

/// The longest a single retry can follow its first attempt: a request
/// timeout (the simulation's 10 s), and a tick.
const RETRY_WITHIN: Duration = Duration::from_millis(10_100);
/// Leeway on the renewal schedule: a tick or two of the simulation.
const SCHEDULE_SLACK: Duration = Duration::from_millis(60);

/// A guard renews on its schedule: each renewal of a lease starts no
/// sooner than a third of the ttl (jittered down by a tenth) after the
/// previous one's answer, unless less time than that was left before its
/// deadline (then up to 3 s before it: 2 s, and a second for the whole
/// seconds of the `Date` the guard reads the grant on), and no later than 2 s before the
/// deadline the previous one set (its send time plus the ttl), or at
/// once if that answer came later, so that it still reaches the server
/// with more than the protocol's last second left. A guard renewing in a tight loop, or too late to be safe, passes
/// every safety check: this catches both. A suspend or stall of the
/// host moves the lease clock on, and a renewal earlier: not judged then.
pub(super) fn schedule(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    let plain: BTreeSet<(usize, &str, i64)> = run
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Leased { client, key, fence } => Some((*client, key.as_str(), *fence)),
            _ => None,
        })
        .collect();
    // When a scope handed its lease to the service for a minimum hold: its
    // keeping renewal, sent then, is not on the cadence.
    let minimums: BTreeMap<(usize, &str, i64), Duration> = run
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::MinimumAsked {
                client, key, fence, ..
            } => Some(((*client, key.as_str(), *fence), e.at)),
            _ => None,
        })
        .collect();
    for (i, grant) in attempts.iter().enumerate() {
        let Some(answer) = grant.answer.as_ref().filter(|o| o.status == 201) else {
            continue;
        };
        let (Some(fence), Some(token), Some(ttl)) = (answer.fence, &grant.token, grant.ttl_seconds)
        else {
            continue;
        };
        let kept_from = minimums
            .get(&(grant.client, grant.key.as_str(), fence))
            .copied()
            .unwrap_or(Duration::MAX);
        if grant.operation != Operation::Acquire
            || plain.contains(&(grant.client, grant.key.as_str(), fence))
        {
            continue;
        }
        let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or_default());
        let renewals = renewals_of(&attempts[i + 1..], token);
        // A lease is timed from the first attempt of the try that got it:
        // the grant may answer a single retry, sent after a 503 or no
        // answer. Which it was, the attempts do not say: the soonest
        // bound reads the earlier, the latest bound the later.
        let retried = attempts[..i]
            .iter()
            .rev()
            .find(|a| a.request_id == grant.request_id);
        let first_sent = retried
            .filter(|a| a.answer.as_ref().is_none_or(|o| o.status == 503))
            .filter(|a| grant.sent <= a.sent + RETRY_WITHIN)
            .map_or(grant.sent, |a| a.sent);
        // The lease as last measured: the earliest and latest its timing
        // may start from, and when its answer came.
        let (mut earliest, mut sent, mut heard) = (first_sent, grant.sent, answer.at);
        let (mut retrying, mut refused) = (false, false);
        for first in renewals {
            // The keeping renewal is sent when the work ends, not on the
            // cadence.
            let off_cadence = retrying || first.sent >= kept_from;
            let suspended = run.lease_clock_moved(grant.client, earliest, first.sent);
            let deadline = sent + ttl;
            // On a host clock running fast (`clock_rate` > 1) the guard
            // sees more time gone and renews sooner, by as much.
            let fast = run.clock_rate.max(1.0);
            let left = ttl.saturating_sub(heard.saturating_sub(earliest).mul_f64(fast));
            // The guard times its lease from what the server granted,
            // read on a `Date` of whole seconds: up to a second less.
            let soonest = (ttl / 3)
                .min(left.saturating_sub(Duration::from_secs(3)))
                .mul_f64(0.9)
                .div_f64(fast)
                .saturating_sub(SCHEDULE_SLACK);
            let latest = latest_renewal(sent, heard, ttl, run.clock_rate) + SCHEDULE_SLACK;
            if !off_cadence && !suspended && first.sent < heard + soonest {
                out.push(format!(
                    "renewed too soon: client {}'s guard on {} (fence {fence}, ttl {ttl:?}) \
                     renewed {:?} after the last answer, at {:?}",
                    grant.client,
                    grant.key,
                    first.sent - heard,
                    first.sent
                ));
            }
            // On its cadence: half the ttl when that keeps 10 s for
            // retries, else a third, at most a minute, +10 %; never past
            // 2 s before the deadline.
            let cadence = on_cadence(ttl, deadline.saturating_sub(heard)) + SCHEDULE_SLACK;
            let timed = run.clock_rate == 1.0 && !suspended;
            if !off_cadence && timed && first.sent > heard + cadence && first.sent <= latest {
                out.push(format!(
                    "renewed late on its cadence: client {}'s guard on {} (fence {fence}, ttl \
                     {ttl:?}) renewed {:?} after the last answer (due within {cadence:?}), at {:?}",
                    grant.client,
                    grant.key,
                    first.sent - heard,
                    first.sent
                ));
            }
            if !off_cadence && first.sent > latest {
                out.push(format!(
                    "renewed too late: client {}'s guard on {} (fence {fence}, ttl {ttl:?}) \
                     sent its renewal at {:?}, {:?} before the deadline the last one set",
                    grant.client,
                    grant.key,
                    first.sent,
                    deadline.saturating_sub(first.sent)
                ));
            }
            // Every attempt, a retry too, is sent while it can still arrive
            // more than the protocol's last second before the lease's
            // expiry on the server: 1 s, and the least time an attempt is
            // given (100 ms).
            let expires = expiry_granted(run, &grant.key, fence, |at| at <= first.sent);
            // A server clock jump since the grant, before the expiry, moves
            // that expiry sooner in sim time: excused by as much.
            let jumped = run.breaks.jumped(grant.sent, first.sent + ttl + IN_WINDOW);
            let excused = run.drift_slack + jumped;
            // After a keep, renewals back to the minimum's end put right
            // what a late request did; one too late finds the lease gone
            // (409), which is harmless.
            let after_keep = first.sent >= kept_from;
            if let Some(expires) =
                expires.filter(|e| !after_keep && first.sent + IN_WINDOW > *e + excused)
            {
                out.push(format!(
                    "renewal after its window: client {}'s guard on {} (fence {fence}) sent a \
                     renewal at {:?}, {:?} before the lease's expiry",
                    grant.client,
                    grant.key,
                    first.sent,
                    expires.saturating_sub(first.sent)
                ));
            }
            // An answered renewal sets the next deadline; a refusal ends the
            // lease's life; a transient failure is retried on a backoff,
            // not on this schedule (each attempt has its own request id).
            match first.answer.as_ref().map(|o| (o.status, o.at)) {
                Some((200, at)) => {
                    (earliest, sent, heard) = (first.sent, first.sent, at);
                    retrying = false;
                }
                Some((status, _)) if !matches!(status, 429 | 500..=599) => {
                    refused = true;
                    break;
                }
                _ => retrying = true,
            }
        }
        // After the last renewal answered (or the grant), the next one was
        // due by `latest`: a guard still believing well past it without
        // having sent one stopped renewing.
        if refused || retrying {
            continue;
        }
        let latest = latest_renewal(sent, heard, ttl, run.clock_rate) + STOPPED_SLACK;
        // A later acquire under the same token (a recovery) starts a
        // lease timing of its own: a belief begun after it was sent is its.
        let next_acquire = attempts[i + 1..]
            .iter()
            .find(|a| a.token.as_deref() == Some(token) && a.operation == Operation::Acquire)
            .map_or(Duration::MAX, |a| a.sent);
        let stopped = run.beliefs.iter().find(|b| {
            b.client == grant.client
                && b.key == grant.key
                && b.fence == fence
                && b.from <= latest
                && b.from < next_acquire
                && b.to > latest
        });
        let Some(b) = stopped else { continue };
        let suspended = run.lease_clock_moved(
            grant.client,
            earliest.saturating_sub(Duration::from_secs(1)),
            b.to,
        );
        if !suspended {
            out.push(format!(
                "stopped renewing: client {}'s guard on {} (fence {fence}, ttl {ttl:?}) last \
                 renewed at {sent:?}, believed until {:?}, and sent no renewal by {latest:?}",
                grant.client, grant.key, b.to
            ));
        }
    }
}

/// How long before the server's expiry a renewal attempt may be sent at
/// the latest: the protocol's last second, and the least time an attempt
/// is given.
const IN_WINDOW: Duration = Duration::from_millis(1_100);

/// How late past its due moment a renewal not sent at all is reported.
const STOPPED_SLACK: Duration = Duration::from_millis(500);

/// The latest a renewal may be sent after a lease measured from `sent`
/// and answered at `heard`: 2 s before the deadline (longer on a slow
/// clock), or at once if the answer came later.
fn latest_renewal(sent: Duration, heard: Duration, ttl: Duration, clock_rate: f64) -> Duration {
    let due = (sent + ttl)
        .saturating_sub(Duration::from_secs(2))
        .saturating_sub(sent)
        .div_f64(clock_rate.min(1.0))
        + sent;
    due.max(heard)
}

/// The renewal attempts sent under `token` (each attempt has its own
/// request id), up to the next grant under the same token.
fn renewals_of<'a>(after: &'a [Attempt], token: &str) -> Vec<&'a Attempt> {
    after
        .iter()
        .filter(|a| a.token.as_deref() == Some(token))
        .take_while(|a| a.operation != Operation::Acquire)
        .filter(|a| a.operation == Operation::Renew)
        .collect()
}

/// How soon after a refusal a guard must have said it is lost: a tick.
const TOLD_WITHIN: Duration = Duration::from_millis(60);

/// A renewal refused (409: the lease is gone, taken over, lapsed or
/// force-released; 401/403: the key was revoked) ends the guard's belief
/// at once: no guard keeps believing, or retrying, on a lease the service
/// refused to extend.
pub(super) fn lost_on_refusal(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for (i, grant) in attempts.iter().enumerate() {
        let granted = grant.answer.as_ref().filter(|o| o.status == 201);
        let (Some(fence), Some(token)) = (granted.and_then(|o| o.fence), &grant.token) else {
            continue;
        };
        if grant.operation != Operation::Acquire {
            continue;
        }
        // 409: the lease is gone; 400/401/403/404: refused for good.
        let refused = renewals_of(&attempts[i + 1..], token)
            .into_iter()
            .find_map(|a| {
                a.answer
                    .as_ref()
                    .filter(|o| matches!(o.status, 400..=499) && o.status != 429)
            });
        let Some(refused) = refused else { continue };
        let believed = run.beliefs.iter().find(|b| {
            b.client == grant.client
                && b.key == grant.key
                && b.fence == fence
                && b.from <= refused.at
                && b.to > refused.at + TOLD_WITHIN
        });
        if let Some(b) = believed {
            out.push(format!(
                "believed after a refusal: client {}'s renewal of {} (fence {fence}) was \
                 answered {} at {:?}, and it believed it held the key until {:?}",
                b.client, b.key, refused.status, refused.at, b.to
            ));
        }
    }
}
