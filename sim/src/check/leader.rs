//! Leaders with capped terms (`max_hold`) share the key: after a term
//! ends by its cap, its leader campaigns again no sooner than its poll
//! interval, the time every other candidate takes to try. A leader that
//! campaigns again at once wins every time and the cap shares nothing.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::{Event, Waiting};

/// Leeway: a tick or two of the simulation.
const SLACK: Duration = Duration::from_millis(60);

/// After a term ended by its cap (`MaxHold`), the leader's next acquire
/// of the key comes at least its poll interval later.
pub(super) fn makes_way(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::Ended {
            client, key, why, ..
        } = &e.event
        else {
            continue;
        };
        if why != "MaxHold" {
            continue;
        }
        // The campaign it belongs to: the client's latest wait, if it is a
        // leader's on this key.
        let campaign = run.events[..i].iter().rev().find_map(|w| match &w.event {
            Event::Waits {
                client: c,
                key: k,
                how,
                poll,
                ..
            } if c == client => Some((k == key && *how == Waiting::Campaign, *poll)),
            _ => None,
        });
        let Some((true, poll)) = campaign else {
            continue;
        };
        // Within the campaign: once `until` fires, its step ends and the
        // next step may acquire the key at once.
        let step_ended = run.events[i..]
            .iter()
            .find(|later| matches!(later.event, Event::StepEnded { client: c } if c == *client))
            .map_or(Duration::MAX, |later| later.at);
        let next = run.server.sent.attempts.iter().find(|a| {
            a.client == *client
                && a.key == *key
                && a.operation == Operation::Acquire
                && a.sent > e.at
                && a.sent < step_ended
        });
        if let Some(next) = next.filter(|a| a.sent + SLACK < e.at + poll) {
            out.push(format!(
                "leader did not make way: client {client}'s term on {key} ended by its cap at \
                 {:?}, and it campaigned again at {:?}, sooner than its poll interval ({poll:?})",
                e.at, next.sent
            ));
        }
    }
}
