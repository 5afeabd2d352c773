//! What is still held when the programs end ([`at_end`]) and when a
//! `shutdown` returns ([`reported_at_shutdown`]), excused by who owns each
//! lease ([`Owners`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use volcano_mock_server::Operation;

use super::beyond_bound;
use crate::check::run::Run;
use crate::log::Event;

/// When the programs ended (the last `shutdown` returned, or the last
/// live program crashed), before any lease could expire: every lease the
/// server still holds belongs to a crashed client, or to one whose
/// `shutdown` named its key, or one its program manages by hand (a plain
/// lease, a release it sent itself that failed), or was granted by a try
/// applied beyond its client's bound (counted by [`undone`](super::undone)). And no
/// client's `shutdown` left a renewal running.
pub(crate) fn at_end(run: &Run<'_>, out: &mut Vec<String>) {
    let (events, server) = (run.events, run.server);
    let owners = Owners::new(run);
    let late = beyond_bound(run);
    let mut crashed: BTreeSet<usize> = BTreeSet::new();
    let mut reported: BTreeSet<(usize, &str)> = BTreeSet::new();
    for e in events {
        match &e.event {
            Event::Crashed { client } => {
                crashed.insert(*client);
            }
            Event::Done {
                client,
                unreleased,
                renewing,
                ..
            } => {
                reported.extend(unreleased.iter().map(|k| (*client, k.as_str())));
                if *renewing != 0 {
                    out.push(format!(
                        "still renewing: client {client}'s shutdown returned with {renewing} \
                         renewals running"
                    ));
                }
            }
            _ => {}
        }
    }
    for lock in &server.locks_at_end {
        if lock.expires_at <= server.now_at_end {
            continue;
        }
        let (key, fence) = (lock.key.as_str(), lock.fencing_token);
        let Some(&(owner, _)) = owners.granted.get(&(key, fence)) else {
            out.push(format!(
                "leaked lease: {key} (fence {fence}) is held at the end, granted to no client"
            ));
            continue;
        };
        if crashed.contains(&owner)
            || reported.contains(&(owner, key))
            || owners.by_hand(owner, key, fence)
            || late.contains(&(key, fence))
        {
            continue;
        }
        out.push(format!(
            "leaked lease: {key} (fence {fence}) is held at the end (until {}), granted to \
             client {owner}, whose shutdown did not name it",
            lock.expires_at
        ));
    }
}

