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
struct Window<'a> {
    client: usize,
    key: &'a str,
    from: Duration,
    to: Duration,
    poll: Duration,
}

/// Every observer's window, ended by its `until`, its step's end or its
/// host's crash, whichever came first.
fn windows<'a>(run: &'a Run<'_>) -> Vec<Window<'a>> {
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
        let looks: Vec<_> = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| a.client == w.client && a.key == w.key && a.operation == Operation::Get)
            .filter(|a| a.sent >= w.from && a.sent <= w.to)
            .collect();
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
