//! Linearizability: the server's history is that of one sequential lease
//! store, and every answer a client received is one the server gave while
//! that request was in flight.
//!
//! The server applies each request at one instant (its journal's `at`, the
//! clock reading the lease was computed from) and journals it in that
//! order, so its journal is the witness order. Two things make it a
//! linearization of what the clients saw:
//!
//! 1. [`server`]: replayed in journal order through [`Spec`], a sequential
//!    lease store written from the protocol (not from the mock's code),
//!    every applied request gets the answer the server gave: status,
//!    fencing token and expiry.
//! 2. [`clients`]: every answer a client received matches a journal entry
//!    of the same request id whose instant lies between the attempt's
//!    sending and the answer's arrival (so the witness order respects the
//!    real-time order of non-overlapping requests).
//!
//! Requests whose answers never arrived may have been applied or not; the
//! journal says which, and the replay takes them as applied where it says
//! so.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use volcano_mock_server::{FaultKind, Operation};

use super::run::Run;
use crate::net::Attempt;

/// A takeover waits this long after the expiry (protocol 2.9).
const GRACE: TimeDelta = TimeDelta::seconds(1);
/// A renewal must arrive more than this before the expiry (protocol 2.2).
const RENEW_MARGIN: TimeDelta = TimeDelta::seconds(1);

/// One journal entry, with what the clients' side adds: the token and TTL
/// sent under its request id, and its instant on simulated time.
#[derive(Debug, Clone)]
struct Entry {
    seq: u64,
    at: DateTime<Utc>,
    sim_at: Duration,
    operation: Operation,
    key: String,
    request_id: Option<String>,
    token: Option<String>,
    ttl_seconds: Option<i64>,
    /// The status sent (or that a dropped answer would have had).
    status: Option<u16>,
    fault: Option<FaultKind>,
    fence: Option<i64>,
    expires_at: Option<DateTime<Utc>>,
}

impl Entry {
    /// Whether the lock logic ran on it: not refused before (auth, quota),
    /// not answered by an injected status, not reset before applying.
    fn applied(&self) -> bool {
        let injected = matches!(
            self.fault,
            Some(FaultKind::Status { .. } | FaultKind::Reset)
        );
        matches!(self.status, Some(200 | 201 | 204 | 409)) && !injected
    }
}

/// What a sequential lease store answers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    status: u16,
    fence: Option<i64>,
    expires_at: Option<DateTime<Utc>>,
}

impl Expected {
    fn status(status: u16) -> Self {
        Expected {
            status,
            fence: None,
            expires_at: None,
        }
    }

    fn lease(status: u16, fence: i64, expires_at: DateTime<Utc>) -> Self {
        Expected {
            status,
            fence: Some(fence),
            expires_at: Some(expires_at),
        }
    }
}

/// A key's lease in the specification.
#[derive(Debug, Clone)]
struct Lease {
    token: String,
    fence: i64,
    expires_at: DateTime<Utc>,
}

impl Lease {
    fn reclaimable(&self, now: DateTime<Utc>) -> bool {
        now >= self.expires_at + GRACE
    }
}

/// One key of the sequential lease store.
#[derive(Debug, Default)]
struct Spec {
    lease: Option<Lease>,
    /// The highest fence granted so far: a new grant is above it.
    highest: Option<i64>,
}

