//! What a release reports matches what the server did (no false conflict,
//! no false success), and its retries back off.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;

/// A release whose earlier attempt (same request id) was applied, its
/// answer lost, and whose later attempt was answered 409 did free the
/// lease: the call must succeed. A program told "conflict" by it was told
/// something false.
pub(super) fn releases(run: &Run<'_>, out: &mut Vec<String>) {
    let server = run.server;
    let journal = &server.journal;
    for (i, refused) in journal.iter().enumerate() {
        if refused.operation != Operation::Release || refused.status != Some(409) {
            continue;
        }
        let Some(id) = &refused.request_id else {
            continue;
        };
        let Some(&(client, _)) = server.sent.by_id.get(id) else {
            continue;
        };
        let applied = journal[..i].iter().any(|earlier| {
            earlier.request_id.as_ref() == Some(id)
                && earlier.operation == Operation::Release
                && earlier.status == Some(204)
        });
        if !applied {
            continue;
        }
        // The call returns (and the program notes it) the moment that 409
        // arrives: a note at another time came from another call.
        let arrived_at: Vec<Duration> = server
            .sent
            .attempts
            .iter()
            .filter(|a| &a.request_id == id)
            .filter_map(|a| a.answer.as_ref())
            .filter(|answer| answer.status == 409)
            .map(|answer| answer.at)
            .collect();
        let at = run.sim_time(refused.at);
        let told = run.events.iter().find(|e| {
            e.at >= at
                && arrived_at.contains(&e.at)
                && matches!(&e.event, Event::Note { client: c, what, .. }
                    if *c == client
                        && [
                            format!("release of {}: lock conflict", refused.key),
                            format!("release {}: lock conflict", refused.key),
                            format!("release {} of own token: lock conflict", refused.key),
                            "release of all: lock conflict".to_owned(),
                        ]
                        .iter()
                        .any(|said| what.starts_with(said)))
        });
        if let Some(told) = told {
            out.push(format!(
                "false conflict: client {client}'s release of {} was applied (its answer lost), \
                 yet the call reported a conflict at {:?}",
                refused.key, told.at
            ));
        }
    }
}

/// No false success: a release call that reported success had an attempt
/// the server applied, or one whose outcome its client could not know (no
/// answer, a 5xx). A call whose every attempt was answered 409 or 429,
/// none applied, freed nothing: success would be false.
pub(super) fn successes(run: &Run<'_>, out: &mut Vec<String>) {
    let server = run.server;
    let attempts = &server.sent.attempts;
    for e in run.events {
        let Event::Released { client, key } = &e.event else {
            continue;
        };
        // The call returned the moment its last answer arrived. Another
        // release of the key by the same client (a background one) may
        // have been answered in the same tick: any of them will do.
        let candidates: Vec<_> = attempts
            .iter()
            .filter(|a| {
                a.client == *client
                    && &a.key == key
                    && a.operation == Operation::Release
                    && a.answer.as_ref().is_some_and(|o| o.at == e.at)
            })
            .collect();
        if candidates.is_empty() {
            out.push(format!(
                "success without a release: client {client}'s release of {key} reported success \
                 at {:?}, and no release answer reached it then",
                e.at
            ));
            continue;
        }
        // A call whose attempts (one request id) were all answered 409 or
        // 429 and none applied freed nothing.
        let freed_nothing = |id: &String| {
            let applied = server.journal.iter().any(|r| {
                r.request_id.as_ref() == Some(id)
                    && r.operation == Operation::Release
                    && r.status == Some(204)
            });
            let answers: Vec<Option<u16>> = attempts
                .iter()
                .filter(|a| &a.request_id == id)
                .map(|a| a.answer.as_ref().map(|o| o.status))
                .collect();
            let known = answers.iter().all(|s| matches!(s, Some(409 | 429)));
            (!applied && known).then_some(answers)
        };
        let refusals: Vec<_> = candidates
            .iter()
            .map(|a| freed_nothing(&a.request_id))
            .collect();
        if let Some(Some(answers)) = refusals
            .first()
            .filter(|_| refusals.iter().all(Option::is_some))
        {
            out.push(format!(
                "false success: client {client}'s release of {key} reported success at {:?}, \
                 but the server applied none of its attempts (answers {answers:?})",
                e.at
            ));
        }
    }
}

