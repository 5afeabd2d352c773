//! A `try_with_lock` scope: at times with a minimum hold, whose rule is
//! checked ([`Ctx::follows_min_hold`]) and which is taken over by hand
//! during the minimum at times ([`Ctx::take_over`]); and the bad input it
//! must refuse ([`Ctx::refuses_bad_input`]).

use std::time::Duration;

use crate::log::Event;
use crate::program::ctx::Ctx;
use crate::program::op::{min_hold_for, one_in};
use volcano::{LockGuard, LostReason};

impl Ctx {
    /// Works inside a `try_with_lock` scope, unless the key is held
    /// elsewhere.
    ///
    /// Half the time it keeps the lock for a minimum (`min_hold`, as a
    /// cron job does): then the scope must not end before the minimum has
    /// passed since the closure began, unless the lock was lost.
    /// Its outcome follows `min_hold`'s rule ([`Ctx::follows_min_hold`]),
    /// tried by a takeover during the minimum at times.
    pub(super) async fn try_with_lock(&self, key: &str, ttl: Duration, work: Duration, coin: u64) {
        let min_hold = min_hold_for(coin);
        let capped = min_hold.is_some() && one_in(coin >> 25, 4);
        // A capped minimum's cap: the minimum itself, or up to 3 s more.
        let cap = min_hold.map(|min| min + Duration::from_millis(1_500 * ((coin >> 61) % 3)));
        let began = std::sync::Mutex::new(None);
        let began = &began;
        // The guard, if the closure returned with its lock not lost; told
        // to a takeover waiting for it.
        let (returned, mut held_at_end) = tokio::sync::watch::channel(None);
        let scope = self.locks.try_with_lock(key, ttl, |guard| async move {
            *crate::lock(began) = Some(self.clock.now());
            let ended = self.believe(&guard);
            self.work(&[&guard], work).await;
            if min_hold.is_some() && one_in(coin >> 46, 2) {
                self.end_on_a_held_renewal(key, ttl, coin).await;
            }
            let began = (*crate::lock(began)).unwrap_or_default();
            if let Some(min) = min_hold.filter(|_| !guard.is_lost()) {
                let left = (began + min).saturating_sub(self.clock.now());
                if !left.is_zero() {
                    let fence = guard.lease().fencing_token();
                    let cap = cap.filter(|_| capped);
                    self.minimum_asked(key, fence, (left, cap), began);
                }
            }
            returned.send_replace(Some((!guard.is_lost()).then(|| guard.clone())));
            Ok::<_, volcano::Error>((ended, guard))
        });
        // A quarter of the minimum holds are also the cap: a minimum as
        // long as the cap is valid.
        let scope = match (min_hold, cap) {
            (Some(min), Some(cap)) if capped => scope.min_hold(min).max_hold(cap),
            (Some(min), _) => scope.min_hold(min),
            (None, _) => scope,
        };
        if one_in(coin >> 23, 4) {
            self.refuses_bad_input(key, ttl).await;
        }
        // A third of the minimum holds are taken over by hand during the
        // minimum, by a force release and an acquire under another token.
        let takeover = async {
            let Some(min) = min_hold.filter(|_| one_in(coin >> 27, 3)) else {
                return;
            };
            if !matches!(
                held_at_end.wait_for(Option::is_some).await.as_deref(),
                Ok(Some(Some(_)))
            ) {
                return;
            }
            let began = (*crate::lock(began)).unwrap_or_default();
            let left = (began + min).saturating_sub(self.clock.now());
            if left > Duration::from_secs(1) {
                tokio::time::sleep(left / 3).await;
                self.take_over(key, ttl).await;
            }
        };
        // When the scope ended, read in its own future: the takeover may
        // go on after it.
        let (result, ()) = tokio::join!(scope, takeover);
        let held_at_end = held_at_end.borrow().clone().flatten();
        if let Some(guard) = held_at_end.filter(|_| min_hold.is_some()) {
            self.follows_min_hold(key, &guard, &result);
        }
        match result {
            Ok(Some((ended, guard))) => {
                if min_hold.is_some() {
                    let kept = guard
                        .failure()
                        .is_some_and(|lost| lost.reason() == LostReason::Released);
                    self.log.push(Event::MinimumEnded {
                        client: self.id,
                        key: key.to_owned(),
                        fence: guard.lease().fencing_token(),
                        kept,
                    });
                }
                ended.await
            }
            Ok(None) => self.note(format!("try_with_lock {key}: held elsewhere")),
            Err(err) => self.failed(&format!("try_with_lock {key}"), &err),
        }
    }

