//! An observer spends its looks where the design says (DESIGN.md §15,
//! "quota-aware polling"): one per poll interval, plus a few at a known
//! lease's last moments, never more.
//!
//! The observe checks (`check/observe.rs`) judge what an observer says
//! and that it keeps looking; an observer that looks too often tells the
//! truth and keeps looking, and spends the project's quota: this catches
//! it. Judged on exact host clocks only, and not across a server clock
//! jump: an observer's estimate of the server's clock starts again at the
//! first answer after one, so the looks from two answers before a jump to
//! the next answer after it are not judged (the rest of the run is).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use volcano_mock_server::Operation;

use super::observe::{looks_in, windows};
use super::run::Run;
use crate::log::Event;

/// The simulation's timers fire on ticks: how much sooner than due a look
/// may go.
const SOON: Duration = Duration::from_millis(10);
/// The least interval between two looks (the SDK's `POLL_MIN`).
const POLL_MIN: Duration = Duration::from_millis(100);
/// A look at a lease's last moments that still showed it is followed by
/// another this much later (the SDK's `RETRY_LATE`).
const RETRY_LATE: Duration = Duration::from_secs(1);
/// Where the looks at a lease's last moments fall around its expiry `E`
/// (server clock): the look in its last second or grace lands in
/// `[E, E + 0.5 s)`, the one as it frees in `[E + 1.1 s, E + 1.6 s]`, each
/// moved by the observer's estimate of the server's clock (off by at most
/// half a second and half a round trip).
const FINAL_FROM: Duration = Duration::from_millis(700);
const FINAL_TO: Duration = Duration::from_millis(2_300);
/// How much later than due a look may go: a tick or two.
const LATE: Duration = Duration::from_millis(150);
/// The most looks off the regular cadence one lease's last moments may
/// take: the one in its last second or grace, the one as it frees, and a
/// look a second after each that still showed it.
const MOST_AT_LAST_MOMENTS: usize = 4;
/// The slowest round trip of a look whose answer sets such a look.
const QUICK: Duration = Duration::from_millis(200);

/// An observer never looks sooner than its schedule: after an answer,
/// the next look comes at nine tenths of the poll interval or later; or
/// at the last moments of the lease the answer showed (from
/// [`FINAL_FROM`] before its expiry to [`FINAL_TO`] after), or
/// [`RETRY_LATE`] after a look there; and never within [`POLL_MIN`].
/// After a failed look (a 429, a 5xx, no answer) the next waits the poll
/// interval at least.
pub(super) fn thrifty(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    let journal = &run.server.journal;
    // The lease (fence, and expiry on sim time) a look's answer showed.
    let lease = |look: &crate::net::Attempt| {
        journal
            .iter()
            .find(|r| {
                r.request_id.as_deref() == Some(look.request_id.as_str())
                    && r.operation == Operation::Get
                    && r.status == Some(200)
            })
            .and_then(|r| r.fencing_token.zip(r.expires_at))
            .map(|(fence, expiry)| (fence, run.sim_time(expiry)))
    };
    let shown = |look: &crate::net::Attempt| lease(look).map(|(_, expires)| expires);
    for w in windows(run) {
        let looks = looks_in(run, &w);
        // The looks off the regular cadence spent on each lease.
        let mut spent: BTreeMap<(i64, Duration), usize> = BTreeMap::new();
        for (n, pair) in looks.windows(2).enumerate() {
            let (prev, look) = (pair[0], pair[1]);
            // Its estimate of the server's clock, from the answers before.
            let since = looks[n.saturating_sub(1)].sent;
            if run.jumped_within(since.saturating_sub(w.poll), look.sent) {
                continue;
            }
            let answered = prev.answer.as_ref().filter(|a| a.status == 200);
            let Some(at) = answered.map(|a| a.at) else {
                // A failed look: the next waits out the poll interval.
                let Some(failed) = prev.answer.as_ref().map(|a| a.at).or(prev.failed) else {
                    continue;
                };
                if look.sent + SOON < failed + w.poll {
                    out.push(format!(
                        "observe: client {} looked at {} again at {:?}, {:?} after a failed \
                         look (poll {:?})",
                        w.client,
                        w.key,
                        look.sent,
                        look.sent - failed,
                        w.poll
                    ));
                }
                continue;
            };
            if look.sent + SOON >= at + w.poll.mul_f64(0.9) {
                continue;
            }
            let quick = at <= prev.sent + QUICK;
            let at_last_moments = shown(prev).is_some_and(|expires| {
                look.sent + FINAL_FROM >= expires && look.sent <= expires + FINAL_TO
            });
            // Another look a second after one at the lease's last
            // moments that still showed it.
            let retry_late = look.sent + SOON >= at + RETRY_LATE
                && look.sent <= at + RETRY_LATE + LATE
                && shown(prev).is_some_and(|expires| prev.sent + FINAL_FROM >= expires);
            let too_soon = look.sent + SOON < at + POLL_MIN;
            if let Some(shown) = lease(prev) {
                let n = spent.entry(shown).or_default();
                *n += 1;
                if *n == MOST_AT_LAST_MOMENTS + 1 {
                    out.push(format!(
                        "observe: client {} looked at {} more than {MOST_AT_LAST_MOMENTS} times \
                         off its cadence for fence {} (expiring at {:?}), the last at {:?}",
                        w.client, w.key, shown.0, shown.1, look.sent
                    ));
                }
            }
            if too_soon || (quick && !at_last_moments && !retry_late) {
                out.push(format!(
                    "observe: client {} looked at {} at {:?}, {:?} after the answer before \
                     (poll {:?}), off its schedule",
                    w.client,
                    w.key,
                    look.sent,
                    look.sent - at,
                    w.poll
                ));
            }
        }
    }
}

