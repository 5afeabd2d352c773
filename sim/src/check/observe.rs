//! What an observer (`locks.observe`) said, against what the server did,
//! and how often it looked.
//!
//! Safety: a change called released was freed by a release (or a
//! force-release) before the expiry the observer had seen; one called
//! expired was not freed so before that expiry's last second; a renewal is
//! of the same fence. Liveness: every fence an answer showed the observer
//! was reported (a takeover is never missed), and the observer looked
//! again within its poll interval after an answer, within two after a
//! failure (a minute more after a 429), until its step ended or a look
//! was refused (400, 401, 403, 404: the stream ends there).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;

/// The simulation's time step, and a little: how late a look may come.
const SLACK: Duration = Duration::from_millis(100);
/// The longest a look can take to fail (the programs' request timeout).
const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `Retry-After` an observer honours.
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// One observation: who, which key, from when to when, how often.
pub(super) struct Window<'a> {
    pub(super) client: usize,
    pub(super) key: &'a str,
    pub(super) from: Duration,
    pub(super) to: Duration,
    pub(super) poll: Duration,
}

/// Every observer's window, ended by its `until`, its step's end or its
/// host's crash, whichever came first.
pub(super) fn windows<'a>(run: &'a Run<'_>) -> Vec<Window<'a>> {
    let mut out = Vec::new();
    for (i, e) in run.events.iter().enumerate() {
        let Event::Observing {
            client,
            key,
            until,
            poll,
        } = &e.event
        else {
            continue;
        };
        let ended = run.events[i + 1..].iter().find(|later| {
            matches!(later.event,
                Event::StepEnded { client: c } | Event::Crashed { client: c } if c == *client)
        });
        let to = ended.map_or(*until, |later| later.at.min(*until));
        // A 429 to any of its client's requests holds its observers back
        // until the window it names (the client's quota clock): judged up
        // to the first such answer.
        let to = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| a.client == *client)
            .filter_map(|a| a.answer.as_ref())
            .filter(|o| o.status == 429 && o.at < to)
            .filter(|o| o.at + o.retry_after.unwrap_or_default().min(MAX_PAUSE) > e.at)
            .map(|o| o.at.max(e.at))
            .min()
            .unwrap_or(to);
        out.push(Window {
            client: *client,
            key,
            from: e.at,
            to,
            poll: *poll,
        });
    }
    out
}

/// When each lease (key, fence) was freed by a release or a
/// force-release while it was still current (server clock), from the
/// journal: a release after its expiry's grace freed nothing of it.
fn frees<'a>(run: &'a Run<'_>) -> BTreeMap<(&'a str, i64), DateTime<Utc>> {
    let grace = TimeDelta::seconds(1);
    let mut current: BTreeMap<&str, (i64, DateTime<Utc>)> = BTreeMap::new();
    let mut freed = BTreeMap::new();
    for r in &run.server.journal {
        let key = r.key.as_str();
        match (r.operation, r.status) {
            (Operation::Acquire, Some(201)) | (Operation::Renew, Some(200)) => {
                if let (Some(fence), Some(expires_at)) = (r.fencing_token, r.expires_at) {
                    current.insert(key, (fence, expires_at));
                }
            }
            (Operation::Release | Operation::ForceRelease, Some(204)) => {
                if let Some((fence, expires_at)) = current.remove(key) {
                    if r.at < expires_at + grace {
                        freed.entry((key, fence)).or_insert(r.at);
                    }
                }
            }
            _ => {}
        }
    }
    freed
}

/// The observer's looks within its window, in the order sent.
pub(super) fn looks_in<'a>(run: &'a Run<'_>, w: &Window<'_>) -> Vec<&'a crate::net::Attempt> {
    run.server
        .sent
        .attempts
        .iter()
        .filter(|a| a.client == w.client && a.key == w.key && a.operation == Operation::Get)
        .filter(|a| a.sent >= w.from && a.sent <= w.to)
        .collect()
}

