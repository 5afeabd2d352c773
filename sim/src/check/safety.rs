//! Safety: what the programs believed they held agrees with what the
//! server granted, the fenced store never refused a holder's write, fences
//! only go up, a belief and a guard's `remaining()` never outlast the
//! server's lease, and nothing is written under a guard told lost. Force
//! releases and server clock jumps break exclusion by design and excuse
//! a conflict that spans them; the excuse is bounded: a belief still ends
//! by its lease's expiry (moved by no more than the clock jumped).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::{Grant, Run};
use crate::log::Event;

/// No program believes it holds a key while the server grants it to
/// another lease, unless a force-release or a server clock jump came after
/// the believed lease was granted.
pub(super) fn exclusion(run: &Run<'_>, out: &mut Vec<String>) {
    for b in &run.beliefs {
        let since = granted_at(&run.grants, &b.key, b.fence).unwrap_or(b.from);
        for g in &run.grants {
            if g.key == b.key && g.fence != b.fence && g.at > b.from && g.at < b.to {
                if run.breaks.any(&b.key, since, g.at) {
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
pub(super) fn granted(run: &Run<'_>, out: &mut Vec<String>) {
    let made: BTreeSet<(&str, i64)> = run
        .grants
        .iter()
        .map(|g| (g.key.as_str(), g.fence))
        .collect();
    for b in &run.beliefs {
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
pub(super) fn writes(run: &Run<'_>, out: &mut Vec<String>) {
    for e in run.events {
        if let Event::Wrote {
            client,
            key,
            fence,
            accepted: false,
            ..
        } = &e.event
        {
            let since = granted_at(&run.grants, key, *fence).unwrap_or_default();
            if !run.breaks.any(key, since, e.at) {
                out.push(format!(
                    "stale write: client {client} wrote {key} with fence {fence} at {:?} while \
                     it believed it held the key, and the store had seen a higher fence",
                    e.at
                ));
            }
        }
    }
}

/// A key's fences never go down from one grant to the next.
pub(super) fn fences(run: &Run<'_>, out: &mut Vec<String>) {
    let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
    for g in &run.grants {
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

/// A belief never outlasts the lease it rests on: at its end the server
/// had granted or renewed that lease until later (the local deadline is
/// always before the server's expiry).
pub(super) fn within_lease(run: &Run<'_>, out: &mut Vec<String>) {
    for b in &run.beliefs {
        let until = expiry_granted(run, &b.key, b.fence, |at| at < b.to);
        let Some(until) = until else { continue };
        let since = granted_at(&run.grants, &b.key, b.fence).unwrap_or(b.from);
        // A server clock jump ends the lease sooner than granted, not the
        // belief: excused by that much, no more. A force-release excuses
        // nothing here: the belief still ends by the lease's expiry.
        if b.to > until + run.drift_slack + run.breaks.jumped(since, b.to) {
            out.push(format!(
                "overclaim: client {} believed it held {} (fence {}) until {:?}, past the \
                 server's expiry of that lease at {:?}",
                b.client, b.key, b.fence, b.to, until
            ));
        }
    }
}

/// What a guard says is left of its lease never reaches past the server's
/// expiry of that lease: at a write at `t`, `t + remaining` is no later
/// than the latest expiry the server had granted it by then.
pub(super) fn remaining(run: &Run<'_>, out: &mut Vec<String>) {
    for e in run.events {
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
        let until = expiry_granted(run, key, *fence, |at| at <= e.at);
        let Some(until) = until else { continue };
        // A server clock jump since the grant moves the server's expiry
        // under the guard (by design, not the guard's fault).
        let since = granted_at(&run.grants, key, *fence).unwrap_or(e.at);
        let claimed = e.at + *remaining;
        if claimed > until + run.drift_slack + run.breaks.jumped(since, claimed) {
            out.push(format!(
                "overstated: client {client}'s guard on {key} (fence {fence}) said {remaining:?} \
                 was left at {:?}, past the server's expiry at {until:?}",
                e.at
            ));
        }
    }
}

/// Once a guard's loss was told (its belief ended), the program wrote no
/// more under it: `is_lost()` said so before the next write.
pub(super) fn no_write_after_loss(run: &Run<'_>, out: &mut Vec<String>) {
    let mut ended: BTreeSet<(usize, &str, i64)> = BTreeSet::new();
    for e in run.events {
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

/// When the server granted `key` to the lease with `fence` (the first
/// time: a re-acquire with the same token keeps it).
pub(super) fn granted_at(grants: &[Grant], key: &str, fence: i64) -> Option<Duration> {
    grants
        .iter()
        .find(|g| g.key == key && g.fence == fence)
        .map(|g| g.at)
}

/// The latest expiry the server granted or renewed the lease `key`/`fence`
/// to, among the grants applied at a sim time `applied` accepts.
pub(super) fn expiry_granted(
    run: &Run<'_>,
    key: &str,
    fence: i64,
    applied: impl Fn(Duration) -> bool,
) -> Option<Duration> {
    run.server
        .journal
        .iter()
        .filter(|r| r.key == key && r.fencing_token == Some(fence))
        .filter(|r| matches!(r.status, Some(200 | 201)))
        .filter(|r| matches!(r.operation, Operation::Acquire | Operation::Renew))
        .filter(|r| applied(run.sim_time(r.at)))
        .filter_map(|r| r.expires_at)
        .max()
        .map(|expires| run.sim_time(expires))
}
