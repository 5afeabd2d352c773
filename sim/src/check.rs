//! The checks after every seed, over the programs' log and the server's
//! journal and locks. Each violation is one line of text.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use volcano_mock_server::{LockSnapshot, Operation, RecordedRequest};

use crate::log::{Event, Stamped, Waiting};

mod leaks;
mod linear;
mod recovery;
mod truth;

/// What the server says happened, and how to read its clock.
pub(crate) struct Server {
    pub(crate) journal: Vec<RecordedRequest>,
    /// Its leases after the programs ended and the crashed ones' expired.
    pub(crate) locks_at_end: Vec<LockSnapshot>,
    /// Its clock's reading then. (A snapshot's own `live` is computed on
    /// the clock of the caller's runtime, and the checks run outside any.)
    pub(crate) now_at_end: DateTime<Utc>,
    /// Its clock's reading when the server started, at `started` (sim time).
    pub(crate) epoch: DateTime<Utc>,
    pub(crate) started: Duration,
    /// What the clients sent.
    pub(crate) sent: crate::net::Sent,
}

/// A program's belief that it holds `key` under `fence`, from `from` to `to`.
#[derive(Debug)]
pub(super) struct Belief {
    pub(super) client: usize,
    pub(super) key: String,
    pub(super) fence: i64,
    pub(super) from: Duration,
    pub(super) to: Duration,
}

/// A grant of `key` to the lease with `fence`, at `at` (sim time).
struct Grant {
    key: String,
    fence: i64,
    at: Duration,
}

/// Every check; the violations found.
pub(crate) fn all(events: &[Stamped], server: &Server, end: Duration) -> Vec<String> {
    let jumps: Vec<(Duration, Duration)> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::ServerJump { by } => Some((e.at, by)),
            _ => None,
        })
        .collect();
    let grants = grants(server, &jumps);
    let breaks = Breaks {
        forced: forced(server, &jumps),
        jumps: jumps.iter().map(|&(at, _)| at).collect(),
    };
    let beliefs = beliefs(events, end);
    let mut violations = Vec::new();
    // Liveness, coarsely: three programs of mostly holds and scopes on two
    // keys always get some lock (a guard or a lease), whatever the faults.
    // (One or two programs may, by the seed, do little but try and
    // force-release under faults: the check needs three.)
    let leased = events
        .iter()
        .any(|e| matches!(e.event, Event::Leased { .. }));
    let programs: BTreeSet<usize> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::Done { client, .. } | Event::StepEnded { client } => Some(client),
            _ => None,
        })
        .collect();
    if programs.len() >= 3 && beliefs.is_empty() && !leased {
        violations.push("liveness: no program held any key in the whole run".to_owned());
    }
    exclusion(&beliefs, &grants, &breaks, &mut violations);
    granted(&beliefs, &grants, &mut violations);
    writes(events, &grants, &breaks, &mut violations);
    fences(&grants, &mut violations);
    within_lease(&beliefs, &grants, server, &jumps, &breaks, &mut violations);
    leaks::undone(events, server, &jumps, &breaks, &mut violations);
    leaks::at_end(events, server, &mut violations);
    leaks::reported_at_shutdown(events, server, &jumps, &mut violations);
    recovery::after_crash(events, &beliefs, server, &jumps, &breaks, &mut violations);
    recovery::after_release(events, server, &breaks, &mut violations);
    truth::releases(events, server, &jumps, &mut violations);
    truth::successes(events, server, &mut violations);
    remaining(events, &grants, server, &jumps, &breaks, &mut violations);
    waits(events, server, &mut violations);
    no_write_after_loss(events, &mut violations);
    for e in events {
        if let Event::Contract { client, what } = &e.event {
            violations.push(format!(
                "guard contract: client {client} at {:?}: {what}",
                e.at
            ));
        }
    }
    truth::backoff(server, &mut violations);
    let history = history(server, &jumps);
    linear::server(&history, &mut violations);
    linear::clients(&server.sent.attempts, &history, &mut violations);
    violations
}

