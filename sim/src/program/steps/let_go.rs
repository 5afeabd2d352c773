//! How a held lock with a minimum hold is let go of ([`Ctx::let_go_after`]),
//! shared by `hold(..).min_hold(..)` and a permit's own `acquire`: at
//! once, or handed to the service for what is left of the minimum, at
//! times the moment a renewal goes out while it is held on its way.

use std::time::Duration;

use crate::log::Event;
use crate::program::ctx::Ctx;
use crate::program::op::one_in;
use volcano::{HeldLock, LostReason, MinHold};

impl Ctx {
    /// Lets go of a lock held with a minimum hold of `min` (under a cap,
    /// `max_hold`, if one is given) since `began` (its host's clock): a
    /// third of the time `release_now()` (released at once, nothing
    /// kept); else `release()`, which hands what is left of the minimum to
    /// the service (logged as a scope's minimum is, for the same checks).
    pub(super) async fn let_go_after(
        &self,
        held: HeldLock,
        (min, cap): (Duration, Option<Duration>),
        began: Duration,
        coin: u64,
    ) {
        let key = held.key().to_owned();
        if one_in(coin >> 60, 3) && !self.kept_minimums() {
            let released = held.release_now().await;
            return self.released(&key, released);
        }
        let guard = (*held).clone();
        // (Under a cap, half the time, the same bit as the minimum's
        // length in `hold_and_use`: a late window's fix-up releases at the
        // minimum's end, and would hide a keep past the cap.)
        let late_renewal = one_in(coin >> 46, 2) || (self.kept_minimums() && cap.is_none());
        if late_renewal {
            self.end_on_a_held_renewal(&key, guard.ttl(), coin).await;
        }
        let fence = guard.lease().fencing_token();
        let left = (began + min).saturating_sub(self.clock.now());
        let asked = !left.is_zero() && !guard.is_lost();
        if asked {
            self.minimum_asked(&key, fence, (left, cap), began);
        }
        // What the SDK says became of the minimum: judged against the
        // service's journal (`check::minimum`).
        let (released, reported) = match held.release_reporting().await {
            Ok(reported) => (Ok(()), Some(reported)),
            Err(err) => (Err(err), None),
        };
        if !asked {
            // Past its minimum and still held: released now, and said to
            // have passed (a release that failed says nothing).
            let held = guard.failure().map(|lost| lost.reason()) == Some(LostReason::Released);
            if left.is_zero() && held && reported.is_some_and(|r| r != MinHold::Passed) {
                self.broken(format!(
                    "release_reporting of {key} past its minimum of {min:?} said {reported:?}"
                ));
            }
            return self.released(&key, released);
        }
        let kept = reported == Some(MinHold::Kept)
            && guard
                .failure()
                .is_some_and(|lost| lost.reason() == LostReason::Released);
        self.log.push(Event::MinimumReported {
            client: self.id,
            key: key.clone(),
            fence,
            kept: reported == Some(MinHold::Kept),
        });
        self.log.push(Event::MinimumEnded {
            client: self.id,
            key: key.clone(),
            fence,
            kept,
        });
        match released {
            // Kept by the service, not released.
            Ok(()) => self.note(format!("release of {key}: kept for its minimum")),
            Err(err) => self.note(format!("release of {key}: {err}")),
        }
        if late_renewal && kept {
            self.trouble_the_fix_up(&key, guard.ttl(), coin).await;
        }
    }

    /// Logs a minimum asked of the service with `left` of it (and, under
    /// a `cap`, when the cap ends: it counts from the hand-over, before
    /// `began`, the host's reading when the work began, so this end is no
    /// earlier than the SDK's).
    pub(super) fn minimum_asked(
        &self,
        key: &str,
        fence: i64,
        (left, cap): (Duration, Option<Duration>),
        began: Duration,
    ) {
        self.log.push(Event::MinimumAsked {
            client: self.id,
            key: key.to_owned(),
            fence,
            left,
            capped: cap.is_some(),
        });
        if let Some(cap) = cap {
            let now = turmoil::sim_elapsed().unwrap_or_default();
            let on_host = self.clock.now().saturating_sub(began);
            self.log.push(Event::KeepCapped {
                client: self.id,
                key: key.to_owned(),
                fence,
                cap_until: now.saturating_sub(on_host) + cap,
            });
        }
    }