/// The least time between two attempts of one release (the retry
/// backoff's floor): retries never hammer a struggling service.
const BACKOFF_FLOOR: Duration = Duration::from_millis(100);

/// Retries of a release back off: no two attempts of one request id are
/// closer than [`BACKOFF_FLOOR`].
pub(super) fn backoff(run: &Run<'_>, out: &mut Vec<String>) {
    let mut last_sent: std::collections::BTreeMap<&str, Duration> = Default::default();
    for a in &run.server.sent.attempts {
        if a.operation != Operation::Release {
            continue;
        }
        if let Some(before) = last_sent.insert(a.request_id.as_str(), a.sent) {
            if a.sent.saturating_sub(before) < BACKOFF_FLOOR {
                out.push(format!(
                    "no backoff: client {} sent a release of {} again {:?} after the last \
                     attempt (at {:?})",
                    a.client,
                    a.key,
                    a.sent.saturating_sub(before),
                    a.sent
                ));
            }
        }
    }
}

/// How long a release's next attempt may follow a transient failure: its
/// backoff's cap (2 s), up to doubled by its jitter, and a tick.
const RELEASE_RETRY_BY: Duration = Duration::from_millis(4_150);

/// A tick of the simulation and a round trip's slack.
const TICK: Duration = Duration::from_millis(150);

/// A release retries what may pass and nothing else. An attempt answered
/// 400, 401, 403, 404 or 409 (another token holds the key, or an earlier
/// attempt freed it) is its request's last; and an attempt
/// that got no answer, or a 429 or 5xx, is followed by another of its
/// request within [`RELEASE_RETRY_BY`] (or the `Retry-After` it named and
/// a tick, when that is longer), unless it was the third (a
/// foreground release's last), its client's operation ended or crashed
/// by then, its client acquired the key again (which supersedes it), or
/// its request had run for 5 s (its budget may be spent).
pub(super) fn release_retries(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    // Released by hand (`locks.release`: one attempt a call): programs'
    // own tokens and plain leases.
    let own: std::collections::BTreeSet<u64> = run
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::OwnToken { token_hash, .. } => Some(*token_hash),
            _ => None,
        })
        .collect();
    let by_hand = |a: &crate::net::Attempt| {
        let Some(token) = a.token.as_deref() else {
            return true;
        };
        own.contains(&crate::log::token_hash(token)) || run.events.iter().any(|e| {
            matches!(&e.event, Event::Leased { client, key, fence }
            if *client == a.client && *key == a.key && attempts.iter().any(|g| {
                g.token.as_deref() == Some(token)
                    && g.answer.as_ref().is_some_and(|o| o.status == 201 && o.fence == Some(*fence))
            }))
        })
    };
    for (i, a) in attempts.iter().enumerate() {
        if a.operation != Operation::Release || by_hand(a) {
            continue;
        }
        let later = attempts[i + 1..]
            .iter()
            .find(|b| b.request_id == a.request_id);
        let earlier: Vec<_> = attempts[..i]
            .iter()
            .filter(|b| b.request_id == a.request_id)
            .collect();
        let status = a.answer.as_ref().map(|o| o.status);
        if let (Some(status @ (400 | 401 | 403 | 404 | 409)), Some(again)) = (status, later) {
            out.push(format!(
                "release retried after a {status}: client {} sent its release of {} again at \
                 {:?}",
                a.client, a.key, again.sent
            ));
        }
        let (failed, named) = match (&a.answer, a.failed) {
            (Some(o), _) if o.status == 429 || o.status >= 500 => {
                (o.at, o.retry_after.unwrap_or_default())
            }
            (None, Some(failed)) => (failed, Duration::ZERO),
            _ => continue,
        };
        // Not before the window a `Retry-After` named (a 429's quota
        // window, seen with sixteen clients on one quota: seed 93).
        let by = failed + RELEASE_RETRY_BY.max(named + TICK);
        let began = earlier.first().map_or(a.sent, |b| b.sent);
        let ended = run.events.iter().any(|e| {
            e.at >= a.sent
                && e.at <= by
                && matches!(e.event, Event::StepEnded { client } | Event::Crashed { client }
                    if client == a.client)
        });
        let superseded = attempts.iter().any(|b| {
            b.client == a.client
                && b.key == a.key
                && b.operation == Operation::Acquire
                && b.sent >= a.sent
                && b.sent <= by
        });
        let spent = earlier.len() >= 2 || by > began + Duration::from_secs(5);
        if later.is_none_or(|b| b.sent > by) && !ended && !superseded && !spent && by < run_end(run)
        {
            out.push(format!(
                "release not retried: client {}'s release of {} failed at {failed:?} and was not \
                 sent again by {by:?}",
                a.client, a.key
            ));
        }
    }
}