/// The journal with what each request id carried (token, TTL), on sim time.
fn history(server: &Server, jumps: &[(Duration, Duration)]) -> Vec<linear::Entry> {
    let mut carried: BTreeMap<&str, &crate::net::Attempt> = BTreeMap::new();
    for a in &server.sent.attempts {
        carried.entry(a.request_id.as_str()).or_insert(a);
    }
    server
        .journal
        .iter()
        .map(|r| {
            let sent = r.request_id.as_deref().and_then(|id| carried.get(id));
            linear::Entry {
                seq: r.seq,
                at: r.at,
                sim_at: sim_time(server, jumps, r.at),
                operation: r.operation,
                key: r.key.clone(),
                request_id: r.request_id.clone(),
                token: sent.and_then(|a| a.token.clone()),
                ttl_seconds: sent.and_then(|a| a.ttl_seconds),
                status: r.status,
                fault: r.fault,
                fence: r.fencing_token,
                expires_at: r.expires_at,
            }
        })
        .collect()
}

/// The server's grants (acquires answered 201), on sim time.
fn grants(server: &Server, jumps: &[(Duration, Duration)]) -> Vec<Grant> {
    let mut grants: Vec<Grant> = server
        .journal
        .iter()
        .filter(|r| r.operation == Operation::Acquire && r.status == Some(201))
        .filter_map(|r| {
            Some(Grant {
                key: r.key.clone(),
                fence: r.fencing_token?,
                at: sim_time(server, jumps, r.at),
            })
        })
        .collect();
    grants.sort_by_key(|g| g.at);
    grants
}

/// When the server applied a force-release, per key (sim time).
fn forced(server: &Server, jumps: &[(Duration, Duration)]) -> Vec<(String, Duration)> {
    server
        .journal
        .iter()
        .filter(|r| r.operation == Operation::ForceRelease && r.status == Some(204))
        .map(|r| (r.key.clone(), sim_time(server, jumps, r.at)))
        .collect()
}

/// What breaks exclusion by design: force-releases and server clock jumps.
pub(super) struct Breaks {
    forced: Vec<(String, Duration)>,
    jumps: Vec<Duration>,
}

impl Breaks {
    /// Whether one happened to `key` in `[from, to]`.
    pub(super) fn any(&self, key: &str, from: Duration, to: Duration) -> bool {
        let within = |at: Duration| at >= from && at <= to;
        self.forced.iter().any(|(k, at)| k == key && within(*at))
            || self.jumps.iter().any(|&at| within(at))
    }
}

/// When the server granted `key` to the lease with `fence` (the first
/// time: a re-acquire with the same token keeps it).
fn granted_at(grants: &[Grant], key: &str, fence: i64) -> Option<Duration> {
    grants
        .iter()
        .find(|g| g.key == key && g.fence == fence)
        .map(|g| g.at)
}

/// The sim time at which the server's clock read `at`: it ran from
/// `epoch` at `started`, plus every jump made before then.
pub(super) fn sim_time(
    server: &Server,
    jumps: &[(Duration, Duration)],
    at: DateTime<Utc>,
) -> Duration {
    let since = (at - server.epoch).to_std().unwrap_or_default();
    let mut on_clock = server.started + since;
    for &(when, by) in jumps {
        match on_clock.checked_sub(by) {
            Some(before) if before >= when => on_clock = before,
            _ => break,
        }
    }
    on_clock
}

