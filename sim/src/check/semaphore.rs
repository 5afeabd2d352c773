//! Semaphores: a program's `with_permit` on `{key}-sem` (two permits) only
//! ever tries `{key}-sem:0` or `{key}-sem:1`. With exclusion per key
//! (checked for every key), the server then never lets more than two
//! holders of a semaphore hold at once. A wait for a permit starts no
//! try after its deadline, and a try that does not wait says "every permit
//! taken" only when it saw each one held.

use volcano_mock_server::Operation;

use crate::log::Event;

use std::time::Duration;

use super::run::Run;

/// The permits a semaphore of the programs has, by the end of its name:
/// `{key}-sem` two, `{key}-sem3` three.
fn permits_of(name: &str) -> Option<u32> {
    if name.ends_with("-sem") {
        Some(2)
    } else if name.ends_with("-sem3") {
        Some(3)
    } else {
        None
    }
}

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
        let Some(permits) = permits_of(name) else {
            continue;
        };
        if index.parse::<u32>().map_or(true, |i| i >= permits) {
            let granted = a.answer.as_ref().and_then(|o| o.fence);
            out.push(format!(
                "semaphore {name} of {permits} permits: client {} tried {} at {:?} (granted fence \
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
            ..
        } = &e.event
        else {
            continue;
        };
        let ended = run.events[i..]
            .iter()
            .find(|later| {
                matches!(later.event,
                    Event::PermitWaitEnded { client: c, .. } | Event::StepEnded { client: c } | Event::Crashed { client: c }
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

/// A try for a permit that does not wait says "every permit taken" only
/// when, during that try, it sent an acquire of each permit's key that was
/// answered 409 (held): one it did not try, or whose try was not answered
/// so, may have been free.
pub(super) fn all_taken_only_when_seen(run: &Run<'_>, out: &mut Vec<String>) {
    for e in run.events {
        let Event::PermitTry {
            client,
            name,
            permits,
            began,
            all_taken: true,
        } = &e.event
        else {
            continue;
        };
        let unseen: Vec<u32> = (0..*permits)
            .filter(|i| {
                let key = format!("{name}:{i}");
                !run.server.sent.attempts.iter().any(|a| {
                    a.client == *client
                        && a.operation == Operation::Acquire
                        && a.key == key
                        && a.sent >= *began
                        && a.sent <= e.at
                        && a.answer.as_ref().is_some_and(|o| o.status == 409)
                })
            })
            .collect();
        if !unseen.is_empty() {
            out.push(format!(
                "semaphore {name}: client {client}'s try (from {began:?} to {:?}) said every \
                 permit was taken, but never saw permits {unseen:?} held",
                e.at
            ));
        }
    }
}

/// A wait for a permit finds one that stays free for a whole rotation: it
/// tries one permit a round, the one it saw held longest ago, so a permit
/// free for as many rounds as there are permits (each at most the poll
/// interval, +10 %) is tried while free. A wait still without a permit
/// after one was free that long, judged where no fault touched the
/// stretch, did not deliver.
pub(super) fn waits_find_a_free_permit(run: &Run<'_>, out: &mut Vec<String>) {
    for (i, e) in run.events.iter().enumerate() {
        let Event::PermitWait {
            client,
            name,
            until,
            poll,
            permits,
        } = &e.event
        else {
            continue;
        };
        let Some((ended, Some(_))) = wait_end(run, i, *client) else {
            continue;
        };
        // A scope's wait ends when its closure has run: it got its permit
        // when it began to believe it held one.
        let prefix = format!("{name}:");
        let ended = run.events[i..]
            .iter()
            .take_while(|later| later.at <= ended)
            .find(|later| {
                matches!(&later.event, Event::Believes { client: c, key, .. }
                    if c == client && key.starts_with(&prefix))
            })
            .map_or(ended, |got| got.at);
        // A rotation, and a try's round trip before the wait's last moment.
        let rotation = (poll.mul_f64(1.1) + Duration::from_millis(300)) * *permits;
        let to = ended.min(*until).saturating_sub(Duration::from_secs(1));
        for p in 0..*permits {
            let key = format!("{name}:{p}");
            let Some((a, b)) = free_stretches(run, &key, e.at, to)
                .into_iter()
                .find(|(a, b)| b.saturating_sub(*a) > rotation)
            else {
                continue;
            };
            // Faults of its host (a suspend, a partition, a slow link) and
            // server clock jumps; the server's own faults show in its
            // requests' answers, below.
            let faulty = run.events.iter().any(|f| {
                let its_own = match &f.event {
                    Event::Fault { what } => super::recovery::touches(what, *client),
                    Event::ServerJump { .. } => true,
                    _ => false,
                };
                its_own && f.at + Duration::from_secs(15) >= a && f.at <= b
            }) || run.breaks.any(&key, a, b)
                // Its client's requests then went unanswered (a partition),
                // came back slowly (a slow link) or were told to wait (429,
                // 5xx).
                || run.server.sent.attempts.iter().any(|r| {
                    r.client == *client
                        && r.sent + r.timeout >= a
                        && r.sent <= ended
                        && r.answer.as_ref().is_none_or(|o| {
                            o.status == 429
                                || o.status >= 500
                                || o.at > r.sent + Duration::from_millis(500)
                        })
                });
            if !faulty {
                out.push(format!(
                    "semaphore {name}: client {client}'s wait (poll {poll:?}) still had no permit \
                     at {ended:?}, though {key} was free from {a:?} to {b:?}"
                ));
                break;
            }
        }
    }
}

/// The stretches from `from` to `to` (sim time) in which `key` was free on
/// the server: no lease granted and not yet released, expired (with the
/// service's 1 s grace) or force-released.
fn free_stretches(
    run: &Run<'_>,
    key: &str,
    from: Duration,
    to: Duration,
) -> Vec<(Duration, Duration)> {
    let grace = Duration::from_secs(1);
    // Held intervals, in the order the server applied requests.
    let mut held: Vec<(Duration, Duration)> = Vec::new();
    let mut current: Option<(Duration, Duration)> = None;
    for r in run.server.journal.iter().filter(|r| r.key == key) {
        let at = run.sim_time(r.at);
        if let Some((start, end)) = current {
            if at >= end {
                held.push((start, end));
                current = None;
            }
        }
        match (r.operation, r.status) {
            (Operation::Acquire, Some(201)) | (Operation::Renew, Some(200)) => {
                let Some(expires) = r.expires_at else {
                    continue;
                };
                let end = run.sim_time(expires) + grace;
                current = Some(match current {
                    Some((start, _)) => (start, end),
                    None => (at, end),
                });
            }
            (Operation::Release | Operation::ForceRelease, Some(204)) => {
                if let Some((start, _)) = current.take() {
                    held.push((start, at));
                }
            }
            _ => {}
        }
    }
    held.extend(current);
    let mut free = Vec::new();
    let mut cursor = from;
    for (start, end) in held {
        if start > cursor && start > from {
            free.push((cursor, start.min(to)));
        }
        cursor = cursor.max(end);
    }
    if cursor < to {
        free.push((cursor, to));
    }
    free.retain(|(a, b)| b > a);
    free
}

/// How the wait for a permit logged at event `i` ended: when, and (when it
/// ended by itself, not dropped or crashed) whether it said every permit
/// stayed taken.
pub(super) fn wait_end(run: &Run<'_>, i: usize, client: usize) -> Option<(Duration, Option<bool>)> {
    run.events[i..].iter().find_map(|later| match &later.event {
        Event::PermitWaitEnded { client: c, held } if *c == client => Some((later.at, Some(*held))),
        Event::StepEnded { client: c } | Event::Crashed { client: c } if *c == client => {
            Some((later.at, None))
        }
        _ => None,
    })
}
