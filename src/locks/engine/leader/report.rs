//! What a candidate tells the world ([`Report`]): its status, its metrics,
//! and its running term ([`TermSlot`]), for its health.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::locks::engine::Reach;
use crate::locks::{LeaderStatus, LockGuard};

/// The term running now, for [`LeaderHealth`](crate::LeaderHealth): set
/// when a term begins, cleared when the candidate's loop has ended it.
/// A term that keeps its thread (blocking code, a loop that never awaits)
/// keeps the loop from ending it: then its guard is lost while it is
/// still here.
#[derive(Default)]
pub(crate) struct TermSlot(std::sync::Mutex<Option<Running>>);

struct Running {
    guard: LockGuard,
    /// When a health check first saw the term's lock lost.
    seen_lost: Option<tokio::time::Instant>,
}

impl TermSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn began(&self, guard: &LockGuard) {
        *self.lock() = Some(Running {
            guard: guard.clone(),
            seen_lost: None,
        });
    }

    pub(super) fn ended(&self) {
        if !sabotaged!(LeaderHealthStuck) {
            *self.lock() = None;
        }
    }

    /// How long the running term has outlived its lock: since its local
    /// deadline passed, or since a check first saw it lost (a loss before
    /// the deadline: a refusal, a mark, a max hold). `None`: no term, or
    /// its lock still held.
    pub(crate) fn overdue(&self) -> Option<Duration> {
        let mut slot = self.lock();
        let running = slot.as_mut()?;
        // Read only: no loss is recorded here (recording one may start a
        // release, and a probe may run on a thread of its own).
        let state = &running.guard.state;
        let past_deadline = state.clock.now().checked_sub(state.deadline());
        let lost = past_deadline.is_some() || state.failure().is_some();
        if !lost || sabotaged!(LeaderHealthSilent) {
            return None;
        }
        let now = tokio::time::Instant::now();
        let seen = now - *running.seen_lost.get_or_insert(now);
        Some(seen.max(past_deadline.unwrap_or_default()))
    }
}

/// What a candidate tells the world: its [`LeaderStatus`] and its
/// metrics (`volcano_leader_*`, labelled with the key only when asked),
/// and its running term, for its health.
pub(crate) struct Report {
    status: Arc<watch::Sender<LeaderStatus>>,
    key: Option<String>,
    pub(super) term: Arc<TermSlot>,
}

impl Report {
    pub(crate) fn new(
        status: watch::Sender<LeaderStatus>,
        key: Option<String>,
        term: Arc<TermSlot>,
    ) -> Self {
        Report {
            status: Arc::new(status),
            key,
            term,
        }
    }

    fn set(&self, status: LeaderStatus) {
        self.status.send_if_modified(|now| {
            let changed = *now != status;
            *now = status;
            changed
        });
    }

    /// Campaigning: told whether the service answers the campaign's tries.
    pub(super) fn campaigning(&self) -> Reach {
        self.set(LeaderStatus::Following);
        let status = self.status.clone();
        Arc::new(move |since: Option<tokio::time::Instant>| {
            status.send_if_modified(|now| match (since, *now) {
                (Some(since), LeaderStatus::Following) => {
                    *now = LeaderStatus::Unreachable {
                        since: since.into_std(),
                    };
                    true
                }
                (None, LeaderStatus::Unreachable { .. }) => {
                    *now = LeaderStatus::Following;
                    true
                }
                _ => false,
            });
        })
    }

    pub(super) fn elected(&self, fencing_token: i64) {
        self.set(LeaderStatus::Leading {
            fencing_token,
            at_risk: false,
        });
        crate::telemetry::leader_elected(self.key.as_deref(), fencing_token);
    }

    /// `until` fired: the term drains under its lock.
    pub(super) fn stepping_down(&self, fencing_token: i64) {
        self.set(LeaderStatus::SteppingDown { fencing_token });
    }

    pub(super) fn at_risk(&self, at_risk: bool) {
        self.status.send_if_modified(|now| match now {
            LeaderStatus::Leading { at_risk: was, .. } if *was != at_risk => {
                *was = at_risk;
                true
            }
            _ => false,
        });
    }

    /// A term ended, for `why` (a metrics label).
    pub(super) fn ended(&self, why: &'static str) {
        if !sabotaged!(StaleLeaderStatus) {
            self.set(LeaderStatus::Following);
        }
        crate::telemetry::leader_ended(self.key.as_deref(), why);
    }
}

/// Dropped with the candidate's future (`run` returned, or the future was
/// dropped mid-term): it leads no more.
impl Drop for Report {
    fn drop(&mut self) {
        self.term.ended();
        if matches!(
            *self.status.borrow(),
            LeaderStatus::Leading { .. } | LeaderStatus::SteppingDown { .. }
        ) {
            crate::telemetry::leader_ended(self.key.as_deref(), "dropped");
        }
        self.set(LeaderStatus::Stopped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report and a receiver of its status, told of nothing yet.
    fn report() -> (Report, watch::Receiver<LeaderStatus>) {
        let (status, mut seen) = watch::channel(LeaderStatus::Following);
        seen.mark_unchanged();
        (Report::new(status, None, Arc::default()), seen)
    }

    /// Whether the receiver was told of a change; then up to date.
    fn told(seen: &mut watch::Receiver<LeaderStatus>) -> bool {
        let changed = seen.has_changed().unwrap();
        seen.mark_unchanged();
        changed
    }

    #[tokio::test(start_paused = true)]
    async fn a_campaign_tells_reachability_once_per_change() {
        let (report, mut seen) = report();
        let reach = report.campaigning();
        assert!(!told(&mut seen), "following already");
        let since = tokio::time::Instant::now();
        reach(Some(since));
        assert!(told(&mut seen));
        assert_eq!(
            *seen.borrow(),
            LeaderStatus::Unreachable {
                since: since.into_std()
            }
        );
        reach(Some(since + Duration::from_secs(5)));
        assert!(!told(&mut seen), "still unreachable, since the first");
        reach(None);
        assert!(told(&mut seen));
        assert_eq!(*seen.borrow(), LeaderStatus::Following);
        reach(None);
        assert!(!told(&mut seen), "answered again: no change");
    }

    #[tokio::test]
    async fn a_term_tells_its_risk_once_per_change() {
        let (report, mut seen) = report();
        report.elected(7);
        assert!(told(&mut seen));
        report.at_risk(false);
        assert!(!told(&mut seen), "no risk before, none now");
        report.at_risk(true);
        assert!(told(&mut seen));
        assert_eq!(
            *seen.borrow(),
            LeaderStatus::Leading {
                fencing_token: 7,
                at_risk: true
            }
        );
        report.at_risk(true);
        assert!(!told(&mut seen));
        report.at_risk(false);
        assert!(told(&mut seen));
        report.ended("returned");
        assert!(told(&mut seen));
        assert_eq!(*seen.borrow(), LeaderStatus::Following);
        // Not leading: a risk is no news.
        report.at_risk(true);
        assert!(!told(&mut seen));
        drop(report);
        assert_eq!(*seen.borrow_and_update(), LeaderStatus::Stopped);
    }
}
