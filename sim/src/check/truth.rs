//! No false conflict: what a call reports matches what the server did.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::{sim_time, Server};
use crate::log::{Event, Stamped};

/// A release whose earlier attempt (same request id) was applied, its
/// answer lost, and whose later attempt was answered 409 did free the
/// lease: the call must succeed. A program told "conflict" by it was told
/// something false.
pub(super) fn releases(
    events: &[Stamped],
    server: &Server,
    jumps: &[(Duration, Duration)],
    out: &mut Vec<String>,
) {
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
        let at = sim_time(server, jumps, refused.at);
        let told = events.iter().find(|e| {
            e.at >= at
                && arrived_at.contains(&e.at)
                && matches!(&e.event, Event::Note { client: c, what }
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
