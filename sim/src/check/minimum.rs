//! Minimum holds kept by the service: once a scope whose closure returned
//! with time left of its minimum has handed its lease over, the key is
//! another's no sooner than the minimum's end (even if the process died
//! right after), nothing of that lease is released, and the service lets
//! it go by the minimum's end (or the shortest lease, 5 s) plus a second
//! of rounding.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;

/// A minimum the service was asked to keep, and how its scope ended.
struct Asked<'a> {
    client: usize,
    key: &'a str,
    fence: i64,
    /// When the closure returned (sim time).
    returned: Duration,
    /// The minimum's end (sim time).
    until: Duration,
}

/// The minimums whose scopes returned `Ok` with their lease kept by the
/// service.
fn kept<'a>(run: &Run<'a>) -> Vec<Asked<'a>> {
    let mut found = Vec::new();
    for (i, e) in run.events.iter().enumerate() {
        // A minimum capped by an equal `max_hold` ends with the cap.
        let Event::MinimumAsked {
            client,
            key,
            fence,
            left,
            capped: false,
        } = &e.event
        else {
            continue;
        };
        let ended = run.events[i..].iter().find_map(|later| match &later.event {
            Event::MinimumEnded {
                client: c,
                key: k,
                fence: f,
                kept,
            } if c == client && k == key && f == fence => Some(*kept),
            _ => None,
        });
        if ended == Some(true) {
            found.push(Asked {
                client: *client,
                key: key.as_str(),
                fence: *fence,
                returned: e.at,
                until: e.at + *left,
            });
        }
    }
    found
}

/// Every kept minimum holds: no other grant of its key before its end
/// (unless a force-release or a server clock jump broke it), no release of
/// its lease sent after its closure returned (the minimum is the
/// service's to keep, not the process's), and its lease's last expiry
/// within the minimum's end (or 5 s after the keeping renewal) plus the
/// second a whole-second ttl may add.
pub(super) fn kept_by_the_service(run: &Run<'_>, out: &mut Vec<String>) {
    for m in kept(run) {
        let (key, fence) = (m.key, m.fence);
        if let Some(g) = run
            .grants
            .iter()
            .find(|g| g.key == key && g.fence != fence && g.at >= m.returned && g.at < m.until)
        {
            if !run.breaks.any(key, m.returned, g.at) {
                out.push(format!(
                    "min_hold not kept: client {}'s scope on {key} (fence {fence}) returned at \
                     {:?} with its minimum kept until {:?}, but the server granted fence {} at \
                     {:?}",
                    m.client, m.returned, m.until, g.fence, g.at
                ));
            }
        }
        let Some(token) = run.token_of(key, fence) else {
            continue;
        };
        // A try of its acquire that may land late (no answer, a 5xx) is
        // put right by a release once none can, after the minimum's end.
        let late_possible = run.server.sent.attempts.iter().any(|a| {
            a.operation == Operation::Acquire
                && a.token.as_deref() == Some(token)
                && a.answer.as_ref().is_none_or(|o| o.status >= 500)
        });
        if let Some(a) = run.server.sent.attempts.iter().find(|a| {
            a.operation == Operation::Release
                && a.client == m.client
                && a.token.as_deref() == Some(token)
                && a.sent >= m.returned
                && !(late_possible && a.sent >= m.until)
        }) {
            out.push(format!(
                "min_hold kept by the process: client {}'s scope on {key} (fence {fence}) \
                 handed its minimum (until {:?}) to the service at {:?}, then sent a release of \
                 it at {:?}",
                m.client, m.until, m.returned, a.sent
            ));
        }
        // The last expiry the server set for the lease, by a renewal
        // applied after the closure returned, and when that renewal was
        // sent (its ttl is counted from there; the time it took to arrive
        // adds to the expiry).
        let last = run
            .server
            .journal
            .iter()
            .filter(|r| {
                r.operation == Operation::Renew
                    && r.status == Some(200)
                    && r.key == key
                    && r.fencing_token == Some(fence)
            })
            .filter_map(|r| {
                let sent = run
                    .server
                    .sent
                    .attempts
                    .iter()
                    .find(|a| Some(&a.request_id) == r.request_id.as_ref())?
                    .sent;
                Some((sent, run.sim_time(r.at), run.sim_time(r.expires_at?)))
            })
            .rfind(|(_, at, _)| *at >= m.returned);
        let Some((sent, applied, expires)) = last else {
            continue;
        };
        if run.breaks.any(key, m.returned, expires) {
            continue;
        }
        let on_its_way = applied.saturating_sub(sent);
        let latest =
            (m.until + Duration::from_secs(1)).max(sent + Duration::from_secs(5)) + on_its_way;
        // Timestamps carry milliseconds.
        let slack = Duration::from_millis(2);
        if expires + slack < m.until || expires > latest + slack {
            out.push(format!(
                "min_hold expiry wrong: client {}'s scope on {key} (fence {fence}) asked the \
                 service to keep it until {:?}; its last renewal (applied at {applied:?}) set its \
                 expiry to {expires:?}, not within [{:?}, {latest:?}]",
                m.client, m.until, m.until
            ));
        }
    }
}
