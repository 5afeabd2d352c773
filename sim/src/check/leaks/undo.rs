//! Whether what a program never saw was undone: an acquire's grant no
//! program learned of is released after it ([`undone`]), and no release is
//! sent for an acquire the service refused every time
//! ([`no_needless_undo`]).

use std::collections::BTreeSet;

use volcano_mock_server::{FaultKind, Operation};

use super::{unseen, Late};
use crate::check::run::Run;
use crate::log::Event;

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
pub(crate) fn undone(run: &Run<'_>, out: &mut Vec<String>) -> Late {
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
        // A request of the token refused for good since (401, 403: a
        // revoked key, as the SDK must take it) ends what it does for it:
        // a kept minimum's renewal back refused, say (kept-minimums seed
        // 789).
        let refused = server.sent.attempts.iter().any(|a| {
            a.client == client
                && a.token == first.token
                && a.sent >= first.sent
                && a.answer
                    .as_ref()
                    .is_some_and(|o| matches!(o.status, 401 | 403))
        });
        if refused {
            continue;
        }
        // A try applied beyond every window of an acquire whose lease
        // the program had (a kept minimum, say, force-released since, whose
        // fix-up saw no late try could land): nothing was the SDK's to
        // undo (kept-minimums seed 637).
        let token_learned = first
            .token
            .as_deref()
            .is_some_and(|t| learned_tokens.contains(t));
        if undoing.is_empty() && token_learned && u.beyond_bound() {
            late.beyond_bound += 1;
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

/// No release is sent for nothing: an SDK's own token is released only
/// if one of its acquire attempts may have been applied (a grant, a 5xx,
/// no answer, or no end seen). An undo after tries the service refused
/// (409, 429, 4xx) frees nothing and spends the project's quota. The
/// programs' own tokens are theirs to release by hand, and are not
/// judged.
pub(crate) fn no_needless_undo(run: &Run<'_>, out: &mut Vec<String>) {
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
