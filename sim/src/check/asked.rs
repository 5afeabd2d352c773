//! Options given all at once (`AcquireOptions`, as the `volcano` CLI
//! gives its flags) reach the wire: the hold's acquire goes under the
//! request id the caller set, and an attempt with no answer is given up
//! within the request timeout the caller set.

use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;

/// Leeway: a tick or two of the simulation.
const SLACK: Duration = Duration::from_millis(60);

/// Every hold given its options at once sent its first acquire under the
/// request id asked for, and gave up each attempt of it within the
/// timeout asked for.
pub(super) fn options_reach_the_wire(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::Asked {
            client,
            key,
            request_id,
            timeout,
        } = &e.event
        else {
            continue;
        };
        let step_ended = run.step_ended(i, *client);
        let acquires: Vec<_> = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| a.client == *client && a.key == *key && a.operation == Operation::Acquire)
            .filter(|a| a.sent >= e.at && a.sent < step_ended)
            .collect();
        if let Some(first) = acquires.first().filter(|a| a.request_id != *request_id) {
            out.push(format!(
                "options: client {client}'s hold of {key} asked for request id {request_id}; its \
                 first acquire at {:?} went as {}",
                first.sent, first.request_id
            ));
        }
        let Some(timeout) = timeout else { continue };
        let late = acquires.iter().find(|a| {
            a.request_id == *request_id
                && a.answer.is_none()
                && a.failed
                    .is_some_and(|failed| failed > a.sent + *timeout + SLACK)
        });
        if let Some(late) = late {
            out.push(format!(
                "options: client {client}'s acquire of {key} sent at {:?} with a {timeout:?} \
                 request timeout was given up only at {:?}",
                late.sent, late.failed
            ));
        }
    }
}
