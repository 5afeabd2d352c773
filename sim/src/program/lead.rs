//! Leader election (`locks.leader`): each term writes through the gate;
//! what the candidate's status and health say is checked against its
//! terms as they run.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use volcano::{LeaderHealth, LeaderStatus, LockGuard};

use super::ctx::{Ctx, PAUSE};
use super::op::{campaign, max_hold_for, one_in, poll_for};
use crate::log::{Event, Log};

impl Ctx {
    /// Leader election for a while. A quarter of the candidates run terms
    /// that stall past their lock (a blocking call, a GC pause) after some
    /// work; half cap each term (`max_hold`), after which the leader makes
    /// way for about a poll interval, then campaigns again. A third
    /// campaign at a short poll interval (200 ms to 2 s). `run` returns
    /// `Ok` only once its `until` has fired.
    pub(super) async fn lead(&self, key: &str, ttl: Duration, work: Duration, coin: u64) {
        let stalls = one_in(coin >> 20, 4);
        let cap = one_in(coin >> 50, 2).then(|| max_hold_for(coin >> 7));
        let span = campaign(work);
        let began = tokio::time::Instant::now();
        // Half the leaders drain their term (0.5 s to 5.5 s) when `until`
        // fires; the term then finishes in up to twice that, so that some
        // outlive their drain and are dropped.
        let drain = if one_in(coin >> 33, 2) {
            Duration::from_millis(500 + (coin >> 35) % 5_000)
        } else {
            Duration::ZERO
        };
        let finishing = Duration::from_millis((coin >> 45) % (2 * drain.as_millis() as u64 + 1));
        let until = {
            let (log, client, key) = (self.log.clone(), self.id, key.to_owned());
            async move {
                tokio::time::sleep(span).await;
                log.push(Event::UntilFired { client, key, drain });
            }
        };
        let leader = self
            .locks
            .leader(key, ttl)
            .poll_interval(poll_for(coin))
            .until(until)
            .drain(drain);
        let leader = match cap {
            Some(cap) => leader.max_hold(cap),
            None => leader,
        };
        let status = leader.status();
        let health = leader.health();
        // What a watcher of the status last saw: every change of it is
        // announced (`changed()` wakes).
        let announced = Mutex::new((leader.status(), LeaderStatus::Following));
        let (watched, health, announced) = (&status, &health, &announced);
        let woken = watch_wakeups(self.log.clone(), self.id, leader.status(), key.to_owned());
        let result = leader
            .run(|term| async move {
                self.announced(announced, key);
                let mut done = TermDone::new(self, key, &term);
                let ended = self.believe_term(&term, Some((watched.clone(), health.clone())));
                let risk =
                    watch_term_risk(self.log.clone(), self.id, term.clone(), watched.clone());
                let working = async {
                    if stalls {
                        self.work(&[&term], work / 2).await;
                        self.stall(&term, health, ttl);
                    }
                    self.work(&[&term], Duration::from_secs(3600)).await;
                    ended.await;
                    risk.await;
                };
                tokio::select! {
                    biased;
                    () = term.stepping_down() => {
                        self.log.push(Event::Draining {
                            client: self.id,
                            key: key.to_owned(),
                            fence: term.lease().fencing_token(),
                        });
                        // The work in hand, through the gate, under the
                        // lock that is still held.
                        self.work(&[&term], finishing).await;
                    }
                    () = working => {}
                }
                done.returned = true;
                Ok::<_, volcano::Error>(())
            })
            .await;
        self.log.push(Event::RunReturned {
            client: self.id,
            key: key.to_owned(),
        });
        woken.await;
        if *status.borrow() != LeaderStatus::Stopped {
            self.broken(format!(
                "leader on {key}: run returned while its status says {:?}",
                *status.borrow()
            ));
        }
        match result {
            Ok(()) if began.elapsed() < span => self.broken(format!(
                "leader on {key}: run returned Ok after {:?}, before its until ({span:?})",
                began.elapsed()
            )),
            Ok(()) => {}
            Err(err) => self.note(format!("leader {key}: {err}")),
        }
    }

    /// At a term's start: if the status changed since a watcher last
    /// looked, the watcher was told.
    fn announced(
        &self,
        announced: &Mutex<(watch::Receiver<LeaderStatus>, LeaderStatus)>,
        key: &str,
    ) {
        let mut guard = crate::lock(announced);
        let (rx, last) = &mut *guard;
        let told = rx.has_changed().unwrap_or(false);
        let now = *rx.borrow_and_update();
        if now != *last && !told {
            self.broken(format!(
                "leader on {key}: its status changed from {last:?} to {now:?} unannounced"
            ));
        }
        *last = now;
    }

