//! How each operation is done through the SDK: [`Ctx::step`] runs the one
//! an [`Op`] names, and each has its method here. Work under a lock goes
//! through [`Ctx::work`]; a lock given up is released, or (at times)
//! dropped to the background release.

use std::time::Duration;

use volcano::LockGuard;

use super::ctx::{futures_all, Ctx};
use super::op::{
    campaign, max_hold_for, min_hold_for, one_in, poll_for, timeout_for, uuid_from, wait_for, Op,
};
use crate::log::Event;

impl Ctx {
    /// One operation: the one `op` names.
    pub(super) async fn step(
        &self,
        op: Op,
        key: String,
        ttl: Duration,
        work: Duration,
        coin: u64,
        all: &[String],
    ) {
        self.asks_for(ttl);
        let wait = wait_for(coin);
        match op {
            Op::HoldShaped => self.hold_and_use(&key, ttl, wait, work, coin).await,
            Op::WithLock => self.with_lock(&key, ttl, wait, work, coin).await,
            Op::TryWithLock => self.try_with_lock(&key, ttl, work, coin).await,
            Op::AcquireRenewRelease => self.acquire_renew_release(&key, ttl, wait, coin).await,
            Op::Leader => self.lead(&key, ttl, work, coin).await,
            Op::HoldAll => self.hold_all(all, ttl, wait, work, coin).await,
            Op::WithLocks => self.with_locks(all, ttl, wait, work, coin).await,
            Op::OwnToken => self.own_token(&key, ttl, wait, work, coin).await,
            Op::ForceRelease => self.force_release(key).await,
            Op::Observe => self.observe(&key, work, coin).await,
        }
    }

    /// Observes `key` for a few times the step's work, logging each
    /// change; the checks judge each against the server's journal, and
    /// the observer's looks against its poll interval.
    async fn observe(&self, key: &str, work: Duration, coin: u64) {
        let (span, poll) = (campaign(work), poll_for(coin));
        let until = turmoil::sim_elapsed().unwrap_or_default() + span;
        self.log.push(Event::Observing {
            client: self.id,
            key: key.to_owned(),
            until,
            poll,
        });
        let mut changes = self.locks.observe(key).poll_interval(poll);
        let deadline = tokio::time::sleep(span);
        tokio::pin!(deadline);
        loop {
            let item = tokio::select! {
                biased;
                item = changes.next() => item,
                () = &mut deadline => break,
            };
            match item {
                Some(Ok(change)) => self.log.push(Event::Observed {
                    client: self.id,
                    key: key.to_owned(),
                    kind: change.kind().as_str(),
                    fence: change.state().fencing_token(),
                    before: change
                        .previous()
                        .and_then(|s| s.fencing_token().zip(s.expires_at())),
                }),
                Some(Err(err)) => self.note(format!("observe {key}: {err}")),
                None => break,
            }
        }
    }

    /// A `hold` the coin shapes ([`Ctx::shaped_hold`]), then used and
    /// given up ([`Ctx::use_held`]).
    async fn hold_and_use(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        match self.shaped_hold(key, ttl, wait, coin).await {
            Ok(held) => self.use_held(held, work, coin).await,
            Err(err) => self.failed(&format!("hold {key}"), &err),
        }
    }

    /// Works inside a `with_lock` scope.
    async fn with_lock(&self, key: &str, ttl: Duration, wait: Duration, work: Duration, coin: u64) {
        let scope = self.locks.with_lock(key, ttl, |guard| async move {
            let ended = self.believe(&guard);
            self.work(&[&guard], work).await;
            Ok::<_, volcano::Error>(ended)
        });
        match scope.wait(wait).poll_interval(poll_for(coin)).await {
            Ok(ended) => ended.await,
            Err(err) => self.failed(&format!("with_lock {key}"), &err),
        }
    }

