//! Leases left behind: an acquire whose outcome a program never saw must be
//! undone, when `shutdown` returns the server holds nothing of the
//! client's SDK-managed leases that it did not name, and at the end
//! nothing is held but what was reported.
//!
//! Here: what both families of checks share, the grants no program learned
//! of ([`Unseen`]). The checks of the undo are in `leaks/undo.rs`, those
//! of what is held at the end in `leaks/held.rs`.

mod held;
mod undo;

use std::collections::BTreeSet;
use std::time::Duration;

use volcano_mock_server::Operation;

use super::run::Run;
use crate::log::Event;
use crate::net::{Attempt, LATE_MARGIN};

pub(super) use held::{at_end, reported_at_shutdown};
pub(super) use undo::{no_needless_undo, undone};

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
        // A waiter's tries share one request id: the grant is a try's
        // whose answer does not show it applied (none, a 5xx, a garbled
        // one); a try the service answered 409 was applied then.
        let bound = tries
            .iter()
            .filter(|a| a.sent <= granted)
            .filter(|a| a.garbled.is_some() || a.answer.as_ref().is_none_or(|o| o.status >= 500))
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