/// When the last event of the run was logged.
fn run_end(run: &Run<'_>) -> Duration {
    run.events.last().map_or(Duration::ZERO, |e| e.at)
}

/// What a release that found another token holding the lock says: taken
/// over (`LockLost`, the work since not covered) when its first attempt
/// was answered 409 while the lease was still ours by its guard's clock
/// (a second to spare, the host's lease clock not moved meanwhile); a
/// conflict (nothing of ours left) when a later attempt was.
pub(super) fn takeovers(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for (i, a) in attempts.iter().enumerate() {
        let Some(answer) = a.answer.as_ref().filter(|o| o.status == 409) else {
            continue;
        };
        if a.operation != Operation::Release {
            continue;
        }
        let said = run.events.iter().find_map(|e| match &e.event {
            Event::Note { client, what, .. } if *client == a.client && e.at == answer.at => what
                .strip_prefix(&format!("release of {}: ", a.key))
                .map(|rest| rest.to_owned()),
            _ => None,
        });
        let Some(said) = said else { continue };
        let first = !attempts[..i].iter().any(|b| b.request_id == a.request_id);
        // The guard's belief, ended by this release, and its time left at
        // its last write.
        let ended_released = |b: &&super::run::Belief| {
            run.events.iter().any(|e| {
                e.at == b.to
                    && matches!(&e.event, Event::Ended { client, key, fence, why }
                        if *client == b.client && *key == b.key && *fence == b.fence && why == "Released")
            })
        };
        // (Its lease's: a release by hand of another lease of the key may
        // go at that moment too, permits seed 757.)
        let belief = run.beliefs.iter().find(|b| {
            b.client == a.client
                && b.key == a.key
                && run.token_of(&b.key, b.fence) == a.token.as_deref()
                && b.to <= a.sent
                && b.to + Duration::from_millis(60) >= a.sent
                && ended_released(b)
        });
        let left = belief.and_then(|b| {
            run.events.iter().rev().find_map(|e| match &e.event {
                Event::Wrote {
                    client,
                    key,
                    fence,
                    remaining,
                    ..
                } if *client == b.client && *key == b.key && *fence == b.fence && e.at <= b.to => {
                    Some(e.at + *remaining)
                }
                _ => None,
            })
        });
        let ours = left.is_some_and(|deadline| {
            answer.at + Duration::from_secs(1) < deadline
                && !run.lease_clock_moved(
                    a.client,
                    a.sent.saturating_sub(Duration::from_secs(1)),
                    answer.at,
                )
        });
        let taken = said.contains("another token held the lock when it was released");
        if first && ours && !taken {
            out.push(format!(
                "takeover unsaid: client {}'s release of {} was answered 409 at {:?} to its first \
                 attempt while the lease was still its own, and the call said: {said}",
                a.client, a.key, answer.at
            ));
        }
        if !first && taken {
            out.push(format!(
                "takeover claimed: client {}'s release of {} was answered 409 at {:?} to a later \
                 attempt (the lease may have lapsed meanwhile), and the call said it was taken over",
                a.client, a.key, answer.at
            ));
        }
    }
}

/// A force-release that reported success sent its request: a
/// `ForceRelease` of the key from its client went out before it
/// returned.
pub(super) fn force_releases_sent(run: &Run<'_>, out: &mut Vec<String>) {
    for e in run.events {
        let Event::Forced { client, key } = &e.event else {
            continue;
        };
        let sent = run.server.sent.attempts.iter().any(|a| {
            a.client == *client
                && a.key == *key
                && a.operation == Operation::ForceRelease
                && a.sent <= e.at
        });
        if !sent {
            out.push(format!(
                "force-release: client {client} was told {key} was force-released at {:?}, and \
                 no request was sent",
                e.at
            ));
        }
    }
}
