//! Checks that waiting for a lock *works*, not only that it never lies:
//! an acquire is retried only as the protocol allows (once, at once,
//! after a 503 or no answer; never after a 409), and a waiter keeps
//! trying, never in a tight loop. An acquire that hammers a held key, or
//! a waiter that stops, passes every safety check: these catch them.

use std::collections::BTreeMap;
use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::{Event, Waiting};
use crate::net::Attempt;

/// An attempt sent this soon after the last one of its request was
/// answered, and less than [`LEAST_PAUSE`] after it was sent, is a retry
/// of it, not a waiter's next try.
const IMMEDIATE: Duration = Duration::from_millis(100);
/// The least pause between two tries of a waiting acquire (a 200 ms poll,
/// jittered down by a tenth): a slow answer can make the next try follow
/// it at once.
const LEAST_PAUSE: Duration = Duration::from_millis(180);

/// The protocol's single retry of an acquire: an attempt that follows the
/// last of its request at once (a retry: not prompted by a look at the
/// holder or by its own client's release of the key between) follows a
/// 503 or no answer, and is never itself retried.
pub(super) fn acquire_retries(run: &Run<'_>, out: &mut Vec<String>) {
    // The previous attempt of each request id, whether it was a retry,
    // and when the try it belongs to began.
    let mut last: BTreeMap<&str, (&Attempt, bool, Duration)> = BTreeMap::new();
    // When each client last looked at each key (`get`) or released it.
    let mut looked: BTreeMap<(usize, &str), Duration> = BTreeMap::new();
    // When a waiter behind another had its turn (a new try follows it).
    let turns = super::turns::turns(run);
    let turn_since =
        |id: &str, since: Duration| turns.iter().any(|(of, turn)| of == id && *turn >= since);
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
            Some((before, before_was_retry, began)) => match &before.answer {
                Some(answer)
                    if a.sent.saturating_sub(answer.at) < IMMEDIATE
                        && a.sent.saturating_sub(before.sent) < LEAST_PAUSE =>
                {
                    if answer.status == 503 && !before_was_retry {
                        // The protocol's single retry.
                        true
                    } else if looked_since(*began) || turn_since(&a.request_id, *began) {
                        // Prompted by a look, by its client's release of
                        // the key, or by its turn in its client's line
                        // since the try began: a new try.
                        false
                    } else {
                        if answer.status != 503 {
                            out.push(format!(
                                "acquire retried after a {}: client {} sent {} again {:?} \
                                 after that answer (at {:?})",
                                answer.status,
                                a.client,
                                a.key,
                                a.sent.saturating_sub(answer.at),
                                a.sent
                            ));
                        } else {
                            out.push(format!(
                                "acquire retried twice: client {}'s acquire of {} at {:?}",
                                a.client, a.key, a.sent
                            ));
                        }
                        true
                    }
                }
                _ => false,
            },
            None => false,
        };
        // When the try this attempt belongs to began: its first attempt
        // (also when that one failed without an answer, or with one its
        // client could not read, and this one followed at once).
        let began = match last.get(a.request_id.as_str()) {
            Some((before, _, began))
                if retry
                    || before.answer.is_none()
                        && before
                            .failed
                            .is_some_and(|failed| a.sent.saturating_sub(failed) < IMMEDIATE) =>
            {
                *began.min(&before.sent)
            }
            _ => a.sent,
        };
        last.insert(a.request_id.as_str(), (a, retry, began));
    }
}

/// One waiting acquire: whose, for which key, from when (its `Waits`
/// event) until its end (its deadline, or its operation's first outcome,
/// whichever came first), at what poll interval, and its requests: its
/// tries (one request id) and its looks (gets), in the order sent.
pub(super) struct AcquireWait<'a> {
    pub(super) client: usize,
    pub(super) key: &'a str,
    pub(super) from: Duration,
    pub(super) end: Duration,
    pub(super) poll: Duration,
    pub(super) requests: Vec<&'a Attempt>,
}

/// Every waiting acquire that sent a try.
pub(super) fn acquire_waits<'a>(run: &Run<'a>) -> Vec<AcquireWait<'a>> {
    let attempts = &run.server.sent.attempts;
    let mut out = Vec::new();
    for (i, e) in run.events.iter().enumerate() {
        let Event::Waits {
            client,
            key,
            until,
            how: Waiting::Acquire,
            poll,
        } = &e.event
        else {
            continue;
        };
        let ended = run.outcome_after(i, *client);
        let end = ended.map_or(*until, |ended| ended.at.min(*until));
        let ours = |a: &&Attempt| a.client == *client && a.key == *key && a.sent >= e.at;
        let Some(first) = attempts
            .iter()
            .filter(ours)
            .find(|a| a.operation == Operation::Acquire)
        else {
            continue;
        };
        let requests = attempts
            .iter()
            .filter(ours)
            .filter(|a| a.request_id == first.request_id || a.operation == Operation::Get)
            .collect();
        out.push(AcquireWait {
            client: *client,
            key,
            from: e.at,
            end,
            poll: *poll,
            requests,
        });
    }
    out
}

