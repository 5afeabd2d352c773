//! Fault injection: answers and failures the mock server produces on demand.

use crate::lock_unpoisoned;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A lock operation, for scoping faults and reading the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Operation {
    /// `POST /locks/{key}/lease`
    Acquire,
    /// `PATCH /locks/{key}/lease`
    Renew,
    /// `DELETE /locks/{key}/lease`
    Release,
    /// `GET /locks/{key}`
    Get,
    /// `DELETE /locks/{key}`
    ForceRelease,
    /// Every operation (faults only).
    Any,
}

impl Operation {
    fn covers(self, op: Operation) -> bool {
        self == Operation::Any || self == op
    }
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FaultKind {
    /// Answer with this status and the documented error body, without
    /// applying the request.
    Status {
        /// The HTTP status.
        status: u16,
    },
    /// Apply the request, then close the connection without answering.
    DropResponse,
    /// Close the connection before applying the request.
    Reset,
    /// Wait this long, then handle the request normally.
    Delay {
        /// Milliseconds to wait (`ms` is accepted too, as for
        /// `delay_response`).
        #[serde(alias = "ms")]
        delay_ms: u64,
    },
    /// Apply the request at once, then hold the answer this long.
    DelayResponse {
        /// Milliseconds to hold the answer.
        ms: u64,
    },
}

/// A fault to inject with `MockServer::inject`.
///
/// ```
/// use std::time::Duration;
/// use volcano_mock_server::{Fault, Operation};
/// let fault = Fault::status(503).on(Operation::Renew).times(2);
/// let slow = Fault::delay(Duration::from_millis(1500)).on(Operation::Any);
/// // Applied at once, answered two seconds later: a client that gives up
/// // first does not know it holds the lock.
/// let late = Fault::delay_response(Duration::from_secs(2))
///     .on(Operation::Acquire)
///     .times(1);
/// # let _ = (fault, slow, late);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Fault {
    /// What happens.
    #[serde(flatten)]
    pub kind: FaultKind,
    /// Which operation it applies to (default: any).
    #[serde(default = "any")]
    pub operation: Operation,
    /// Only requests for this key (default: every key).
    #[serde(default)]
    pub key: Option<String>,
    /// How many matching requests it affects (default: all, until reset).
    #[serde(default)]
    pub times: Option<u32>,
    /// Affect only every n-th matching request (default: each one).
    #[serde(default)]
    pub every: Option<u32>,
    /// Matching requests seen so far (for `every`).
    #[serde(skip)]
    seen: u32,
}

fn any() -> Operation {
    Operation::Any
}

/// Whole milliseconds of `duration`, saturating (as faults and the journal
/// count them).
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Fault {
    fn new(kind: FaultKind) -> Self {
        Fault {
            kind,
            operation: Operation::Any,
            key: None,
            times: None,
            every: None,
            seen: 0,
        }
    }

    /// Answer with `status` (e.g. 503, 429, 500) without applying the request.
    pub fn status(status: u16) -> Self {
        Self::new(FaultKind::Status { status })
    }

    /// Apply the request, then close the connection without an answer: the
    /// client cannot know that it succeeded.
    pub fn drop_response() -> Self {
        Self::new(FaultKind::DropResponse)
    }

    /// Close the connection before applying the request.
    pub fn reset() -> Self {
        Self::new(FaultKind::Reset)
    }

    /// Hold the request for `delay`, then handle it normally (the state
    /// change happens after the delay, as on a slow network).
    pub fn delay(delay: Duration) -> Self {
        Self::new(FaultKind::Delay {
            delay_ms: millis(delay),
        })
    }

    /// Apply the request at once (the state change and the journal entry
    /// happen before the wait), then hold the answer for `delay`. With a
    /// status fault it is that answer that waits; with `drop_response` or
    /// `reset` the connection closes after the wait.
    pub fn delay_response(delay: Duration) -> Self {
        Self::new(FaultKind::DelayResponse { ms: millis(delay) })
    }

    /// Limit the fault to one operation.
    pub fn on(mut self, operation: Operation) -> Self {
        self.operation = operation;
        self
    }

    /// Limit the fault to one key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Affect only the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Affect only every `n`-th matching request: `every(20)` is 5 %.
    pub fn every(mut self, n: u32) -> Self {
        self.every = Some(n.max(1));
        self
    }

    fn matches(&self, op: Operation, key: &str) -> bool {
        self.operation.covers(op)
            && self.key.as_deref().is_none_or(|k| k == key)
            && self.times != Some(0)
    }
}

