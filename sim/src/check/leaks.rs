//! Leases left behind: an acquire whose outcome a program never saw must be
//! undone, when `shutdown` returns the server holds nothing of the
//! client's SDK-managed leases that it did not name, and at the end
//! nothing is held but what was reported.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use volcano_mock_server::{Operation, RecordedRequest};

use super::run::Run;
use crate::log::Event;

/// A grant no program learned of (an acquire whose outcome it never saw)
/// is undone: its client sends a release for the key (it may not arrive on
/// a broken network, and then the lease lives out its ttl), or its
/// `shutdown` reports the key. A crashed client is excused.
pub(super) fn undone(run: &Run<'_>, out: &mut Vec<String>) {
    let server = run.server;
    let mut learned: BTreeSet<(&str, i64)> = BTreeSet::new();
    let mut excused: BTreeSet<(usize, &str)> = BTreeSet::new();
    let mut crashed: BTreeSet<usize> = BTreeSet::new();
    for e in run.events {
        match &e.event {
            Event::Believes { key, fence, .. } | Event::Leased { key, fence, .. } => {
                learned.insert((key.as_str(), *fence));
            }
            Event::Done {
                client, unreleased, ..
            } => {
                excused.extend(unreleased.iter().map(|k| (*client, k.as_str())));
            }
            Event::Crashed { client } => {
                crashed.insert(*client);
            }
            _ => {}
        }
    }
    let sent = |r: &RecordedRequest| {
        r.request_id
            .as_ref()
            .and_then(|id| server.sent.by_id.get(id))
    };
    let sender = |r: &RecordedRequest| sent(r).map(|(client, _)| client);
    for (i, r) in server.journal.iter().enumerate() {
        let (Some(fence), Some(&client)) = (r.fencing_token, sender(r)) else {
            continue;
        };
        if r.operation != Operation::Acquire
            || r.status != Some(201)
            || learned.contains(&(r.key.as_str(), fence))
            || crashed.contains(&client)
            || excused.contains(&(client, r.key.as_str()))
        {
            continue;
        }
        // A lease force-released (or cut short by a server clock jump)
        // before it expired needs no undo.
        let granted = run.sim_time(r.at);
        let expires = r.expires_at.map_or(granted, |e| run.sim_time(e));
        if run.breaks.any(&r.key, granted, expires) {
            continue;
        }
        // A later try of the same acquire answered 409: the server said
        // the lease is gone (lapsed) or another's, so nothing is left to
        // undo.
        let refused_later = server.journal[i + 1..].iter().any(|later| {
            later.operation == Operation::Acquire
                && later.request_id == r.request_id
                && later.status == Some(409)
        });
        if refused_later {
            continue;
        }
        // Releases of this token the client sent after it sent the
        // acquire (the token tells an undo from the release of an
        // earlier lease sent at the same moment).
        let attempts = &server.sent.attempts;
        let acquire = attempts
            .iter()
            .find(|a| r.request_id.as_ref() == Some(&a.request_id));
        let Some(acquire) = acquire else { continue };
        let undoing: Vec<&String> = attempts
            .iter()
            .filter(|a| {
                a.operation == Operation::Release
                    && a.client == client
                    && a.key == r.key
                    && a.token == acquire.token
                    && a.sent >= acquire.sent
            })
            .map(|a| &a.request_id)
            .collect();
        let released = !undoing.is_empty();
        let arrived = |range: &[RecordedRequest]| {
            range.iter().any(|other| {
                other.operation == Operation::Release
                    && other
                        .request_id
                        .as_ref()
                        .is_some_and(|id| undoing.contains(&id))
            })
        };
        // A release that arrived before the acquire it undoes frees
        // nothing; the lease then lives out its ttl.
        if released && !arrived(&server.journal[i + 1..]) && arrived(&server.journal[..i]) {
            out.push(format!(
                "undo raced ahead: client {client}'s release of {} arrived before the acquire \
                 it undoes (fence {fence}), which then held the key for its whole ttl",
                r.key
            ));
        }
        if !released {
            out.push(format!(
                "not undone: client {client} was granted {} (fence {fence}) by an acquire whose \
                 outcome it never saw, and never released it",
                r.key
            ));
        }
    }
}

/// When the programs ended (the last `shutdown` returned, or the last
/// live program crashed), before any lease could expire: every lease the
/// server still holds belongs to a crashed client, or to one whose
/// `shutdown` named its key, or one its program manages by hand (a plain
/// lease, a release it sent itself that failed). And no client's
/// `shutdown` left a renewal running.
pub(super) fn at_end(run: &Run<'_>, out: &mut Vec<String>) {
    let (events, server) = (run.events, run.server);
    let owners = Owners::new(run);
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
        let mut owners = Owners {
            granted,
            kept_fences: BTreeSet::new(),
            kept_until: BTreeMap::new(),
            plain: BTreeSet::new(),
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
pub(super) fn reported_at_shutdown(run: &Run<'_>, out: &mut Vec<String>) {
    let owners = Owners::new(run);
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
            {
                out.push(format!(
                    "unreported lease: client {client}'s shutdown returned while the server \
                     still held {key} (fence {fence}) for it, and did not name the key"
                ));
            }
        }
    }
}

/// No release is sent for nothing: an SDK's own token is released only
/// if one of its acquire attempts may have been applied (a grant, a 5xx,
/// no answer, or no end seen). An undo after tries the service refused
/// (409, 429, 4xx) frees nothing and spends the project's quota. The
/// programs' own tokens are theirs to release by hand, and are not
/// judged.
pub(super) fn no_needless_undo(run: &Run<'_>, out: &mut Vec<String>) {
    let own: BTreeSet<u64> = run
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::OwnToken { token_hash, .. } => Some(*token_hash),
            _ => None,
        })
        .collect();
    let attempts = &run.server.sent.attempts;
    let mut judged: BTreeSet<&str> = BTreeSet::new();
    for release in attempts
        .iter()
        .filter(|a| a.operation == Operation::Release)
    {
        let Some(token) = release.token.as_deref() else {
            continue;
        };
        if own.contains(&crate::log::token_hash(token)) || !judged.insert(token) {
            continue;
        }
        let acquires: Vec<_> = attempts
            .iter()
            .filter(|a| a.operation == Operation::Acquire && a.token.as_deref() == Some(token))
            .collect();
        let may_have_applied = |a: &&crate::net::Attempt| match &a.answer {
            Some(o) => o.status < 300 || o.status >= 500,
            None => true,
        };
        if !acquires.is_empty() && !acquires.iter().any(may_have_applied) {
            out.push(format!(
                "needless undo: client {} released a token on {} at {:?} whose every acquire \
                 attempt ({}) was refused",
                release.client,
                release.key,
                release.sent,
                acquires.len()
            ));
        }
    }
}