/// How much later than its pause allows a waiter's next request may go
/// out: a tick or two of the simulation, and the answer's processing.
pub(super) const PAUSE_SLACK: Duration = Duration::from_millis(150);

/// A waiting acquire keeps trying, and never in a tight loop. While it
/// waits (until its deadline, or until it is granted the key, fails or
/// is dropped), no request of its follows the previous answer by more
/// than its poll interval (+10 %: a waiter refused with 429 polls at its
/// interval ±10 %), unless that answer was one to pause on (a 429, a 5xx)
/// or none came; and after a look that found the key held it never tries
/// again sooner than its least pause (it would then be polling as fast as
/// the network answers); and a try refused for good (400, 401, 403,
/// 404) ends the wait. A waiter that stops trying after its first look,
/// spins, or waits through a revoked key passes every safety check: this
/// catches them.
pub(super) fn waiters(run: &Run<'_>, out: &mut Vec<String>) {
    for w in acquire_waits(run) {
        let AcquireWait {
            client,
            key,
            from,
            mut end,
            poll,
            requests: sent,
        } = w;
        let poll = &poll;
        let allowed = poll.mul_f64(1.1) + PAUSE_SLACK;
        // When the waiter last heard an answer it does not pause on
        // (`None`: one it may pause on for longer, or none), and whether
        // that was a look that found the key held.
        let mut heard = Some(from);
        let mut held_seen = false;
        let freed_between = |a: Duration, b: Duration| run.freed_between(client, key, a, b);
        let mut previous_sent = from;
        // A refusal for good (400, 401, 403, 404) ends the wait.
        let mut refused: Option<(u16, Duration)> = None;
        let mut last_try: Option<&Attempt> = None;
        // The last answer was a look that found the key free: the next try
        // goes at once.
        let mut free_seen = false;
        for a in sent {
            if a.sent >= end {
                break;
            }
            if let Some((status, at)) = refused.take() {
                out.push(format!(
                    "waited through a refusal: client {client}'s wait for {key} was answered \
                     {status} at {at:?} and sent again at {:?}",
                    a.sent
                ));
            }
            // Not while a 429 to any request of its client asks for quiet
            // (the wait pauses past it, plus up to a poll interval).
            let quiet = |h: &Duration| super::aim::quiet_from(run, client, *h, a.sent);
            if let Some(heard) = heard.filter(|h| a.sent > *h + allowed && !quiet(h)) {
                out.push(format!(
                    "stopped trying: client {client}'s wait for {key} (poll {poll:?}) sent \
                     nothing from {heard:?} to {:?}",
                    a.sent
                ));
            }
            if let Some(heard) = heard.filter(|h| held_seen && a.sent < *h + LEAST_PAUSE) {
                if a.operation == Operation::Acquire && !freed_between(previous_sent, a.sent) {
                    out.push(format!(
                        "tight loop: client {client}'s wait for {key} tried again {:?} after \
                         an answer that the key is held (at {:?})",
                        a.sent - heard,
                        a.sent
                    ));
                }
            }
            previous_sent = a.sent;
            if free_seen && a.operation == Operation::Acquire {
                if let Some(heard) =
                    heard.filter(|h| a.sent > *h + IMMEDIATE + PAUSE_SLACK && !quiet(h))
                {
                    out.push(format!(
                        "slow after a free look: client {client}'s wait for {key} found the key \
                         free at {heard:?} and tried only at {:?}",
                        a.sent
                    ));
                }
            }
            let answer = a.answer.as_ref();
            free_seen = a.operation == Operation::Get
                && answer.is_some_and(|o| o.status == 200 && o.fence.is_none());
            // A look that found the key held, or a try refused with 409:
            // either way the next try waits at least a pause.
            held_seen = answer.is_some_and(|o| match a.operation {
                Operation::Get => o.status == 200 && o.fence.is_some(),
                _ => o.status == 409,
            });
            heard = answer
                .filter(|o| matches!(o.status, 200 | 201 | 204 | 404 | 409))
                .map(|o| o.at);
            // (Not a single retry's: the first attempt's uncertain outcome
            // stands over a retry's refusal.)
            let retry_of = last_try.filter(|t: &&Attempt| {
                let seen = t.answer.as_ref().map(|o| o.at).or(t.failed);
                t.answer.as_ref().is_none_or(|o| o.status == 503)
                    && seen.is_some_and(|seen| a.sent <= seen + IMMEDIATE)
            });
            refused = answer
                .filter(|_| a.operation == Operation::Acquire && retry_of.is_none())
                .filter(|o| matches!(o.status, 400 | 401 | 403 | 404))
                .map(|o| (o.status, o.at));
            if a.operation == Operation::Acquire {
                last_try = Some(a);
            }
            if let Some(granted) = answer.filter(|o| o.status == 201) {
                end = end.min(granted.at);
                heard = None;
            }
        }
        // (Quiet to its end, too: 16-client seed 96.)
        let quiet = |h: &Duration| super::aim::quiet_from(run, client, *h, end);
        if let Some(heard) = heard.filter(|h| end > *h + allowed && !quiet(h)) {
            out.push(format!(
                "stopped trying: client {client}'s wait for {key} (poll {poll:?}) sent nothing \
                 from {heard:?} to its end at {end:?}"
            ));
        }
    }
}