    /// Works inside a `try_with_lock` scope, unless the key is held
    /// elsewhere.
    ///
    /// Half the time it keeps the lock for a minimum (`min_hold`, as a
    /// cron job does): then the scope must not end before the minimum has
    /// passed since the closure began, unless the lock was lost.
    async fn try_with_lock(&self, key: &str, ttl: Duration, work: Duration, coin: u64) {
        let min_hold = min_hold_for(coin);
        let began = std::sync::Mutex::new(None);
        let began = &began;
        let scope = self.locks.try_with_lock(key, ttl, |guard| async move {
            *crate::lock(began) = Some(self.clock.now());
            let ended = self.believe(&guard);
            self.work(&[&guard], work).await;
            Ok::<_, volcano::Error>((ended, guard))
        });
        let scope = match min_hold {
            Some(min) => scope.min_hold(min),
            None => scope,
        };
        match scope.await {
            Ok(Some((ended, guard))) => {
                let began = *crate::lock(began);
                if let (Some(min), Some(began)) = (min_hold, began) {
                    self.kept_for(&guard, min, self.clock.now().saturating_sub(began));
                }
                ended.await
            }
            Ok(None) => self.note(format!("try_with_lock {key}: held elsewhere")),
            Err(err) => self.note(format!("try_with_lock {key}: {err}")),
        }
    }

    /// Works inside a `with_locks` scope over every key.
    async fn with_locks(
        &self,
        all: &[String],
        ttl: Duration,
        wait: Duration,
        work: Duration,
        coin: u64,
    ) {
        let scope = self.locks.with_locks(all.to_vec(), ttl, |set| async move {
            let guards = self.whole_set(&set, all.len());
            let ended: Vec<_> = guards.iter().map(|g| self.believe(g)).collect();
            self.work(&guards.iter().collect::<Vec<_>>(), work).await;
            Ok::<_, volcano::Error>(ended)
        });
        match scope.wait(wait).poll_interval(poll_for(coin)).await {
            Ok(ended) => futures_all(ended).await,
            Err(err) => self.failed("with_locks", &err),
        }
    }

    /// Force-releases `key`, whoever holds it.
    async fn force_release(&self, key: String) {
        match self.locks.force_release(&key).await {
            Ok(()) => self.log.push(Event::Forced {
                client: self.id,
                key,
            }),
            Err(err) => self.note(format!("force_release {key}: {err}")),
        }
    }

    /// Works under a held lock, then releases it, or (a third of the time)
    /// drops it to the background release; at times it gives up the lock
    /// first (`mark_lost`), which must end the belief as `Marked`.
    async fn use_held(&self, held: volcano::HeldLock, work: Duration, coin: u64) {
        let ended = self.believe(&held);
        self.work(&[&*held], work).await;
        if one_in(coin, 11) {
            held.mark_lost("the program gave up");
            let marked = held.failure().map(|lost| lost.reason());
            if !held.is_lost() || marked.is_none() {
                self.log.push(Event::Contract {
                    client: self.id,
                    what: format!(
                        "after mark_lost, is_lost() is {} and failure() {marked:?}",
                        held.is_lost()
                    ),
                });
            }
        }
        if one_in(coin, 3) {
            drop(held);
        } else {
            let key = held.key().to_owned();
            self.released(&key, held.release().await);
        }
        ended.await;
    }

    /// `hold` with options the coin picks: a cap on the hold (`max_hold`)
    /// and a per-request timeout.
    async fn shaped_hold(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        coin: u64,
    ) -> volcano::Result<volcano::HeldLock> {
        let mut hold = self
            .locks
            .hold(key, ttl)
            .wait(wait)
            .poll_interval(poll_for(coin));
        if one_in(coin, 5) {
            hold = hold.max_hold(max_hold_for(coin));
        }
        if one_in(coin, 7) {
            hold = hold.timeout(timeout_for(coin));
        }
        hold.await
    }

