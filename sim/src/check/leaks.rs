//! Leases left behind: an acquire whose outcome a program never saw must be
//! undone, when `shutdown` returns the server holds nothing of the
//! client's SDK-managed leases that it did not name, and at the end
//! nothing is held but what was reported.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use volcano_mock_server::{FaultKind, Operation};

use super::run::Run;
use crate::log::Event;
use crate::net::{Attempt, LATE_MARGIN};

/// What the leak checks excused by the bound, counted for the report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Late {
    /// Grants no program learned of, made by a try applied later than
    /// every window its client could bound (`sent + timeout +
    /// LATE_MARGIN` of each attempt sent before it), and not released
    /// after: excused by name ("late tries beyond the bound").
    pub(crate) beyond_bound: usize,
    /// Grants no program learned of, made by a try applied after an
    /// attempt of the same acquire had been answered 409 (a retry
    /// answered 409 while the first attempt was still on its way).
    pub(crate) after_a_409: usize,
}

/// A grant (an acquire answered 201) of a fence no program learned of,
/// to a token the SDK generated, with what its client's attempts of that
/// acquire say about it.
struct Unseen<'a> {
    /// Its place in the journal.
    index: usize,
    client: usize,
    key: &'a str,
    fence: i64,
    /// When the server applied it (sim time).
    granted: Duration,
    /// The attempts of its request id, in the order sent.
    tries: Vec<&'a Attempt>,
    /// The latest moment a try of it could be applied and still be
    /// bounded by its client: the latest `sent + timeout + LATE_MARGIN`
    /// of the attempts sent before it was applied.
    bound: Duration,
}

impl Unseen<'_> {
    /// Applied later than any window its client could bound.
    fn beyond_bound(&self) -> bool {
        self.granted > self.bound
    }

    /// The last attempt sent before this try was applied was answered
    /// 409: the grant is an earlier attempt's, applied after the later
    /// one was refused (a retry answered 409 while the first attempt was
    /// still on its way).
    fn after_a_409(&self) -> bool {
        self.tries
            .iter()
            .rfind(|a| a.sent <= self.granted)
            .and_then(|a| a.answer.as_ref())
            .is_some_and(|o| o.status == 409)
    }
}

