//! Semaphores: a program's `with_permit` on `{key}-sem` (two permits) only
//! ever tries `{key}-sem:0` or `{key}-sem:1`. With exclusion per key
//! (checked for every key), the server then never lets more than two
//! holders of a semaphore hold at once. And a wait for a permit starts no
//! try after its deadline.

use volcano_mock_server::Operation;

use crate::log::Event;

use std::time::Duration;

use super::run::Run;

/// The permits a semaphore of the programs has.
const PERMITS: u32 = 2;

/// Every acquire of a semaphore's key is of one of its permits (granted
/// or not).
pub(super) fn within_count(run: &Run<'_>, out: &mut Vec<String>) {
    for a in &run.server.sent.attempts {
        if a.operation != Operation::Acquire {
            continue;
        }
        let Some((name, index)) = a.key.rsplit_once(':') else {
            continue;
        };
        if !name.ends_with("-sem") {
            continue;
        }
        if index.parse::<u32>().map_or(true, |i| i >= PERMITS) {
            let granted = a.answer.as_ref().and_then(|o| o.fence);
            out.push(format!(
                "semaphore {name} of {PERMITS} permits: client {} tried {} at {:?} (granted fence \
                 {granted:?}), a permit past its count",
                a.client, a.key, a.sent
            ));
        }
    }
}

/// A wait for a permit sends no acquire of its semaphore's keys after its
/// deadline.
pub(super) fn waits_end_by_their_deadline(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::PermitWait {
            client,
            name,
            until,
        } = &e.event
        else {
            continue;
        };
        let ended = run.events[i..]
            .iter()
            .find(|later| {
                matches!(later.event,
                    Event::PermitWaitEnded { client: c } | Event::StepEnded { client: c } | Event::Crashed { client: c }
                    if c == *client)
            })
            .map_or(Duration::MAX, |later| later.at);
        let prefix = format!("{name}:");
        if let Some(late) = run.server.sent.attempts.iter().find(|a| {
            a.client == *client
                && a.operation == Operation::Acquire
                && a.key.starts_with(&prefix)
                && a.sent > *until
                && a.sent < ended
        }) {
            out.push(format!(
                "semaphore {name}: client {client}'s wait until {until:?} tried {} at {:?}, \
                 after its deadline",
                late.key, late.sent
            ));
        }
    }
}