impl Spec {
    /// Applies `e` (at its instant); what the store answers. `Err` when
    /// the entry lacks what the operation needs (a token, a TTL).
    fn apply(&mut self, e: &Entry) -> Result<Expected, String> {
        let now = e.at;
        let token = || e.token.clone().ok_or("no lock token was sent with it");
        let ttl = || {
            e.ttl_seconds
                .map(TimeDelta::seconds)
                .ok_or("no ttl_seconds was sent with it")
        };
        let live = self.lease.as_ref().filter(|l| !l.reclaimable(now));
        Ok(match e.operation {
            Operation::Acquire => {
                let (token, ttl) = (token()?, ttl()?);
                match self.lease.as_mut().filter(|l| !l.reclaimable(now)) {
                    Some(l) if l.token != token || now >= l.expires_at => Expected::status(409),
                    Some(l) => {
                        l.expires_at = now + ttl;
                        Expected::lease(201, l.fence, l.expires_at)
                    }
                    None => {
                        // Any fence above the highest will do (gaps are
                        // allowed): take the server's, if it is one.
                        let above = self.highest.map_or(i64::MIN, |h| h + 1);
                        let fence = e.fence.filter(|&f| f >= above).unwrap_or(above);
                        self.highest = Some(fence);
                        let lease = Lease {
                            token,
                            fence,
                            expires_at: now + ttl,
                        };
                        let expected = Expected::lease(201, fence, lease.expires_at);
                        self.lease = Some(lease);
                        expected
                    }
                }
            }
            Operation::Renew => {
                let (token, ttl) = (token()?, ttl()?);
                match self.lease.as_mut() {
                    Some(l) if l.token == token && now + RENEW_MARGIN < l.expires_at => {
                        l.expires_at = now + ttl;
                        Expected::lease(200, l.fence, l.expires_at)
                    }
                    _ => Expected::status(409),
                }
            }
            Operation::Release => {
                let token = token()?;
                match live {
                    Some(l) if l.token != token => Expected::status(409),
                    _ => {
                        self.lease = None;
                        Expected::status(204)
                    }
                }
            }
            Operation::Get => match live {
                Some(l) => Expected::lease(200, l.fence, l.expires_at),
                None => {
                    self.lease = None;
                    Expected::status(200)
                }
            },
            Operation::ForceRelease => {
                self.lease = None;
                Expected::status(204)
            }
            other => return Err(format!("an operation the specification lacks: {other:?}")),
        })
    }
}

/// Both checks over the journal as a history: the server's ([`server`]),
/// then the clients' ([`clients`]).
pub(super) fn check(run: &Run<'_>, out: &mut Vec<String>) {
    let history = history(run);
    server(&history, out);
    clients(&run.server.sent.attempts, &history, out);
}

