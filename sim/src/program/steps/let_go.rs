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
    /// Lets go of a lock held with a minimum hold of `min` since `began`
    /// (its host's clock): a third of the time `release_now()` (released
    /// at once, nothing kept); else `release()`, which hands what is left
    /// of the minimum to the service (logged as a scope's minimum is, for
    /// the same checks).
    pub(super) async fn let_go_after(
        &self,
        held: HeldLock,
        min: Duration,
        began: Duration,
        coin: u64,
    ) {
        let key = held.key().to_owned();
        if one_in(coin >> 60, 3) {
            let released = held.release_now().await;
            return self.released(&key, released);
        }
        let guard = (*held).clone();
        if one_in(coin >> 46, 2) {
            self.end_on_a_held_renewal(&key, guard.ttl(), coin).await;
        }
        let fence = guard.lease().fencing_token();
        let left = (began + min).saturating_sub(self.clock.now());
        let asked = !left.is_zero() && !guard.is_lost();
        if asked {
            self.log.push(Event::MinimumAsked {
                client: self.id,
                key: key.clone(),
                fence,
                left,
                capped: false,
            });
        }
        // What the SDK says became of the minimum: judged against the
        // service's journal (`check::minimum`).
        let (released, reported) = match held.release_reporting().await {
            Ok(reported) => (Ok(()), Some(reported)),
            Err(err) => (Err(err), None),
        };
        if !asked {
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
