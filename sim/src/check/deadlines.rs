//! Deadlines: an operation that waits for a held key keeps its deadline,
//! neither giving up before it (on any error that says "try again") nor
//! trying after it.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::{Event, Waiting};

/// A wait keeps its deadline: an operation that waits for a key never
/// fails before its deadline with an error that says "try again" (the
/// key held, a 429, a 5xx, no answer), and never starts a try after it
/// (the tries of one waiting acquire share its request id).
pub(super) fn waits(run: &Run<'_>, out: &mut Vec<String>) {
    let events = run.events;
    for (i, e) in events.iter().enumerate() {
        let Event::Waits {
            client,
            key,
            until,
            how,
            ..
        } = &e.event
        else {
            continue;
        };
        if *how == Waiting::Campaign {
            continue;
        }
        let ended = run.outcome_after(i, *client);
        // Failed with an error that says "try again" (the key held, a
        // 429, a 5xx, no answer) before the deadline: it gave up early.
        let gave_up = ended.filter(|ended| {
            matches!(
                &ended.event,
                Event::Note {
                    try_again: Some(true),
                    ..
                }
            )
        });
        if let Some(gave_up) = gave_up.filter(|e| e.at < *until) {
            let Event::Note { what, .. } = &gave_up.event else {
                continue;
            };
            out.push(format!(
                "gave up early: client {client}'s wait for {key} until {until:?} failed at {:?}: \
                 {what}",
                gave_up.at
            ));
        }
        // The waiting acquire of this operation (a set's keys are
        // acquired one by one, each with its own wait: not checked here).
        if *how != Waiting::Acquire {
            continue;
        }
        let step_ended = events[i + 1..]
            .iter()
            .find(|later| matches!(later.event, Event::StepEnded { client: c } if c == *client))
            .map_or(Duration::MAX, |later| later.at);
        let attempts = &run.server.sent.attempts;
        let first = attempts.iter().find(|a| {
            a.client == *client
                && &a.key == key
                && a.operation == Operation::Acquire
                && a.sent >= e.at
                && a.sent <= step_ended
        });
        let Some(first) = first else { continue };
        let late = attempts
            .iter()
            .filter(|a| a.request_id == first.request_id)
            .find(|a| a.sent > *until);
        if let Some(late) = late {
            out.push(format!(
                "tried after its deadline: client {client}'s wait for {key} until {until:?} sent \
                 a try at {:?}",
                late.sent
            ));
        }
    }
}