/// A known lease's last moments get their look: after a regular look
/// (nine tenths of the poll interval or more after the answer before, or
/// the first) showed a lease whose last moments come before the next
/// regular look, the observer looks in them (from [`FINAL_FROM`] before
/// its expiry to [`FINAL_TO`] after), whatever the holder does: so an
/// expiry is told from a release without polling faster. Judged when
/// nothing disturbed the stretch (no fault on the observer's host, its
/// looks answered quickly).
pub(super) fn looks_at_last_moments(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    let journal = &run.server.journal;
    for w in windows(run) {
        let looks = looks_in(run, &w);
        for (n, look) in looks.iter().enumerate() {
            let regular = n == 0
                || looks[n - 1]
                    .answer
                    .as_ref()
                    .is_some_and(|prev| look.sent + SOON >= prev.at + w.poll.mul_f64(0.9));
            let Some(answer) = look.answer.as_ref().filter(|a| a.status == 200) else {
                continue;
            };
            let Some(seen) = journal.iter().find(|r| {
                r.request_id.as_deref() == Some(look.request_id.as_str()) && r.status == Some(200)
            }) else {
                continue;
            };
            let (Some(_), Some(expiry)) = (seen.fencing_token, seen.expires_at) else {
                continue;
            };
            let expires = run.sim_time(expiry);
            let (from, to) = (expires.saturating_sub(FINAL_FROM), expires + FINAL_TO);
            // Its last moments come well before the next regular look,
            // and well after this answer; the window lasts past them.
            let next_regular = answer.at + w.poll.mul_f64(0.9);
            if !regular || to + LATE >= next_regular || from <= answer.at + QUICK || to >= w.to {
                continue;
            }
            // The server's clock jumped since the looks its estimate
            // came from, or before those last moments.
            let since = looks[n.saturating_sub(2)].sent.saturating_sub(w.poll);
            let disturbed = super::aim::touched(run, w.client, look.sent, to)
                || run.jumped_within(since, to)
                || looks[n..].iter().filter(|l| l.sent <= to).any(|l| {
                    l.answer
                        .as_ref()
                        .is_none_or(|a| a.status != 200 || a.at > l.sent + QUICK)
                });
            if disturbed {
                continue;
            }
            if !looks[n + 1..]
                .iter()
                .any(|l| l.sent >= from && l.sent <= to)
            {
                out.push(format!(
                    "observe: client {} saw {} held until {expires:?} at {:?} (poll {:?}) and did \
                     not look in its last moments ({from:?} to {to:?})",
                    w.client, w.key, look.sent, w.poll
                ));
            }
        }
    }
}