/// Released and expired told right; a renewal is of the same fence.
pub(super) fn told_right(run: &Run<'_>, out: &mut Vec<String>) {
    let freed = frees(run);
    for e in run.events {
        let Event::Observed {
            client,
            key,
            kind,
            fence,
            before,
        } = &e.event
        else {
            continue;
        };
        let at = e.at;
        match (*kind, before) {
            ("released", Some((old, seen_expiry))) => {
                let by_release = freed
                    .get(&(key.as_str(), *old))
                    .is_some_and(|t| t < seen_expiry);
                if !by_release {
                    out.push(format!(
                        "observe: client {client} called the end of {key} fence {old} a release \
                         at {at:?}, but nothing released it before its expiry {seen_expiry}"
                    ));
                }
            }
            ("expired", Some((old, seen_expiry))) => {
                if let Some(t) = freed.get(&(key.as_str(), *old)) {
                    if *t < *seen_expiry - TimeDelta::seconds(1) {
                        out.push(format!(
                            "observe: client {client} called the end of {key} fence {old} an \
                             expiry at {at:?}, but it was released at {t}, before its last \
                             second (expiry {seen_expiry})"
                        ));
                    }
                }
            }
            ("renewed", Some((old, _))) if Some(*old) != *fence => out.push(format!(
                "observe: client {client} called a change of {key} from fence {old} to \
                 {fence:?} a renewal at {at:?} (a takeover)"
            )),
            _ => {}
        }
    }
}

/// Whether anything renewed, released, force-released or acquired `key`
/// on the server from `after` (a look's instant: a release handled in
/// the same millisecond after the look counts; observers seed 86) until
/// strictly before `before` (server clock).
pub(super) fn lease_moved(
    journal: &[volcano_mock_server::RecordedRequest],
    key: &str,
    after: DateTime<Utc>,
    before: DateTime<Utc>,
) -> bool {
    journal.iter().any(|r| {
        r.key == key
            && r.at >= after
            && r.at < before
            && matches!(
                (r.operation, r.status),
                (Operation::Renew, Some(200))
                    | (Operation::Release | Operation::ForceRelease, Some(204))
                    | (Operation::Acquire, Some(201))
            )
    })
}

/// Whether a look was refused for good: another would be too.
fn refused(look: &crate::net::Attempt) -> bool {
    look.answer
        .as_ref()
        .is_some_and(|a| matches!(a.status, 400 | 401 | 403 | 404))
}

/// Every fence an answer showed the observer was reported, and it kept
/// looking at its cadence, until a look was refused.
pub(super) fn kept_looking(run: &Run<'_>, out: &mut Vec<String>) {
    for w in windows(run) {
        let looks = looks_in(run, &w);
        let reported: Vec<Option<i64>> = run
            .events
            .iter()
            .filter(|e| e.at >= w.from && e.at <= w.to)
            .filter_map(|e| match &e.event {
                Event::Observed {
                    client, key, fence, ..
                } if *client == w.client && key == w.key => Some(*fence),
                _ => None,
            })
            .collect();
        for look in &looks {
            let Some(answer) = look.answer.as_ref().filter(|a| a.status == 200) else {
                continue;
            };
            if answer.at < w.to && answer.fence.is_some() && !reported.contains(&answer.fence) {
                out.push(format!(
                    "observe: client {} was shown {} held under fence {:?} at {:?} and never \
                     reported it",
                    w.client, w.key, answer.fence, answer.at
                ));
            }
        }
        // When the observer must have looked again after each look.
        let due = |look: &crate::net::Attempt| match &look.answer {
            Some(a) if a.status == 200 => a.at + w.poll + SLACK,
            Some(a) if a.status == 429 => a.at + MAX_PAUSE + w.poll.min(MAX_PAUSE) + SLACK,
            Some(a) => a.at + 2 * w.poll + SLACK,
            None => look.sent + TIMEOUT + 2 * w.poll + SLACK,
        };
        let mut last = None;
        for (i, look) in looks.iter().enumerate() {
            // A refusal (400, 401, 403, 404) ends the stream: no look
            // after it, and none due.
            if refused(look) {
                if let Some(again) = looks.get(i + 1) {
                    out.push(format!(
                        "observe: client {} looked at {} again at {:?} after a look was refused \
                         ({:?})",
                        w.client,
                        w.key,
                        again.sent,
                        look.answer.as_ref().map(|a| a.status)
                    ));
                }
                last = None;
                break;
            }
            if let Some(due) = last {
                if look.sent > due {
                    out.push(format!(
                        "observe: client {} looked at {} at {:?}, later than due ({due:?})",
                        w.client, w.key, look.sent
                    ));
                }
            }
            last = Some(due(look));
        }
        if let Some(due) = last.filter(|due| *due < w.to) {
            out.push(format!(
                "observe: client {} stopped looking at {}: a look was due at {due:?}, and none \
                 came before its step ended at {:?}",
                w.client, w.key, w.to
            ));
        }
    }
}