fn beliefs(events: &[Stamped], end: Duration) -> Vec<Belief> {
    let mut open: BTreeMap<(usize, String, i64), Duration> = BTreeMap::new();
    let mut beliefs = Vec::new();
    for e in events {
        match &e.event {
            Event::Believes { client, key, fence } => {
                open.insert((*client, key.clone(), *fence), e.at);
            }
            Event::Ended {
                client, key, fence, ..
            } => {
                if let Some(from) = open.remove(&(*client, key.clone(), *fence)) {
                    beliefs.push(Belief {
                        client: *client,
                        key: key.clone(),
                        fence: *fence,
                        from,
                        to: e.at,
                    });
                }
            }
            Event::Crashed { client } => {
                let theirs: Vec<_> = open.keys().filter(|k| k.0 == *client).cloned().collect();
                for k in theirs {
                    let from = open.remove(&k).unwrap_or_default();
                    let (client, key, fence) = k;
                    beliefs.push(Belief {
                        client,
                        key,
                        fence,
                        from,
                        to: e.at,
                    });
                }
            }
            _ => {}
        }
    }
    for ((client, key, fence), from) in open {
        beliefs.push(Belief {
            client,
            key,
            fence,
            from,
            to: end,
        });
    }
    beliefs
}

/// No program believes it holds a key while the server grants it to
/// another lease, unless a force-release or a server clock jump came after
/// the believed lease was granted.
fn exclusion(beliefs: &[Belief], grants: &[Grant], breaks: &Breaks, out: &mut Vec<String>) {
    for b in beliefs {
        let since = granted_at(grants, &b.key, b.fence).unwrap_or(b.from);
        for g in grants {
            if g.key == b.key && g.fence != b.fence && g.at > b.from && g.at < b.to {
                if breaks.any(&b.key, since, g.at) {
                    continue;
                }
                out.push(format!(
                    "exclusion: client {} believed it held {} (fence {}) from {:?} to {:?}, \
                     but the server granted fence {} at {:?}",
                    b.client, b.key, b.fence, b.from, b.to, g.fence, g.at
                ));
            }
        }
    }
}

/// Every belief rests on a grant the server made.
fn granted(beliefs: &[Belief], grants: &[Grant], out: &mut Vec<String>) {
    let made: BTreeSet<(&str, i64)> = grants.iter().map(|g| (g.key.as_str(), g.fence)).collect();
    for b in beliefs {
        if !made.contains(&(b.key.as_str(), b.fence)) {
            out.push(format!(
                "client {} believed it held {} under fence {}, which the server never granted",
                b.client, b.key, b.fence
            ));
        }
    }
}

/// A write a holder made while it believed it held the key is never
/// refused by the fenced store, unless exclusion was broken by design.
fn writes(events: &[Stamped], grants: &[Grant], breaks: &Breaks, out: &mut Vec<String>) {
    for e in events {
        if let Event::Wrote {
            client,
            key,
            fence,
            accepted: false,
            ..
        } = &e.event
        {
            let since = granted_at(grants, key, *fence).unwrap_or_default();
            if !breaks.any(key, since, e.at) {
                out.push(format!(
                    "stale write: client {client} wrote {key} with fence {fence} at {:?} while \
                     it believed it held the key, and the store had seen a higher fence",
                    e.at
                ));
            }
        }
    }
}

/// A belief never outlasts the lease it rests on: at its end the server
/// had granted or renewed that lease until later (the local deadline is
/// always before the server's expiry).
fn within_lease(
    beliefs: &[Belief],
    grants: &[Grant],
    server: &Server,
    jumps: &[(Duration, Duration)],
    breaks: &Breaks,
    out: &mut Vec<String>,
) {
    for b in beliefs {
        let until = expiry_granted(server, jumps, &b.key, b.fence, |at| at < b.to);
        let Some(until) = until else { continue };
        let since = granted_at(grants, &b.key, b.fence).unwrap_or(b.from);
        if b.to > until && !breaks.any(&b.key, since, b.to) {
            out.push(format!(
                "overclaim: client {} believed it held {} (fence {}) until {:?}, past the \
                 server's expiry of that lease at {:?}",
                b.client, b.key, b.fence, b.to, until
            ));
        }
    }
}

