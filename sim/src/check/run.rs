//! What every check reads: the server's side of a run ([`Server`]) and
//! [`Run`], the one value each check is given, built once from the
//! programs' log and the server's journal: the server's clock jumps (to
//! read its clock on sim time), its grants, what breaks exclusion by
//! design, and the programs' beliefs.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use volcano_mock_server::{LockSnapshot, Operation, RecordedRequest};

use crate::log::{Event, Stamped};

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

/// One run as the checks see it: what was logged and journaled, and what
/// every check derives from it, derived once.
pub(super) struct Run<'a> {
    /// Every event of the programs and the driver, in order.
    pub(super) events: &'a [Stamped],
    /// What the server says happened.
    pub(super) server: &'a Server,
    /// The server's clock jumps: when (sim time), and by how much.
    jumps: Vec<(Duration, Duration)>,
    /// The server's grants, in the order of their sim time.
    pub(super) grants: Vec<Grant>,
    /// What breaks exclusion by design.
    pub(super) breaks: Breaks,
    /// The programs' beliefs that they held a key; those still open at
    /// the end (`end`, sim time) last until then.
    pub(super) beliefs: Vec<Belief>,
    /// How far past the server's expiry a guard may say its lease lasts
    /// because its host's clock runs slow (zero for an exact clock).
    pub(super) drift_slack: Duration,
    /// The rate the client hosts' clocks run at (1 for an exact clock).
    pub(super) clock_rate: f64,
}

impl<'a> Run<'a> {
    /// The run of `events` and `server`, whose programs ended at `end`.
    pub(super) fn new(events: &'a [Stamped], server: &'a Server, end: Duration) -> Run<'a> {
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
            jumps: jumps.clone(),
        };
        let beliefs = beliefs(events, end);
        Run {
            events,
            server,
            jumps,
            grants,
            breaks,
            beliefs,
            drift_slack: Duration::ZERO,
            clock_rate: 1.0,
        }
    }

    /// Whether `client` freed `key` (a release or a force-release answered
    /// 204) between `from` and `to`: a waiter may then try at once.
    pub(super) fn freed_between(
        &self,
        client: usize,
        key: &str,
        from: Duration,
        to: Duration,
    ) -> bool {
        self.server.sent.attempts.iter().any(|r| {
            r.client == client
                && r.key == key
                && matches!(r.operation, Operation::Release | Operation::ForceRelease)
                && r.answer
                    .as_ref()
                    .is_some_and(|o| o.status == 204 && o.at >= from && o.at <= to)
        })
    }

    /// Whether a request of `client` sent from `from` to `to` was answered
    /// later than `within` after it went, or not at all: its link was slow
    /// (a latency lasts) or broken.
    pub(super) fn slow_link(
        &self,
        client: usize,
        from: Duration,
        to: Duration,
        within: Duration,
    ) -> bool {
        self.server.sent.attempts.iter().any(|a| {
            a.client == client
                && a.sent >= from
                && a.sent <= to
                && a.answer.as_ref().is_none_or(|o| o.at > a.sent + within)
        })
    }

    /// Whether `client`'s lease clock was moved on in `[from, to]`: its
    /// host suspended, or a leader's term on it stalled.
    pub(super) fn lease_clock_moved(&self, client: usize, from: Duration, to: Duration) -> bool {
        self.events.iter().any(|e| {
            e.at >= from
                && e.at <= to
                && matches!(&e.event, Event::Fault { what }
                    if (what.starts_with("suspend of ") || what.starts_with("stall of "))
                        && super::recovery::touches(what, client))
        })
    }

    /// The first outcome of `client`'s operation after the event at
    /// `index`: a belief, a lease, a note, the step's end or a crash.
    pub(super) fn outcome_after(&self, index: usize, client: usize) -> Option<&'a Stamped> {
        self.events[index + 1..]
            .iter()
            .find(|later| match &later.event {
                Event::Believes { client: c, .. }
                | Event::Leased { client: c, .. }
                | Event::Note { client: c, .. }
                | Event::StepEnded { client: c }
                | Event::Crashed { client: c } => *c == client,
                _ => false,
            })
    }

    /// The sim time at which the server's clock read `at`.
    /// When `client`'s operation under way at event `i` ended (its next
    /// [`Event::StepEnded`]); `Duration::MAX` if it never did.
    pub(super) fn step_ended(&self, i: usize, client: usize) -> Duration {
        self.events[i..]
            .iter()
            .find(|later| matches!(later.event, Event::StepEnded { client: c } if c == client))
            .map_or(Duration::MAX, |later| later.at)
    }

    /// Whether the hosts' clocks are exact and the server's never
    /// jumped: what checks of fine timing need.
    pub(super) fn exact_and_steady(&self) -> bool {
        self.clock_rate == 1.0 && self.jumps.is_empty()
    }

    /// Whether the server's clock jumped in `[from, to]` (sim time).
    pub(super) fn jumped_within(&self, from: Duration, to: Duration) -> bool {
        self.jumps.iter().any(|(at, _)| *at >= from && *at <= to)
    }

    /// How belief `b` ended, in the log's words (`None`: still held at
    /// the end).
    pub(super) fn why_ended(&self, b: &Belief) -> Option<&'a str> {
        self.events.iter().find_map(|e| match &e.event {
            Event::Ended {
                client,
                key,
                fence,
                why,
            } if *client == b.client && *key == b.key && *fence == b.fence && e.at == b.to => {
                Some(why.as_str())
            }
            _ => None,
        })
    }

    pub(super) fn sim_time(&self, at: DateTime<Utc>) -> Duration {
        sim_time(self.server, &self.jumps, at)
    }

    /// The token a lease was granted to, from the acquire attempts
    /// answered with its fence.
    pub(super) fn token_of(&self, key: &str, fence: i64) -> Option<&'a str> {
        self.server
            .sent
            .attempts
            .iter()
            .find(|a| {
                a.operation == Operation::Acquire
                    && a.key == key
                    && a.answer.as_ref().and_then(|o| o.fence) == Some(fence)
            })
            .and_then(|a| a.token.as_deref())
    }
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
pub(super) struct Grant {
    pub(super) key: String,
    pub(super) fence: i64,
    pub(super) at: Duration,
}

