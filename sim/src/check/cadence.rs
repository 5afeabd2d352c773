//! Checks that a lock *works*, not only that it never lies: a held lock
//! is renewed, and an acquire is retried only as the protocol allows (once, at once, after a 503 or no answer; never after
//! a 409). A lock that loses itself, or an acquire that hammers a held
//! key, passes every safety check: these catch them.

use std::collections::BTreeMap;
use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;

/// An attempt sent this soon after the last one of its request was
/// answered, and less than [`LEAST_PAUSE`] after it was sent, is a retry
/// of it, not a waiter's next try.
const IMMEDIATE: Duration = Duration::from_millis(100);
/// The least pause between two tries of a waiting acquire (a 200 ms poll,
/// jittered down by a tenth): a slow answer can make the next try follow
/// it at once.
const LEAST_PAUSE: Duration = Duration::from_millis(180);

/// How the belief ended, in words the log uses, for a loss that only
/// failing renewals (or none sent) can cause.
const LOST_BY_ITSELF: [&str; 3] = ["Expired", "RenewalFailed", "NoSafeWindow"];

/// A held lock is renewed: a guard whose lease ended by itself (an expiry,
/// failed renewals) after more than half its ttl, with no renewal of that
/// lease ever sent, never tried to keep it, unless its host was suspended
/// or its term stalled meanwhile (the lease clock jumped past the moment
/// a renewal was due).
pub(super) fn renewed(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for b in &run.beliefs {
        let ended = run.events.iter().find_map(|e| match &e.event {
            Event::Ended {
                client,
                key,
                fence,
                why,
            } if *client == b.client && *key == b.key && *fence == b.fence && e.at == b.to => {
                Some(why.as_str())
            }
            _ => None,
        });
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
        if b.to.saturating_sub(b.from) <= ttl / 2 + Duration::from_secs(1) {
            continue;
        }
        let renewal_sent = attempts.iter().any(|a| {
            a.operation == Operation::Renew
                && a.token.as_deref() == Some(token)
                && a.sent >= b.from
                && a.sent <= b.to
        });
        let host = format!("client-{}", b.client);
        let jumped = run.events.iter().any(|e| {
            e.at + Duration::from_secs(1) >= b.from
                && e.at <= b.to
                && matches!(&e.event, Event::Fault { what }
                    if (what.starts_with("suspend of ") || what.starts_with("stall of "))
                        && what.contains(&host))
        });
        if !renewal_sent && !jumped {
            out.push(format!(
                "never renewed: client {}'s guard on {} (fence {}, ttl {ttl:?}) held from {:?} \
                 ended ({why}) at {:?} without a renewal ever sent",
                b.client, b.key, b.fence, b.from, b.to
            ));
        }
    }
}

/// The protocol's single retry of an acquire: an attempt that follows the
/// last of its request at once (a retry: not prompted by a look at the
/// holder or by its own client's release of the key between) follows a
/// 503 or no answer, and is never itself retried.
pub(super) fn acquire_retries(run: &Run<'_>, out: &mut Vec<String>) {
    // The previous attempt of each request id, and whether it was a retry.
    let mut last: BTreeMap<&str, (&crate::net::Attempt, bool)> = BTreeMap::new();
    // When each client last looked at each key (`get`) or released it.
    let mut looked: BTreeMap<(usize, &str), Duration> = BTreeMap::new();
    for a in &run.server.sent.attempts {
        if matches!(
            a.operation,
            Operation::Get | Operation::Release | Operation::ForceRelease
        ) {
            // When its answer came, if one did: that is what prompts.
            let at = a.answer.as_ref().map_or(a.sent, |answer| answer.at);
            let last = looked.entry((a.client, a.key.as_str())).or_default();
            *last = (*last).max(at);
        }
        if a.operation != Operation::Acquire {
            continue;
        }
        let looked_since = |since: Duration| {
            looked
                .get(&(a.client, a.key.as_str()))
                .is_some_and(|at| *at >= since)
        };
        let retry = match last.get(a.request_id.as_str()) {
            Some((before, before_was_retry)) => match &before.answer {
                Some(answer)
                    if a.sent.saturating_sub(answer.at) < IMMEDIATE
                        && a.sent.saturating_sub(before.sent) < LEAST_PAUSE
                        && !looked_since(before.sent) =>
                {
                    if answer.status != 503 {
                        out.push(format!(
                            "acquire retried after a {}: client {} sent {} again {:?} after \
                             that answer (at {:?})",
                            answer.status,
                            a.client,
                            a.key,
                            a.sent.saturating_sub(answer.at),
                            a.sent
                        ));
                    }
                    if *before_was_retry {
                        out.push(format!(
                            "acquire retried twice: client {}'s acquire of {} at {:?}",
                            a.client, a.key, a.sent
                        ));
                    }
                    true
                }
                _ => false,
            },
            None => false,
        };
        last.insert(a.request_id.as_str(), (a, retry));
    }
}