    /// `min_hold`'s rule, for a scope whose closure returned with its
    /// lock held: a loss during the minimum ends the scope in
    /// `Error::LockLost` exactly when it was to another holder.
    fn follows_min_hold<T>(&self, key: &str, guard: &LockGuard, result: &volcano::Result<T>) {
        let wrong = match (result, guard.failure().filter(to_another)) {
            (Err(volcano::Error::LockLost(lost)), _) if !to_another(lost) => {
                format!("failed for a loss that was not to another holder ({lost})")
            }
            (Err(volcano::Error::LockLost(_)), _) | (_, None) => return,
            (Ok(_), Some(lost)) => {
                format!("returned Ok, though its lock was lost to another holder ({lost})")
            }
            (Err(err), Some(lost)) => {
                format!("failed with \"{err}\", not a lock lost to another holder ({lost})")
            }
        };
        self.broken(format!("try_with_lock {key} with a minimum hold {wrong}"));
    }

    /// Bad input gets a clear error and sends nothing: a zero request
    /// timeout, a cap under a second, a poll interval under 100 ms, a
    /// minimum hold past the longest lease or past the
    /// cap. The edges themselves are valid: a poll of exactly 100 ms, a
    /// minimum of exactly 90 days.
    async fn refuses_bad_input(&self, key: &str, ttl: Duration) {
        let second = Duration::from_secs(1);
        let least_poll = Duration::from_millis(100);
        let holds = [
            (
                "timeout(0)",
                self.locks.hold(key, ttl).timeout(Duration::ZERO),
            ),
            (
                "max_hold(999 ms)",
                self.locks
                    .hold(key, ttl)
                    .max_hold(second - Duration::from_millis(1)),
            ),
            (
                "a 99 ms poll interval",
                self.locks
                    .hold(key, ttl)
                    .poll_interval(least_poll - Duration::from_millis(1)),
            ),
        ];
        for (what, hold) in holds {
            match hold.await {
                Err(volcano::Error::InvalidArgument(_)) => {}
                Ok(held) => {
                    self.broken(format!("hold {key} with {what} was granted"));
                    let _ = held.release().await;
                }
                Err(err) => self.broken(format!("hold {key} with {what} failed otherwise: {err}")),
            }
        }
        let longest = Duration::from_secs(90 * 86_400);
        let scopes = [
            ("min_hold past 90 days", longest + second, None),
            (
                "min_hold 5 s past max_hold 2 s",
                5 * second,
                Some(2 * second),
            ),
        ];
        for (what, min, max) in scopes {
            let scope = self
                .locks
                .try_with_lock(key, ttl, |_guard| async { Ok::<_, volcano::Error>(()) })
                .min_hold(min)
                .set_max_hold(max);
            match scope.await {
                Err(volcano::Error::InvalidArgument(_)) => {}
                other => self.broken(format!(
                    "try_with_lock {key} with {what} ended {:?}",
                    other.map_err(|e| e.to_string())
                )),
            }
        }
        // The edges, on a key of their own (the program's own is not taken
        // early): input is judged before anything is sent, at the first
        // poll. What gets past it is dropped there, and lets go of
        // whatever its acquire may take, as any dropped hold does.
        let edges = format!("{key}-edges");
        let hold = self.locks.hold(&edges, ttl).poll_interval(least_poll);
        if let Some(Err(err @ volcano::Error::InvalidArgument(_))) = first_poll(hold).await {
            self.broken(format!(
                "hold {edges} with a 100 ms poll interval was refused: {err}"
            ));
        }
        let scope = self
            .locks
            .try_with_lock(&edges, ttl, |_guard| async { Ok::<_, volcano::Error>(()) })
            .min_hold(longest);
        if let Some(Err(err @ volcano::Error::InvalidArgument(_))) = first_poll(scope).await {
            self.broken(format!(
                "try_with_lock {edges} with a minimum hold of exactly 90 days was refused: {err}"
            ));
        }
    }

    /// Takes `key` from whoever holds it, by hand: a force release, an
    /// acquire under a token of its own, a release a moment later.
    pub(super) async fn take_over(&self, key: &str, ttl: Duration) {
        self.force_release(key.to_owned()).await;
        let lease = match self.locks.acquire(key, ttl).await {
            Ok(lease) => lease,
            Err(err) => return self.note(format!("take over {key}: {err}")),
        };
        self.log.push(Event::Leased {
            client: self.id,
            key: key.to_owned(),
            fence: lease.fencing_token(),
        });
        tokio::time::sleep(ttl / 4).await;
        let released = self.locks.release(&lease).await;
        if released.is_err() {
            self.kept(key, Some(lease.fencing_token()));
        }
        self.released(key, released);
    }
}

/// A loss to another holder, as `min_hold` tells them apart: taken over,
/// or a request that found another token (`409`).
fn to_another(lost: &volcano::LockLost) -> bool {
    lost.reason() == volcano::LostReason::TakenOver
        || lost
            .cause()
            .is_some_and(|cause| cause.is_ownership_lost() || cause.is_lock_held())
}

/// What a future gives at its first poll, if it is ready then; dropped
/// otherwise.
async fn first_poll<F: std::future::IntoFuture>(future: F) -> Option<F::Output> {
    let future = std::pin::pin!(future.into_future());
    tokio::select! {
        biased;
        output = future => Some(output),
        () = std::future::ready(()) => None,
    }
}