/// Who was granted each lease, and which leases the programs manage by
/// hand.
struct Owners<'a> {
    /// The client each granted fence went to, and when (sim time).
    granted: BTreeMap<(&'a str, i64), (usize, Duration)>,
    /// Leases the programs manage by hand and failed to release: by fence,
    /// or (own tokens) every lease of the key granted before the failure.
    kept_fences: BTreeSet<(usize, &'a str, i64)>,
    kept_until: BTreeMap<(usize, &'a str), Duration>,
    /// Plain leases (an acquire, not a guard).
    plain: BTreeSet<(usize, &'a str, i64)>,
    /// Leases granted to a program's own token: the SDK never releases
    /// those behind the program's back (a late try of one is the
    /// program's to recover or release; its error said it may have been
    /// applied).
    own: BTreeSet<(&'a str, i64)>,
    /// Leases handed to the service to keep for a minimum hold: kept
    /// after the program ended, by design (judged by
    /// [`crate::check::minimum::kept_by_the_service`]).
    minimums: BTreeSet<(usize, &'a str, i64)>,
}

impl<'a> Owners<'a> {
    fn new(run: &Run<'a>) -> Owners<'a> {
        let (events, server) = (run.events, run.server);
        let mut granted = BTreeMap::new();
        for r in &server.journal {
            let (Operation::Acquire, Some(201), Some(fence)) =
                (r.operation, r.status, r.fencing_token)
            else {
                continue;
            };
            let sender = r
                .request_id
                .as_ref()
                .and_then(|id| server.sent.by_id.get(id));
            if let Some((client, _)) = sender {
                granted
                    .entry((r.key.as_str(), fence))
                    .or_insert((*client, run.sim_time(r.at)));
            }
        }
        // Grants no program learned of (a late try) to a program's own
        // token.
        let mut learned: BTreeSet<(&str, i64)> = BTreeSet::new();
        let mut own_hashes: BTreeSet<u64> = BTreeSet::new();
        for e in events {
            match &e.event {
                Event::Believes { key, fence, .. } | Event::Leased { key, fence, .. } => {
                    learned.insert((key.as_str(), *fence));
                }
                Event::OwnToken { token_hash, .. } => {
                    own_hashes.insert(*token_hash);
                }
                _ => {}
            }
        }
        let token_of = |id: &str| {
            server
                .sent
                .attempts
                .iter()
                .find(|a| a.request_id == id)
                .and_then(|a| a.token.as_deref())
        };
        let own: BTreeSet<(&str, i64)> = server
            .journal
            .iter()
            .filter(|r| r.operation == Operation::Acquire && r.status == Some(201))
            .filter_map(|r| {
                let fence = r.fencing_token?;
                let token = token_of(r.request_id.as_deref()?)?;
                let mine = own_hashes.contains(&crate::log::token_hash(token));
                (mine && !learned.contains(&(r.key.as_str(), fence)))
                    .then_some((r.key.as_str(), fence))
            })
            .collect();
        let mut owners = Owners {
            granted,
            kept_fences: BTreeSet::new(),
            kept_until: BTreeMap::new(),
            plain: BTreeSet::new(),
            own,
            minimums: BTreeSet::new(),
        };
        for e in events {
            match &e.event {
                Event::Kept {
                    client,
                    key,
                    fence: Some(fence),
                } => {
                    owners.kept_fences.insert((*client, key.as_str(), *fence));
                }
                Event::Kept {
                    client,
                    key,
                    fence: None,
                } => {
                    owners.kept_until.insert((*client, key.as_str()), e.at);
                }
                Event::Leased { client, key, fence } => {
                    owners.plain.insert((*client, key.as_str(), *fence));
                }
                // Kept or not (a keeping renewal without an answer may
                // have been applied), the lease ends by itself by the
                // minimum's end or its last expiry.
                Event::MinimumAsked {
                    client, key, fence, ..
                } => {
                    owners.minimums.insert((*client, key.as_str(), *fence));
                }
                _ => {}
            }
        }
        owners
    }

    /// Whether `client` manages the lease `key`/`fence` by hand.
    fn by_hand(&self, client: usize, key: &str, fence: i64) -> bool {
        let granted_at = self.granted.get(&(key, fence)).map(|&(_, at)| at);
        self.kept_fences.contains(&(client, key, fence))
            || self.plain.contains(&(client, key, fence))
            || self.own.contains(&(key, fence))
            || self.minimums.contains(&(client, key, fence))
            || self
                .kept_until
                .get(&(client, key))
                .zip(granted_at)
                .is_some_and(|(kept, at)| at <= *kept)
    }
}

/// When a program's `shutdown` returned, every lease the server still held
/// for that client is one `shutdown` named, unless the program manages it
/// itself (a plain lease, a release it sent by hand that failed): a
/// release the SDK let go of that did not free the lease (refused with
/// `401`/`403`, given up) is never silently dropped.
pub(crate) fn reported_at_shutdown(run: &Run<'_>, out: &mut Vec<String>) {
    let owners = Owners::new(run);
    let late = beyond_bound(run);
    for e in run.events {
        let Event::Done {
            client,
            unreleased,
            live_then,
            ..
        } = &e.event
        else {
            continue;
        };
        for (key, fence) in live_then {
            let Some(&(owner, _)) = owners.granted.get(&(key.as_str(), *fence)) else {
                continue;
            };
            if owner == *client
                && !unreleased.contains(key)
                && !owners.by_hand(*client, key, *fence)
                && !late.contains(&(key.as_str(), *fence))
            {
                out.push(format!(
                    "unreported lease: client {client}'s shutdown returned while the server \
                     still held {key} (fence {fence}) for it, and did not name the key"
                ));
            }
        }
    }
}