/// What breaks exclusion by design: force-releases and server clock jumps.
pub(super) struct Breaks {
    forced: Vec<(String, Duration)>,
    /// When the server's clock jumped (sim time), and by how much.
    jumps: Vec<(Duration, Duration)>,
}

impl Breaks {
    /// Whether one happened to `key` in `[from, to]`.
    pub(super) fn any(&self, key: &str, from: Duration, to: Duration) -> bool {
        let within = |at: Duration| at >= from && at <= to;
        self.forced.iter().any(|(k, at)| k == key && within(*at))
            || self.jumps.iter().any(|&(at, _)| within(at))
    }

    /// How far the server's clock jumped in `[from, to]`: how much sooner
    /// than granted a lease live through that stretch ended on the server.
    /// (A force-release ends a lease too, but not the holder's belief:
    /// the holder is excused only until the lease's expiry, which its
    /// local deadline never passes.)
    pub(super) fn jumped(&self, from: Duration, to: Duration) -> Duration {
        self.jumps
            .iter()
            .filter(|&&(at, _)| at >= from && at <= to)
            .map(|&(_, by)| by)
            .sum()
    }
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

/// The sim time at which the server's clock read `at`: it ran from
/// `epoch` at `started`, plus every jump made before then.
fn sim_time(server: &Server, jumps: &[(Duration, Duration)], at: DateTime<Utc>) -> Duration {
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

/// Every belief in the log: from a program's `Believes` to its `Ended`,
/// or to its crash, or (still open) to `end`.
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
