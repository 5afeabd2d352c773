//! The keep of a minimum hold ([`Holding::keep_for`]): one renewal that
//! hands the rest of the minimum to the service, and the fix-up it leaves
//! behind while a late request of the lease may still land.

use std::time::Duration;

use tracing::Instrument;

use super::super::renewal::renew_in_window_for;
use super::super::state::State;
use super::{release, Holding, Stage};
use crate::error::{LockLost, LostReason};
use crate::validate;

impl Holding {
    /// Ends the hold without a release: one renewal (retried within the
    /// lease's window, as any renewal) sets the lease's expiry to `time`
    /// from now, at least the shortest lease (5 s), rounded up to a whole
    /// second; then nothing runs any more and the service keeps the key
    /// until that expiry. A lock lost already, or a `time` of zero, is
    /// released as [`finish`](Self::finish) does. Returns the loss up to
    /// now, and the keeping renewal's failure (the lease then ends at its
    /// last expiry, or was taken).
    pub(crate) async fn keep_for(
        mut self,
        time: Duration,
    ) -> (Option<LockLost>, std::result::Result<(), LockLost>) {
        let span = self.span.clone();
        async move {
            if let Stage::Renewing(renewal) = std::mem::replace(&mut self.stage, Stage::Stopped) {
                renewal.stop().await;
            }
            let state = self.state.clone();
            state.check();
            let loss = state.failure();
            if time.is_zero() || loss.is_some() {
                let (loss, released) = self.finish_unscoped().await;
                let released = released.map_err(|err| {
                    LockLost::new(state.key.clone(), LostReason::Released).with_cause(err)
                });
                return (loss, released);
            }
            if sabotaged!(MinHoldInProcess) {
                // The planted bug: the minimum kept by this process alone.
                let until = state.clock.now().saturating_add(time);
                let _ = state.sleep_while_held(until).await;
                let (loss, _) = self.finish_unscoped().await;
                return (loss, Ok(()));
            }
            // Each attempt asks for the time left then: a retry does not
            // push the expiry past the end.
            let until = state.clock.now().saturating_add(time);
            let left = move |state: &State| {
                let now = state.clock.now();
                let left = until.saturating_sub(now);
                // Not past `max_hold`.
                let cap = state.cap_at().filter(|_| !sabotaged!(KeepPastMaxHold));
                let cap_left = cap.map(|cap| cap.saturating_sub(now));
                validate::ttl_under_cap(validate::ttl_covering(left), cap_left)
            };
            // A renewal answered with little time left (the short ttl
            // asked, answered late) still set the expiry: kept.
            let fence = state.lease().fencing_token();
            let kept = match renew_in_window_for(&state, &self.locks, &left).await {
                Err(lost) if lost.reason() == LostReason::NoSafeWindow => Ok(()),
                // A retry found less than the shortest lease left of the
                // cap: released instead, as when the job ends that late
                // (kept-minimums seed 420: a keep retried after a
                // partition asked 5 s with 4.6 s of the cap left).
                Err(capped) if capped.reason() == LostReason::MaxHold => {
                    let (loss, released) = self.finish_unscoped().await;
                    let capped = match released {
                        Ok(()) => capped,
                        Err(err) => capped.with_cause(err),
                    };
                    return (loss, Err(capped));
                }
                other => other,
            };
            // Renewed under another fencing token: not the minimum asked
            // for (kept-minimums seed 152; see `State::taken_again`).
            let kept = kept.and_then(|()| state.taken_again(fence).map_or(Ok(()), Err));
            // Nothing is released on drop from here on: the service keeps
            // the key until the expiry just set (or the last one, if the
            // renewal could not be made).
            let _renewing = std::mem::replace(&mut self.stage, Stage::Released);
            // A try of the acquisition, a renewal abandoned in flight when
            // the renewal stopped, or the keeping renewal itself when its
            // answer did not prove it handled, may still land and set the
            // expiry a whole ttl from then: put it right once none can,
            // whatever the keeping renewal did.
            let lease = state.lease();
            let background = self.locks.client().background();
            let acquire_late = background.take_late_window(lease.key(), lease.token());
            let renewal_late = state.renewals_land_by().map(|by| (by, state.ttl));
            let late_acquire = acquire_late.is_some();
            let late = match (acquire_late, renewal_late) {
                (Some((a, a_ttl)), Some((r, r_ttl))) => Some((a.max(r), a_ttl.max(r_ttl))),
                (one, other) => one.or(other),
            };
            let stranger = matches!(&kept, Err(lost) if lost.reason() == LostReason::TakenOver);
            if stranger {
                // The keep renewed a lease a late try of the acquire took
                // once the kept one was gone: nobody's work. Released now,
                // and again once no late try can land.
                match late {
                    Some((land_by, ttl)) => release::undo(&self.locks, lease, land_by, ttl),
                    None => {
                        release::sweep(&self.locks, lease, tokio::time::Instant::now(), state.ttl)
                    }
                }
            } else if let Some((land_by, ttl)) = late {
                // The minimum's end, the lease's and the cap's, as instants.
                let (now, at) = (state.clock.now(), tokio::time::Instant::now());
                let instant = |end: Duration| at + end.saturating_sub(now);
                let bounds = release::KeptBounds {
                    land_by,
                    kept_until: instant(until),
                    live_until: instant(state.deadline()),
                    // A late request landing after the keep may set it
                    // the shortest lease from then.
                    floor_until: instant(state.deadline()).min(at + validate::MIN_TTL),
                    cap_until: state.cap_at().map(instant),
                };
                release::kept_sweep(&self.locks, lease, bounds, ttl, late_acquire);
            }
            match &kept {
                Ok(()) => {
                    state.mark(LockLost::new(state.key.clone(), LostReason::Released));
                    tracing::debug!(
                        key = %state.key,
                        kept_for_ms = time.as_millis() as u64,
                        "lock kept by the service until its minimum's end"
                    );
                }
                Err(lost) => state.mark(lost.clone()),
            }
            (None, kept)
        }
        .instrument(span)
        .await
    }
}
