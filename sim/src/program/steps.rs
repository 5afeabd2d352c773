//! How each operation is done through the SDK: [`Ctx::step`] runs the one
//! an [`Op`] names, and each has its method here. Work under a lock goes
//! through [`Ctx::work`]; a lock given up is released, or (at times)
//! dropped to the background release.
//!
//! The `try_with_lock` scope (a minimum hold, a takeover, bad input) is in
//! `steps/try_scope.rs`.

mod forgets;
mod let_go;
mod permits;
mod try_scope;

use std::time::Duration;

use super::ctx::Ctx;
use super::op::{
    max_hold_for, min_hold_for, one_in, poll_for, timeout_for, uuid_from, wait_for, Op,
};
use crate::log::Event;
use volcano::AcquireOptions;

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
        // A quarter of them keep the lock for a minimum (a hold's own
        // `min_hold`), then `release()` (kept by the service) or
        // `release_now()`.
        // Those that end on a renewal held on its way
        // ([`Ctx::end_on_a_held_renewal`], the same bit) keep 10 s more:
        // the renewal's window then closes before the minimum's end.
        // Kept minimums in depth: half of them under a cap (`max_hold`)
        // as long as the minimum or up to 2 s longer
        // (`check::minimum::kept_within_the_cap`). Half of those end on a
        // renewal held on its way (as every other kept minimum does), so
        // that the fix-up's renewals back reach to the cap's edge; in the
        // others the minimum ends 1 s to 7 s after the work, so that the
        // job often ends with less than the shortest lease left of the cap
        // (the keep must then release).
        let capped = self.kept_minimums() && one_in(coin.rotate_left(29), 2);
        let min_hold = if capped && !one_in(coin >> 46, 2) {
            Some(work + Duration::from_millis(1_000 + coin.rotate_left(37) % 6_000))
        } else if self.kept_minimums() {
            Some(Duration::from_millis(1_000 + (coin >> 40) % 18_000))
        } else {
            min_hold_for(coin)
                .filter(|_| one_in(coin >> 52, 2))
                .map(|min| {
                    if one_in(coin >> 46, 2) {
                        min + Duration::from_secs(10)
                    } else {
                        min
                    }
                })
        };
        let cap = min_hold
            .filter(|_| capped)
            .map(|min| min + Duration::from_secs(coin.rotate_left(31) % 3));
        if self.kept_minimums() && one_in(coin >> 33, 3) {
            self.acquire_late(key, coin);
        }
        match self.shaped_hold(key, ttl, wait, coin, min_hold, cap).await {
            Ok(held) => match min_hold {
                Some(min) => {
                    let began = self.clock.now();
                    let ended = self.believe(&held);
                    self.work(&[&*held], work).await;
                    self.let_go_after(held, (min, cap), began, coin).await;
                    ended.await;
                }
                None => self.use_held(held, work, coin).await,
            },
            Err(err) => self.failed(&format!("hold {key}"), &err),
        }
    }

    /// The next acquire of `key` answered 503 by a gateway that applies it
    /// 1 s to 11 s later (kept minimums in depth): its retry takes the key,
    /// and the late try, with the same token, may set the expiry a whole
    /// ttl from when it lands, after the minimum was handed over.
    fn acquire_late(&self, key: &str, coin: u64) {
        let applied = Duration::from_millis(1_000 + (coin >> 17) % 10_000);
        if let Some(mock) = crate::lock(&self.server).as_ref() {
            mock.inject(
                volcano_mock_server::Fault::gateway(503, Duration::from_millis(100), applied)
                    .on(volcano_mock_server::Operation::Acquire)
                    .key(key)
                    .times(1),
            );
        }
        self.log.push(Event::Fault {
            what: format!(
                "acquire-applied-late gateway 503 after 100ms, applied after {applied:?}, of {key}"
            ),
        });
    }

    /// Works inside a `with_lock` scope.
    async fn with_lock(&self, key: &str, ttl: Duration, wait: Duration, work: Duration, coin: u64) {
        // A quarter of them take a permit of a semaphore of two instead.
        if Op::WithLock.takes_a_permit(coin, self.depth) {
            return self.with_permit(key, ttl, wait, work, coin).await;
        }
        let scope = self.locks.with_lock(key, ttl, |guard| async move {
            let ended = self.believe(&guard);
            self.work(&[&guard], work).await;
            Ok::<_, volcano::Error>(ended)
        });
        let first = async {
            match scope.wait(wait).poll_interval(poll_for(coin)).await {
                Ok(ended) => ended.await,
                Err(err) => self.failed(&format!("with_lock {key}"), &err),
            }
        };
        if one_in(coin >> 31, 4) {
            tokio::join!(first, self.behind(key, ttl, wait + work, coin));
        } else {
            first.await;
        }
    }

    /// A second task of this client waits for `key` behind a first one
    /// (begun a moment before): it waits its turn, then tries; when it
    /// gets the key, it works a moment and releases it.
    async fn behind(&self, key: &str, ttl: Duration, wait: Duration, coin: u64) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let request_id = uuid_from(coin.rotate_left(29));
        self.log.push(Event::Behind {
            client: self.id,
            key: key.to_owned(),
            request_id: request_id.clone(),
            until: turmoil::sim_elapsed().unwrap_or_default() + wait,
        });
        let options = AcquireOptions::default()
            .request_id(request_id)
            .wait(wait)
            .poll_interval(poll_for(coin >> 3));
        let outcome = self.locks.hold(key, ttl).options(options).await;
        self.log.push(Event::BehindEnded { client: self.id });
        match outcome {
            Ok(held) => {
                let ended = self.believe(&held);
                self.work(&[&*held], Duration::from_millis(300)).await;
                self.released(key, held.release().await);
                ended.await;
            }
            Err(err) => self.failed(&format!("hold {key} behind another"), &err),
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
    pub(super) async fn use_held(&self, held: volcano::HeldLock, work: Duration, coin: u64) {
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
            // Observers in depth: these holders find their key
            // force-released (as an operator would) the moment before they
            // release it: the release must say the lock was taken over
            // (`check::truth::takeovers`), and observers see the release.
            if self.depth == crate::Depth::Observers {
                self.force_release(key.clone()).await;
            }
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
        min_hold: Option<Duration>,
        cap: Option<Duration>,
    ) -> volcano::Result<volcano::HeldLock> {
        let mut hold = self
            .locks
            .hold(key, ttl)
            .wait(wait)
            .poll_interval(poll_for(coin));
        match min_hold {
            // A minimum is at most the cap.
            Some(min) => hold = hold.min_hold(min).set_max_hold(cap),
            None if one_in(coin, 5) => hold = hold.max_hold(max_hold_for(coin)),
            None => {}
        }
        if one_in(coin, 7) {
            hold = hold.timeout(timeout_for(coin));
        }
        hold.await
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
}