/// The latest expiry the server granted or renewed the lease `key`/`fence`
/// to, among the grants applied at a sim time `applied` accepts.
fn expiry_granted(
    server: &Server,
    jumps: &[(Duration, Duration)],
    key: &str,
    fence: i64,
    applied: impl Fn(Duration) -> bool,
) -> Option<Duration> {
    server
        .journal
        .iter()
        .filter(|r| r.key == key && r.fencing_token == Some(fence))
        .filter(|r| matches!(r.status, Some(200 | 201)))
        .filter(|r| matches!(r.operation, Operation::Acquire | Operation::Renew))
        .filter(|r| applied(sim_time(server, jumps, r.at)))
        .filter_map(|r| r.expires_at)
        .max()
        .map(|expires| sim_time(server, jumps, expires))
}

/// A key's fences never go down from one grant to the next.
fn fences(grants: &[Grant], out: &mut Vec<String>) {
    let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
    for g in grants {
        let top = highest.entry(g.key.as_str()).or_insert(i64::MIN);
        if g.fence < *top {
            out.push(format!(
                "fence order: {} granted fence {} at {:?} after fence {}",
                g.key, g.fence, g.at, top
            ));
        }
        *top = (*top).max(g.fence);
    }
}

/// What a guard says is left of its lease never reaches past the server's
/// expiry of that lease: at a write at `t`, `t + remaining` is no later
/// than the latest expiry the server had granted it by then.
fn remaining(
    events: &[Stamped],
    grants: &[Grant],
    server: &Server,
    jumps: &[(Duration, Duration)],
    breaks: &Breaks,
    out: &mut Vec<String>,
) {
    for e in events {
        let Event::Wrote {
            client,
            key,
            fence,
            remaining,
            ..
        } = &e.event
        else {
            continue;
        };
        let until = expiry_granted(server, jumps, key, *fence, |at| at <= e.at);
        let Some(until) = until else { continue };
        // A server clock jump since the grant moves the server's expiry
        // under the guard (by design, not the guard's fault).
        let since = granted_at(grants, key, *fence).unwrap_or(e.at);
        if e.at + *remaining > until && !breaks.any(key, since, e.at + *remaining) {
            out.push(format!(
                "overstated: client {client}'s guard on {key} (fence {fence}) said {remaining:?} \
                 was left at {:?}, past the server's expiry at {until:?}",
                e.at
            ));
        }
    }
}

/// A wait keeps its deadline: an operation that waits for a key never
/// reports the key held before its deadline, and never starts a try after
/// it (the tries of one waiting acquire share its request id).
fn waits(events: &[Stamped], server: &Server, out: &mut Vec<String>) {
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
        let ended = events[i + 1..].iter().find(|later| match &later.event {
            Event::Believes { client: c, .. }
            | Event::Leased { client: c, .. }
            | Event::Note { client: c, .. }
            | Event::StepEnded { client: c } => c == client,
            _ => false,
        });
        let held = ended.filter(|ended| {
            matches!(&ended.event, Event::Note { what, .. } if what.contains("(HTTP 409 lock_held"))
        });
        if let Some(held) = held.filter(|held| held.at < *until) {
            out.push(format!(
                "gave up early: client {client}'s wait for {key} until {until:?} reported the key \
                 held at {:?}",
                held.at
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
        let attempts = &server.sent.attempts;
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

/// Once a guard's loss was told (its belief ended), the program wrote no
/// more under it: `is_lost()` said so before the next write.
fn no_write_after_loss(events: &[Stamped], out: &mut Vec<String>) {
    let mut ended: BTreeSet<(usize, &str, i64)> = BTreeSet::new();
    for e in events {
        match &e.event {
            Event::Ended {
                client, key, fence, ..
            } => {
                ended.insert((*client, key.as_str(), *fence));
            }
            Event::Believes { client, key, fence } => {
                ended.remove(&(*client, key.as_str(), *fence));
            }
            Event::Wrote {
                client, key, fence, ..
            } if ended.contains(&(*client, key.as_str(), *fence)) => {
                out.push(format!(
                    "wrote after loss: client {client} wrote {key} under fence {fence} at {:?}, \
                     after its guard said it was lost",
                    e.at
                ));
            }
            _ => {}
        }
    }
}