/// A 429 to any request of a client spends its quota until the window it
/// names: none of its observers looks before that window ends (each then
/// spreads its next look), whichever request was told. The simulation's
/// observers of a twin key (`program/observing.rs`) get their first looks
/// answered so, beside an observer of another key. Judged on exact clocks.
pub(super) fn quiet_while_spent(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    let max_pause = Duration::from_secs(60);
    for (i, e) in run.events.iter().enumerate() {
        let Event::Observing {
            client, key, until, ..
        } = &e.event
        else {
            continue;
        };
        let to = run.step_ended(i, *client).min(*until);
        let spent: Vec<(Duration, Duration, &str)> = run
            .server
            .sent
            .attempts
            .iter()
            .filter(|a| a.client == *client)
            .filter_map(|a| {
                let o = a.answer.as_ref().filter(|o| o.status == 429)?;
                let after = o.retry_after?.min(max_pause);
                Some((o.at, o.at + after, a.key.as_str()))
            })
            .collect();
        for look in run.server.sent.attempts.iter().filter(|a| {
            a.client == *client
                && a.key == *key
                && a.operation == Operation::Get
                && a.sent > e.at
                && a.sent <= to
        }) {
            if let Some((told, quiet, of)) = spent
                .iter()
                .find(|(told, quiet, _)| *told + SOON < look.sent && look.sent + SOON < *quiet)
            {
                out.push(format!(
                    "observe: client {client} looked at {key} at {:?}, though a 429 to its \
                     request of {of} at {told:?} named quiet until {quiet:?}",
                    look.sent
                ));
                break;
            }
        }
    }
}

/// A lease a look showed: its fence, its expiry, and whether that look
/// saw it when it could no longer be renewed (its `Date`, whole seconds,
/// a second or less before its expiry, or after it).
fn shown_lease(run: &Run<'_>, look: &crate::net::Attempt) -> Option<(i64, DateTime<Utc>, bool)> {
    let r = run.server.journal.iter().find(|r| {
        r.request_id.as_deref() == Some(look.request_id.as_str())
            && r.operation == Operation::Get
            && r.status == Some(200)
    })?;
    let (fence, expires) = r.fencing_token.zip(r.expires_at)?;
    let date = DateTime::from_timestamp(r.at.timestamp(), 0)?;
    Some((fence, expires, date + TimeDelta::seconds(1) >= expires))
}

/// A holder that renews within each poll interval costs its observer at
/// most one look more per interval, two when the first came too early
/// (`observe.rs`, `special_spent`, `retried_early`; the guide's "quota
/// and cadence"): between two regular looks (nine tenths of the poll
/// interval or more after the answer before), the looks off the cadence
/// that found the lease the look before showed, renewed or as it was,
/// are one; two when the first found it as it was before its last
/// second (too early). A look after one that saw the lease in its last
/// second is the one as it frees, and a lease taken over or freed is
/// news: neither is counted. Judged on exact clocks, not across a jump
/// of the server's clock.
pub(super) fn one_more_per_interval(run: &Run<'_>, out: &mut Vec<String>) {
    if run.clock_rate != 1.0 {
        return;
    }
    for w in windows(run) {
        let looks = looks_in(run, &w);
        // Off the cadence since the last regular look: looks that found
        // the same lease, and how many are allowed.
        let (mut spent, mut allowed) = (0, 1);
        for (n, pair) in looks.windows(2).enumerate() {
            let (prev, look) = (pair[0], pair[1]);
            let since = looks[n.saturating_sub(1)].sent.saturating_sub(w.poll);
            let answered = prev.answer.as_ref().filter(|a| a.status == 200);
            let regular = answered.is_none_or(|a| look.sent + SOON >= a.at + w.poll.mul_f64(0.9));
            if regular || run.jumped_within(since, look.sent) {
                (spent, allowed) = (0, 1);
                continue;
            }
            let (Some(before), Some(found)) = (shown_lease(run, prev), shown_lease(run, look))
            else {
                continue;
            };
            // News: a new lease's last moments get their own looks.
            if before.0 != found.0 {
                (spent, allowed) = (0, 1);
                continue;
            }
            // The look as a lease seen final frees.
            if before.2 {
                continue;
            }
            spent += 1;
            if spent == 1 && found.1 == before.1 && !found.2 {
                allowed = 2;
            }
            if spent > allowed {
                out.push(format!(
                    "observe: client {} looked at {} at {:?} (poll {:?}), the look number {spent} \
                     off its cadence since its last regular one to find fence {} renewed or as \
                     it was (at most {allowed})",
                    w.client, w.key, look.sent, w.poll, found.0
                ));
            }
        }
    }
}