/// The journal with what each request id carried (token, TTL), on sim time.
fn history(run: &Run<'_>) -> Vec<Entry> {
    let mut carried: BTreeMap<&str, &Attempt> = BTreeMap::new();
    for a in &run.server.sent.attempts {
        carried.entry(a.request_id.as_str()).or_insert(a);
    }
    run.server
        .journal
        .iter()
        .map(|r| {
            let sent = r.request_id.as_deref().and_then(|id| carried.get(id));
            Entry {
                seq: r.seq,
                at: r.at,
                sim_at: run.sim_time(r.at),
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

/// Replays the applied entries (in journal order) through the
/// specification; the first divergence per key is a violation (later
/// ones would follow from it).
fn server(entries: &[Entry], out: &mut Vec<String>) {
    let mut keys: BTreeMap<&str, Spec> = BTreeMap::new();
    let mut diverged: BTreeMap<&str, ()> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.applied()) {
        if diverged.contains_key(e.key.as_str()) {
            continue;
        }
        let spec = keys.entry(e.key.as_str()).or_default();
        let got = Expected {
            status: e.status.unwrap_or_default(),
            fence: e.fence,
            expires_at: e.expires_at,
        };
        let problem = match spec.apply(e) {
            Ok(expected) if expected == got => continue,
            Ok(expected) => format!(
                "a sequential lease store answers {}",
                describe(&expected, e.at)
            ),
            Err(why) => why.to_owned(),
        };
        diverged.insert(e.key.as_str(), ());
        out.push(format!(
            "linearizability: {} request {} ({:?} at {:?}) was answered {}; {problem}",
            e.key,
            e.seq,
            e.operation,
            e.sim_at,
            describe(&got, e.at)
        ));
    }
}

fn describe(answer: &Expected, now: DateTime<Utc>) -> String {
    let mut text = answer.status.to_string();
    if let Some(fence) = answer.fence {
        text.push_str(&format!(" fence {fence}"));
    }
    if let Some(expires) = answer.expires_at {
        let left = (expires - now).num_milliseconds();
        text.push_str(&format!(" expiring {left} ms after it"));
    }
    text
}

/// Every answer a client received is one the server gave to that request
/// id, at an instant while the attempt was in flight, or the 5xx of a
/// gateway in front of it (the request applied after it was sent).
fn clients(attempts: &[Attempt], entries: &[Entry], out: &mut Vec<String>) {
    let mut by_id: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for e in entries {
        if let Some(id) = &e.request_id {
            by_id.entry(id.as_str()).or_default().push(e);
        }
    }
    for a in attempts {
        let Some(answer) = &a.answer else { continue };
        let given = by_id.get(a.request_id.as_str()).is_some_and(|entries| {
            entries.iter().any(|e| {
                let served = e.status == Some(answer.status)
                    && (answer.fence.is_none() || e.fence == answer.fence)
                    && e.sim_at <= answer.at;
                // A gateway answered in the service's place, which
                // applied the request on its own time (before or after).
                let gateway = matches!(e.fault,
                    Some(FaultKind::Gateway { status, .. }) if status == answer.status);
                e.operation == a.operation
                    && e.key == a.key
                    && e.sim_at >= a.sent
                    && (served || gateway)
            })
        });
        if !given {
            out.push(format!(
                "linearizability: client {}'s {:?} of {} sent at {:?} got {}{} at {:?}, which the \
                 server did not answer while it was in flight",
                a.client,
                a.operation,
                a.key,
                a.sent,
                answer.status,
                answer
                    .fence
                    .map_or_else(String::new, |f| format!(" fence {f}")),
                answer.at
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Observed;

    const TTL: i64 = 10;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_000_000 + secs, 0).unwrap_or_default()
    }

    /// An applied entry at second `secs`, with `token`'s request id.
    fn entry(seq: u64, secs: i64, operation: Operation, token: &str, status: u16) -> Entry {
        Entry {
            seq,
            at: t(secs),
            sim_at: Duration::from_secs(secs as u64),
            operation,
            key: "k".to_owned(),
            request_id: Some(format!("id-{seq}")),
            token: Some(token.to_owned()),
            ttl_seconds: Some(TTL),
            status: Some(status),
            fault: None,
            fence: None,
            expires_at: None,
        }
    }

    fn lease(mut e: Entry, fence: i64, expires: i64) -> Entry {
        e.fence = Some(fence);
        e.expires_at = Some(t(expires));
        e
    }

    fn check(entries: &[Entry]) -> Vec<String> {
        let mut out = Vec::new();
        server(entries, &mut out);
        out
    }

    #[test]
    fn a_lawful_history_passes() {
        let history = [
            lease(entry(1, 0, Operation::Acquire, "a", 201), 1, 10),
            entry(2, 1, Operation::Acquire, "b", 409),
            lease(entry(3, 2, Operation::Acquire, "a", 201), 1, 12),
            lease(entry(4, 5, Operation::Renew, "a", 200), 1, 15),
            lease(entry(5, 6, Operation::Get, "", 200), 1, 15),
            entry(6, 7, Operation::Release, "b", 409),
            entry(7, 8, Operation::Release, "a", 204),
            entry(8, 8, Operation::Release, "a", 204),
            // A fence may skip values; a grant after a release is higher.
            lease(entry(9, 9, Operation::Acquire, "b", 201), 5, 19),
            // Expired: the owner may not renew; in the grace nobody takes
            // over, after it anyone does.
            entry(10, 19, Operation::Renew, "b", 409),
            entry(11, 19, Operation::Acquire, "a", 409),
            entry(12, 19, Operation::Acquire, "b", 409),
            lease(entry(13, 20, Operation::Acquire, "a", 201), 6, 30),
            entry(14, 21, Operation::ForceRelease, "", 204),
            entry(15, 21, Operation::Get, "", 200),
        ];
        assert_eq!(check(&history), Vec::<String>::new());
    }

    #[test]
    fn a_second_grant_of_a_live_lease_is_found() {
        let history = [
            lease(entry(1, 0, Operation::Acquire, "a", 201), 1, 10),
            lease(entry(2, 3, Operation::Acquire, "b", 201), 2, 13),
        ];
        let found = check(&history);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("request 2") && found[0].contains("answers 409"));
    }

    #[test]
    fn wrong_fences_and_expiries_are_found() {
        let same_fence = [
            lease(entry(1, 0, Operation::Acquire, "a", 201), 4, 10),
            entry(2, 1, Operation::Release, "a", 204),
            lease(entry(3, 2, Operation::Acquire, "b", 201), 4, 12),
        ];
        assert_eq!(check(&same_fence).len(), 1);
        let renewed_from_old_expiry = [
            lease(entry(1, 0, Operation::Acquire, "a", 201), 1, 10),
            lease(entry(2, 4, Operation::Renew, "a", 200), 1, 20),
        ];
        assert_eq!(check(&renewed_from_old_expiry).len(), 1);
        let late_renewal = [
            lease(entry(1, 0, Operation::Acquire, "a", 201), 1, 10),
            lease(entry(2, 9, Operation::Renew, "a", 200), 1, 19),
        ];
        assert_eq!(check(&late_renewal).len(), 1);
        let stale_release = [
            lease(entry(1, 0, Operation::Acquire, "a", 201), 1, 10),
            entry(2, 1, Operation::Release, "b", 204),
        ];
        assert_eq!(check(&stale_release).len(), 1);
    }

    #[test]
    fn requests_not_applied_change_nothing() {
        let mut refused = lease(entry(2, 1, Operation::Acquire, "b", 201), 2, 11);
        refused.status = Some(503);
        refused.fault = Some(FaultKind::Status { status: 503 });
        let mut dropped = lease(entry(3, 2, Operation::Acquire, "b", 201), 2, 12);
        dropped.status = Some(429);
        let history = [
            lease(entry(1, 0, Operation::Acquire, "a", 201), 1, 10),
            refused,
            dropped,
            entry(4, 3, Operation::Acquire, "b", 409),
        ];
        assert_eq!(check(&history), Vec::<String>::new());
    }

    fn attempt(id: &str, sent: u64, status: u16, at: u64) -> Attempt {
        Attempt {
            client: 0,
            request_id: id.to_owned(),
            operation: Operation::Acquire,
            key: "k".to_owned(),
            token: Some("a".to_owned()),
            ttl_seconds: Some(TTL),
            sent: Duration::from_secs(sent),
            timeout: Duration::from_secs(10),
            answer: Some(Observed {
                at: Duration::from_secs(at),
                status,
                fence: (status == 201).then_some(1),
                retry_after: None,
                left: None,
                json: true,
            }),
            failed: None,
            garbled: None,
        }
    }

    #[test]
    fn answers_must_come_from_the_server_while_in_flight() {
        let history = [lease(entry(1, 5, Operation::Acquire, "a", 201), 1, 15)];
        let mut out = Vec::new();
        clients(&[attempt("id-1", 4, 201, 6)], &history, &mut out);
        assert_eq!(out, Vec::<String>::new());
        for wrong in [
            attempt("id-1", 6, 201, 7), // applied before it was sent
            attempt("id-1", 3, 201, 4), // answered before it was applied
            attempt("id-1", 4, 409, 6), // not the answer given
            attempt("id-2", 4, 201, 6), // an id the server never saw
        ] {
            let mut out = Vec::new();
            clients(std::slice::from_ref(&wrong), &history, &mut out);
            assert_eq!(out.len(), 1, "{wrong:?}");
        }
    }

    /// A gateway's 504 is its own answer: the service applied the request
    /// (201) after it was sent, here after the 504 came back.
    #[test]
    fn a_gateways_answer_is_its_own() {
        let mut applied = lease(entry(1, 8, Operation::Acquire, "a", 201), 1, 18);
        applied.fault = Some(FaultKind::Gateway {
            status: 504,
            patience_ms: 1_000,
            apply_after_ms: 4_000,
        });
        let history = [applied];
        let mut out = Vec::new();
        clients(&[attempt("id-1", 4, 504, 5)], &history, &mut out);
        assert_eq!(out, Vec::<String>::new());
        for wrong in [
            attempt("id-1", 4, 503, 5),  // not the gateway's status
            attempt("id-1", 9, 504, 10), // applied before it was sent
        ] {
            let mut out = Vec::new();
            clients(std::slice::from_ref(&wrong), &history, &mut out);
            assert_eq!(out.len(), 1, "{wrong:?}");
        }
    }
}
