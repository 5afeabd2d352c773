//! Sets of keys (`hold_all`, `with_locks`): every guard's belief is
//! logged as a single lock's is, and what the set says of itself (its
//! fences, its loss, its early warning, and the outcome of its release or
//! scope) is checked against its guards.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use volcano::{LockGuard, LockSet};

use super::ctx::{futures_all, Ctx};
use super::op::{max_hold_for, one_in, poll_for};
use crate::log::{Event, Log};

impl Ctx {
    /// Works inside a `with_locks` scope over every key. A scope whose
    /// set was lost by the end of its closure fails.
    pub(super) async fn with_locks(
        &self,
        all: &[String],
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        let lost_at_end = AtomicBool::new(false);
        let lost_at_end = &lost_at_end;
        let scope = self.locks.with_locks(all.to_vec(), ttl, |set| async move {
            let guards = self.whole_set(&set, all.len());
            let ended: Vec<_> = guards.iter().map(|g| self.believe(g)).collect();
            let watched = watch_set(self.log.clone(), self.id, set.clone());
            self.work(&guards.iter().collect::<Vec<_>>(), work).await;
            self.whole_set(&set, all.len());
            lost_at_end.store(set.is_lost(), Ordering::Relaxed);
            Ok::<_, volcano::Error>((ended, watched))
        });
        match scope.wait(wait).poll_interval(poll_for(coin)).await {
            Ok(_) if lost_at_end.load(Ordering::Relaxed) => self.broken(
                "with_locks returned Ok though its set was lost when its closure ended".to_owned(),
            ),
            Ok((ended, watched)) => {
                futures_all(ended).await;
                watched.await;
            }
            Err(err) => self.failed("with_locks", &err),
        }
    }

    /// Every key at once, then released (or dropped). A release of a set
    /// that was lost fails.
    pub(super) async fn hold_all(
        &self,
        all: &[String],
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        let mut hold = self
            .locks
            .hold_all(all.to_vec(), ttl)
            .wait(wait)
            .poll_interval(poll_for(coin));
        if one_in(coin, 4) {
            hold = hold.max_hold(max_hold_for(coin));
        }
        let held = match hold.await {
            Ok(held) => held,
            Err(err) => return self.failed("hold_all", &err),
        };
        let set = held.set();
        let guards = self.whole_set(&set, all.len());
        let ended: Vec<_> = guards.iter().map(|g| self.believe(g)).collect();
        let watched = watch_set(self.log.clone(), self.id, set.clone());
        self.work(&guards.iter().collect::<Vec<_>>(), work).await;
        self.whole_set(&set, all.len());
        if one_in(coin, 3) {
            drop(held);
        } else {
            let lost = set.is_lost();
            match held.release().await {
                Ok(()) if lost => {
                    self.broken("HeldLocks::release returned Ok though the set was lost".to_owned())
                }
                Ok(()) => {}
                Err(err) => self.note(format!("release of all: {err}")),
            }
        }
        futures_all(ended).await;
        watched.await;
    }

    /// A held set has a guard for every key asked for, and says of each
    /// what its guard says: its fence, whether it is lost and why.
    pub(super) fn whole_set(&self, set: &LockSet, asked: usize) -> Vec<LockGuard> {
        let guards: Vec<LockGuard> = set.keys().filter_map(|k| set.guard(k)).cloned().collect();
        let mut broken = Vec::new();
        if guards.len() != asked {
            broken.push(format!(
                "a held set lists {} keys with guards; {asked} were asked for",
                guards.len()
            ));
        }
        for guard in &guards {
            let fence = guard.lease().fencing_token();
            if set.fencing_token(guard.key()) != Some(fence) {
                broken.push(format!(
                    "a held set says {:?} for {}'s fence; its guard says {fence}",
                    set.fencing_token(guard.key()),
                    guard.key()
                ));
            }
        }
        let (lost, any_lost) = (set.is_lost(), guards.iter().any(LockGuard::is_lost));
        if lost != any_lost {
            broken.push(format!(
                "a held set says is_lost() is {lost}; its guards say {any_lost}"
            ));
        }
        if set.failure().is_some() != set.is_lost() {
            broken.push(format!(
                "a held set's failure() is {:?} while is_lost() is {}",
                set.failure().map(|l| l.reason()),
                set.is_lost()
            ));
        }
        for what in broken {
            self.broken(what);
        }
        guards
    }
}

/// Watches a held set until it is lost (or released): `lost()` resolves
/// only once `is_lost()` says so; at each change of its early warning,
/// the warning names the first key at risk, in key order, as its guards
/// say; `at_risk_changed()` does not resolve again and again with
/// nothing changed. The returned future completes when it stops.
fn watch_set(log: Log, client: usize, set: LockSet) -> impl Future<Output = ()> + 'static {
    let (done, stopped) = tokio::sync::oneshot::channel();
    tokio::task::spawn_local(async move {
        let broken = |what: String| log.push(Event::Contract { client, what });
        let mut same_instant = (tokio::time::Instant::now(), 0);
        loop {
            tokio::select! {
                biased;
                () = set.lost() => {
                    if !set.is_lost() {
                        broken("LockSet::lost() resolved while is_lost() is false".to_owned());
                    }
                    break;
                }
                () = set.at_risk_changed() => {}
            }
            let now = tokio::time::Instant::now();
            same_instant = if now == same_instant.0 {
                (now, same_instant.1 + 1)
            } else {
                (now, 1)
            };
            if same_instant.1 > 8 {
                broken("LockSet::at_risk_changed() keeps resolving at one instant".to_owned());
                break;
            }
            let first = (!set.is_lost())
                .then(|| {
                    set.keys()
                        .find_map(|k| set.guard(k).and_then(LockGuard::at_risk))
                })
                .flatten();
            let said = set.at_risk();
            if said.as_ref().map(|r| r.key().to_owned())
                != first.as_ref().map(|r| r.key().to_owned())
                && !set.is_lost()
            {
                broken(format!(
                    "LockSet::at_risk() names {:?}; the first guard at risk is {:?}",
                    said.map(|r| r.key().to_owned()),
                    first.map(|r| r.key().to_owned())
                ));
            }
        }
        let _ = done.send(());
    });
    async move {
        let _ = stopped.await;
    }
}