    /// A term that keeps its thread past its lock: the lease clock moves
    /// on by more than a ttl within one poll (as a blocking call or a GC
    /// pause would), and the term, still running, asks its leader's
    /// health, which must say it is overdue.
    fn stall(&self, term: &LockGuard, health: &LeaderHealth, ttl: Duration) {
        if term.is_lost() {
            return;
        }
        let by = ttl + Duration::from_secs(1);
        self.log.push(Event::Fault {
            what: format!("stall of client-{}'s term for {by:?}", self.id),
        });
        self.clock.advance(by);
        if health.overdue().is_none() {
            self.broken(format!(
                "a term on {} stalled {by:?} past its lock, and its leader's health says nothing",
                term.lease().key()
            ));
        }
    }
}

/// Logs how a term ended when it is dropped: returned (the term set
/// `returned`), or dropped by its candidate.
struct TermDone {
    log: Log,
    client: usize,
    key: String,
    fence: i64,
    returned: bool,
}

impl TermDone {
    fn new(ctx: &Ctx, key: &str, term: &LockGuard) -> Self {
        TermDone {
            log: ctx.log.clone(),
            client: ctx.id,
            key: key.to_owned(),
            fence: term.lease().fencing_token(),
            returned: false,
        }
    }
}

impl Drop for TermDone {
    fn drop(&mut self) {
        self.log.push(Event::TermDone {
            client: self.client,
            key: std::mem::take(&mut self.key),
            fence: self.fence,
            returned: self.returned,
        });
    }
}

/// While a term holds its lock, a status that says it leads under the
/// term's fence says the term is at risk exactly when its guard does
/// (read a pause apart, when the guard said the same both times: the
/// status follows a change within the tick). The returned future
/// completes when the term's lock is lost.
fn watch_term_risk(
    log: Log,
    client: usize,
    term: LockGuard,
    status: watch::Receiver<LeaderStatus>,
) -> impl std::future::Future<Output = ()> + 'static {
    let (done, stopped) = tokio::sync::oneshot::channel();
    tokio::task::spawn_local(async move {
        let fence = term.lease().fencing_token();
        let mut before = term.at_risk().is_some();
        loop {
            tokio::select! {
                biased;
                () = term.lost() => break,
                () = tokio::time::sleep(PAUSE) => {}
            }
            let now = term.at_risk().is_some();
            let says = match *status.borrow() {
                LeaderStatus::Leading {
                    fencing_token,
                    at_risk,
                } if fencing_token == fence => Some(at_risk),
                _ => None,
            };
            if let Some(says) = says.filter(|says| now == before && *says != now && !term.is_lost())
            {
                log.push(Event::Contract {
                    client,
                    what: format!(
                        "the leader's status says at_risk: {says} for the term on {} (fence {fence}); its guard says {now}",
                        term.key()
                    ),
                });
            }
            before = now;
        }
        let _ = done.send(());
    });
    async move {
        let _ = stopped.await;
    }
}

/// A watcher of the status is woken by changes only: each time it wakes,
/// the status differs from what it saw before. Each status is logged
/// ([`Event::LeaderSays`]) for the checks. Ends when the status says
/// `Stopped` (or its sender is gone); the returned future completes then.
fn watch_wakeups(
    log: Log,
    client: usize,
    mut status: watch::Receiver<LeaderStatus>,
    key: String,
) -> impl std::future::Future<Output = ()> + 'static {
    let (done, stopped) = tokio::sync::oneshot::channel();
    tokio::task::spawn_local(async move {
        let says = |status: LeaderStatus| {
            log.push(Event::LeaderSays {
                client,
                key: key.clone(),
                status: match status {
                    LeaderStatus::Leading { .. } => "leading",
                    LeaderStatus::Following => "following",
                    LeaderStatus::Unreachable { .. } => "unreachable",
                    LeaderStatus::SteppingDown { .. } => "stepping down",
                    _ => "stopped",
                },
            });
        };
        let mut last = *status.borrow_and_update();
        says(last);
        while last != LeaderStatus::Stopped && status.changed().await.is_ok() {
            let now = *status.borrow_and_update();
            says(now);
            if now == last {
                log.push(Event::Contract {
                    client,
                    what: format!(
                        "leader on {key}: its status watcher was woken with no change ({now:?})"
                    ),
                });
            }
            last = now;
        }
        let _ = done.send(());
    });
    async move {
        let _ = stopped.await;
    }
}