    /// Troubles a kept minimum's fix-up (`release/late.rs`, `Kept`: its
    /// renewals back to the minimum's end while the held renewal may land)
    /// in eight of nine: its next renewals back answered 503 or 429 (tried
    /// again), a gateway's 504 whose renewal is applied later (its window
    /// then counts too), refused with 403 (not tried again), the key taken
    /// by hand meanwhile (a force release, and another token's acquire or
    /// not: a late acquire may then take it again), every try of a
    /// renewal back answered 503 (unanswered: released at the minimum's
    /// end), or two held past their timeout (unanswered, applied late: the
    /// tries and their pauses must not put the release at the end off).
    async fn trouble_the_fix_up(&self, key: &str, ttl: Duration, coin: u64) {
        use volcano_mock_server::{Fault, Operation};
        let pick = (coin.rotate_left(23) ^ (coin >> 7)) % 9;
        let later = Duration::from_millis(1_000 + (coin >> 13) % 2_000);
        let (fault, what) = match pick {
            0 => (Some(Fault::status(503).times(2)), "503 x2".to_owned()),
            1 => (Some(Fault::status(429).times(1)), "429".to_owned()),
            2 => (
                Some(Fault::gateway(504, Duration::from_millis(200), later).times(1)),
                format!("gateway 504 after 200ms, applied after {later:?}"),
            ),
            3 => (Some(Fault::status(403).times(1)), "refused 403".to_owned()),
            4 => (None, format!("taken over by hand after {later:?}")),
            5 => (Some(Fault::status(503).times(3)), "503 x3".to_owned()),
            6 => (None, format!("force-released by hand after {later:?}")),
            7 => (
                Some(Fault::delay(Duration::from_millis(3_500)).times(2)),
                "two renewals back held 3.5 s".to_owned(),
            ),
            _ => return,
        };
        self.log.push(Event::Fault {
            what: format!("fix-up-troubled {what}, of {key}"),
        });
        match fault {
            Some(fault) => {
                if let Some(mock) = crate::lock(&self.server).as_ref() {
                    mock.inject(fault.on(Operation::Renew).key(key));
                }
            }
            None if pick == 6 => {
                tokio::time::sleep(later).await;
                self.force_release(key.to_owned()).await;
            }
            None => {
                tokio::time::sleep(later).await;
                self.take_over(key, ttl).await;
            }
        }
    }

    /// Ends a job the moment its next renewal goes out (within `ttl`),
    /// with that renewal held on its way for 0.5 s to 8 s and applied then:
    /// after the keep of a minimum, or the release, that follows at once.
    /// A renewal cannot bring a released lease back; a kept one it would
    /// stretch (or cut short) unless the SDK puts it right.
    pub(super) async fn end_on_a_held_renewal(&self, key: &str, ttl: Duration, coin: u64) {
        let held = Duration::from_millis(500 + (coin >> 47) % 7_500);
        if let Some(mock) = crate::lock(&self.server).as_ref() {
            mock.inject(
                volcano_mock_server::Fault::delay(held)
                    .on(volcano_mock_server::Operation::Renew)
                    .key(key)
                    .times(1),
            );
        }
        self.log.push(Event::Fault {
            what: format!("late-renewal-at-job-end held {held:?}, of {key}"),
        });
        let mut requests = self.requests.clone();
        let next = *requests.borrow_and_update() + 1;
        let sent = tokio::time::timeout(ttl, async {
            requests.wait_for(|n| *n >= next).await.is_ok()
        })
        .await;
        if sent == Ok(true) {
            // Until it has reached the server, which holds it.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
