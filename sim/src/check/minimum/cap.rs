//! A kept minimum under a `max_hold` cap: its lease never outlives the
//! cap, whatever a late request or the fix-up's renewals back do.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::end::lease_end;
use super::{kept_at_end, refused_after};
use crate::check::run::Run;
use crate::log::Event;
use crate::net::LATE_MARGIN;

/// Whether a release of `token` went from the job's end (`from`) to `by`,
/// and no renewal (no keep) from `from` on.
fn released_instead(run: &Run<'_>, token: &str, from: Duration, by: Duration) -> bool {
    let of_token = |op| {
        run.server
            .sent
            .attempts
            .iter()
            .filter(move |a| a.operation == op && a.token.as_deref() == Some(token))
    };
    of_token(Operation::Release).any(|a| a.sent >= from && a.sent <= by)
        && !of_token(Operation::Renew).any(|a| a.sent >= from)
}

/// A kept minimum under a `max_hold` never outlives the cap: the keep
/// asks for no more than the cap's whole seconds left, and with less than
/// the shortest lease left of it the lease is released instead.
pub(in crate::check) fn kept_within_the_cap(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::KeepCapped {
            client,
            key,
            fence,
            cap_until,
        } = &e.event
        else {
            continue;
        };
        if !kept_at_end(run, i, *client, key, *fence) {
            continue;
        }
        let Some(token) = run.token_of(key, *fence) else {
            continue;
        };
        let Some(end) = lease_end(run, key, *fence, token) else {
            continue;
        };
        if run.breaks.any(key, e.at, end.at) {
            continue;
        }
        // Sent before the job ended and landed beyond any bound: excused.
        if end
            .set_by
            .is_some_and(|s| s.sent < e.at && end.applied > s.sent + s.timeout + LATE_MARGIN)
        {
            continue;
        }
        let latest = *cap_until + end.transit + Duration::from_millis(2);
        // Released instead of kept, by the cap, late on the network: the
        // lease as the job left it (observers 168: a release held 5.6 s).
        let set_before = end.set_by.is_none_or(|s| s.sent < e.at);
        if set_before && released_instead(run, token, e.at, *cap_until) {
            continue;
        }
        // Set by a late request, and the fix-up meant to put it right was
        // refused for good (a revoked key; kept-minimums seed 49).
        let set_late = end.set_by.is_some_and(|s| s.sent < e.at);
        if set_late && refused_after(run, token, e.at) {
            continue;
        }
        // Its host crashed before the fix-up could put a late request's
        // expiry right (kept-minimums seed 49).
        let crashed = run.events.iter().any(|c| {
            matches!(c.event, Event::Crashed { client: by } if by == *client)
                && c.at >= e.at
                && c.at <= *cap_until
        });
        if set_late && crashed {
            continue;
        }
        // Released by the cap, and that release held back by a fault.
        if release_held_back(run, token, e.at, *cap_until) {
            continue;
        }
        if end.at > latest {
            out.push(format!(
                "min_hold past max_hold: client {client}'s lease on {key} (fence {fence}) was \
                 kept until {:?}, past its cap at {cap_until:?}",
                end.at
            ));
        }
    }
}

/// Whether a release of `token` went from the job's end (`from`) by the
/// cap (`by`) and was not answered by then (no answer, a 5xx or a 429, or
/// an answer after it): a fault held the key past the cap, not the SDK
/// (kept-minimums seeds 21 and 143: the release at the minimum's end, at
/// the cap, reset and answered 504 for 4 s).
fn release_held_back(run: &Run<'_>, token: &str, from: Duration, by: Duration) -> bool {
    run.server.sent.attempts.iter().any(|a| {
        a.operation == Operation::Release
            && a.token.as_deref() == Some(token)
            && a.sent >= from
            && a.sent <= by + Duration::from_millis(2)
            && a.answer
                .as_ref()
                .is_none_or(|o| o.status >= 500 || o.status == 429 || o.at > by)
    })
}