/// The faults that apply to one request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    /// Wait before applying (every matching `delay`, added up).
    pub(crate) delay: Duration,
    /// Wait after applying, before answering (every matching
    /// `delay_response`, added up).
    pub(crate) delay_response: Duration,
    /// The first matching status, drop_response or reset fault.
    pub(crate) action: Option<FaultKind>,
}

/// Most faults pending at once; past it an inject is refused. A fault
/// without `times` stays until reset, so a test (or a fuzzer) posting them
/// in a loop would otherwise grow the server without bound.
pub const MAX_FAULTS: usize = 1024;

/// Why a fault was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidFault {
    /// A status fault's status is not a final HTTP status.
    Status(u16),
    /// The fault's key is not a lock key, so no lock request could match it.
    Key(String),
    /// [`MAX_FAULTS`] faults are pending.
    TooMany,
}

impl std::fmt::Display for InvalidFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidFault::Status(status) => write!(
                f,
                "fault status {status} is not a final HTTP status: use 200..=599"
            ),
            InvalidFault::Key(key) => write!(
                f,
                "fault key {key:?} can never match: lock keys match \
                 ^[A-Za-z0-9][A-Za-z0-9._:-]{{0,127}}$"
            ),
            InvalidFault::TooMany => write!(
                f,
                "{MAX_FAULTS} faults are pending; clear them (DELETE /__mock/faults or \
                 POST /__mock/reset) before injecting more"
            ),
        }
    }
}

impl std::error::Error for InvalidFault {}

impl Fault {
    /// Checks that the fault can take effect as asked.
    pub fn validate(&self) -> Result<(), InvalidFault> {
        if let FaultKind::Status { status } = self.kind {
            if !(200..=599).contains(&status) {
                return Err(InvalidFault::Status(status));
            }
        }
        match &self.key {
            Some(key) if !crate::state::valid_key(key) => {
                let mut shown: String = key.chars().take(140).collect();
                if shown.len() < key.len() {
                    shown.push_str("...");
                }
                Err(InvalidFault::Key(shown))
            }
            _ => Ok(()),
        }
    }
}

/// The injected faults, consumed in the order they were injected, indexed
/// by operation and key: a request looks only at the faults that can apply
/// to it (its operation's and `Any`'s, for its key and for every key).
#[derive(Default)]
pub(crate) struct Faults {
    index: Mutex<Index>,
}

#[derive(Default)]
struct Index {
    /// Injection order.
    next: u64,
    len: usize,
    /// One bucket per [`Operation`], `Any` included.
    buckets: [Bucket; 6],
}

#[derive(Default)]
struct Bucket {
    every_key: Vec<Entry>,
    by_key: std::collections::HashMap<String, Vec<Entry>>,
}

struct Entry {
    seq: u64,
    fault: Fault,
}

/// One of the four lists that can apply to a request: a bucket, and its
/// every-key list (`false`) or its list for the request's key (`true`).
type ListId = (usize, bool);

fn bucket(op: Operation) -> usize {
    match op {
        Operation::Acquire => 0,
        Operation::Renew => 1,
        Operation::Release => 2,
        Operation::Get => 3,
        Operation::ForceRelease => 4,
        Operation::Any => 5,
    }
}

impl Index {
    fn list(&mut self, (bucket, keyed): ListId, key: &str) -> Option<&mut Vec<Entry>> {
        let bucket = &mut self.buckets[bucket];
        if keyed {
            bucket.by_key.get_mut(key)
        } else {
            Some(&mut bucket.every_key)
        }
    }
}

impl Faults {
    pub(crate) fn push(&self, fault: Fault) -> Result<(), InvalidFault> {
        fault.validate()?;
        let mut index = self.lock();
        if index.len >= MAX_FAULTS {
            return Err(InvalidFault::TooMany);
        }
        let seq = index.next;
        index.next += 1;
        index.len += 1;
        let bucket = &mut index.buckets[bucket(fault.operation)];
        let list = match &fault.key {
            Some(key) => bucket.by_key.entry(key.clone()).or_default(),
            None => &mut bucket.every_key,
        };
        list.push(Entry { seq, fault });
        Ok(())
    }

    pub(crate) fn clear(&self) {
        *self.lock() = Index::default();
    }

