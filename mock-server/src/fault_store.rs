//! The fault store: the injected [`Fault`]s, consumed in the order they
//! were injected, and the matching that plans what applies to one request
//! ([`Planned`]). The specs themselves, and their checks, are `fault`.

use std::sync::Mutex;
use std::time::Duration;

use crate::fault::{Fault, FaultKind, InvalidFault, Operation, MAX_FAULTS};
use crate::sync::lock_unpoisoned;

impl Operation {
    fn covers(self, op: Operation) -> bool {
        self == Operation::Any || self == op
    }
}

impl Fault {
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
    /// The first matching status, drop_response, reset,
    /// garbled_response or gateway fault.
    pub(crate) action: Option<FaultKind>,
}

/// The injected faults, in the order they were injected: a plain list (it
/// holds at most [`MAX_FAULTS`]). With none, a request costs one look at
/// its length.
#[derive(Default)]
pub(crate) struct Faults {
    list: Mutex<Vec<Fault>>,
}

impl Planned {
    /// Takes `fault` into the plan if it applies to this request (and its
    /// `every` count says so), counting the use against `times`.
    fn take(&mut self, fault: &mut Fault, op: Operation, key: &str) {
        if !fault.matches(op, key) {
            return;
        }
        if let Some(every) = fault.every {
            fault.seen = fault.seen.wrapping_add(1);
            if fault.seen % every.max(1) != 0 {
                return;
            }
        }
        match fault.kind {
            FaultKind::Delay { delay_ms } => {
                self.delay = self.delay.saturating_add(Duration::from_millis(delay_ms));
            }
            FaultKind::DelayResponse { ms } => {
                self.delay_response = self
                    .delay_response
                    .saturating_add(Duration::from_millis(ms));
            }
            kind if self.action.is_none() => self.action = Some(kind),
            _ => return,
        }
        if let Some(n) = fault.times.as_mut() {
            *n -= 1;
        }
    }
}

impl Faults {
    pub(crate) fn push(&self, fault: Fault) -> Result<(), InvalidFault> {
        fault.validate()?;
        let mut list = self.lock();
        if list.len() >= MAX_FAULTS {
            return Err(InvalidFault::TooMany);
        }
        list.push(fault);
        Ok(())
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Takes what applies to this request: every matching delay and
    /// delay_response (each kind added up, saturating) and the first
    /// matching other fault, in injection order; each use counts against
    /// `times`, and a fault used up is dropped.
    pub(crate) fn plan(&self, op: Operation, key: &str) -> Planned {
        let mut list = self.lock();
        if list.is_empty() {
            return Planned::default();
        }
        let mut planned = Planned::default();
        for fault in list.iter_mut() {
            planned.take(fault, op, key);
        }
        list.retain(|fault| fault.times != Some(0));
        planned
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        lock_unpoisoned(&self.list)
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
        assert_eq!(faults.lock().len(), 0, "used-up faults are gone");
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
        assert_eq!(
            faults.push(Fault::status(503).times(0)),
            Err(InvalidFault::NeverApplies)
        );
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