/// How late past a lease's expiry an observer may report that it ended:
/// the service's second of grace and the observer's look after it
/// (1.1 s), its spread (0.5 s), a round trip and a tick.
const SEEN_GONE_WITHIN: Duration = Duration::from_millis(2_000);

/// The longest round trip of a look on an undisturbed stretch.
const QUICK: Duration = Duration::from_millis(200);

/// An expiry is told from a release, promptly: a lease that a regular
/// look showed at least 2.5 s before its expiry, and that then ran out
/// (not renewed, not released), is reported ended as `expired` (or
/// `taken_over`, when another took it before the look after the grace)
/// within
/// [`SEEN_GONE_WITHIN`] of its expiry, when nothing disturbed the stretch
/// (no fault on the observer's host or on looks, no server clock jump,
/// from a second before the look until then; every look in it answered
/// within [`QUICK`]: a slow link delays every look). A look is regular when it came at
/// least 0.9 of the poll interval after the answer before it (or was the
/// first): a look at a lease's last moments that found it renewed spends
/// the next one until a regular look. Judged on exact clocks only.
pub(super) fn sees_expiry(run: &Run<'_>, out: &mut Vec<String>) {
    // Its looks are timed on the host's clock: judged on an exact one.
    if run.clock_rate != 1.0 {
        return;
    }
    let journal = &run.server.journal;
    for w in windows(run) {
        let looks = looks_in(run, &w);
        let mut judged = Vec::new();
        for (n, look) in looks.iter().enumerate() {
            let regular = n == 0
                || looks[n - 1].answer.as_ref().is_some_and(|prev| {
                    look.sent + Duration::from_millis(50) >= prev.at + w.poll.mul_f64(0.9)
                });
            let Some(seen) = journal.iter().find(|r| {
                r.request_id.as_deref() == Some(look.request_id.as_str()) && r.status == Some(200)
            }) else {
                continue;
            };
            let (Some(fence), Some(expiry)) = (seen.fencing_token, seen.expires_at) else {
                continue;
            };
            if !regular || judged.contains(&(fence, expiry)) {
                continue;
            }
            let expires = run.sim_time(expiry);
            let due = expires + SEEN_GONE_WITHIN;
            if expires < run.sim_time(seen.at) + Duration::from_millis(2_500) || due >= w.to {
                continue;
            }
            // It ran out: nothing renewed, released or took the key
            // before its grace ended.
            let grace_end = expiry + chrono::TimeDelta::seconds(1);
            let touched = super::observe::lease_moved(journal, w.key, seen.at, grace_end);
            let from = look.sent.saturating_sub(Duration::from_secs(1));
            let disturbed = run.events.iter().any(|e| {
                e.at >= from
                    && e.at <= due
                    && match &e.event {
                        Event::Fault { what } => {
                            super::recovery::touches(what, w.client) || what.contains("on Get")
                        }
                        Event::ServerJump { .. } => true,
                        Event::Crashed { client } => *client == w.client,
                        _ => false,
                    }
            }) || looks.iter().any(|l| {
                l.sent >= look.sent
                    && l.sent <= due
                    && l.answer
                        .as_ref()
                        .is_none_or(|a| a.status != 200 || a.at > l.sent + QUICK)
            });
            if touched || disturbed {
                continue;
            }
            judged.push((fence, expiry));
            let reported = run.events.iter().find(|e| {
                e.at > look.sent
                    && matches!(&e.event, Event::Observed { client, key, before: Some((old, _)), kind, .. }
                        if *client == w.client && key == w.key && *old == fence && *kind != "renewed")
            });
            match reported {
                // Due by then: a look sent by then, and its quick answer.
                Some(e)
                    if e.at <= due + QUICK
                        && matches!(&e.event, Event::Observed { kind, .. }
                            if *kind == "expired" || *kind == "taken_over") => {}
                Some(e) => out.push(format!(
                    "observe: client {} saw {} fence {fence} at {:?} (a regular look), it expired \
                     at {expires:?} undisturbed, and the observer reported {:?} at {:?} (due as \
                     expired by {due:?})",
                    w.client,
                    w.key,
                    look.sent,
                    match &e.event {
                        Event::Observed { kind, .. } => *kind,
                        _ => "",
                    },
                    e.at
                )),
                None => out.push(format!(
                    "observe: client {} saw {} fence {fence} at {:?} (a regular look), it expired \
                     at {expires:?} undisturbed, and the observer never reported its end (due by \
                     {due:?})",
                    w.client, w.key, look.sent
                )),
            }
        }
    }
}