/// Every grant of a fence no program learned of (no `Believes` or
/// `Leased` of it) to a token the SDK generated (not a program's own),
/// with the attempts of its acquire.
fn unseen<'a>(run: &Run<'a>) -> Vec<Unseen<'a>> {
    let server = run.server;
    let mut learned: BTreeSet<(&str, i64)> = BTreeSet::new();
    let mut own: BTreeSet<u64> = BTreeSet::new();
    for e in run.events {
        match &e.event {
            Event::Believes { key, fence, .. } | Event::Leased { key, fence, .. } => {
                learned.insert((key.as_str(), *fence));
            }
            Event::OwnToken { token_hash, .. } => {
                own.insert(*token_hash);
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    for (index, r) in server.journal.iter().enumerate() {
        let (Operation::Acquire, Some(201), Some(fence), Some(id)) = (
            r.operation,
            r.status,
            r.fencing_token,
            r.request_id.as_ref(),
        ) else {
            continue;
        };
        let Some(&(client, _)) = server.sent.by_id.get(id) else {
            continue;
        };
        if learned.contains(&(r.key.as_str(), fence)) {
            continue;
        }
        let tries: Vec<&Attempt> = server
            .sent
            .attempts
            .iter()
            .filter(|a| a.operation == Operation::Acquire && a.request_id == *id)
            .collect();
        let generated = tries
            .first()
            .and_then(|a| a.token.as_deref())
            .is_some_and(|token| !own.contains(&crate::log::token_hash(token)));
        if !generated {
            continue;
        }
        let granted = run.sim_time(r.at);
        let bound = tries
            .iter()
            .filter(|a| a.sent <= granted)
            .map(|a| a.sent + a.timeout + LATE_MARGIN)
            .max()
            .unwrap_or(Duration::MAX);
        found.push(Unseen {
            index,
            client,
            key: r.key.as_str(),
            fence,
            granted,
            tries,
            bound,
        });
    }
    found
}

/// The grants no program learned of that a try applied beyond its
/// client's bound made: the leases the end-of-run checks excuse with
/// them.
fn beyond_bound<'a>(run: &Run<'a>) -> BTreeSet<(&'a str, i64)> {
    unseen(run)
        .iter()
        .filter(|u| u.beyond_bound())
        .map(|u| (u.key, u.fence))
        .collect()
}

/// A grant no program learned of (an acquire whose outcome it never saw)
/// is undone: its client sends a release of that token, and one of them
/// is applied at the server *after* the grant (a try can be applied
/// after the release that undoes it: held in the network, or behind a
/// gateway that answered 5xx and let it go on; so the undo releases
/// again once the last try's window has closed). Excused: a crashed
/// client; one whose `shutdown` named the key; a force-release or server
/// clock jump during the lease; and, named and counted, a try applied
/// beyond every window its client could bound (`sent + timeout +
/// LATE_MARGIN`). A client that never sent a release at all is not
/// excused by the bound: it did not undo.
pub(super) fn undone(run: &Run<'_>, out: &mut Vec<String>) -> Late {
    let server = run.server;
    let mut excused: BTreeSet<(usize, &str)> = BTreeSet::new();
    let mut crashed: BTreeSet<usize> = BTreeSet::new();
    let mut learned_tokens: BTreeSet<&str> = BTreeSet::new();
    for e in run.events {
        match &e.event {
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
    // The tokens of the leases programs learned of (their acquire's
    // answer carried the fence): a grant to one of them that no program
    // learned of is a try of that acquire applied after the program had
    // its lease.
    let learned: BTreeSet<(&str, i64)> = run
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Believes { key, fence, .. } | Event::Leased { key, fence, .. } => {
                Some((key.as_str(), *fence))
            }
            _ => None,
        })
        .collect();
    for a in &server.sent.attempts {
        let fence = a.answer.as_ref().and_then(|o| o.fence);
        if let (Operation::Acquire, Some(fence), Some(token)) = (a.operation, fence, &a.token) {
            if learned.contains(&(a.key.as_str(), fence)) {
                learned_tokens.insert(token.as_str());
            }
        }
    }
    // The tokens of the plain leases programs were handed (an acquire,
    // not a guard).
    let plain: BTreeSet<(&str, i64)> = run
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Leased { key, fence, .. } => Some((key.as_str(), *fence)),
            _ => None,
        })
        .collect();
    let plain_tokens: BTreeSet<&str> = server
        .sent
        .attempts
        .iter()
        .filter(|a| a.operation == Operation::Acquire)
        .filter(|a| {
            a.answer
                .as_ref()
                .and_then(|o| o.fence)
                .is_some_and(|f| plain.contains(&(a.key.as_str(), f)))
        })
        .filter_map(|a| a.token.as_deref())
        .collect();
    let mut late = Late::default();
    // A try applied while the lease it grants is live re-grants the same
    // fence: one violation per lease.
    let mut reported: BTreeSet<(&str, i64)> = BTreeSet::new();
    for u in unseen(run) {
        let (client, key, fence) = (u.client, u.key, u.fence);
        if crashed.contains(&client)
            || excused.contains(&(client, key))
            || reported.contains(&(key, fence))
        {
            continue;
        }
        // A lease force-released (or cut short by a server clock jump)
        // before it expired needs no undo.
        let r = &server.journal[u.index];
        let expires = r.expires_at.map_or(u.granted, |e| run.sim_time(e));
        if run.breaks.any(key, u.granted, expires) {
            continue;
        }
        let Some(first) = u.tries.first() else {
            continue;
        };
        // Releases of this token the client sent after it sent the
        // acquire (the token tells an undo from the release of an
        // earlier lease sent at the same moment).
        let undoing: BTreeSet<&str> = server
            .sent
            .attempts
            .iter()
            .filter(|a| {
                a.operation == Operation::Release
                    && a.client == client
                    && a.key == key
                    && a.token == first.token
                    && a.sent >= first.sent
            })
            .map(|a| a.request_id.as_str())
            .collect();
        let after_a_409 = u.after_a_409();
        if after_a_409 {
            late.after_a_409 += 1;
        }
        // A try of the same acquire answered 409 *applied after* this
        // grant (the journal is in the order requests were applied): the
        // server said then that this lease was gone (lapsed, or another's
        // after it lapsed), so nothing is left to undo. A try applied
        // later still is another grant, judged on its own: a 409 to the
        // retry applied before a late first attempt excuses nothing.
        let refused_later = server.journal[u.index + 1..].iter().any(|later| {
            later.operation == Operation::Acquire
                && later.request_id == server.journal[u.index].request_id
                && later.status == Some(409)
                && !matches!(later.fault, Some(FaultKind::Status { .. }))
        });
        if refused_later {
            continue;
        }
        // The token of a plain lease the program was handed: the lease,
        // and a late grant to the same token, are the program's to
        // release (it can name the token); one it dropped unreleased
        // ends at its ttl.
        if first
            .token
            .as_deref()
            .is_some_and(|t| plain_tokens.contains(t))
        {
            continue;
        }
        if undoing.is_empty() {
            let retry = if after_a_409 {
                " (a later attempt of it was answered 409 before this try was applied)"
            } else {
                ""
            };
            out.push(format!(
                "not undone: client {client} was granted {key} (fence {fence}) by an acquire \
                 whose outcome it never saw, and never released it{retry}"
            ));
            reported.insert((key, fence));
            continue;
        }
        // Applied at the server after the grant: 204 (freed or already
        // gone) or 409 (another's by then), not refused or reset.
        let applied_after = server.journal[u.index + 1..].iter().any(|later| {
            later.operation == Operation::Release
                && matches!(later.status, Some(204 | 409))
                && !matches!(
                    later.fault,
                    Some(FaultKind::Status { .. } | FaultKind::Reset)
                )
                && later
                    .request_id
                    .as_deref()
                    .is_some_and(|id| undoing.contains(id))
        });
        // Or sent after the grant and lost on its way (a held link, a
        // partition): the client tried once no try could land, as it
        // must; the network kept the lease for its ttl.
        let sent_after = server
            .sent
            .attempts
            .iter()
            .any(|a| undoing.contains(a.request_id.as_str()) && a.sent >= u.granted);
        if applied_after || sent_after {
            continue;
        }
        if u.beyond_bound() {
            late.beyond_bound += 1;
            continue;
        }
        let token_learned = first
            .token
            .as_deref()
            .is_some_and(|t| learned_tokens.contains(t));
        let what = if token_learned {
            "released too soon: a try of an acquire whose lease it had already learned of and \
             released"
        } else {
            "undone too soon: a try of an acquire whose outcome it never saw"
        };
        out.push(format!(
            "{what} (sent at {:?}, window until {:?}) granted client {client} {key} (fence \
             {fence}) at {:?}, after every release of that token it sent had arrived or \
             failed; the lease then held the key for its ttl, and shutdown did not name it",
            first.sent, u.bound, u.granted
        ));
        reported.insert((key, fence));
    }
    late
}

/// When the programs ended (the last `shutdown` returned, or the last
/// live program crashed), before any lease could expire: every lease the
/// server still holds belongs to a crashed client, or to one whose
/// `shutdown` named its key, or one its program manages by hand (a plain
/// lease, a release it sent itself that failed), or was granted by a try
/// applied beyond its client's bound (counted by [`undone`]). And no
/// client's `shutdown` left a renewal running.
pub(super) fn at_end(run: &Run<'_>, out: &mut Vec<String>) {
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
    /// [`super::minimum::kept_by_the_service`]).
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
pub(super) fn reported_at_shutdown(run: &Run<'_>, out: &mut Vec<String>) {
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
