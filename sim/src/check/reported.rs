//! What the SDK reports of a minimum hold, against what the service did.

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;

/// `release_reporting` says "kept" whenever the service kept it: a
/// minimum asked for and reported not kept had no keeping renewal answered
/// 200 (sent by its client, with its token, once its job had ended),
/// unless its host's lease clock jumped meanwhile (a suspend).
pub(super) fn reported_as_kept(run: &Run<'_>, out: &mut Vec<String>) {
    for e in run.events.iter() {
        let Event::MinimumReported {
            client,
            key,
            fence,
            kept: false,
        } = &e.event
        else {
            continue;
        };
        let Some(token) = run.token_of(key, *fence) else {
            continue;
        };
        // Its job's end: the `MinimumAsked` just before.
        let Some(asked) = run.events.iter().rev().find(|a| {
            a.at <= e.at
                && matches!(&a.event, Event::MinimumAsked { client: c, key: k, fence: f, .. }
                    if c == client && k == key && f == fence)
        }) else {
            continue;
        };
        // Its host's lease clock jumped (a suspend) before the answer was
        // read: by that clock the lease had run out (16-client seed 691).
        if run.lease_clock_moved(*client, asked.at, e.at) {
            continue;
        }
        if let Some(a) = run.server.sent.attempts.iter().find(|a| {
            a.operation == Operation::Renew
                && a.client == *client
                && a.token.as_deref() == Some(token)
                && a.sent >= asked.at
                && a.sent <= e.at
                // (One answered with another fence renewed another lease
                // of the token, which a late try of its acquire took.)
                && a.answer.as_ref().is_some_and(|o| o.status == 200 && o.fence == Some(*fence))
        }) {
            out.push(format!(
                "min_hold reported not kept: client {client}'s minimum on {key} (fence {fence}) \
                 was kept by a renewal sent at {:?} and answered 200, yet release_reporting said \
                 it was not",
                a.sent
            ));
        }
    }
}