/// The protocol's single retry is made: a first attempt of an acquire
/// answered 503, or failed without an answer (or with a success it could
/// not read), is followed at once by a
/// second with the same request id, unless its operation ended first
/// (dropped, its host crashed) or its wait's deadline had passed (no
/// attempt starts after it).
pub(super) fn acquire_retried(run: &Run<'_>, out: &mut Vec<String>) {
    let attempts = &run.server.sent.attempts;
    for (i, a) in attempts.iter().enumerate() {
        let answered_503 = a.answer.as_ref().filter(|o| o.status == 503).map(|o| o.at);
        let Some(seen) = answered_503.or(a.failed) else {
            continue;
        };
        let earlier = attempts[..i]
            .iter()
            .rev()
            .find(|b| b.request_id == a.request_id);
        // A retry itself, or a try after an earlier 503 (not a first).
        let is_retry = earlier.is_some_and(|b| {
            let seen = b.answer.as_ref().map(|o| o.at).or(b.failed);
            b.answer.as_ref().is_none_or(|o| o.status == 503)
                && a.sent <= seen.unwrap_or(b.sent + RETRY_WITHIN) + IMMEDIATE
        });
        if a.operation != Operation::Acquire || is_retry {
            continue;
        }
        let by = seen + IMMEDIATE;
        let retried = attempts[i + 1..]
            .iter()
            .any(|b| b.request_id == a.request_id && b.sent <= by);
        // The operation ended before the failure was seen (an operation
        // that ends with it ends for want of the retry), its host crashed,
        // or its wait's deadline had passed.
        let excused = run.events.iter().any(|e| {
            e.at <= by
                && e.at >= a.sent
                && match &e.event {
                    Event::Crashed { client } => *client == a.client,
                    Event::StepEnded { client } | Event::Note { client, .. } => {
                        *client == a.client && e.at < seen
                    }
                    _ => false,
                }
        }) || wait_deadline(run, a).is_some_and(|until| until <= by);
        if !retried && !excused {
            out.push(format!(
                "acquire not retried: client {}'s acquire of {} failed (503, no answer, or a success it could not read) at \
                 {:?} and was not sent again",
                a.client, a.key, seen
            ));
        }
    }
}

/// The deadline of the wait attempt `a` belongs to, if it waits: its
/// operation's (the client's latest `Waits` before it was sent, on its
/// key or for a set, or `PermitWait` of its semaphore, in the same
/// operation), or its own when it waits
/// behind another task of its client.
fn wait_deadline(run: &Run<'_>, a: &Attempt) -> Option<Duration> {
    let mut deadline = None;
    // The log is in the order events were pushed, which is not always
    // the order of their times (a program's note can follow a later one):
    // every event up to the attempt, not the log up to the first later.
    for e in run.events.iter().filter(|e| e.at <= a.sent) {
        match &e.event {
            Event::Waits {
                client,
                key,
                until,
                how,
                ..
            } if *client == a.client && (*key == a.key || *how == Waiting::Set) => {
                deadline = Some(*until);
            }
            // A wait for a permit: its tries of the semaphore's keys.
            Event::PermitWait {
                client,
                name,
                until,
                ..
            } if *client == a.client
                && a.key
                    .strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.starts_with(':')) =>
            {
                deadline = Some(*until);
            }
            // (Not its own step's, ended in its instant: kept seed 64.)
            Event::StepEnded { client } if *client == a.client && e.at < a.sent => {
                deadline = None;
            }
            _ => {}
        }
    }
    let behind = run.events.iter().find_map(|e| match &e.event {
        Event::Behind {
            request_id, until, ..
        } if *request_id == a.request_id => Some(*until),
        _ => None,
    });
    behind.or(deadline)
}

/// The longest a single retry can follow a first attempt that got no
/// answer: a request timeout (the simulation's 10 s), and a tick.
const RETRY_WITHIN: Duration = Duration::from_millis(10_100);