    /// Takes what applies to this request: every matching delay and
    /// delay_response (each kind added up, saturating) and the first
    /// matching other fault; each use counts against `times`.
    pub(crate) fn plan(&self, op: Operation, key: &str) -> Planned {
        let mut index = self.lock();
        if index.len == 0 {
            return Planned::default();
        }
        let all: [ListId; 4] = [
            (bucket(op), true),
            (bucket(op), false),
            (bucket(Operation::Any), true),
            (bucket(Operation::Any), false),
        ];
        // A request always names its operation; `Any` would list twice.
        let lists = if op == Operation::Any {
            &all[2..]
        } else {
            &all[..]
        };
        // The candidates of these lists, in injection order.
        let mut order = Vec::new();
        for (n, &id) in lists.iter().enumerate() {
            if let Some(list) = index.list(id, key) {
                order.extend(list.iter().enumerate().map(|(i, e)| (e.seq, n, i)));
            }
        }
        order.sort_unstable();
        let mut planned = Planned::default();
        for (_, n, i) in order {
            let Some(entry) = index.list(lists[n], key).and_then(|l| l.get_mut(i)) else {
                continue;
            };
            let fault = &mut entry.fault;
            if !fault.matches(op, key) {
                continue;
            }
            if let Some(every) = fault.every {
                fault.seen = fault.seen.wrapping_add(1);
                if fault.seen % every.max(1) != 0 {
                    continue;
                }
            }
            match fault.kind {
                FaultKind::Delay { delay_ms } => {
                    planned.delay = planned
                        .delay
                        .saturating_add(Duration::from_millis(delay_ms));
                }
                FaultKind::DelayResponse { ms } => {
                    planned.delay_response = planned
                        .delay_response
                        .saturating_add(Duration::from_millis(ms));
                }
                kind if planned.action.is_none() => planned.action = Some(kind),
                _ => continue,
            }
            if let Some(n) = fault.times.as_mut() {
                *n -= 1;
            }
        }
        let mut removed = 0;
        for &id in lists {
            if let Some(list) = index.list(id, key) {
                let before = list.len();
                list.retain(|e| e.fault.times != Some(0));
                removed += before - list.len();
            }
            let bucket = &mut index.buckets[id.0];
            if id.1 && bucket.by_key.get(key).is_some_and(Vec::is_empty) {
                bucket.by_key.remove(key);
            }
        }
        index.len -= removed;
        planned
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        lock_unpoisoned(&self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_scoped_and_counted() {
        let faults = Faults::default();
        faults
            .push(Fault::status(503).on(Operation::Renew).times(1))
            .unwrap();
        faults
            .push(Fault::delay(Duration::from_millis(10)).times(2))
            .unwrap();
        faults.push(Fault::reset().key("other")).unwrap();
        let p = faults.plan(Operation::Acquire, "k");
        assert_eq!(
            p,
            Planned {
                delay: Duration::from_millis(10),
                delay_response: Duration::ZERO,
                action: None
            }
        );
        let p = faults.plan(Operation::Renew, "k");
        assert_eq!(p.action, Some(FaultKind::Status { status: 503 }));
        assert_eq!(p.delay, Duration::from_millis(10));
        assert_eq!(faults.plan(Operation::Renew, "k"), Planned::default());
        assert_eq!(
            faults.plan(Operation::Get, "other").action,
            Some(FaultKind::Reset)
        );
        assert_eq!(
            faults.plan(Operation::Get, "other").action,
            Some(FaultKind::Reset)
        );
    }

    #[test]
    fn fault_json_shape() {
        let json =
            serde_json::to_value(Fault::status(503).on(Operation::Acquire).times(1)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "status", "status": 503, "operation": "acquire", "key": null, "times": 1, "every": null})
        );
        let parsed: Fault = serde_json::from_str(r#"{"kind":"delay","delay_ms":1500}"#).unwrap();
        assert_eq!(parsed, Fault::delay(Duration::from_millis(1500)));
        let parsed: Fault = serde_json::from_str(r#"{"kind":"delay","ms":1500}"#).unwrap();
        assert_eq!(parsed, Fault::delay(Duration::from_millis(1500)));
        let parsed: Fault = serde_json::from_str(
            r#"{"kind":"delay_response","ms":250,"operation":"acquire","times":1}"#,
        )
        .unwrap();
        assert_eq!(
            parsed,
            Fault::delay_response(Duration::from_millis(250))
                .on(Operation::Acquire)
                .times(1)
        );
        assert_eq!(
            serde_json::to_value(FaultKind::DelayResponse { ms: 250 }).unwrap(),
            serde_json::json!({"kind": "delay_response", "ms": 250})
        );
    }

    #[test]
    fn delays_of_each_kind_add_up_beside_one_action() {
        let faults = Faults::default();
        faults
            .push(Fault::delay_response(Duration::from_millis(100)).times(1))
            .unwrap();
        faults
            .push(Fault::delay(Duration::from_millis(7)).times(1))
            .unwrap();
        faults
            .push(Fault::delay_response(Duration::from_millis(20)).on(Operation::Get))
            .unwrap();
        faults.push(Fault::status(503).times(1)).unwrap();
        faults.push(Fault::drop_response()).unwrap();
        assert_eq!(
            faults.plan(Operation::Get, "k"),
            Planned {
                delay: Duration::from_millis(7),
                delay_response: Duration::from_millis(120),
                action: Some(FaultKind::Status { status: 503 }),
            }
        );
        assert_eq!(
            faults.plan(Operation::Get, "k"),
            Planned {
                delay: Duration::ZERO,
                delay_response: Duration::from_millis(20),
                action: Some(FaultKind::DropResponse),
            }
        );
    }

    #[test]
    fn huge_delays_saturate_instead_of_overflowing() {
        // Each is u64::MAX ms; a thousand and one of them pass Duration::MAX.
        for fault in [
            Fault::delay(Duration::MAX),
            Fault::delay_response(Duration::MAX),
        ] {
            let faults = Faults::default();
            for _ in 0..1_001 {
                faults.push(fault.clone()).unwrap();
            }
            let planned = faults.plan(Operation::Acquire, "k");
            assert_eq!(planned.delay.max(planned.delay_response), Duration::MAX);
        }
    }

    #[test]
    fn the_index_keeps_injection_order_across_operations_and_keys() {
        let faults = Faults::default();
        faults.push(Fault::status(500).key("k").times(1)).unwrap();
        faults
            .push(Fault::status(503).on(Operation::Get).times(1))
            .unwrap();
        faults
            .push(Fault::status(429).on(Operation::Get).key("k").times(1))
            .unwrap();
        faults.push(Fault::status(502).times(1)).unwrap();
        let action = |op, key| match faults.plan(op, key).action {
            Some(FaultKind::Status { status }) => Some(status),
            _ => None,
        };
        // Other keys see only the unkeyed faults, in order.
        assert_eq!(action(Operation::Get, "other"), Some(503));
        assert_eq!(action(Operation::Get, "other"), Some(502));
        assert_eq!(action(Operation::Get, "other"), None);
        // On "k", the oldest first: the Any fault for "k", then Get's.
        assert_eq!(action(Operation::Get, "k"), Some(500));
        assert_eq!(action(Operation::Get, "k"), Some(429));
        assert_eq!(action(Operation::Get, "k"), None);
        assert_eq!(faults.lock().len, 0, "used-up faults are gone");
    }

    #[test]
    fn faults_that_cannot_take_effect_are_refused_and_the_count_is_bounded() {
        let faults = Faults::default();
        for status in [0, 42, 101, 199, 600] {
            assert_eq!(
                faults.push(Fault::status(status)),
                Err(InvalidFault::Status(status))
            );
        }
        assert!(faults.push(Fault::status(200)).is_ok());
        assert!(matches!(
            faults.push(Fault::reset().key("no spaces")),
            Err(InvalidFault::Key(_))
        ));
        for _ in 1..MAX_FAULTS {
            faults.push(Fault::reset().key("k")).unwrap();
        }
        assert_eq!(faults.push(Fault::reset()), Err(InvalidFault::TooMany));
        faults.clear();
        assert!(faults.push(Fault::reset()).is_ok());
    }

    #[test]
    fn every_nth_request() {
        let faults = Faults::default();
        faults
            .push(Fault::status(503).on(Operation::Renew).every(4))
            .unwrap();
        let hits: Vec<bool> = (0..12)
            .map(|_| faults.plan(Operation::Renew, "k").action.is_some())
            .collect();
        assert_eq!(hits.iter().filter(|h| **h).count(), 3);
        assert!(hits[3] && hits[7] && hits[11]);
    }
}