    /// Frees whatever lease `token` may hold on `key` (release is
    /// idempotent), trying again while the failure is transient.
    async fn release_own(&self, key: &str, token: String) {
        let orphan = volcano::LockLease::new(key, token, chrono::DateTime::UNIX_EPOCH, 0);
        for _ in 0..4 {
            match self.locks.release(&orphan).await {
                Err(err) if err.is_transient() => {
                    self.note(format!("release {key} of own token failed, again: {err}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(err) => {
                    self.kept(key, None);
                    return self.note(format!("release {key} of own token: {err}"));
                }
                Ok(()) => return self.released(key, Ok(())),
            }
        }
        self.kept(key, None);
    }

    /// Every key at once, then released (or dropped).
    async fn hold_all(
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
        let guards = self.whole_set(&held.set(), all.len());
        let ended: Vec<_> = guards.iter().map(|g| self.believe(g)).collect();
        self.work(&guards.iter().collect::<Vec<_>>(), work).await;
        if one_in(coin, 3) {
            drop(held);
        } else if let Err(err) = held.release().await {
            self.note(format!("release of all: {err}"));
        }
        futures_all(ended).await;
    }

    /// A hold under the program's own token, released or dropped. A
    /// failure, or the program dropping it (see [`Ctx::recover_own`]), is
    /// recovered the documented way: hold again with the same token
    /// (idempotent: it gets back the lease if it is still ours), then
    /// release.
    async fn own_token(&self, key: &str, ttl: Duration, wait: Duration, work: Duration, coin: u64) {
        let token = uuid_from(coin);
        let hold = self.locks.hold(key, ttl).token(token.clone()).wait(wait);
        match hold.poll_interval(poll_for(coin)).await {
            Ok(held) => self.use_held(held, work, coin).await,
            Err(err) => {
                self.failed(&format!("hold {key} with own token"), &err);
                self.recover_own(key, token, ttl).await;
            }
        }
    }

    /// After an abandoned or failed hold under `token`: holds again with
    /// it, without waiting, works a little if that got the lease back,
    /// and releases whatever the token may hold.
    pub(super) async fn recover_own(&self, key: &str, token: String, ttl: Duration) {
        match self.locks.hold(key, ttl).token(token.clone()).await {
            Ok(held) => {
                let ended = self.believe(&held);
                self.work(&[&*held], Duration::from_secs(1)).await;
                self.released(key, held.release().await);
                ended.await;
            }
            Err(err) => self.note(format!("recovering {key} with own token: {err}")),
        }
        self.release_own(key, token).await;
    }

    /// A waiting acquire, a renew and a release, by hand.
    async fn acquire_renew_release(&self, key: &str, ttl: Duration, wait: Duration, coin: u64) {
        let locks = &self.locks;
        let acquire = locks.acquire(key, ttl).wait(wait);
        let lease = match acquire.poll_interval(poll_for(coin)).await {
            Ok(lease) => lease,
            Err(err) => return self.failed(&format!("acquire {key}"), &err),
        };
        self.log.push(Event::Leased {
            client: self.id,
            key: key.to_owned(),
            fence: lease.fencing_token(),
        });
        tokio::time::sleep(ttl / 4).await;
        let lease = match locks.renew(&lease, ttl).await {
            Ok(renewed) => renewed,
            Err(err) => {
                self.note(format!("renew {key}: {err}"));
                lease
            }
        };
        let released = locks.release(&lease).await;
        if released.is_err() {
            self.kept(key, Some(lease.fencing_token()));
        }
        self.released(key, released);
    }

    /// Leader election for a while: each term writes through the gate.
    /// A term that keeps its thread past its lock: the lease clock moves
    /// on by more than a ttl within one poll (as a blocking call or a GC
    /// pause would), and the term, still running, asks its leader's health,
    /// which must say it is overdue.
    fn stall(&self, term: &LockGuard, health: &volcano::LeaderHealth, ttl: Duration) {
        if term.is_lost() {
            return;
        }
        let by = ttl + Duration::from_secs(1);
        self.log.push(Event::Fault {
            what: format!("stall of client-{}'s term for {by:?}", self.id),
        });
        self.clock.advance(by);
        if health.overdue().is_none() {
            self.log.push(Event::Contract {
                client: self.id,
                what: format!(
                    "a term on {} stalled {by:?} past its lock, and its leader's health says nothing",
                    term.lease().key()
                ),
            });
        }
    }

    async fn lead(&self, key: &str, ttl: Duration, work: Duration, coin: u64) {
        // A quarter of the candidates run terms that stall past their
        // lock (a blocking call, a GC pause) after some work.
        let stalls = one_in(coin >> 20, 4);
        let until = tokio::time::sleep(campaign(work));
        let leader = self.locks.leader(key, ttl).until(until);
        let status = leader.status();
        let health = leader.health();
        let (watched, health) = (&status, &health);
        let result = leader
            .run(|term| async move {
                let ended = self.believe_term(&term, Some((watched.clone(), health.clone())));
                if stalls {
                    self.work(&[&term], work / 2).await;
                    self.stall(&term, health, ttl);
                }
                self.work(&[&term], Duration::from_secs(3600)).await;
                ended.await;
                Ok::<_, volcano::Error>(())
            })
            .await;
        if *status.borrow() != volcano::LeaderStatus::Stopped {
            self.log.push(Event::Contract {
                client: self.id,
                what: format!(
                    "leader on {key}: run returned while its status says {:?}",
                    *status.borrow()
                ),
            });
        }
        if let Err(err) = result {
            self.note(format!("leader {key}: {err}"));
        }
    }
}
